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
    # the kernel's own steps (warp-enum.patch), emulated lane by lane, on the same kinds of rows
    n_eq = n_fb = 0
    for drafter in ("random", "peaked", "jittered"):
        x, _ = bd.drafter_logits(rng, 3, drafter, vocab=32768)
        for b in range(3):
            for budget in (3, 8, 16):
                _, lp, _ = ref.topk_logprobs(x[b], budget)
                for cap in (CAP, 16):
                    ok = check_emulated(lp, budget, cap)
                    n_eq += ok is True
                    n_fb += ok is None
    for seed in range(300):
        r = np.random.default_rng(seed)
        D, K, budget = int(r.integers(1, 10)), int(r.integers(1, 6)), int(r.integers(1, 17))
        ok = check_emulated(-np.sort(r.integers(0, 6, (D, K)), axis=1).astype(np.float32) / 4, budget)
        n_eq += ok is True
        n_fb += ok is None
    print(f"the kernel's steps emulated: {n_eq} trees equal to the heap's, {n_fb} handed back")
    return 0



def warp_enum_emulated(lp: np.ndarray, budget: int, cap: int = CAP):
    """The kernel's ``warp_enum`` (research/patches/warp-enum.patch) step by step for a warp of 32
    lanes: the merge (one lane per row, the maximum by its encoded key, the lowest such lane
    advancing), the pair-parallel depth passes with their carry, the ranks. Returns
    ``(depths, parents, ranks)`` or None (the heap)."""
    D, ks = lp.shape
    kb = min(budget, ks)
    if budget <= 0 or kb <= 0 or D <= 0 or D > 32:
        return None
    f = lambda i, r: float(lp[i, r])  # noqa: E731
    bad = any(f(d, 0) > 0 for d in range(D))
    pd = []
    for lane in range(32):
        c = 0.0
        for i in range(min(lane, D)):
            t, ok = exact_sum(c, f(i, 0))
            bad |= not ok
            c = t
        pd.append(c)
    r = [0] * 32
    v = [None] * 32
    for lane in range(D):
        v[lane], ok = exact_sum(pd[lane], f(lane, 0))
        bad |= not ok
    T = None
    for _ in range(budget):
        live = [(v[lane], lane) for lane in range(32) if v[lane] is not None]
        if not live:
            return None
        T = max(x for x, _ in live)
        w = min(lane for x, lane in live if x == T)
        r[w] += 1
        if r[w] < kb:
            v[w], ok = exact_sum(pd[w], f(w, r[w]))
            bad |= not ok
        else:
            v[w] = None
    if bad:
        return None
    key, par, rd = [], [], []
    cnt = fb = fe = 0
    for d in range(D):
        np_ = 1 if d == 0 else fe - fb
        if np_ == 0:
            break
        start, pairs, carry = cnt, np_ * kb, False
        for base in range(0, pairs, 32):
            inc, ks_, info = [], [], []
            for lane in range(32):
                q = base + lane
                has = q < pairs
                j, rr = (q // kb, q % kb) if has else (0, 0)
                pk = 0.0 if (d == 0 or not has) else key[fb + j]
                x = f(d, rr) if has else 0.0
                k, ok = exact_sum(pk, x)
                inc.append(has and k >= T)
                info.append((has, j, rr, k, ok))
            total = sum(inc)
            if cnt + total > cap:
                return None
            for lane in range(32):
                has, j, rr, k, ok = info[lane]
                prev = rr > 0 and (inc[lane - 1] if lane > 0 else carry)
                if inc[lane] or (has and (rr == 0 or prev)):
                    bad |= not ok
                if inc[lane]:
                    at = cnt + sum(inc[:lane])
                    assert at == len(key)
                    key.append(k)
                    par.append(-1 if d == 0 else fb + j)
                    rd.append((rr, d + 1))
            cnt += total
            carry = inc[31]
        fb, fe = start, cnt
    if bad:
        return None

    def tup(i):
        out = []
        while i >= 0:
            out.append(rd[i][0])
            i = par[i]
        return tuple(reversed(out))

    rank = [sum(1 for j in range(cnt) if key[j] > key[i] or (key[j] == key[i] and j != i and tup(j) < tup(i)))
            for i in range(cnt)]
    count = min(budget, cnt)
    nodes = sorted((rank[i], i) for i in range(cnt) if rank[i] < count)
    depths = [0] + [rd[i][1] for _, i in nodes]
    parents = [-1] + [0 if par[i] < 0 else rank[par[i]] + 1 for _, i in nodes]
    ranks = [-1] + [rd[i][0] for _, i in nodes]
    return depths, parents, ranks


def check_emulated(lp: np.ndarray, budget: int, cap: int = CAP) -> bool | None:
    """True: the emulated kernel's tree equals the reference heap's; None: it handed the row back."""
    res = warp_enum_emulated(lp, budget, cap)
    if res is None:
        return None
    ids = np.tile(np.arange(lp.shape[1], dtype=np.int32), (lp.shape[0], 1))
    t = ref.build_tree_from_topk(0, ids, lp, budget)
    assert (list(t.depths), list(t.parents), list(t.ranks)) == res, (list(t.depths), res)
    return True


if __name__ == "__main__":
    sys.exit(main())
