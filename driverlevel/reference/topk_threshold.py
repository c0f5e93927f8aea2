"""Numpy twin of the threshold top-K kernels (``DDTreePlan(topk="threshold")``).

Models, value for value, what ``cu/ddtree/topk_threshold.cuh`` decides for one logits row:
the stratified sample (:func:`driverlevel._topk_threshold.sample_groups`), the threshold
``T`` (``kth_largest_bound`` of ``cu/ddtree/keys.cuh`` over the sampled order keys, NaN
counting as -inf: :func:`kth_largest_bound`, a lower bound of the ``m``-th largest sampled
value that admits at most ``sample_slack`` more), the early fallback when ``T`` is not
finite, the candidate count of the stream pass (``x >= T`` as a float compare, so NaN is never a candidate) and the fallback decision
(``count < K`` or ``count > capacity``); then the exact top-K of the candidates by
(logit descending, lower id first) and the log-sum-exp from the stream kernel's per-segment
sums below ``T`` and the candidates' sum above it. The CPU tests check it against :func:`driverlevel.reference.ddtree.topk_logprobs`
on adversarial rows, and count how often the fallback triggers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._checks import bool_arg, int_in_range, positive_int
from .._dtypes import bf16_bits_to_f32, f32_to_bf16_bits
from .._topk_threshold import (SAMPLE_VALUES, candidate_capacity, sample_rank, sample_slack, sample_tokens,
                               stream_segments)
from .attention import _float_input
from .ddtree import LP_FLOOR, _logits_input, _topk_k, topk_logprobs
from .trees import _exact_ints, _int_array

__all__ = ["ThresholdResult", "order_keys", "sample_values", "sample_threshold", "threshold_topk", "log_bin",
           "log_bin_lo", "log_bin_hi", "kth_largest_bound", "KEY_NEG_INF"]

#: The order key of -inf (and of NaN): the smallest key a logit has (``logit_keys.cuh``).
KEY_NEG_INF = 0x007FFFFF


def order_keys(x) -> np.ndarray:
    """The kernels' order-preserving uint32 key of float32 values, NaN as -inf (``logit_key``)."""
    x = np.asarray(x, np.float32)
    x = np.where(np.isnan(x), np.float32(-np.inf), x) + np.float32(0.0)  # -0 -> +0
    b = x.view(np.uint32)
    return np.where(b & 0x80000000, ~b, b | 0x80000000).astype(np.uint32)


def _uint32_keys(k) -> np.ndarray:
    """``k`` as an integer array of uint32 values: TypeError for another dtype (floats are not
    truncated, bools are no keys), ValueError for a value outside ``[0, 2**32 - 1]``."""
    a = _exact_ints(k, 0, 0xFFFFFFFF, "keys must be uint32 values in [0, 2**32 - 1]")
    if a.dtype.kind not in "iu":
        raise TypeError(f"keys must be integers (uint32 values), got dtype {a.dtype}")
    bad = (a < 0) | (a > 0xFFFFFFFF)
    if np.any(bad):
        raise ValueError(f"keys must be uint32 values in [0, 2**32 - 1], got {int(a[bad].flat[0])}")
    return a


def key_to_f32(k) -> np.ndarray:
    """The float32 values of uint32 keys, the inverse of :func:`order_keys` (``key_f32`` in the kernels):
    a NaN's key (that of -inf) comes back as -inf and -0 as +0.

    ``k``: integers in ``[0, 2**32 - 1]``, any shape (the result has it). TypeError for another dtype
    (floats are not truncated, bools are no keys), ValueError for a value outside that range."""
    k = _uint32_keys(k).astype(np.uint32)
    return np.where(k & 0x80000000, k & 0x7FFFFFFF, ~k).astype(np.uint32).view(np.float32)


