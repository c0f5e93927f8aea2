"""A numpy model of a one-warp bounded enumeration for small budgets (a design for replacing the
one-warp heap, research/ddtree_build.md, thirty-eighth session), checked against the reference heap.

The tree of a request is the ``budget`` best nodes in (key desc, ranks tuple asc) order when every
log-prob is <= 0 (keys fall along children and siblings: the parallel search's precondition). A
lower bound ``T`` of the budget-th best key comes from nodes whose keys are known at once: the
chain's siblings (at every depth the ranks 0 .. budget-1 below the chain's node one depth up). Every tree node has key >= T, and so
has every ancestor and earlier sibling of one, so the nodes with key >= T are found depth by depth
from the root, each parent's children a prefix of its sorted row; then sorting those candidates
gives the tree. The model counts what a warp would do (depths walked, candidates, fallbacks) and
asserts the tree equals ``reference.ddtree.build_tree_from_topk``'s.

Fallbacks (the kernel would run the heap): a positive log-prob, a float64 sum parent + lp that is
not exact (then the reference's sibling chain of keys may differ from the sums), more than CAP
candidates, or fewer than ``budget`` known nodes for the bound.

    python research/probes/warp_enum_model.py
"""
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from driverlevel.reference import ddtree as ref  # noqa: E402

CAP = 64  # candidates a warp holds (two per lane)


def exact_sum(a: float, b: float) -> tuple[float, bool]:
    """fl(a + b) in float64 and whether it is exact (TwoSum)."""
    s = a + b
    bb = s - a
    err = (a - (s - bb)) + (b - bb)
    return s, err == 0.0


def warp_enum(lp: np.ndarray, budget: int):
    """``(depths, parents, ranks, stats)`` of the tree, or ``(None, reason)``; lp float32 [D, K] rows
    sorted descending (the build's top-K rows)."""
    D, K = lp.shape
    k = min(budget, K)
    lpd = lp[:, :k].astype(np.float64)
    if D == 0 or k == 0 or budget == 0:
        return None, "empty"
    if np.any(lpd[:, 0] > 0):
        return None, "positive"
    # the bound: the budget-th best of the known nodes, the chain's siblings: at every depth d the
    # ranks 0 .. k-1 below the chain's node of depth d - 1 (rank 0 at every depth above; depth 1:
    # the root's children), D * k nodes whose keys are the chain's prefix sums plus one log-prob
    known = []
    c = 0.0
    for d in range(D):
        for r in range(k):
            s, ok = exact_sum(c, lpd[d, r])
            if not ok:
                return None, "inexact"
            known.append(s)
        c, _ = exact_sum(c, lpd[d, 0])
    if len(known) < budget:
        return None, "few-known"
    T = np.sort(np.array(known))[::-1][budget - 1]
    # depth by depth: the children of each candidate parent with key >= T (a prefix of its row)
    cand = []  # (key, depth, parent index in cand or -1, rank)
    frontier = [(-1, 0.0)]  # (candidate index, key) of the previous depth's candidates, the root first
    depths_walked = 0
    for d in range(D):
        nxt = []
        for pi, pkey in frontier:
            for r in range(k):
                s, ok = exact_sum(pkey, lpd[d, r])
                if not ok:
                    return None, "inexact"
                if s < T:
                    break  # the first excluded sibling's sum is exact too: the reference's chain agrees
                cand.append((s, d + 1, pi, r))
                nxt.append((len(cand) - 1, s))
                if len(cand) > CAP:
                    return None, "cap"
        depths_walked += 1
        if not nxt:
            break
        frontier = nxt

    def ranks(i):
        out = []
        while i >= 0:
            out.append(cand[i][3])
            i = cand[i][2]
        return tuple(reversed(out))

    order = sorted(range(len(cand)), key=lambda i: (-cand[i][0], ranks(i)))[:budget]
    node = {i: n + 1 for n, i in enumerate(order)}
    depths = [0] + [cand[i][1] for i in order]
    parents = [-1] + [node[cand[i][2]] if cand[i][2] >= 0 else 0 for i in order]
    rk = [-1] + [cand[i][3] for i in order]
    return (depths, parents, rk, {"cand": len(cand), "depths": depths_walked, "T": T}), None


def check(lp: np.ndarray, budget: int) -> tuple[dict | None, str | None]:
    res, why = warp_enum(lp, budget)
    if res is None:
        return None, why
    depths, parents, rk, st = res
    ids = np.tile(np.arange(lp.shape[1], dtype=np.int32), (lp.shape[0], 1))
    t = ref.build_tree_from_topk(0, ids, lp, budget)
    assert list(t.depths) == depths, (list(t.depths), depths)
    assert list(t.parents) == parents, (list(t.parents), parents)
    assert list(t.ranks) == rk
    return st, None


def main() -> int:
    import bench_ddtree as bd

    rng = np.random.default_rng(0)
    for drafter in ("random", "peaked", "jittered"):
        for budget in (16, 32, 64):
            stats, whys = [], {}
            x, _ = bd.drafter_logits(rng, 4, drafter, vocab=32768)
            for b in range(x.shape[0]):
                ids, lp, _ = ref.topk_logprobs(x[b], budget)
                st, why = check(lp, budget)
                if st is None:
                    whys[why] = whys.get(why, 0) + 1
                else:
                    stats.append(st)
            if stats:
                c = [s["cand"] for s in stats]
                d = [s["depths"] for s in stats]
                print(f"{drafter:<9} budget {budget:>3}: {len(stats)} trees equal to the heap's; candidates "
                      f"{min(c)}-{max(c)}, depths walked {min(d)}-{max(d)}; fallbacks {whys or 'none'}")
            else:
                print(f"{drafter:<9} budget {budget:>3}: all fell back: {whys}")
    # ties and random small rows (exact dyadic log-probs: many equal keys)
    n_eq = n_fb = 0
    for seed in range(400):
        r = np.random.default_rng(seed)
        D, K, budget = int(r.integers(1, 8)), int(r.integers(1, 6)), int(r.integers(1, 20))
        lp = -np.sort(r.integers(0, 6, (D, K)), axis=1).astype(np.float32) / 4
        st, why = check(lp, budget)
        n_eq += st is not None
        n_fb += st is None
    print(f"dyadic rows with ties: {n_eq} trees equal to the heap's, {n_fb} fell back")
    return 0


if __name__ == "__main__":
    sys.exit(main())
