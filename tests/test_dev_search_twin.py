"""The deviation search's algorithm (cu/ddtree/search.cuh, ``dev_search``) through its numpy twin,
research/probes/dev_search_twin.py, on the CPU: on every row where the twin builds the tree itself
it must equal the reference heap's (``build_tree_from_topk``) node for node -- rows tied everywhere
on a 0.25 grid, confident rows, rows with two near-equal tokens per depth (nodes of two
deviations) and bf16-truncated rows -- and it must hand to the heap exactly the rows whose trees
it cannot prove (three deviations, an inexact float64 sum). The GPU tests check the kernel against
the same reference (test_ddtree_gpu.py, ``test_deviation_search_exact_or_hands_to_the_heap``);
this checks the design on many more rows than a GPU run builds.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from driverlevel.reference import ddtree as ref
from test_ddtree_gpu import paired_rows, peaked_rows  # (the GPU tests' rows; importable without a GPU)

_path = Path(__file__).parents[1] / "research" / "probes" / "dev_search_twin.py"
_spec = importlib.util.spec_from_file_location("dev_search_twin", _path)
twin = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(twin)


def _check(lp: np.ndarray, n: int) -> str:
    """Runs the twin's kernel path (direct) on one request; asserts its tree equals the reference's
    when it builds one. Returns ``"built"`` or the reason it hands the request to the heap."""
    got, why = twin.dev_search(lp, n, direct=True)
    if got is None:
        return why.split()[0]
    want = twin.reference_tuples(lp, n)
    assert got == want, (lp, n, got, want)
    assert len(got) == n and len(set(got)) == n
    return "built"


def test_rows_tied_everywhere_equal_the_heap():
    """Log-probs on a 0.25 grid (every key ties with many others; depth limits 1..8, budgets
    2..16): the tie-break (``dev_tb``) must give the heap's order, and most rows are built."""
    rng = np.random.default_rng(17)
    routes = {}
    for _ in range(400):
        D = int(rng.integers(1, 9))
        n = int(rng.choice([2, 3, 4, 8, 16]))
        lp = -np.sort(rng.integers(0, 12, (D, n)), axis=1).astype(np.float32) * np.float32(0.25)
        r = _check(lp, n)
        routes[r] = routes.get(r, 0) + 1
    assert routes.get("built", 0) >= 300, routes
    assert set(routes) <= {"built", "three", "cap"}, routes


@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("rows, route", [("peaked 0.0", "built"), ("peaked 0.7", "built"),
                                         ("paired 0.4", "built"), ("paired 0.1", "three")])
def test_drafter_rows_are_built_or_handed_on_as_the_kernel_does(rows, route, bf16):
    """Deep rows at budgets 4, 8 and 16 (vocabulary 4,096, depth 15): confident rows (exact ties
    between paths when the boosts do not jitter) and paired rows with two deviations (gap 0.4) are
    built and equal the heap's trees; with gap 0.1 the trees may hold three deviations, and at
    budget 16 the twin hands every such request to the heap (as the GPU test's stamps show the
    kernel doing). bf16: the rows truncated to bf16's bits (more ties)."""
    kind, arg = rows.split()
    rng = np.random.default_rng(29 + len(rows))
    x = (peaked_rows if kind == "peaked" else paired_rows)(rng, 4, 15, 4096, float(arg))
    if bf16:
        x = (x.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
    for n in (4, 8, 16):
        for row in x:
            _, lp, _ = ref.topk_logprobs(row, n)
            r = _check(lp, n)
            if n == 16:
                assert r == route, (rows, bf16, r)
            else:
                assert r in ("built", "three"), (rows, bf16, n, r)


def test_inexact_keys_go_to_the_heap():
    """A row whose log-probs span 2^53 of their lowest set bit (a log-prob of -2^-40 beside -1e6)
    cannot have its float64 keys proved exact: the twin refuses it (``inexact``), as the kernel
    does (stamp ``dvfail``)."""
    D, n = 6, 8
    lp = np.tile(-np.arange(n, dtype=np.float32) * np.float32(0.5), (D, 1))
    lp[2, 1] = np.float32(-(2.0 ** -40))
    lp[3, n - 1] = np.float32(-1e6)
    lp[3] = np.sort(lp[3])[::-1]
    lp[2] = np.sort(lp[2])[::-1]
    assert _check(lp, n) == "inexact"


def test_the_tie_break_is_the_ranks_tuple_order():
    """``dev_tb`` (the kernel's u64 tie-break of nodes of at most two deviations) orders every pair
    of such nodes as the reference compares their ranks tuples (lexicographic, a prefix first)."""
    nodes = [(0, L, 0, 0, 0, 0) for L in range(1, 6)]
    for L in range(1, 6):
        for j1 in range(L):
            for r1 in range(1, 4):
                nodes.append((1, L, j1, r1, 0, 0))
                for j2 in range(j1 + 1, L):
                    for r2 in range(1, 3):
                        nodes.append((2, L, j1, r1, j2, r2))
    tup = [twin.as_tuple(t) for t in nodes]
    assert len(set(tup)) == len(tup)
    for a, ta in zip(nodes, tup):
        for b, tb in zip(nodes, tup):
            assert (twin.dev_tb(a) < twin.dev_tb(b)) == (ta < tb), (ta, tb)
