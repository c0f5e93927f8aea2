"""The deviation rounds' algorithm (``dev_rounds``: research/patches/dev-rounds.patch, measured slower
on the H200 in the forty-third session and not landed; in the history at e44613d) through its numpy twin, research/probes/dev_rounds_twin.py, on the CPU:
where the twin builds the tree it must equal the
reference heap's (``build_tree_from_topk``) node for node -- rows tied everywhere on a 0.25 grid,
confident rows with and without jitter, paired rows (nodes of many deviations), bf16-truncated
rows -- and it hands on (to the parallel search) only rows whose candidates overflow SEARCH_CAP or
whose float64 sums it cannot prove exact. The GPU tests check the kernel against the same
reference (the patch's test_ddtree_gpu.py, ``test_deviation_rounds_exact_or_hand_on``). The twin stays
as the design's record.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from driverlevel.reference import ddtree as ref
from test_ddtree_gpu import paired_rows, peaked_rows  # (the GPU tests' rows; importable without a GPU)

_probes = Path(__file__).parents[1] / "research" / "probes"
sys.path.insert(0, str(_probes))  # (the twin imports its sibling probes)
_spec = importlib.util.spec_from_file_location("dev_rounds_twin", _probes / "dev_rounds_twin.py")
twin = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(twin)


def _check(lp: np.ndarray, n: int) -> str:
    got, st = twin.dev_rounds(lp, n)
    if got is None:
        return st.split()[0]
    want = twin.reference_tuples(lp, n)
    assert got == want, (n, got[:8], want[:8])
    return "built"


def test_rows_tied_everywhere_equal_the_heap():
    """Log-probs on a 0.25 grid (every key ties with many others; depth limits 2..8, budgets
    17..48): the final ranking's tie-break and the rounds' bins must give the heap's tree."""
    rng = np.random.default_rng(23)
    routes = {}
    for _ in range(60):
        D = int(rng.integers(2, 9))
        n = int(rng.choice([17, 24, 32, 48]))
        lp = -np.sort(rng.integers(0, 40, (D, n)), axis=1).astype(np.float32) * np.float32(0.25)
        lp[:, 0] = np.minimum(lp[:, 0], 0)
        r = _check(lp, n)
        routes[r] = routes.get(r, 0) + 1
    assert routes.get("built", 0) >= 50, routes


@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("kind, arg, budget", [("peaked", 0.0, 32), ("peaked", 0.7, 64), ("peaked", 1.5, 128),
                                               ("paired", 0.1, 64), ("paired", 0.4, 128)])
def test_deep_rows_equal_the_heap(kind, arg, budget, bf16):
    """Deep rows (depth 15, vocabulary 4,096): confident rows (exact ties between paths when the
    boosts do not jitter) and paired rows (two near-equal tokens per depth) are built in one or
    more rounds and equal the heap's trees; the trees are deep."""
    rng = np.random.default_rng(31 + budget + int(10 * arg))
    for _ in range(2):
        x = (paired_rows if kind == "paired" else peaked_rows)(rng, 1, 15, 4096, arg)[0]
        if bf16:
            x = (x.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
        _, lp, _ = ref.topk_logprobs(x, budget)
        assert _check(lp, budget) == "built"
        got, st = twin.dev_rounds(lp, budget)
        assert st["depth"] >= 8 and st["cand"] <= twin.SEARCH_CAP


def test_overflow_and_inexact_rows_are_handed_on():
    """Budget 512 on confident rows: more than SEARCH_CAP candidates (``cap``); a row whose
    log-probs span 2^53 of their lowest set bit: ``inexact``. Either way the kernel runs the
    parallel search instead."""
    rng = np.random.default_rng(41)
    _, lp, _ = ref.topk_logprobs(peaked_rows(rng, 1, 15, 4096, 0.0)[0], 512)
    assert _check(lp, 512) == "cap"
    D, n = 6, 20
    lp = np.tile(-np.arange(n, dtype=np.float32) * np.float32(0.5), (D, 1))
    lp[2, 1] = np.float32(-(2.0 ** -40))
    lp[3, n - 1] = np.float32(-1e6)
    assert _check(lp, n) == "inexact"
