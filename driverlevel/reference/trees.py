"""Draft trees and verify metadata for tests and references (host, numpy).

A draft tree of ``n`` nodes is a parents array: int64 ``[n]`` with
``parents[0] == -1`` (node 0 is the root, the last committed token) and
``0 <= parents[i] < i`` for ``i >= 1``, so nodes are numbered in an order where
every parent comes before its children. Draft token ``i`` of a request sees
itself and its ancestors (the "ancestor-only" mask) and the whole committed
prefix.

This module builds trees (:func:`random_tree`, :func:`chain_tree`,
:func:`star_tree`), the visibility they imply (:func:`ancestor_visibility`),
every mask format of :mod:`driverlevel._mask` from a list of per-request trees,
and SGLang-style metadata with native dtypes (:func:`make_metadata`).
"""

from __future__ import annotations

import dataclasses
import numbers
import operator
from typing import Sequence

import numpy as np

from driverlevel._mask import BITMASK_WORD_BITS, MaskFormat, parse_mask_format

__all__ = [
    "random_tree",
    "chain_tree",
    "star_tree",
    "check_parents",
    "ancestor_visibility",
    "mask_indptr_for",
    "build_full_mask",
    "build_qlen_only_mask",
    "build_bitmask",
    "build_mask",
    "VerifyMetadata",
    "make_metadata",
]


# --------------------------------------------------------------------------- trees


def _count(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got bool")
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}") from None
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def _generator(rng: object) -> np.random.Generator:
    """``rng`` if it is a numpy Generator (``numpy.random.default_rng(...)``), else a TypeError."""
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator (numpy.random.default_rng(seed)), "
                        f"got {type(rng).__name__}")
    return rng


def _int_array(name: str, values: object, what: str = "an integer array") -> np.ndarray:
    """``values`` as an int64 array, or an error naming ``name``.

    Integer dtypes only: bool, float, str and object arrays are refused, never truncated or
    parsed. An empty list or tuple (which numpy makes float64) counts as integers. Unsigned
    values past the int64 range are refused, never wrapped (``2**64 - 1`` is not ``-1``).

    Raises
    ------
    TypeError
        Not an integer dtype: ``"parents must be an integer array, got dtype float64"``.
    ValueError
        An unsigned value above ``2**63 - 1``.
    """
    arr = np.asarray(values)
    if arr.size == 0 and isinstance(values, (list, tuple)):
        return arr.astype(np.int64)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{name} must be {what}, got dtype {arr.dtype}")
    if arr.dtype.kind == "u" and arr.size and int(arr.max()) > np.iinfo(np.int64).max:
        raise ValueError(f"{name} must fit int64, got {int(arr.max())}")
    return arr.astype(np.int64)


def _exact_ints(values: object, lo: int, hi: int, what: str) -> np.ndarray:
    """``values`` as numpy reads them, except Python ints that it keeps as objects (past int64) or
    makes float64 (ints of both signs past int64): those come back as int64, every one checked to
    lie in ``[lo, hi]`` first, ValueError ``"WHAT, got V"`` naming the first that does not (never
    rounded or wrapped). An empty list or tuple comes back as int64 (numpy makes it float64).
    The dtype check stays the caller's: a float in ``values`` leaves them as numpy read them."""
    arr = np.asarray(values)
    if arr.size == 0 and isinstance(values, (list, tuple)):
        return arr.astype(np.int64)
    if arr.size and (arr.dtype == object or (arr.dtype.kind == "f" and not isinstance(values, np.ndarray))):
        objs = np.asarray(values, dtype=object)
        if all(isinstance(v, numbers.Integral) and not isinstance(v, (bool, np.bool_)) for v in objs.flat):
            bad = next((int(v) for v in objs.flat if not lo <= int(v) <= hi), None)
            if bad is not None:
                raise ValueError(f"{what}, got {bad}")
            return objs.astype(np.int64)
    return arr


