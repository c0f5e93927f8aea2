"""DDTree on the GPU: tree build, tree compile, greedy accept and KV commit, capture-safe.

Pairs with ``cu/ddtree.cu`` and its stage headers ``cu/ddtree/*.cuh`` (a params struct per
stage over a shared one, ``cu/ddtree/params.cuh``, mirrored here by ``_Shared``,
``_TopKParams``, ``_BuildParams``, ``_CompileParams``, ``_AcceptParams`` and ``_CommitParams``)
and with the numpy reference
:mod:`driverlevel.reference.ddtree`, which defines every result exactly (the algorithm of
Ringel & Romano 2026, arXiv 2604.12989; the pool, slot and stop-token rules are spelled out
there).

One decode step with a :class:`DDTreePlan`::

    plan.build(stream, draft_logits, state)      # top-K per depth + best-first tree
    plan.compile(stream, state)                  # verify inputs, slots, metadata, masks
    ...target forward over plan.input_ids / plan.positions / plan.metadata()...
    plan.accept(stream, state, target_logits=...)  # argmax, walk, bonus, stop tokens
    plan.commit(stream, state)                   # keep accepted slots, free the rest

Every launch is capture-safe: nothing allocates, synchronizes or reads back; every
per-step value (active flags, lengths, the tree, the pool's count) lives in device
memory; every grid is fixed by the plan's maxima. Inputs are validated (dtype, shape,
device, contiguity) before anything is launched.

Device-side request state (:class:`~driverlevel.request_state.RequestState`)
------------------------------------------------------------------------
The request state and the slot pool the runner uses too, under the same names (SGLang's
where they exist): ``active``, ``root_tokens`` (accept writes the next roots),
``seq_lens`` (tokens whose KV is cached; the root sits at this position),
``req_pool_indices``, ``req_to_token``, the free-slot pool ``free_slots`` + ``free_count``,
optional ``budgets`` and ``stop_tokens``. ``DDTreeState`` is the same class.
"""

from __future__ import annotations

import ctypes
import math
import operator

import numpy as np

from ._array import DeviceArray, array_key
from ._compile import CompileVariant, compile_file, normalize_arch, shared_limit
from ._constants import (
    DDTREE_BUILD_THREADS,
    DDTREE_FALLBACK_SHARED_BYTES,
    DDTREE_MERGE_ELEMS,
    DDTREE_SMALL_THREADS,
    DDTREE_TOPK_ELEMS,
    DDTREE_TOPK_THREADS,
    FINISH_DONE,
    FINISH_NONFINITE,
    FLAG_LEGACY_SEARCH,
    LP_FLOOR,
    MAX_BATCH,
    MAX_BUDGET,
    MAX_DEPTH,
    RECORD_HEADER,
    STATUS_CONTEXT_FULL,
    STATUS_KV_CAPACITY,
    STATUS_MASK_CAPACITY,
    STATUS_NONFINITE,
    STATUS_POOL_EXHAUSTED,
    kernel_defines,
    mask_words,
)
from ._device import _check_device_arg
from ._dtypes import BF16_FORMS, as_dtype, bfloat16
from ._device_error import DeviceErrorWord, error_defines
from ._memory import PinnedHostBuffer, WorkspacePool
from ._module import check_plan_args, check_pool_device, check_pool_open, load_module, resolve_pdl
from ._checks import device_array_arg as _arr
from ._checks import int_in_range as _int_in_range
from ._checks import need_dtype as _need_dtype
from ._checks import need_shape as _need_shape
from ._checks import positive_int as _positive_int
from ._checks import stream_arg as _stream_arg
from . import _topk_threshold as _tk
from . import argmax as _argmax
from .request_state import RequestState
from .verify_attention import VerifyMetadata

__all__ = [
    "DDTreePlan",
    "DDTreeState",
    "RequestState",
    "SOURCE",
    "CHUNK",
    "MAX_BUDGET",
    "MAX_DEPTH",
    "STATUS_POOL_EXHAUSTED",
    "STATUS_CONTEXT_FULL",
    "STATUS_KV_CAPACITY",
    "STATUS_MASK_CAPACITY",
    "STATUS_NONFINITE",
    "FINISH_DONE",
    "FINISH_NONFINITE",
    "LP_FLOOR",
    "RECORD_HEADER",
    "FLAG_LEGACY_SEARCH",
    "TOPK_MODES",
    "compile_defines",
    "compile_variants",
    "dynamic_shared_bytes",
    "build_shared_bytes",
]

SOURCE = "ddtree.cu"
# The limits, status bits, finish codes, record layout and block sizes are driverlevel._constants'
# (compiled into the kernels as -DDL_<NAME>); re-exported here under the same names.
#: Logits per chunk CTA of ``ddtree_topk_chunks_*`` (320 threads x 24).
CHUNK = DDTREE_TOPK_THREADS * DDTREE_TOPK_ELEMS
#: Candidates one ``ddtree_build`` CTA merges per row (512 threads x 24): ``num_chunks * K`` must fit.
MERGE_CAPACITY = DDTREE_BUILD_THREADS * DDTREE_MERGE_ELEMS
_TOPK_THREADS = DDTREE_TOPK_THREADS
_BUILD_THREADS = DDTREE_BUILD_THREADS
_SMALL_THREADS = DDTREE_SMALL_THREADS
_MASK_FORMATS = ("bitmask", "full", "qlen_only")
#: ``DDTreePlan(topk=...)``: the chunk top-K alone, or the threshold top-K (the default;
#: :mod:`driverlevel._topk_threshold`) with the chunk top-K as its exact fallback.
TOPK_MODES = ("chunked", "threshold")

_u64 = ctypes.c_uint64
_i64 = ctypes.c_int64
_i32 = ctypes.c_int32


class _Shared(ctypes.Structure):
    """ctypes mirror of ``DDTreeShared`` in cu/ddtree/params.cuh (offsets checked at compile time, prefix ``SH``)."""

    _fields_ = [("state", _u64), ("error", _u64), ("max_batch", _i32), ("depth_limit", _i32), ("vocab", _i32),
        ("budget", _i32), ("k", _i32), ("n_words", _i32), ("flags", _i32), ("shared_pad", _i32)]


class _TopKParams(_Shared):
    """ctypes mirror of ``TopKParams`` in cu/ddtree/params.cuh (offsets checked at compile time, prefix ``TK``)."""

    _fields_ = [("logits", _u64), ("active", _u64), ("cand", _u64), ("chunk_max", _u64), ("chunk_sum", _u64),
        ("counters", _u64), ("tk_thresh", _u64), ("tk_count", _u64), ("tk_flag", _u64), ("tk_cand", _u64),
        ("tk_sum", _u64), ("logits_batch_stride", _i64), ("logits_row_stride", _i64),
        ("num_chunks", _i32), ("logits_vec", _i32), ("topk_mode", _i32), ("tk_m", _i32), ("tk_cap", _i32),
        ("tk_nseg", _i32), ("tk_seg_len", _i32), ("tk_slack", _i32)]


class _BuildParams(_TopKParams):
    """ctypes mirror of ``BuildParams`` in cu/ddtree/params.cuh (offsets checked at compile time, prefix ``BD``)."""

    _fields_ = [("root_tokens", _u64), ("budgets", _u64), ("top_ids", _u64), ("top_lp", _u64), ("tokens", _u64),
        ("depths", _u64), ("parents", _u64), ("node_counts", _u64), ("anc", _u64), ("warm_scratch", _u64), ("lp_bytes", _i32),
        ("logits_bf16", _i32)]


