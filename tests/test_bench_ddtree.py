"""``benchmarks/bench_ddtree.py`` times the DDTree reference itself (CPU only).

Its peer columns must come from :mod:`driverlevel.reference.ddtree`, not from a copy of it:
the host stages it times give what the reference's ``build_tree`` gives, and its accept
follows the tree.
"""

from __future__ import annotations

import numpy as np

from bench_util import BENCH, load_bench
from driverlevel._topk_threshold import sample_tokens
from driverlevel.reference import ddtree as ref



def _bench():
    return load_bench("bench_ddtree")


def test_the_benchmark_has_no_copy_of_the_reference():
    text = (BENCH / "bench_ddtree.py").read_text()
    assert "import heapq" not in text and "def reference_heap" not in text
    assert "from driverlevel.reference import ddtree as ref" in text


def test_reference_stages_match_the_reference_build_and_accept():
    bench = _bench()
    rng = np.random.default_rng(0)
    bs, vocab, budget = 3, 64, 16
    logits = rng.standard_normal((bs, bench.DEPTH, vocab)).astype(np.float32) * 3
    k = min(budget, vocab)
    tops = [ref.topk_logprobs(logits[b], k) for b in range(bs)]
    ids = np.stack([t[0] for t in tops])
    lp = np.stack([t[1] for t in tops])

    trees = bench.reference_build(ids, lp, budget)
    tb = bench.reference_visibility(trees, ids, lp, budget)
    want = ref.build_tree(np.zeros(bs, np.int64), logits, budget)
    for name in ("tokens", "depths", "parents", "node_counts", "masks", "top_ids", "top_lp"):
        np.testing.assert_array_equal(getattr(tb, name), getattr(want, name), err_msg=name)

    # A target that agrees with each tree's first child everywhere accepts a root-to-leaf chain.
    post = []
    for b in range(bs):
        n = int(tb.node_counts[b])
        for i in range(n):
            kids = np.flatnonzero(tb.parents[b, :n] == i)
            post.append(int(tb.tokens[b, kids[0]]) if kids.size else 7)
    res = bench.reference_accept(tb, np.asarray(post))
    for b in range(bs):
        path = res.accepted_nodes[b, :res.accepted_count[b]]
        assert res.accepted_count[b] >= 2 and path[0] == 0
        assert all(tb.parents[b, path[i]] == path[i - 1] for i in range(1, len(path)))


def test_drafter_kinds_give_the_tree_shapes_their_docs_claim():
    """--drafter: the default rows are nearly flat (top-1 probability under 1%) and their trees
    stars of depth 1; the peaked rows put ~0.76 on the top token (the jittered ones 0.3-0.99, a
    different value at every depth) and their budget-256 trees reach every depth (the reference's
    tree on the bench's own logits, at the bench's vocabulary)."""
    bench = _bench()
    for drafter, star, (lo, hi) in (("random", True, (0.0, 0.01)), ("peaked", False, (0.6, 0.9)),
                                    ("jittered", False, (0.3, 0.99))):
        x, top = bench.drafter_logits(np.random.default_rng(1), 2, drafter)
        assert x.shape == (2, bench.DEPTH, bench.VOCAB) and top.shape == (2, bench.DEPTH, 4)
        p1 = np.exp(ref.topk_logprobs(x[0], 1)[1][:, 0])
        assert ((p1 > lo) & (p1 < hi)).all(), (drafter, p1)
        if drafter == "jittered":  # the boosts differ per depth
            assert np.unique(np.round(p1, 3)).size == bench.DEPTH
        t = ref.build_tree(np.zeros(2, np.int64), x, 256)
        for b in range(2):
            depths = t.depths[b, 1:int(t.node_counts[b])]
            assert depths.size == 256
            if star:
                assert (depths == 1).all()
            else:
                assert depths.max() == bench.DEPTH and (np.bincount(depths)[1:] > 0).all()


def test_code_evictor_is_larger_than_an_sms_instruction_caches():
    """--evict-code's kernel (also tools/ddtree_stamps.py's) compiles (NVRTC) to over 250 KB of code
    and keeps its steps (no dead-code elimination: the cubin grows with EVICT_STEPS), without spills."""
    import driverlevel as dl

    b = _bench()
    small = dl.runtime.compile_source(b.EVICT_SRC, "evict_code.cu", "sm_90", {"EVICT_STEPS": 64})
    big = dl.runtime.compile_source(b.EVICT_SRC, "evict_code.cu", "sm_90", {"EVICT_STEPS": b.EVICT_STEPS})
    assert len(big.data) > 250_000 and len(big.data) > 20 * len(small.data)
    assert big.resources["evict_code"].spills == 0


def test_clustered_drafter_puts_its_large_logits_in_aligned_runs():
    """--drafter clustered: the random rows plus 32 runs of 16 consecutive ids (each starting at a
    multiple of 16) of logits in [6.5, 8.5), the four strong tokens written after them (9 / 6 / 5 / 4
    as in the random rows)."""
    bench = _bench()
    runs, run, lo, hi = bench.DRAFTER_CLUSTERS["clustered"]
    x, top = bench.drafter_logits(np.random.default_rng(3), 2, "clustered")
    assert x.shape == (2, bench.DEPTH, bench.VOCAB) and top.shape == (2, bench.DEPTH, 4)
    for b in range(2):
        for d in range(bench.DEPTH):
            row = x[b, d]
            assert (row[top[b, d]] == np.float32([9.0, 6.0, 5.0, 4.0])).all()
            hot = (row >= lo) & (row < hi)
            hot[top[b, d]] = False
            groups = hot[: bench.VOCAB // run * run].reshape(-1, run)
            full = groups.all(axis=1)
            # every run is whole (a strong token may sit in one); the noise (N(0, 4)) adds a few
            # scattered values in [6.5, 8.5) outside the runs (~93), never a whole group of 16
            assert runs - 1 <= int(full.sum()) <= runs
            assert hot.sum() - groups[full].sum() < 200  # ~93 expected: 163,840 x P(3.25 <= z < 4.25)


def test_fallback_rows_counts_the_rows_whose_threshold_fails():
    """fallback_rows: a constant row (every logit >= T: more than tk_cap) and a row with fewer
    than K finite logits fall back, to the chunk top-K (ties past the capacity; too few finite
    logits); a row whose sampled tokens are boosted is refined; the random rows around them do not
    fall back (fp32 and bf16)."""
    bench = _bench()

    class Plan:
        k = 256

    x, _ = bench.drafter_logits(np.random.default_rng(5), 2, "random")
    x[0, 3] = 1.0
    x[1, 5] = -np.inf
    x[1, 5, 1000:1010] = np.arange(10, dtype=np.float32)
    for bf16 in (False, True):
        assert bench.fallback_rows(x, Plan, bf16, 132) == {"fallback": 2, "refined": 0, "chunk": 2, "max_reads": 0}
        z = x.copy()
        z[0, 7, sample_tokens(z.shape[2], bf16)] += 50.0  # the sample sees only these: T ~ 55, fewer than K logits >= T
        got = bench.fallback_rows(z, Plan, bf16, 132)
        assert got["fallback"] == 3 and got["refined"] == 1 and got["chunk"] == 2 and got["max_reads"] >= 1, got
    y, _ = bench.drafter_logits(np.random.default_rng(5), 2, "random")
    assert bench.fallback_rows(y, Plan, False, 132) == {"fallback": 0, "refined": 0, "chunk": 0, "max_reads": 0}
