"""Numpy references of the demo MLA model, its drafter and greedy decoding (host only).

Everything is computed in float64 from the bf16 weights of
:func:`driverlevel.demo._mla_weights.make_weights`, rounding to bf16 at the points where
the GPU stores bf16 (queries, latent KV, attention output, residual stream), so the
logits agree with the GPU's to within fp32 accumulation noise.

Functions
---------
:func:`forward_reference`
    The target forward over one verify call (any mask format), writing the tokens'
    latent KV into a host cache, returning float64 logits.
:func:`greedy_generate_reference`
    Plain greedy decoding (one token per step): the ground truth of the lossless check.
:func:`no_context_successor`
    The drafter's table: the model's argmax with the attention ablated.
:func:`draft_noise_reference`, :func:`drafter_logits_reference`
    The drafter's counter-based noise and per-depth logits.
:func:`margin_report`, :func:`chain_acceptance`
    Top-1 margins along a generation, and the acceptance of the drafter's chain.
:func:`ddtree_generate_reference`
    The whole DDTree decode loop on the host (drafter, tree, forward, accept, commit).
"""

from __future__ import annotations

import numpy as np

from driverlevel.demo._mla_weights import QK_DIM, V_DIM, MLAWeights
from driverlevel.reference.attention import round_to_bf16, verify_attention_reference

__all__ = [
    "embed_reference",
    "forward_reference",
    "greedy_generate_reference",
    "no_context_successor",
    "no_context_logits",
    "draft_noise_reference",
    "drafter_logits_reference",
    "drafter_chain_reference",
    "margin_report",
    "chain_acceptance",
    "ddtree_generate_reference",
]

_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


class _Cache:
    """float64 widened weights of one MLAWeights (computed once per object)."""

    _memo: dict = {}

    @classmethod
    def get(cls, w: MLAWeights):
        key = id(w)
        hit = cls._memo.get(key)
        if hit is not None and hit[0] is w:
            return hit[1]
        d = {n: w.as_float32(n).astype(np.float64) for n in ("embed", "w_q", "w_kv", "w_o", "w_lm")}
        cls._memo = {key: (w, d)}  # keep one model's widened weights
        return d


def _bf16(x) -> np.ndarray:
    return round_to_bf16(np.asarray(x, dtype=np.float64)).astype(np.float64)


def embed_reference(w: MLAWeights, tokens, positions) -> np.ndarray:
    """float64 ``[T, d_model]`` embedding of ``tokens`` at ``positions``.

    The class one-hot (the first ``num_classes`` columns of the embedding row) is
    rotated cyclically by the position: ``one_hot((cls[t] + pos) % num_classes)``;
    the feature columns are copied. (A discrete analogue of rotary position encoding.)
    """
    f = _Cache.get(w)
    NC = w.config.num_classes
    tokens = np.asarray(tokens, dtype=np.int64)
    positions = np.asarray(positions, dtype=np.int64)
    e = f["embed"][tokens].copy()
    cls = np.argmax(e[:, :NC], axis=1)
    e[:, :NC] = 0.0
    e[np.arange(len(tokens)), (cls + positions) % NC] = f["embed"][tokens, cls]
    return e


def _project(w: MLAWeights, tokens: np.ndarray, positions: np.ndarray):
    """bf16-rounded embedding, queries [T, H, 576] and latent KV [T, 576] of ``tokens``."""
    f = _Cache.get(w)
    H = w.config.num_heads
    e = embed_reference(w, tokens, positions)
    q = _bf16(e @ f["w_q"].T).reshape(len(tokens), H, QK_DIM)
    kv = _bf16(e @ f["w_kv"].T)
    return e, q, kv


def _head(w: MLAWeights, e: np.ndarray, attn: np.ndarray) -> np.ndarray:
    """float64 logits from the embedding and the bf16 attention output [T, H, 512]."""
    f = _Cache.get(w)
    T = e.shape[0]
    h = _bf16(e + _bf16(attn).reshape(T, -1) @ f["w_o"].T)
    return h @ f["w_lm"].T