def sample_values(row: np.ndarray, bf16: bool) -> np.ndarray:
    """The logits the sample kernel reads (float32 values of the row).

    ``row``: a 1-D numpy array (TypeError otherwise, ValueError for another rank); ``bf16``: a bool
    (TypeError for anything else: a string "no" is not False)."""
    bf16 = bool_arg("bf16", bf16)
    if not isinstance(row, np.ndarray):
        raise TypeError(f"row must be a 1-D numpy array, got {type(row).__name__}")
    if row.ndim != 1:
        raise ValueError(f"row must be 1-D, got shape {row.shape}")
    tokens = sample_tokens(row.shape[0], bf16)
    return row if tokens is None else row[tokens]


def log_bin(d) -> np.ndarray:
    """``log_bin`` of ``cu/ddtree/keys.cuh`` (int64, d < 2**53): d itself below 16, else 8 bins
    per octave (the octave's exponent and the three bits below its leading one).

    ``d``: integers (any shape) in ``[0, 2**53)``, distances ``vmax - v`` (exact in the float64 this
    takes the exponent from). TypeError for another dtype (floats are not truncated), ValueError for a
    value outside that range (a negative ``d`` came back as its own bin)."""
    d = _int_array("d", d, "integers")
    bad = (d < 0) | (d >= 1 << 53)
    if np.any(bad):
        raise ValueError(f"d must be in [0, 2**53), got {int(d[bad].flat[0])}")
    e = np.frexp(np.maximum(d, 1).astype(np.float64))[1].astype(np.int64) - 1  # floor(log2 d), exact
    sh = np.maximum(e - 3, 0)
    return np.where(d < 16, d, 16 + (e - 4) * 8 + ((d >> sh) & 7))


def log_bin_lo(b: int) -> int:
    """The smallest d of log bin ``b``: an int in ``[0, 495]`` (the bins of a u64 ``d``; ValueError
    outside, TypeError for a non-int: bool and floats refused)."""
    b = int_in_range("b", b, 0, 495)
    if b < 16:
        return b
    e = 4 + (b - 16) // 8
    return (8 + (b - 16) % 8) << (e - 3)


def log_bin_hi(b: int) -> int:
    """The largest d of log bin ``b`` (the last bins: all of u64): an int in ``[0, 511]``, the 512 bins
    of the levels' histogram (ValueError outside, TypeError for a non-int: bool and floats refused)."""
    b = int_in_range("b", b, 0, 511)
    return (1 << 64) - 1 if b >= 495 else log_bin_lo(b + 1) - 1


def kth_largest_bound(v, need: int, slack: int, cut: int = KEY_NEG_INF) -> int:
    """``kth_largest_bound`` of ``cu/ddtree/keys.cuh`` over the keys ``v`` (uint32): a key ``t``
    with ``need <= count(v >= t) <= max(need + slack, count(v >= the need-th largest))`` among
    the keys ``>= cut``. Its levels: a histogram of ``d = vmax - v`` over :func:`log_bin`, then
    256-bin linear refinements of the bin where the running count reaches ``need``, until that
    bin, taken whole, holds at most ``slack`` values past the need-th, or one ``d``; ``t`` is
    the bin's lowest key.

    Parameters
    ----------
    v : array_like of int
        Order keys (:func:`order_keys`), uint32 values, any shape (read flat).
    need : int
        ``1 <= need <=`` the keys ``>= cut``.
    slack : int
        ``>= 0``: the keys past the ``need``-th the bound may admit.
    cut : int
        A key in ``[0, 2**32 - 1]``; keys below it are not counted (default: -inf's, every key).

    Raises
    ------
    TypeError
        ``v`` not integers (floats are not truncated, bools are no keys); ``need``, ``slack`` or
        ``cut`` not an int (bool and floats refused).
    ValueError
        A key outside ``[0, 2**32 - 1]``; ``need`` < 1 or more than the keys ``>= cut`` (``"need
        must be an int in 1 .. 4, got 10"``); ``slack`` < 0; ``cut`` outside the key range; no key
        ``>= cut``.
    """
    v = _uint32_keys(v).astype(np.int64).ravel()
    cut = int_in_range("cut", cut, 0, 0xFFFFFFFF)
    slack = int_in_range("slack", slack, 0, 1 << 62)
    v = v[v >= cut]
    if v.size == 0:  # (the kernel never asks: its rows hold a finite maximum)
        raise ValueError(f"kth_largest_bound: no key >= cut {cut}")
    need = int_in_range("need", need, 1, int(v.size))
    vmax = int(v.max())
    d = vmax - v
    lo, hi, shift = 0, vmax - cut, -1
    while True:
        x = d[(d >= lo) & (d <= hi)]
        h = np.bincount(log_bin(x) if shift < 0 else (x - lo) >> shift, minlength=512)
        c = np.cumsum(h)
        b = int(np.argmax(c >= need))  # find_bin: the first bin where the running count reaches need
        before = int(c[b] - h[b])
        if shift < 0:
            nlo, nhi = log_bin_lo(b), log_bin_hi(b)
        else:
            nlo = lo + (b << shift)
            nhi = nlo + (1 << shift) - 1
        lo, hi, need = max(nlo, lo), min(nhi, hi), need - before
        if lo == hi or int(h[b]) - need <= slack:
            return vmax - hi
        shift = max((hi - lo).bit_length() - 8, 0)


