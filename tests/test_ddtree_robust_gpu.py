"""DDTree kernels under hostile inputs (issue 11): non-finite logits, a poisoned build counter,
a dense commit at the end of its window, and corrupted per-step metadata reported through the
device error word. Every result is checked against the numpy reference, never against zeros.
"""

from __future__ import annotations

import numpy as np
import pytest

import driverlevel as dl
from driverlevel._dtypes import bf16_bits_to_f32, f32_to_bf16_bits
from driverlevel._errors import MetadataError
from driverlevel.reference import ddtree as ref
from test_ddtree_gpu import (TOPK_MODES, TREE_OUTPUTS, Rig, assert_tree_equal, check_threshold_state, poison, poison_topk,
                             random_posterior, upload)

pytestmark = pytest.mark.gpu

FLOOR = np.float32(ref.LP_FLOOR)


def _walk(tb, b, post_b):
    """The accepted path of request b under posterior post_b (finite rows)."""
    n = int(tb.node_counts[b])
    par, tok = tb.parents[b, :n], tb.tokens[b, :n]
    cur, path = 0, [0]
    while True:
        kids = np.flatnonzero((par == cur) & (tok == post_b[cur]))
        if kids.size == 0:
            return path
        cur = int(kids[0])
        path.append(cur)


def _to_device_logits(device, x, dtype):
    if dtype == "bfloat16":
        bits = f32_to_bf16_bits(x)
        return upload(device, bits, dl.bfloat16), bf16_bits_to_f32(bits)
    return upload(device, x), x


def _fill_table(rig):
    """Valid slots for every request's committed prefix; the rest of the slots form the pool."""
    used = rig.rng.permutation(rig.num_slots)
    off = 0
    for b in range(rig.B):
        c = int(rig.h["seq_lens"][b])
        rig.h["req_to_token"][rig.h["req_pool_indices"][b], :c] = used[off:off + c]
        off += c
    rig.pool = ref.SlotPool(np.concatenate([used[off:], np.full(off, -3)]).astype(np.int64), used.size - off)


def _force_chain(tb, b, post, qo):
    """Make request b's target follow the best child at every node; returns the path."""
    n = int(tb.node_counts[b])
    par, tok = tb.parents[b, :n], tb.tokens[b, :n]
    cur, path = 0, [0]
    while True:
        kids = np.flatnonzero(par == cur)
        if kids.size == 0:
            return path
        post[qo[b] + cur] = tok[kids[0]]
        cur = int(kids[0])
        path.append(cur)


# ------------------------------------------------------------------------------ 3b: non-finite rows


