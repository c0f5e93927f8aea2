"""DDTree kernels on the GPU against the numpy reference (driverlevel.reference.ddtree).

Trees node for node, masks bit for bit, metadata and pool state exactly; log-probs within
a few float32 ulps of the float64 reference (the GPU sums the exponentials in another
order). Outputs are poisoned before every call. 1,000 random build/compile/accept/commit
rounds count every slot; a captured graph replayed with new logits equals eager launches; the
build with programmatic dependent launch (sm_90+) equals the one without, bitwise.
"""

from __future__ import annotations

import functools
import numpy as np
import pytest

import driverlevel as dl
from driverlevel._dtypes import bf16_bits_to_f32, f32_to_bf16_bits
from driverlevel.ddtree import DDTreePlan, DDTreeState
from driverlevel.reference import ddtree as ref
from graph_util import graph_edges, kernel_node_carveouts

pytestmark = pytest.mark.gpu

TREE_OUTPUTS = ("tokens", "depths", "parents", "node_counts", "anc")
#: The build's two top-K paths (DDTreePlan(topk=...)): every top-K test runs both.
TOPK_MODES = ("chunked", "threshold")
#: Workspace of the threshold top-K, poisoned with the outputs (the kernels must re-arm it).
TK_STATE = ("tk_thresh", "tk_count", "tk_flag", "tk_cand", "tk_sum")


def poison_topk(plan, stream):
    """Poison the top-K workspace of either path (the chunk candidates; the threshold state)."""
    poison(plan, stream, ("cand", "chunk_max", "chunk_sum") + (TK_STATE if plan.topk == "threshold" else ()))
STEP_OUTPUTS = ("top_ids", "top_lp", "tokens", "depths", "parents", "node_counts", "anc", "input_ids", "positions",
                "out_cache_loc", "qo_indptr", "kv_indptr", "bitmask", "step", "posterior", "accepted_nodes",
                "accepted_count", "bonus", "records")


def upload(dev, host, dtype=None):
    host = np.ascontiguousarray(host)
    arr = dl.DeviceBuffer.allocate(dev, max(host.nbytes, 16), label="test").as_array(host.shape, dtype or host.dtype)
    arr.copy_from_host(host)
    return arr


def poison(plan, stream, names):
    for n in names:
        getattr(plan, n).fill_bytes(0xA5, stream)


class Rig:
    """A plan, a device state and the host copy of that state, kept in step by the tests."""

    def __init__(self, dev, rng, *, max_batch, depth, vocab, budget, max_context=64, num_slots=None,
                 dtype="float32", mask_formats=("bitmask", "full", "qlen_only"), n_stop=2, r2t_dtype=np.int32,
                 topk="threshold", pdl=None):  # the plan's defaults; top-K tests run both paths
        self.dev, self.rng = dev, rng
        self.plan = DDTreePlan(dev, max_batch=max_batch, depth_limit=depth, vocab=vocab, budget=budget,
                               max_context=max_context, logits_dtype=dtype, mask_formats=mask_formats, topk=topk,
                               pdl=pdl)
        self.B, self.D, self.V, self.budget = max_batch, depth, vocab, budget
        self.num_slots = num_slots or max_batch * (max_context + budget + 1)
        self.state = DDTreeState.allocate(dev, max_batch=max_batch, max_context=max_context,
                                          num_slots=self.num_slots, n_stop=n_stop, budgets=True, r2t_dtype=r2t_dtype)
        self.bf16 = dtype == "bfloat16"
        self.logits = dl.DeviceBuffer.allocate(dev, max_batch * depth * vocab * (2 if self.bf16 else 4)).as_array(
            (max_batch, depth, vocab), dl.bfloat16 if self.bf16 else np.float32)
        self.target = dl.DeviceBuffer.allocate(dev, self.plan.max_rows * 4).as_array((self.plan.max_rows,), np.int32)
        self.h = dict(
            active=np.ones(max_batch, np.uint8), root_tokens=rng.integers(0, vocab, max_batch).astype(np.int32),
            seq_lens=np.zeros(max_batch, np.int64), req_pool_indices=rng.permutation(max_batch).astype(np.int64),
            req_to_token=np.full((max_batch, max_context), -1, r2t_dtype), budgets=np.full(max_batch, budget, np.int32),
            stop_tokens=np.full((max_batch, n_stop), -1, np.int32))
        self.pool = ref.SlotPool(rng.permutation(self.num_slots).astype(np.int64), self.num_slots)

    def push_state(self):
        s = self.state
        s.upload(**self.h)
        s.free_slots.copy_from_host(self.pool.slots)
        s.free_count.copy_from_host(np.array([self.pool.count], np.int64))

    def new_logits(self, scale=3.0, ties=False):
        x = self.rng.standard_normal((self.B, self.D, self.V)).astype(np.float32) * scale
        if ties:
            x = np.round(x)
        if self.bf16:
            bits = f32_to_bf16_bits(x)
            self.logits.copy_from_host(bits)
            return bf16_bits_to_f32(bits)
        self.logits.copy_from_host(x)
        return x

    def get(self, *names):
        return {n: getattr(self.plan, n).to_numpy() for n in names}

    def replay_poisoned(self, gexec, stream, names):
        """The plan's outputs ``names`` filled with 0x5A bytes, ``gexec`` replayed on ``stream``:
        what the replay wrote (a stale eager result cannot pass for it)."""
        for n in names:
            getattr(self.plan, n).fill_bytes(0x5A, stream)
        gexec.launch(stream)
        stream.synchronize()
        return self.get(*names)

    def host_tree(self, out):
        """The reference TreeBatch built from the GPU's own top-K (the heap checked exactly)."""
        return ref.build_tree(self.h["root_tokens"], None, self.budget, budgets=self.h["budgets"],
                              active=self.h["active"], top=(out["top_ids"], out["top_lp"]))


def assert_tree_equal(tb, out, active):
    for b in range(active.shape[0]):
        n = int(tb.node_counts[b])
        assert out["node_counts"][b] == n, f"request {b}: {out['node_counts'][b]} nodes, want {n}"
        if not active[b]:
            continue
        for name in ("tokens", "depths", "parents"):
            np.testing.assert_array_equal(out[name][b], getattr(tb, name)[b], err_msg=f"{name} of request {b}")
        np.testing.assert_array_equal(out["anc"][b], tb.masks[b], err_msg=f"ancestor masks of request {b}")


# ------------------------------------------------------------------------------ build


@pytest.mark.parametrize("topk", TOPK_MODES)
@pytest.mark.parametrize("dtype, vocab, depth, budget, batch, ties", [
    ("float32", 163840, 15, 256, 3, False),
    ("bfloat16", 163840, 15, 512, 2, False),
    ("float32", 20000, 6, 64, 5, True),
    ("bfloat16", 3000, 3, 16, 4, False),
    ("float32", 300, 4, 512, 2, False),
    ("bfloat16", 8000, 5, 100, 3, True),
    ("float32", 3001, 3, 40, 2, False),   # odd vocab: element loads instead of 16-byte vectors
    ("bfloat16", 12345, 4, 64, 2, True),
    # the row merge's sort network at its edges (bitonic_desc): K = 1 (no sort), 2 and 3 (P = 2, 4:
    # one warp, padding), 481 (P = 512: every warp sorts, the log-sum-exp warp too)
    ("float32", 300, 3, 1, 2, False),
    ("bfloat16", 500, 3, 2, 2, True),
    ("float32", 1000, 4, 3, 3, False),
    ("float32", 5000, 4, 481, 2, False),
    # the merge's histogram ranking (cu/ddtree/build.cuh, hist_rank) and, with integer ties of
    # hundreds of candidates at the K-th, its crowded rows' select and sort
    ("float32", 163840, 4, 256, 2, True),
    ("bfloat16", 129280, 4, 512, 2, True),
])
def test_build_matches_reference(device, stream, dtype, vocab, depth, budget, batch, ties, topk):
    rng = np.random.default_rng(vocab + budget)
    rig = Rig(device, rng, max_batch=batch, depth=depth, vocab=vocab, budget=budget, dtype=dtype, topk=topk)
    rig.h["active"][1] = 0
    rig.h["budgets"][:] = rng.integers(0, budget + 1, batch)
    rig.h["budgets"][0] = budget
    rig.push_state()
    for _ in range(2):  # twice: the per-request counters must be back at 0 after a launch
        x = rig.new_logits(ties=ties)
        poison(rig.plan, stream, ("top_ids", "top_lp") + TREE_OUTPUTS)
        poison_topk(rig.plan, stream)
        rig.plan.build(stream, rig.logits, rig.state)
        stream.synchronize()
        out = rig.get("top_ids", "top_lp", *TREE_OUTPUTS)
        assert (rig.plan.counters.to_numpy() == 0).all()
        k = rig.plan.k
        exact = 0
        for b in np.flatnonzero(rig.h["active"]):
            ids, lp, lse = ref.topk_logprobs(x[b], k)
            np.testing.assert_array_equal(out["top_ids"][b], ids, err_msg=f"top-K ids of request {b}")
            tol = 4 * np.spacing(np.abs(lse))[:, None] + 2 * np.spacing(np.abs(lp)) + 1e-7
            assert (np.abs(out["top_lp"][b] - lp) <= tol).all(), f"log-probs of request {b}"
            exact += np.array_equal(out["top_lp"][b], lp)
            if np.array_equal(out["top_lp"][b], lp):  # then the whole pipeline equals the reference
                one = ref.build_tree(rig.h["root_tokens"][b:b + 1], x[b:b + 1], budget, budgets=rig.h["budgets"][b:b + 1])
                np.testing.assert_array_equal(out["tokens"][b], one.tokens[0])
        assert_tree_equal(rig.host_tree(out), out, rig.h["active"])