def sample_threshold(row, k: int, bf16: bool | None = None) -> tuple[np.float32, bool]:
    """``(T, early_fallback)``: the sample's threshold (:func:`kth_largest_bound` of the
    sampled keys at ``m = sample_rank``, ``slack = sample_slack``: at least ``m`` and, ties
    with the ``m``-th aside, at most ``m + slack`` sampled values are ``>= T``), and whether
    ``T`` is not finite (then the stream pass skips the row and the exact fallback takes it).

    Parameters
    ----------
    row, k, bf16
        As :func:`threshold_topk` (the same input rules and errors).
    """
    x, bf16 = _threshold_row(row, bf16)
    v = x.shape[0]
    k = _topk_k(k, v)
    s = order_keys(sample_values(x, bf16))
    m = min(sample_rank(k, v), s.shape[0])
    tk = kth_largest_bound(s, m, sample_slack(k, v))
    t = key_to_f32(np.uint32(tk))
    return np.float32(t), not np.isfinite(t)


def _threshold_row(row, bf16) -> tuple[np.ndarray, bool]:
    """``(x, bf16)``: one row of logits as float32 ``[vocab]`` and whether the kernels read it as
    bf16 (``None``: the row's dtype says; a bool must agree with it). TypeError / ValueError as
    :func:`threshold_topk` documents."""
    arr = _float_input("row", row)  # TypeError for integers other than uint16 (bf16 bits), bool, ...
    is_bf16 = arr.dtype == np.uint16
    bf16 = is_bf16 if bf16 is None else bool_arg("bf16", bf16)
    x = _logits_input("row", arr)  # float32; bf16 widened exactly
    if x.ndim != 1 or x.shape[0] < 1:
        raise ValueError(f"row must be one row [vocab] with vocab >= 1, got shape {x.shape}")
    if is_bf16 and not bf16:
        raise ValueError("row holds bf16 logits (an ml_dtypes.bfloat16 array or uint16 bit patterns) but "
                         "bf16=False: the kernels read such a row as bf16 (pass bf16=True or leave it None)")
    if bf16 and not is_bf16:
        rounded = bf16_bits_to_f32(f32_to_bf16_bits(x))
        if np.array_equal(rounded, x, equal_nan=True):
            return x, bf16
        bad = int(np.flatnonzero((rounded != x) & ~np.isnan(x))[0])
        raise ValueError(f"bf16=True, but row[{bad}] = {float(x[bad])!r} is no bf16 value: a bf16 row's "
                         "float values must be exactly bf16 (widened), or pass the bf16 array itself")
    return x, bf16


