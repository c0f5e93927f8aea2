"""A numpy twin of the budget <= 16 deviation search (cu/ddtree/search.cuh, dev_search; built in
the fortieth session, landed in the forty-first), step for step, checked against the reference heap
(build_tree_from_topk).

The kernel's steps (n = budget = kb <= 16; lp [D][kb] float32 rows sorted descending):
  0. Exactness: every key and every quantity below is a signed sum of at most D + 4 log-probs of
     the rows; all are multiples of 2^e_min (the lowest set bit of any of them), so when
     (D + 4) * max|lp| < 2^(53 + e_min) each is exact in float64 -- the reference's float64 keys
     are then the exact sums, whatever their order of addition. Else: the heap.
  1. The chain's prefixes P_L (L = 0..D) and the candidates of at most one deviation: the chain
     nodes c_L (key P_L) and (j, r, L), rank r >= 1 at depth j < L, rank 0 elsewhere up to depth
     L (key P_L - (lp[j][0] - lp[j][r])). Those with keys >= T0 are gathered (more than
     CAP_DIRECT: the heap); T0 is the n-th best key of the chain's first m nodes and the depth-1
     nodes of ranks 1 .. n - m, for the best m (n nodes: the tree's n-th key is >= T0).
     (``direct=False``: the removed `dev-search` variant, which histogrammed the keys over 512
     float32 bins of [-lp[0][0], -T0] first and gathered only the bins up to b*, the first bin
     where the count reaches n, at most CAP of them; its patch is in the history at 91f4343.)
  2. They are ranked exactly by (key desc, ranks tuple asc), the tuples compared by the kernel's
     u64 dev_tb (checked here against an event-wise comparison of the tuples, dev_less); T1 = the
     key of rank n - 1.
  3. The nodes of two deviations with keys >= T1, from the gathered nodes of one deviation with
     keys >= T1 (a second deviation at j2 in (j1, L), r2 = 1, 2, .. while >= T1). None: the tree
     is the n best gathered. Else all are ranked again, T2 = the n-th key, and if a node of two
     deviations with a key >= T2 extends by a third (j3 in (j2, L), rank 1) to a key >= T2: the
     heap.

    python research/probes/dev_search_twin.py
"""
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from dev_enum_model import reference_tuples  # noqa: E402  (the reference tree as ranks tuples)
from driverlevel.reference import ddtree as ref  # noqa: E402
from test_ddtree_gpu import peaked_rows  # noqa: E402  (the GPU tests' confident rows)

BINS = 512
CAP = 128
CAP_DIRECT = 256


def lowest_bit_exp(v: np.ndarray) -> int:
    """The smallest exponent e with every nonzero float32 of v a multiple of 2^e."""
    b = v.astype(np.float32).view(np.uint32)
    e = (b >> 23) & 0xFF
    m = b & 0x7FFFFF
    m = np.where(e > 0, m | 0x800000, m).astype(np.int64)
    nz = m != 0
    if not nz.any():
        return 0
    ctz = np.array([(int(x) & -int(x)).bit_length() - 1 for x in m[nz]])
    ex = np.where(e[nz] > 0, e[nz].astype(np.int64) - 150, -149)
    return int((ex + ctz).min())


def exact_rows(x: np.ndarray):
    """Step 0 of both deviation searches (dev_search, dev_rounds): ``(X, P, None)`` -- the float32
    rows ``x`` [D, kb] as float64 and the chain's prefixes P_0 .. P_D -- when every log-prob is
    <= 0 and (D + 4) max|lp| < 2^(53 + e_min); else ``(None, None, reason)`` ("positive",
    "inexact"), where the kernels hand the request on."""
    x = x.astype(np.float32)
    if np.any(x[:, 0] > 0):
        return None, None, "positive"
    M = float(np.abs(x).max())
    if M > 0 and (x.shape[0] + 4) * M >= 2.0 ** (53 + lowest_bit_exp(x)):
        return None, None, "inexact"
    X = x.astype(np.float64)
    return X, np.concatenate([[0.0], np.cumsum(X[:, 0])]), None


def bins_of(lo: float, hi: float):
    lof, hif = np.float32(lo), np.float32(hi)
    inv = np.float32(BINS / (hi - lo)) if hi > lo else np.float32(0.0)

    def b(x: float) -> int:
        xf = np.float32(x)
        if xf > hif:
            return BINS
        with np.errstate(over="ignore", invalid="ignore"):
            t = np.float32(np.float32(xf - lof) * inv)
        t = np.float32(min(max(t, np.float32(0.0)), np.float32(BINS - 1))) if not np.isnan(t) else np.float32(0.0)
        return int(t)
    return b


