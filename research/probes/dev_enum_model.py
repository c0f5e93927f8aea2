"""A numpy model of a tree search by deviation rounds (a design, thirty-ninth session; not built).

DDTree's drafter rows are per depth, not per path: a node is a ranks tuple (r_1 .. r_L), one rank
per depth, and its key is the sum of lp[d][r_d] along it. With every log-prob <= 0, write the key as
the chain's prefix P_L (all ranks 0) minus the node's penalties delta[d][r] = lp[d][0] - lp[d][r]
(>= 0, non-decreasing in r) at its *deviations* (the depths where r_d > 0). The budget-16 trees of
bench_ddtree's peaked and jittered rows hold nodes of at most 1-2 deviations over 7-15 depths, so a
search that walks deviation counts (a few rounds) instead of depths (up to 15 dependent passes,
the parallel search's ~2.3 µs each on deep trees, or 16 heap pops of ~0.85 µs) needs fewer
dependent steps:

  1. T_lb = the budget-th best key among the nodes of at most one deviation (a lower bound of the
     tree's budget-th key: they are a subset of all nodes); these keys are P_L - delta[j][r] for
     j < L, a structured set a CTA can select from in parallel.
  2. round k = 1, 2, ...: extend each base of k - 1 deviations (last deviation at depth j0, penalty
     sum S) by one deviation (j > j0, r >= 1) while P_{j+1} - S - delta[j][r] >= T_lb (a prefix of
     r: delta grows with r); each new base adds the nodes of lengths j + 1 .. L_max, the lengths
     where P_L - S' >= T_lb (a prefix too: P_L falls with L). Rounds end when no base extends.
  3. the tree = the budget best candidates by (key desc, ranks tuple asc), the reference heap's order.

Exactness (as the parallel search's): the keys are the reference's float64 sums when every
candidate's and every frontier node's key is exact in float64 (TwoSum on parent + lp); the model
computes keys in the reference's order and asserts the tree equals build_tree_from_topk's.

    python research/probes/dev_enum_model.py

Prints, per kind of row and budget: the rounds, the (base, depth) tasks of each round (what a CTA
would spread over its threads), the candidates against the budget, and whether the tree equals the
reference's.
"""
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from driverlevel.reference import ddtree as ref  # noqa: E402


def dev_enum(lp: np.ndarray, budget: int):
    """``(tuples, stats)``: the tree's nodes as ranks tuples in pop order (root excluded) and the
    work counts, or ``(None, reason)``. ``lp``: float32 ``[D, K']`` rows sorted descending."""
    D, kp = lp.shape
    kb = min(budget, kp)
    if budget <= 0 or kb <= 0 or D <= 0:
        return None, "empty"
    x = lp[:, :kb].astype(np.float64)
    if np.any(x[:, 0] > 0):
        return None, "positive"
    P = np.concatenate([[0.0], np.cumsum(x[:, 0])])  # (the reference's order: exact for these rows)
    delta = x[:, :1] - x  # [D, kb], delta[d][0] = 0
    # 1. T_lb: the budget-th best key of the nodes with at most one deviation
    k01 = [P[1:]]
    for j in range(D):
        if kb > 1:
            k01.append((P[None, j + 1:] - delta[j, 1:, None]).ravel())
    k01 = np.concatenate(k01)
    if k01.size < budget:
        return None, "few"
    t_lb = np.partition(k01, k01.size - budget)[k01.size - budget]
    # 2. rounds
    cands = [(tuple([0] * L), P[L]) for L in range(1, D + 1) if P[L] >= t_lb]
    bases = [((), -1, 0.0)]  # (deviations ((depth, rank), ...), last depth, penalty sum)
    tasks, rounds = [], 0
    while bases:
        new, n_tasks = [], 0
        for devs, j0, s in bases:
            for j in range(j0 + 1, D):
                n_tasks += 1  # a (base, depth) task: scan r = 1.. while the shortest node passes
                for r in range(1, kb):
                    s2 = s + delta[j, r]
                    if P[j + 1] - s2 < t_lb:
                        break
                    d2 = devs + ((j, r),)
                    new.append((d2, j, s2))
                    for L in range(j + 1, D + 1):
                        if P[L] - s2 < t_lb:
                            break
                        t = [0] * L
                        for dj, dr in d2:
                            t[dj] = dr
                        cands.append((tuple(t), None))
        if new:
            rounds += 1
            tasks.append(n_tasks)
        bases = new
    # keys in the reference's order (parent + lp along the path), then the heap's order
    keyed = []
    for t, _ in cands:
        k = 0.0
        for d, r in enumerate(t):
            k = k + float(x[d, r])
        keyed.append((-k, t))
    keyed.sort()
    out = [t for _, t in keyed[:budget]]
    return out, {"rounds": rounds, "tasks": tasks, "cand": len(cands), "t_lb": float(t_lb)}


def reference_tuples(lp: np.ndarray, budget: int) -> list:
    ids = np.tile(np.arange(lp.shape[1], dtype=np.int32), (lp.shape[0], 1))
    t = ref.build_tree_from_topk(0, ids, lp, budget)
    tup = [()]
    for i in range(1, t.num_nodes):
        tup.append(tup[int(t.parents[i])] + (int(t.ranks[i]),))
    return tup[1:]


def main() -> int:
    import bench_ddtree as bd

    print(f"{'rows':<9} {'vocab':>7} {'budget':>6} | {'equal':>5} {'rounds':>6} {'tasks per round':<22} "
          f"{'candidates':>10} (min/median/max over the rows)")
    for drafter in ("peaked", "jittered", "random"):
        for vocab in (32768, 163840):
            x, _ = bd.drafter_logits(np.random.default_rng(7), 6, drafter, vocab=vocab)
            for budget in (16, 64, 256):
                eq, rounds, tasks, cand = 0, [], [], []
                for b in range(x.shape[0]):
                    _, lp, _ = ref.topk_logprobs(x[b], budget)
                    got, st = dev_enum(lp, budget)
                    if got is None:
                        continue
                    eq += got == reference_tuples(lp, budget)
                    rounds.append(st["rounds"])
                    tasks.append(st["tasks"])
                    cand.append(st["cand"])
                worst = max(tasks, key=sum) if tasks else []
                print(f"{drafter:<9} {vocab:>7} {budget:>6} | {eq:>2}/{x.shape[0]:<2} {max(rounds):>6} "
                      f"{str(worst):<22} {min(cand):>4} {int(np.median(cand)):>5} {max(cand):>5}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
