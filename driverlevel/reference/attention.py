"""Float64 numpy reference of the verify attention for MLA draft trees.

The function computed (absorbed MLA, one latent KV head shared by all query
heads, paged KV with page size 1)::

    for request b, draft token i (global row t = qo_indptr[b] + i), head h:
        keys(t)  = prefix slots kv_indices[kv_indptr[b] : kv_indptr[b+1]]   (all)
                 + draft slots out_cache_loc[qo_indptr[b] + j]  for each draft
                   token j of request b that the mask shows to token i
        s_k      = sm_scale * dot(q[t, h, :], kv_cache[k, :])   (all head_dim)
        out[t,h] = sum_k softmax(s)_k * kv_cache[k, :v_dim]     (V = first v_dim)
        lse[t,h] = log(sum_k exp(s_k))                           (natural log)

A row that sees no key at all (only possible with an empty prefix and a mask
that hides the token from itself), or whose every score is -inf, gets ``out = 0``
and ``lse = -inf``; a NaN score, or a largest score of +inf, makes the row NaN.

Inputs may be any float dtype, or bf16 given as uint16 bit patterns (converted
with :func:`bf16_to_f32`); everything is computed in float64. The mask formats
are those of :mod:`driverlevel._mask`.

:func:`verify_attention_reference` is vectorised (one matrix product per chunk
of draft tokens per request); :func:`verify_attention_bruteforce` computes the
same thing with Python loops and an explicit softmax, decoding the mask
buffers on its own, and exists to check the former on small cases.
"""

from __future__ import annotations

import itertools
import math
import numbers

import numpy as np

from driverlevel._dtypes import bf16_bits_to_f32, f32_to_bf16_bits, is_ml_bfloat16
from driverlevel._mask import BITMASK_WORD_BITS, MaskFormat, parse_mask_format

from .trees import _exact_ints, _int_array

__all__ = [
    "bf16_to_f32",
    "f32_to_bf16",
    "round_to_bf16",
    "draft_visibility",
    "verify_attention_reference",
    "verify_attention_bruteforce",
]

# Elements of one float64 score block [tokens, heads, keys] per chunk (~32 MiB).
_CHUNK_ELEMENTS = 1 << 22


# --------------------------------------------------------------------------- bf16


def bf16_to_f32(bits: object) -> np.ndarray:
    """Widen bf16 bit patterns to float32 (exact).

    Parameters
    ----------
    bits : array_like
        uint16 (or int16) bf16 bit patterns, any shape.

    Returns
    -------
    numpy.ndarray
        float32, same shape: the upper 16 bits of each float32 are ``bits``.

    Raises
    ------
    TypeError
        ``bits`` is not a 16-bit integer array.
    """
    arr = np.asarray(bits)
    if arr.dtype.kind not in "iu" or arr.dtype.itemsize != 2:  # (stricter than the package's own)
        raise TypeError(f"bf16 bit patterns must be uint16 (or int16), got dtype {arr.dtype}")
    return bf16_bits_to_f32(arr)


def f32_to_bf16(values: object) -> np.ndarray:
    """Round float32 values to bf16, to nearest with ties to even.

    Parameters
    ----------
    values : array_like
        Real values, any shape; converted to float32 first.

    Returns
    -------
    numpy.ndarray
        uint16 bf16 bit patterns, same shape (a scalar gives a 0-d array). Values past bf16's
        range round to +-inf, infinities stay infinite, NaN becomes a quiet NaN with the
        same sign. The package's :func:`driverlevel.runtime.f32_to_bf16_bits`, which this calls.
    """
    return f32_to_bf16_bits(values)


def round_to_bf16(values: object) -> np.ndarray:
    """Round to bf16 (to nearest, ties to even, from float32) and return it as float32.

    Parameters
    ----------
    values : array_like
        Real values, any shape; converted to float32 first, as :func:`f32_to_bf16` does, so a
        float64 value is rounded twice: within one bf16 ulp, but not always the nearest bf16
        (``1 + 2**-8 + 2**-30`` gives 1.0, not 1.0078125). Every value the kernels read is float32
        or bf16 already, where the result is the nearest.

    Returns
    -------
    numpy.ndarray
        float32, same shape, every entry exactly representable in bf16.
    """
    return bf16_to_f32(f32_to_bf16(values))