def dev_at(t, p):
    """rank + 1 of node t = (nd, L, j1, r1, j2, r2) at depth p, 0 past its length (dev_at)."""
    nd, L, j1, r1, j2, r2 = t
    if p >= L:
        return 0
    if nd >= 1 and p == j1:
        return r1 + 1
    if nd >= 2 and p == j2:
        return r2 + 1
    return 1


def dev_less(a, b):
    """The kernel's dev_less: the first depth where the tuples differ is an event of a or b."""
    ev = [a[1], b[1], a[2] if a[0] >= 1 else 63, a[4] if a[0] >= 2 else 63,
          b[2] if b[0] >= 1 else 63, b[4] if b[0] >= 2 else 63]
    p = 64
    for e in ev:
        if e < p and dev_at(a, e) != dev_at(b, e):
            p = e
    return p < 64 and dev_at(a, p) < dev_at(b, p)


def dev_tb(t):
    """The kernel's tie-break key (u64, smaller first): a tuple of at most two deviations compares
    as its events in depth order -- each deviation a digit 1024 + (31 - depth) * 32 + (rank + 1),
    then its length L -- 11 bits each, padded with 0 (a deviation sorts after a length: at the first
    event of either tuple, the deviating one has rank >= 1 where the other has 0 or ended)."""
    nd, L, j1, r1, j2, r2 = t
    dig = [1024 + (31 - j1) * 32 + r1 + 1] if nd >= 1 else []
    if nd >= 2:
        dig.append(1024 + (31 - j2) * 32 + r2 + 1)
    dig.append(L)
    dig += [0] * (3 - len(dig))
    return (dig[0] << 22) | (dig[1] << 11) | dig[2]


def ranked(cand):
    """cand: [(key, node)] -> the same, in the heap's order (the kernel's rank: count of better)."""
    out = [None] * len(cand)
    for i, (kx, tx) in enumerate(cand):
        rank = sum(1 for q, (ky, ty) in enumerate(cand) if ky > kx or (ky == kx and dev_tb(ty) < dev_tb(tx)))
        assert rank == sum(1 for q, (ky, ty) in enumerate(cand) if ky > kx or (ky == kx and q != i and dev_less(ty, tx)))
        assert out[rank] is None
        out[rank] = (kx, tx)
    return out


def as_tuple(t):
    nd, L, j1, r1, j2, r2 = t
    v = [0] * L
    if nd >= 1:
        v[j1] = r1
    if nd >= 2:
        v[j2] = r2
    return tuple(v)


def dev_search(lp: np.ndarray, n: int, direct: bool = False):
    """``(tuples, reason)``: the tree's nodes as ranks tuples in pop order, or None and why the
    kernel hands the request to the heap. ``direct``: the kernel's way (landed as dev-direct),
    which gathers the nodes with keys >= T0 straight away (up to CAP_DIRECT of them); False: the
    removed dev-search variant, with its histogram first."""
    D = lp.shape[0]
    kb = n
    X, P, why = exact_rows(lp[:, :kb])
    if X is None:
        return None, why
    pen = X[:, :1] - X
    # the bins' upper end: -T0, T0 the n-th best key of the chain's first m nodes and the depth-1
    # nodes of ranks 1 .. n - m (the n-th best of those two sorted lists: the best split m)
    t0 = max(P[m] if m == n else min(P[m], X[0, n - m]) for m in range(1, min(D, n) + 1))
    bins = bins_of(-float(X[0, 0]), -float(t0))
    nodes = [(P[L], (0, L, 0, 0, 0, 0)) for L in range(1, D + 1)]
    for j in range(D):
        for r in range(1, kb):
            for L in range(j + 1, D + 1):
                nodes.append((P[L] - pen[j, r], (1, L, j, r, 0, 0)))
    if direct:
        cand = [c for c in nodes if c[0] >= t0]
    else:
        hist = np.zeros(BINS + 1, np.int64)
        for k, _ in nodes:
            hist[bins(-k)] += 1
        cum = np.cumsum(hist[:BINS])
        bstar = int(np.argmax(cum >= n)) if cum[-1] >= n else BINS - 1
        cand = [c for c in nodes if bins(-c[0]) <= bstar]
    cap = CAP_DIRECT if direct else CAP
    if len(cand) > cap:
        return None, f"cap {len(cand)}"
    t1 = ranked(cand)[n - 1][0]
    c1 = len(cand)
    for k0, t in list(cand):  # round 2: nodes of two deviations with keys >= T1
        if t[0] != 1 or k0 < t1:
            continue
        _, L, j1, r1, _, _ = t
        for j2 in range(j1 + 1, L):
            for r2 in range(1, n):
                k = k0 - pen[j2, r2]
                if k < t1:
                    break
                cand.append((k, (2, L, j1, r1, j2, r2)))
    if len(cand) > cap:
        return None, f"cap {len(cand)}"
    order = ranked(cand)
    if len(cand) > c1:
        t2 = order[n - 1][0]
        for k, t in cand:
            if t[0] == 2 and k >= t2 and any(k - pen[j3, 1] >= t2 for j3 in range(t[4] + 1, t[1])):
                return None, "three deviations"
    return [as_tuple(t) for _, t in order[:n]], (c1, len(cand))