@functools.lru_cache(maxsize=4)
def _vocab_logits(dtype, vocab, batch, D):
    """The logits of test_topk_and_tree_at_model_vocabularies and their reference top-512, made
    once for both top-K paths (the host side took most of the test's time)."""
    rng = np.random.default_rng(vocab + batch + (dtype == "bfloat16"))
    x = rng.standard_normal((batch, D, vocab)).astype(np.float32) * 2.0
    x[0, 1] = np.round(x[0, 1])                                # many equal logits
    x[-1, 2] = np.sort(x[-1, 2])                               # ascending
    x[-1, 3] = np.nan                                          # all NaN
    x[-1, 4] = -np.inf                                         # all -inf
    x[-1, 5, 100:] = -np.inf                                   # 100 finite values (< K at 256, 512)
    x[-1, 5, rng.choice(np.arange(100, vocab), 1000, replace=False)] = np.nan
    if dtype == "bfloat16":
        x = bf16_bits_to_f32(f32_to_bf16_bits(x))
    x.setflags(write=False)
    kmax = 512  # the reference's order is total, so every smaller K is a prefix of the top 512
    return x, [ref.topk_logprobs(x[b], kmax) for b in range(batch)]


@pytest.mark.parametrize("topk", TOPK_MODES)
@pytest.mark.parametrize("batch", [1, 8])
@pytest.mark.parametrize("vocab", [129_280, 163_840, 151_936])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_topk_and_tree_at_model_vocabularies(device, stream, dtype, vocab, batch, topk):
    """The build's top-K at DeepSeek-V3 / Kimi / Qwen vocabularies (none a multiple of the
    top-K chunk), batch 1 and 8, depth 15, budgets 16 .. 512 (issue 12): top-K ids equal the
    reference's exactly (ties by the lower id: rounded logits in one row), log-probs within a
    few ulps, the tree equals the reference heap's on the GPU's own top-K. Rows sorted
    ascending, all NaN, all -inf and with fewer than K finite values ride along in the last
    request; the status says a row was not finite."""
    D = 15
    x, want = _vocab_logits(dtype, vocab, batch, D)
    rng = np.random.default_rng(vocab + batch + (dtype == "bfloat16") + 1)  # (the rigs' states)
    for budget in (16, 64, 256, 512):
        rig = Rig(device, rng, max_batch=batch, depth=D, vocab=vocab, budget=budget, dtype=dtype,
                  mask_formats=("bitmask",), topk=topk)
        rig.logits.copy_from_host(f32_to_bf16_bits(x) if rig.bf16 else x)
        rig.push_state()
        poison(rig.plan, stream, ("top_ids", "top_lp") + TREE_OUTPUTS)
        poison_topk(rig.plan, stream)
        rig.plan.build(stream, rig.logits, rig.state)
        stream.synchronize()
        out = rig.get("top_ids", "top_lp", "step", *TREE_OUTPUTS)
        k = rig.plan.k
        for b in range(batch):
            assert_topk_matches(out, b, want[b][0][:, :k], want[b][1][:, :k], want[b][2], f"budget {budget}")
        assert out["step"][3] & ref.STATUS_NONFINITE
        assert_tree_equal(rig.host_tree(out), out, rig.h["active"])
        if topk == "threshold" and budget == 512:  # the twin of the first and the last request (time)
            check_threshold_state(rig, x, "float32" if not rig.bf16 else "bfloat16", requests=sorted({0, batch - 1}))
        del rig


def assert_topk_matches(out, b, ids, lp, lse, what):
    """Request ``b``'s top-K equals the reference's: ids exactly, log-probs at the floor exactly
    (rows with no finite value), the others within a few ulps of the float64 log-sum-exp."""
    np.testing.assert_array_equal(out["top_ids"][b], ids, err_msg=f"{what}: top-K ids of request {b}")
    fin = lp != ref.LP_FLOOR
    np.testing.assert_array_equal(out["top_lp"][b][~fin], lp[~fin])
    with np.errstate(over="ignore", invalid="ignore"):
        tol = 4 * np.spacing(np.abs(np.nan_to_num(lse)))[:, None] + 2 * np.spacing(np.abs(lp)) + 1e-7
    assert (np.abs(out["top_lp"][b] - lp)[fin] <= tol[fin]).all(), f"{what}: log-probs of request {b}"