@pytest.mark.parametrize("dtype, V", [("float32", 3000), ("bfloat16", 3000), ("float32", 3001)])
def test_nonfinite_target_rows_finish_the_request(device, stream, dtype, V):
    """All-NaN and all -inf target rows give posterior 0 (never -1), end the walk there, and
    finish the request with FINISH_NONFINITE and STATUS_NONFINITE; NaN in rows the walk does not
    end at has no influence; partial-NaN rows take the argmax of their finite values."""
    rng = np.random.default_rng(41)
    B, D, ctx = 5, 4, 64
    rig = Rig(device, rng, max_batch=B, depth=D, vocab=V, budget=24, max_context=ctx, dtype=dtype,
              mask_formats=("bitmask",))
    rig.push_state()
    x = rng.standard_normal((B, D, V)).astype(np.float32) * 2.0
    x[:, :, 11] += 6.0  # a confident drafter: paths of several nodes exist
    rig.logits.copy_from_host(f32_to_bf16_bits(x) if dtype == "bfloat16" else x)
    rig.plan.build(stream, rig.logits, rig.state)
    rig.plan.compile(stream, rig.state)
    stream.synchronize()
    out = rig.get("top_ids", "top_lp", *TREE_OUTPUTS, "qo_indptr", "step")
    tb = rig.host_tree(out)
    qo = out["qo_indptr"]
    post = random_posterior(rng, tb, qo, V, follow=1.0)
    path2 = _force_chain(tb, 2, post, qo)
    path3 = _force_chain(tb, 3, post, qo)
    logits = rng.standard_normal((rig.plan.max_rows, V)).astype(np.float32)
    logits[np.arange(post.size), post] = 9.0
    logits[qo[0]] = np.nan                                   # request 0: root row all NaN
    logits[qo[1]] = -np.inf                                  # request 1: root row all -inf
    assert len(path2) >= 3 and _walk(tb, 2, post[qo[2]:qo[3]]) == path2, path2
    mix = np.where(rng.random(V) < 0.5, np.float32(np.nan), np.float32(-np.inf))
    logits[qo[2] + path2[1]] = mix                          # request 2: NaN / -inf mix on its path
    assert _walk(tb, 3, post[qo[3]:qo[4]]) == path3
    off = [i for i in range(int(tb.node_counts[3])) if i not in path3]
    assert off
    logits[qo[3] + off[0]] = np.nan                          # request 3: NaN off its path: no influence
    row = logits[qo[3]]
    cols = np.flatnonzero(row < 9.0)[:200]
    row[cols] = np.nan                                       # partial NaN on its root row
    cols = np.flatnonzero(logits[qo[4]] < 9.0)[:5]
    logits[qo[4], cols] = np.nan                             # request 4: NaN in a row that keeps its argmax
    tl, host = _to_device_logits(device, logits, dtype)
    poison(rig.plan, stream, ("posterior", "accepted_nodes", "accepted_count", "bonus", "records"))
    rig.plan.accept(stream, rig.state, target_logits=tl)
    stream.synchronize()
    res = ref.greedy_accept(tb, qo, host[:qo[-1]], rig.h["active"], rig.h["seq_lens"], ctx, D,
                            root_tokens=rig.h["root_tokens"], stop_tokens=rig.h["stop_tokens"])
    got = rig.get("posterior", "accepted_nodes", "accepted_count", "bonus", "records", "step")
    t = int(qo[-1])
    assert ((got["posterior"][:t] >= 0) & (got["posterior"][:t] < V)).all()
    np.testing.assert_array_equal(got["posterior"][:t], res.posterior)
    np.testing.assert_array_equal(got["accepted_nodes"], res.accepted_nodes)
    np.testing.assert_array_equal(got["accepted_count"], res.accepted_count)
    np.testing.assert_array_equal(got["bonus"], res.bonus)
    np.testing.assert_array_equal(got["records"], ref.accept_records(res))
    assert res.finished.tolist()[:3] == [ref.FINISH_NONFINITE] * 3
    assert res.accepted_count[2] == 2 and res.finished[3] == 0 and res.finished[4] == 0
    assert res.accepted_count[3] == len(path3)
    assert got["step"][2] & ref.STATUS_NONFINITE
    assert got["step"][2] == out["step"][2] | res.status
    state = rig.state.download()
    np.testing.assert_array_equal(state["active"], res.active)
    np.testing.assert_array_equal(state["root_tokens"], res.root_tokens)
    assert (state["root_tokens"] >= 0).all()
    rig.plan.check_errors()  # not-finite rows are data, not bad metadata