def forward_reference(w: MLAWeights, tokens, positions, kv_cache: np.ndarray, qo_indptr, kv_indptr, kv_indices,
                      out_cache_loc, mask=None, mask_format="causal", *, mask_indptr=None) -> np.ndarray:
    """The target forward of one verify call, in float64.

    Parameters
    ----------
    w : MLAWeights
    tokens : int array ``[total_q]``
        Token of every draft row (request ``b``'s rows are ``qo_indptr[b]:qo_indptr[b+1]``).
    positions : int array ``[total_q]``
        Position of every draft row in its sequence (prefix length + depth).
    kv_cache : float array ``[num_slots, 576]`` (host; modified)
        The latent KV of ``tokens`` is written at ``out_cache_loc`` (bf16-rounded values).
    qo_indptr, kv_indptr, kv_indices, out_cache_loc, mask, mask_format, mask_indptr
        As for :func:`driverlevel.reference.attention.verify_attention_reference`.

    Returns
    -------
    numpy.ndarray
        float64 ``[total_q, vocab]`` logits.
    """
    tokens = np.asarray(tokens, dtype=np.int64)
    e, q, kv = _project(w, tokens, np.asarray(positions, dtype=np.int64))
    kv_cache[np.asarray(out_cache_loc, dtype=np.int64)] = kv
    attn, _ = verify_attention_reference(q, kv_cache, qo_indptr, kv_indptr, kv_indices, out_cache_loc,
                                         mask, mask_format, w.config.sm_scale, V_DIM, mask_indptr=mask_indptr)
    return _head(w, e, attn)