class _CompileParams(_Shared):
    """ctypes mirror of ``CompileParams`` in cu/ddtree/params.cuh (offsets checked at compile time, prefix ``CP``)."""

    _fields_ = [("seq_lens", _u64), ("req_pool_indices", _u64), ("req_to_token", _u64), ("free_slots", _u64),
        ("free_count", _u64), ("tokens", _u64), ("depths", _u64), ("node_counts", _u64), ("anc", _u64),
        ("input_ids", _u64), ("positions", _u64), ("out_cache_loc", _u64), ("qo_indptr", _u64), ("kv_indptr", _u64),
        ("kv_indices", _u64), ("bitmask", _u64), ("full_mask", _u64), ("full_indptr", _u64), ("qlen_mask", _u64),
        ("qlen_indptr", _u64), ("kv_capacity", _i64), ("full_capacity", _i64), ("qlen_capacity", _i64),
        ("max_context", _i64), ("r2t_stride", _i64), ("r2t_rows", _i64), ("free_capacity", _i64), ("r2t_is64", _i32),
        ("compile_pad", _i32)]


class _AcceptParams(_Shared):
    """ctypes mirror of ``AcceptParams`` in cu/ddtree/params.cuh (offsets checked at compile time, prefix ``AC``)."""

    _fields_ = [("active", _u64), ("root_tokens", _u64), ("seq_lens", _u64), ("stop_tokens", _u64),
        ("qo_indptr", _u64), ("tokens", _u64), ("parents", _u64), ("argmax_part", _u64), ("target_tokens", _u64),
        ("posterior", _u64), ("accepted_nodes", _u64), ("accepted_count", _u64), ("bonus", _u64), ("records", _u64),
        ("mirror", _u64), ("max_context", _i64), ("n_stop", _i32), ("record_width", _i32)]


class _CommitParams(_Shared):
    """ctypes mirror of ``CommitParams`` in cu/ddtree/params.cuh (offsets checked at compile time, prefix ``CM``)."""

    _fields_ = [("active", _u64), ("seq_lens", _u64), ("req_pool_indices", _u64), ("req_to_token", _u64),
        ("free_slots", _u64), ("free_count", _u64), ("qo_indptr", _u64), ("out_cache_loc", _u64),
        ("accepted_nodes", _u64), ("accepted_count", _u64), ("dense_cache", _u64), ("r2t_stride", _i64),
        ("r2t_rows", _i64), ("free_capacity", _i64), ("dense_layer_stride", _i64), ("dense_batch_stride", _i64),
        ("dense_pos_stride", _i64), ("dense_row_bytes", _i64), ("dense_window", _i64), ("r2t_is64", _i32),
        ("paged", _i32), ("dense_layers", _i32), ("commit_pad", _i32)]


#: The stages' params mirrors by their define prefix (``DL_OFF_<prefix>_<field>``, ``DL_SIZEOF_<prefix>``).
_STRUCTS = {"SH": _Shared, "TK": _TopKParams, "BD": _BuildParams, "CP": _CompileParams, "AC": _AcceptParams,
            "CM": _CommitParams}


def _struct_fields(cls) -> list:
    """Every field name of a ctypes params class, its bases' first (the C layout's order)."""
    names = []
    for c in reversed(cls.__mro__):
        names += [n for n, *_ in c.__dict__.get("_fields_", ())]
    return names


#: Every field name of every stage's struct (a field of one name means one value in every stage).
_ALL_FIELDS = frozenset(n for c in _STRUCTS.values() for n in _struct_fields(c))


class _Values:
    """The values of one launch's params, by field name, for every stage (0 where not set).

    :func:`_pack` copies the fields of one stage's struct out of it; setting a name that no
    stage's struct has raises ``AttributeError`` (a typo would otherwise launch a 0)."""

    def __init__(self):
        for n in _ALL_FIELDS:
            object.__setattr__(self, n, 0)

    def __setattr__(self, name, value):
        if name not in _ALL_FIELDS:
            raise AttributeError(f"no DDTree params struct has a field {name!r}")
        object.__setattr__(self, name, value)


def _pack(cls, v: _Values):
    """The ``cls`` struct (one stage's params) filled from ``v``."""
    p = cls()
    for n in _struct_fields(cls):
        setattr(p, n, getattr(v, n))
    return p


def compile_defines(arch, topk: str = "threshold") -> dict:
    """Defines for ``ddtree.cu`` as a plan of top-K ``topk`` compiles it: the stages' params layouts
    (checked by static_assert), the shared constants (:func:`driverlevel._constants.kernel_defines`),
    the device error word's field and code numbers (:func:`driverlevel._device_error.error_defines`)
    and ``DL_DDTREE_HIST_MERGE``: 1 for ``"threshold"``, whose rows the build merges by one histogram
    (``cu/ddtree/build.cuh``, ``hist_rank``), 0 for ``"chunked"``, whose merge then keeps its code
    in one straight run (inlined, that path cost a chunked build ~5 µs from cold instruction caches:
    BENCHMARKS.md, sixty-first session).

    ``topk`` is case-insensitive, as :class:`DDTreePlan`'s.

    Raises
    ------
    ValueError
        ``topk`` is not one of :data:`TOPK_MODES`, or ``arch`` is not an architecture."""
    normalize_arch(arch)
    if isinstance(topk, str):
        topk = topk.lower()  # case-insensitive, as DDTreePlan's topk
    if topk not in TOPK_MODES:
        raise ValueError(f"topk must be one of {TOPK_MODES}, got {topk!r}")
    d = {}
    for prefix, cls in _STRUCTS.items():
        d.update({f"DL_OFF_{prefix}_{n}": getattr(cls, n).offset for n in _struct_fields(cls)})
        d[f"DL_SIZEOF_{prefix}"] = ctypes.sizeof(cls)
        d[f"DL_FIELDS_{prefix}"] = " ".join(f"DL_F({n})" for n in _struct_fields(cls))  # params.cuh checks each
    d.update(kernel_defines())
    d.update(error_defines())
    d["DL_DDTREE_HIST_MERGE"] = int(topk == "threshold")
    return d


def _align16(n: int) -> int:
    return (int(n) + 15) & ~15


def _py_ints(*values) -> tuple:
    """``values`` as Python ints (``operator.index``: numpy ints accepted, floats refused) before they are
    multiplied: a product of numpy ints wraps silently (``np.int32(65536) * np.int32(65536) == 0``)."""
    return tuple(operator.index(v) for v in values)


def _build_union_bytes(depth_limit: int, k: int, budget: int) -> int:
    """The union region of ``ddtree_build``'s dynamic shared memory, bytes (``lp_bytes``)."""
    depth_limit, k, budget = _py_ints(depth_limit, k, budget)
    n = budget + 1
    sort = 8 * (1 << max(k - 1, 0).bit_length())           # the row merge's picked composites
    heap = _align16(4 * depth_limit * k) + 12 * n            # log-probs + overflow frontier
    masks = 4 * n * mask_words(budget)                       # ancestor-mask staging
    return _align16(max(sort, heap, masks))


def build_shared_bytes(depth_limit: int, k: int, budget: int) -> int:
    """Dynamic shared memory of ``ddtree_build``, bytes.

    ``align16(max(8 * pow2ceil(K), align16(4 * D * K) + 12 * N, 4 * N * W)) + 5 * N``
    with ``N = budget + 1``, ``W = ceil(N / 32)``: the row merge's sort buffer, the
    heap's log-probs and overflow frontier, or the mask staging (one at a time), then the
    node arrays (parent, rank int16, depth uint8).

    Raises
    ------
    TypeError
        An argument is not an integer, or is a bool (numpy ints are taken, as Python ints:
        their products never wrap).
    ValueError
        ``depth_limit`` outside 1 .. MAX_DEPTH, ``budget`` outside 1 .. MAX_BUDGET, or ``k``
        outside 1 .. ``budget`` (a plan's ``k`` is ``min(budget, vocab)``).
    """
    depth_limit = _int_in_range("depth_limit", depth_limit, 1, MAX_DEPTH)
    budget = _int_in_range("budget", budget, 1, MAX_BUDGET)
    k = _int_in_range("k", k, 1, budget)
    return _align16(_build_union_bytes(depth_limit, k, budget) + 5 * (budget + 1))