def check_threshold_state(rig, x, dtype, requests=None):
    """The threshold top-K's per-row state equals its numpy twin's: T (kth_largest_bound of the
    sampled keys: the kernel samples the same tokens and stops at the same histogram level), the count of logits >= T and the fallback
    decision (the chunk top-K ran for exactly those rows)."""
    from driverlevel.reference import topk_threshold as twin

    plan = rig.plan
    thresh, count, flag = plan.tk_thresh.to_numpy(), plan.tk_count.to_numpy(), plan.tk_flag.to_numpy()
    B, D = x.shape[:2]
    for b in (range(B) if requests is None else requests):
        if not rig.h["active"][b]:
            continue
        for d in range(D):
            r = twin.threshold_topk(x[b, d], plan.k, dtype == "bfloat16", sm_count=rig.dev.sm_count,
                                    rows=B * D)
            row = b * D + d
            want_t = np.float32(r.threshold)
            assert thresh[row] == want_t or (np.isnan(want_t) and np.isnan(thresh[row])), \
                f"row ({b}, {d}): T {thresh[row]} want {want_t}"
            early = bool(flag[row])
            assert early == (not np.isfinite(want_t)), f"row ({b}, {d}): flag {flag[row]}"
            if not early:
                assert count[row] == r.count, f"row ({b}, {d}): count {count[row]} want {r.count}"
            fallback = early or count[row] < plan.k or count[row] > plan.tk_cap
            assert fallback == r.fallback, f"row ({b}, {d}): fallback {fallback} want {r.fallback}"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_threshold_fallback_rows_are_exact(device, stream, dtype):
    """Rows where the sampled threshold fails stay exact: the sampled tokens boosted above the rest
    (count < K) and pushed below it (count > capacity; also on a row of negative logits, whose radix
    select's first window holds +0), where the build refines a threshold of its own (refine_row:
    the row's list then holds every logit >= T', the T' of refine_row's numpy twin, where the
    stream's held fewer than K or not all); a constant row and a flat row with spikes (count > capacity:
    every value ties with T) and an all-NaN row (T not finite), which take the chunk top-K;
    beside rows that keep the threshold (normal, integer-valued with ties at T, large logits
    clustered at low ids). The twin predicts every decision of the stream; replayed from a
    graph, equal. The chunk top-K runs in the row's ddtree_build CTA (its code on 512 threads):
    those rows' top-K ids and log-probs are bitwise those of a chunked plan (the chunk kernel,
    320 threads) on the same logits; the refined rows' ids are too."""
    from driverlevel._topk_threshold import sample_tokens
    from driverlevel.reference import topk_threshold as twin

    rng = np.random.default_rng(71)
    B, D, V, budget = 2, 6, 129_280, 256
    bf16 = dtype == "bfloat16"
    rig = Rig(device, rng, max_batch=B, depth=D, vocab=V, budget=budget, dtype=dtype, mask_formats=("bitmask",),
              topk="threshold")
    rig.push_state()
    x = rng.standard_normal((B, D, V)).astype(np.float32) * 2.0
    sampled = sample_tokens(V, bf16)
    x[0, 0, sampled] += 50.0                # only the sampled tokens are large: count <= m + slack < K
    x[0, 1] = 1.25                          # constant: count = V > capacity
    x[0, 2] = 0.0                           # flat with 100 spikes: T = 0, every value ties with it:
    x[0, 2, rng.choice(V, 100, replace=False)] = 7.0  # count > capacity
    x[0, 3] = np.nan                        # T = NaN (-inf): the stream skips the row
    x[0, 5] = np.round(x[0, 5])             # integers: many ties at T, the threshold holds
    x[1, 0, sampled] -= 50.0                # only the sampled tokens are small: count > capacity,
    #                                         refined above T
    x[1, 1, sampled[:96]] += 50.0           # 96 sampled tokens large: T ~ 51, count < K, the K-th
    #                                         largest ~6: three append windows, the third past the
    #                                         capacity, where the radix select starts
    x[1, 2] -= 20.0                         # every logit negative and the sampled ones small: count
    x[1, 2, sampled] -= 50.0                # > capacity, refined above T ~ -65 by the radix select,
    #                                         whose first window holds +0: no vector read past the
    #                                         row (129,280 tokens: 224 of them) may count as a logit
    x[1, 4, :3000] += 6.0                   # large logits clustered at low ids: the threshold holds,
    #                                         and up to 112 (fp32) / 167 (bf16) candidates in one warp
    #                                         tile take the stream's direct path (> TK_WARP_STAGE)
    if bf16:
        x = bf16_bits_to_f32(f32_to_bf16_bits(x))
    rig.logits.copy_from_host(f32_to_bf16_bits(x) if bf16 else x)
    with dl.capture(stream) as cap:
        rig.plan.build(stream, rig.logits, rig.state)
    gexec = cap.graph.instantiate()
    first = None
    for rnd in range(3):
        poison(rig.plan, stream, ("top_ids", "top_lp") + TREE_OUTPUTS)
        poison_topk(rig.plan, stream)
        if rnd == 1:
            gexec.launch(stream)
        else:
            rig.plan.build(stream, rig.logits, rig.state)
        stream.synchronize()
        out = rig.get("top_ids", "top_lp", *TREE_OUTPUTS)
        k = rig.plan.k
        for b in range(B):
            assert_topk_matches(out, b, *ref.topk_logprobs(x[b], k), f"round {rnd}")
        assert_tree_equal(rig.host_tree(out), out, rig.h["active"])
        check_threshold_state(rig, x, dtype)
        count, flag = rig.plan.tk_count.to_numpy(), rig.plan.tk_flag.to_numpy()
        fb = (flag != 0) | (count < k) | (count > rig.plan.tk_cap)
        assert np.flatnonzero(fb).tolist() == [0, 1, 2, 3, D, D + 1, D + 2], f"fallback rows {np.flatnonzero(fb)}"
        # refined (refine_row): the row's list is every logit >= the T' of the numpy twin of
        # refine_row, no more, no less (the list of a row the chunk top-K took holds < K of them)
        cand = rig.plan.tk_cand.to_numpy().reshape(B * D, -1)
        thresh = rig.plan.tk_thresh.to_numpy()
        for b, d in ((0, 0), (1, 0), (1, 1), (1, 2)):
            row = b * D + d
            r = twin.refine_threshold(x[b, d], k, thresh[row], int(count[row]), rig.plan.tk_cap)
            assert r.threshold is not None, (b, d, r)
            listed = (~(cand[row, :r.count] & np.uint64(0xFFFFFFFF)).astype(np.uint32)).view(np.int32)
            want_ids = np.flatnonzero(twin.order_keys(x[b, d]) >= twin.order_keys(np.array([r.threshold]))[0])
            np.testing.assert_array_equal(np.sort(listed), want_ids, err_msg=f"round {rnd}: refined row ({b}, {d})")
        if first is None:
            first = out
        else:  # eager and replayed builds are bitwise equal
            for n in out:
                np.testing.assert_array_equal(out[n], first[n], err_msg=f"round {rnd}: {n}")
    chunked = DDTreePlan(device, max_batch=B, depth_limit=D, vocab=V, budget=budget, max_context=rig.plan.max_context,
                         logits_dtype=dtype, mask_formats=("bitmask",), topk="chunked")
    poison(chunked, stream, ("top_ids", "top_lp"))
    chunked.build(stream, rig.logits, rig.state)
    stream.synchronize()
    want = plan_outputs(chunked, ("top_ids", "top_lp"))
    for n in ("top_ids", "top_lp"):  # request 0's rows 1..3 took the chunk top-K
        np.testing.assert_array_equal(first[n][0, 1:4], want[n][0, 1:4], err_msg=f"fallback rows vs chunked: {n}")
    for b, d in ((0, 0), (1, 0), (1, 1), (1, 2)):  # the refined rows: the same ids
        np.testing.assert_array_equal(first["top_ids"][b, d], want["top_ids"][b, d], err_msg=f"refined row ({b}, {d})")


def peaked_rows(rng, batch, depth, vocab, jitter):
    """Confident drafter rows (bench_ddtree --drafter peaked): N(0, 4) noise and four tokens at
    16 / 14 / 12.5 / 11.5 (top-1 probability ~0.76 at 163,840 tokens); ``jitter`` (standard
    deviation) moves each boost per row, else every depth has the same boosts and many paths'
    sums tie within rounding."""
    x = rng.standard_normal((batch, depth, vocab)).astype(np.float32) * 2.0
    top = rng.integers(0, vocab, (batch, depth, 4))
    for j, boost in enumerate((16.0, 14.0, 12.5, 11.5)):
        vals = boost + (rng.standard_normal((batch, depth, 1)) * jitter if jitter else 0.0)
        np.put_along_axis(x, top[:, :, j:j + 1], np.asarray(vals, np.float32), axis=2)
    return x


def search_defines(monkeypatch, extra):
    """Compile the plans made after this call with ``extra`` added to ddtree.cu's defines (e.g.
    ``DL_SEARCH_HEAP_BUDGET=0``: never the switch to the heap; ``DL_STAMPS=1``: phase stamps)."""
    from driverlevel import ddtree

    plain = ddtree.compile_defines
    monkeypatch.setattr(ddtree, "compile_defines", lambda arch, topk="threshold": {**plain(arch, topk), **extra})


def stamped_build(monkeypatch, rig, stream, x):
    """Build from the drafter logits ``x`` with a plan compiled with ``-DDL_STAMPS=1``
    (search_defines), check the tree against the reference node for node, and return the outputs
    and, for each CTA that searched a request's tree (it stamps ``searched``; not the code warmer,
    CTA (depth_limit, 0)), the set of its stamp points (``depth``: the parallel search ran)."""
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "tools"))
    import phase_stamps

    rig.logits.copy_from_host(x)
    phase_stamps.zero_stamps(rig.plan._module)
    rig.plan.build(stream, rig.logits, rig.state)
    stream.synchronize()
    recs = phase_stamps.read_stamps(rig.plan._module)
    out = rig.get("top_ids", "top_lp", *TREE_OUTPUTS)
    assert_tree_equal(rig.host_tree(out), out, rig.h["active"])
    warmer_row = rig.plan.depth_limit  # (cu/ddtree/build.cuh)
    searched = {row: {p for p, _, _, _ in r} for row, r in recs.items()
                if row != warmer_row and any(p == "searched" for p, _, _, _ in r)}
    return out, searched


@pytest.mark.parametrize("search", ["default", "parallel", "heap", "no-dev"])
@pytest.mark.parametrize("jitter", [0.0, 0.7])
@pytest.mark.parametrize("dtype, budget, batch", [("float32", 256, 3), ("bfloat16", 512, 2), ("float32", 16, 2),
                                                  ("bfloat16", 8, 2)])
