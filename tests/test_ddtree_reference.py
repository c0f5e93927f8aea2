"""CPU tests of the DDTree numpy reference: tree build against brute force, top-K order,
accept and commit on hand-worked trees, slot-pool conservation over random rounds, and its logits
(float, bf16 bits or ml_dtypes.bfloat16) and argument checks."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest

from driverlevel.reference import ddtree as R
from driverlevel.reference import ddtree as ref
from driverlevel.reference.ddtree import (
    STATUS_CONTEXT_FULL,
    STATUS_POOL_EXHAUSTED,
    SlotPool,
    TreeBatch,
    ancestor_masks,
    build_tree,
    build_tree_from_topk,
    commit_dense,
    commit_paged,
    compile_tree,
    greedy_accept,
    topk_logprobs,
)
from driverlevel.reference.attention import bf16_to_f32, f32_to_bf16
from driverlevel.reference.trees import ancestor_visibility

# --------------------------------------------------------------------------- brute force


def _pusher_keys(lp: np.ndarray, k: int, depth_limit: int) -> dict:
    """Key of every path (ranks tuple) of depth <= depth_limit, ranks < k, formed as the
    reference forms it: from the previous sibling, or from the parent for rank 0."""
    lpf = [[float(v) for v in row[:k]] for row in lp]
    keys = {}
    for d in range(1, depth_limit + 1):
        for path in itertools.product(range(k), repeat=d):
            r = path[-1]
            if r > 0:
                keys[path] = keys[path[:-1] + (r - 1,)] - lpf[d - 1][r - 1] + lpf[d - 1][r]
            elif d == 1:
                keys[path] = lpf[0][0]
            else:
                keys[path] = keys[path[:-1]] + lpf[d - 1][0]
    return keys


def _pusher(path: tuple):
    if path[-1] > 0:
        return path[:-1] + (path[-1] - 1,)
    return path[:-1] if len(path) > 1 else None


def _scan_build(root: int, ids: np.ndarray, lp: np.ndarray, budget: int):
    """Best-first selection without a heap: scan every enumerated path each step."""
    depth_limit = lp.shape[0]
    k = min(budget, lp.shape[1])
    keys = _pusher_keys(lp, k, depth_limit) if k else {}
    chosen, index = [], {(): 0}
    while len(chosen) < budget:
        ready = [p for p in keys if p not in index and (_pusher(p) is None or _pusher(p) in index)]
        if not ready:
            break
        best = min(ready, key=lambda p: (-keys[p], p))
        index[best] = len(chosen) + 1
        chosen.append(best)
    tokens = [root] + [int(ids[len(p) - 1][p[-1]]) for p in chosen]
    parents = [-1] + [index[p[:-1]] for p in chosen]
    depths = [0] + [len(p) for p in chosen]
    return np.array(tokens), np.array(parents), np.array(depths), chosen, keys


def _assert_tree(t, tokens, parents, depths):
    np.testing.assert_array_equal(t.tokens, tokens)
    np.testing.assert_array_equal(t.parents, parents)
    np.testing.assert_array_equal(t.depths, depths)


# --------------------------------------------------------------------------- top-K


def test_topk_orders_ties_by_lower_id():
    x = np.array([[1.0, 3.0, 3.0, 2.0, 3.0, -0.0, 0.0]], np.float32)
    ids, lp, lse = topk_logprobs(x, 7)
    assert ids[0].tolist() == [1, 2, 4, 3, 0, 5, 6]
    want_lse = np.float32(np.log(np.exp(x.astype(np.float64)).sum()))
    assert lse[0] == want_lse
    np.testing.assert_array_equal(lp[0], x[0][ids[0]] - want_lse)
    assert lp.dtype == np.float32 and ids.dtype == np.int32


@pytest.mark.parametrize("seed", range(5))
def test_topk_matches_sorted_python(seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(-4, 4, (3, 40)).astype(np.float32) / 2  # many exact ties
    ids, lp, _ = topk_logprobs(x, 17)
    for d in range(3):
        want = sorted(range(40), key=lambda i: (-x[d, i], i))[:17]
        assert ids[d].tolist() == want
        assert np.all(np.diff(lp[d]) <= 0)


def test_topk_rejects_bad_input():
    with pytest.raises(ValueError, match="k must be"):
        topk_logprobs(np.zeros((2, 3)), 4)
    with pytest.raises(ValueError, match="depth_limit, vocab"):
        topk_logprobs(np.zeros(3), 1)


# --------------------------------------------------------------------------- tree build


@pytest.mark.parametrize("vocab,depth_limit,budget,seed", [
    (3, 3, 5, 0), (3, 3, 39, 1), (4, 3, 12, 2), (4, 2, 20, 3), (5, 3, 30, 4), (2, 4, 30, 5), (6, 1, 4, 6),
    (4, 4, 3, 7), (3, 2, 0, 8),
])
def test_build_matches_scan_on_random_logits(vocab, depth_limit, budget, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((depth_limit, vocab)).astype(np.float32) * 2
    k = min(budget, vocab)
    ids, lp, _ = topk_logprobs(x, max(k, 1))
    t = build_tree_from_topk(9, ids, lp, budget)
    tokens, parents, depths, _, _ = _scan_build(9, ids, lp, budget)
    _assert_tree(t, tokens, parents, depths)


@pytest.mark.parametrize("seed", range(6))
def test_build_matches_scan_with_tied_logits(seed):
    rng = np.random.default_rng(100 + seed)
    x = rng.integers(-2, 2, (3, 5)).astype(np.float32)  # repeated values in every row
    ids, lp, _ = topk_logprobs(x, 5)
    t = build_tree_from_topk(1, ids, lp, 40)
    tokens, parents, depths, _, _ = _scan_build(1, ids, lp, 40)
    _assert_tree(t, tokens, parents, depths)


@pytest.mark.parametrize("seed", range(6))
def test_build_is_the_best_prefix_closed_set_with_exact_keys(seed):
    """With dyadic log-probs every key is exact, so the pop order must be the sort of ALL
    paths by (key desc, ranks asc), truncated to the budget: the budget best paths."""
    rng = np.random.default_rng(200 + seed)
    depth_limit, vocab, budget = 3, 4, 25
    lp = -np.sort(rng.integers(0, 6, (depth_limit, vocab)), axis=1).astype(np.float32) / 4  # ties, exact
    ids = np.tile(np.arange(vocab, dtype=np.int32), (depth_limit, 1))
    t = build_tree_from_topk(0, ids, lp, budget)
    paths = [p for d in range(1, depth_limit + 1) for p in itertools.product(range(vocab), repeat=d)]
    exact = {p: sum(float(lp[i][r]) for i, r in enumerate(p)) for p in paths}
    best = sorted(paths, key=lambda p: (-exact[p], p))[:budget]
    index = {(): 0, **{p: i + 1 for i, p in enumerate(best)}}
    assert all(p[:-1] in index for p in best)  # prefix-closed
    _assert_tree(t, [0] + [p[-1] for p in best], [-1] + [index[p[:-1]] for p in best], [0] + [len(p) for p in best])
    np.testing.assert_array_equal(t.keys[1:], [exact[p] for p in best])


def test_build_hand_worked():
    # depth 1: lp [-0.5, -1, -3], depth 2: [-0.25, -2, -4]
    lp = np.array([[-0.5, -1.0, -3.0], [-0.25, -2.0, -4.0]], np.float32)
    ids = np.array([[10, 11, 12], [20, 21, 22]], np.int32)
    t = build_tree_from_topk(7, ids, lp, 4)
    # pops: (0,) -0.5; (0,0) -0.75; (1,) -1; (1,0) -1.25
    _assert_tree(t, [7, 10, 20, 11, 20], [-1, 0, 1, 0, 3], [0, 1, 2, 1, 2])
    np.testing.assert_array_equal(t.keys, [0.0, -0.5, -0.75, -1.0, -1.25])


def test_build_budget_larger_than_tree_and_zero_budget():
    lp = np.log(np.array([[0.5, 0.5]], np.float32))
    ids = np.array([[3, 4]], np.int32)
    t = build_tree_from_topk(1, ids, lp, 10)  # only 2 paths exist
    _assert_tree(t, [1, 3, 4], [-1, 0, 0], [0, 1, 1])
    t0 = build_tree_from_topk(1, ids, lp, 0)
    _assert_tree(t0, [1], [-1], [0])


def test_build_tree_batch_padding_inactive_and_budgets():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 2, 6)).astype(np.float32)
    tb = build_tree([1, 2, 3], x, 5, budgets=[5, 2, 5], active=[1, 1, 0])
    assert tb.node_counts.tolist() == [6, 3, 0]
    assert tb.tokens.shape == (3, 6) and tb.masks.shape == (3, 6, 1)
    assert (tb.tokens[1, 3:] == -1).all() and (tb.parents[2] == -1).all() and (tb.masks[2] == 0).all()
    for b in range(2):
        n = tb.node_counts[b]
        np.testing.assert_array_equal(tb.masks[b, :n], ancestor_masks(tb.parents[b, :n], 1))
    # the budget-2 request is the budget-5 tree's first two pops (same logits)
    one = build_tree([2], x[1:2], 5)
    np.testing.assert_array_equal(tb.tokens[1, :3], one.tokens[0, :3])


def test_ancestor_masks_multiword():
    par = np.array([-1] + list(range(0, 39)))  # a chain of 40 nodes
    m = ancestor_masks(par, 2)
    assert m[39, 0] == 0xFFFFFFFF and m[39, 1] == 0xFF
    assert m[0].tolist() == [1, 0]
    vis = ancestor_visibility(par)
    bits = np.unpackbits(m.view(np.uint8), bitorder="little").reshape(40, 64)[:, :40]
    np.testing.assert_array_equal(bits.astype(bool), vis)


# --------------------------------------------------------------------------- accept / commit

# node:      0    1   2   3   4   5
# token:   100   10  11  20  21  30
# parent:   -1    0   0   1   1   3
HAND_TOKENS = [100, 10, 11, 20, 21, 30]
HAND_PARENTS = [-1, 0, 0, 1, 1, 3]
HAND_DEPTHS = [0, 1, 1, 2, 2, 3]


def _batch(trees, budget=8):
    """A TreeBatch from [(tokens, parents, depths)]."""
    bs = len(trees)
    words = ref.mask_words(budget)
    tb = TreeBatch(np.full((bs, budget + 1), -1, np.int32), np.full((bs, budget + 1), -1, np.int32),
                   np.full((bs, budget + 1), -1, np.int32), np.zeros(bs, np.int32),
                   np.zeros((bs, budget + 1, words), np.uint32), np.zeros((bs, 1, 1), np.int32),
                   np.zeros((bs, 1, 1), np.float32), budget)
    for b, (tok, par, dep) in enumerate(trees):
        n = len(tok)
        tb.tokens[b, :n], tb.parents[b, :n], tb.depths[b, :n] = tok, par, dep
        tb.node_counts[b] = n
        tb.masks[b, :n] = ancestor_masks(par, words)
    return tb


def _accept_one(post, stop=None, committed=0, max_context=100, active=True):
    tb = _batch([(HAND_TOKENS, HAND_PARENTS, HAND_DEPTHS)])
    stops = None if stop is None else np.array([stop])
    return greedy_accept(tb, [0, 6], np.array(post), [active], [committed], max_context, 3,
                         root_tokens=[100], stop_tokens=stops)


def test_accept_nothing_beyond_root():
    r = _accept_one([99, 0, 0, 0, 0, 0])
    assert r.accepted_count[0] == 1 and r.accepted_nodes[0, :1].tolist() == [0]
    assert r.bonus[0] == 99 and r.emitted[0, :1].tolist() == [99] and r.num_emitted[0] == 1
    assert r.root_tokens[0] == 99 and r.active[0] == 1 and r.finished[0] == 0


def test_accept_whole_branch_and_bonus():
    r = _accept_one([10, 20, 0, 30, 0, 77])
    assert r.accepted_nodes[0].tolist() == [0, 1, 3, 5]
    assert r.bonus[0] == 77 and r.emitted[0].tolist() == [10, 20, 30, 77]


def test_accept_second_sibling_then_bonus():
    r = _accept_one([11, 0, 55, 0, 0, 0])
    assert r.accepted_nodes[0, :2].tolist() == [0, 2] and r.accepted_count[0] == 2
    assert r.bonus[0] == 55 and r.emitted[0, :2].tolist() == [11, 55]


def test_accept_from_logits_takes_first_max():
    logits = np.zeros((6, 40), np.float32)
    logits[0, [10, 11]] = 5.0  # tie: token 10 (first index) wins
    logits[1, 21] = 1.0
    r = _accept_one(logits)
    assert r.posterior[:2].tolist() == [10, 21]
    assert r.accepted_nodes[0, :3].tolist() == [0, 1, 4] and r.bonus[0] == 0


def test_accept_stop_token_in_the_middle():
    r = _accept_one([10, 20, 0, 30, 0, 77], stop=[20, -1])
    assert r.accepted_nodes[0, :3].tolist() == [0, 1, 3] and r.accepted_count[0] == 3
    assert r.bonus[0] == -1 and r.finished[0] == 1 and r.active[0] == 0
    assert r.emitted[0].tolist() == [10, 20, -1, -1] and r.num_emitted[0] == 2
    assert r.root_tokens[0] == 100  # unchanged: the request is finished


def test_accept_stop_bonus_is_emitted():
    r = _accept_one([10, 21, 0, 0, 0, 0], stop=[5, 21])  # 21 is accepted (node 4)
    assert r.accepted_nodes[0, :3].tolist() == [0, 1, 4] and r.finished[0] == 1
    r = _accept_one([10, 66, 0, 0, 0, 0], stop=[66])  # the bonus is a stop token
    assert r.accepted_nodes[0, :2].tolist() == [0, 1] and r.bonus[0] == 66
    assert r.emitted[0, :2].tolist() == [10, 66] and r.finished[0] == 1 and r.active[0] == 0


def test_accept_inactive_request():
    r = _accept_one([10, 20, 0, 30, 0, 77], active=False)
    assert r.accepted_count[0] == 0 and r.bonus[0] == -1 and r.num_emitted[0] == 0
    assert r.active[0] == 0 and r.finished[0] == 0 and r.root_tokens[0] == 100


def test_accept_cut_by_context_room():
    r = _accept_one([10, 20, 0, 30, 0, 77], committed=98, max_context=100)
    assert r.accepted_nodes[0, :2].tolist() == [0, 1] and r.accepted_count[0] == 2
    assert r.bonus[0] == -1 and r.finished[0] == 1 and r.status == STATUS_CONTEXT_FULL


def test_accept_records_layout():
    r = _accept_one([10, 20, 0, 30, 0, 77])
    rec = ref.accept_records(r)
    assert rec.tolist() == [[4, 4, 77, 0, 10, 20, 30, 77]]


def _two_request_step():
    tb = _batch([(HAND_TOKENS, HAND_PARENTS, HAND_DEPTHS), ([200, 40, 41], [-1, 0, 0], [0, 1, 1])])
    pool = SlotPool(np.arange(100, 120, dtype=np.int64), 20)
    req_to_token = np.full((4, 16), -7, np.int32)
    req_to_token[2, :3] = [1, 2, 3]
    req_to_token[0, :5] = [4, 5, 6, 7, 8]
    committed = np.array([3, 5], np.int64)
    rows = np.array([2, 0], np.int64)
    return tb, pool, req_to_token, committed, rows


def test_compile_hand_worked():
    tb, pool, r2t, committed, rows = _two_request_step()
    st = compile_tree(tb, committed, rows, r2t, pool)
    assert st.alloc_base == 11 and st.alloc_total == 9 and pool.count == 20 and st.status == 0
    assert st.qo_indptr.tolist() == [0, 6, 9] and st.kv_indptr.tolist() == [0, 3, 8]
    assert st.kv_indptr.dtype == np.int32 and st.qo_indptr.dtype == np.int64
    assert st.kv_indices.tolist() == [1, 2, 3, 4, 5, 6, 7, 8]
    assert st.input_ids.tolist() == HAND_TOKENS + [200, 40, 41]
    assert st.positions.tolist() == [3, 4, 4, 5, 5, 6, 5, 6, 6]
    assert st.out_cache_loc.tolist() == list(range(111, 120))
    assert st.full_indptr.tolist() == [0, 6 * 9, 6 * 9 + 3 * 8]
    assert st.qlen_indptr.tolist() == [0, 36, 45]
    full0 = st.full_mask[:54].reshape(6, 9)
    assert (full0[:, :3] == 1).all()
    np.testing.assert_array_equal(full0[:, 3:], ancestor_visibility(HAND_PARENTS))
    np.testing.assert_array_equal(st.qlen_mask[36:].reshape(3, 3), np.eye(3, dtype=np.uint8) | np.array([[0, 0, 0], [1, 0, 0], [1, 0, 0]], np.uint8))
    assert st.bitmask[5, 0] == 0b101011 and st.bitmask[8, 0] == 0b101


def test_compile_and_accept_refuse_malformed_inputs():
    """compile_tree and greedy_accept name a malformed argument instead of a raw IndexError or a
    silently truncated slice."""
    tb, pool, r2t, committed, rows = _two_request_step()
    with pytest.raises(ValueError, match=r"seq_lens must have shape \(2,\)"):
        compile_tree(tb, committed[:1], rows, r2t, pool)
    with pytest.raises(ValueError, match="req_pool_indices must be in"):
        compile_tree(tb, committed, np.array([2, 4]), r2t, pool)
    with pytest.raises(ValueError, match=r"seq_lens must be in \[0, max_context"):
        compile_tree(tb, np.array([3, -1]), rows, r2t, pool)
    with pytest.raises(ValueError, match="req_to_token must be"):
        compile_tree(tb, committed, rows, r2t[0], pool)
    post = np.array([10, 20, 0, 0, 0, 0, 99, 0, 0])
    with pytest.raises(ValueError, match="qo_indptr must be"):
        greedy_accept(tb, [0, 6], post, [1, 1], committed, 16, 3)
    with pytest.raises(ValueError, match="qo_indptr must be"):
        greedy_accept(tb, [0, 9, 6], post, [1, 1], committed, 16, 3)
    with pytest.raises(ValueError, match="more than the trees"):
        greedy_accept(tb, [0, 1000, 1000], post, [1, 1], committed, 16, 3)
    with pytest.raises(ValueError, match="target must be"):
        greedy_accept(tb, [0, 6, 9], post[:8], [1, 1], committed, 16, 3)
    with pytest.raises(ValueError, match=r"active must have shape \(2,\)"):
        greedy_accept(tb, [0, 6, 9], post, [1], committed, 16, 3)
    with pytest.raises(ValueError, match="stop_tokens must be"):
        greedy_accept(tb, [0, 6, 9], post, [1, 1], committed, 16, 3, stop_tokens=[5, 6])
    with pytest.raises(ValueError, match="depth_limit must be"):
        greedy_accept(tb, [0, 6, 9], post, [1, 1], committed, 16, -1)
    # a negative committed length would widen the context's room (review s54): refused, as compile_tree does;
    # past max_context too; an inactive request or one without rows is not looked at
    for bad in ([3, -5], [17, 2]):
        with pytest.raises(ValueError, match=r"seq_lens must be in \[0, max_context = 16\] for active"):
            greedy_accept(tb, [0, 6, 9], post, [1, 1], np.array(bad), 16, 3)
    greedy_accept(tb, [0, 6, 9], post, [1, 0], np.array([3, -5]), 16, 3)
    greedy_accept(tb, [0, 6, 6], post[:6], [1, 1], np.array([3, -5]), 16, 3)


def test_commit_paged_hand_worked():
    tb, pool, r2t, committed, rows = _two_request_step()
    st = compile_tree(tb, committed, rows, r2t, pool)
    res = greedy_accept(tb, st.qo_indptr, np.array([10, 20, 0, 0, 0, 0, 99, 0, 0]), [1, 1], committed, 16, 3)
    assert res.accepted_nodes[0, :3].tolist() == [0, 1, 3] and res.accepted_count.tolist() == [3, 1]
    commit_paged(st, res, rows, r2t, committed, pool)
    assert committed.tolist() == [6, 6]
    assert r2t[2, :6].tolist() == [1, 2, 3, 111, 112, 114]
    assert r2t[0, :6].tolist() == [4, 5, 6, 7, 8, 117]
    assert pool.count == 11 + 5
    assert pool.slots[11:16].tolist() == [113, 115, 116, 118, 119]


def test_commit_paged_does_nothing_when_pool_exhausted():
    tb, _, r2t, committed, rows = _two_request_step()
    pool = SlotPool(np.arange(100, 108, dtype=np.int64), 8)  # 8 < 9 nodes
    st = compile_tree(tb, committed, rows, r2t, pool)
    assert st.status & STATUS_POOL_EXHAUSTED and (st.out_cache_loc == -1).all()
    res = greedy_accept(tb, st.qo_indptr, np.zeros(9, np.int64), [1, 1], committed, 16, 3)
    before = r2t.copy()
    commit_paged(st, res, rows, r2t, committed, pool)
    assert pool.count == 8 and committed.tolist() == [3, 5]
    np.testing.assert_array_equal(r2t, before)


def test_commit_dense_moves_rows_to_the_front():
    tb, pool, r2t, committed, rows = _two_request_step()
    res = greedy_accept(tb, [0, 6, 9], np.array([10, 20, 0, 30, 0, 0, 41, 0, 0]), [1, 1], committed, 16, 3)
    assert res.accepted_nodes[0].tolist() == [0, 1, 3, 5] and res.accepted_nodes[1, :2].tolist() == [0, 2]
    cache = np.arange(2 * 2 * 16 * 3, dtype=np.float32).reshape(2, 2, 16, 3)
    orig = cache.copy()
    commit_dense(cache, res, committed)
    assert committed.tolist() == [7, 7]
    for i, node in enumerate([0, 1, 3, 5]):
        np.testing.assert_array_equal(cache[:, 0, 3 + i], orig[:, 0, 3 + node])
    np.testing.assert_array_equal(cache[:, 1, 6], orig[:, 1, 7])
    np.testing.assert_array_equal(cache[:, :, :3], orig[:, :, :3])


# --------------------------------------------------------------------------- pool conservation


def _random_posterior(rng, tb, qo, vocab):
    """Target tokens that follow a random branch part of the way, then go off-tree."""
    post = rng.integers(0, vocab, int(qo[-1]))
    for b in range(tb.node_counts.shape[0]):
        n = int(tb.node_counts[b])
        for i in range(n):
            kids = np.flatnonzero(tb.parents[b, :n] == i)
            if kids.size and rng.random() < 0.7:
                post[qo[b] + i] = tb.tokens[b, rng.choice(kids)]
    return post


def test_slot_pool_conservation_over_random_rounds():
    rng = np.random.default_rng(7)
    bs, depth_limit, vocab, budget, max_context, num_slots = 4, 3, 6, 10, 40, 120
    pool = SlotPool(rng.permutation(num_slots).astype(np.int64), num_slots)
    r2t = np.full((bs, max_context), -1, np.int64)
    committed = np.zeros(bs, np.int64)
    rows = np.arange(bs, dtype=np.int64)
    roots = rng.integers(0, vocab, bs).astype(np.int32)
    active = np.ones(bs, np.uint8)
    stops = np.array([[0, -1]] * bs)
    for _ in range(300):
        logits = rng.standard_normal((bs, depth_limit, vocab)).astype(np.float32)
        tb = build_tree(roots, logits, budget, budgets=rng.integers(0, budget + 1, bs), active=active)
        st = compile_tree(tb, committed, rows, r2t, pool)
        post = _random_posterior(rng, tb, st.qo_indptr, vocab)
        res = greedy_accept(tb, st.qo_indptr, post, active, committed, max_context, depth_limit, roots, stops)
        commit_paged(st, res, rows, r2t, committed, pool)
        roots, active = res.root_tokens, res.active
        held = [int(s) for b in range(bs) for s in r2t[b, :committed[b]]]
        free = [int(s) for s in pool.slots[:pool.count]]
        assert len(held) + len(free) == num_slots, "a slot leaked"
        assert sorted(held + free) == list(range(num_slots)), "a slot is held twice"
        for b in range(bs):  # finished requests release their slots and start again
            if not active[b]:
                pool.slots[pool.count:pool.count + committed[b]] = r2t[b, :committed[b]]
                pool.count += int(committed[b])
                committed[b] = 0
                active[b] = 1
                roots[b] = rng.integers(1, vocab)


# --------------------------------------------------------------------------- non-finite values (issue 11)


def test_row_argmax_nan_is_minus_inf_and_empty_rows_give_zero():
    x = np.array([[np.nan] * 4, [-np.inf] * 4, [np.nan, -np.inf, np.nan, -np.inf], [np.nan, -1.0, np.nan, -1.0],
                  [1.0, np.inf, 2.0, np.inf]], np.float32)
    ids, finite = ref.row_argmax(x)
    assert ids.tolist() == [0, 0, 0, 1, 1]
    assert finite.tolist() == [False, False, False, True, True]


def test_topk_nonfinite_rows_keep_distinct_in_range_ids():
    x = np.array([[np.nan] * 6,                                   # all NaN
                  [-np.inf] * 6,                                  # all -inf
                  [0.5, np.nan, -np.inf, 2.0, np.nan, -np.inf],   # two finite values, K = 4
                  [0.0, np.inf, 1.0, 2.0, 3.0, 4.0]], np.float32)  # +inf: no distribution
    ids, lp, lse = topk_logprobs(x, 4)
    assert ids.tolist() == [[0, 1, 2, 3], [0, 1, 2, 3], [3, 0, 1, 2], [1, 5, 4, 3]]
    floor = np.float32(ref.LP_FLOOR)
    assert (lp[[0, 1, 3]] == floor).all() and np.isnan(lse[[0, 1, 3]]).all()
    want = np.log(np.exp(2.0) + np.exp(0.5))
    np.testing.assert_allclose(lp[2, :2], [2.0 - want, 0.5 - want], rtol=1e-6)
    assert (lp[2, 2:] == floor).all() and np.all(np.diff(lp[2]) <= 0)


def test_build_with_nonfinite_rows_has_no_duplicate_siblings():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 3, 50)).astype(np.float32)
    x[0, 1] = np.nan
    x[0, 2, 5:] = -np.inf  # 5 finite values, K = 12
    tb = build_tree([7], x, 12)
    n = int(tb.node_counts[0])
    assert n == 13
    tok, par = tb.tokens[0, :n], tb.parents[0, :n]
    assert ((tok[1:] >= 0) & (tok[1:] < 50)).all()
    for p in np.unique(par[1:]):
        kids = tok[1:][par[1:] == p]
        assert len(set(kids.tolist())) == kids.size


def test_accept_nonfinite_root_row_finishes_the_request():
    logits = np.random.default_rng(1).standard_normal((6, 40)).astype(np.float32)
    logits[0] = np.nan
    r = _accept_one(logits)
    assert r.posterior[0] == 0 and not r.finite[0]
    assert r.accepted_count[0] == 1 and r.bonus[0] == -1 and r.num_emitted[0] == 0
    assert r.finished[0] == ref.FINISH_NONFINITE and r.active[0] == 0 and r.root_tokens[0] == 100
    assert r.status == ref.STATUS_NONFINITE
    logits[0] = -np.inf
    logits[0, 0] = np.nan
    assert _accept_one(logits).finished[0] == ref.FINISH_NONFINITE


def test_accept_nonfinite_row_on_and_off_the_path():
    logits = np.zeros((6, 40), np.float32)
    logits[0, 10] = logits[1, 20] = 5.0      # root -> node 1 -> node 3
    logits[3] = -np.inf                      # node 3's row: the walk ends there
    logits[2] = np.nan                       # node 2 is off the path: no influence
    r = _accept_one(logits)
    assert r.accepted_nodes[0, :3].tolist() == [0, 1, 3] and r.bonus[0] == -1
    assert r.emitted[0, :2].tolist() == [10, 20] and r.finished[0] == ref.FINISH_NONFINITE
    logits[3, 30] = 1.0                      # finite again: the walk goes on to node 5
    r = _accept_one(logits)
    assert r.accepted_nodes[0].tolist() == [0, 1, 3, 5] and r.finished[0] == 0 and r.status == 0


def test_accept_context_cut_before_a_nonfinite_row_is_a_plain_cut():
    """The walk ends at node 3's not-finite row, but only two nodes fit: the cut drops that row,
    so the request finishes with FINISH_DONE and only STATUS_CONTEXT_FULL is set (the kernel's
    order in cu/ddtree/accept.cuh); with room for the whole walk it is FINISH_NONFINITE."""
    logits = np.zeros((6, 40), np.float32)
    logits[0, 10] = logits[1, 20] = 5.0      # root -> node 1 -> node 3
    logits[3] = np.nan                       # node 3's row: the walk ends there
    r = _accept_one(logits, committed=98, max_context=100)
    assert r.accepted_nodes[0, :3].tolist() == [0, 1, -1] and r.accepted_count[0] == 2
    assert r.bonus[0] == -1 and r.emitted[0, :2].tolist() == [10, -1] and r.num_emitted[0] == 1
    assert r.finished[0] == ref.FINISH_DONE and r.status == STATUS_CONTEXT_FULL
    r = _accept_one(logits, committed=97, max_context=100)  # three nodes fit: nothing is cut
    assert r.accepted_count[0] == 3 and r.finished[0] == ref.FINISH_NONFINITE
    assert r.status == ref.STATUS_NONFINITE


def test_accept_target_tokens_out_of_vocab_count_as_not_finite():
    tb = _batch([(HAND_TOKENS, HAND_PARENTS, HAND_DEPTHS)])
    r = greedy_accept(tb, [0, 6], np.array([10, 500, 0, 0, 0, 0]), [1], [0], 100, 3, root_tokens=[100], vocab=200)
    assert r.accepted_nodes[0, :2].tolist() == [0, 1] and r.posterior[1] == 0
    assert r.finished[0] == ref.FINISH_NONFINITE and r.emitted[0, :1].tolist() == [10]


def test_commit_dense_is_bounded_by_the_window():
    """60 committed tokens in a window of 64, a 4-node path whose later nodes lie past it."""
    tok = [100, 10, 11, 12, 13, 20, 21, 22, 30, 31]
    par = [-1, 0, 0, 0, 0, 1, 1, 1, 5, 5]
    dep = [0, 1, 1, 1, 1, 2, 2, 2, 3, 3]
    tb = _batch([(tok, par, dep), ([200, 40], [-1, 0], [0, 1])], budget=12)
    committed = np.array([60, 5], np.int64)
    post = np.array([10, 20, 0, 0, 0, 31, 0, 0, 0, 77, 40, 9])
    res = greedy_accept(tb, [0, 10, 12], post, [1, 1], committed, 64, 3)
    assert res.accepted_nodes[0].tolist() == [0, 1, 5, 9] and res.accepted_count[0] == 4
    cache = np.arange(2 * 2 * 64 * 3, dtype=np.float32).reshape(2, 2, 64, 3)
    orig = cache.copy()
    status = commit_dense(cache, res, committed)
    assert status == STATUS_CONTEXT_FULL
    assert res.accepted_count.tolist() == [2, 2] and res.active.tolist() == [0, 1]
    assert committed.tolist() == [62, 7]
    np.testing.assert_array_equal(cache[:, 0, 61], orig[:, 0, 61])  # node 1 stays at 60 + 1
    np.testing.assert_array_equal(cache[:, 0, 62:], orig[:, 0, 62:])  # nothing from outside the window
    np.testing.assert_array_equal(cache[:, 1, 6], orig[:, 1, 6])


def test_build_tree_and_slot_pool_refuse_shapes_they_cannot_use():
    logits = np.random.default_rng(0).standard_normal((3, 4, 50)).astype(np.float32)
    with pytest.raises(ValueError, match="logits must be"):
        build_tree([1, 2], logits, 8)  # 2 roots, 3 requests of logits
    with pytest.raises(ValueError, match="logits must be"):
        build_tree([1, 2, 3], logits[0], 8)  # 2-D
    with pytest.raises(ValueError, match="budget must be >= 0"):
        build_tree([1, 2, 3], logits, -1)
    with pytest.raises(ValueError, match="root_tokens must be one-dimensional"):
        build_tree(5, logits, 8)
    assert build_tree([1, 2, 3], logits, 8).node_counts.tolist() == [9, 9, 9]
    with pytest.raises(ValueError, match="count must be in 0..10"):
        SlotPool(np.arange(10), count=100)
    assert SlotPool(np.arange(10), count=10).free_set() == set(range(10))


# -- review 16 #10: malformed arguments are named, never truncated, parsed or ignored -----------------
_X = np.zeros((1, 2, 4))


@pytest.mark.parametrize("call, exc, words", [
    (lambda: build_tree([1], _X, 2, budgets=[1, 1]), ValueError, r"budgets must have shape \(1,\), got \(2,\)"),
    (lambda: build_tree([1], _X, 2, active=[1, 1]), ValueError, r"active must have shape \(1,\), got \(2,\)"),
    (lambda: build_tree([1], _X, 2, active=["no"]), TypeError, "active must be bools or integers, got dtype <U2"),
    (lambda: build_tree([1], _X, 2, budgets=[1.5]), TypeError, "budgets must be integers, got dtype float64"),
    (lambda: build_tree([1.7], _X, 2), TypeError, "root_tokens must be integers, got dtype float64"),
    (lambda: build_tree([1], _X, 2.7), TypeError, "budget must be an int, got float"),
    (lambda: build_tree([1], _X, True), TypeError, "budget must be an int, got bool"),
    (lambda: build_tree_from_topk(1, np.zeros((2, 4), np.int32), np.zeros((2, 4), np.float32), 2.0), TypeError,
     "budget must be an int, got float"),
    (lambda: topk_logprobs(np.zeros((1, 4)), 2.5), TypeError, "k must be an int, got float"),
    (lambda: topk_logprobs(np.zeros((1, 4)), True), TypeError, "k must be an int, got bool"),
    (lambda: topk_logprobs(np.zeros((1, 4)), 0), ValueError, r"k must be in \[1, vocab=4\], got 0"),
])
def test_build_and_topk_name_a_malformed_argument(call, exc, words):
    with pytest.raises(exc, match=words):
        call()


# -- review 17 M4 / L10: build_tree_from_topk's other arguments, row_argmax's shape ----------------------------
_IDS, _LP = np.zeros((3, 2), np.int64), np.zeros((3, 2), np.float32)


@pytest.mark.parametrize("call, exc, words", [
    (lambda: build_tree_from_topk(1.7, _IDS, _LP, 2), TypeError, "^root_token must be an int, got float$"),
    (lambda: build_tree_from_topk("a", _IDS, _LP, 2), TypeError, "^root_token must be an int, got str$"),
    (lambda: build_tree_from_topk(True, _IDS, _LP, 2), TypeError, "^root_token must be an int, got bool$"),
    (lambda: build_tree_from_topk(1, np.full((3, 2), 1.7), _LP, 2), TypeError,
     "^top_ids must be integers, got dtype float64$"),
    (lambda: build_tree_from_topk(1, np.zeros((2, 2), np.int64), _LP, 4), ValueError,
     r"^top_ids and top_lp must be \[depth_limit, K\] of one shape, got top_ids \(2, 2\) and top_lp \(3, 2\)$"),
    (lambda: build_tree_from_topk(1, np.zeros((3, 1), np.int64), _LP, 4), ValueError,
     r"^top_ids and top_lp must be \[depth_limit, K\] of one shape, got top_ids \(3, 1\) and top_lp \(3, 2\)$"),
    (lambda: build_tree_from_topk(1, np.zeros(2, np.int64), np.zeros(2, np.float32), 4), ValueError,
     r"^top_ids and top_lp must be \[depth_limit, K\] of one shape, got top_ids \(2,\) and top_lp \(2,\)$"),
    (lambda: ref.row_argmax(np.zeros(5)), ValueError, r"^x must be \[rows, vocab\] with vocab >= 1, got shape \(5,\)$"),
    (lambda: ref.row_argmax(np.zeros((2, 0))), ValueError,
     r"^x must be \[rows, vocab\] with vocab >= 1, got shape \(2, 0\)$"),
    (lambda: ref.row_argmax(np.float32(1)), ValueError, r"^x must be \[rows, vocab\] with vocab >= 1, got shape \(\)$"),
])
def test_build_from_topk_and_row_argmax_name_a_malformed_argument(call, exc, words):
    with pytest.raises(exc, match=words):
        call()


def test_build_tree_from_topk_takes_lists_and_numpy_ints_and_reads_k_from_both():
    """Lists as well as arrays (a list crashed with AttributeError); a numpy integer root; the tree the
    same as from the arrays."""
    ids, lp = [[5, 6], [7, 8]], [[-0.1, -1.0], [-0.2, -2.0]]
    want = build_tree_from_topk(3, np.array(ids), np.array(lp, np.float32), 3)
    for got in (build_tree_from_topk(3, ids, lp, 3), build_tree_from_topk(np.int32(3), np.array(ids, np.uint8), lp, 3)):
        assert got.tokens.tolist() == want.tokens.tolist() == [3, 5, 7, 6]
        assert got.parents.tolist() == want.parents.tolist()


def test_build_tree_still_takes_every_kind_of_flags_and_ints():
    """What the callers pass (tests, benchmarks, the demo's reference): lists, bool / uint8 / int arrays,
    numpy integer scalars for the budget."""
    x = np.random.default_rng(1).standard_normal((3, 2, 6)).astype(np.float32)
    want = build_tree([1, 2, 3], x, 5, budgets=[5, 2, 5], active=[1, 1, 0]).node_counts.tolist()
    assert want == [6, 3, 0]
    for active in ([True, True, False], np.array([1, 1, 0], np.uint8), np.array([1, 1, 0], np.int8)):
        for budgets in (np.array([5, 2, 5], np.int32), np.array([5, 2, 5], np.uint64)):
            tb = build_tree(np.array([1, 2, 3], np.int32), x, np.int64(5), budgets=budgets, active=active)
            assert tb.node_counts.tolist() == want
    assert build_tree([], np.zeros((0, 2, 6), np.float32), 5).node_counts.shape == (0,)


def test_accept_and_commit_name_malformed_per_request_arrays():
    tb, pool, r2t, committed, rows = _two_request_step()
    st = compile_tree(tb, committed, rows, r2t, pool)
    post = np.array([10, 20, 0, 0, 0, 0, 99, 0, 0])
    with pytest.raises(TypeError, match="active must be bools or integers, got dtype <U3"):
        greedy_accept(tb, st.qo_indptr, post, ["yes", "no"], committed, 16, 3)
    with pytest.raises(TypeError, match="seq_lens must be integers, got dtype float64"):
        greedy_accept(tb, st.qo_indptr, post, [1, 1], committed + 0.5, 16, 3)
    with pytest.raises(TypeError, match="stop_tokens must be integers, got dtype float64"):
        greedy_accept(tb, st.qo_indptr, post, [1, 1], committed, 16, 3, stop_tokens=[[5.0], [6.0]])
    with pytest.raises(TypeError, match="req_pool_indices must be integers, got dtype float64"):
        compile_tree(tb, committed, rows.astype(np.float64), r2t, pool)
    res = greedy_accept(tb, st.qo_indptr, post, np.array([True, True]), committed, 16, 3)
    with pytest.raises(ValueError, match=r"req_pool_indices must have shape \(2,\), got \(1,\)"):
        commit_paged(st, res, rows[:1], r2t, committed.copy(), pool)
    commit_paged(st, res, rows, r2t, committed, pool)  # the good call still works


def test_per_request_ints_refuse_unsigned_values_past_int64():
    tb, pool, r2t, committed, rows = _two_request_step()
    with pytest.raises(ValueError, match="seq_lens must fit int64, got 18446744073709551615"):
        compile_tree(tb, np.array([2**64 - 1, 5], np.uint64), rows, r2t, pool)


# -- logits as float, bf16 bits (uint16) or ml_dtypes.bfloat16 -----------------------------------------------
def _bf16_logits(shape, seed=0):
    """Random logits rounded to bf16: (uint16 bits, the same values widened to float32)."""
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    bits = f32_to_bf16(x)
    return bits, bf16_to_f32(bits)


def test_row_argmax_reads_uint16_as_bf16_bits():
    bits = f32_to_bf16(np.array([[1.0, -1.0], [-3.0, -2.0]]))
    ids, finite = R.row_argmax(bits)
    assert ids.tolist() == [0, 1] and finite.all()


def test_topk_logprobs_reads_uint16_as_bf16_bits():
    bits, wide = _bf16_logits((3, 16))
    for got, want in zip(R.topk_logprobs(bits, 4), R.topk_logprobs(wide, 4)):
        np.testing.assert_array_equal(got, want)
    _, _, lse = R.topk_logprobs(np.array([[0x3F80, 0x4000]], np.uint16), 1)  # 1.0, 2.0
    assert lse[0] == pytest.approx(np.log(np.e + np.e ** 2), rel=1e-6)


def test_build_tree_and_greedy_accept_read_uint16_as_bf16_bits():
    bits, wide = _bf16_logits((1, 3, 16), seed=1)
    got, want = R.build_tree([1], bits, budget=4), R.build_tree([1], wide, budget=4)
    np.testing.assert_array_equal(got.tokens, want.tokens)
    n = int(want.node_counts[0])
    tbits, twide = _bf16_logits((n, 16), seed=2)
    a = R.greedy_accept(want, [0, n], tbits, [True], [0], 100, 3)
    b = R.greedy_accept(want, [0, n], twide, [True], [0], 100, 3)
    np.testing.assert_array_equal(a.posterior, b.posterior)
    np.testing.assert_array_equal(a.accepted_nodes, b.accepted_nodes)


@pytest.mark.parametrize("call", [
    lambda x: R.row_argmax(x),
    lambda x: R.topk_logprobs(x, 1),
    lambda x: R.build_tree([0], x[None], budget=2),
    lambda x: R.greedy_accept(R.build_tree([0], np.zeros((1, 1, 2), np.float32), budget=1), [0, 2],
                              np.concatenate([x, x])[:2], [True], [0], 100, 1),
])
@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.int16, np.uint32, np.bool_])
def test_integer_logits_are_refused(call, dtype):
    with pytest.raises(TypeError, match="float array, an ml_dtypes.bfloat16 array or uint16"):
        call(np.array([[1, 0]], dtype))


def test_ml_dtypes_bfloat16_logits_match_their_bits():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bits, wide = _bf16_logits((1, 3, 16), seed=3)
    ml = bits.view(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(R.build_tree([1], ml, budget=4).tokens, R.build_tree([1], wide, budget=4).tokens)
    assert R.row_argmax(np.array([[1.0, -1.0]], ml_dtypes.bfloat16))[0].tolist() == [0]


# -- greedy_accept's depth_limit and max_context; build_tree's top as lists ----------------------------------
def _deep_tree():
    """A depth-2 chain (root, 0 at depth 1, 0 at depth 2) and target logits that accept all of it."""
    lg = np.full((1, 2, 4), -5.0, np.float32)
    lg[0, :, 0] = 5.0
    tb = ref.build_tree([3], lg, budget=2)
    assert tb.depths[0].tolist() == [0, 1, 2]
    tgt = np.full((3, 4), -5.0, np.float32)
    tgt[:, 0] = 5.0
    return tb, tgt


def test_greedy_accept_refuses_a_depth_limit_below_the_trees_depth():
    tb, tgt = _deep_tree()
    R.greedy_accept(tb, [0, 3], tgt, [True], [0], 100, 2)
    with pytest.raises(ValueError, match="request 0's tree has a node at depth 2, past depth_limit = 1"):
        R.greedy_accept(tb, [0, 3], tgt, [True], [0], 100, 1)


@pytest.mark.parametrize("max_context, depth_limit, exc", [
    (100, True, TypeError), (100, 2.0, TypeError), (100, "x", TypeError), (100, -1, ValueError),
    (2.5, 2, TypeError), (False, 2, TypeError), ("100", 2, TypeError), (-1, 2, ValueError),
])
def test_greedy_accept_checks_max_context_and_depth_limit(max_context, depth_limit, exc):
    tb, tgt = _deep_tree()
    name = "depth_limit" if max_context == 100 else "max_context"
    with pytest.raises(exc, match=name):
        R.greedy_accept(tb, [0, 3], tgt, [True], [0], max_context, depth_limit)
    R.greedy_accept(tb, [0, 3], tgt, [True], [0], np.int64(100), np.int32(2))  # numpy ints are ints


def test_build_tree_takes_top_as_lists():
    lg = np.random.default_rng(4).standard_normal((1, 2, 8)).astype(np.float32)
    want = R.build_tree([3], lg, budget=4)
    got = R.build_tree([3], None, budget=4, top=(want.top_ids.tolist(), want.top_lp.tolist()))
    np.testing.assert_array_equal(got.tokens, want.tokens)
    # review s54: integer log-probs were converted to float32 here, where build_tree_from_topk refuses them
    with pytest.raises(TypeError, match="top's log-probs must be floats, got dtype int64"):
        R.build_tree([3], None, budget=4, top=(want.top_ids, np.round(want.top_lp).astype(np.int64)))
    with pytest.raises(TypeError, match="top's ids must be integers, got dtype float32"):
        R.build_tree([3], None, budget=4, top=(want.top_ids.astype(np.float32), want.top_lp))


@pytest.mark.parametrize("top", [
    (np.zeros((1, 2, 4), np.int32),), [np.zeros((1, 2, 4), np.int32)] * 3, np.zeros((2, 1, 2, 4), np.int32), "ab"])
def test_build_tree_refuses_a_top_that_is_not_a_pair(top):
    """A one-tuple `top` was indexed as a pair (a bare IndexError); anything but two arrays is refused by name."""
    with pytest.raises(ValueError, match=r"top must be \(ids, lp\), a pair"):
        R.build_tree(np.zeros(1, np.int32), None, 3, top=top)


# -- review 38 (a fresh user's findings): the references take what their docstrings say, and refuse the rest --

def _review38_batch():
    lg = np.random.default_rng(0).standard_normal((2, 3, 8)).astype(np.float32)
    tb = build_tree([5, 6], lg, 4)
    return tb, np.r_[0, np.cumsum(tb.node_counts)]


def test_review38_threshold_twin_reads_bf16_bits_as_bf16_and_refuses_integers():
    """Finding 1: uint16 bf16 bits were read as the integers 0..65535 (a wrong top-K, lse ~49,296)."""
    from driverlevel.reference.topk_threshold import threshold_topk

    row = np.random.default_rng(0).standard_normal(32768).astype(np.float32)
    bits = f32_to_bf16(row)
    widened = bf16_to_f32(bits)
    a, b = threshold_topk(bits, 8, bf16=True), threshold_topk(widened, 8, bf16=True)
    ids, lp, lse = topk_logprobs(bits[None], 8)
    np.testing.assert_array_equal(a.ids, ids[0])
    np.testing.assert_array_equal(a.ids, b.ids)
    np.testing.assert_array_equal(a.lp, b.lp)
    assert a.lse == b.lse and abs(float(a.lse) - float(lse[0])) < 1e-3 and float(a.lse) < 20
    for bad in (np.arange(100, dtype=np.int64), np.ones(100, bool), np.array(["1", "5", "3"])):
        with pytest.raises(TypeError, match="row must be a float array"):
            threshold_topk(bad, 2)


def test_review38_greedy_accept_refuses_float_and_bool_tokens_and_bad_vocab():
    """Findings 2 and 12: 1.9 was token 1, True token 1, NaN a cast warning; vocab unchecked; an
    empty logits row named ``x``."""
    tb, qo = _review38_batch()
    n = int(qo[-1])
    args = ([1, 1], [0, 0], 100, 3)
    for bad in (np.full(n, 1.9), np.ones(n, bool), np.full(n, np.nan)):
        with pytest.raises(TypeError, match="target must be integer tokens"):
            greedy_accept(tb, qo, bad, *args)
    with pytest.raises(ValueError, match=r"target logits must be \[total_q = \d+, vocab\] with vocab >= 1"):
        greedy_accept(tb, qo, np.zeros((n, 0), np.float32), *args)
    with pytest.raises(TypeError, match="vocab must be an int, got bool"):
        greedy_accept(tb, qo, np.zeros(n, np.int64), *args, vocab=True)
    with pytest.raises(ValueError, match="vocab must be >= 1, got 0"):
        greedy_accept(tb, qo, np.zeros(n, np.int64), *args, vocab=0)
    # integer tokens still work, and vocab still marks out-of-range ones not finite
    r = greedy_accept(tb, qo, np.full(n, 7, np.int32), *args, vocab=7)
    assert not r.finite.any() and (r.posterior == 0).all()


def test_review38_greedy_accept_refuses_roots_past_int32():
    """Finding 3: root_tokens 2**40 came back as 0 (an inactive request's root is kept unchanged)."""
    tb, qo = _review38_batch()
    n = int(qo[-1])
    with pytest.raises(ValueError, match="root_tokens must fit int32"):
        greedy_accept(tb, qo, np.zeros(n, np.int64), [0, 0], [0, 0], 100, 3, root_tokens=[2**40, 2**40])
    r = greedy_accept(tb, qo, np.zeros(n, np.int64), [0, 0], [0, 0], 100, 3, root_tokens=[2**31 - 1, -5])
    assert r.root_tokens.tolist() == [2**31 - 1, -5] and r.root_tokens.dtype == np.int32


def test_review38_compile_tree_checks_seq_lens_against_the_width_and_skips_empty_requests():
    """Findings 4 and 5: seq_lens past req_to_token's columns gave kv_indptr [0 100 104] with 68
    kv_indices; an inactive request's out-of-range row raised a bare IndexError."""
    tb, _ = _review38_batch()
    r2t = np.arange(4 * 64, dtype=np.int64).reshape(4, 64)
    with pytest.raises(ValueError, match=r"seq_lens must be in \[0, max_context = 64\]"):
        compile_tree(tb, [100, 4], [0, 1], r2t, ref.SlotPool(np.arange(100, 200), 100))
    st = compile_tree(tb, [64, 4], [0, 1], r2t, ref.SlotPool(np.arange(100, 200), 100))  # 64 is allowed
    assert st.kv_indptr.tolist() == [0, 64, 68] and st.kv_indices.shape == (68,)
    assert st.status & ref.STATUS_CONTEXT_FULL
    lg = np.random.default_rng(0).standard_normal((2, 3, 8)).astype(np.float32)
    one = build_tree([5, 6], lg, 4, active=[1, 0])
    a = compile_tree(one, [3, -7], [0, 99], r2t, ref.SlotPool(np.arange(100, 200), 100))
    b = compile_tree(one, [3, 0], [0, 0], r2t, ref.SlotPool(np.arange(100, 200), 100))
    assert a.kv_indices.tolist() == b.kv_indices.tolist() == r2t[0, :3].tolist()
    assert a.kv_indptr.tolist() == b.kv_indptr.tolist() == [0, 3, 3]
    with pytest.raises(TypeError, match="req_to_token must be integers"):
        compile_tree(tb, [3, 4], [0, 1], r2t.astype(np.float64), ref.SlotPool(np.arange(100, 200), 100))


def test_review38_slot_pool_refuses_float_bool_and_str_counts_and_float_slots():
    """Finding 7: count 2.7 was truncated, True and "2" taken; float slots handed out truncated."""
    for bad in (2.7, True, "2"):
        with pytest.raises(TypeError, match="count must be an int"):
            ref.SlotPool(np.arange(4), bad)
    with pytest.raises(TypeError, match="slots must be integers"):
        ref.SlotPool(np.arange(4) + 0.5, 2)
    slots = np.arange(4)
    pool = ref.SlotPool(slots, np.int64(2))
    assert pool.slots is slots and pool.count == 2 and type(pool.count) is int


def test_review38_build_tree_from_topk_floors_nan_and_checks_int32():
    """Finding 13 and 3's sibling: NaN log-probs entered the heap (arbitrary pop order); 2**40 ids
    raised numpy's OverflowError without naming the argument."""
    ids = np.array([[1, 2, 3], [4, 5, 6]], np.int32)
    lp = np.array([[np.nan, -1, -2], [-0.5, -np.inf, -3]], np.float32)
    t = build_tree_from_topk(0, ids, lp, 5)
    t_floor = build_tree_from_topk(0, ids, np.fmax(lp, np.float32(ref.LP_FLOOR)), 5)
    np.testing.assert_array_equal(t.tokens, t_floor.tokens)
    np.testing.assert_array_equal(t.parents, t_floor.parents)
    assert not np.isnan(t.keys).any()
    assert t.keys[1] == float(np.float32(ref.LP_FLOOR))  # the NaN at rank 0 (popped first: the root's child)
    with pytest.raises(TypeError, match="top_lp must be floats"):
        build_tree_from_topk(0, ids, np.array([["a", "b", "c"], ["d", "e", "f"]]), 3)
    with pytest.raises(ValueError, match="root_token must fit int32"):
        build_tree_from_topk(2**40, ids, lp, 3)
    with pytest.raises(ValueError, match="top_ids must fit int32"):
        build_tree_from_topk(0, ids.astype(np.int64) + 2**40, lp, 3)


def test_review38_ancestor_masks_and_commits_refuse_what_they_would_truncate():
    """Finding 14: float parents were truncated, n_words=-1 gave a confusing message; commit_paged
    truncated float seq_lens, commit_dense failed on a list with an AttributeError."""
    with pytest.raises(TypeError, match="parents must be integers"):
        ancestor_masks([-1.0, 0.5], 1)
    with pytest.raises(ValueError, match="n_words must be >= 1, got -1"):
        ancestor_masks([-1], -1)
    assert ancestor_masks([-1, 0, 0], 1).tolist() == [[1], [3], [5]]
    tb, pool, r2t, committed, rows = _two_request_step()
    st = compile_tree(tb, committed, rows, r2t, pool)
    post = np.array([10, 20, 0, 0, 0, 0, 99, 0, 0])
    res = greedy_accept(tb, [0, 6, 9], post, [1, 1], committed, 16, 3)
    with pytest.raises(TypeError, match=r"seq_lens must be a 1-D numpy integer array \(updated in place\)"):
        commit_paged(st, res, rows, r2t, committed.astype(np.float64), pool)
    with pytest.raises(TypeError, match=r"req_to_token must be a 2-D numpy integer array"):
        commit_paged(st, res, rows, r2t.tolist(), committed.copy(), pool)
    with pytest.raises(TypeError, match=r"seq_lens must be a 1-D numpy integer array"):
        commit_dense(np.zeros((1, 2, 32, 4)), res, [3, 5])
    with pytest.raises(TypeError, match=r"cache must be a numpy array"):
        commit_dense([[[0]]], res, committed.copy())


# ------------------------------------------------------------------------------ review 39
# A fresh-user review (thirty-ninth session) of inputs the references misread or failed on late.


def test_review39_greedy_accept_refuses_tokens_past_int32_and_float_qo_indptr():
    """Finding 1: target tokens 2**32 + 7 wrapped to 7 and matched the tree; finding 5: a
    qo_indptr of 2.9 was read as 2, bools taken."""
    tb, qo = _review38_batch()
    n = int(qo[-1])
    tgt = np.zeros(n, np.int64)
    tgt[0] = 2**32 + int(tb.tokens[0, 1])
    with pytest.raises(ValueError, match="target tokens must fit int32"):
        greedy_accept(tb, qo, tgt, [1, 1], [0, 0], 100, 3)
    for bad in (qo.astype(np.float64), qo.astype(bool)):
        with pytest.raises(TypeError, match="qo_indptr must be integers"):
            greedy_accept(tb, bad, np.zeros(n, np.int64), [1, 1], [0, 0], 100, 3)
    ok = greedy_accept(tb, qo.tolist(), np.zeros(n, np.int64), [1, 1], [0, 0], 100, 3)  # a list of ints
    same = greedy_accept(tb, qo, np.zeros(n, np.int64), [1, 1], [0, 0], 100, 3)
    assert ok.accepted_count.tolist() == same.accepted_count.tolist() and ok.accepted_count.min() >= 1


def test_review39_references_name_the_class_they_need():
    """Finding 4: a Tree for a TreeBatch, an array for a SlotPool or None for an AcceptResult failed
    with bare AttributeErrors; SlotPool kept a list, which compile_tree could not use."""
    tb, qo = _review38_batch()
    one = build_tree_from_topk(0, [[1, 2]], [[-0.5, -1.0]], 2)
    with pytest.raises(TypeError, match="trees must be a TreeBatch"):
        greedy_accept(one, [0, 3], np.zeros(3, np.int64), [1], [0], 100, 2)
    r2t = np.zeros((2, 16), np.int64)
    with pytest.raises(TypeError, match="trees must be a TreeBatch"):
        compile_tree(one, [2], [0], r2t, SlotPool(np.arange(8), 8))
    with pytest.raises(TypeError, match="pool must be a SlotPool, got ndarray"):
        compile_tree(tb, [2, 2], [0, 1], r2t, np.arange(8))
    with pytest.raises(TypeError, match="res must be an AcceptResult"):
        ref.accept_records(None)
    pool = SlotPool([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 10)  # a list: kept as int64
    assert isinstance(pool.slots, np.ndarray) and pool.slots.dtype == np.int64
    st = compile_tree(tb, [2, 2], [0, 1], r2t, pool)
    assert st.alloc_total == int(tb.node_counts.sum()) and set(st.out_cache_loc.tolist()) <= set(range(1, 11))


def test_review39_commit_paged_checks_before_it_writes():
    """Finding 3: a row -1 wrote the last row, a seq_lens past the columns advanced with nothing
    written (a leaked slot), -1 and a row past the end raised numpy's errors, int8 req_to_token
    stored slots 1000.. as negatives, an extra seq_lens entry was ignored. Nothing is written
    before the error."""
    tb, pool, r2t, committed, rows = _two_request_step()
    st = compile_tree(tb, committed, rows, r2t, pool)
    post = np.array([10, 20, 0, 0, 0, 0, 99, 0, 0])
    res = greedy_accept(tb, [0, 6, 9], post, [1, 1], committed, 16, 3)
    assert res.accepted_count.tolist() == [3, 1]

    def refused(exc, match, rows=rows, r2t=r2t, seq=committed):
        r2t_in, seq_in, pool_in = r2t.copy(), np.array(seq), SlotPool(pool.slots.copy(), pool.count)
        before = (r2t_in.copy(), seq_in.copy(), pool_in.slots.copy(), pool_in.count)
        with pytest.raises(exc, match=match):
            commit_paged(st, res, rows, r2t_in, seq_in, pool_in)
        after = (r2t_in, seq_in, pool_in.slots, pool_in.count)
        assert all(np.array_equal(a, b) for a, b in zip(before, after)), "written before the error"

    refused(ValueError, r"req_pool_indices must be rows of req_to_token \[0, 4\)", rows=np.array([-1, 0]))
    refused(ValueError, r"req_pool_indices must be rows of req_to_token", rows=np.array([2, 5]))
    refused(ValueError, r"seq_lens \+ accepted counts must be in \[0, 16\]", seq=np.array([14, 5]))
    refused(ValueError, r"seq_lens \+ accepted counts must be in \[0, 16\]", seq=np.array([-1, 5]))
    refused(ValueError, r"seq_lens must be \[2\]|seq_lens.*shape", seq=np.array([3, 5, 0]))
    refused(TypeError, "req_to_token must be int32 or int64", r2t=r2t.astype(np.int8))
    seq = committed.copy()
    commit_paged(st, res, rows, r2t, seq, pool)  # the valid call
    assert seq.tolist() == [6, 6] and r2t[2, 3:6].tolist() == st.out_cache_loc[res.accepted_nodes[0, :3]].tolist()


def test_review39_commit_dense_checks_seq_lens_and_the_batch():
    """Finding 6: a negative seq_lens indexed the window from its end, a longer one raised a bare
    IndexError."""
    tb, pool, r2t, committed, rows = _two_request_step()
    post = np.array([10, 20, 0, 0, 0, 0, 99, 0, 0])
    res = greedy_accept(tb, [0, 6, 9], post, [1, 1], committed, 16, 3)
    cache = np.arange(2 * 2 * 32 * 4, dtype=np.float64).reshape(2, 2, 32, 4)
    for seq, match in ((np.array([-3, 5]), "seq_lens must be >= 0"), (np.array([3, 5, 0]), "seq_lens")):
        c = cache.copy()
        with pytest.raises(ValueError, match=match):
            commit_dense(c, res, seq)
        assert np.array_equal(c, cache)
    with pytest.raises(ValueError, match=r"cache must be \[num_layers, bs = 2, window"):
        commit_dense(np.zeros((2, 3, 32, 4)), res, committed.copy())


def test_review39_build_tree_from_topk_refuses_plus_inf():
    """Finding 8: a +inf log-prob made the sibling key inf - inf = NaN."""
    with pytest.raises(ValueError, match=r"\+inf is no log-probability"):
        build_tree_from_topk(0, [[1, 2]], [[np.inf, 0.0]], 2)
    assert not np.isnan(build_tree_from_topk(0, [[1, 2]], [[-np.inf, -1.0]], 2).keys).any()


def test_review39_tree_index_and_bf16_byte_order():
    """Findings 12 and 2: TreeBatch.tree(-1) returned the last request; '>u2' bf16 bits were read
    byte-swapped (1.0 came back as -5.8e-39)."""
    tb, _ = _review38_batch()
    with pytest.raises(IndexError, match=r"b must be in \[0, 2\)"):
        tb.tree(-1)
    with pytest.raises(TypeError, match="b must be an int"):
        tb.tree(1.0)
    assert tb.tree(np.int64(1)).tokens.tolist() == tb.tokens[1, :tb.node_counts[1]].tolist()
    assert bf16_to_f32(np.array([0x3F80, 0xC000], ">u2")).tolist() == [1.0, -2.0]
    assert bf16_to_f32(np.array([0x3F80, 0xC000], "<u2")).tolist() == [1.0, -2.0]


# -- narrow seq_lens / req_to_token dtypes and a short `top` (a tester's findings) ---------------------------

def _path_step(seed=3):
    """Random trees of budget 4 (vocab 10), a random pool and a posterior that accepts, in request 0, the
    path to its last node (a depth-1 or -2 node past index 1: its KV moves in a dense commit), in request 1
    the root only. Returns (trees, step, res, pool, r2t, rows, path of request 0)."""
    rng = np.random.default_rng(seed)
    tb = build_tree([1, 2], rng.standard_normal((2, 3, 10)).astype(np.float32), 4)
    qo = np.r_[0, np.cumsum(tb.node_counts)]
    j = int(tb.node_counts[0]) - 1
    path = [j]
    while path[-1] != 0:
        path.append(int(tb.parents[0, path[-1]]))
    path = path[::-1]
    post = np.full(int(qo[-1]), 9999, np.int64)  # 9999 is no token of the trees: every walk stops
    for a, b in zip(path[:-1], path[1:]):
        post[a] = tb.tokens[0, b]
    pool = SlotPool(rng.permutation(1000).astype(np.int64), 1000)
    r2t = rng.integers(0, 1000, (3, 300)).astype(np.int32)
    rows = np.array([2, 0])
    st = compile_tree(tb, [100, 6], rows, r2t, pool)
    res = greedy_accept(tb, st.qo_indptr, post, [1, 1], [100, 6], 300, 3)
    assert res.accepted_count.tolist() == [len(path), 1] and any(n != i for i, n in enumerate(path))
    return tb, st, res, pool, r2t, rows, path


@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
def test_commit_paged_refuses_a_seq_lens_dtype_the_sum_overflows_before_writing(dtype):
    """A uint8 seq_lens 254 + 2 accepted raised numpy's OverflowError after req_to_token[r, 254:256] was
    written (int8: 126 + 2). Now a ValueError and nothing written; the largest sum that fits commits."""
    _, st, res, pool, r2t, rows, path = _path_step()
    a = len(path)
    top = int(np.iinfo(dtype).max)
    seq = np.array([top - a + 1, 6], dtype)
    r2t_in, pool_in = r2t.copy(), SlotPool(pool.slots.copy(), pool.count)
    with pytest.raises(ValueError, match=rf"seq_lens \+ accepted counts must fit seq_lens's dtype "
                                         rf"{np.dtype(dtype)} \(at most {top}\), got {top + 1} for request 0"):
        commit_paged(st, res, rows, r2t_in, seq, pool_in)
    assert np.array_equal(r2t_in, r2t) and seq.tolist() == [top - a + 1, 6]
    assert np.array_equal(pool_in.slots, pool.slots) and pool_in.count == pool.count
    seq = np.array([top - a, 6], dtype)  # fits: committed as with int64
    commit_paged(st, res, rows, r2t_in, seq, pool_in)
    assert seq.tolist() == [top, 7]
    assert r2t_in[2, top - a:top].tolist() == st.out_cache_loc[path].tolist()
    assert r2t_in[0, 6] == st.out_cache_loc[st.qo_indptr[1]]
    assert pool_in.count == st.alloc_base + st.alloc_total - a - 1


def test_commit_dense_refuses_a_seq_lens_dtype_the_sum_overflows_before_moving():
    """An int8 seq_lens 126 + 2 raised numpy's OverflowError after cache rows were moved. Now a ValueError
    before anything moves; the check is on the nodes kept (a window cut that keeps the sum in range commits)."""
    _, _, res, _, _, _, path = _path_step()
    a = len(path)
    rng = np.random.default_rng(5)
    cache = rng.standard_normal((2, 2, 200, 3))
    seq, c = np.array([128 - a, 6], np.int8), cache.copy()
    with pytest.raises(ValueError, match=r"must fit seq_lens's dtype int8 \(at most 127\), got 128 for request 0"):
        commit_dense(c, res, seq)
    assert np.array_equal(c, cache) and seq.tolist() == [128 - a, 6]
    assert res.accepted_count.tolist() == [a, 1] and res.active.tolist() == [1, 1]
    seq = np.array([127 - a, 6], np.int8)  # fits: the accepted rows move to the front
    assert commit_dense(c, res, seq) == 0 and seq.tolist() == [127, 7]
    for i, node in enumerate(path):
        np.testing.assert_array_equal(c[:, 0, 127 - a + i], cache[:, 0, 127 - a + node])
    np.testing.assert_array_equal(c[:, 1], cache[:, 1])  # request 1: the root only, in place
    # a window of 127 keeps only the root of a path at 126: 126 + 1 fits int8, so it commits (cut)
    res = _path_step()[2]
    c, seq = cache[:, :, :127].copy(), np.array([126, 6], np.int8)
    assert commit_dense(c, res, seq) == STATUS_CONTEXT_FULL
    assert seq.tolist() == [127, 7] and res.accepted_count.tolist() == [1, 1] and res.active.tolist() == [0, 1]


@pytest.mark.parametrize("dtype", [np.int16, np.int8, np.uint8, np.uint32, np.uint64])
def test_compile_tree_refuses_the_req_to_token_dtypes_commit_paged_refuses(dtype):
    """compile_tree took an int16 req_to_token that commit_paged then refused; both now say the same."""
    tb, st, _, pool, r2t, rows, _ = _path_step()
    pool_in = SlotPool(pool.slots.copy(), pool.count)
    with pytest.raises(TypeError, match=rf"req_to_token must be int32 or int64 \(the kernels' types\), "
                                        rf"got dtype {np.dtype(dtype)}"):
        compile_tree(tb, [100, 6], rows, r2t.astype(dtype), pool_in)
    assert np.array_equal(pool_in.slots, pool.slots) and pool_in.count == pool.count
    for ok in (r2t.astype(np.int64), r2t.tolist()):  # int64 and a list of ints (int64) as int32
        got = compile_tree(tb, [100, 6], rows, ok, pool)
        assert got.kv_indices.tolist() == r2t[2, :100].tolist() + r2t[0, :6].tolist()
        np.testing.assert_array_equal(got.kv_indices, st.kv_indices)


def test_build_tree_refuses_a_top_narrower_than_k():
    """A top of [bs, depth_limit, 2] with logits of vocab 10 and budget 4 (K = 4) built a tree from 2 ranks."""
    rng = np.random.default_rng(6)
    lg = rng.standard_normal((2, 3, 10)).astype(np.float32)
    want = build_tree([1, 2], lg, 4)
    ids, lp, _ = zip(*(topk_logprobs(lg[b], 7) for b in range(2)))  # 7 >= K ranks: the first K are used
    got = build_tree([1, 2], lg, 4, top=(np.stack(ids), np.stack(lp)))
    for f in ("tokens", "parents", "depths", "node_counts", "top_ids", "top_lp"):
        np.testing.assert_array_equal(getattr(got, f), getattr(want, f))
    with pytest.raises(ValueError, match=r"top must be \[bs=2, depth_limit=3, >= K=4\] \(K = min\(budget, vocab\) "
                                         r"of logits \(2, 3, 10\)\), got shape \(2, 3, 2\)"):
        build_tree([1, 2], lg, 4, top=(want.top_ids[:, :, :2], want.top_lp[:, :, :2]))
    with pytest.raises(ValueError, match=r"depth_limit=3, >= K=4.*got shape \(2, 2, 4\)"):
        build_tree([1, 2], lg, 4, top=(want.top_ids[:, :2], want.top_lp[:, :2]))
    with pytest.raises(ValueError, match=r"logits must be \[bs=2"):
        build_tree([1, 2], lg[:1], 4, top=(want.top_ids, want.top_lp))
    # a vocabulary of 2 (K = 2) takes the 2 ranks; without logits K = min(budget, 2) as before
    small = build_tree([1, 2], lg[:, :, :2], 4)
    for logits in (lg[:, :, :2], None):
        got = build_tree([1, 2], logits, 4, top=(small.top_ids, small.top_lp))
        np.testing.assert_array_equal(got.tokens, small.tokens)


def test_commit_paged_refuses_a_result_of_another_step_before_writing():
    """Fresh-user trial (s66): a res from another step (its request 1 accepted 4 nodes of a tree that
    had only its root here) raised a bare IndexError after request 0 was committed, leaving its slots both in
    req_to_token and on the free stack; a res of fewer requests raised numpy's broadcast error and one
    of more was accepted. Now a ValueError naming the mismatch, and nothing written."""
    lg = np.zeros((2, 3, 4), np.float32)
    lg[:, :, 1] = 5
    tb_a, tb_b = build_tree([1, 1], lg, 3), build_tree([1, 1], lg, 3, budgets=[3, 0])
    seq = np.array([0, 0])
    r2t = np.full((2, 10), -1, np.int64)
    pool = SlotPool(np.arange(100, 120), 20)
    st_a, st_b = compile_tree(tb_a, seq, [0, 1], r2t, pool), compile_tree(tb_b, seq, [0, 1], r2t, pool)
    post = np.zeros((st_a.alloc_total, 4), np.float32)
    post[:, 1] = 9
    res_a = greedy_accept(tb_a, st_a.qo_indptr, post, [1, 1], seq, 10, 3)
    assert res_a.accepted_count.tolist() == [4, 4]

    def refused(step, res, match):
        r2t_in, seq_in, pool_in = r2t.copy(), seq.copy(), SlotPool(pool.slots.copy(), pool.count)
        with pytest.raises(ValueError, match=match):
            commit_paged(step, res, [0, 1], r2t_in, seq_in, pool_in)
        assert np.array_equal(r2t_in, r2t) and np.array_equal(seq_in, seq)
        assert np.array_equal(pool_in.slots, pool.slots) and pool_in.count == pool.count

    refused(st_b, res_a, r"res does not belong to step: request 1 accepts nodes \[0, 1, 2, 3\] "
                         r"\(accepted_count 4\) of a tree of 1 nodes")
    bad = dataclasses.replace(res_a, accepted_nodes=res_a.accepted_nodes.copy())
    bad.accepted_nodes[0, 2] = bad.accepted_nodes[0, 1]  # a node twice
    refused(st_a, bad, r"res does not belong to step: request 0")
    for n in (1, 3):
        other = greedy_accept(build_tree([1] * n, np.broadcast_to(lg[:1], (n, 3, 4)), 3),
                              np.arange(n + 1) * 4, np.tile(post[:4], (n, 1)), [1] * n, [0] * n, 10, 3)
        refused(st_a, other, rf"res must be the accept result of step's batch of 2 requests, got {n}")
    r2t_in, seq_in = r2t.copy(), seq.copy()
    commit_paged(st_a, res_a, [0, 1], r2t_in, seq_in, SlotPool(pool.slots.copy(), pool.count))  # the valid call
    assert seq_in.tolist() == [4, 4] and sorted(r2t_in[:, :4].ravel().tolist()) == st_a.out_cache_loc.tolist()


def test_compile_and_commit_refuse_two_requests_on_one_req_to_token_row():
    """Fresh-user trial (s66): req_pool_indices [0, 0] let request 1 overwrite request 0's entries."""
    tb, st, res, pool, r2t, rows, _ = _path_step()
    with pytest.raises(ValueError, match=r"req_pool_indices must be distinct for requests with nodes .* got row 2 "
                                         r"for requests \[0, 1\]"):
        compile_tree(tb, [100, 6], [2, 2], r2t, pool)
    r2t_in, seq_in = r2t.copy(), np.array([100, 6])
    with pytest.raises(ValueError, match=r"distinct for requests with accepted nodes"):
        commit_paged(st, res, [2, 2], r2t_in, seq_in, SlotPool(pool.slots.copy(), pool.count))
    assert np.array_equal(r2t_in, r2t) and seq_in.tolist() == [100, 6]
    # a request without nodes takes no part: its row may be anyone's
    lg = np.random.default_rng(2).standard_normal((2, 3, 10)).astype(np.float32)
    tb1 = build_tree([1, 2], lg, 4, active=[1, 0])
    assert compile_tree(tb1, [5, 6], [1, 1], r2t, pool).alloc_total == 5  # the root and budget 4


@pytest.mark.parametrize("which", ["req_to_token", "seq_lens", "pool.slots"])
def test_commit_paged_refuses_read_only_arrays_before_writing(which):
    """A read-only seq_lens or pool.slots raised numpy's error after req_to_token was written."""
    _, st, res, pool, r2t, rows, _ = _path_step()
    r2t_in, seq_in, pool_in = r2t.copy(), np.array([100, 6]), SlotPool(pool.slots.copy(), pool.count)
    {"req_to_token": r2t_in, "seq_lens": seq_in, "pool.slots": pool_in.slots}[which].flags.writeable = False
    with pytest.raises(ValueError, match=rf"{which} is read-only: commit_paged updates it in place"):
        commit_paged(st, res, rows, r2t_in, seq_in, pool_in)
    assert np.array_equal(r2t_in, r2t) and seq_in.tolist() == [100, 6] and np.array_equal(pool_in.slots, pool.slots)


def test_float64_logits_past_float32_become_inf_without_a_warning():
    """Fresh-user trial (s66): numpy's "overflow encountered in cast" leaked from the documented conversion."""
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ids, lp, lse = topk_logprobs(np.array([[1e300, 0.0, -1e300], [2.0, 1e300, 0.0]]), 2)
    assert ids.tolist() == [[0, 1], [1, 0]] and np.isnan(lse).all() and (lp == R.LP_FLOOR).all()


def test_commit_paged_leaves_a_request_without_nodes_alone_whatever_its_row():
    """Review (s66): a request without nodes and a row outside req_to_token (compile_tree does not check
    it) raised a bare IndexError after request 0 was committed; a hand-built res whose accepted_nodes
    was narrower than its accepted_count half-committed before numpy's broadcast error."""
    lg = np.zeros((2, 3, 4), np.float32)
    lg[:, :, 1] = 5
    tb = build_tree([1, 1], lg, 3, active=[1, 0])
    seq, r2t = np.array([0, 0]), np.full((2, 10), -1, np.int64)
    pool = SlotPool(np.arange(100, 120), 20)
    st = compile_tree(tb, seq, [0, 99], r2t, pool)
    post = np.zeros((st.alloc_total, 4), np.float32)
    post[:, 1] = 9
    res = greedy_accept(tb, st.qo_indptr, post, [1, 1], seq, 10, 3)
    assert res.accepted_count.tolist() == [4, 0]
    narrow = dataclasses.replace(res, accepted_nodes=res.accepted_nodes[:, :3].copy())
    r2t_in, seq_in, pool_in = r2t.copy(), seq.copy(), SlotPool(pool.slots.copy(), pool.count)
    with pytest.raises(ValueError, match=r"accepted_nodes must be \[2, >= 4\] .* got shape \(2, 3\)"):
        commit_paged(st, narrow, [0, 99], r2t_in, seq_in, pool_in)
    assert np.array_equal(r2t_in, r2t) and seq_in.tolist() == [0, 0] and pool_in.count == 20
    commit_paged(st, res, [0, 99], r2t_in, seq_in, pool_in)
    assert seq_in.tolist() == [4, 0] and r2t_in[0, :4].tolist() == st.out_cache_loc.tolist()
    assert pool_in.count == 16 and not set(pool_in.slots[:16].tolist()) & set(r2t_in[0, :4].tolist())


def _review_tree():
    """Two requests of 2 and 4 nodes (budgets 1 and 3), the second review's example."""
    return build_tree([1, 2], np.random.default_rng(5).standard_normal((2, 2, 5)).astype(np.float32), 3,
                      budgets=[1, 3])


def test_greedy_accept_needs_one_row_per_node_or_none():
    """A fresh user's review (seventy-third session): qo_indptr with fewer or more rows than a
    request's nodes was taken, cutting the tree (accepted_count 1 instead of 2) or reading past it."""
    tb = _review_tree()
    assert tb.node_counts.tolist() == [2, 4]
    for qo in ([0, 3, 7], [0, 1, 5]):
        with pytest.raises(ValueError, match=r"^request 0 has \d rows in qo_indptr but 2 tree nodes"):
            greedy_accept(tb, qo, np.zeros(qo[-1], np.int64), [1, 1], [0, 0], 10, 2)
    greedy_accept(tb, [0, 2, 6], np.zeros(6, np.int64), [1, 1], [0, 0], 10, 2)  # one row per node
    greedy_accept(tb, [0, 0, 4], np.zeros(4, np.int64), [1, 1], [0, 0], 10, 2)  # none: compile gave it no rows


def test_slot_pool_free_slots_are_distinct_and_not_negative():
    """The review: a pool of [-5] * 8 or [3] * 8 handed one slot (or the exhausted sentinel's kin)
    to every node; a count changed after construction was not checked again by compile_tree."""
    for slots in ([-5] * 8, [3] * 8, [0, 1, 2, 1]):
        with pytest.raises(ValueError, match="free slots"):
            SlotPool(np.array(slots, np.int64), len(slots))
    SlotPool(np.array([0, 1, 2, -1, -1], np.int64), 3)  # past count: not read
    tb = _review_tree()
    r2t = np.zeros((2, 8), np.int64)
    for count in (50, -3):
        pool = SlotPool(np.arange(10), 10)
        pool.count = count
        with pytest.raises(ValueError, match="^count must be in 0..10"):
            compile_tree(tb, [1, 1], [0, 1], r2t, pool)
    pool = SlotPool(np.arange(10), 10)
    pool.slots[9] = 4  # a repeat among the free slots, after construction
    with pytest.raises(ValueError, match="must be distinct, got slot 4 2 times"):
        compile_tree(tb, [1, 1], [0, 1], r2t, pool)


def test_commit_paged_refuses_a_slot_its_int32_table_would_wrap():
    """The review: slot ids of 2**31 and more were written into an int32 req_to_token as negatives."""
    tb = _review_tree()
    big = np.arange(2**31, 2**31 + 10, dtype=np.int64)
    for dtype, ok in ((np.int32, False), (np.int64, True)):
        r2t, seq, pool = np.zeros((2, 8), dtype), np.array([1, 1]), SlotPool(big.copy(), 10)
        st = compile_tree(tb, seq, [0, 1], r2t, pool)
        res = greedy_accept(tb, st.qo_indptr, np.zeros(int(st.qo_indptr[-1]), np.int64), [1, 1], seq, 8, 2)
        if ok:
            commit_paged(st, res, [0, 1], r2t, seq, pool)
            assert r2t.max() >= 2**31
        else:
            r2t_in, seq_in = r2t.copy(), seq.copy()
            with pytest.raises(ValueError, match="must fit req_to_token's dtype int32"):
                commit_paged(st, res, [0, 1], r2t, seq, pool)
            assert (r2t == r2t_in).all() and (seq == seq_in).all() and pool.count == 10  # nothing written


def _dense_res(nodes, count):
    nodes = np.asarray(nodes, np.int32)
    bs = nodes.shape[0]
    return ref.AcceptResult(accepted_nodes=nodes, accepted_count=np.asarray(count, np.int32),
                        bonus=np.full(bs, 5, np.int32), finished=np.zeros(bs, np.uint8),
                        emitted=np.full(nodes.shape, -1, np.int32), num_emitted=np.zeros(bs, np.int32),
                        active=np.ones(bs, np.uint8), root_tokens=np.zeros(bs, np.int32),
                        posterior=np.zeros(6, np.int32), status=0)


def test_commit_dense_checks_res_and_writability_before_moving():
    """The review: a read-only seq_lens failed after the cache had moved; a count past the row, a
    negative count, node -1 or descending nodes corrupted the cache or leaked an IndexError."""
    cache0 = np.arange(12.0).reshape(1, 2, 6)
    ro = np.array([1, 1])
    ro.flags.writeable = False
    cases = [(_dense_res([[0, 2, -1], [0, 1, -1]], [2, 2]), ro, "seq_lens is read-only"),
             (_dense_res([[0, 2, -1], [0, 1, -1]], [4, 2]), None, "accepted_count in"),
             (_dense_res([[0, 2, -1], [0, 1, -1]], [-2, 2]), None, "accepted_count in"),
             (_dense_res([[0, -1, 3], [0, 1, -1]], [3, 2]), None, "not ascending node ids >= 0"),
             (_dense_res([[0, 2, 1], [0, 1, -1]], [3, 2]), None, "not ascending node ids >= 0")]
    for res, seq, words in cases:
        cache, seq = cache0.copy(), (np.array([1, 1]) if seq is None else seq)
        with pytest.raises(ValueError, match=words):
            commit_dense(cache, res, seq)
        assert (cache == cache0).all()
    cache = cache0.copy()
    ro_cache = cache.copy()
    ro_cache.flags.writeable = False
    with pytest.raises(ValueError, match="cache is read-only"):
        commit_dense(ro_cache, _dense_res([[0, 2, -1], [0, 1, -1]], [2, 2]), np.array([1, 1]))
    seq = np.array([1, 1])
    assert commit_dense(cache, _dense_res([[0, 2, -1], [0, 1, -1]], [2, 2]), seq) == 0
    assert cache[0, 0, 1:3].tolist() == [1.0, 3.0] and seq.tolist() == [3, 3]  # row 1 + node 2 moved to 2


def test_build_tree_from_topk_refuses_repeated_or_negative_sibling_tokens():
    """The review: [[3, 3]] built two sibling nodes of one token, and negative ids were taken."""
    lp = np.array([[-0.1, -0.2], [-0.3, -0.4]], np.float32)
    with pytest.raises(ValueError, match="^top_ids must be distinct within a depth .* token 3 2 times at depth 2$"):
        build_tree_from_topk(7, np.array([[1, 2], [3, 3]]), lp, 4)
    with pytest.raises(ValueError, match="^top_ids must be token ids >= 0, got -1 at depth 1, rank 1$"):
        build_tree_from_topk(7, np.array([[1, -1], [3, 4]]), lp, 4)
    t = build_tree_from_topk(7, np.array([[1, 2], [3, 3]]), lp, 1)  # K = min(budget, 2) = 1: rank 0 alone
    assert t.tokens.tolist() == [7, 1]