def random_tree(num_nodes: int, rng: np.random.Generator) -> np.ndarray:
    """A random draft tree: each node's parent is uniform over the earlier nodes.

    Parameters
    ----------
    num_nodes : int
        Number of nodes, root included (>= 1).
    rng : numpy.random.Generator

    Returns
    -------
    numpy.ndarray
        int64 ``[num_nodes]`` parents; ``parents[0] == -1``, ``parents[i] < i``.

    Raises
    ------
    TypeError, ValueError
        ``num_nodes`` is not an int >= 1; ``rng`` is not a numpy Generator (TypeError).
    """
    n = _count("num_nodes", num_nodes, 1)
    rng = _generator(rng)
    parents = np.empty(n, dtype=np.int64)
    parents[0] = -1
    if n > 1:
        # parents[i] uniform over [0, i), for i = 1 .. n-1, in one call.
        parents[1:] = rng.integers(0, np.arange(1, n, dtype=np.int64), dtype=np.int64)
    return parents


def chain_tree(num_nodes: int) -> np.ndarray:
    """A chain: node ``i`` is the child of node ``i - 1``.

    Parameters
    ----------
    num_nodes : int
        Number of nodes (>= 1).

    Returns
    -------
    numpy.ndarray
        int64 ``[num_nodes]``: ``[-1, 0, 1, ..., num_nodes - 2]``.
    """
    n = _count("num_nodes", num_nodes, 1)
    return np.arange(-1, n - 1, dtype=np.int64)


def star_tree(num_nodes: int) -> np.ndarray:
    """A star: every node other than the root is a child of the root.

    Parameters
    ----------
    num_nodes : int
        Number of nodes (>= 1).

    Returns
    -------
    numpy.ndarray
        int64 ``[num_nodes]``: ``[-1, 0, 0, ..., 0]``.
    """
    n = _count("num_nodes", num_nodes, 1)
    parents = np.zeros(n, dtype=np.int64)
    parents[0] = -1
    return parents


def check_parents(parents: object, name: str = "parents") -> np.ndarray:
    """Validate a parents array and return it as int64.

    Parameters
    ----------
    parents : array_like of int
        ``[n]``, ``n >= 1``.
    name : str
        Name used in error messages.

    Returns
    -------
    numpy.ndarray
        int64 ``[n]`` copy.

    Raises
    ------
    TypeError
        Not an integer array (a string, floats...: ``"parents must be an integer array, got
        dtype <U3"``), whatever its shape.
    ValueError
        Not 1-D, empty, an unsigned value past int64, ``parents[0] != -1``, or some
        ``parents[i]`` outside ``[0, i)``.
    """
    arr = np.asarray(parents)
    if arr.size or isinstance(parents, np.ndarray):  # the dtype first: a string or floats are no integer
        arr = _int_array(name, arr)                  # array, whatever their shape (a [] list is float64: its shape)
    if arr.ndim != 1 or arr.shape[0] < 1:  # ([] is an empty float64 array, not a float one: the shape)
        raise ValueError(f"{name} must be 1-D with at least one node, got shape {arr.shape}")
    if arr[0] != -1:
        raise ValueError(f"{name}[0] must be -1 (the root), got {arr[0]}")
    idx = np.arange(arr.shape[0])
    bad = np.flatnonzero((arr[1:] < 0) | (arr[1:] >= idx[1:]))
    if bad.size:
        i = int(bad[0]) + 1
        raise ValueError(f"{name}[{i}] must be in [0, {i}), got {arr[i]}")
    return arr


def ancestor_visibility(parents: object) -> np.ndarray:
    """Which nodes each node sees: itself and its ancestors.

    Parameters
    ----------
    parents : array_like of int
        ``[n]`` parents array (see the module docstring).

    Returns
    -------
    numpy.ndarray
        bool ``[n, n]``; ``vis[i, j]`` is True iff ``j == i`` or ``j`` is an
        ancestor of ``i``. Lower triangular with a true diagonal.

    Raises
    ------
    TypeError, ValueError
        From :func:`check_parents`.
    """
    par = check_parents(parents)
    n = par.shape[0]
    vis = np.zeros((n, n), dtype=bool)
    vis[0, 0] = True
    for i in range(1, n):  # parents come first, so their rows are complete
        vis[i] = vis[par[i]]
        vis[i, i] = True
    return vis