def test_build_deep_trees(device, stream, monkeypatch, dtype, budget, batch, jitter, search):
    """Deep and wide trees (every depth of 15 holds nodes, tens per depth at budget 256): the
    random rows of the other tests give trees of at most four depths, and bench_ddtree's default
    rows stars. Confident rows at Kimi's vocabulary, with the boosts equal at every depth (many
    near-tied path sums: the ranks tuple decides) or jittered; the default search (at budgets 8
    and 16 these deep trees take the deviation search: search_bounds' switch), the parallel search
    alone (the switch compiled out), the heap alone (FLAG_LEGACY_SEARCH) and the switch to the heap
    without the deviation search (-DDL_DEV_SEARCH=0) all equal the reference tree on the GPU's own
    top-K, node for node, and the trees are deep."""
    from driverlevel.ddtree import FLAG_LEGACY_SEARCH

    if search == "parallel":
        search_defines(monkeypatch, {"DL_SEARCH_HEAP_BUDGET": 0})
    if search == "no-dev":
        search_defines(monkeypatch, {"DL_DEV_SEARCH": 0})
    rng = np.random.default_rng(budget * 10 + batch + int(jitter * 10))
    D, V = 15, 163_840
    rig = Rig(device, rng, max_batch=batch, depth=D, vocab=V, budget=budget, dtype=dtype, mask_formats=("bitmask",))
    if search == "heap":
        rig.plan.flags = FLAG_LEGACY_SEARCH
    rig.push_state()
    x = peaked_rows(rng, batch, D, V, jitter)
    if rig.bf16:
        x = bf16_bits_to_f32(f32_to_bf16_bits(x))
        rig.logits.copy_from_host(f32_to_bf16_bits(x))
    else:
        rig.logits.copy_from_host(x)
    poison(rig.plan, stream, ("top_ids", "top_lp") + TREE_OUTPUTS)
    poison_topk(rig.plan, stream)
    rig.plan.build(stream, rig.logits, rig.state)
    stream.synchronize()
    out = rig.get("top_ids", "top_lp", *TREE_OUTPUTS)
    k = rig.plan.k
    for b in range(batch):
        ids, lp, lse = ref.topk_logprobs(x[b], k)
        assert_topk_matches(out, b, ids, lp, lse, f"peaked rows, jitter {jitter}")
    tb = rig.host_tree(out)
    assert_tree_equal(tb, out, rig.h["active"])
    for b in range(batch):
        n = int(tb.node_counts[b])
        assert n == budget + 1
        # deep (the reference on these seeds: 15 at budgets 256 / 512; 8-10 at budget 16)
        assert out["depths"][b, :n].max() >= (12 if budget > 16 else 4 if budget < 16 else 6), out["depths"][b, :n].max()


@pytest.mark.parametrize("rows, budget, parallel", [("peaked", 16, False), ("stars", 16, True), ("peaked", 256, True)])
def test_search_switch_routes_by_depth_bound_and_budget(device, stream, monkeypatch, rows, budget, parallel):
    """search_bounds' switch, seen through the phase stamps (-DDL_STAMPS=1): deep trees of budget
    <= 16 take the deviation search (the request's search CTA stamps `dvdone` and no
    parallel-search depth), star trees (bench_ddtree's default rows: every node at depth 1) and
    budget 256 the parallel search (depth stamps); the tree equals the reference either way."""
    search_defines(monkeypatch, {"DL_STAMPS": 1})
    rng = np.random.default_rng(budget + (rows == "stars"))
    D, V, batch = 15, 163_840, 2
    rig = Rig(device, rng, max_batch=batch, depth=D, vocab=V, budget=budget, mask_formats=("bitmask",))
    rig.push_state()
    if rows == "peaked":
        x = peaked_rows(rng, batch, D, V, 0.7)
    else:  # nearly flat rows: four boosts 9 / 6 / 5 / 4 over N(0, 4) noise (bench_ddtree's default)
        x = rng.standard_normal((batch, D, V)).astype(np.float32) * 2.0
        top = rng.integers(0, V, (batch, D, 4))
        for j, boost in enumerate((9.0, 6.0, 5.0, 4.0)):
            np.put_along_axis(x, top[:, :, j:j + 1], np.float32(boost), axis=2)
    out, searched = stamped_build(monkeypatch, rig, stream, x)
    deepest = int(out["depths"][:, :budget + 1].max())
    assert (deepest <= 2) if rows == "stars" else (deepest >= 6), deepest  # (stars: depth bound <= 3)
    assert len(searched) == batch, sorted(searched)
    for row, points in searched.items():
        assert ("depth" in points) == parallel, (row, sorted(points))
        assert ("dvdone" in points) == (not parallel), (row, sorted(points))


def paired_rows(rng, batch, depth, vocab, gap):
    """Deep rows with two near-equal tokens at every depth (the second ``gap`` below the first):
    the budget-16 trees hold nodes of two deviations (rank 1 at two depths; gap 0.4), which the
    deviation search finds in its second round, or of three (gap 0.1), which it hands to the heap
    (research/probes/dev_search_twin.py: so on every seed tried)."""
    x = peaked_rows(rng, batch, depth, vocab, 0.3)
    top2 = np.argsort(-x, axis=2)[:, :, :2]
    np.put_along_axis(x, top2[:, :, 1:2], np.take_along_axis(x, top2[:, :, :1], axis=2) - np.float32(gap), axis=2)
    return x


@pytest.mark.parametrize("rows, budget, route", [("peaked", 16, "dvdone"), ("peaked", 4, "dvdone"),
                                                 ("paired 0.4", 16, "dvdone"), ("paired 0.1", 16, "dvfail"),
                                                 ("floored", 16, "dvfail")])
def test_deviation_search_exact_or_hands_to_the_heap(device, stream, monkeypatch, rows, budget, route):
    """The deviation search (cu/ddtree/search.cuh, dev_search) of deep trees of budget <= 16: on
    confident rows it builds the tree itself (stamp `dvdone`), also where the tree holds nodes of
    two deviations (paired rows, gap 0.4: its second round); where it may hold nodes of three
    (gap 0.1) or its float64 keys may be inexact (a row of request 0 with three finite logits:
    ranks 3.. floored to -FLT_MAX) it hands the request to the heap (stamp `dvfail`, no
    `dvdone`). Either way the tree equals the reference node for node (stamped_build checks it),
    poisoned outputs overwritten, and the trees are deep."""
    search_defines(monkeypatch, {"DL_STAMPS": 1})
    rng = np.random.default_rng(4000 + budget + len(rows))
    D, V, batch = 15, 32_768, 2
    rig = Rig(device, rng, max_batch=batch, depth=D, vocab=V, budget=budget, mask_formats=("bitmask",))
    rig.push_state()
    if rows.startswith("paired"):
        x = paired_rows(rng, batch, D, V, float(rows.split()[1]))
    else:
        x = peaked_rows(rng, batch, D, V, 0.7)
    if rows == "floored":
        keep = np.argsort(-x[0, 5])[:3]
        row = np.full(V, -np.inf, np.float32)
        row[keep] = x[0, 5, keep]
        x[0, 5] = row
    poison(rig.plan, stream, TREE_OUTPUTS)
    out, searched = stamped_build(monkeypatch, rig, stream, x)
    assert int(out["depths"][:, :budget + 1].max()) >= min(budget, 4)
    assert len(searched) == batch, sorted(searched)
    routes = {row: ("dvdone" if "dvdone" in points else "dvfail" if "dvfail" in points else "other")
              for row, points in searched.items()}
    if rows == "floored":  # request 1's rows are finite: it keeps the deviation search
        assert sorted(routes.values()) == ["dvdone", "dvfail"], routes
    else:
        assert set(routes.values()) == {route}, routes


@pytest.mark.parametrize("skew", [-3, 3, -1000, 1000])
def test_count_children_guess_off_still_exact(device, stream, monkeypatch, skew):
    """count_children (cu/ddtree/search.cuh) guesses each parent's count of children with a float32
    binary search and checks the guess exactly at two ranks; only a wrong guess runs the exact
    binary search, on the side that holds the answer. Random rows almost never make the guess
    wrong, so -DDL_SEARCH_GUESS_SKEW moves every guess by `skew` ranks (clamped to 0..kb: +-1000
    sends it to either end): the deep trees of budget 256 still equal the reference node for node,
    and the parallel search ran (its depth stamps, -DDL_STAMPS=1), not the heap."""
    search_defines(monkeypatch, {"DL_STAMPS": 1, "DL_SEARCH_GUESS_SKEW": skew})
    rng = np.random.default_rng(2000 + skew)  # (seeds must be >= 0)
    D, V, batch, budget = 15, 163_840, 2, 256
    rig = Rig(device, rng, max_batch=batch, depth=D, vocab=V, budget=budget, mask_formats=("bitmask",))
    rig.push_state()
    x = peaked_rows(rng, batch, D, V, 0.7)
    poison(rig.plan, stream, TREE_OUTPUTS)
    out, searched = stamped_build(monkeypatch, rig, stream, x)
    assert int(out["depths"][:, :budget + 1].max()) >= 12
    assert len(searched) == batch, sorted(searched)
    for row, points in searched.items():
        assert "depth" in points, (row, sorted(points))


