"""Numpy reference of DDTree's tree build, tree compile, greedy accept and KV commit.

DDTree (Ringel & Romano 2026, arXiv 2604.12989) turns the drafter's per-depth
distributions into a draft tree by best-first search, verifies the whole tree in
one target forward, and keeps the longest path the target agrees with. This
module is the host-side definition the GPU kernels of ``cu/ddtree.cu`` are
checked against, node for node and bit for bit.

Tree build (per request)
------------------------
Inputs: the drafter's logits ``[depth_limit, vocab]`` (row ``d`` is depth
``d + 1``), the root token (node 0) and a ``budget`` = the most nodes *besides*
the root. ``K = min(budget, vocab)``.

1. Per depth row, the top-``K`` tokens by logit, descending; equal logits are
   ordered by the lower token id first (torch.topk leaves ties unspecified; this
   is our definition). Log-probabilities ``lp = logit - lse`` in float32, where
   ``lse`` is the row's log-sum-exp rounded to float32 (:func:`topk_logprobs`).
   Non-finite logits follow the package's one rule (below): NaN counts as -inf,
   so ids stay distinct and in range; a log-prob that is -inf or NaN becomes
   :data:`LP_FLOOR`, and a row whose maximum is not finite has every log-prob
   at the floor.
2. Best-first search with Python's ``heapq`` exactly as the reference does it.
   Heap entries are ``(-logw, ranks, parent, depth, rank, logw)``; ``logw`` is a
   Python float (float64) summed from the float32 ``lp``; ``ranks`` is the tuple
   of ranks along the path, which breaks ties in ``-logw`` lexicographically
   (a prefix before its extensions). The first entry is
   ``(lp[0][0], (0,), parent 0, depth 1, rank 0)``. While the heap is not empty
   and fewer than ``budget`` nodes were taken: pop; the popped entry becomes
   node ``n = taken + 1`` with token ``top_ids[depth-1][rank]``; push its next
   sibling when ``rank + 1 < K`` with
   ``logw - lp[depth-1][rank] + lp[depth-1][rank+1]`` (left to right, float64)
   and ranks ``ranks[:-1] + (rank+1,)``; push its first child when
   ``depth < depth_limit`` with ``logw + lp[depth][0]``, ranks ``ranks + (0,)``
   and parent ``n``.
3. Node ``i`` sees itself and its ancestors; the root sees itself. Visibility is
   kept as uint32 words per node: bit ``j`` of word ``w`` is node ``32*w + j``,
   ``n_words = ceil((budget + 1) / 32)``.

Tree compile, slots and the free-slot pool
------------------------------------------
The root is the last committed token: its KV is *not* yet in the cache (the
reference verifies it with the tree; its past length excludes it). So every
node, the root included, gets a fresh cache slot, and the root sits at position
``committed_len`` (the number of tokens whose KV is cached); node ``i`` at
``committed_len + depth[i]``.

Slots come from a **free-slot pool**: a stack ``slots`` (int64
``[capacity]``) whose first ``count`` entries are free slot ids, and ``count``
(an int64 scalar on the device). Compile takes the top ``T = sum(q_len)``
entries without changing ``count``: ``alloc_base = count - T``, and node ``i``
of request ``b`` gets ``slots[alloc_base + qo_indptr[b] + i]``. Commit pushes
the rejected slots back starting at ``alloc_base`` (request by request, node by
node) and sets ``count = alloc_base + rejected``. Between compile and commit
nobody else may use the pool. If ``T > count`` compile sets
:data:`STATUS_POOL_EXHAUSTED`, hands out slot ``-1`` everywhere, and commit then
changes nothing.

Non-finite values: one rule for every argmax and top-K
------------------------------------------------------
NaN counts as -inf. An argmax is the first index of the row's maximum; a row with
no value above -inf (all NaN / -inf) gives id 0 and is *not finite*. A top-K keeps
``K`` distinct ids by (value desc, id asc). Ids are always in ``[0, vocab)``.

* Accept: a not-finite target row (or a target token outside ``[0, vocab)``)
  has posterior 0 but matches no child; when the walk ends at such a node there
  is no bonus token, the request finishes with ``finished =``
  :data:`FINISH_NONFINITE` and :data:`STATUS_NONFINITE` is set. Rows the walk
  does not end at have no influence. A context cut comes first: when the walk
  does not fit, the kept nodes stop before that row, and the request finishes
  with :data:`FINISH_DONE` and :data:`STATUS_CONTEXT_FULL` alone.
* Build: a drafter row whose maximum is not finite sets
  :data:`STATUS_NONFINITE` (in the step's status; the tree is still built,
  from the floor log-probs).

Greedy accept and stop tokens
-----------------------------
``posterior[i]`` is the target's argmax at node ``i`` (the first index of the
maximum). From ``cur = 0``: while some child ``j`` of ``cur`` has
``token[j] == posterior[cur]`` (sibling tokens are distinct, so at most one),
step to it and accept it. Then the bonus token is ``posterior[cur]``.

* The root is always accepted for an active request; an inactive request
  accepts nothing (count 0, no bonus) and keeps its state.
* **Stop tokens.** When a newly accepted node's token is a stop token of its
  request, acceptance ends right after it, no bonus token is produced, and the
  request finishes. If the bonus token itself is a stop token it is still
  emitted and the request finishes. A finished request becomes inactive.
* **Context room.** At most ``max_context - committed_len`` nodes can be
  committed (the root included). A longer accepted path is cut to that length,
  the request finishes without a bonus, and :data:`STATUS_CONTEXT_FULL` is set.
* Emitted tokens = the accepted non-root tokens, then the bonus if any. For an
  active request that stays active, the bonus becomes the next root token.

Commit
------
Paged (primary): append the accepted nodes' slots to the request's row of
``req_to_token`` at positions ``committed_len ..``, advance ``committed_len`` by
the accepted count, return every other slot of the request to the pool. No KV
moves. Dense: in a cache with a contiguous window per request, move the rows of
the accepted nodes (at ``committed_len + node``) to the front of the window
(``committed_len + i``), then advance ``committed_len``. A node whose row
``committed_len + node`` lies at or past the window has no KV there: the path is
cut before it, the accepted count becomes the nodes kept, the request finishes
and :data:`STATUS_CONTEXT_FULL` is set.
"""

from __future__ import annotations

import dataclasses
import heapq

import numpy as np

# The status bits, finish codes, record layout and mask_words are the package's shared constants
# (driverlevel._constants, also compiled into the kernels); re-exported here under the same names.
from driverlevel._constants import (
    FINISH_DONE,
    FINISH_NONFINITE,
    LP_FLOOR,
    RECORD_HEADER,
    STATUS_CONTEXT_FULL,
    STATUS_KV_CAPACITY,
    STATUS_MASK_CAPACITY,
    STATUS_NONFINITE,
    STATUS_POOL_EXHAUSTED,
    mask_words,
)
from driverlevel._checks import need_shape
from driverlevel._mask import BITMASK_WORD_BITS
from driverlevel.reference.attention import _float_input, bf16_to_f32
from driverlevel.reference.trees import _count, _int_array, ancestor_visibility

__all__ = [
    "STATUS_POOL_EXHAUSTED",
    "STATUS_CONTEXT_FULL",
    "STATUS_KV_CAPACITY",
    "STATUS_MASK_CAPACITY",
    "STATUS_NONFINITE",
    "FINISH_DONE",
    "FINISH_NONFINITE",
    "LP_FLOOR",
    "RECORD_HEADER",
    "row_argmax",
    "mask_words",
    "topk_logprobs",
    "Tree",
    "TreeBatch",
    "build_tree_from_topk",
    "build_tree",
    "ancestor_masks",
    "SlotPool",
    "CompiledStep",
    "compile_tree",
    "AcceptResult",
    "greedy_accept",
    "accept_records",
    "commit_paged",
    "commit_dense",
]

# --------------------------------------------------------------------------- top-K