def _float_input(name: str, x: object) -> np.ndarray:
    """Check a data array's dtype; bf16 (ml_dtypes.bfloat16) comes back as uint16 bits."""
    arr = np.asarray(x)
    if is_ml_bfloat16(arr.dtype):  # not a void dtype that only carries the name
        arr = arr.view(np.uint16)
    if arr.dtype != np.uint16 and arr.dtype.kind != "f":
        raise TypeError(
            f"{name} must be a float array, an ml_dtypes.bfloat16 array or uint16 bf16 bit patterns, "
            f"got dtype {arr.dtype}"
        )
    return arr


def _widen(arr: np.ndarray) -> np.ndarray:
    """float64 copy of a checked data array (uint16 read as bf16)."""
    if arr.dtype == np.uint16:
        return bf16_to_f32(arr).astype(np.float64)
    return arr.astype(np.float64)


def _to_float64(name: str, x: object) -> np.ndarray:
    return _widen(_float_input(name, x))


# --------------------------------------------------------------------------- validation


def _index_array(name: str, x: object, length: "int | None" = None) -> np.ndarray:
    """``x`` as int64: TypeError for a non-integer dtype, ValueError for values past int64 (a uint64
    ``2**63 + 1``, a Python ``2**70``), never wrapped; then the shape checks."""
    arr = _int_array(name, _exact_ints(x, -2**63, 2**63 - 1, f"{name} must fit int64"))
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if length is not None and arr.shape[0] != length:
        raise ValueError(f"{name} must have length {length}, got {arr.shape[0]}")
    return arr


def _indptr_array(name: str, x: object, length: "int | None" = None) -> np.ndarray:
    arr = _index_array(name, x, length)
    if arr.shape[0] < 1:
        raise ValueError(f"{name} must have length bs + 1 >= 1, got 0")
    if arr[0] < 0:
        raise ValueError(f"{name}[0] must be >= 0, got {arr[0]}")
    steps = np.diff(arr)
    if steps.size and steps.min() < 0:
        b = int(np.flatnonzero(steps < 0)[0])
        raise ValueError(f"{name} must be non-decreasing, but {name}[{b + 1}] = {arr[b + 1]} < {name}[{b}] = {arr[b]}")
    return arr