def _attend(w: MLAWeights, q_row: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Attention of one token's queries [H, 576] over key rows [n, 576] (float64)."""
    s = (q_row @ keys.T) * w.config.sm_scale          # [H, n]
    s -= s.max(axis=1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=1, keepdims=True)
    return p @ keys[:, :V_DIM]                          # [H, 512]


def greedy_generate_reference(w: MLAWeights, prompts, max_new_tokens: int, stop_token: int | None = None,
                              *, return_margins: bool = False):
    """Greedy decoding, one token per step, with the float64 reference forward.

    The prompt's tokens but the last form the committed prefix; the last is the first
    token processed (as in the GPU runner). A request stops after ``max_new_tokens``
    tokens or after emitting ``stop_token`` (which is kept).

    Parameters
    ----------
    w : MLAWeights
    prompts : sequence of int sequences
        Each at least 1 token.
    max_new_tokens : int
    stop_token : int, optional
    return_margins : bool
        Also return, per request, the top-1 minus top-2 logit of every step.

    Returns
    -------
    list of list of int, or (tokens, margins)
    """
    f = _Cache.get(w)
    outs, margins = [], []
    for prompt in prompts:
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise ValueError("every prompt needs at least one token")
        n = len(prompt)
        _, _, kv_p = _project(w, np.asarray(prompt, dtype=np.int64), np.arange(n))
        keys = [kv_p[i] for i in range(n - 1)]
        cur = prompt[-1]
        out, marg = [], []
        for step in range(max_new_tokens):
            e, q, kv = _project(w, np.asarray([cur], dtype=np.int64), np.asarray([n - 1 + step]))
            keys.append(kv[0])
            attn = _bf16(_attend(w, q[0], np.asarray(keys)))
            h = _bf16(e[0] + attn.reshape(-1) @ f["w_o"].T)
            logits = h @ f["w_lm"].T
            nxt = int(np.argmax(logits))
            if return_margins:
                top2 = np.partition(logits, -2)[-2:]
                marg.append(float(top2[1] - top2[0]))
            out.append(nxt)
            cur = nxt
            if stop_token is not None and nxt == stop_token:
                break
        outs.append(out)
        margins.append(marg)
    return (outs, margins) if return_margins else outs


def no_context_logits(w: MLAWeights, tokens) -> np.ndarray:
    """float64 ``[n, vocab]`` logits of ``tokens`` with the attention ablated (``embed @ w_lm.T``)."""
    f = _Cache.get(w)
    return f["embed"][np.asarray(tokens, dtype=np.int64)] @ f["w_lm"].T


def no_context_successor(w: MLAWeights, chunk: int = 2048) -> np.ndarray:
    """int64 ``[vocab]``: argmax of :func:`no_context_logits` of every token (lowest index on ties)."""
    V = w.config.vocab_size
    out = np.empty(V, dtype=np.int64)
    for s in range(0, V, chunk):
        out[s:s + chunk] = np.argmax(no_context_logits(w, np.arange(s, min(V, s + chunk))), axis=1)
    return out


# --------------------------------------------------------------------------- drafter noise

def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser on uint64 arrays (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def draft_noise_reference(seed: int, step: int, rows, cols) -> np.ndarray:
    """The drafter's standard-normal noise at (step, row, column), as the kernel computes it.

    Columns come in pairs (``2j``, ``2j + 1``) that share one hash
    ``x = mix64(mix64(seed ^ mix64(step + 1)) + row * 2^32 + 2j)``; its two 32-bit halves give
    ``u1`` in (0, 1] and ``u2`` in (0, 1), and Box-Muller's transform (Box and Muller, 1958) the
    two independent normals ``sqrt(-2 ln u1) * cos(2 pi u2)`` (even column) and
    ``sqrt(-2 ln u1) * sin(2 pi u2)`` (odd column). Row is ``b * depth_limit + d`` (request
    ``b``, depth index ``d``); column the token. The kernel evaluates the transcendental
    functions in fp32, so it agrees to ~1e-6 typically, and to ~2.5e-4 where ``u1`` rounds to
    1 in fp32 (its top 25 bits set: the kernel's radius is then 0).

    Returns
    -------
    numpy.ndarray
        float64, broadcast shape of ``rows`` and ``cols``.
    """
    rows = np.asarray(rows, dtype=np.uint64)
    cols = np.asarray(cols, dtype=np.uint64)
    with np.errstate(over="ignore"):
        base = _mix64(np.uint64(seed) ^ _mix64(np.uint64(step) + np.uint64(1)))
        x = _mix64(base + (rows << np.uint64(32)) + (cols & ~np.uint64(1)))
    u1 = ((x >> np.uint64(32)).astype(np.float64) + 1.0) / 4294967296.0
    u2 = ((x & np.uint64(0xFFFFFFFF)).astype(np.float64) + 0.5) / 4294967296.0
    theta = 2.0 * np.pi * u2
    return np.sqrt(-2.0 * np.log(u1)) * np.where((cols & np.uint64(1)) == 0, np.cos(theta), np.sin(theta))


def drafter_chain_reference(successor: np.ndarray, roots, depth_limit: int) -> np.ndarray:
    """int64 ``[bs, depth_limit]``: guesses ``g_0 = root``, ``g_{i+1} = successor[g_i]``."""
    roots = np.asarray(roots, dtype=np.int64)
    g = np.empty((roots.shape[0], depth_limit), dtype=np.int64)
    g[:, 0] = roots
    for i in range(1, depth_limit):
        g[:, i] = successor[g[:, i - 1]]
    return g


def drafter_logits_reference(w: MLAWeights, successor: np.ndarray, roots, depth_limit: int, *, seed: int,
                             step: int, noise_std: float, logit_scale: float = 1.0) -> np.ndarray:
    """float64 ``[bs, depth_limit, vocab]``: the drafter's logits of one step.

    Row ``(b, d)`` = ``logit_scale * no_context_logits(g_d) + noise_std * z(step, b*L + d, v)``
    with ``g`` from :func:`drafter_chain_reference`: the distribution of the token at
    depth ``d + 1``.
    """
    g = drafter_chain_reference(successor, roots, depth_limit)
    bs = g.shape[0]
    V = w.config.vocab_size
    logits = no_context_logits(w, g.reshape(-1)).reshape(bs, depth_limit, V) * logit_scale
    if noise_std:
        rows = np.arange(bs * depth_limit).reshape(bs, depth_limit, 1)
        logits = logits + noise_std * draft_noise_reference(seed, step, rows, np.arange(V).reshape(1, 1, V))
    return logits


# --------------------------------------------------------------------------- statistics

def margin_report(margins) -> dict:
    """Summary of top-1 margins (logit units): count, min, 1st percentile, median."""
    m = np.concatenate([np.asarray(x, dtype=np.float64) for x in margins]) if len(margins) else np.zeros(0)
    if m.size == 0:
        return {"count": 0}
    return {"count": int(m.size), "min": float(m.min()), "p1": float(np.percentile(m, 1)),
            "median": float(np.median(m))}


def chain_acceptance(successor: np.ndarray, prompts, outputs, depth_limit: int) -> float:
    """Mean tokens per step of chain drafting (no tree) along greedy ``outputs``.

    At every step the drafter proposes ``successor`` applied repeatedly to the root;
    the step accepts the longest matching prefix (up to ``depth_limit``) plus the bonus
    token. Returns the mean tokens per step over all requests.
    """
    steps = tokens = 0
    for prompt, out in zip(prompts, outputs):
        seq = [int(prompt[-1])] + [int(t) for t in out]
        i = 0
        while i < len(out):
            root = seq[i]
            acc = 0
            g = root
            while acc < depth_limit and i + acc < len(out) - 1:
                g = int(successor[g])
                if g != out[i + acc]:
                    break
                acc += 1
            n = min(acc + 1, len(out) - i)
            tokens += n
            steps += 1
            i += n
    return tokens / max(steps, 1)


# --------------------------------------------------------------------------- the whole decode loop

def ddtree_generate_reference(w: MLAWeights, prompts, max_new_tokens: int, *, budget: int, depth_limit: int,
                              stop_token: int | None = None, noise_std: float = 1.0, logit_scale: float = 1.0,
                              seed: int = 0, successor: np.ndarray | None = None, max_context: int | None = None):
    """The DDTree decode loop on the host: drafter, tree build, compile, forward, accept, commit.

    Uses :mod:`driverlevel.reference.ddtree` for the tree steps and :func:`forward_reference`
    (bitmask mask) for the target, exactly as :class:`driverlevel.runner.DecodeStepRunner`
    sequences them on the GPU (the drafter's step counter starts at 1).

    Returns
    -------
    tokens : list of list of int
        Per request, at most ``max_new_tokens`` tokens (stop token included).
    tokens_per_step : float
        Mean tokens per (step, active request).
    """
    from driverlevel.reference import ddtree as rd

    prompts = [[int(t) for t in p] for p in prompts]
    bs = len(prompts)
    if successor is None:
        successor = no_context_successor(w)
    if max_context is None:
        max_context = max(len(p) for p in prompts) + max_new_tokens + budget + 2
    num_slots = bs * (max_context + budget + 1) + 1
    kv = np.zeros((num_slots, QK_DIM), dtype=np.float64)
    r2t = np.zeros((bs, max_context), dtype=np.int64)
    committed = np.zeros(bs, dtype=np.int64)
    roots = np.zeros(bs, dtype=np.int32)
    stack = list(range(num_slots - 1))
    for b, p in enumerate(prompts):
        k = len(p) - 1
        slots = [stack.pop() for _ in range(k)]
        r2t[b, :k] = slots
        committed[b] = k
        roots[b] = p[-1]
        if k:
            _, _, kvp = _project(w, np.asarray(p[:-1], dtype=np.int64), np.arange(k))
            kv[slots] = kvp
    pool = rd.SlotPool(np.asarray(stack + [-1] * (num_slots - len(stack)), dtype=np.int64), len(stack))
    active = np.ones(bs, dtype=bool)
    outs = [[] for _ in range(bs)]
    stops = None if stop_token is None else np.full((bs, 1), stop_token, dtype=np.int64)
    rows = np.arange(bs)
    step = 0
    emitted = act_steps = 0
    while active.any():
        step += 1
        logits = drafter_logits_reference(w, successor, roots, depth_limit, seed=seed, step=step,
                                          noise_std=noise_std, logit_scale=logit_scale).astype(np.float32)
        trees = rd.build_tree(roots, logits, budget, active=active)
        cs = rd.compile_tree(trees, committed, rows, r2t, pool)
        if cs.status & rd.STATUS_POOL_EXHAUSTED:
            raise RuntimeError("reference slot pool exhausted")
        tl = forward_reference(w, cs.input_ids, cs.positions, kv, cs.qo_indptr, cs.kv_indptr, cs.kv_indices,
                               cs.out_cache_loc, cs.bitmask, "bitmask")
        res = rd.greedy_accept(trees, cs.qo_indptr, tl, active, committed, max_context, depth_limit, roots, stops)
        rd.commit_paged(cs, res, rows, r2t, committed, pool)
        for b in range(bs):
            if not active[b]:
                continue
            act_steps += 1
            ne = int(res.num_emitted[b])
            room = max_new_tokens - len(outs[b])
            got = [int(t) for t in res.emitted[b, :ne]][:room]
            outs[b].extend(got)
            emitted += len(got)
        roots = res.root_tokens.copy()
        active = res.active.astype(bool) & np.array([len(o) < max_new_tokens for o in outs])
    return outs, emitted / max(act_steps, 1)