def _logits_input(name: str, x: object) -> np.ndarray:
    """Logits as float32: a float array converted, bf16 (``ml_dtypes.bfloat16``, or uint16 bit
    patterns as :meth:`DeviceArray.to_numpy` returns them) widened exactly; TypeError for any other
    dtype (integers are not read as values: uint16 would be bf16 bits). A float64 beyond float32's
    range becomes +-inf (as the conversion rounds), without numpy's overflow warning."""
    arr = _float_input(name, x)
    if arr.dtype == np.uint16:
        return bf16_to_f32(arr)
    with np.errstate(over="ignore"):
        return arr.astype(np.float32)


def row_argmax(x: object) -> tuple[np.ndarray, np.ndarray]:
    """The package's argmax rule: ``(ids, finite)`` of every row of ``x`` ``[rows, vocab]``.

    NaN counts as -inf; ``ids`` is the first index of each row's maximum, 0 for a row with no
    value above -inf, where ``finite`` is False. ``x`` is float (compared as float32), or bf16:
    an ``ml_dtypes.bfloat16`` array or uint16 bit patterns (as a bf16 :class:`DeviceArray`'s
    ``to_numpy()`` returns them), widened exactly.

    Raises
    ------
    TypeError
        ``x`` has another dtype (an integer other than uint16, bool...):
        ``"x must be a float array, an ml_dtypes.bfloat16 array or uint16 bf16 bit patterns, got dtype int64"``.
    ValueError
        ``x`` is not 2-D ``[rows, vocab]`` with ``vocab >= 1``:
        ``"x must be [rows, vocab] with vocab >= 1, got shape (5,)"``.
    """
    x = _logits_input("x", x)
    if x.ndim != 2 or x.shape[1] < 1:
        raise ValueError(f"x must be [rows, vocab] with vocab >= 1, got shape {x.shape}")
    x = np.where(np.isnan(x), np.float32(-np.inf), x)
    finite = (x > -np.inf).any(axis=1)
    ids = np.where(finite, np.argmax(x, axis=1), 0).astype(np.int32)
    return ids, finite


def _topk_k(k: object, vocab: int) -> int:
    """``k`` of a top-K over ``vocab`` tokens as an int in ``[1, vocab]``, or TypeError / ValueError naming it."""
    k = _count("k", k, -np.iinfo(np.int64).max)  # the type; the range below, with the vocabulary
    if not 1 <= k <= vocab:
        raise ValueError(f"k must be in [1, vocab={vocab}], got {k}")
    return k