class _Problem:
    """Validated, normalised inputs of one verify call (host, float64/int64)."""

    def __init__(self, q, kv_cache, qo_indptr, kv_indptr, kv_indices, out_cache_loc,
                 mask, mask_format, sm_scale, v_dim, mask_indptr):
        self.fmt = parse_mask_format(mask_format)
        self.q = _to_float64("q", q)
        # The pool may be far larger than the slots in use: keep its dtype and
        # widen only the gathered rows (see rows()).
        self.kv = _float_input("kv_cache", kv_cache)
        if self.q.ndim != 3:
            raise ValueError(f"q must be [total_q, num_heads, head_dim], got shape {self.q.shape}")
        if self.kv.ndim != 2:
            raise ValueError(f"kv_cache must be [num_slots, head_dim], got shape {self.kv.shape}")
        total_q, self.num_heads, head_dim = self.q.shape
        if self.kv.shape[1] != head_dim:
            # (names both shapes: either argument may be the wrong one)
            raise ValueError(
                f"q and kv_cache disagree on head_dim: q.shape[2] = {head_dim}, kv_cache.shape[1] = {self.kv.shape[1]}"
            )
        if isinstance(v_dim, bool) or not isinstance(v_dim, numbers.Integral):
            raise TypeError(f"v_dim must be an int, got {type(v_dim).__name__}")
        if not 1 <= v_dim <= head_dim:
            raise ValueError(f"v_dim must be in [1, head_dim = {head_dim}], got {v_dim}")
        self.v_dim = int(v_dim)
        if isinstance(sm_scale, bool) or not isinstance(sm_scale, numbers.Real):
            raise TypeError(f"sm_scale must be a real number, got {type(sm_scale).__name__}")
        try:
            value = float(sm_scale)
        except OverflowError:  # an int (or Fraction) beyond the float range
            raise ValueError(f"sm_scale must be finite, got {type(sm_scale).__name__} too large for a float") from None
        if not math.isfinite(value):
            raise ValueError(f"sm_scale must be finite, got {sm_scale}")
        self.sm_scale = value

        self.qo_indptr = _indptr_array("qo_indptr", qo_indptr)
        bs = self.qo_indptr.shape[0] - 1
        self.bs = bs
        if self.qo_indptr[0] != 0:
            raise ValueError(f"qo_indptr[0] must be 0, got {self.qo_indptr[0]}")
        if self.qo_indptr[-1] != total_q:
            raise ValueError(
                f"qo_indptr[-1] must equal q.shape[0] = {total_q}, got {self.qo_indptr[-1]}"
            )
        self.kv_indptr = _indptr_array("kv_indptr", kv_indptr, bs + 1)
        self.kv_indices = _index_array("kv_indices", kv_indices)
        if self.kv_indptr[-1] > self.kv_indices.shape[0]:
            raise ValueError(
                f"kv_indptr[-1] = {self.kv_indptr[-1]} exceeds len(kv_indices) = {self.kv_indices.shape[0]}"
            )
        self.out_cache_loc = _index_array("out_cache_loc", out_cache_loc, total_q)
        num_slots = self.kv.shape[0]
        used = self.kv_indices[self.kv_indptr[0]:self.kv_indptr[-1]]
        for name, slots in (("kv_indices", used), ("out_cache_loc", self.out_cache_loc)):
            if slots.size and (slots.min() < 0 or slots.max() >= num_slots):
                bad = slots[(slots < 0) | (slots >= num_slots)][0]
                raise ValueError(f"{name} holds slot {bad}, outside the cache's [0, {num_slots})")
        self.q_lens = np.diff(self.qo_indptr)
        self.prefix_lens = np.diff(self.kv_indptr)

        if not self.fmt.uses_mask_indptr:
            mask_indptr = None  # not read by these formats
        self.mask_indptr = mask_indptr
        self.mask = mask

    def rows(self, slots: np.ndarray) -> np.ndarray:
        """float64 ``[len(slots), head_dim]`` cache rows."""
        return _widen(self.kv[slots])