@pytest.mark.parametrize("topk", TOPK_MODES)
@pytest.mark.parametrize("vocab, depth, batch", [(2048, 6, 4), (32768, 15, 8)])
def test_build_on_the_demo_drafters_rows(device, stream, vocab, depth, batch, topk):
    """The rows the decode-step runner builds from: the demo drafter's logits (its float64
    reference, rounded to fp32: 4 x the model's no-context logits + noise, so the row maximum is
    ~25 above the rest; with vocab 2,048 the sample is the whole row and the count is exactly K),
    budget 16: top-K and tree equal the reference's."""
    from driverlevel.demo._mla_weights import MLAModelConfig, make_weights
    from driverlevel.demo.reference import drafter_logits_reference, no_context_successor

    rng = np.random.default_rng(vocab)
    w = make_weights(MLAModelConfig(vocab_size=vocab, num_heads=9, num_classes=64, feature_dim=128, seed=3))
    roots = rng.integers(0, vocab, batch)
    x = drafter_logits_reference(w, no_context_successor(w), roots, depth, seed=0, step=1, noise_std=1.0,
                                 logit_scale=4.0).astype(np.float32)
    budget = 16
    rig = Rig(device, rng, max_batch=batch, depth=depth, vocab=vocab, budget=budget, topk=topk)
    rig.h["root_tokens"][:] = roots
    rig.push_state()
    rig.logits.copy_from_host(x)
    for _ in range(2):
        poison(rig.plan, stream, ("top_ids", "top_lp") + TREE_OUTPUTS)
        poison_topk(rig.plan, stream)
        rig.plan.build(stream, rig.logits, rig.state)
        stream.synchronize()
        out = rig.get("top_ids", "top_lp", *TREE_OUTPUTS)
        for b in range(batch):
            ids, lp, lse = ref.topk_logprobs(x[b], rig.plan.k)
            assert_topk_matches(out, b, ids, lp, lse, f"demo rows, {topk}")
        assert_tree_equal(rig.host_tree(out), out, rig.h["active"])
        if topk == "threshold":
            check_threshold_state(rig, x, "float32")


def test_build_chain_and_star_extremes(device, stream):
    """A dominant token per depth gives a chain; flat rows give a star of siblings."""
    rng = np.random.default_rng(3)
    rig = Rig(device, rng, max_batch=2, depth=8, vocab=5000, budget=64)
    rig.push_state()
    x = rng.standard_normal((2, 8, 5000)).astype(np.float32) * 0.01
    x[0, :, 7] = 40.0  # request 0: token 7 at every depth, then the rest
    rig.logits.copy_from_host(x)
    rig.plan.build(stream, rig.logits, rig.state)
    stream.synchronize()
    out = rig.get("top_ids", "top_lp", *TREE_OUTPUTS)
    tb = rig.host_tree(out)
    assert_tree_equal(tb, out, rig.h["active"])
    assert out["depths"][0, :9].tolist() == list(range(9))  # the chain comes first
    assert (out["depths"][1, 1:] == 1).sum() >= 60  # nearly flat: mostly depth-1 siblings


def warm_lp_host(D, K):
    """``warm_lp(d, k)`` of cu/ddtree/build.cuh in numpy float32 ``[D, K]`` (the device may contract
    to FMAs and its log2f rounds differently: equal within a few ulps, not bitwise)."""
    from driverlevel._topk_threshold import hash32

    d, k = np.meshgrid(np.arange(D), np.arange(K), indexing="ij")
    frac = (hash32((d * 1024 + k).astype(np.uint64)).astype(np.uint32) >> np.uint32(8)).astype(np.float32) \
        * np.float32(2.0 ** -24)
    x = np.float32(1) + k.astype(np.float32) + np.float32(0.999) * frac
    return np.float32(-5.4) - np.float32(0.5) * np.log2(x).astype(np.float32)


def check_warm_scratch(ws, D, K, N, W, root, budget):
    """The code warmer's scratch ``ws`` (int32, cu/ddtree/build.cuh's layout) against the reference
    search on its own log-probs; returns the warmer's node count."""
    assert ws.dtype == np.int32 and ws.shape == (D * K + 3 * N + N * W + 1,)
    gids = ws[:D * K].reshape(D, K)  # its token ids: its log-probs' bits
    lp = gids.view(np.float32)
    assert np.isfinite(lp).all(), "the warmer's log-probs are not all finite"
    assert (np.diff(lp.astype(np.float64), axis=1) < 0).all(), "the warmer's log-probs do not decrease along a row"
    np.testing.assert_allclose(lp, warm_lp_host(D, K), rtol=0, atol=1e-5, err_msg="the warmer's log-probs")
    o = D * K
    depths, parents, tokens = ws[o:o + N], ws[o + N:o + 2 * N], ws[o + 2 * N:o + 3 * N]
    anc = ws[o + 3 * N:o + 3 * N + N * W].view(np.uint32).reshape(N, W)
    count = int(ws[o + 3 * N + N * W])
    # The reference takes ids >= 0: the bits without their sign (every warm_lp is negative; for
    # negative int32 that map keeps both distinctness and order), and the sign back on its tokens.
    assert (lp < 0).all()
    ids = (gids.view(np.uint32) & np.uint32(0x7FFFFFFF)).astype(np.int64)
    tree = ref.build_tree_from_topk(root, ids, lp, budget)
    n = tree.num_nodes
    assert count == n, f"the warmer built {count} nodes, the reference {n}"
    want = tree.tokens.astype(np.int64)
    want[1:] |= 0x80000000
    np.testing.assert_array_equal(tokens[:n], want.astype(np.uint32).view(np.int32), err_msg="the warmer's tokens")
    np.testing.assert_array_equal(depths[:n], tree.depths, err_msg="the warmer's depths")
    np.testing.assert_array_equal(parents[:n], tree.parents, err_msg="the warmer's parents")
    np.testing.assert_array_equal(anc[:n], ref.ancestor_masks(tree.parents, W), err_msg="the warmer's anc")
    return n


@pytest.mark.parametrize("budget, depth", [(16, 6), (256, 15)])
@pytest.mark.parametrize("batch", [1, 8])
def test_the_code_warmer_builds_the_reference_tree_of_its_own_log_probs(device, stream, budget, depth, batch):
    """Review 17 L3: ddtree_build's code warmer (CTA (depth_limit, 0), cu/ddtree/build.cuh) runs and
    computes what it should, which no other test would notice (a warmer that exits early or writes
    garbage leaves the requests' outputs right).

    After one build (and again after a second, the scratch poisoned before each), ``plan.warm_scratch``
    holds, in build.cuh's layout: ``warm_lp``'s log-probs ``[depth_limit, K]`` (finite, strictly
    decreasing along each row, within 1e-5 of a numpy float32 rebuild with ``hash32``); then the
    warmer's tree, whose depths, parents, tokens (the log-probs' int32 bits as token ids, the root
    ``root_tokens[0]``), ancestor masks (bit for bit) and node count equal
    ``reference.ddtree.build_tree_from_topk(root_tokens[0], bits, log_probs, budget)`` (the bits
    without their sign: the reference takes ids >= 0) and
    ``ancestor_masks`` exactly (the warmer always spends its whole budget: there is nothing past
    its count to check). At batch 8 request 0 is inactive: the
    warmer still builds on its root token, and the other requests' trees stay the reference's.
    (The outputs do not tell the parallel search from the one-warp heap fallback: both are exact.
    With warm_lp's rows, two rank-0 steps sum below rank K - 1 (-10.8 against >= -9.9), so the
    warmer's tree is a star of depth-1 nodes: this pins its result, not the search's deeper order.)
    """
    rng = np.random.default_rng(budget + batch)
    rig = Rig(device, rng, max_batch=batch, depth=depth, vocab=3000, budget=budget)
    plan = rig.plan
    D, K, N, W = plan.depth_limit, plan.k, plan.budget + 1, plan.n_words
    assert (D, K, N) == (depth, budget, budget + 1)  # vocab > budget: K = budget
    if batch > 1:
        rig.h["active"][0] = 0
    rig.push_state()
    root = int(rig.h["root_tokens"][0])
    for _ in range(2):
        rig.new_logits()
        poison(plan, stream, ("warm_scratch", "top_ids", "top_lp") + TREE_OUTPUTS)
        plan.build(stream, rig.logits, rig.state)
        stream.synchronize()
        n = check_warm_scratch(plan.warm_scratch.to_numpy(), D, K, N, W, root, budget)
        assert n == budget + 1  # D * K > budget candidates: the budget is spent
        out = rig.get("top_ids", "top_lp", *TREE_OUTPUTS)
        assert_tree_equal(rig.host_tree(out), out, rig.h["active"])


# ------------------------------------------------------------------------------ compile