@pytest.mark.parametrize("topk", TOPK_MODES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_nonfinite_drafter_rows_topk_and_tree(device, stream, dtype, topk):
    """Top-K of rows that are all NaN, all -inf, +inf, NaN-sprinkled, with fewer than K finite
    values, with a whole chunk of -inf, or with one logit 60 or 200 above the rest: ids equal the reference (NaN = -inf, ties by id),
    distinct and in range; log-probs equal it (the floor exactly); the tree is the reference's."""
    rng = np.random.default_rng(43)
    B, D, V, budget = 3, 4, 20000, 64
    rig = Rig(device, rng, max_batch=B, depth=D, vocab=V, budget=budget, max_context=128, dtype=dtype,
              mask_formats=("bitmask",), topk=topk)
    rig.push_state()
    x = rng.standard_normal((B, D, V)).astype(np.float32) * 3.0
    x[0, 1] = np.nan                                           # all NaN
    x[0, 2] = -np.inf                                          # all -inf
    x[1, 0, 50:] = -np.inf                                     # 50 finite values < K = 64 ...
    x[1, 0, rng.choice(np.arange(50, V), 300, replace=False)] = np.nan  # ... and NaN among the rest
    x[1, 3, rng.choice(V, 500, replace=False)] = np.nan        # NaN sprinkled over a normal row
    x[2, 2, 7680:15360] = -np.inf                              # a whole chunk of -inf
    x[2, 3, 7] = np.inf                                        # +inf: no distribution
    x[2, 0, 5] = 60.0                                          # far above the rest: a large term e^(x - T)
    x[2, 1, 123] = 200.0                                       # >= 80 above T: ddtree_build sums the candidates
    if dtype == "bfloat16":
        bits = f32_to_bf16_bits(x)
        rig.logits.copy_from_host(bits)
        x = bf16_bits_to_f32(bits)
    else:
        rig.logits.copy_from_host(x)
    for _ in range(2):
        poison(rig.plan, stream, ("top_ids", "top_lp") + TREE_OUTPUTS)
        poison_topk(rig.plan, stream)
        rig.plan.build(stream, rig.logits, rig.state)
        rig.plan.compile(stream, rig.state)
        stream.synchronize()
        out = rig.get("top_ids", "top_lp", "step", *TREE_OUTPUTS)
        k = rig.plan.k
        for b in range(B):
            ids, lp, lse = ref.topk_logprobs(x[b], k)
            np.testing.assert_array_equal(out["top_ids"][b], ids, err_msg=f"top-K ids of request {b}")
            for d in range(D):
                assert np.unique(ids[d]).size == k and ((ids[d] >= 0) & (ids[d] < V)).all()
            floor = lp == FLOOR
            np.testing.assert_array_equal(out["top_lp"][b][floor], lp[floor], err_msg=f"floor log-probs of {b}")
            fin = ~floor
            with np.errstate(over="ignore"):
                tol = 4 * np.spacing(np.abs(np.nan_to_num(lse)))[:, None] + 2 * np.spacing(np.abs(lp)) + 1e-7
            assert (np.abs(out["top_lp"][b] - lp)[fin] <= tol[fin]).all(), f"log-probs of request {b}"
            assert (np.diff(out["top_lp"][b], axis=1) <= 0).all()
        assert (out["top_lp"][0, 1] == FLOOR).all() and (out["top_lp"][0, 2] == FLOOR).all()
        assert (out["top_lp"][2, 3] == FLOOR).all() and (out["top_lp"][1, 0, 50:] == FLOOR).all()
        tb = rig.host_tree(out)
        assert_tree_equal(tb, out, rig.h["active"])
        for b in range(B):
            n = int(out["node_counts"][b])
            assert n == budget + 1
            tok, par = out["tokens"][b, :n], out["parents"][b, :n]
            assert ((tok[1:] >= 0) & (tok[1:] < V)).all()
            for p in np.unique(par[1:]):
                kids = tok[1:][par[1:] == p]
                assert np.unique(kids).size == kids.size, f"duplicate siblings in request {b}"
        assert out["step"][3] & ref.STATUS_NONFINITE and out["step"][2] & ref.STATUS_NONFINITE
        if topk == "threshold":
            check_threshold_state(rig, x, dtype)


# ------------------------------------------------------------------------------ 8: poisoned counter


@pytest.mark.parametrize("topk", TOPK_MODES)
def test_poisoned_build_counter_is_rearmed_in_every_build(device, stream, topk):
    """A per-request counter left non-zero (an aborted replay) must not break later builds,
    eager or replayed from a graph (threshold top-K: its row counters and flags too)."""
    rng = np.random.default_rng(47)
    B, D, V, budget = 3, 5, 9000, 40
    rig = Rig(device, rng, max_batch=B, depth=D, vocab=V, budget=budget, max_context=128, mask_formats=("bitmask",),
              topk=topk)
    rig.push_state()
    with dl.capture(stream) as cap:
        rig.plan.build(stream, rig.logits, rig.state)
    gexec = cap.graph.instantiate()
    for rnd, value in enumerate((0x01, 0x5A, 0xFF, 0x03, 0x80, 0x7F)):
        x = rig.new_logits(scale=2.5)
        rig.plan.counters.fill_bytes(value, stream)
        if topk == "threshold":
            rig.plan.tk_count.fill_bytes(value, stream)
            rig.plan.tk_flag.fill_bytes(value, stream)
        poison(rig.plan, stream, ("top_ids", "top_lp") + TREE_OUTPUTS)
        if rnd % 2:
            gexec.launch(stream)
        else:
            rig.plan.build(stream, rig.logits, rig.state)
        stream.synchronize()
        out = rig.get("top_ids", "top_lp", *TREE_OUTPUTS)
        for b in range(B):
            ids, _, _ = ref.topk_logprobs(x[b], rig.plan.k)
            np.testing.assert_array_equal(out["top_ids"][b], ids, err_msg=f"round {rnd}: ids of {b}")
        assert (out["node_counts"] == budget + 1).all(), f"round {rnd}: {out['node_counts']}"
        assert_tree_equal(rig.host_tree(out), out, rig.h["active"])
        assert (rig.plan.counters.to_numpy() == 0).all()


# ------------------------------------------------------------------------------ 10: dense commit


def test_dense_commit_at_the_end_of_the_window(device, stream):
    """60 committed tokens in a window of 64 accepting a 4-node path whose later nodes lie past
    the window: nothing is copied from another request's window, the path is cut, the request
    finishes and STATUS_CONTEXT_FULL is set -- as the reference says."""
    rng = np.random.default_rng(53)
    B, D, V, ctx, layers = 2, 4, 900, 64, 2
    rig = Rig(device, rng, max_batch=B, depth=D, vocab=V, budget=20, max_context=ctx, mask_formats=("bitmask",))
    rig.h["seq_lens"][:] = [60, 10]
    _fill_table(rig)
    rig.push_state()
    x = rng.standard_normal((B, D, V)).astype(np.float32)
    x[:, :, 5] += 8.0  # two dominant tokens per depth: a binary tree of them comes first
    x[:, :, 6] += 7.5
    rig.logits.copy_from_host(x)
    rig.plan.build(stream, rig.logits, rig.state)
    rig.plan.compile(stream, rig.state)
    stream.synchronize()
    out = rig.get("top_ids", "top_lp", *TREE_OUTPUTS, "qo_indptr", "step")
    tb = rig.host_tree(out)
    qo = out["qo_indptr"]
    assert out["step"][2] & ref.STATUS_CONTEXT_FULL  # the tree of request 0 does not fit
    n0 = int(tb.node_counts[0])
    par, dep, tok = tb.parents[0, :n0], tb.depths[0, :n0], tb.tokens[0, :n0]
    best = None
    for n3 in np.flatnonzero(dep == 3):
        path = [int(n3)]
        while path[-1] != 0:
            path.append(int(par[path[-1]]))
        path = path[::-1]
        if 60 + path[2] >= ctx and (best is None or path[1] < best[1]):
            best = path
    assert best is not None, "no depth-3 node past the window"
    post = random_posterior(rng, tb, qo, V, follow=0.0)
    for a, c in zip(best[:-1], best[1:]):
        post[qo[0] + a] = tok[c]
    post[qo[0] + best[-1]] = next(t for t in range(V) if t not in set(tok.tolist()))  # the bonus
    rig.target.copy_from_host(np.concatenate([post, np.zeros(rig.plan.max_rows - post.size, np.int32)]))
    cache_h = rng.standard_normal((layers, B, ctx, 16)).astype(np.float32)  # 64-byte rows
    cache = upload(device, cache_h)
    rig.plan.accept(stream, rig.state, target_tokens=rig.target)
    rig.plan.commit_dense(stream, rig.state, cache)
    stream.synchronize()
    res = ref.greedy_accept(tb, qo, post, rig.h["active"], rig.h["seq_lens"], ctx, D,
                            root_tokens=rig.h["root_tokens"], stop_tokens=rig.h["stop_tokens"])
    assert res.accepted_nodes[0, :4].tolist() == best and res.accepted_count[0] == 4
    committed = rig.h["seq_lens"].copy()
    status = ref.commit_dense(cache_h, res, committed)
    assert status == ref.STATUS_CONTEXT_FULL and res.accepted_count[0] < 4
    np.testing.assert_array_equal(cache.to_numpy(), cache_h)
    state = rig.state.download()
    np.testing.assert_array_equal(state["seq_lens"], committed)
    np.testing.assert_array_equal(state["active"], res.active)
    np.testing.assert_array_equal(rig.plan.accepted_count.to_numpy(), res.accepted_count)
    assert rig.plan.step.to_numpy()[2] & ref.STATUS_CONTEXT_FULL
    assert committed[0] <= ctx
    rig.plan.check_errors()


# ------------------------------------------------------------------------------ 5: bad metadata


def _round(rig, stream, post_follow=0.7, target=None):
    """build + compile + accept (target tokens) + commit; returns the GPU outputs."""
    p = rig.plan
    p.build(stream, rig.logits, rig.state)
    p.compile(stream, rig.state)
    stream.synchronize()
    out = rig.get("top_ids", "top_lp", *TREE_OUTPUTS, "qo_indptr", "kv_indptr", "kv_indices", "input_ids",
                  "positions", "out_cache_loc", "step")
    if target is None:
        tb = rig.host_tree(out)
        target = random_posterior(rig.rng, tb, out["qo_indptr"], rig.V, follow=post_follow)
    rig.target.copy_from_host(np.concatenate([target, np.zeros(p.max_rows - target.size, np.int32)]))
    p.accept(stream, rig.state, target_tokens=rig.target)
    p.commit(stream, rig.state)
    stream.synchronize()
    out.update(rig.get("accepted_count", "records"))
    return out


def _expect_error(rig, request, field, code=None):
    with pytest.raises(MetadataError) as ei:
        rig.plan.check_errors()
    e = ei.value
    assert e.field == field, str(e)
    if request is not None:
        assert e.request in (request if isinstance(request, tuple) else (request,)), str(e)
    if code is not None:
        assert e.code == code, str(e)
    assert field in str(e)
    rig.plan.check_errors()  # cleared


def _check_compile_others(rig, out, bad, h, pool, kv_fix=None):
    """The other requests' compile outputs equal the reference with request `bad` given no rows."""
    tb = rig.host_tree(out)
    tb.node_counts[bad] = 0
    st = ref.compile_tree(tb, h["seq_lens"], np.clip(h["req_pool_indices"], 0, rig.B - 1),
                          h["req_to_token"], pool)
    np.testing.assert_array_equal(out["qo_indptr"], st.qo_indptr)
    np.testing.assert_array_equal(out["kv_indptr"], st.kv_indptr)
    assert (np.diff(out["kv_indptr"]) >= 0).all() and out["kv_indptr"][0] == 0
    t = st.alloc_total
    np.testing.assert_array_equal(out["input_ids"][:t], st.input_ids)
    np.testing.assert_array_equal(out["positions"][:t], st.positions)
    np.testing.assert_array_equal(out["out_cache_loc"][:t], st.out_cache_loc)
    want_kv = st.kv_indices.copy()
    if kv_fix is not None:
        want_kv = kv_fix(want_kv)
    np.testing.assert_array_equal(out["kv_indices"][:st.kv_indptr[-1]], want_kv)


def test_corrupted_metadata_is_reported_and_contained(device, stream):
    rng = np.random.default_rng(59)
    B, D, V, budget, ctx = 4, 4, 3000, 24, 64
    rig = Rig(device, rng, max_batch=B, depth=D, vocab=V, budget=budget, max_context=ctx, mask_formats=("bitmask",))
    rig.h["seq_lens"][:] = [7, 12, 3, 20]
    _fill_table(rig)
    clean_h = {k: v.copy() for k, v in rig.h.items()}
    clean_pool = ref.SlotPool(rig.pool.slots.copy(), rig.pool.count)

    def restore():
        rig.h = {k: v.copy() for k, v in clean_h.items()}
        rig.pool = ref.SlotPool(clean_pool.slots.copy(), clean_pool.count)
        rig.push_state()

    def clean_round_matches_reference():
        restore()
        rig.new_logits()
        out = _round(rig, stream)
        rig.plan.check_errors()
        tb = rig.host_tree(out)
        assert_tree_equal(tb, out, rig.h["active"])
        st = ref.compile_tree(tb, rig.h["seq_lens"], rig.h["req_pool_indices"], rig.h["req_to_token"], rig.pool)
        np.testing.assert_array_equal(out["qo_indptr"], st.qo_indptr)
        np.testing.assert_array_equal(out["kv_indices"][:st.kv_indptr[-1]], st.kv_indices)
        assert out["step"][:3].tolist() == [st.alloc_base, st.alloc_total, st.status]

    def built_on_a_clean_state():  # (the cases that corrupt what compile wrote, before accept and commit)
        restore()
        rig.new_logits()
        rig.plan.build(stream, rig.logits, rig.state)
        rig.plan.compile(stream, rig.state)
        stream.synchronize()

    def accept_random_targets_and_commit():
        rig.target.copy_from_host(rng.integers(0, V, rig.plan.max_rows).astype(np.int32))
        rig.plan.accept(stream, rig.state, target_tokens=rig.target)
        rig.plan.commit(stream, rig.state)
        stream.synchronize()

    clean_round_matches_reference()

    # 1. a committed length far past max_context (kv_indptr would overflow int32 at 2 x 1.1e9)
    restore()
    rig.new_logits()
    h = {k: v.copy() for k, v in rig.h.items()}
    h["seq_lens"][1] = 1_100_000_000
    h["seq_lens"][2] = 1_100_000_000
    rig.state.upload(seq_lens=h["seq_lens"])
    out = _round(rig, stream)
    _expect_error(rig, (1, 2), "seq_lens", "over_max")
    _check_compile_others(rig, out, [1, 2], h, rig.pool)
    assert out["accepted_count"][1] == 0 and out["accepted_count"][0] >= 1
    assert rig.state.seq_lens.to_numpy()[1] == 1_100_000_000  # left as it was
    clean_round_matches_reference()

    # 2. a req_pool_indices row outside req_to_token
    restore()
    rig.new_logits()
    h = {k: v.copy() for k, v in rig.h.items()}
    h["req_pool_indices"][2] = 77
    rig.state.upload(req_pool_indices=h["req_pool_indices"])
    out = _round(rig, stream)
    _expect_error(rig, 2, "req_pool_indices", "out_of_range")
    _check_compile_others(rig, out, 2, h, rig.pool)
    clean_round_matches_reference()

    # 3. a root token outside the vocabulary: no tree for that request
    restore()
    rig.new_logits()
    h = {k: v.copy() for k, v in rig.h.items()}
    h["root_tokens"][0] = -1
    rig.state.upload(root_tokens=h["root_tokens"])
    out = _round(rig, stream)
    _expect_error(rig, 0, "tree_tokens", "out_of_range")
    assert out["node_counts"][0] == 0 and (out["node_counts"][1:] == budget + 1).all()
    _check_compile_others(rig, out, 0, h, rig.pool)
    clean_round_matches_reference()

    # 4. a pool count past the free-slot stack: no slot handed out, nothing committed
    restore()
    rig.new_logits()
    rig.state.free_count.copy_from_host(np.array([rig.num_slots + 5], np.int64))
    out = _round(rig, stream)
    _expect_error(rig, None, "out_cache_loc", "out_of_range")
    assert out["step"][2] & ref.STATUS_POOL_EXHAUSTED
    t = int(out["qo_indptr"][-1])
    assert (out["out_cache_loc"][:t] == -1).all()
    np.testing.assert_array_equal(rig.state.seq_lens.to_numpy(), rig.h["seq_lens"])
    clean_round_matches_reference()

    # 5. a slot id in req_to_token outside the pool
    restore()
    rig.new_logits()
    h = {k: v.copy() for k, v in rig.h.items()}
    row3 = h["req_pool_indices"][3]
    h["req_to_token"][row3, 5] = rig.num_slots + 9
    rig.state.upload(req_to_token=h["req_to_token"])
    out = _round(rig, stream)
    _expect_error(rig, 3, "req_to_token", "out_of_range")
    start3 = int(out["kv_indptr"][3])

    def fix(kv):
        kv[start3 + 5] = -1
        return kv
    tb = rig.host_tree(out)
    st = ref.compile_tree(tb, h["seq_lens"], h["req_pool_indices"], h["req_to_token"], rig.pool)
    np.testing.assert_array_equal(out["kv_indices"][:st.kv_indptr[-1]], fix(st.kv_indices.copy()))
    np.testing.assert_array_equal(out["input_ids"][:st.alloc_total], st.input_ids)
    clean_round_matches_reference()

    # 6. a target token outside the vocabulary: the walk ends there and the request finishes
    built_on_a_clean_state()
    pre = rig.get("top_ids", "top_lp", *TREE_OUTPUTS, "qo_indptr")
    tb = rig.host_tree(pre)
    post = random_posterior(rng, tb, pre["qo_indptr"], V, follow=0.5)
    post[pre["qo_indptr"][1]] = V + 3
    out = _round(rig, stream, target=post)
    _expect_error(rig, 1, "logits", "out_of_range")
    res = ref.greedy_accept(tb, pre["qo_indptr"], post, rig.h["active"], rig.h["seq_lens"], ctx, D,
                            root_tokens=rig.h["root_tokens"], stop_tokens=rig.h["stop_tokens"], vocab=V)
    np.testing.assert_array_equal(out["records"], ref.accept_records(res))
    assert res.finished[1] == ref.FINISH_NONFINITE
    clean_round_matches_reference()

    # 7. a parent index past its child (the build writes parents first)
    built_on_a_clean_state()
    par = rig.plan.parents.to_numpy()
    par[2, 3] = 40
    par[2, 5] = -7
    rig.plan.parents.copy_from_host(par)
    accept_random_targets_and_commit()
    _expect_error(rig, 2, "parents", "out_of_range")
    clean_round_matches_reference()

    # 8. a qo_indptr that disagrees with the plan (request 2 claims too many rows)
    built_on_a_clean_state()
    qo = rig.plan.qo_indptr.to_numpy()
    qo[3] = qo[2] + 10_000
    rig.plan.qo_indptr.copy_from_host(qo)
    accept_random_targets_and_commit()
    _expect_error(rig, (2, 3), "qo_indptr")
    assert (rig.plan.accepted_count.to_numpy()[2:] == 0).all()
    clean_round_matches_reference()

    # 9. a sane row count at rows far outside out_cache_loc (request 2 moved to row 10**12; request 1 then claims
    #    ~10**12 rows and request 3 a negative count): accept reports them and accepts nothing for them; commit
    #    must neither read out_cache_loc there (an illegal address) nor push those slots
    built_on_a_clean_state()
    qo = rig.plan.qo_indptr.to_numpy()
    n2 = int(qo[3] - qo[2])
    qo[2], qo[3] = 10**12, 10**12 + n2
    rig.plan.qo_indptr.copy_from_host(qo)
    accept_random_targets_and_commit()
    _expect_error(rig, (1, 2, 3), "qo_indptr")
    acc = rig.plan.accepted_count.to_numpy()
    assert (acc[1:] == 0).all()
    alloc_base = int(rig.plan.step.to_numpy()[0])
    free_count = int(rig.state.free_count.to_numpy()[0])
    assert free_count == alloc_base + int(qo[1] - qo[0]) - int(acc[0])  # request 0's rejected slots only
    pushed = rig.state.free_slots.to_numpy()[alloc_base:free_count]
    assert ((pushed >= 0) & (pushed < rig.num_slots)).all()
    clean_round_matches_reference()

    # 10. a repeated node in accepted_nodes (request 1 "accepts" its root a times): commit takes the path's
    #     increasing prefix (the root alone) and pushes at most each request's share of rejected slots
    #     (rows - accepted), so the other requests' ranges of the free-slot stack keep exactly their own
    #     rejected slots; request 1's surplus is reported (and leaked), its root committed once
    built_on_a_clean_state()
    pre = rig.get("top_ids", "top_lp", *TREE_OUTPUTS, "qo_indptr", "out_cache_loc", "step")
    tb = rig.host_tree(pre)
    qo = pre["qo_indptr"].astype(np.int64)
    post = random_posterior(rng, tb, qo, V, follow=1.0)
    rig.target.copy_from_host(np.concatenate([post, np.zeros(rig.plan.max_rows - post.size, np.int32)]))
    rig.plan.accept(stream, rig.state, target_tokens=rig.target)
    stream.synchronize()
    rig.plan.check_errors()
    nodes, acc = rig.plan.accepted_nodes.to_numpy(), rig.plan.accepted_count.to_numpy()
    assert acc[1] >= 2, acc
    clean_nodes = nodes.copy()
    nodes[1, :acc[1]] = 0
    rig.plan.accepted_nodes.copy_from_host(nodes)
    rig.plan.commit(stream, rig.state)
    stream.synchronize()
    _expect_error(rig, 1, "parents", "inconsistent")
    alloc_base = int(pre["step"][0])
    share = (qo[1:] - qo[:-1]) - acc
    assert int(rig.state.free_count.to_numpy()[0]) == alloc_base + int(share.sum())
    free_slots = rig.state.free_slots.to_numpy()
    start = alloc_base + np.concatenate([[0], np.cumsum(share)])
    for b in range(B):
        rows = pre["out_cache_loc"][qo[b]:qo[b + 1]]
        pushed = free_slots[start[b]:start[b + 1]]
        if b == 1:  # only the root is kept: the first `share` of its other rows, in node order
            np.testing.assert_array_equal(pushed, rows[1:1 + share[1]])
            continue
        kept = np.zeros(rows.size, bool)
        kept[clean_nodes[b, :acc[b]]] = True
        np.testing.assert_array_equal(pushed, rows[~kept], err_msg=f"request {b}'s rejected slots")
    got = rig.state.download()
    want_seq = rig.h["seq_lens"] + acc
    want_seq[1] = rig.h["seq_lens"][1] + 1
    np.testing.assert_array_equal(got["seq_lens"], want_seq)
    row1, c1 = int(rig.h["req_pool_indices"][1]), int(rig.h["seq_lens"][1])
    assert got["req_to_token"][row1, c1] == pre["out_cache_loc"][qo[1]]  # the root's slot, once
    np.testing.assert_array_equal(got["req_to_token"][row1, c1 + 1:], rig.h["req_to_token"][row1, c1 + 1:])
    clean_round_matches_reference()