def draft_visibility(
    mask: "np.ndarray | None",
    mask_format: "MaskFormat | str",
    qo_indptr: object,
    kv_indptr: object,
    *,
    mask_indptr: "np.ndarray | None" = None,
) -> list[np.ndarray]:
    """Decode a mask buffer into per-request draft-to-draft visibility.

    Parameters
    ----------
    mask : numpy.ndarray or None
        ``"full"``: uint8/bool/int8 ``[mask_indptr[-1]]``; ``"qlen_only"``:
        uint8/bool/int8 ``[mask_indptr[-1]]`` (a nonzero byte is visible, as in the
        kernel); ``"bitmask"``: uint32 (or int32, the
        same bits) ``[total_q, n_words]``; ``"causal"``: None.
    mask_format : MaskFormat or str
    qo_indptr : array_like of int
        ``[bs + 1]`` draft-token offsets, ``qo_indptr[0] == 0``.
    kv_indptr : array_like of int
        ``[bs + 1]`` prefix offsets (the FULL layout needs prefix lengths).
    mask_indptr : array_like of int, optional
        ``[bs + 1]`` block starts for ``"full"``/``"qlen_only"``; when None the
        blocks are taken as packed back to back from offset 0. Ignored by the
        other formats.

    Returns
    -------
    list of numpy.ndarray
        ``bs`` bool arrays ``[q_b, q_b]``; ``vis[b][i, j]`` is True iff draft
        token ``j`` of request ``b`` is visible to its draft token ``i``.

    Raises
    ------
    TypeError
        Wrong mask dtype, or a mask given for ``"causal"``.
    ValueError
        Wrong shapes, blocks past the end of the buffer, or bitmask bits set at or
        past the request's draft count. (A FULL block's prefix columns are not read,
        as the kernels do not read them: SGLang's Triton backend skips them by
        default, and its tree builder may leave them unwritten.)
    """
    fmt = parse_mask_format(mask_format)
    qo = _indptr_array("qo_indptr", qo_indptr)
    kvp = _indptr_array("kv_indptr", kv_indptr, qo.shape[0])
    if qo[0] != 0:
        raise ValueError(f"qo_indptr[0] must be 0, got {qo[0]}")
    q_lens = np.diff(qo)
    p_lens = np.diff(kvp)
    bs = q_lens.shape[0]

    if fmt is MaskFormat.CAUSAL:
        if mask is not None:
            raise TypeError("mask must be None for mask_format 'causal' (it has no mask buffer)")
        return [np.tril(np.ones((n, n), dtype=bool)) for n in q_lens]

    if mask is None:
        raise TypeError(f"mask_format {fmt.value!r} needs a mask buffer, got None")
    m = np.asarray(mask)

    if fmt is MaskFormat.BITMASK:
        if m.dtype == np.int32:  # the same 32 bits, as VerifyMetadata's custom_mask may hold them (SGLang's int32)
            m = m.view(np.uint32)
        if m.dtype != np.uint32:
            raise TypeError(f"mask must be uint32 (or int32 words) for mask_format 'bitmask', got dtype {m.dtype}")
        total_q = int(qo[-1])
        if m.ndim != 2 or m.shape[0] != total_q:
            raise ValueError(f"mask must be [total_q = {total_q}, n_words] for 'bitmask', got shape {m.shape}")
        width = m.shape[1] * BITMASK_WORD_BITS
        max_q = int(q_lens.max()) if bs else 0
        if max_q > width:
            raise ValueError(
                f"bitmask has {m.shape[1]} words per token ({width} bits), fewer than max q_len = {max_q}"
            )
        shifts = np.arange(BITMASK_WORD_BITS, dtype=np.uint32)
        bits = ((m[:, :, None] >> shifts) & np.uint32(1)).astype(bool).reshape(total_q, width)
        out = []
        for b in range(bs):
            rows = bits[qo[b]:qo[b + 1]]
            n = int(q_lens[b])
            if rows[:, n:].any():
                i = int(np.flatnonzero(rows[:, n:].any(axis=1))[0])
                raise ValueError(
                    f"bitmask row {qo[b] + i} (request {b}, q_len {n}) has bits set at or past bit {n}"
                )
            out.append(np.ascontiguousarray(rows[:, :n]))
        return out

    # SGLang layouts: flat uint8/bool (or int8, as VerifyAttention.run takes it: a byte != 0 is visible)
    if m.dtype not in (np.uint8, np.bool_, np.int8):
        raise TypeError(f"mask must be uint8, bool or int8 for mask_format {fmt.value!r}, got dtype {m.dtype}")
    if m.ndim != 1:
        raise ValueError(f"mask must be 1-D for mask_format {fmt.value!r}, got shape {m.shape}")
    widths = [int(p) + int(q) if fmt is MaskFormat.FULL else int(q) for p, q in zip(p_lens, q_lens)]
    sizes = [int(q) * w for q, w in zip(q_lens, widths)]  # Python ints: an int64 product may wrap
    if mask_indptr is None:
        starts = [0] + list(itertools.accumulate(sizes))
    else:
        starts = _index_array("mask_indptr", mask_indptr, bs + 1)
    out = []
    for b in range(bs):
        start, size = int(starts[b]), sizes[b]
        if start < 0 or start + size > m.shape[0]:
            raise ValueError(
                f"request {b}'s mask block [{start}, {start + size}) lies outside the mask of length {m.shape[0]}"
            )
        n, w = int(q_lens[b]), int(widths[b])
        block = m[start:start + size].reshape(n, w).astype(bool)
        if fmt is MaskFormat.FULL:  # the prefix columns are not read (whatever they hold)
            block = block[:, w - n:]
        out.append(np.ascontiguousarray(block))
    return out