# --------------------------------------------------------------------------- masks


def _lengths(name: str, values: object) -> np.ndarray:
    arr = _int_array(name, values, "integers")
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.size and arr.min() < 0:
        raise ValueError(f"{name} must be >= 0, got {arr.tolist()}")
    return arr


def _trees(parents_list: Sequence[object]) -> list[np.ndarray]:
    if isinstance(parents_list, np.ndarray) and parents_list.ndim == 1:
        raise TypeError("parents_list must be a sequence of parents arrays (one per request), "
                        "got a single 1-D array; wrap it in a list")
    return [check_parents(p, f"parents_list[{b}]") for b, p in enumerate(parents_list)]


def _indptr(sizes: np.ndarray, name: str = "the lengths") -> np.ndarray:
    """int64 ``[n + 1]`` running sums of ``sizes`` (int64, or object: Python ints), exact: a total past
    int64 is a ValueError naming ``name``, never a wrapped (negative) offset."""
    total = sum(int(v) for v in sizes.tolist()) if sizes.dtype == object else int(sizes.astype(object).sum())
    if total > np.iinfo(np.int64).max:
        raise ValueError(f"the total of {name} = {total} does not fit int64")
    out = np.zeros(sizes.shape[0] + 1, dtype=np.int64)
    np.cumsum(np.asarray(sizes, dtype=np.int64), out=out[1:])
    return out


def mask_indptr_for(prefix_lens: object, q_lens: object, mask_format: "MaskFormat | str") -> np.ndarray:
    """Start of each request's block in a SGLang mask buffer.

    Parameters
    ----------
    prefix_lens : array_like of int
        ``[bs]`` committed prefix length per request (keys).
    q_lens : array_like of int
        ``[bs]`` draft tokens per request.
    mask_format : MaskFormat or str
        ``"full"`` (blocks of ``q_len * (prefix_len + q_len)``) or
        ``"qlen_only"`` (blocks of ``q_len * q_len``).

    Returns
    -------
    numpy.ndarray
        int64 ``[bs + 1]``; ``mask_indptr[-1]`` is the buffer's length in bytes.

    Raises
    ------
    ValueError
        Length arrays of different sizes or negative, a format without ``mask_indptr``, or a
        buffer longer than int64 can count.
    """
    fmt = parse_mask_format(mask_format)
    p = _lengths("prefix_lens", prefix_lens)
    q = _lengths("q_lens", q_lens)
    if p.shape != q.shape:
        raise ValueError(f"prefix_lens and q_lens must have the same length, got {p.shape[0]} and {q.shape[0]}")
    po, qo = p.astype(object), q.astype(object)  # (Python ints: a block past int64 is refused, not wrapped)
    if fmt is MaskFormat.FULL:
        return _indptr(qo * (po + qo), "the FULL mask's blocks q_len * (prefix_len + q_len)")
    if fmt is MaskFormat.QLEN_ONLY:
        return _indptr(qo * qo, "the QLEN_ONLY mask's blocks q_len * q_len")
    raise ValueError(f"mask_format {fmt.value!r} has no mask_indptr (only 'full' and 'qlen_only')")