def dynamic_shared_bytes(arch) -> dict:
    """Largest dynamic shared memory any plan launches ``ddtree_build`` and the stream kernels
    with on ``arch``, bytes (the stream's ring as :func:`driverlevel._topk_threshold.stream_config`
    sizes it for the arch's shared memory per block; one SM holds 1 KB more)."""
    limit = shared_limit(normalize_arch(arch))
    out = {"ddtree_build": build_shared_bytes(MAX_DEPTH, MAX_BUDGET, MAX_BUDGET)}
    for suffix, bf16 in (("f32", False), ("bf16", True)):
        _, stages = _tk.stream_config(bf16, limit + 1024, limit)
        out[f"ddtree_topk_stream_{suffix}"] = stages * _tk.stream_tile_bytes(bf16)
    return out


def compile_variants(arch) -> list[CompileVariant]:
    """The two ways ``ddtree.cu`` is compiled on ``arch``, one per top-K mode (labels ``"threshold"``,
    the default plans', first, and ``"chunked"``; :func:`compile_defines`), each with the
    worst-case dynamic shared memory.

    ``driverlevel.runtime.compile_file(SOURCE, arch, v.defines)`` for a variant ``v`` compiles it as
    the plans of that top-K do (``compile_file`` without these defines stops at the source's
    ``#error``)."""
    return [CompileVariant(compile_defines(arch, topk), dynamic_shared_bytes(arch), topk)
            for topk in ("threshold", "chunked")]