@dataclass
class ThresholdResult:
    """What the threshold top-K computes for one row (:func:`threshold_topk`).

    Attributes
    ----------
    threshold : numpy.float32
        ``T``, the sample's threshold (not finite: the stream skipped the row).
    count : int
        The row's logits ``>= T`` (the stream kernel's counter; 0 when ``T`` is not finite).
    capacity : int
        The row's candidate capacity (>= ``k``).
    fallback : bool
        The threshold failed (``T`` not finite, ``count < k`` or ``count > capacity``): the build
        refines the row (:func:`refine_threshold`) or runs the chunk top-K; ``ids``, ``lp`` and
        ``lse`` are then the exact reference's.
    ids : numpy.ndarray
        int32 ``[k]``: the top-K token ids, logit descending, ties to the lower id.
    lp : numpy.ndarray
        float32 ``[k]``: their log-probabilities (``logit - lse``, floored at ``LP_FLOOR``).
    lse : numpy.float32
        The row's log-sum-exp, as :func:`~driverlevel.reference.ddtree.topk_logprobs` gives it.
    """

    threshold: np.float32
    count: int            # values >= T in the row (what the stream kernel's counter reaches)
    capacity: int
    fallback: bool        # the threshold failed: the build refines the row (or runs the chunk top-K)
    ids: np.ndarray       # int32 [k]
    lp: np.ndarray        # float32 [k]
    lse: np.float32


def threshold_topk(row, k: int, bf16: bool | None = None, merge_capacity: int = 12288, sm_count: int = 132,
                   rows: int = 1) -> ThresholdResult:
    """The threshold top-K of one row as the kernels compute it (the fallback is the
    reference's exact top-K, which the build's refined threshold or the chunk kernel reproduce).

    Parameters
    ----------
    row : array_like of float
        One row of logits, 1-D ``[vocab]`` with ``vocab >= 1``: floats (compared as float32), or
        bf16 as ``ml_dtypes.bfloat16`` or uint16 bit patterns (as a bf16
        :meth:`~driverlevel.DeviceArray.to_numpy` returns them), widened exactly -- the input rules
        of :func:`~driverlevel.reference.ddtree.topk_logprobs`.
    k : int
        ``1 <= k <= vocab``.
    bf16 : bool or None
        The kernels read the row as bf16 (their bf16 sampling and tiles). None (the default): the
        row's dtype says (bf16 for an ``ml_dtypes.bfloat16`` or uint16 row). True for a float row
        needs its values to be exactly bf16 (a widened bf16 row).
    merge_capacity, sm_count, rows : int
        The row merge's candidate capacity, the GPU's SM count and the rows of the launch
        (which set the stream kernel's segments): each >= 1. The row's candidate capacity
        (:func:`driverlevel._topk_threshold.candidate_capacity`, at most ``merge_capacity``) must
        hold ``k``: a plan's ``k`` is at most its budget (<= 512), its capacity 12,288.

    Raises
    ------
    TypeError
        ``k``, ``merge_capacity``, ``sm_count`` or ``rows`` not an int (bool and floats
        refused), ``bf16`` not a bool (``"bf16 must be a bool, got str 'no'"``), or ``row`` of
        another dtype (integers other than uint16, bool, strings: uint16 would be bf16 bits, so
        integers are never read as values).
    ValueError
        ``row`` not 1-D and non-empty (``"row must be one row [vocab] with vocab >= 1, got shape
        (2, 100)"``), ``k`` not in ``[1, len(row)]`` (as
        :func:`~driverlevel.reference.ddtree.topk_logprobs`), or ``merge_capacity``, ``sm_count``
        or ``rows`` < 1; ``bf16=False`` for a bf16 row, or ``bf16=True`` for a float row whose
        values are not all bf16 values; the row's candidate capacity below ``k`` (``"k = 300 needs
        a candidate capacity >= k; merge_capacity 256 gives 256"``).
    """
    x, bf16 = _threshold_row(row, bf16)  # float32; bf16 widened exactly; TypeError for integers
    merge_capacity, sm_count, rows = (positive_int(n, a) for n, a in (("merge_capacity", merge_capacity),
                                                                         ("sm_count", sm_count), ("rows", rows)))
    v = x.shape[0]
    k = _topk_k(k, v)
    cap = candidate_capacity(k, v, merge_capacity)
    if cap < k:
        raise ValueError(f"k = {k} needs a candidate capacity >= k; merge_capacity {merge_capacity} gives {cap}")
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