def build_full_mask(parents_list: Sequence[object], prefix_lens: object) -> tuple[np.ndarray, np.ndarray]:
    """SGLang FULL mask of ancestor-only trees.

    Parameters
    ----------
    parents_list : sequence of array_like of int
        One parents array per request; request ``b`` has ``len(parents_list[b])``
        draft tokens.
    prefix_lens : array_like of int
        ``[bs]`` committed prefix length per request.

    Returns
    -------
    custom_mask : numpy.ndarray
        uint8 ``[sum_b q_b * (prefix_b + q_b)]``; request ``b``'s block, at
        ``mask_indptr[b]``, is ``q_b × (prefix_b + q_b)`` row-major with the
        prefix columns all ones.
    mask_indptr : numpy.ndarray
        int64 ``[bs + 1]``.

    Raises
    ------
    TypeError, ValueError
        Bad parents arrays, or ``len(prefix_lens) != len(parents_list)``.
    """
    trees = _trees(parents_list)
    p = _lengths("prefix_lens", prefix_lens)
    if p.shape[0] != len(trees):
        raise ValueError(f"prefix_lens must have one entry per request ({len(trees)}), got {p.shape[0]}")
    blocks = []
    for par, plen in zip(trees, p):
        vis = ancestor_visibility(par)
        block = np.ones((vis.shape[0], int(plen) + vis.shape[0]), dtype=np.uint8)
        block[:, int(plen):] = vis
        blocks.append(block.ravel())
    q = np.array([t.shape[0] for t in trees], dtype=np.int64)
    mask = np.concatenate(blocks) if blocks else np.zeros(0, dtype=np.uint8)
    return mask, mask_indptr_for(p, q, MaskFormat.FULL)


def build_qlen_only_mask(parents_list: Sequence[object]) -> tuple[np.ndarray, np.ndarray]:
    """SGLang QLEN_ONLY mask of ancestor-only trees.

    Parameters
    ----------
    parents_list : sequence of array_like of int
        One parents array per request.

    Returns
    -------
    custom_mask : numpy.ndarray
        uint8 ``[sum_b q_b * q_b]``; request ``b``'s ``q_b × q_b`` row-major
        block starts at ``mask_indptr[b]``.
    mask_indptr : numpy.ndarray
        int64 ``[bs + 1]``.

    Raises
    ------
    TypeError, ValueError
        Bad parents arrays.
    """
    trees = _trees(parents_list)
    blocks = [ancestor_visibility(par).astype(np.uint8).ravel() for par in trees]
    q = np.array([t.shape[0] for t in trees], dtype=np.int64)
    mask = np.concatenate(blocks) if blocks else np.zeros(0, dtype=np.uint8)
    return mask, mask_indptr_for(np.zeros_like(q), q, MaskFormat.QLEN_ONLY)


def build_bitmask(parents_list: Sequence[object], words_per_token: int) -> np.ndarray:
    """driverlevel's packed bitmask of ancestor-only trees.

    Parameters
    ----------
    parents_list : sequence of array_like of int
        One parents array per request.
    words_per_token : int
        uint32 words per draft token, ``ceil(max_q / 32)`` of the plan
        (:func:`driverlevel._mask.bitmask_words`).

    Returns
    -------
    numpy.ndarray
        uint32 ``[total_q, words_per_token]``; bit ``j`` of word ``w`` in global
        row ``qo_indptr[b] + i`` is set iff draft token ``32*w + j`` of request
        ``b`` is ``i`` itself or an ancestor of ``i``. Rows are in request order.

    Raises
    ------
    TypeError, ValueError
        Bad parents arrays, or a request with more than ``32 * words_per_token``
        draft tokens.
    """
    trees = _trees(parents_list)
    words = _count("words_per_token", words_per_token, 1)
    width = words * BITMASK_WORD_BITS
    rows = []
    for b, par in enumerate(trees):
        n = par.shape[0]
        if n > width:
            raise ValueError(
                f"request {b} has {n} draft tokens, more than words_per_token * 32 = {width}"
            )
        vis = np.zeros((n, width), dtype=np.uint64)
        vis[:, :n] = ancestor_visibility(par)
        weights = np.left_shift(np.uint64(1), np.arange(BITMASK_WORD_BITS, dtype=np.uint64))
        packed = (vis.reshape(n, words, BITMASK_WORD_BITS) * weights).sum(axis=2)
        rows.append(packed.astype(np.uint32))
    if not rows:
        return np.zeros((0, words), dtype=np.uint32)
    return np.ascontiguousarray(np.concatenate(rows, axis=0))