def check_merge_capacity(vocab: int, budget: int) -> None:
    """Check that ``ddtree_build``'s row merge holds a row's chunk candidates at ``vocab`` and ``budget``.

    The rule :class:`DDTreePlan` enforces: ``ceil(vocab / CHUNK) * K <= MERGE_CAPACITY`` with
    ``K = min(budget, vocab)`` (``ceil(vocab / 7680) * K <= 12288``). Pure: it touches no device,
    so the runners and the benchmark scripts check their arguments with it before a plan is built.

    Parameters
    ----------
    vocab, budget : int
        Positive integers (Python or numpy ints; a float or a bool is refused, never truncated).

    Raises
    ------
    TypeError
        ``vocab`` or ``budget`` is not an integer (the message names it and the type it got, e.g. a float).
    ValueError
        ``vocab`` or ``budget`` is < 1; or the row merge cannot hold the candidates: the message
        names the vocabulary, K, the chunks and the capacity, and what to lower.

    Example
    -------
    >>> check_merge_capacity(163840, 512)   # 22 chunks x 512 = 11264 candidates: fits
    """
    vocab = _positive_int("vocab", vocab)  # int() truncated a float: 163840.9 was checked as 163840
    budget = _positive_int("budget", budget)
    k = min(budget, vocab)
    num_chunks = -(-vocab // CHUNK)  # exact for any int (a float division rounds above 2**53)
    if num_chunks * k > MERGE_CAPACITY:
        fix = ("lower the budget" if num_chunks <= MERGE_CAPACITY
               else f"no budget fits: the vocabulary can have at most {MERGE_CAPACITY * CHUNK} tokens")
        raise ValueError(f"vocab={vocab} at K={k} needs {num_chunks} chunks x {k} candidates "
                         f"per row, more than the row merge's {MERGE_CAPACITY}: {fix}")


_LOGIT_DTYPES = f'float32 or bfloat16 ("float32" or numpy.float32; {BF16_FORMS})'


def _logit_dtype(name, dt):
    """TypeError naming ``name`` and the accepted values for anything but float32 / bfloat16."""
    if dt is None:
        raise TypeError(f"{name} must be {_LOGIT_DTYPES}, got None")
    try:
        d = as_dtype(dt)
    except TypeError:
        raise TypeError(f"{name} must be {_LOGIT_DTYPES}, got {dt!r}") from None
    if d is bfloat16:
        return bfloat16
    if d == np.dtype(np.float32):
        return d
    raise TypeError(f"{name} must be {_LOGIT_DTYPES}, got {d}")


def _is_bf16(a: DeviceArray) -> bool:
    return a.dtype is bfloat16 or a.dtype.name == "uint16"


def _ptr(a) -> int:
    return 0 if a is None else int(a.ptr)


# ------------------------------------------------------------------------------- state


#: The request state the DDTree stages read and update: :class:`driverlevel.request_state.RequestState`
#: (the runner's too), under the name this module has always exported.
DDTreeState = RequestState


# ------------------------------------------------------------------------------- plan


class DDTreePlan:
    """DDTree tree build, compile, accept and commit for fixed maxima (capture-safe launches).

    The algorithm is DDTree's (Ringel & Romano 2026, arXiv 2604.12989): per depth the top-K of
    the drafter's log-probabilities, then the best-first tree of ``budget`` nodes by the sum
    of its path's log-probabilities, verified greedily. :mod:`driverlevel.reference.ddtree`
    defines every result exactly (ties included); the threshold top-K is this project's
    (:mod:`driverlevel._topk_threshold`), exact by its fallback. One plan serves one stream at a
    time: its workspace is shared by its launches.

    Parameters
    ----------
    device : Device or int
    max_batch : int
        Request slots (1 .. 1024). Inactive slots cost an early exit.
    depth_limit : int
        Drafted depths per request (block size - 1; 1 .. 32).
    vocab : int
        Vocabulary size (``ceil(vocab / 7680) * min(budget, vocab) <= 12288``: up to 184,320
        tokens at budget 512, e.g. Kimi K2's 163,840).
    budget : int
        Most tree nodes besides the root (1 .. 512); per-request budgets may be smaller.
    max_context : int
        Positions per request (the width of ``req_to_token``).
    logits_dtype, target_dtype : {"float32", "bfloat16"}
        Drafter and target logits (target defaults to the drafter's).
    mask_formats : iterable of {"bitmask", "full", "qlen_only"}
        Verify masks :meth:`compile` writes (names case-insensitive; the members of the enum
        ``driverlevel._mask.MaskFormat`` too). The packed ``bitmask`` is always written;
        ``"full"`` carves ``max_batch * N * (max_context + N)`` bytes (SGLang FULL).
    compile_ctas : int
        CTAs per request of ``ddtree_compile`` (kv_indices and mask rows are spread over them).
    topk : {"chunked", "threshold"}
        The build's top-K (case-insensitive); both give the same (exact) result. ``"threshold"`` (default): a
        sampled threshold per row, one streaming pass over the logits that keeps those above
        it, and the chunk top-K only for the rows where the threshold failed, run by that
        row's ``ddtree_build`` CTA (:mod:`driverlevel._topk_threshold`); on the H200 at batch 8
        it builds the tree in half the time of ``"chunked"`` (BENCHMARKS.md, "DDTree stages"). ``"chunked"``: an exact
        top-K per 7,680-token chunk, merged per row (less workspace, see below). Each mode has a
        cubin of its own (:func:`compile_defines`; the threshold one ranks a row's candidates by
        one histogram), so the first plan of each mode compiles ``ddtree.cu`` once (cached on disk).
    pool : WorkspacePool, optional
        Pool to carve the workspace from (a private one is allocated otherwise), on
        ``device``: a fresh pool of the default 256-byte alignment needs :attr:`pool_bytes`
        (one already carved from, up to 255 B more for the first carve-out's alignment).
    name : str
        Prefix of the carve-out names.
    arch : str, optional
        Compile for this architecture instead of the device's.
    pdl : bool, optional
        Programmatic dependent launch of the stages' kernels (CUDA Programming Guide,
        "Programmatic Dependent Launch and Synchronization"). None (default): on where the
        plan's architecture is sm_90 or newer; False: off; True: on (``ValueError`` below
        sm_90). On, every launch of the build but its first (threshold: the stream kernel and
        ``ddtree_build``; chunked: ``ddtree_build``) is queued with
        ``cuLaunchKernelEx`` and ``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION``
        (:meth:`~driverlevel.runtime.Kernel.prepare`): it may start while the kernel before
        it finishes, and waits inside (``griddepcontrol.wait``, every CTA) before it touches
        what that kernel writes, instead of paying a full launch gap (on the H200 it saves
        1.3-5.3 µs of a threshold build, BENCHMARKS.md 2026-12-01, fifth session). The first
        launch stays ordinary, so the build starts after whatever came before it on the
        stream, and it ends only when all of its kernels have. :meth:`compile`, :meth:`accept`
        (and its row argmax) and :meth:`commit` (paged) are programmatic launches too: each
        kernel waits at its entry, before it reads or writes anything (``dl::pdl_enter``,
        ``cu/common.cuh``), so only its launch and its CTAs' start overlap the kernel before it,
        whatever that kernel is (the decode step of the demo, with the model's and the runner's
        kernels so too: -5.7 µs on an H100, fifty-ninth session). The results do
        not depend on it: ``tests/test_ddtree_gpu.py`` compares builds with it on and off
        bitwise, eager and replayed from a graph (stream capture records the dependencies as
        programmatic edges); compile, accept and commit run with it on (the default) throughout
        the GPU tests, where their results are checked against the numpy reference.

    Workspace
    ---------
    :attr:`workspace_bytes`; dominated by the chunk candidates
    ``max_batch * depth_limit * ceil(vocab / 7680) * K * 8`` (K = min(budget, vocab)),
    ``kv_indices`` (``max_batch * max_context * 8``), the target argmax partials
    (``max_batch * (budget + 1) * 8``: one running maximum per row, which accept clears) and
    the optional FULL mask. ``topk="threshold"`` adds ``max_batch * depth_limit * tk_cap * 8``
    bytes of candidates (``tk_cap``: 1,024-4,608 at the model vocabularies) and per-segment
    statistics.

    Outputs (device arrays of the plan)
    -----------------------------------
    ``top_ids`` int32 / ``top_lp`` float32 ``[max_batch, depth_limit, K]``;
    ``tokens`` / ``depths`` / ``parents`` int32 ``[max_batch, N]`` (N = budget + 1, -1 past
    the count); ``node_counts`` int32 ``[max_batch]``; ``anc`` uint32 ``[max_batch, N, W]``;
    ``input_ids`` int32, ``positions`` int64, ``out_cache_loc`` int64 ``[max_batch * N]``;
    ``qo_indptr`` int64 / ``kv_indptr`` int32 ``[max_batch + 1]``; ``kv_indices`` int64
    ``[max_batch * max_context]``;
    ``bitmask`` uint32 ``[max_batch * N, W]``; ``posterior`` int32 ``[max_batch * N]``;
    ``accepted_nodes`` int32 ``[max_batch, depth_limit + 1]``; ``accepted_count`` /
    ``bonus`` int32 ``[max_batch]``; ``records`` int32 ``[max_batch, 4 + depth_limit + 1]``
    (``[accepted_count, num_emitted, bonus, finished, emitted tokens...]``, ``finished`` =
    0, :data:`FINISH_DONE` or :data:`FINISH_NONFINITE`); ``step`` int64 ``[4]`` =
    (alloc_base, alloc_total, status bits, the build's status bits).

    Non-finite values
    -----------------
    One rule for every top-K and argmax (see :mod:`driverlevel.reference.ddtree`): NaN
    counts as -inf, ids are always in ``[0, vocab)`` and distinct; a drafter row whose
    maximum is not finite gets log-probs of :data:`LP_FLOOR` and sets
    :data:`STATUS_NONFINITE`; a target row with nothing above -inf has posterior 0, and a
    walk that ends at it finishes the request with :data:`FINISH_NONFINITE`.

    Bad per-step metadata
    ---------------------
    Checked by the kernels and reported through :attr:`error_word`; :meth:`check_errors`
    raises :class:`~driverlevel.MetadataError` naming the request and field. ``max_batch *
    max_context`` must stay below 2**31 (``kv_indptr`` is int32): checked at construction.

    Attributes
    ----------
    flags : int
        0 (default): the fast paths: the block-wide parallel search, or for a request of
        budget <= 16 whose tree may be deeper than 3 (a bound from its rows' maxima;
        ``DL_SEARCH_HEAP_BUDGET`` and ``DL_SEARCH_HEAP_DEPTH`` in ``cu/ddtree/search.cuh``) the
        deviation search (``dev_search``: the tree's nodes of one or two deviations from the
        chain, found in a few block-wide phases); the one-warp heap of the reference in the rare
        cases where either cannot prove it matches the heap. :data:`FLAG_LEGACY_SEARCH` makes
        the build use the heap for every request; for tests.
        Set it before the first launch of a stage (launches are packed once).
    pdl : bool
        Whether :meth:`build` launches its kernels after the first programmatically, and
        :meth:`compile`, :meth:`accept` and :meth:`commit` theirs (the ``pdl`` parameter
        resolved for the plan's architecture; fixed at construction).

    Raises
    ------
    ValueError, TypeError
        For out-of-range or mistyped parameters (checked before the device is touched, so
        this works without a GPU too), and a ``pool`` on another device than ``device`` or a
        closed one (checked once the device is opened, before any compile or carve). Every
        stage (:meth:`build`, :meth:`compile`, :meth:`accept`, :meth:`commit`,
        :meth:`commit_dense`) raises ``ValueError`` naming the plan if its pool was closed since.
    DriverUnavailableError, CudaError
        If there is no usable device ``device``.
    NvrtcError, CudaError
        If the kernels cannot be compiled or loaded.
    PoolExhaustedError
        ``pool`` has too little room left for the plan's workspace (:attr:`pool_bytes`): the
        message gives the bytes needed and the bytes free, and nothing is carved.

    Example
    -------
    >>> plan = DDTreePlan(dev, max_batch=8, depth_limit=15, vocab=163840, budget=256,      # doctest: +SKIP
    ...                   max_context=8192, logits_dtype="bfloat16")
    >>> state = RequestState.allocate(dev, max_batch=8, max_context=8192, num_slots=1 << 16)  # doctest: +SKIP
    >>> plan.build(stream, draft_logits, state); plan.compile(stream, state)               # doctest: +SKIP
    """

    def __init__(self, device, *, max_batch: int, depth_limit: int, vocab: int, budget: int, max_context: int,
                 logits_dtype="float32", target_dtype=None, mask_formats=("bitmask",), compile_ctas: int = 8, pool: WorkspacePool | None = None, name: str = "ddtree", arch=None,
                 topk: str = "threshold", pdl: bool | None = None):
        self.max_batch = _int_in_range("max_batch", max_batch, 1, MAX_BATCH)
        self.depth_limit = _int_in_range("depth_limit", depth_limit, 1, MAX_DEPTH)
        self.vocab = _int_in_range("vocab", vocab, 1, 2**31 - 1)
        self.budget = _int_in_range("budget", budget, 1, MAX_BUDGET)
        self.max_context = _int_in_range("max_context", max_context, 1, 2**31 - 1)
        if self.max_batch * self.max_context > 2**31 - 1:
            # kv_indptr is int32 (SGLang's layout): every request at max_context must fit it
            raise ValueError(f"max_batch * max_context = {self.max_batch} * {self.max_context} = "
                             f"{self.max_batch * self.max_context} exceeds 2**31 - 1, the range of the int32 "
                             f"kv_indptr: lower max_batch or max_context")
        self.compile_ctas = _int_in_range("compile_ctas", compile_ctas, 1, 1024)
        self.logits_dtype = _logit_dtype("logits_dtype", logits_dtype)
        self.target_dtype = _logit_dtype("target_dtype", target_dtype if target_dtype is not None else logits_dtype)
        if isinstance(mask_formats, str):
            raise TypeError(f"mask_formats must be an iterable of format names, e.g. ({mask_formats!r},), not a str")
        if mask_formats is None or not hasattr(mask_formats, "__iter__"):
            raise TypeError(f"mask_formats must be an iterable of format names, got {type(mask_formats).__name__}")
        # case-insensitive, as VerifyAttention's mask_format (parse_mask_format); a MaskFormat is a str
        formats = tuple(f.lower() if isinstance(f, str) else f for f in mask_formats)
        bad = [f for f in formats if f not in _MASK_FORMATS]
        if bad:
            raise ValueError(f"mask_formats must be a subset of {_MASK_FORMATS}, got {formats}")
        self.mask_formats = formats
        if isinstance(topk, str):
            topk = topk.lower()  # case-insensitive, as logits_dtype and the arch
        if topk not in TOPK_MODES:
            raise ValueError(f"topk must be one of {TOPK_MODES}, got {topk!r}")
        check_plan_args(pdl=pdl, pool=pool, name=name, arch=arch)  # before the device
        self.topk = topk
        self.k = min(self.budget, self.vocab)
        self.n_nodes = self.budget + 1
        self.n_words = mask_words(self.budget)
        self.num_chunks = math.ceil(self.vocab / CHUNK)
        check_merge_capacity(self.vocab, self.budget)
        self.max_rows = self.max_batch * self.n_nodes
        self.record_width = RECORD_HEADER + self.depth_limit + 1
        self.device = _check_device_arg(device)
        self._what = f"DDTreePlan {name!r}"  # (how errors name this plan)
        check_pool_device(pool, self.device, self._what)
        self.flags = 0
        bf16 = self.logits_dtype is bfloat16
        #: Threshold top-K layout (``topk="threshold"``): the threshold's rank in the sample and
        #: the sampled values it may admit past it, the candidates kept per row, the stream CTAs
        #: per row and their tokens.
        self.tk_m = _tk.sample_rank(self.k, self.vocab)
        self.tk_slack = _tk.sample_slack(self.k, self.vocab)
        self.tk_cap = _tk.candidate_capacity(self.k, self.vocab, MERGE_CAPACITY)
        props = self.device.properties
        #: The stream kernel's CTAs per SM and ring tiles, from the GPU's shared memory.
        self.tk_ctas_per_sm, self.tk_stages = _tk.stream_config(
            bf16, props.max_shared_memory_per_multiprocessor or props.max_shared_memory_per_block_optin,
            props.max_shared_memory_per_block_optin)
        self.tk_ring_bytes = self.tk_stages * _tk.stream_tile_bytes(bf16)
        self.tk_nseg, self.tk_seg_len = _tk.stream_segments(self.max_batch * self.depth_limit, self.vocab, bf16,
                                                            self.device.sm_count, self.tk_ctas_per_sm)
        self.arch = normalize_arch(arch or self.device.arch)
        self.pdl = resolve_pdl(pdl, self.arch)
        rows = self.max_batch * self.depth_limit
        #: The sample kernel's launch carveout (:func:`driverlevel._topk_threshold.sample_carveout`;
        #: threshold top-K with programmatic launches only, None = the driver's default).
        self.tk_sample_carveout = (_tk.sample_carveout(rows, rows * self.tk_nseg, self.device.sm_count,
                                                       self.tk_ctas_per_sm)
                                   if self.pdl and self.topk == "threshold" else None)
        # threshold: ddtree_build refines a row the threshold failed, or runs the chunk top-K over
        # it, in its own dynamic shared memory (cu/ddtree/build.cuh, refine_row, chunk_fallback_row)
        self.build_smem = build_shared_bytes(self.depth_limit, self.k, self.budget)
        if self.topk == "threshold":
            self.build_smem = max(self.build_smem, DDTREE_FALLBACK_SHARED_BYTES)

        self.cubin = compile_file(SOURCE, self.arch, compile_defines(self.arch, self.topk))
        static = self.cubin.resources.get("ddtree_build")
        limit = shared_limit(self.arch)
        if static is not None and self.build_smem + static.shared_bytes > limit:
            raise ValueError(f"depth_limit={self.depth_limit}, budget={self.budget} need {self.build_smem} B of shared "
                             f"memory in ddtree_build, more than {self.arch} allows ({limit} B)")
        self._module = load_module(self.device, self.cubin)
        kern = self._module.kernel
        suffix = "bf16" if self.logits_dtype is bfloat16 else "f32"
        # Only the top-K kernels this plan launches (build()): their shared-memory hints (100 = the
        # largest carveout) are set once here, never during a capture.
        if self.topk == "threshold":  # sample -> stream; the stream's ring is dynamic shared memory
            self._k_sample = kern(f"ddtree_topk_sample_{suffix}")
            self._k_stream = kern(f"ddtree_topk_stream_{suffix}")
            self._k_stream.reserve_shared(self.tk_ring_bytes)
            self._k_stream.prefer_shared_memory(100)
        else:  # the chunk CTAs keep their logits in shared memory: several share an SM
            self._k_chunks = kern(f"ddtree_topk_chunks_{suffix}")
            self._k_chunks.prefer_shared_memory(100)
        self._k_build = kern("ddtree_build")
        self._k_compile = kern("ddtree_compile")
        #: ``cu/argmax.cu`` loaded on the device: the target's argmax per node before :meth:`accept`.
        self._argmax_module = _argmax.load(self.device, self.arch)
        self._k_accept = kern("ddtree_accept")
        self._k_commit = kern("ddtree_commit")
        self._k_dense = kern("ddtree_commit_dense")
        # The opt-in now, never during a capture. The default limit of dynamic shared memory is
        # 48 KB minus the static part, so raise it whenever the sum passes 48 KB (only ever raise:
        # plans of other sizes share the loaded kernel).
        self._k_build.reserve_shared(self.build_smem)

        specs = self._specs()
        if pool is None:
            pool = WorkspacePool.allocate(self.device, self.workspace_bytes, label=name)
        else:  # the caller's: too small is said before anything is carved, with both sizes
            pool._require_room([(shape, dtype) for _, shape, dtype in specs], f"DDTreePlan {name!r}")
        self.pool = pool
        for cname, shape, dtype in specs:
            setattr(self, cname, pool.carve(f"{name}.{cname}", shape, dtype))
        #: The device error word the kernels report bad per-step metadata in (see :meth:`check_errors`).
        self.error_word = DeviceErrorWord(self.device, label=f"DDTreePlan {name}")
        stream = self.device.create_stream()
        self.counters.fill_bytes(0, stream)  # (the chunk kernel re-arms them in every build too)
        self.argmax_part.fill_bytes(0, stream)  # per-row argmax maxima: accept reads and clears them
        self.step.fill_bytes(0, stream)
        stream.synchronize()
        self._cache: dict = {}

    # -- sizes ------------------------------------------------------------------------------
    def _specs(self) -> list:
        B, D, K, N, W, R = self.max_batch, self.depth_limit, self.k, self.n_nodes, self.n_words, self.max_rows
        specs = [
            ("cand", (B, D, self.num_chunks, K), np.uint64), ("chunk_max", (B, D, self.num_chunks), np.float32),
            ("chunk_sum", (B, D, self.num_chunks), np.float64), ("counters", (B,), np.uint32),
            ("top_ids", (B, D, K), np.int32), ("top_lp", (B, D, K), np.float32),
            ("tokens", (B, N), np.int32), ("depths", (B, N), np.int32), ("parents", (B, N), np.int32),
            ("node_counts", (B,), np.int32), ("anc", (B, N, W), np.uint32),
            ("input_ids", (R,), np.int32), ("positions", (R,), np.int64), ("out_cache_loc", (R,), np.int64),
            ("qo_indptr", (B + 1,), np.int64), ("kv_indptr", (B + 1,), np.int32),
            ("kv_indices", (B * self.max_context,), np.int64), ("bitmask", (R, W), np.uint32),
            ("step", (4,), np.int64), ("argmax_part", (R,), np.uint64),
            ("posterior", (R,), np.int32), ("accepted_nodes", (B, D + 1), np.int32),
            ("accepted_count", (B,), np.int32), ("bonus", (B,), np.int32),
            ("records", (B, self.record_width), np.int32),
            # ddtree_build's code warmer (cu/ddtree/build.cuh): its own log-probs, then its nodes
            ("warm_scratch", (D * K + 3 * N + N * W + 1,), np.int32),
        ]
        if self.topk == "threshold":
            R = B * D
            specs += [("tk_thresh", (R,), np.float32), ("tk_count", (R,), np.uint32), ("tk_flag", (R,), np.uint32),
                      ("tk_cand", (R, self.tk_cap), np.uint64), ("tk_sum", (R, self.tk_nseg, 2), np.float64)]
        if "full" in self.mask_formats:
            specs += [("full_mask", (B * N * (self.max_context + N),), np.uint8), ("full_indptr", (B + 1,), np.int64)]
        if "qlen_only" in self.mask_formats:
            specs += [("qlen_mask", (B * N * N,), np.uint8), ("qlen_indptr", (B + 1,), np.int64)]
        return specs

    @property
    def workspace_bytes(self) -> int:
        """Bytes of the plan's workspace: every carve-out of :meth:`_specs`, 256-byte aligned."""
        return WorkspacePool.required_bytes([(s, d) for _, s, d in self._specs()])

    @property
    def pool_bytes(self) -> int:
        """Bytes a fresh :class:`~driverlevel.WorkspacePool` of the default (256-byte) alignment
        needs for this plan (here equal to
        :attr:`workspace_bytes`, whose carve-outs are counted aligned; the name
        :class:`~driverlevel.VerifyAttention` shares). Plans sharing one pool need the sum."""
        return self.workspace_bytes

    def metadata(self) -> VerifyMetadata:
        """The verify metadata :meth:`compile` fills, for the verify attention (bitmask format)."""
        return VerifyMetadata(self.qo_indptr, self.kv_indptr, self.kv_indices, self.out_cache_loc, self.bitmask, None)

    # -- validation -------------------------------------------------------------------------
    def _check_state(self, state: RequestState, need_table: bool = True, writes: tuple = ()) -> None:
        """Check the state's fields; those named in ``writes`` (the launch's kernels write them) must not be read-only."""
        dev, B = self.device, self.max_batch
        if not isinstance(state, RequestState):
            raise TypeError(f"state must be a RequestState (DDTreeState), got {type(state).__name__}")
        for fname, dt, shape in (("active", ("uint8", "bool", "int8"), (B,)), ("root_tokens", ("int32",), (B,)),
                                 ("seq_lens", ("int64",), (B,)), ("req_pool_indices", ("int64",), (B,)),
                                 ("free_count", ("int64",), (1,))):
            a = _arr(f"state.{fname}", getattr(state, fname), dev, writable=fname in writes)
            _need_dtype(f"state.{fname}", a, *dt)
            _need_shape(f"state.{fname}", a, shape)
        if need_table:
            r2t = _arr("state.req_to_token", state.req_to_token, dev, writable="req_to_token" in writes)
            _need_dtype("state.req_to_token", r2t, "int32", "int64")
            if r2t.ndim != 2 or r2t.shape[1] != self.max_context:
                raise ValueError(f"state.req_to_token must have shape [rows, max_context={self.max_context}], got {r2t.shape}")
            fs = _arr("state.free_slots", state.free_slots, dev, writable="free_slots" in writes)
            _need_dtype("state.free_slots", fs, "int64")
            if fs.ndim != 1:
                raise ValueError(f"state.free_slots must be 1-D, got {fs.shape}")
            if r2t.dtype.itemsize == 4 and fs.shape[0] > 2**31:  # (ids 0 .. 2**31 - 1; RequestState.specs agrees)
                raise ValueError(f"an int32 state.req_to_token holds slot ids below 2**31, but state.free_slots has "
                                 f"{fs.shape[0]:,} slots: use an int64 req_to_token")
        if state.budgets is not None:
            a = _arr("state.budgets", state.budgets, dev)
            _need_dtype("state.budgets", a, "int32")
            _need_shape("state.budgets", a, (B,))
        if state.stop_tokens is not None:
            a = _arr("state.stop_tokens", state.stop_tokens, dev)
            _need_dtype("state.stop_tokens", a, "int32")
            if a.ndim != 2 or a.shape[0] != B or a.shape[1] < 1:
                raise ValueError(f"state.stop_tokens must have shape [max_batch={B}, n_stop >= 1], got {a.shape}")

    def _check_logits(self, name, x, dtype, rows_shape) -> DeviceArray:
        a = _arr(name, x, self.device)
        if dtype is bfloat16:
            if not _is_bf16(a):
                raise TypeError(f"{name} must have dtype bfloat16 (or uint16 bit patterns), got {a.dtype.name}")
        else:
            _need_dtype(name, a, "float32")
        if len(rows_shape) == 2:  # target: [>= rows, vocab]
            if a.ndim != 2 or a.shape[1] != self.vocab or a.shape[0] < rows_shape[0]:
                raise ValueError(f"{name} must have shape [>= {rows_shape[0]}, vocab={self.vocab}], got {a.shape}")
        else:
            _need_shape(name, a, rows_shape)
        return a

    def _params(self, state: RequestState | None) -> _Values:
        p = _Values()
        for cname, _, _ in self._specs():
            if cname in _ALL_FIELDS:
                setattr(p, cname, getattr(self, cname).ptr)
        p.state = self.step.ptr
        p.max_batch, p.depth_limit, p.vocab, p.budget, p.k = self.max_batch, self.depth_limit, self.vocab, self.budget, self.k
        p.num_chunks, p.n_words, p.record_width = self.num_chunks, self.n_words, self.record_width
        p.lp_bytes = _build_union_bytes(self.depth_limit, self.k, self.budget)
        p.flags = self.flags
        if self.topk == "threshold":
            p.topk_mode = 1
            p.logits_bf16 = int(self.logits_dtype is bfloat16)
            p.tk_m, p.tk_cap, p.tk_nseg, p.tk_seg_len = self.tk_m, self.tk_cap, self.tk_nseg, self.tk_seg_len
            p.tk_slack = self.tk_slack
        p.max_context = self.max_context
        p.kv_capacity = self.max_batch * self.max_context
        if "full" in self.mask_formats:
            p.full_capacity = self.full_mask.shape[0]
        if "qlen_only" in self.mask_formats:
            p.qlen_capacity = self.qlen_mask.shape[0]
        p.paged = 1
        p.error = self.error_word.device_ptr
        if state is not None:
            p.active, p.root_tokens, p.seq_lens = state.active.ptr, state.root_tokens.ptr, state.seq_lens.ptr
            p.req_pool_indices, p.free_count = state.req_pool_indices.ptr, state.free_count.ptr
            p.req_to_token, p.free_slots = _ptr(state.req_to_token), _ptr(state.free_slots)
            if state.req_to_token is not None:
                p.r2t_stride = state.req_to_token.shape[1]
                p.r2t_rows = state.req_to_token.shape[0]
                p.r2t_is64 = int(state.req_to_token.dtype.name == "int64")
            if state.free_slots is not None:
                p.free_capacity = state.free_slots.shape[0]
            p.budgets, p.stop_tokens = _ptr(state.budgets), _ptr(state.stop_tokens)
            p.n_stop = state.stop_tokens.shape[1] if state.stop_tokens is not None else 0
        return p

    def _launch(self, stream, key, state, make) -> None:
        """Check ``stream``, then launch on it every prepared launch of ``key`` + ``state.key()``.

        The stream is checked (:func:`~driverlevel._checks.stream_arg`: ``TypeError`` /
        ``ValueError``) before anything is packed or launched. ``make()`` packs the list of
        launches the first time a key is seen; later calls with the same arrays (address, shape and
        dtype: :func:`~driverlevel._array.array_key`) replay it.
        """
        _stream_arg("stream", stream, self.device)
        check_pool_open(self.pool, self._what)
        key += state.key()
        launches = self._cache.get(key)
        if launches is None:
            launches = self._cache[key] = make()
        for ln in launches:
            ln.launch(stream)

    # -- launches ---------------------------------------------------------------------------
    def build(self, stream, logits, state: RequestState) -> None:
        """Top-K log-probs per depth and the best-first tree of every active request.

        Parameters
        ----------
        stream : Stream
        logits : float32 or bf16 ``[max_batch, depth_limit, vocab]``
            The drafter's logits (finite), C-contiguous; the plan's ``logits_dtype``.
            The rows of inactive requests are read too (the top-K does not wait for
            ``active`` before its first loads) and their results dropped: their values
            may be anything, but the whole array must be allocated.
        state : RequestState
            Reads ``active``, ``root_tokens`` and ``budgets``.

        Writes ``top_ids``, ``top_lp``, ``tokens``, ``depths``, ``parents``,
        ``node_counts`` and ``anc`` (inactive requests: ``node_counts = 0`` only), and
        the code warmer's scratch ``warm_scratch`` (its own log-probs and tree, whatever
        the requests; never read by another stage: see cu/ddtree/build.cuh's ``build_tree``).
        ``top_ids`` equal the reference's exactly (equal logits: lower id first); the
        log-probs agree with its float64 log-sum-exp within a few float32 ulps (the GPU sums
        the exponentials in another order); from those top-K lists the tree is the
        reference's heapq search node for node.

        Raises
        ------
        TypeError, ValueError
            Before any launch, naming the offending argument.
        """
        self._check_state(state, need_table=False)
        lg = self._check_logits("logits", logits, self.logits_dtype, (self.max_batch, self.depth_limit, self.vocab))

        def make():
            p = self._params(state)
            p.logits = lg.ptr
            p.logits_row_stride = self.vocab
            p.logits_batch_stride = self.depth_limit * self.vocab
            vec = 4 if self.logits_dtype is not bfloat16 else 8
            p.logits_vec = int(lg.ptr % 16 == 0 and self.vocab % vec == 0)
            tkp = _pack(_TopKParams, p)
            # pdl: every launch but the build's first is programmatic (the kernels wait inside,
            # cu/ddtree.cu); the first is ordinary, so the build starts after what came before it
            pdl = self.pdl
            if self.topk == "threshold":  # sample -> stream (ddtree_build runs the rows that failed)
                out = [self._k_sample.prepare((self.depth_limit, self.max_batch, 1), _tk.SAMPLE_THREADS, [tkp],
                                              carveout=self.tk_sample_carveout),
                       self._k_stream.prepare((self.tk_nseg, self.depth_limit, self.max_batch), _tk.STREAM_THREADS,
                                              [tkp], self.tk_ring_bytes, programmatic=pdl)]
            else:  # one chunk top-K CTA per chunk of every row
                out = [self._k_chunks.prepare((self.num_chunks, self.depth_limit, self.max_batch), _TOPK_THREADS, [tkp])]
            out.append(self._k_build.prepare((self.depth_limit + 1, self.max_batch, 1), _BUILD_THREADS,
                                             [_pack(_BuildParams, p)], self.build_smem, programmatic=pdl))
            for ln in out:
                ln.keep(lg, state)
            return out

        self._launch(stream, ("build", lg.ptr), state, make)

    def compile(self, stream, state: RequestState) -> None:
        """Verify inputs, slots, metadata and masks of the trees just built.

        Reads ``node_counts``, ``tokens``, ``depths``, ``anc`` and the state's
        ``seq_lens``, ``req_pool_indices``, ``req_to_token``, ``free_slots`` and
        ``free_count`` (left unchanged: :meth:`commit` settles the pool). Writes
        ``input_ids``, ``positions``, ``out_cache_loc``, ``qo_indptr``, ``kv_indptr``,
        ``kv_indices``, ``bitmask``, the SGLang masks of ``mask_formats`` and ``step``
        (alloc_base, alloc_total, status). The rows past the step's (``qo_indptr[bs]`` ..
        ``max_rows``) get token 0, position 0 and slot -1, so that a forward computing every
        row writes no KV through a stale slot; their mask rows are left as they were. See
        :mod:`driverlevel.reference.ddtree`.

        Raises
        ------
        TypeError, ValueError
            Before any launch, naming the offending argument (``state``, ``stream``).
        """
        self._check_state(state)

        def make():
            p = self._params(state)
            ln = self._k_compile.prepare((self.max_batch, self.compile_ctas, 1), _SMALL_THREADS, [_pack(_CompileParams, p)],
                                          programmatic=self.pdl)
            ln.keep(state)
            return [ln]

        self._launch(stream, ("compile",), state, make)

    def accept(self, stream, state: RequestState, target_logits=None, target_tokens=None, mirror=None) -> None:
        """Greedy acceptance: the target's argmax per node, the walk, stop tokens, next roots.

        Parameters
        ----------
        stream : Stream
        state : RequestState
            Reads ``active``, ``seq_lens``, ``stop_tokens``; clears ``active`` of
            finished requests and writes the next ``root_tokens``.
        target_logits : float32 or bf16 ``[>= max_batch * (budget + 1), vocab]``, optional
            Row ``qo_indptr[b] + i`` is the target's logits at node ``i`` of request ``b``.
        target_tokens : int32 ``[>= max_batch * (budget + 1)]``, optional
            The target's argmax per row instead of its logits (exactly one of the two).
        mirror : PinnedHostBuffer (mapped) or int32 DeviceArray ``[max_batch, record_width]``, optional
            Also receives the ``records`` (volatile stores, then ``__threadfence_system()``);
            read it on the host after an event, without a copy call. A PinnedHostBuffer may come
            from any device (driverlevel's are portable); a DeviceArray must be the plan's device's.

        Writes ``posterior``, ``accepted_nodes``, ``accepted_count``, ``bonus``, ``records``.

        Raises
        ------
        TypeError, ValueError
            Before any launch, naming the offending argument; ``ValueError`` also for a
            read-only ``state.active``, ``state.root_tokens`` or ``mirror`` (written here), and for
            a ``mirror`` PinnedHostBuffer that is not mapped or too small.
        """
        self._check_state(state, need_table=False, writes=("active", "root_tokens"))
        if (target_logits is None) == (target_tokens is None):
            raise ValueError("pass exactly one of target_logits and target_tokens")
        tl = tt = None
        if target_logits is not None:
            tl = self._check_logits("target_logits", target_logits, self.target_dtype, (self.max_rows, self.vocab))
        else:
            tt = _arr("target_tokens", target_tokens, self.device)
            _need_dtype("target_tokens", tt, "int32")
            if tt.ndim != 1 or tt.shape[0] < self.max_rows:
                raise ValueError(f"target_tokens must have shape [>= {self.max_rows}], got {tt.shape}")
        mir = None
        if mirror is not None:
            if isinstance(mirror, PinnedHostBuffer):  # its device view (a portable mapped buffer: any device's)
                try:
                    v = mirror.as_array((self.max_batch, self.record_width), np.int32)
                except (TypeError, ValueError) as exc:
                    raise type(exc)(f"mirror: {exc}") from None
                mirror = DeviceArray(v.ptr, v.shape, v.dtype, self.device, owner=mirror)
            mir = _arr("mirror", mirror, self.device, writable=True)
            _need_dtype("mirror", mir, "int32")
            _need_shape("mirror", mir, (self.max_batch, self.record_width))

        def make():
            p = self._params(state)
            p.target_tokens, p.mirror = _ptr(tt), _ptr(mir)
            out = []
            if tl is not None:  # argmax.cu's composites per row, which accept reads and clears
                out.append(_argmax.argmax_rows_launch(self.device, tl, m_max=self.max_rows, part=self.argmax_part,
                                                      num_rows=self.qo_indptr[self.max_batch:],
                                                      module=self._argmax_module, programmatic=self.pdl))
            out.append(self._k_accept.prepare(self.max_batch, _SMALL_THREADS, [_pack(_AcceptParams, p)], programmatic=self.pdl))
            for ln in out:
                ln.keep(tl, tt, mirror, state)
            return out

        self._launch(stream, ("accept", _ptr(tl), _ptr(tt), _ptr(mir)), state, make)

    def commit(self, stream, state: RequestState) -> None:
        """Paged commit: append the accepted slots to ``req_to_token``, advance
        ``seq_lens``, push the rejected slots back onto the pool and set
        ``free_count``. Does nothing when :meth:`compile` found the pool exhausted.

        Raises
        ------
        TypeError, ValueError
            Before any launch, naming the offending argument; ``ValueError`` also when one of
            the fields written (``seq_lens``, ``req_to_token``, ``free_slots``, ``free_count``)
            is read-only.
        """
        self._check_state(state, writes=("seq_lens", "req_to_token", "free_slots", "free_count"))

        def make():
            ln = self._k_commit.prepare(self.max_batch, _SMALL_THREADS, [_pack(_CommitParams, self._params(state))],
                                         programmatic=self.pdl)
            ln.keep(state)
            return [ln]

        self._launch(stream, ("commit",), state, make)

    def commit_dense(self, stream, state: RequestState, cache) -> None:
        """Dense commit: move the accepted rows of each request's appended window to its front.

        Parameters
        ----------
        stream : Stream
        state : RequestState
            ``seq_lens`` (advanced after the move) and ``active``.
        cache : DeviceArray ``[num_layers, max_batch, >= max_context, ...]``
            C-contiguous; request ``b``'s node ``i`` sits at position
            ``seq_lens[b] + i`` of every layer. A row (the trailing dimensions) must
            be a multiple of 16 bytes; 1 to 65,535 layers, no zero extent.

        Raises
        ------
        TypeError, ValueError
            Before any launch, naming the offending argument; ``ValueError`` also for a
            read-only ``cache``, ``state.seq_lens`` or ``state.active`` (written here).
        """
        self._check_state(state, need_table=False, writes=("active", "seq_lens"))
        c = _arr("cache", cache, self.device, writable=True)
        if c.ndim < 4 or c.shape[1] != self.max_batch or c.shape[2] < self.max_context:
            raise ValueError(f"cache must have shape [num_layers, max_batch={self.max_batch}, >= max_context="
                             f"{self.max_context}, ...], got {c.shape}")
        if not 1 <= c.shape[0] <= 65_535 or c.size == 0:  # (num_layers is the grid's y extent; a row of 0 bytes
            # would still be given the strides' 1-extent row size and copied)
            raise ValueError(f"cache must have 1 to 65,535 layers and hold elements (no zero extent), got {c.shape}")
        row = c.strides[2]
        if row % 16 or c.ptr % 16:
            raise ValueError(f"cache rows must be 16-byte multiples on a 16-byte aligned base, got {row} B rows")

        def make():
            p = self._params(state)
            p.dense_cache = c.ptr
            p.dense_layer_stride, p.dense_batch_stride, p.dense_pos_stride = c.strides[0], c.strides[1], c.strides[2]
            p.dense_row_bytes, p.dense_layers = row, c.shape[0]
            p.dense_window = c.shape[2]
            q = self._params(state)
            q.paged = 0
            out = [self._k_dense.prepare((self.max_batch, c.shape[0], 1), _SMALL_THREADS, [_pack(_CommitParams, p)]),
                   self._k_commit.prepare(self.max_batch, _SMALL_THREADS, [_pack(_CommitParams, q)])]
            for ln in out:
                ln.keep(c, state)
            return out

        self._launch(stream, ("dense", array_key(c), c.strides), state, make)  # (the params hold its shape and strides)

    # -- host helpers (not capture-safe) ----------------------------------------------------
    def check_errors(self, stream=None) -> None:
        """Raise if a kernel of this plan found bad per-step metadata since the last check.

        The kernels check what they read (node counts, committed lengths against
        ``max_context``, ``req_pool_indices`` against the table's rows, the pool count and
        slot ids against the free-slot stack, ``qo_indptr`` against the plan, parents,
        accepted nodes, target tokens against the vocabulary, root tokens), never read or
        write out of bounds, give the bad request a defined result (no rows this step; the
        state left as it was) and record the first failure in :attr:`error_word`.

        Parameters
        ----------
        stream : Stream, optional
            Synchronised first (not capture-safe; call between steps). ``None``: not
            synchronised (the caller has made sure the work queued before is complete).

        Raises
        ------
        TypeError
            ``stream`` is neither None nor a driverlevel :class:`~driverlevel.Stream`
            (an :class:`~driverlevel.Event` is refused, not synchronised in its place).
        ValueError
            ``stream`` belongs to another device than the plan's, or was closed.
        CaptureError
            ``stream`` given during a capture (the synchronize is not capture-safe).
        MetadataError
            Naming the first bad request and the field (the word is cleared).
        """
        self.error_word.check(stream)

    def allocate_mirror(self) -> PinnedHostBuffer:
        """A mapped pinned buffer for :meth:`accept`'s ``mirror`` (read with :meth:`read_records`)."""
        return PinnedHostBuffer.allocate(self.device, self.max_batch * self.record_width * 4, mapped=True,
                                         label="ddtree.mirror")

    def read_records(self, mirror: PinnedHostBuffer) -> np.ndarray:
        """The int32 ``[max_batch, record_width]`` view of a mirror (no copy; read after an event).

        Raises
        ------
        TypeError
            For a ``mirror`` that is not a :class:`~driverlevel.PinnedHostBuffer` (an int32
            DeviceArray mirror, which :meth:`accept` also takes, is read with its ``to_numpy``).
        ValueError
            For a closed buffer or one smaller than ``max_batch * record_width * 4`` bytes.
        """
        if not isinstance(mirror, PinnedHostBuffer):
            hint = (": a DeviceArray mirror is read with mirror.to_numpy(stream)" if isinstance(mirror, DeviceArray)
                    else "")
            raise TypeError(f"read_records: mirror must be a PinnedHostBuffer (allocate_mirror()), "
                            f"got {type(mirror).__name__}{hint}")
        return mirror.numpy((self.max_batch, self.record_width), np.int32)

    def __repr__(self):
        return (f"<DDTreePlan max_batch={self.max_batch} depth_limit={self.depth_limit} vocab={self.vocab} "
                f"budget={self.budget} K={self.k} chunks={self.num_chunks} topk={self.topk} pdl={self.pdl} "
                f"{self.arch} workspace={self.workspace_bytes} B>")