#: ``refine_row``'s constants (cu/ddtree/build.cuh; a CPU test reads them there): bins of a radix
#: level, their index bits, the radix select's first window below ``T`` (keys), the appends' first
#: window (keys: 1/4 of an octave), the append windows and the radix levels at most.
REFINE_BINS = 2048
REFINE_BIN_BITS = 11
REFINE_WIDTH = 1 << 24
REFINE_APPEND_WIDTH = 1 << 21
REFINE_APPEND_WINDOWS = 4
REFINE_LEVELS = 12
_KMIN = KEY_NEG_INF + 1  # the smallest key of a logit above -inf
_U32 = 0xFFFFFFFF


def _window_below(hi: int, width: int) -> int:
    """The bottom key of a window of ``width`` keys whose top is ``hi``, never below ``_KMIN``."""
    return hi - width + 1 if hi - _KMIN >= width else _KMIN


@dataclass
class RefineResult:
    """What ``refine_row`` decides for a failed row: ``threshold`` (T', float32) and ``count`` (the
    logits >= T', in ``[K, capacity]``), or ``threshold`` None when the chunk top-K takes the row
    (``reason`` says why); ``reads``: the reads of the whole row it made (appends, radix levels and
    the listing read)."""

    threshold: np.float32 | None
    count: int
    reads: int
    reason: str = ""