def build_mask(
    parents_list: Sequence[object],
    prefix_lens: object,
    mask_format: "MaskFormat | str",
    words_per_token: "int | None" = None,
) -> tuple["np.ndarray | None", "np.ndarray | None"]:
    """The mask buffer (and ``mask_indptr``) of ``mask_format`` for these trees.

    Parameters
    ----------
    parents_list : sequence of array_like of int
        One parents array per request.
    prefix_lens : array_like of int
        ``[bs]`` committed prefix length per request, each ``>= 0``; read by ``"full"``
        only, checked in every format.
    mask_format : MaskFormat or str
    words_per_token : int, optional
        For ``"bitmask"``; defaults to ``ceil(max_q / 32)`` of these trees.

    Returns
    -------
    mask : numpy.ndarray or None
        See :func:`build_full_mask`, :func:`build_qlen_only_mask`,
        :func:`build_bitmask`; None for ``"causal"``.
    mask_indptr : numpy.ndarray or None
        int64 ``[bs + 1]`` for ``"full"`` and ``"qlen_only"``, else None.

    Raises
    ------
    ValueError
        ``"causal"`` with a tree that is not a chain, ``len(prefix_lens) != len(parents_list)``,
        a negative prefix length, or the builders' errors.
    """
    fmt = parse_mask_format(mask_format)
    if fmt is MaskFormat.FULL:
        return build_full_mask(parents_list, prefix_lens)
    trees = _trees(parents_list)
    p = _lengths("prefix_lens", prefix_lens)  # checked in every format, not only the one that reads it
    if p.shape[0] != len(trees):
        raise ValueError(f"prefix_lens must have one entry per request ({len(trees)}), got {p.shape[0]}")
    if fmt is MaskFormat.QLEN_ONLY:
        return build_qlen_only_mask(trees)
    if fmt is MaskFormat.BITMASK:
        if words_per_token is None:
            max_q = max((t.shape[0] for t in trees), default=1)
            words_per_token = -(-max_q // BITMASK_WORD_BITS)
        return build_bitmask(trees, words_per_token), None
    for b, par in enumerate(trees):
        if not np.array_equal(par, chain_tree(par.shape[0])):
            raise ValueError(f"mask_format 'causal' needs chains, but parents_list[{b}] is not a chain")
    return None, None


# --------------------------------------------------------------------------- metadata


@dataclasses.dataclass(frozen=True)
class VerifyMetadata:
    """SGLang-style verify metadata, host arrays in the native dtypes.

    Attributes
    ----------
    prefix_lens : numpy.ndarray
        int64 ``[bs]`` committed prefix length per request.
    q_lens : numpy.ndarray
        int64 ``[bs]`` draft tokens per request.
    qo_indptr : numpy.ndarray
        int64 ``[bs + 1]``; request ``b``'s draft tokens are global rows
        ``qo_indptr[b] .. qo_indptr[b+1]-1``.
    kv_indptr : numpy.ndarray
        int32 ``[bs + 1]``; request ``b``'s prefix slots are
        ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]``.
    kv_indices : numpy.ndarray
        int64 ``[sum(prefix_lens)]`` slot ids of the committed prefixes.
    out_cache_loc : numpy.ndarray
        int64 ``[total_q]`` slot of each draft token's own K/V.
    mask_indptr : numpy.ndarray
        int64 ``[bs + 1]`` block starts of the SGLang mask in ``mask_format``'s
        layout (the FULL layout for ``"bitmask"`` and ``"causal"``, which do
        not read it).
    num_slots : int
        Size of the KV pool the slots were drawn from.
    mask_format : MaskFormat
    """

    prefix_lens: np.ndarray
    q_lens: np.ndarray
    qo_indptr: np.ndarray
    kv_indptr: np.ndarray
    kv_indices: np.ndarray
    out_cache_loc: np.ndarray
    mask_indptr: np.ndarray
    num_slots: int
    mask_format: MaskFormat

    @property
    def batch_size(self) -> int:
        """Number of requests ``bs``."""
        return int(self.q_lens.shape[0])

    @property
    def total_q(self) -> int:
        """Draft tokens over all requests."""
        return int(self.qo_indptr[-1])

    @property
    def max_q(self) -> int:
        """Largest draft count of one request (0 for an empty batch)."""
        return int(self.q_lens.max()) if self.q_lens.size else 0


def make_metadata(
    prefix_lens: object,
    q_lens: object,
    num_slots: int,
    rng: np.random.Generator,
    mask_format: "MaskFormat | str" = MaskFormat.FULL,
) -> VerifyMetadata:
    """Random SGLang-style metadata: slots drawn from a shuffled KV pool.

    A random permutation of ``range(num_slots)`` is taken; its first
    ``sum(prefix_lens)`` entries become the prefixes (request by request), the
    next ``sum(q_lens)`` the draft tokens' ``out_cache_loc``. Prefix and draft
    slots are therefore all distinct, and the pool's remaining slots are unused
    (fill them with NaN to catch out-of-range reads).

    Parameters
    ----------
    prefix_lens : array_like of int
        ``[bs]`` committed prefix length per request (0 allowed).
    q_lens : array_like of int
        ``[bs]`` draft tokens per request (>= 1 each).
    num_slots : int
        Pool size; at least ``sum(prefix_lens) + sum(q_lens)``.
    rng : numpy.random.Generator
    mask_format : MaskFormat or str, default "full"
        Layout that ``mask_indptr`` describes (see :class:`VerifyMetadata`).

    Returns
    -------
    VerifyMetadata

    Raises
    ------
    TypeError
        Non-integer lengths or ``num_slots``; ``rng`` not a numpy Generator.
    ValueError
        Lengths of different sizes, a negative prefix length, a ``q_len < 1``,
        a pool too small for all slots, or a prefix total past int32.
    """
    fmt = parse_mask_format(mask_format)
    rng = _generator(rng)
    p = _lengths("prefix_lens", prefix_lens)
    q = _lengths("q_lens", q_lens)
    if p.shape != q.shape:
        raise ValueError(f"prefix_lens and q_lens must have the same length, got {p.shape[0]} and {q.shape[0]}")
    if q.size and q.min() < 1:
        raise ValueError(f"q_lens must be >= 1, got {q.tolist()}")
    n_slots = _count("num_slots", num_slots, 1)
    total_p = sum(int(v) for v in p.tolist())  # (Python ints: never wrapped)
    total_q = sum(int(v) for v in q.tolist())
    if total_p + total_q > n_slots:
        raise ValueError(
            f"num_slots must be >= sum(prefix_lens) + sum(q_lens) = {total_p + total_q}, got {n_slots}"
        )
    if total_p > np.iinfo(np.int32).max:
        raise ValueError(f"sum(prefix_lens) = {total_p} does not fit kv_indptr's int32")
    perm = rng.permutation(n_slots).astype(np.int64)
    kv_indptr = _indptr(p)
    if fmt is MaskFormat.QLEN_ONLY:
        mask_indptr = mask_indptr_for(p, q, MaskFormat.QLEN_ONLY)
    else:
        mask_indptr = mask_indptr_for(p, q, MaskFormat.FULL)
    return VerifyMetadata(
        prefix_lens=p,
        q_lens=q,
        qo_indptr=_indptr(q),
        kv_indptr=kv_indptr.astype(np.int32),
        kv_indices=np.ascontiguousarray(perm[:total_p]),
        out_cache_loc=np.ascontiguousarray(perm[total_p:total_p + total_q]),
        mask_indptr=mask_indptr,
        num_slots=n_slots,
        mask_format=fmt,
    )