# --------------------------------------------------------------------------- reference


def verify_attention_reference(
    q: object,
    kv_cache: object,
    qo_indptr: object,
    kv_indptr: object,
    kv_indices: object,
    out_cache_loc: object,
    mask: "np.ndarray | None",
    mask_format: "MaskFormat | str",
    sm_scale: float,
    v_dim: int = 512,
    *,
    mask_indptr: "np.ndarray | None" = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Verify attention of a batch of draft trees, in float64.

    Parameters
    ----------
    q : array_like
        ``[total_q, num_heads, head_dim]`` queries (absorbed MLA: head_dim 576 =
        512 latent + 64 rope). Any float dtype, or uint16 bf16 bit patterns.
        Non-finite values are taken as they are: a NaN reaches ``out`` and
        ``lse`` of the rows that see it, as IEEE arithmetic carries it.
    kv_cache : array_like
        ``[num_slots, head_dim]`` KV pool, page size 1; keys are whole rows,
        values their first ``v_dim`` columns. Same dtype rules as ``q``.
    qo_indptr : array_like of int
        ``[bs + 1]``, ``qo_indptr[0] == 0``, ``qo_indptr[-1] == total_q``.
        SGLang passes int64.
    kv_indptr : array_like of int
        ``[bs + 1]`` offsets into ``kv_indices`` (SGLang: int32).
    kv_indices : array_like of int
        Slot ids of the committed prefixes (SGLang: int64).
    out_cache_loc : array_like of int
        ``[total_q]`` slot of each draft token's own K/V (SGLang: int64).
    mask : numpy.ndarray or None
        Draft-to-draft visibility in ``mask_format`` (see
        :func:`draft_visibility` and :mod:`driverlevel._mask`); None for
        ``"causal"``.
    mask_format : MaskFormat or str
        ``"full"``, ``"qlen_only"``, ``"bitmask"`` or ``"causal"``.
    sm_scale : float
        Softmax scale applied to ``q·k`` (``1/sqrt(192)`` for DeepSeek-style
        models). Any finite value: the reference is the formula, and 0 or a
        negative scale are defined there (in float64: a scale whose scores ``sm_scale * q·k``
        overflow it, past ~1.8e308, gives NaN). :class:`~driverlevel.VerifyAttention`
        takes only what its kernels can (a positive ``sm_scale`` whose
        ``sm_scale * log2(e)`` is a normal float32).
    v_dim : int, default 512
        Value / output width per head, ``1 <= v_dim <= head_dim``.
    mask_indptr : array_like of int, optional
        ``[bs + 1]`` block starts for ``"full"``/``"qlen_only"``; None means
        blocks packed back to back from 0. Ignored by the other formats.

    Returns
    -------
    out : numpy.ndarray
        float64 ``[total_q, num_heads, v_dim]``.
    lse : numpy.ndarray
        float64 ``[total_q, num_heads]``, natural log of ``sum exp(sm_scale*q·k)``
        over the visible keys; ``-inf`` (with ``out`` 0) for a row with none.

    Raises
    ------
    TypeError
        Non-float data, non-integer metadata, a wrong mask dtype, or a
        non-numeric ``sm_scale``/``v_dim``.
    ValueError
        Inconsistent shapes or lengths, decreasing indptrs, slots outside the
        cache, index values past int64 (``"kv_indices must fit int64, got
        9223372036854775809"``, never wrapped), a ``v_dim`` outside
        ``[1, head_dim]``, or a malformed mask (see :func:`draft_visibility`).

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> q = rng.standard_normal((2, 1, 4)); kv = rng.standard_normal((5, 4))
    >>> out, lse = verify_attention_reference(
    ...     q, kv, qo_indptr=[0, 2], kv_indptr=[0, 2], kv_indices=[3, 1],
    ...     out_cache_loc=[0, 4], mask=None, mask_format="causal",
    ...     sm_scale=0.5, v_dim=2)
    >>> out.shape, lse.shape
    ((2, 1, 2), (2, 1))
    """
    pb = _Problem(q, kv_cache, qo_indptr, kv_indptr, kv_indices, out_cache_loc,
                  mask, mask_format, sm_scale, v_dim, mask_indptr)
    vis = draft_visibility(pb.mask, pb.fmt, pb.qo_indptr, pb.kv_indptr, mask_indptr=pb.mask_indptr)
    total_q, H, D = pb.q.shape
    out = np.zeros((total_q, H, pb.v_dim), dtype=np.float64)
    lse = np.full((total_q, H), -np.inf, dtype=np.float64)

    for b in range(pb.bs):
        q0, n = int(pb.qo_indptr[b]), int(pb.q_lens[b])
        if n == 0:
            continue
        k0, p = int(pb.kv_indptr[b]), int(pb.prefix_lens[b])
        slots = np.concatenate([pb.kv_indices[k0:k0 + p], pb.out_cache_loc[q0:q0 + n]])
        keys = pb.rows(slots)                     # [p + n, D]
        values = keys[:, :pb.v_dim]               # [p + n, v_dim]
        # A key row with a non-finite value must not reach the rows that cannot see it (0 * NaN in
        # the product below would): the product uses finite value rows only, and those keys are
        # added for the rows that see them, weight times value as verify_attention_bruteforce does.
        finite_v = np.isfinite(values).all(axis=1)                          # [p + n]
        values_f = np.where(finite_v[:, None], values, 0.0)
        bad = np.flatnonzero(~finite_v)
        visible = np.concatenate([np.ones((n, p), dtype=bool), vis[b]], axis=1)  # [n, p + n]
        chunk = max(1, _CHUNK_ELEMENTS // max(1, H * (p + n)))
        for c0 in range(0, n, chunk):
            c1 = min(n, c0 + chunk)
            rows = pb.q[q0 + c0:q0 + c1].reshape(-1, D)                    # [c*H, D]
            s = (rows @ keys.T).reshape(c1 - c0, H, p + n) * pb.sm_scale   # [c, H, keys]
            s = np.where(visible[c0:c1, None, :], s, -np.inf)
            m = s.max(axis=2, keepdims=True)
            m_safe = np.where(np.isfinite(m), m, 0.0)
            e = np.exp(s - m_safe)
            l = e.sum(axis=2)                                               # [c, H]
            with np.errstate(invalid="ignore"):  # NaN / inf inputs give NaN rows, on purpose
                acc = (e.reshape(-1, p + n) @ values_f).reshape(c1 - c0, H, pb.v_dim)
                if bad.size:
                    term = e[..., bad, None] * values[bad][None, None]          # [c, H, nbad, v_dim]
                    acc = acc + np.where(visible[c0:c1, None, bad, None], term, 0.0).sum(axis=2)
                # l is NaN where a visible score is NaN, and made NaN where the largest is +inf
                # (exp(inf - inf)): that row's output and LSE are NaN too
                pos_inf = np.isposinf(m[..., 0])
                l = np.where(pos_inf, np.nan, l)
                acc = np.where(pos_inf[..., None], np.nan, acc)
                has = (l > 0) | np.isnan(l)
                out[q0 + c0:q0 + c1] = np.where(has[..., None], acc / np.where(has, l, 1.0)[..., None], 0.0)
                lse[q0 + c0:q0 + c1] = np.where(has, m_safe[..., 0] + np.log(np.where(has, l, 1.0)), -np.inf)
    return out, lse


# --------------------------------------------------------------------------- brute force


def _bruteforce_visible(pb: _Problem, b: int, i: int, j: int) -> bool:
    """Is draft token j of request b visible to its token i? Read straight from the buffer."""
    fmt = pb.fmt
    if fmt is MaskFormat.CAUSAL:
        return j <= i
    n = int(pb.q_lens[b])
    if fmt is MaskFormat.BITMASK:
        word = int(pb.mask[int(pb.qo_indptr[b]) + i, j // BITMASK_WORD_BITS])
        return (word >> (j % BITMASK_WORD_BITS)) & 1 == 1
    p = int(pb.prefix_lens[b])
    width = p + n if fmt is MaskFormat.FULL else n
    col = p + j if fmt is MaskFormat.FULL else j
    if pb.mask_indptr is not None:
        start = int(pb.mask_indptr[b])
    else:
        start = 0
        for bb in range(b):
            nb = int(pb.q_lens[bb])
            start += nb * ((int(pb.prefix_lens[bb]) + nb) if fmt is MaskFormat.FULL else nb)
    return bool(pb.mask[start + i * width + col])


def verify_attention_bruteforce(
    q: object,
    kv_cache: object,
    qo_indptr: object,
    kv_indptr: object,
    kv_indices: object,
    out_cache_loc: object,
    mask: "np.ndarray | None",
    mask_format: "MaskFormat | str",
    sm_scale: float,
    v_dim: int = 512,
    *,
    mask_indptr: "np.ndarray | None" = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The verify attention with Python loops and an explicit softmax.

    Same parameters, returns and input checks as
    :func:`verify_attention_reference`, but each (draft token, head) row is
    computed on its own: list the visible key slots (the prefix, then each
    draft token whose mask entry is read directly from the buffer), score them
    one dot product at a time, subtract the maximum, exponentiate, normalise,
    and sum the weighted value rows. Slow; for small test cases only. The mask is
    validated as :func:`verify_attention_reference` validates it (its dtype, size and
    ``mask_indptr``: :func:`draft_visibility` runs for its checks only), but what a draft token
    sees is read from the buffer here, entry by entry (the prefix columns of a FULL mask are
    taken as visible without being read).
    """
    pb = _Problem(q, kv_cache, qo_indptr, kv_indptr, kv_indices, out_cache_loc,
                  mask, mask_format, sm_scale, v_dim, mask_indptr)
    draft_visibility(pb.mask, pb.fmt, pb.qo_indptr, pb.kv_indptr, mask_indptr=pb.mask_indptr)  # (checks only)
    if pb.fmt.has_mask_buffer:
        if pb.mask is None:
            raise TypeError(f"mask_format {pb.fmt.value!r} needs a mask buffer, got None")
        pb.mask = np.asarray(pb.mask)
        if pb.mask_indptr is not None:
            pb.mask_indptr = _index_array("mask_indptr", pb.mask_indptr, pb.bs + 1)
    elif pb.mask is not None:
        raise TypeError("mask must be None for mask_format 'causal' (it has no mask buffer)")
    total_q, H, _ = pb.q.shape
    kv = pb.rows(np.arange(pb.kv.shape[0]))  # small cases only: widen the whole pool
    out = np.zeros((total_q, H, pb.v_dim), dtype=np.float64)
    lse = np.full((total_q, H), -np.inf, dtype=np.float64)
    for b in range(pb.bs):
        q0 = int(pb.qo_indptr[b])
        k0 = int(pb.kv_indptr[b])
        for i in range(int(pb.q_lens[b])):
            t = q0 + i
            slots = [int(pb.kv_indices[k0 + k]) for k in range(int(pb.prefix_lens[b]))]
            for j in range(int(pb.q_lens[b])):
                if _bruteforce_visible(pb, b, i, j):
                    slots.append(int(pb.out_cache_loc[q0 + j]))
            if not slots:
                continue  # out stays 0, lse -inf
            for h in range(H):
                scores = [pb.sm_scale * float(np.dot(pb.q[t, h], kv[s])) for s in slots]
                if all(x == -math.inf for x in scores):
                    continue  # every weight is 0: out stays 0, lse -inf (as a row that sees no key)
                top = max(scores)
                weights = [math.exp(x - top) for x in scores]
                total = math.fsum(weights)
                row = np.zeros(pb.v_dim, dtype=np.float64)
                with np.errstate(invalid="ignore"):  # non-finite inputs give NaN rows, on purpose
                    for w, s in zip(weights, slots):
                        row += (w / total) * kv[s, :pb.v_dim]
                out[t, h] = row
                lse[t, h] = top + math.log(total)
    return out, lse