@pytest.mark.parametrize("r2t_dtype, exhaust", [(np.int32, False), (np.int64, False), (np.int32, True)])
def test_compile_matches_reference(device, stream, r2t_dtype, exhaust):
    rng = np.random.default_rng(11)
    rig = Rig(device, rng, max_batch=4, depth=5, vocab=4000, budget=40, max_context=128, r2t_dtype=r2t_dtype)
    rig.h["active"][2] = 0
    rig.h["seq_lens"][:] = [17, 3, 50, 0]
    used = rng.permutation(rig.num_slots)
    off = 0
    for b in range(4):
        c = int(rig.h["seq_lens"][b])
        rig.h["req_to_token"][rig.h["req_pool_indices"][b], :c] = used[off:off + c]
        off += c
    free = used[off:]
    rig.pool = ref.SlotPool(np.concatenate([free, np.full(off, -3)]).astype(np.int64), 30 if exhaust else free.size)
    rig.push_state()
    rig.new_logits()
    rig.plan.build(stream, rig.logits, rig.state)
    poison(rig.plan, stream, ("input_ids", "positions", "out_cache_loc", "qo_indptr", "kv_indptr", "kv_indices",
                              "bitmask", "full_mask", "qlen_mask", "full_indptr", "qlen_indptr", "step"))
    rig.plan.compile(stream, rig.state)
    stream.synchronize()
    out = rig.get("top_ids", "top_lp", *TREE_OUTPUTS, "input_ids", "positions", "out_cache_loc", "qo_indptr",
                  "kv_indptr", "kv_indices", "bitmask", "full_mask", "qlen_mask", "full_indptr", "qlen_indptr", "step")
    tb = rig.host_tree(out)
    assert_tree_equal(tb, out, rig.h["active"])
    st = ref.compile_tree(tb, rig.h["seq_lens"], rig.h["req_pool_indices"], rig.h["req_to_token"], rig.pool)
    t = st.alloc_total
    assert out["step"][:3].tolist() == [st.alloc_base, t, st.status]
    assert bool(st.status & ref.STATUS_POOL_EXHAUSTED) == exhaust
    np.testing.assert_array_equal(out["qo_indptr"], st.qo_indptr)
    np.testing.assert_array_equal(out["kv_indptr"], st.kv_indptr)
    np.testing.assert_array_equal(out["input_ids"][:t], st.input_ids)
    np.testing.assert_array_equal(out["positions"][:t], st.positions)
    np.testing.assert_array_equal(out["out_cache_loc"][:t], st.out_cache_loc)
    # rows past the step's (poisoned above): no token, no position, no slot to write
    assert t < out["out_cache_loc"].shape[0]
    assert (out["input_ids"][t:] == 0).all() and (out["positions"][t:] == 0).all()
    assert (out["out_cache_loc"][t:] == -1).all()
    np.testing.assert_array_equal(out["kv_indices"][:st.kv_indptr[-1]], st.kv_indices)
    np.testing.assert_array_equal(out["bitmask"][:t], st.bitmask)
    np.testing.assert_array_equal(out["full_indptr"], st.full_indptr)
    np.testing.assert_array_equal(out["qlen_indptr"], st.qlen_indptr)
    np.testing.assert_array_equal(out["full_mask"][:st.full_indptr[-1]], st.full_mask)
    np.testing.assert_array_equal(out["qlen_mask"][:st.qlen_indptr[-1]], st.qlen_mask)


# ------------------------------------------------------------------------------ accept / commit


def random_posterior(rng, tb, qo, vocab, follow=0.7):
    """Target tokens that follow a random branch part of the way, then leave the tree."""
    post = rng.integers(0, vocab, int(qo[-1])).astype(np.int32)
    for b in range(tb.node_counts.shape[0]):
        n = int(tb.node_counts[b])
        par = tb.parents[b, :n]
        for i in range(n):
            kids = np.flatnonzero(par == i)
            if kids.size and rng.random() < follow:
                post[qo[b] + i] = tb.tokens[b, rng.choice(kids)]
    return post


def check_state(rig):
    got = rig.state.download()
    for name in ("active", "root_tokens", "seq_lens", "req_to_token"):
        np.testing.assert_array_equal(got[name], rig.h[name], err_msg=name)
    assert got["free_count"][0] == rig.pool.count
    np.testing.assert_array_equal(got["free_slots"][:rig.pool.count], rig.pool.slots[:rig.pool.count],
                                  err_msg="free-slot stack")


@pytest.mark.parametrize("dtype, V", [("float32", 3000), ("bfloat16", 3000), ("float32", 3001), ("bfloat16", 2999)])
def test_accept_from_target_logits_with_stop_tokens_and_mirror(device, stream, dtype, V):
    rng = np.random.default_rng(21)
    rig = Rig(device, rng, max_batch=5, depth=4, vocab=V, budget=30, max_context=40, dtype=dtype)
    rig.h["active"][3] = 0
    rig.h["seq_lens"][:] = [0, 5, 38, 0, 9]  # request 2 has room for 2 nodes only
    rig.push_state()
    rig.new_logits(scale=2.0)
    rig.plan.build(stream, rig.logits, rig.state)
    rig.plan.compile(stream, rig.state)
    stream.synchronize()
    out = rig.get("top_ids", "top_lp", *TREE_OUTPUTS, "qo_indptr")
    tb = rig.host_tree(out)
    qo = out["qo_indptr"]
    st = ref.compile_tree(tb, rig.h["seq_lens"], rig.h["req_pool_indices"], rig.h["req_to_token"], rig.pool)
    assert st.status == ref.STATUS_CONTEXT_FULL  # request 2 cannot hold its tree
    post = random_posterior(rng, tb, qo, V, follow=0.9)
    rig.h["stop_tokens"][4, 0] = tb.tokens[4, 1]  # a stop token request 4 may accept
    rig.state.upload(stop_tokens=rig.h["stop_tokens"])
    logits = rng.standard_normal((rig.plan.max_rows, V)).astype(np.float32)
    logits[np.arange(post.size), post] = 9.0
    logits[0, (post[0] + 1) % V] = 9.0  # a tie: the lower id must win
    if dtype == "bfloat16":
        bits = f32_to_bf16_bits(logits)
        tl, host = upload(device, bits, dl.bfloat16), bf16_bits_to_f32(bits)
    else:
        tl, host = upload(device, logits), logits
    mirror = rig.plan.allocate_mirror()
    rig.plan.read_records(mirror)[:] = -99
    poison(rig.plan, stream, ("posterior", "accepted_nodes", "accepted_count", "bonus", "records"))
    rig.plan.accept(stream, rig.state, target_logits=tl, mirror=mirror)
    stream.synchronize()
    res = ref.greedy_accept(tb, qo, host[:qo[-1]], rig.h["active"], rig.h["seq_lens"], 40, 4,
                            root_tokens=rig.h["root_tokens"], stop_tokens=rig.h["stop_tokens"])
    got = rig.get("posterior", "accepted_nodes", "accepted_count", "bonus", "records", "step")
    act = rig.h["active"].astype(bool)
    for b in np.flatnonzero(act):
        np.testing.assert_array_equal(got["posterior"][qo[b]:qo[b + 1]], res.posterior[qo[b]:qo[b + 1]])
    np.testing.assert_array_equal(got["accepted_nodes"], res.accepted_nodes)
    np.testing.assert_array_equal(got["accepted_count"], res.accepted_count)
    np.testing.assert_array_equal(got["bonus"], res.bonus)
    np.testing.assert_array_equal(got["records"], ref.accept_records(res))
    np.testing.assert_array_equal(rig.plan.read_records(mirror), got["records"])
    assert got["step"][2] == st.status | res.status
    rig.h["active"], rig.h["root_tokens"] = res.active, res.root_tokens
    state = rig.state.download()
    np.testing.assert_array_equal(state["active"], res.active)
    np.testing.assert_array_equal(state["root_tokens"], res.root_tokens)