def main() -> int:
    import bench_ddtree as bd

    rows = []
    for drafter in ("peaked", "jittered", "random"):
        x, _ = bd.drafter_logits(np.random.default_rng(7), 8, drafter, vocab=32768)
        rows += [(drafter, r) for r in x]
    for jit in (0.0, 0.7):
        x = peaked_rows(np.random.default_rng(11), 8, 15, 32768, jit)
        rows += [(f"tests-{jit}", r) for r in x]
    x = np.random.default_rng(3).standard_normal((8, 15, 4096)).astype(np.float32) * 0.05
    rows += [("flat", r) for r in x]
    x = peaked_rows(np.random.default_rng(5), 8, 15, 4096, 0.3)
    top2 = np.argsort(-x, axis=2)[:, :, :2]
    np.put_along_axis(x, top2[:, :, 1:2], np.take_along_axis(x, top2[:, :, :1], axis=2) - 0.4, axis=2)
    rows += [("pairs", r) for r in x]  # (two near-equal tokens per depth: nodes of two deviations)
    stats = {}
    for name, row in rows:
        for bf16 in (False, True):
            r = row
            if bf16:
                r = (r.view(np.uint32) & 0xFFFF0000).view(np.float32)  # (truncated: ties, as bf16 has)
            for budget in (2, 4, 8, 16):
                _, lp, _ = ref.topk_logprobs(r, budget)
                got, why = dev_search(lp, budget)
                got_d, why_d = dev_search(lp, budget, direct=True)
                if got_d is not None:
                    assert got_d == reference_tuples(lp, budget), (name, bf16, budget, "direct")
                st = stats.setdefault((name, bf16, budget), {"equal": 0, "heap": {}, "cand": []})
                st.setdefault("direct", []).append(why_d[1] if got_d is not None else why_d)
                if got is None:
                    st["heap"][why.split()[0]] = st["heap"].get(why.split()[0], 0) + 1
                    continue
                want = reference_tuples(lp, budget)
                assert got == want, (name, bf16, budget, got, want)
                st["equal"] += 1
                st["cand"].append(why[1])
    # ties everywhere: rows on a grid of 0.25 (and depth limits 1..8)
    rng = np.random.default_rng(1)
    tied = {"equal": 0, "heap": 0}
    for _ in range(3000):
        D = int(rng.integers(1, 9))
        n = int(rng.choice([2, 3, 4, 8, 16]))
        lp = -np.sort(rng.integers(0, 12, (D, n)), axis=1).astype(np.float32) * np.float32(0.25)
        lp[:, 0] = np.minimum(lp[:, 0], 0)
        got_d, _ = dev_search(lp, n, direct=True)
        if got_d is not None:
            assert got_d == reference_tuples(lp, n), (lp, n, got_d, "direct")
            tied["direct equal"] = tied.get("direct equal", 0) + 1
        got, why = dev_search(lp, n)
        if got is None:
            tied["heap"] += 1
            continue
        assert got == reference_tuples(lp, n), (lp, n, got)
        tied["equal"] += 1
    print(f"grid rows with ties: {tied}")
    print(f"{'rows':<10} {'bf16':>5} {'budget':>6} | equal  to the heap        candidates (max) | direct: candidates or why")
    for (name, bf16, budget), st in stats.items():
        print(f"{name:<10} {bf16!s:>5} {budget:>6} | {st['equal']:>5}  {str(st['heap']):<20} {max(st['cand'], default=0):>16} | "
              f"{st['direct']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