def topk_logprobs(logits: object, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Top-``k`` tokens and their log-probabilities for every depth row.

    Parameters
    ----------
    logits : array_like of float
        ``[depth_limit, vocab]`` drafter logits: float32 (other floats are converted to float32),
        or bf16 as an ``ml_dtypes.bfloat16`` array or uint16 bit patterns (as a bf16
        :class:`DeviceArray`'s ``to_numpy()`` returns them), widened exactly. NaN counts as -inf.
    k : int
        ``1 <= k <= vocab``.

    Returns
    -------
    ids : numpy.ndarray
        int32 ``[depth_limit, k]``, by logit descending, equal logits by lower id.
    lp : numpy.ndarray
        float32 ``[depth_limit, k]``: ``max(float32(logit - lse), LP_FLOOR)`` (a float32
        subtraction; -inf and NaN become :data:`LP_FLOOR`).
    lse : numpy.ndarray
        float32 ``[depth_limit]``: ``m + log(sum(exp(x - m)))`` computed in float64
        (``m`` the row maximum), rounded to float32; NaN where ``m`` is not finite (every
        log-prob of that row is then :data:`LP_FLOOR`).

    Raises
    ------
    TypeError
        ``k`` not an int (bool and floats included, even when integral), or ``logits`` of
        another dtype than float, ``ml_dtypes.bfloat16`` or uint16 (integer logits are refused,
        not read as values).
    ValueError
        Not 2-D or ``k`` out of range.
    """
    x = _logits_input("logits", logits)
    if x.ndim != 2:
        raise ValueError(f"logits must be [depth_limit, vocab], got shape {x.shape}")
    k = _topk_k(k, x.shape[1])
    x = np.where(np.isnan(x), np.float32(-np.inf), x)  # NaN counts as -inf
    x = x + np.float32(0.0)  # -0.0 -> +0.0, so that equal values are ordered by id only
    order = np.argsort(-x, axis=1, kind="stable")[:, :k]  # stable: equal logits keep id order
    x64 = x.astype(np.float64)
    m = x64.max(axis=1, keepdims=True)
    finite = np.isfinite(m[:, 0])
    safe_m = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        lse = (m[:, 0] + np.log(np.exp(x64 - safe_m).sum(axis=1))).astype(np.float32)
        lse = np.where(finite, lse, np.float32(np.nan)).astype(np.float32)
        top = np.take_along_axis(x, order, axis=1)
        lp = (top - lse[:, None]).astype(np.float32)
    lp = np.fmax(lp, np.float32(LP_FLOOR)).astype(np.float32)  # fmax: NaN -> the floor
    return order.astype(np.int32), lp, lse


# --------------------------------------------------------------------------- tree build


@dataclasses.dataclass(frozen=True)
class Tree:
    """One request's draft tree, nodes in pop order (root first).

    Attributes
    ----------
    tokens, depths, parents, ranks : numpy.ndarray
        int32 ``[n]``; the root has depth 0, parent -1 and rank -1.
    keys : numpy.ndarray
        float64 ``[n]``: each node's path log-probability ``logw`` (root 0.0).
    """

    tokens: np.ndarray
    depths: np.ndarray
    parents: np.ndarray
    ranks: np.ndarray
    keys: np.ndarray

    @property
    def num_nodes(self) -> int:
        return int(self.tokens.shape[0])


def _int32_value(name: str, v: int) -> int:
    """``v`` if it fits int32 (the kernels' token and root arrays), else a ValueError naming ``name``."""
    if not np.iinfo(np.int32).min <= v <= np.iinfo(np.int32).max:
        raise ValueError(f"{name} must fit int32 (the device arrays' type), got {v}")
    return v


def _int32_values(name: str, a: np.ndarray) -> np.ndarray:
    """``a`` (int64) if every value fits int32, else a ValueError naming ``name`` and the first offender."""
    bad = (a < np.iinfo(np.int32).min) | (a > np.iinfo(np.int32).max)
    if np.any(bad):
        raise ValueError(f"{name} must fit int32 (the device arrays' type), got {int(a[bad].flat[0])}")
    return a


def _need_type(name: str, value: object, cls: type, hint: str = "") -> None:
    """A TypeError naming ``name`` unless ``value`` is a ``cls`` (the references' result classes, read
    by attribute: another object failed later with a bare AttributeError)."""
    if not isinstance(value, cls):
        article = "an" if cls.__name__[0] in "AEIOU" else "a"
        raise TypeError(f"{name} must be {article} {cls.__name__}{f' ({hint})' if hint else ''}, got {type(value).__name__}")


def build_tree_from_topk(root_token: int, top_ids: object, top_lp: object, budget: int) -> Tree:
    """Best-first tree build from per-depth top-K lists, with ``heapq`` as the reference.

    Parameters
    ----------
    root_token : int
        A Python or numpy integer in the int32 range (bool, floats and strings refused, never
        truncated or parsed).
    top_ids : array_like of int
        ``[depth_limit, K']`` token ids by rank (an integer dtype, as ``build_tree``'s ``root_tokens``),
        in the int32 range.
    top_lp : array_like of float
        float ``[depth_limit, K']`` log-probabilities by rank (non-increasing), the shape of ``top_ids``,
        read as float32; NaN and values below :data:`LP_FLOOR` (-inf) become ``LP_FLOOR``, the
        package's rule (:func:`topk_logprobs`, the kernels), so that the heap's keys stay ordered.
    budget : int
        Most nodes besides the root (>= 0). ``K = min(budget, K')`` ranks are used per depth.

    Returns
    -------
    Tree

    Raises
    ------
    TypeError
        ``budget`` or ``root_token`` not an int (bool and floats refused, never truncated),
        ``top_ids`` not of an integer dtype (``"top_ids must be integers, got dtype float64"``), or
        ``top_lp`` not of a float dtype.
    ValueError
        ``budget`` < 0, ``root_token`` or a ``top_ids`` entry outside the int32 range, a negative
        or repeated token among a depth's first ``K`` ids (siblings would share a token), a ``top_lp``
        of +inf (the order of each row is the caller's: not checked), or ``top_ids`` and ``top_lp``
        are not 2-D of one shape:
        ``"top_ids and top_lp must be [depth_limit, K] of one shape, got top_ids (2, 2) and top_lp (3, 2)"``.
    """
    budget = _count("budget", budget, 0)
    root = _int32_value("root_token", _count("root_token", root_token, -np.iinfo(np.int64).max))
    ids = _int32_values("top_ids", _int_array("top_ids", top_ids, "integers"))
    lp_in = np.asarray(top_lp)
    if lp_in.dtype.kind != "f" and not (lp_in.size == 0 and isinstance(top_lp, (list, tuple))):
        raise TypeError(f"top_lp must be floats, got dtype {lp_in.dtype}")
    lp_arr = np.fmax(lp_in.astype(np.float32), np.float32(LP_FLOOR))  # NaN and -inf: the floor
    if ids.ndim != 2 or ids.shape != lp_arr.shape:
        raise ValueError(f"top_ids and top_lp must be [depth_limit, K] of one shape, got top_ids {ids.shape} "
                         f"and top_lp {lp_arr.shape}")
    depth_limit = ids.shape[0]
    k = min(budget, ids.shape[1])
    if np.any(np.isposinf(lp_arr)):  # (an inf - inf sibling key would be NaN)
        raise ValueError("top_lp must be finite, NaN or -inf: +inf is no log-probability")
    used = ids[:, :k]
    if np.any(used < 0):  # (a top-K's ids are tokens: siblings of one node are its depth's ranks)
        d, r = (int(v[0]) for v in np.nonzero(used < 0))
        raise ValueError(f"top_ids must be token ids >= 0, got {int(used[d, r])} at depth {d + 1}, rank {r}")
    for d in range(used.shape[0]):
        rep = _first_repeat(used[d])
        if rep is not None:
            raise ValueError(f"top_ids must be distinct within a depth (a node's children are its ranks: no two "
                             f"siblings share a token), got token {rep[0]} {rep[1]} times at depth {d + 1}")
    lp = [[float(v) for v in row[:k]] for row in lp_arr]
    tokens, depths, parents, ranks, keys = [root], [0], [-1], [-1], [0.0]
    heap = []
    if k > 0 and depth_limit > 0:
        heap.append((-lp[0][0], (0,), 0, 1, 0, lp[0][0]))
    while heap and len(tokens) - 1 < budget:
        _, path, parent, depth, rank, logw = heapq.heappop(heap)
        node = len(tokens)
        tokens.append(int(ids[depth - 1][rank]))
        depths.append(depth)
        parents.append(parent)
        ranks.append(rank)
        keys.append(logw)
        if rank + 1 < k:
            sib = logw - lp[depth - 1][rank] + lp[depth - 1][rank + 1]
            heapq.heappush(heap, (-sib, path[:-1] + (rank + 1,), parent, depth, rank + 1, sib))
        if depth < depth_limit:
            child = logw + lp[depth][0]
            heapq.heappush(heap, (-child, path + (0,), node, depth + 1, 0, child))
    i32 = lambda v: np.asarray(v, dtype=np.int32)  # noqa: E731
    return Tree(i32(tokens), i32(depths), i32(parents), i32(ranks), np.asarray(keys, dtype=np.float64))


def ancestor_masks(parents: object, n_words: int) -> np.ndarray:
    """Ancestor-and-self bitmask words of a tree.

    Parameters
    ----------
    parents : array_like of int
        ``[n]`` with ``parents[0] == -1`` and ``parents[i] < i``.
    n_words : int
        Words per node (``>= ceil(n / 32)``).

    Returns
    -------
    numpy.ndarray
        uint32 ``[n, n_words]``; bit ``j`` of word ``w`` of row ``i`` is set iff node
        ``32*w + j`` is ``i`` or an ancestor of ``i``.

    Raises
    ------
    TypeError
        ``parents`` not integers (floats are not truncated) or ``n_words`` not an int.
    ValueError
        ``n_words`` < 1, too few words for the nodes, or ``parents`` not a tree (as
        :func:`~driverlevel.reference.trees.ancestor_visibility`).
    """
    n_words = _count("n_words", n_words, 1)
    vis = ancestor_visibility(_int_array("parents", parents, "integers"))
    n = vis.shape[0]
    if n > n_words * BITMASK_WORD_BITS:
        raise ValueError(f"{n} nodes need more than n_words={n_words} words")
    wide = np.zeros((n, n_words * BITMASK_WORD_BITS), dtype=np.uint64)
    wide[:, :n] = vis
    weights = np.left_shift(np.uint64(1), np.arange(BITMASK_WORD_BITS, dtype=np.uint64))
    return (wide.reshape(n, n_words, BITMASK_WORD_BITS) * weights).sum(axis=2).astype(np.uint32)


@dataclasses.dataclass
class TreeBatch:
    """Draft trees of a batch, padded to the plan's maxima (what the GPU writes).

    Attributes
    ----------
    tokens, depths, parents : numpy.ndarray
        int32 ``[bs, budget + 1]``; entries at or past ``node_counts[b]`` are -1.
    node_counts : numpy.ndarray
        int32 ``[bs]``: nodes of request ``b``, root included; 0 when inactive.
    masks : numpy.ndarray
        uint32 ``[bs, budget + 1, n_words]`` ancestor bitmasks (0 past the count).
    top_ids, top_lp : numpy.ndarray
        int32 / float32 ``[bs, depth_limit, K]`` (zeros for inactive requests).
    budget : int
        The plan's budget (row width minus one).
    """

    tokens: np.ndarray
    depths: np.ndarray
    parents: np.ndarray
    node_counts: np.ndarray
    masks: np.ndarray
    top_ids: np.ndarray
    top_lp: np.ndarray
    budget: int

    def tree(self, b: int) -> Tree:
        """Request ``b``'s tree, unpadded (ranks and keys are not kept: -1 and NaN).

        TypeError for a ``b`` that is not an int, IndexError outside ``[0, bs)`` (no negative
        index from the end: a request is named by its slot)."""
        bs = self.node_counts.shape[0]
        if isinstance(b, bool) or not isinstance(b, (int, np.integer)):
            raise TypeError(f"b must be an int, got {type(b).__name__}")
        if not 0 <= b < bs:
            raise IndexError(f"b must be in [0, {bs}) (the batch's requests), got {b}")
        n = int(self.node_counts[b])
        return Tree(self.tokens[b, :n].copy(), self.depths[b, :n].copy(), self.parents[b, :n].copy(),
                    np.full(n, -1, np.int32), np.full(n, np.nan))


def build_tree(root_tokens: object, logits: object, budget: int, budgets: object = None,
               active: object = None, top: tuple | None = None) -> TreeBatch:
    """Tree build for a batch of requests.

    Parameters
    ----------
    root_tokens : array_like of int
        ``[bs]``.
    logits : array_like of float or None
        ``[bs, depth_limit, vocab]``: float (converted to float32), or bf16 as an
        ``ml_dtypes.bfloat16`` array or uint16 bit patterns (see :func:`topk_logprobs`).
        May be None when ``top`` is given; when given with ``top``, only its shape is used
        (``vocab``, so ``K``), checked as without ``top``.
    budget : int
        The plan's budget (>= 0): the arrays' width is ``budget + 1``, and
        ``K = min(budget, vocab)`` tokens are kept per depth (``min(budget, K')`` for a ``top``
        of last dimension ``K'`` without ``logits``).
    budgets : array_like of int, optional
        ``[bs]`` per-request budgets, each clamped to ``[0, budget]`` (default: ``budget``).
    active : array_like of bool, optional
        ``[bs]``; inactive requests get no nodes (default: all active).
    top : (ids, lp), optional
        Precomputed top-K per request ``[bs, depth_limit, >= K]`` to build from
        instead of ``logits`` (e.g. the GPU's, to check the heap on its own); with ``logits``
        given, ``depth_limit`` must be theirs and the last dimension at least
        ``K = min(budget, vocab)``.

    Returns
    -------
    TreeBatch

    Raises
    ------
    ValueError
        If ``budget`` is negative, ``root_tokens`` is not one-dimensional, ``logits`` (or
        ``top``'s arrays) is not ``[bs, depth_limit, vocab]`` with the roots' ``bs``, ``top`` is
        not a pair, ``top`` given with ``logits`` has another ``depth_limit`` or a last dimension
        below ``K = min(budget, vocab)``, or ``budgets`` / ``active`` is not ``[bs]``.
    TypeError
        If ``budget`` is not an int (bool and floats refused, never truncated), or
        ``root_tokens`` / ``budgets`` are not integers, ``active`` not bools or integers
        (a string is not a flag), ``logits`` not float, ``ml_dtypes.bfloat16`` or uint16 bf16
        bits (see :func:`topk_logprobs`), or ``top``'s ids not integers or its log-probs not floats.
    """
    roots = np.asarray(root_tokens)
    if roots.ndim != 1:
        raise ValueError(f"root_tokens must be one-dimensional [bs], got shape {roots.shape}")
    roots = _int_array("root_tokens", root_tokens, "integers")
    bs = roots.shape[0]
    budget = _count("budget", budget, 0)
    vocab = None
    if top is None or logits is not None:
        x = _logits_input("logits", logits)
        if x.ndim != 3 or x.shape[0] != bs or 0 in x.shape[1:]:
            raise ValueError(f"logits must be [bs={bs}, depth_limit, vocab] with depth_limit, vocab >= 1, "
                             f"got shape {x.shape}")
        depth_limit, vocab = x.shape[1], x.shape[2]
    if top is not None:
        if not isinstance(top, (tuple, list)) or len(top) != 2:
            n = f" of {len(top)}" if isinstance(top, (tuple, list)) else ""
            raise ValueError(f"top must be (ids, lp), a pair of [bs={bs}, depth_limit, >= K] arrays, got a "
                             f"{type(top).__name__}{n}")
        if np.ndim(top[0]) != 3 or np.shape(top[0])[0] != bs or np.shape(top[1]) != np.shape(top[0]):
            raise ValueError(f"top must be (ids, lp), each [bs={bs}, depth_limit, >= K], got shapes "
                             f"{np.shape(top[0])} and {np.shape(top[1])}")
        if np.asarray(top[1]).dtype.kind != "f":  # (as build_tree_from_topk refuses them: never converted)
            raise TypeError(f"top's log-probs must be floats, got dtype {np.asarray(top[1]).dtype}")
        _int_array("top's ids", top[0], "integers")
        if vocab is not None and (np.shape(top[0])[1] != depth_limit or np.shape(top[0])[2] < min(budget, vocab)):
            raise ValueError(f"top must be [bs={bs}, depth_limit={depth_limit}, >= K={min(budget, vocab)}] "
                             f"(K = min(budget, vocab) of logits {x.shape}), got shape {np.shape(top[0])}")
        depth_limit = np.shape(top[0])[1]
    k = min(budget, vocab) if vocab is not None else min(budget, np.shape(top[0])[2])
    per = np.full(bs, budget, np.int64) if budgets is None else np.clip(_per_request("budgets", budgets, bs), 0, budget)
    act = np.ones(bs, bool) if active is None else _per_request_flags("active", active, bs)
    words = mask_words(budget)
    out = TreeBatch(
        tokens=np.full((bs, budget + 1), -1, np.int32), depths=np.full((bs, budget + 1), -1, np.int32),
        parents=np.full((bs, budget + 1), -1, np.int32), node_counts=np.zeros(bs, np.int32),
        masks=np.zeros((bs, budget + 1, words), np.uint32),
        top_ids=np.zeros((bs, depth_limit, k), np.int32), top_lp=np.zeros((bs, depth_limit, k), np.float32),
        budget=budget)
    for b in range(bs):
        if not act[b]:
            continue
        if top is None:
            ids, lp, _ = topk_logprobs(x[b], max(k, 1))
            ids, lp = ids[:, :k], lp[:, :k]
        else:
            ids, lp = np.asarray(top[0][b])[:, :k], np.asarray(top[1][b], dtype=np.float32)[:, :k]
        out.top_ids[b], out.top_lp[b] = ids, lp
        t = build_tree_from_topk(int(roots[b]), ids, lp, int(per[b]))
        n = t.num_nodes
        out.tokens[b, :n], out.depths[b, :n], out.parents[b, :n] = t.tokens, t.depths, t.parents
        out.node_counts[b] = n
        out.masks[b, :n] = ancestor_masks(t.parents, words)
    return out


# --------------------------------------------------------------------------- compile


@dataclasses.dataclass
class SlotPool:
    """The free-slot pool: a stack of free KV slot ids and its count.

    Attributes
    ----------
    slots : numpy.ndarray
        int64 ``[capacity]``; ``slots[:count]`` are the free slots, the top at ``count - 1``: distinct
        and >= 0 (-1 is the kernels' "pool exhausted"); the entries past ``count`` are not read.
    count : int
        ``0 <= count <= capacity``.

    Raises
    ------
    ValueError
        ``slots`` not one-dimensional, ``count`` outside ``0..capacity``, or a free slot negative or
        repeated (two nodes would share one KV slot). :func:`compile_tree` checks the same again,
        as ``count`` and ``slots`` may have changed since.
    TypeError
        ``slots`` or ``count`` not integers (floats are not truncated; bool refused).
    """

    slots: np.ndarray
    count: int

    def __post_init__(self):
        n = np.shape(self.slots)[0] if np.ndim(self.slots) == 1 else None
        if n is None:
            raise ValueError(f"slots must be one-dimensional, got shape {np.shape(self.slots)}")
        slots = _int_array("slots", self.slots, "integers")  # (floats are not truncated)
        if not isinstance(self.slots, np.ndarray):  # a list or tuple: as the int64 array the docstring
            self.slots = slots                        # names (an array given stays the same object)
        self.count = _count("count", self.count, 0)  # (bool, floats and strings refused)
        self.check()

    def check(self) -> None:
        """ValueError unless ``count`` is in ``0..capacity`` and the free slots ``slots[:count]`` are
        distinct and >= 0 (see the class's Raises)."""
        n = np.shape(self.slots)[0]
        if not isinstance(self.count, (int, np.integer)) or isinstance(self.count, bool) or not 0 <= self.count <= n:
            raise ValueError(f"count must be in 0..{n} (the stack's capacity), got {self.count!r}")
        free = np.asarray(self.slots[:self.count]).astype(np.int64)
        if np.any(free < 0):
            raise ValueError(f"the free slots (slots[:count]) must be >= 0 (-1 means an exhausted pool), got "
                             f"{int(free[free < 0][0])} at {int(np.flatnonzero(free < 0)[0])}")
        rep = _first_repeat(free)
        if rep is not None:
            raise ValueError(f"the free slots (slots[:count]) must be distinct, got slot {rep[0]} {rep[1]} times")

    def free_set(self) -> set:
        return set(int(s) for s in self.slots[: self.count])


@dataclasses.dataclass
class CompiledStep:
    """Verify inputs and metadata of one step (SGLang layouts, native dtypes).

    Attributes
    ----------
    q_lens, prefix_lens : int64 ``[bs]``
        Draft tokens (= nodes) and cached prefix length per request (0 when inactive).
    input_ids : int32 ``[total_q]``
        Node tokens, root first, request by request.
    positions : int64 ``[total_q]``
        ``committed_len + depth``.
    out_cache_loc : int64 ``[total_q]``
        Fresh slot per node (-1 when the pool was exhausted).
    qo_indptr : int64 ``[bs + 1]``; kv_indptr : int32 ``[bs + 1]``; kv_indices : int64 ``[sum(prefix)]``
    bitmask : uint32 ``[total_q, n_words]``
        Ancestor bitmask per draft token (driverlevel's packed mask).
    full_mask, full_indptr, qlen_mask, qlen_indptr :
        SGLang FULL (``q × (prefix + q)`` per request, prefix columns all ones) and
        QLEN_ONLY (``q × q``) uint8 masks with their int64 ``[bs + 1]`` indptrs.
    alloc_base, alloc_total : int
        Where the step's slots start in the pool stack, and how many.
    status : int
        ``STATUS_*`` bits.
    """

    q_lens: np.ndarray
    prefix_lens: np.ndarray
    input_ids: np.ndarray
    positions: np.ndarray
    out_cache_loc: np.ndarray
    qo_indptr: np.ndarray
    kv_indptr: np.ndarray
    kv_indices: np.ndarray
    bitmask: np.ndarray
    full_mask: np.ndarray
    full_indptr: np.ndarray
    qlen_mask: np.ndarray
    qlen_indptr: np.ndarray
    alloc_base: int
    alloc_total: int
    status: int


def _indptr(sizes: np.ndarray, dtype=np.int64) -> np.ndarray:
    out = np.zeros(sizes.shape[0] + 1, dtype=np.int64)
    np.cumsum(sizes, out=out[1:])
    return out.astype(dtype)


def _in_place_ints(name: str, a: object, ndim: int) -> np.ndarray:
    """``a`` itself if it is a numpy integer array of ``ndim`` dimensions (the caller updates it in
    place), else a TypeError naming ``name``."""
    if not isinstance(a, np.ndarray) or a.dtype.kind not in "iu" or a.ndim != ndim:
        what = f"{type(a).__name__}" if not isinstance(a, np.ndarray) else f"{a.ndim}-D {a.dtype}"
        raise TypeError(f"{name} must be a {ndim}-D numpy integer array (updated in place), got {what}")
    return a


def _need_fits(name: str, a: np.ndarray, new: list) -> None:
    """A ValueError naming ``name`` unless every value of ``new`` (Python ints, the values a commit
    will store in ``a``) fits ``a``'s dtype: a narrow in-place array (uint8, int8...) would overflow
    part-way through the commit."""
    hi = int(np.iinfo(a.dtype).max)
    bad = [b for b, v in enumerate(new) if v > hi]
    if bad:
        raise ValueError(f"{name} + accepted counts must fit {name}'s dtype {a.dtype} (at most {hi}), got "
                         f"{new[bad[0]]} for request {bad[0]}: pass a wider {name} (int32 or int64)")


def _per_request(name: str, value: object, bs: int) -> np.ndarray:
    """``value`` as an int64 ``[bs]`` array, or ``ValueError`` naming it (:func:`driverlevel._checks.need_shape`);
    ``TypeError`` for values that are not integers (floats are not truncated, strings not parsed)."""
    a = np.asarray(value)
    need_shape(name, a, (bs,))
    return _int_array(name, value, "integers")


def _per_request_flags(name: str, value: object, bs: int) -> np.ndarray:
    """``value`` as a bool ``[bs]`` array (nonzero is True, as the kernels read a flag), or ``ValueError``
    naming it for another shape; ``TypeError`` for values that are neither bools nor integers."""
    a = np.asarray(value)
    need_shape(name, a, (bs,))
    if a.dtype.kind not in "biu":
        raise TypeError(f"{name} must be bools or integers, got dtype {a.dtype}")
    return a.astype(bool)


def _first_repeat(a: np.ndarray) -> tuple[int, int] | None:
    """``(value, times)`` of the smallest value ``a`` holds more than once, or None if its values are distinct."""
    values, counts = np.unique(a, return_counts=True)
    rep = np.flatnonzero(counts > 1)
    return None if rep.size == 0 else (int(values[rep[0]]), int(counts[rep[0]]))


def _need_distinct_rows(rows: np.ndarray, used: np.ndarray, what: str) -> None:
    """A ValueError unless the ``req_pool_indices`` of the requests with ``used`` set are distinct: two
    requests on one ``req_to_token`` row would write each other's entries (the kernels do not check
    it; in SGLang every running request owns its row)."""
    rep = _first_repeat(rows[used])
    if rep is not None:
        row = rep[0]
        raise ValueError(f"req_pool_indices must be distinct for requests with {what} (each owns its req_to_token "
                         f"row), got row {row} for requests {np.flatnonzero(used & (rows == row)).tolist()}")


def compile_tree(trees: TreeBatch, seq_lens: object, req_pool_indices: object, req_to_token: np.ndarray,
                 pool: SlotPool) -> CompiledStep:
    """Verify inputs, metadata and masks of one step (the pool's count is left unchanged).

    Parameters
    ----------
    trees : TreeBatch
    seq_lens : array_like of int
        ``[bs]`` tokens whose KV is cached (the root's position).
    req_pool_indices : array_like of int
        ``[bs]`` row of ``req_to_token`` of each request.
    req_to_token : numpy.ndarray
        int32/int64 ``[max_reqs, max_context]`` slot id of each cached position.
    pool : SlotPool

    Returns
    -------
    CompiledStep

    Raises
    ------
    ValueError
        For ``seq_lens`` / ``req_pool_indices`` that are not ``[bs]``, a ``req_to_token``
        that is not two-dimensional, or -- for a request with nodes -- a ``seq_lens`` outside
        ``[0, max_context]`` (``max_context`` = ``req_to_token``'s columns; the kernel gives such a
        request no rows and reports it) or a ``req_pool_indices`` outside its rows or shared with
        another request with nodes. Requests without nodes are not checked and take no part. A
        ``pool`` whose ``count`` or free slots are no longer valid (:class:`SlotPool`).
    TypeError
        For ``seq_lens`` / ``req_pool_indices`` / ``req_to_token`` that are not integers, a
        ``req_to_token`` of another integer dtype than int32 or int64 (the kernels' types, as
        :func:`commit_paged`: ``"req_to_token must be int32 or int64 (the kernels' types), got
        dtype int16"``), ``trees`` that is not a :class:`TreeBatch` or ``pool`` not a :class:`SlotPool`.
    """
    _need_type("trees", trees, TreeBatch, "build_tree's result; build_tree_from_topk's Tree is one request")
    _need_type("pool", pool, SlotPool)
    pool.check()  # (count and slots may have changed since the pool was made)
    bs = trees.node_counts.shape[0]
    q = trees.node_counts.astype(np.int64)
    committed = _per_request("seq_lens", seq_lens, bs)
    rows = _per_request("req_pool_indices", req_pool_indices, bs)
    if np.ndim(req_to_token) != 2:
        raise ValueError(f"req_to_token must be [max_reqs, max_context], got shape {np.shape(req_to_token)}")
    r2t_dtype = np.asarray(req_to_token).dtype
    req_to_token = _int_array("req_to_token", req_to_token, "integers")
    if r2t_dtype.kind in "iu" and r2t_dtype not in (np.int32, np.int64):  # (as commit_paged refuses them)
        raise TypeError(f"req_to_token must be int32 or int64 (the kernels' types), got dtype {r2t_dtype}")
    live = q > 0
    if np.any(live & ((committed < 0) | (committed > req_to_token.shape[1]))):
        raise ValueError(f"seq_lens must be in [0, max_context = {req_to_token.shape[1]}] (req_to_token's columns) "
                         f"for requests with nodes, got {committed[live].tolist()}")
    if np.any(live & ((rows < 0) | (rows >= req_to_token.shape[0]))):
        raise ValueError(f"req_pool_indices must be in [0, {req_to_token.shape[0]}) for requests with nodes, "
                         f"got {rows[live].tolist()}")
    _need_distinct_rows(rows, live, "nodes")
    prefix = np.where(q > 0, committed, 0)
    qo = _indptr(q)
    total = int(qo[-1])
    status = 0
    max_context = req_to_token.shape[1]
    if np.any((q > 0) & (committed + q > max_context)):
        status |= STATUS_CONTEXT_FULL
    if total > pool.count:
        status |= STATUS_POOL_EXHAUSTED
        base = pool.count
        loc = np.full(total, -1, np.int64)
    else:
        base = pool.count - total
        loc = pool.slots[base:base + total].astype(np.int64).copy()
    ids = np.concatenate([trees.tokens[b, :q[b]] for b in range(bs)]).astype(np.int32) if total else np.zeros(0, np.int32)
    pos = np.concatenate([committed[b] + trees.depths[b, :q[b]] for b in range(bs)]).astype(np.int64) \
        if total else np.zeros(0, np.int64)
    words = trees.masks.shape[2]
    bitmask = np.concatenate([trees.masks[b, :q[b]] for b in range(bs)]) if total else np.zeros((0, words), np.uint32)
    kv_indices = np.concatenate([req_to_token[rows[b], :prefix[b]] for b in range(bs) if prefix[b] > 0]) \
        .astype(np.int64) if prefix.sum() else np.zeros(0, np.int64)  # (requests with nodes only)
    full, qlen = [], []
    for b in range(bs):
        n = int(q[b])
        if n == 0:
            continue
        vis = ancestor_visibility(trees.parents[b, :n].astype(np.int64)).astype(np.uint8)
        block = np.ones((n, int(prefix[b]) + n), np.uint8)
        block[:, int(prefix[b]):] = vis
        full.append(block.ravel())
        qlen.append(vis.ravel())
    cat = lambda parts: np.concatenate(parts) if parts else np.zeros(0, np.uint8)  # noqa: E731
    return CompiledStep(
        q_lens=q, prefix_lens=prefix, input_ids=ids, positions=pos, out_cache_loc=loc, qo_indptr=qo,
        kv_indptr=_indptr(prefix, np.int32), kv_indices=kv_indices, bitmask=bitmask,
        full_mask=cat(full), full_indptr=_indptr(q * (prefix + q)), qlen_mask=cat(qlen), qlen_indptr=_indptr(q * q),
        alloc_base=int(base), alloc_total=total, status=status)


# --------------------------------------------------------------------------- accept


@dataclasses.dataclass
class AcceptResult:
    """Greedy acceptance of one step.

    Attributes
    ----------
    accepted_nodes : int32 ``[bs, depth_limit + 1]``
        Accepted node indices, root first (-1 past the count).
    accepted_count : int32 ``[bs]``
        Root included; 0 for an inactive request.
    bonus : int32 ``[bs]``
        The target's token after the accepted path, or -1 (none).
    finished : uint8 ``[bs]``
        :data:`FINISH_DONE` (1) when a stop token was emitted or the context is full,
        :data:`FINISH_NONFINITE` (2) when the walk ended at a not-finite target row.
    emitted : int32 ``[bs, depth_limit + 1]``; num_emitted : int32 ``[bs]``
        Tokens produced this step: accepted non-root tokens, then the bonus.
    active : uint8 ``[bs]``
        Active flags after the step (``active and not finished``).
    root_tokens : int32 ``[bs]``
        Next roots: the bonus where the request stays active, else unchanged.
    posterior : int32 ``[total_q]``
        The target's argmax per node (0 for a not-finite row).
    finite : bool ``[total_q]``
        False where the target row had no value above -inf (or the target token was
        outside ``[0, vocab)``).
    status : int
        :data:`STATUS_CONTEXT_FULL` if some acceptance was cut; :data:`STATUS_NONFINITE`
        if some request finished on a not-finite row.
    """

    accepted_nodes: np.ndarray
    accepted_count: np.ndarray
    bonus: np.ndarray
    finished: np.ndarray
    emitted: np.ndarray
    num_emitted: np.ndarray
    active: np.ndarray
    root_tokens: np.ndarray
    posterior: np.ndarray
    status: int
    finite: np.ndarray | None = None


def greedy_accept(trees: TreeBatch, qo_indptr: object, target: object, active: object, seq_lens: object,
                  max_context: int, depth_limit: int, root_tokens: object = None,
                  stop_tokens: object = None, vocab: int | None = None) -> AcceptResult:
    """Temperature-0 acceptance of every request's tree.

    Parameters
    ----------
    trees : TreeBatch
    qo_indptr : array_like of int
        ``[bs + 1]`` rows of request ``b`` in ``target``.
    target : array_like
        ``[total_q, vocab]`` target logits, float or bf16 (``ml_dtypes.bfloat16`` or uint16 bit
        patterns; argmax taken here by :func:`row_argmax`: first index on ties, NaN as -inf), or
        int ``[total_q]`` target tokens.
    active : array_like of bool
        ``[bs]`` active flags at accept time.
    seq_lens : array_like of int
        ``[bs]`` committed lengths, in ``[0, max_context]`` for the active requests with rows
        (limits acceptance to ``max_context - seq_lens`` nodes).
    max_context : int
        ``>= 0``.
    depth_limit : int
        ``>= 0``, at least the depth of every tree node in use: width of the accepted arrays
        is ``depth_limit + 1``.
    root_tokens : array_like of int, optional
        ``[bs]`` current roots (default -1); the result's ``root_tokens`` updates them.
    stop_tokens : array_like of int, optional
        ``[bs, n_stop]`` per-request stop tokens, -1 padded.
    vocab : int, optional
        ``>= 1``. With target tokens: tokens outside ``[0, vocab)`` count as not-finite rows
        (default: only negative tokens do).

    Returns
    -------
    AcceptResult

    Raises
    ------
    ValueError
        For a ``qo_indptr`` that is not ``[bs + 1]`` non-decreasing from 0 with ``bs`` the
        trees' batch, a request whose rows are neither none nor one per node of its tree
        (``node_counts``), a ``target`` with other
        than ``qo_indptr[-1]`` rows, per-request arrays that are not ``[bs]`` (``stop_tokens``:
        ``[bs, n_stop]``), a negative ``max_context`` or ``depth_limit``, or a tree node in use
        deeper than ``depth_limit``, a ``seq_lens`` outside ``[0, max_context]`` for an active
        request with rows, 2-D ``target`` logits with no column, ``root_tokens`` or 1-D
        ``target`` tokens outside the int32 range (the device arrays' type), or ``vocab`` < 1.
    TypeError
        For ``trees`` that is not a :class:`TreeBatch`, ``max_context``, ``depth_limit`` or
        ``vocab`` that are not ints (bool and floats refused, never truncated), ``qo_indptr``,
        ``seq_lens``, ``root_tokens``, ``stop_tokens`` or 1-D ``target`` tokens that are not integers, ``active`` that is neither bools nor integers, or 2-D ``target`` logits
        that are not float, ``ml_dtypes.bfloat16`` or uint16 bf16 bits.
    """
    _need_type("trees", trees, TreeBatch, "build_tree's result; build_tree_from_topk's Tree is one request")
    qo = _int_array("qo_indptr", qo_indptr, "integers")  # (never truncated)
    bs = trees.node_counts.shape[0]
    if qo.shape != (bs + 1,) or qo[0] != 0 or np.any(np.diff(qo) < 0):
        raise ValueError(f"qo_indptr must be [bs + 1 = {bs + 1}] non-decreasing from 0, got {qo.tolist()}")
    if np.any(np.diff(qo) > trees.parents.shape[1]):
        raise ValueError(f"a request has more than the trees' {trees.parents.shape[1]} nodes: qo_indptr {qo.tolist()}")
    rows_of = np.diff(qo)
    off = np.flatnonzero((rows_of != 0) & (rows_of != trees.node_counts.astype(np.int64)))
    if off.size:  # (a request has a row per node of its tree, or none: compile gave it no rows)
        b = int(off[0])
        raise ValueError(f"request {b} has {int(rows_of[b])} rows in qo_indptr but {int(trees.node_counts[b])} tree "
                         f"nodes: each request has one row per node (or none), got qo_indptr {qo.tolist()}")
    depth_limit = _count("depth_limit", depth_limit, 0)
    max_context = _count("max_context", max_context, 0)
    for b in range(bs):  # the accepted arrays are depth_limit + 1 wide: no path may be longer
        n = int(qo[b + 1] - qo[b])
        deepest = int(trees.depths[b, :n].max()) if n else 0
        if deepest > depth_limit:
            raise ValueError(f"request {b}'s tree has a node at depth {deepest}, past depth_limit = {depth_limit}")
    tgt = np.asarray(target)
    if tgt.ndim not in (1, 2) or tgt.shape[0] != qo[-1]:
        raise ValueError(f"target must be [total_q = {qo[-1]}, vocab] logits or [total_q] tokens, got shape {tgt.shape}")
    vocab = None if vocab is None else _count("vocab", vocab, 1)
    if tgt.ndim == 2:
        tgt = _logits_input("target", tgt)  # refuses integer logits; uint16 are bf16 bits
        if tgt.shape[1] < 1:
            raise ValueError(f"target logits must be [total_q = {qo[-1]}, vocab] with vocab >= 1, got shape {tgt.shape}")
        post, finite = row_argmax(tgt) if tgt.shape[0] else (np.zeros(0, np.int32), np.zeros(0, bool))
    else:
        post = _int_array("target", target, "integer tokens (or [total_q, vocab] float logits)")  # never truncated
        _int32_values("target tokens", post)  # (the device's int32 array; never wrapped)
        finite = (post >= 0) & (post < (vocab if vocab is not None else np.iinfo(np.int64).max))
        post = np.where(finite, post, 0).astype(np.int32)
    act = _per_request_flags("active", active, bs)
    committed = _per_request("seq_lens", seq_lens, bs)
    live = act & (np.diff(qo) > 0)
    if np.any(live & ((committed < 0) | (committed > max_context))):  # (as compile_tree refuses them)
        raise ValueError(f"seq_lens must be in [0, max_context = {max_context}] for active requests with rows, "
                         f"got {committed[live].tolist()}")
    roots = None if root_tokens is None else _int32_values("root_tokens", _per_request("root_tokens", root_tokens, bs))
    stops = np.full((bs, 0), -1) if stop_tokens is None else _int_array("stop_tokens", stop_tokens, "integers")
    if stops.ndim != 2 or stops.shape[0] != bs:
        raise ValueError(f"stop_tokens must be [bs={bs}, n_stop], got shape {stops.shape}")
    width = depth_limit + 1
    res = AcceptResult(
        accepted_nodes=np.full((bs, width), -1, np.int32), accepted_count=np.zeros(bs, np.int32),
        bonus=np.full(bs, -1, np.int32), finished=np.zeros(bs, np.uint8),
        emitted=np.full((bs, width), -1, np.int32), num_emitted=np.zeros(bs, np.int32),
        active=act.astype(np.uint8),
        root_tokens=(np.full(bs, -1, np.int32) if roots is None else roots.astype(np.int32)),
        posterior=post, status=0, finite=finite)
    for b in range(bs):
        n = int(qo[b + 1] - qo[b])
        if not act[b] or n == 0:
            continue
        is_stop = lambda t: t >= 0 and bool(np.any(stops[b] == t))  # noqa: E731,B023
        par, tok, p = trees.parents[b, :n], trees.tokens[b, :n], post[qo[b]:qo[b] + n]
        fin = finite[qo[b]:qo[b] + n]
        cur, path, finished = 0, [0], 0
        while fin[cur]:  # a not-finite row matches no child
            kids = np.flatnonzero((par == cur) & (tok == p[cur]))
            if kids.size == 0:
                break
            cur = int(kids[0])
            path.append(cur)
            if is_stop(int(tok[cur])):
                finished = FINISH_DONE
                break
        bonus = -1
        if not finished:
            if fin[cur]:
                bonus = int(p[cur])
            else:
                finished = FINISH_NONFINITE
        room = int(max_context - committed[b])
        if len(path) > room:
            path = path[:max(room, 0)]
            finished, bonus = FINISH_DONE, -1
            res.status |= STATUS_CONTEXT_FULL
        if finished == FINISH_NONFINITE:
            res.status |= STATUS_NONFINITE
        if bonus >= 0 and is_stop(bonus):
            finished = FINISH_DONE
        a = len(path)
        res.accepted_nodes[b, :a] = path
        res.accepted_count[b] = a
        res.bonus[b] = bonus
        res.finished[b] = finished
        out = [int(tok[i]) for i in path[1:]] + ([bonus] if bonus >= 0 else [])
        res.emitted[b, :len(out)] = out
        res.num_emitted[b] = len(out)
        res.active[b] = 0 if finished else 1
        if not finished:
            res.root_tokens[b] = bonus
    return res


def accept_records(res: AcceptResult) -> np.ndarray:
    """The accept records mirrored to host memory: int32 ``[bs, RECORD_HEADER + depth_limit + 1]``.

    Row ``b`` is ``[accepted_count, num_emitted, bonus, finished, emitted...]`` with the
    emitted tokens -1 padded. TypeError if ``res`` is not an :class:`AcceptResult`.
    """
    _need_type("res", res, AcceptResult)
    head = np.stack([res.accepted_count, res.num_emitted, res.bonus, res.finished.astype(np.int32)], axis=1)
    return np.concatenate([head, res.emitted], axis=1).astype(np.int32)


# --------------------------------------------------------------------------- commit


def commit_paged(step: CompiledStep, res: AcceptResult, req_pool_indices: object, req_to_token: np.ndarray,
                 seq_lens: np.ndarray, pool: SlotPool) -> None:
    """Keep the accepted nodes' KV (append their slots) and free the rest; in place.

    Parameters
    ----------
    step : CompiledStep
    res : AcceptResult
    req_pool_indices : array_like of int
        ``[bs]``.
    req_to_token : numpy.ndarray
        ``[max_reqs, max_context]``; updated.
    seq_lens : numpy.ndarray
        int ``[bs]``; advanced by the accepted counts.
    pool : SlotPool
        Rejected slots are pushed back from ``step.alloc_base``; ``count`` becomes
        ``alloc_base + rejected``. Nothing changes if the pool was exhausted.

    Raises
    ------
    ValueError, TypeError
        For a ``req_pool_indices`` that is not ``[bs]`` integers (checked even when the pool
        was exhausted); TypeError for a ``req_to_token`` or ``seq_lens`` that is not a numpy
        integer array (2-D, 1-D: both are updated in place; ``req_to_token`` int32 or int64,
        the kernels' types, as a narrower one would wrap the slot ids), ``step``, ``res`` or
        ``pool`` of another class. ValueError, before anything is written, for a ``seq_lens``
        that is not ``[bs]``, a ``res`` of another batch size than ``step`` (checked even when the
        pool was exhausted) or whose accepted nodes are not distinct nodes of ``step``'s trees, a
        read-only ``req_to_token``, ``seq_lens`` or ``pool.slots``, and for a request with accepted
        nodes whose ``req_pool_indices`` is not a row of ``req_to_token``, is another such
        request's row, or whose ``seq_lens`` + accepted count is negative,
        past ``req_to_token``'s columns (:func:`greedy_accept` with that ``max_context``
        never accepts past it) or past what ``seq_lens``'s dtype holds (a uint8 254 + 2), or an
        accepted node's slot that ``req_to_token``'s dtype cannot hold (an int32 table and a slot
        id of 2**31 or more).
    """
    _need_type("step", step, CompiledStep)
    _need_type("res", res, AcceptResult)
    _need_type("pool", pool, SlotPool)
    bs = step.q_lens.shape[0]
    rows = _per_request("req_pool_indices", req_pool_indices, bs)
    _in_place_ints("req_to_token", req_to_token, 2)
    if req_to_token.dtype not in (np.int32, np.int64):
        raise TypeError(f"req_to_token must be int32 or int64 (the kernels' types), got dtype {req_to_token.dtype}")
    _in_place_ints("seq_lens", seq_lens, 1)
    need_shape("seq_lens", seq_lens, (bs,))
    if res.accepted_count.shape[0] != bs:
        raise ValueError(f"res must be the accept result of step's batch of {bs} requests, got "
                         f"{res.accepted_count.shape[0]}")
    if step.status & STATUS_POOL_EXHAUSTED:
        return
    for name, a in (("req_to_token", req_to_token), ("seq_lens", seq_lens), ("pool.slots", pool.slots)):
        if not a.flags.writeable:
            raise ValueError(f"{name} is read-only: commit_paged updates it in place")
    acc_n = res.accepted_count.astype(np.int64)
    widest = int(acc_n.max(initial=0))
    if res.accepted_nodes.ndim != 2 or res.accepted_nodes.shape[0] != bs or res.accepted_nodes.shape[1] < widest:
        raise ValueError(f"res does not belong to step: accepted_nodes must be [{bs}, >= {widest}] (the batch, the "
                         f"largest accepted_count), got shape {res.accepted_nodes.shape}")
    for b in range(bs):
        nodes = res.accepted_nodes[b, :max(int(acc_n[b]), 0)].astype(np.int64)
        n = int(step.q_lens[b])
        if not 0 <= acc_n[b] <= n or np.any((nodes < 0) | (nodes >= n)) or np.unique(nodes).shape[0] != nodes.shape[0]:
            raise ValueError(f"res does not belong to step: request {b} accepts nodes {nodes.tolist()} "
                             f"(accepted_count {int(acc_n[b])}) of a tree of {n} nodes")
    c = seq_lens.astype(np.int64)
    used = acc_n > 0
    if np.any(used & ((rows < 0) | (rows >= req_to_token.shape[0]))):
        raise ValueError(f"req_pool_indices must be rows of req_to_token [0, {req_to_token.shape[0]}) for requests "
                         f"with accepted nodes, got {rows.tolist()}")
    _need_distinct_rows(rows, used, "accepted nodes")
    if np.any(used & ((c < 0) | (c + acc_n > req_to_token.shape[1]))):
        raise ValueError(f"seq_lens + accepted counts must be in [0, {req_to_token.shape[1]}] (req_to_token's "
                         f"columns), got seq_lens {c.tolist()} and accepted counts {acc_n.tolist()}")
    _need_fits("seq_lens", seq_lens, np.where(used, c + acc_n, 0).tolist())  # (a uint8 254 + 2 would not)
    kept = [step.out_cache_loc[step.qo_indptr[b] + res.accepted_nodes[b, :int(acc_n[b])].astype(np.int64)]
            for b in range(bs) if acc_n[b] > 0]
    kept = np.concatenate(kept).astype(np.int64) if kept else np.zeros(0, np.int64)
    hi = int(np.iinfo(req_to_token.dtype).max)
    if np.any((kept < 0) | (kept > hi)):
        bad = int(kept[(kept < 0) | (kept > hi)][0])
        raise ValueError(f"the accepted nodes' slots must fit req_to_token's dtype {req_to_token.dtype} "
                         f"(0..{hi}), got slot {bad}: pass an int64 req_to_token")
    top = step.alloc_base
    for b in range(step.q_lens.shape[0]):
        n = int(step.q_lens[b])
        a = int(res.accepted_count[b])
        acc = res.accepted_nodes[b, :a]
        slots = step.out_cache_loc[step.qo_indptr[b]:step.qo_indptr[b] + n]
        if a:  # (a request with nothing accepted takes no row: its req_pool_indices is not checked)
            c = int(seq_lens[b])
            req_to_token[rows[b], c:c + a] = slots[acc]
            seq_lens[b] = c + a
        keep = np.zeros(n, bool)
        keep[acc] = True
        rejected = slots[~keep]
        pool.slots[top:top + rejected.shape[0]] = rejected
        top += rejected.shape[0]
    pool.count = top


def commit_dense(cache: np.ndarray, res: AcceptResult, seq_lens: np.ndarray) -> int:
    """Move accepted rows to the front of each request's appended window; in place.

    Parameters
    ----------
    cache : numpy.ndarray
        ``[num_layers, bs, window, ...]``; request ``b``'s node ``i`` sits at position
        ``seq_lens[b] + i`` of every layer.
    res : AcceptResult
        Where a node's row ``seq_lens[b] + node`` lies at or past the window, the
        path is cut before it: ``res.accepted_count[b]`` becomes the nodes kept and the
        request finishes (``res.active[b] = 0``); the accept records (already published)
        and ``accepted_nodes`` are left as they were.
    seq_lens : numpy.ndarray
        int ``[bs]``; advanced by the (kept) accepted counts.

    Returns
    -------
    int
        :data:`STATUS_CONTEXT_FULL` if a path was cut, else 0.

    Raises
    ------
    TypeError
        ``cache`` is not a numpy array of at least 3 dimensions, or ``seq_lens`` not a 1-D numpy
        integer array (both are updated in place), or ``res`` not an :class:`AcceptResult`.
    ValueError
        ``seq_lens`` not ``[bs]`` (``res``'s batch) or negative, ``cache``'s second dimension
        not ``bs``, a read-only ``cache``, ``seq_lens``, ``res.accepted_count`` or ``res.active``,
        a ``res`` whose ``accepted_count`` lies outside ``[0, accepted_nodes.shape[1]]`` or whose
        accepted nodes are not ascending node ids >= 0, or a ``seq_lens`` + kept accepted count
        past what ``seq_lens``'s dtype holds (an int8 126 + 2); before anything is moved or written.
    """
    if not isinstance(cache, np.ndarray) or cache.ndim < 3:
        raise TypeError(f"cache must be a numpy array [num_layers, bs, window, ...] (updated in place), got "
                        f"{type(cache).__name__ if not isinstance(cache, np.ndarray) else f'shape {cache.shape}'}")
    _need_type("res", res, AcceptResult)
    _in_place_ints("seq_lens", seq_lens, 1)
    bs = res.accepted_count.shape[0]
    need_shape("seq_lens", seq_lens, (bs,))
    if cache.shape[1] != bs:
        raise ValueError(f"cache must be [num_layers, bs = {bs}, window, ...] (res's batch), got shape {cache.shape}")
    if np.any(seq_lens < 0):
        raise ValueError(f"seq_lens must be >= 0, got {seq_lens.tolist()}")
    for name, a in (("cache", cache), ("seq_lens", seq_lens), ("res.accepted_count", res.accepted_count),
                    ("res.active", res.active)):
        if isinstance(a, np.ndarray) and not a.flags.writeable:
            raise ValueError(f"{name} is read-only: commit_dense updates it in place")
    acc_n = np.asarray(res.accepted_count).astype(np.int64)
    acc_nodes = np.asarray(res.accepted_nodes)
    width = acc_nodes.shape[1] if acc_nodes.ndim == 2 else -1
    if acc_nodes.ndim != 2 or acc_nodes.shape[0] != bs or np.any((acc_n < 0) | (acc_n > width)):
        raise ValueError(f"res is no accept result: accepted_nodes must be [{bs}, width] and accepted_count in "
                         f"[0, width], got shape {acc_nodes.shape} and counts {acc_n.tolist()}")
    for b in range(bs):  # a path from the root: node ids >= 0 and ascending (a child follows its parent)
        nodes = acc_nodes[b, :int(acc_n[b])].astype(np.int64)
        if np.any(nodes < 0) or np.any(np.diff(nodes) <= 0):
            raise ValueError(f"res is no accept result: request {b} accepts nodes {nodes.tolist()}, which are not "
                             f"ascending node ids >= 0 (a path from the root)")
    window = cache.shape[2]
    kept = []  # (seq_lens, accepted nodes, nodes kept) per request, all checked before anything is moved
    for b in range(seq_lens.shape[0]):
        a = int(res.accepted_count[b])
        c = int(seq_lens[b])
        nodes = [int(v) for v in res.accepted_nodes[b, :a]]
        keep = 0
        while keep < a and c + nodes[keep] < window:
            keep += 1
        kept.append((c, nodes, keep))
    _need_fits("seq_lens", seq_lens, [c + keep for c, _, keep in kept])
    status = 0
    for b, (c, nodes, keep) in enumerate(kept):
        a = len(nodes)
        if keep < a:
            res.accepted_count[b] = keep
            res.active[b] = 0
            status |= STATUS_CONTEXT_FULL
        for i, node in enumerate(nodes[:keep]):
            if node != i:  # node >= i, increasing: ascending order never overwrites a source
                cache[:, b, c + i] = cache[:, b, c + node]
        seq_lens[b] = c + keep
    return status