def test_thousand_rounds_count_every_slot(device, stream):
    rng = np.random.default_rng(5)
    B, D, V, budget, ctx = 6, 4, 700, 24, 96
    rig = Rig(device, rng, max_batch=B, depth=D, vocab=V, budget=budget, max_context=ctx,
              num_slots=B * (ctx + budget + 1), mask_formats=("bitmask",))
    rig.h["stop_tokens"][:, 0] = rng.integers(0, V, B)
    rig.push_state()
    rounds = 1000
    for step in range(rounds):
        rig.h["budgets"][:] = rng.integers(0, budget + 1, B)
        rig.state.upload(budgets=rig.h["budgets"])
        rig.new_logits(scale=2.5)
        rig.plan.build(stream, rig.logits, rig.state)
        rig.plan.compile(stream, rig.state)
        stream.synchronize()
        out = rig.get("top_ids", "top_lp", *TREE_OUTPUTS, "qo_indptr", "out_cache_loc", "step")
        tb = rig.host_tree(out)
        if step % 50 == 0:
            assert_tree_equal(tb, out, rig.h["active"])
        st = ref.compile_tree(tb, rig.h["seq_lens"], rig.h["req_pool_indices"], rig.h["req_to_token"], rig.pool)
        assert out["step"][:3].tolist() == [st.alloc_base, st.alloc_total, st.status], f"round {step}"
        np.testing.assert_array_equal(out["out_cache_loc"][:st.alloc_total], st.out_cache_loc)
        post = random_posterior(rng, tb, st.qo_indptr, V)
        rig.target.copy_from_host(np.concatenate([post, np.zeros(rig.plan.max_rows - post.size, np.int32)]))
        rig.plan.accept(stream, rig.state, target_tokens=rig.target)
        rig.plan.commit(stream, rig.state)
        res = ref.greedy_accept(tb, st.qo_indptr, post, rig.h["active"], rig.h["seq_lens"], ctx, D,
                                root_tokens=rig.h["root_tokens"], stop_tokens=rig.h["stop_tokens"])
        ref.commit_paged(st, res, rig.h["req_pool_indices"], rig.h["req_to_token"], rig.h["seq_lens"], rig.pool)
        rig.h["active"], rig.h["root_tokens"] = res.active, res.root_tokens
        stream.synchronize()
        check_state(rig)
        held = [int(s) for b in range(B) for s in rig.h["req_to_token"][rig.h["req_pool_indices"][b], :rig.h["seq_lens"][b]]]
        free = rig.state.free_slots.to_numpy()[:int(rig.state.free_count.to_numpy()[0])]
        assert len(held) + free.size == rig.num_slots, f"round {step}: a slot leaked"
        assert np.array_equal(np.sort(np.concatenate([held, free])), np.arange(rig.num_slots)), f"round {step}: double"
        for b in np.flatnonzero(rig.h["active"] == 0):  # finished: release its slots and start again
            row = rig.h["req_pool_indices"][b]
            c = int(rig.h["seq_lens"][b])
            rig.pool.slots[rig.pool.count:rig.pool.count + c] = rig.h["req_to_token"][row, :c]
            rig.pool.count += c
            rig.h["req_to_token"][row, :] = -1
            rig.h["seq_lens"][b] = 0
            rig.h["active"][b] = 1
            rig.h["root_tokens"][b] = rng.integers(0, V)
        rig.push_state()


def test_commit_dense_matches_reference(device, stream):
    rng = np.random.default_rng(8)
    B, D, ctx, layers = 3, 4, 48, 2
    rig = Rig(device, rng, max_batch=B, depth=D, vocab=900, budget=20, max_context=ctx, mask_formats=("bitmask",))
    rig.h["seq_lens"][:] = [0, 10, 20]
    rig.push_state()
    x = rng.standard_normal((B, D, 900)).astype(np.float32)
    x[:, :, 5] += 12.0  # a confident drafter: the chain of token 5 comes first
    rig.logits.copy_from_host(x)
    rig.plan.build(stream, rig.logits, rig.state)
    rig.plan.compile(stream, rig.state)
    stream.synchronize()
    out = rig.get("top_ids", "top_lp", *TREE_OUTPUTS, "qo_indptr")
    tb = rig.host_tree(out)
    post = random_posterior(rng, tb, out["qo_indptr"], 900, follow=0.0)
    for b in range(B):  # request b's target agrees with the best child b + 2 times
        qo, cur = out["qo_indptr"][b], 0
        for _ in range(b + 2):
            kids = np.flatnonzero(tb.parents[b, :tb.node_counts[b]] == cur)
            if kids.size == 0:
                break
            post[qo + cur] = tb.tokens[b, kids[0]]
            cur = kids[0]
    rig.target.copy_from_host(np.concatenate([post, np.zeros(rig.plan.max_rows - post.size, np.int32)]))
    cache_h = rng.standard_normal((layers, B, ctx, 16)).astype(np.float32)  # 64-byte rows
    cache = upload(device, cache_h)
    rig.plan.accept(stream, rig.state, target_tokens=rig.target)
    rig.plan.commit_dense(stream, rig.state, cache)
    stream.synchronize()
    res = ref.greedy_accept(tb, out["qo_indptr"], post, rig.h["active"], rig.h["seq_lens"], ctx, D)
    assert res.accepted_count.max() >= 3
    ref.commit_dense(cache_h, res, rig.h["seq_lens"])
    np.testing.assert_array_equal(cache.to_numpy(), cache_h)
    np.testing.assert_array_equal(rig.state.seq_lens.to_numpy(), rig.h["seq_lens"])


# ------------------------------------------------------------------------------ graphs


@pytest.mark.parametrize("topk", TOPK_MODES)
def test_graph_replay_with_new_logits_equals_eager(device, stream, topk):
    rng = np.random.default_rng(9)
    B, D, V, budget, ctx = 4, 6, 12000, 48, 200
    eager = Rig(device, rng, max_batch=B, depth=D, vocab=V, budget=budget, max_context=ctx, mask_formats=("bitmask",),
                topk=topk)
    plan = eager.plan
    graph_state = DDTreeState.allocate(device, max_batch=B, max_context=ctx, num_slots=eager.num_slots, n_stop=2,
                                       budgets=True)
    eager.h["active"][2] = 0
    eager.h["stop_tokens"][:, 0] = rng.integers(0, V, B)
    eager.push_state()
    for name, value in eager.state.download().items():
        getattr(graph_state, name).copy_from_host(value)
    mirror = plan.allocate_mirror()
    with dl.capture(stream) as cap:
        plan.build(stream, eager.logits, graph_state)
        plan.compile(stream, graph_state)
        plan.accept(stream, graph_state, target_tokens=eager.target, mirror=mirror)
        plan.commit(stream, graph_state)
    gexec = cap.graph.instantiate()
    for step in range(6):
        eager.new_logits(scale=2.0)
        plan.build(stream, eager.logits, eager.state)
        plan.compile(stream, eager.state)
        stream.synchronize()
        out = eager.get("top_ids", "top_lp", *TREE_OUTPUTS, "qo_indptr")
        tb = ref.build_tree(eager.state.root_tokens.to_numpy(), None, budget, budgets=eager.state.budgets.to_numpy(),
                            active=eager.state.active.to_numpy(), top=(out["top_ids"], out["top_lp"]))
        post = random_posterior(rng, tb, out["qo_indptr"], V, follow=0.8)
        eager.target.copy_from_host(np.concatenate([post, np.zeros(plan.max_rows - post.size, np.int32)]))
        plan.accept(stream, eager.state, target_tokens=eager.target)
        plan.commit(stream, eager.state)
        stream.synchronize()
        want = eager.get(*STEP_OUTPUTS)
        want_state = eager.state.download()
        got = eager.replay_poisoned(gexec, stream, STEP_OUTPUTS)
        for n in STEP_OUTPUTS:
            if n in ("input_ids", "positions", "out_cache_loc", "bitmask", "posterior"):
                t = int(want["qo_indptr"][-1])
                np.testing.assert_array_equal(got[n][:t], want[n][:t], err_msg=f"step {step}: {n}")
            elif n in ("tokens", "depths", "parents", "anc"):
                for b in np.flatnonzero(want["node_counts"] > 0):
                    np.testing.assert_array_equal(got[n][b], want[n][b], err_msg=f"step {step}: {n}[{b}]")
            elif n in ("top_ids", "top_lp"):
                for b in np.flatnonzero(want["node_counts"] > 0):
                    np.testing.assert_array_equal(got[n][b], want[n][b], err_msg=f"step {step}: {n}[{b}]")
            else:
                np.testing.assert_array_equal(got[n], want[n], err_msg=f"step {step}: {n}")
        for name, value in graph_state.download().items():
            np.testing.assert_array_equal(value, want_state[name], err_msg=f"step {step}: state.{name}")
        np.testing.assert_array_equal(plan.read_records(mirror), want["records"])


# ------------------------------------------------------------------------------ programmatic launch


def need_pdl(device):
    """Skip below compute capability 9.0 (DDTreePlan(pdl=True) refuses it there)."""
    if device.compute_capability < (9, 0):
        pytest.skip(f"programmatic dependent launch needs sm_90 or newer, GPU 0 is {device.arch}")


def plan_outputs(plan, names):
    return {n: getattr(plan, n).to_numpy() for n in names}


