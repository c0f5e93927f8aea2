"""``benchmarks/bench_ddtree.py`` times the DDTree reference itself (CPU only).

Its peer columns must come from :mod:`driverlevel.reference.ddtree`, not from a copy of it:
the host stages it times give what the reference's ``build_tree`` gives, and its accept
follows the tree.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

from driverlevel.reference import ddtree as ref

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_ddtree.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_ddtree", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_benchmark_has_no_copy_of_the_reference():
    text = BENCH.read_text()
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
