"""Numpy twin of the threshold top-K kernels (``DDTreePlan(topk="threshold")``).

Models, value for value, what ``cu/ddtree/topk_threshold.cuh`` decides for one logits row:
the stratified sample (:func:`driverlevel._topk_threshold.sample_groups`), the threshold
``T`` (the exact ``m``-th largest sampled value by order key, NaN counting as -inf), the
early fallback when ``T`` is not finite, the candidate count of the stream pass
(``x >= T`` as a float compare, so NaN is never a candidate) and the fallback decision
(``count < K`` or ``count > capacity``); then the exact top-K of the candidates by
(logit descending, lower id first) and the log-sum-exp from the stream kernel's per-segment
sums below ``T`` and the candidates' sum above it. The CPU tests check it against :func:`driverlevel.reference.ddtree.topk_logprobs`
on adversarial rows, and count how often the fallback triggers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._topk_threshold import (SAMPLE_VALUES, candidate_capacity, group_tokens, sample_groups, sample_rank,
                               stream_segments)
from .ddtree import LP_FLOOR, topk_logprobs

__all__ = ["ThresholdResult", "order_keys", "sample_values", "sample_threshold", "threshold_topk"]


def order_keys(x) -> np.ndarray:
    """The kernels' order-preserving uint32 key of float32 values, NaN as -inf (``logit_key``)."""
    x = np.asarray(x, np.float32)
    x = np.where(np.isnan(x), np.float32(-np.inf), x) + np.float32(0.0)  # -0 -> +0
    b = x.view(np.uint32)
    return np.where(b & 0x80000000, ~b, b | 0x80000000).astype(np.uint32)


def key_to_f32(k) -> np.ndarray:
    k = np.asarray(k, np.uint32)
    return np.where(k & 0x80000000, k & 0x7FFFFFFF, ~k).astype(np.uint32).view(np.float32)


def sample_values(row: np.ndarray, bf16: bool) -> np.ndarray:
    """The logits the sample kernel reads (float32 values of the row)."""
    starts = sample_groups(row.shape[0], bf16)
    if starts is None:
        return row
    g = group_tokens(bf16)
    return row[(starts[:, None] + np.arange(g)[None, :]).reshape(-1)]


def sample_threshold(row: np.ndarray, k: int, bf16: bool) -> tuple[np.float32, bool]:
    """``(T, early_fallback)``: the ``m``-th largest sampled value, and whether ``T`` is not
    finite (then the stream pass skips the row and the exact fallback takes it)."""
    s = order_keys(sample_values(row, bf16))
    m = min(sample_rank(k, row.shape[0]), s.shape[0])
    tk = np.partition(s, s.shape[0] - m)[s.shape[0] - m]
    t = key_to_f32(tk)
    return np.float32(t), not np.isfinite(t)


@dataclass
class ThresholdResult:
    threshold: np.float32
    count: int            # values >= T in the row (what the stream kernel's counter reaches)
    capacity: int
    fallback: bool        # the exact chunk top-K takes the row
    ids: np.ndarray       # int32 [k]
    lp: np.ndarray        # float32 [k]
    lse: np.float32


def threshold_topk(row, k: int, bf16: bool = False, merge_capacity: int = 12288, sm_count: int = 132,
                   rows: int = 1) -> ThresholdResult:
    """The threshold top-K of one row as the kernels compute it (the fallback is the
    reference's exact top-K, which the chunk kernel reproduces)."""
    x = np.asarray(row, np.float32)
    v = x.shape[0]
    cap = candidate_capacity(k, v, merge_capacity)
    t, early = sample_threshold(x, k, bf16)
    if early:
        ids, lp, lse = topk_logprobs(x[None], k)
        return ThresholdResult(t, 0, cap, True, ids[0], lp[0], lse[0])
    with np.errstate(invalid="ignore"):
        cand = x >= t  # NaN: False
    count = int(cand.sum())
    if count < k or count > cap:
        ids, lp, lse = topk_logprobs(x[None], k)
        return ThresholdResult(t, count, cap, True, ids[0], lp[0], lse[0])
    cid = np.flatnonzero(cand)
    cx = x[cid] + np.float32(0.0)
    order = np.lexsort((cid, -cx))[:k]  # logit descending, then lower id
    ids = cid[order].astype(np.int32)
    # log-sum-exp in float64 here, from the same parts as the kernels: the stream kernel's
    # per-segment sums of exp(x - T) over the logits below T, and the candidates' sum (the
    # stream's per-segment sums above T, or ddtree_build's own sum relative to the row maximum m
    # when a logit is 80 or more above T), written here relative to m
    nseg, seg = stream_segments(rows, v, bf16, sm_count)
    xs = np.where(np.isnan(x), -np.inf, x).astype(np.float64)
    below = []
    for s in range(nseg):
        a = xs[s * seg:(s + 1) * seg]
        below.append(float(np.exp(a[a < float(t)] - float(t)).sum()))
    m = float(xs[cid].max())
    if not np.isfinite(m):
        lse = np.float32(np.nan)
        lp = np.full(k, LP_FLOOR, np.float32)
    else:
        tot = float(np.exp(xs[cid] - m).sum()) + sum(below) * np.exp(float(t) - m)
        lse = np.float32(m + np.log(tot))
        with np.errstate(over="ignore", invalid="ignore"):
            lp = np.maximum(x[ids] - lse, LP_FLOOR).astype(np.float32)
    return ThresholdResult(t, count, cap, False, ids, lp, lse)


__all__ += ["key_to_f32", "SAMPLE_VALUES"]