@pytest.mark.parametrize("topk", TOPK_MODES)
@pytest.mark.parametrize("dtype, vocab, depth, budget, batch", [
    ("float32", 163840, 15, 256, 8),
    ("bfloat16", 129280, 15, 512, 3),
    ("float32", 20000, 6, 64, 5),
    ("bfloat16", 3001, 4, 40, 2),   # odd vocab: the stream loads elements (no cp.async prologue)
])
def test_build_with_pdl_equals_without(device, stream, dtype, vocab, depth, budget, batch, topk):
    """DDTreePlan(pdl=True) (the stream and build kernels, or chunked's build, launched programmatically,
    waiting inside) gives bitwise the build of pdl=False on the same logits and state: top-K,
    log-probs, tree, the threshold state; eager and replayed from a graph, several rounds with
    the outputs poisoned in between; both equal the reference. An inactive request (its CTAs
    exit early, after the wait) and rows that take the threshold's fallback (a constant row:
    count > capacity; an all-NaN row: flagged) ride along."""
    need_pdl(device)
    rng = np.random.default_rng(vocab + budget + batch)
    rig = Rig(device, rng, max_batch=batch, depth=depth, vocab=vocab, budget=budget, dtype=dtype,
              mask_formats=("bitmask",), topk=topk, pdl=False)
    on = DDTreePlan(device, max_batch=batch, depth_limit=depth, vocab=vocab, budget=budget, max_context=64,
                    logits_dtype=dtype, mask_formats=("bitmask",), topk=topk, pdl=True)
    assert on.pdl and not rig.plan.pdl
    rig.h["active"][1] = 0
    rig.h["budgets"][:] = rng.integers(0, budget + 1, batch)
    rig.h["budgets"][0] = budget
    rig.push_state()
    names = ("top_ids", "top_lp") + TREE_OUTPUTS + (("tk_thresh", "tk_count", "tk_flag") if topk == "threshold" else ())
    plans = {"off": rig.plan, "on": on}
    graphs = {}
    for key, plan in plans.items():  # packed and captured once; replays read the logits buffer anew
        with dl.capture(stream) as cap:
            plan.build(stream, rig.logits, rig.state)
        graphs[key] = cap.graph.instantiate()
    for rnd in range(3):
        x = rig.new_logits(ties=rnd == 1)
        x[0, 0] = 1.25      # constant: count = vocab > capacity, the chunk top-K takes the row
        x[0, 1] = np.nan    # T not finite: flagged, the stream skips the row
        rig.logits.copy_from_host(f32_to_bf16_bits(x) if rig.bf16 else x)
        got = {}
        for key, plan in plans.items():
            for how in ("eager", "graph", "graph again"):
                poison(plan, stream, ("top_ids", "top_lp") + TREE_OUTPUTS)
                poison_topk(plan, stream)
                if how == "eager":
                    plan.build(stream, rig.logits, rig.state)
                else:
                    graphs[key].launch(stream)
                stream.synchronize()
                got[key, how] = plan_outputs(plan, names)
                assert (plan.counters.to_numpy() == 0).all(), f"round {rnd}, pdl {key}, {how}: counters"
        want = got["off", "eager"]
        for (key, how), out in got.items():
            for n in names:
                np.testing.assert_array_equal(out[n], want[n], err_msg=f"round {rnd}, pdl {key}, {how}: {n}")
        k = rig.plan.k
        for b in np.flatnonzero(rig.h["active"]):
            assert_topk_matches(want, b, *ref.topk_logprobs(x[b], k), f"round {rnd}")
        assert_tree_equal(rig.host_tree(want), want, rig.h["active"])
        assert (want["node_counts"][rig.h["active"] == 0] == 0).all()


@pytest.mark.parametrize("topk", TOPK_MODES)
def test_pdl_build_captures_programmatic_edges(device, stream, topk):
    """Stream capture of a pdl build records each programmatic launch's dependency as a
    programmatic edge (CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC): threshold sample -> stream ->
    build (the build runs the chunk fallback of a failed row itself), chunked chunks -> build;
    with pdl=False every edge is a plain one. (Without such edges a replayed graph would run
    correctly but serialize the kernels as before.)"""
    from cuda.bindings import driver

    need_pdl(device)
    rng = np.random.default_rng(5)
    sfx = "f32"
    chain = ([f"ddtree_topk_sample_{sfx}", f"ddtree_topk_stream_{sfx}"] if topk == "threshold" else
             [f"ddtree_topk_chunks_{sfx}"]) + ["ddtree_build"]
    want_pairs = list(zip(chain[:-1], chain[1:]))
    for pdl in (False, True):
        rig = Rig(device, rng, max_batch=2, depth=3, vocab=5000, budget=16, mask_formats=("bitmask",), topk=topk,
                  pdl=pdl)
        rig.push_state()
        rig.new_logits()
        with dl.capture(stream) as cap:
            rig.plan.build(stream, rig.logits, rig.state)
        edges = graph_edges(cap.graph)
        assert sorted((a, b) for a, b, _ in edges) == sorted(want_pairs), f"pdl={pdl}: edges {edges}"
        kinds = {(a, b): (int(d.type), int(d.from_port), int(d.to_port)) for a, b, d in edges}
        want = int(driver.CUgraphDependencyType.CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC) if pdl else 0
        for pair, kind in kinds.items():
            assert kind[0] == want, f"pdl={pdl}: edge {pair} has (type, from_port, to_port) {kind}, want type {want}"
        gexec = cap.graph.instantiate()  # instantiable and runs
        gexec.launch(stream)
        stream.synchronize()


def test_sample_carveout_is_captured_and_the_build_unchanged(device, stream):
    """A pdl threshold plan most of whose stream CTAs do not fit beside the sample's SMs (batch 8,
    depth 15: _topk_threshold.sample_carveout) launches the sample kernel with the largest
    carveout, and stream capture records it on the sample's node; one that fits (batch 1, depth 3)
    does not ask. Either way the replayed build equals the eager one (outputs poisoned in between)
    and its top-K equals the float64 reference's."""
    from driverlevel import _topk_threshold as tk

    need_pdl(device)
    rng = np.random.default_rng(17)
    asked = []
    for max_batch, depth in ((1, 3), (8, 15)):
        rig = Rig(device, rng, max_batch=max_batch, depth=depth, vocab=5000, budget=16, mask_formats=("bitmask",),
                  topk="threshold", pdl=True)
        plan, rows = rig.plan, max_batch * depth
        want = tk.sample_carveout(rows, rows * plan.tk_nseg, device.sm_count, plan.tk_ctas_per_sm)
        assert plan.tk_sample_carveout == want
        asked.append(want)
        rig.push_state()
        x = rig.new_logits()
        plan.build(stream, rig.logits, rig.state)
        stream.synchronize()
        names = ("top_ids", "top_lp", *TREE_OUTPUTS)
        eager = rig.get(*names)
        for b in range(max_batch):
            assert_topk_matches(eager, b, *ref.topk_logprobs(x[b], plan.k), f"batch {max_batch}")
        with dl.capture(stream) as cap:
            plan.build(stream, rig.logits, rig.state)
        carve = kernel_node_carveouts(cap.graph)
        if want is not None:
            assert carve["ddtree_topk_sample_f32"] == want, carve
        got = rig.replay_poisoned(cap.graph.instantiate(), stream, names)
        for n in names:
            np.testing.assert_array_equal(got[n], eager[n], err_msg=f"batch {max_batch}: {n}")
    assert asked[0] is None  # (a quarter of 3 rows x 2 stream CTAs fit beside the sample on any GPU of 4 or more SMs)
    if asked[1] is None:  # (4 stream CTAs per SM: 135 SMs or more hold a quarter of batch 8's 240 beside the sample)
        pytest.skip(f"the batch-8 shape does not ask for the carveout on {device.sm_count} SMs: only the build checked")


# ------------------------------------------------------------------------------ validation


def test_validation_names_the_argument(device, stream):
    rng = np.random.default_rng(1)
    rig = Rig(device, rng, max_batch=2, depth=3, vocab=500, budget=8, mask_formats=("bitmask",))
    wrong = dl.DeviceBuffer.allocate(device, 2 * 3 * 500 * 2).as_array((2, 3, 500), dl.bfloat16)
    with pytest.raises(TypeError, match="logits must have dtype float32"):
        rig.plan.build(stream, wrong, rig.state)
    short = dl.DeviceBuffer.allocate(device, 2 * 3 * 499 * 4).as_array((2, 3, 499), np.float32)
    with pytest.raises(ValueError, match=r"logits must have shape \(2, 3, 500\)"):
        rig.plan.build(stream, short, rig.state)
    with pytest.raises(ValueError, match="exactly one of target_logits and target_tokens"):
        rig.plan.accept(stream, rig.state)
    small = dl.DeviceBuffer.allocate(device, 4 * 4).as_array((4,), np.int32)
    with pytest.raises(ValueError, match="target_tokens must have shape"):
        rig.plan.accept(stream, rig.state, target_tokens=small)
    bad_state = DDTreeState(**{**rig.state.__dict__, "seq_lens": small})
    with pytest.raises(TypeError, match="state.seq_lens must have dtype int64"):
        rig.plan.compile(stream, bad_state)
    with pytest.raises(TypeError, match="state must be a RequestState"):
        rig.plan.commit(stream, {"active": None})