def refine_threshold(row, k: int, threshold, count: int, capacity: int) -> RefineResult:
    """The numpy twin of ``refine_row`` (cu/ddtree/build.cuh): for a row whose sampled threshold
    ``T`` failed (``count`` logits >= ``T`` with ``count < k`` or ``count > capacity``, or ``T``
    not finite), the threshold ``T'`` the build finds of the row's own, window by window and level
    by level as the kernel does, so that its decisions (and how many reads of the row they take)
    can be checked on CPU against a brute-force count.

    The chunk top-K takes the row (``threshold`` None) exactly when: ``T`` is not finite; the
    stream's sums relative to ``T`` are not (a logit ``x`` with ``x - T >= 80`` in float32,
    ``+inf`` included); fewer than ``k`` logits are above ``-inf``; or more than ``capacity``
    logits are >= the ``k``-th largest (ties at it: no ``T'`` admits at most ``capacity``).
    Not modelled: the kernel's rescale ``exp(T - T')`` of the sums overflowing a double (``T -
    T' > ~709``), where it also hands the row to the chunk top-K.

    Parameters
    ----------
    row : array_like of float
        One row of logits ``[vocab]`` (the input rules of :func:`threshold_topk`; bf16 widened).
    k, count, capacity : int
        ``1 <= k <= vocab``; the stream's count of logits >= ``T`` (>= 0); the row's candidate
        capacity (>= ``k``).
    threshold : float
        ``T`` as the sample kernel wrote it: a real number that float32 holds (NaN and +-inf
        included: the stream skipped the row).

    Raises
    ------
    TypeError
        As :func:`threshold_topk` for ``row`` and ``k``; ``threshold`` not a real number (None,
        a string, a bool, an array), ``count`` or ``capacity`` not an int.
    ValueError
        As :func:`threshold_topk` for ``row`` and ``k``; ``threshold`` finite but beyond float32's
        range; ``count`` < 0, ``capacity`` < ``k``; for a finite ``T``: ``count`` other than the
        row's logits ``>= T`` (``"count 0 disagrees with the row: 51 logits are >= T = 2.5"``), or a
        row whose threshold held (``k <= count <= capacity``: nothing to refine).
    """
    x, _ = _threshold_row(row, None)
    k = _topk_k(k, x.shape[0])
    count = int_in_range("count", count, 0, x.shape[0])
    capacity = int_in_range("capacity", capacity, k, 1 << 31)
    if isinstance(threshold, (bool, np.bool_)) or not isinstance(threshold, (int, float, np.integer, np.floating)):
        raise TypeError(f"threshold must be a real number (T, float32), got {type(threshold).__name__} {threshold!r}")
    with np.errstate(over="ignore"):
        t = np.float32(threshold)
    if (isinstance(threshold, (int, np.integer)) or np.isfinite(threshold)) and not np.isfinite(t):
        raise ValueError(f"threshold must be a float32 value, got {threshold!r} (beyond float32's range)")
    if not np.isfinite(t):
        return RefineResult(None, 0, 0, "T not finite")
    with np.errstate(invalid="ignore"):
        n_ge = int((x >= t).sum())  # NaN: never
    if count != n_ge:
        raise ValueError(f"count {count} disagrees with the row: {n_ge} logits are >= T = {float(t)!r}")
    if k <= count <= capacity:
        raise ValueError(f"the row's threshold held ({count} logits >= T, in [k, capacity] = [{k}, {capacity}]): "
                         "nothing to refine")
    with np.errstate(invalid="ignore", over="ignore"):
        if ((x - t) >= np.float32(80.0)).any():
            return RefineResult(None, 0, 0, "the stream's sums are not finite")
    keys = order_keys(x).astype(np.int64)
    tkey = int(order_keys(np.array([t]))[0])
    reads = 0
    # the radix select's first window [lo, hi] and the keys above it: more than capacity passed
    lo, hi, width, above = tkey, _U32, REFINE_WIDTH, 0
    if count < k:  # the appends: windows below T while the list holds fewer than K
        if tkey <= _KMIN:
            return RefineResult(None, 0, 0, "fewer than K logits above -inf")
        hi, width, have = tkey - 1, REFINE_APPEND_WIDTH, count
        overflowed = False
        for _ in range(REFINE_APPEND_WINDOWS):
            lo = _window_below(hi, width)
            before = have
            have += int(((keys >= lo) & (keys <= hi)).sum())
            reads += 1
            if have > capacity:  # the K-th largest lies in this window: the radix select starts on it
                above, overflowed = before, True
                break
            if have >= k:
                return RefineResult(key_to_f32(np.array([lo]))[0], have, reads)
            if lo == _KMIN:
                return RefineResult(None, 0, reads, "fewer than K logits above -inf")
            hi = lo - 1
            width = _U32 if width >= (1 << 29) else width << 3
        if not overflowed:  # every window read: the radix select starts on the next one below
            above, lo = have, _window_below(hi, width)
    # the radix select
    for _ in range(REFINE_LEVELS):
        rng = hi - lo
        shift = max(rng.bit_length() - REFINE_BIN_BITS, 0)
        inw = keys[(keys >= lo) & (keys <= hi)]
        bins = np.bincount((inw - lo) >> shift, minlength=REFINE_BINS)
        reads += 1
        need = k - above
        from_top = np.cumsum(bins[::-1])
        if from_top[-1] < need:  # the K-th largest lies below the window: the next, 16x as wide
            above += int(from_top[-1])
            if lo <= _KMIN:
                return RefineResult(None, 0, reads, "fewer than K logits above -inf")
            hi = lo - 1
            width = _U32 if width >= (1 << 28) else width << 4
            lo = _window_below(hi, width)
            continue
        j = int(np.argmax(from_top >= need))  # the K-th's bin, counted from the top
        b = REFINE_BINS - 1 - j
        n_above = int(from_top[j] - bins[b])
        blo = lo + (b << shift)
        bhi = min(hi, blo + (1 << shift) - 1)
        n_ge = above + n_above + int(bins[b])
        if n_ge <= capacity:
            return RefineResult(key_to_f32(np.array([blo]))[0], n_ge, reads + 1)  # + the listing read
        if shift == 0:
            return RefineResult(None, 0, reads, "more than capacity logits tie with the K-th largest")
        above += n_above
        lo, hi = blo, bhi
    return RefineResult(None, 0, reads, "levels exhausted")


__all__ += ["RefineResult", "refine_threshold"]
