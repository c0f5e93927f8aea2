"""The one source of every constant that Python and the DDTree / runner kernels share.

The status bits, the finish codes, the accept-record layout, the plan limits and the DDTree
kernels' block geometry are defined here once. :func:`kernel_defines` hands them to NVRTC as
``-DDL_<NAME>=<value>``; ``cu/constants.cuh`` refuses to compile without them (``#error``)
and declares the ``constexpr`` names the kernels use. The launchers
(:mod:`driverlevel.ddtree`, :mod:`driverlevel.runner`) and the float64 reference
(:mod:`driverlevel.reference.ddtree`) import them from here, so none of them sits under
another and Python and CUDA cannot disagree.

(The device error word's field and code numbers follow the same pattern in
:mod:`driverlevel._device_error`.)
"""

from __future__ import annotations

import numpy as np

from ._checks import non_negative_int
from ._mask import bitmask_words

__all__ = [
    "STATUS_POOL_EXHAUSTED",
    "STATUS_CONTEXT_FULL",
    "STATUS_KV_CAPACITY",
    "STATUS_MASK_CAPACITY",
    "STATUS_NONFINITE",
    "FINISH_DONE",
    "FINISH_NONFINITE",
    "RECORD_HEADER",
    "RING_HEADER",
    "MAX_DEPTH",
    "MAX_BUDGET",
    "MAX_BATCH",
    "LP_FLOOR",
    "FLAG_LEGACY_SEARCH",
    "DDTREE_TOPK_THREADS",
    "DDTREE_TOPK_ELEMS",
    "DDTREE_BUILD_THREADS",
    "DDTREE_MERGE_ELEMS",
    "DDTREE_FALLBACK_SHARED_BYTES",
    "DDTREE_SMALL_THREADS",
    "DDTREE_TK_SAMPLE_VALUES",
    "DDTREE_TK_STREAM_THREADS",
    "DDTREE_TK_STREAM_VECS",
    "DDTREE_TK_STREAM_CTAS_PER_SM",
    "DDTREE_TK_WARP_STAGE",
    "KERNEL_CONSTANTS",
    "kernel_defines",
    "mask_words",
]

# -- status bits: DDTree's step word (``DDTreePlan.step[2]``) and the runner's sticky status
#: The slot pool had fewer free slots than the step needs (DDTree compile: the draft tokens;
#: the autoregressive step: one per active request).
STATUS_POOL_EXHAUSTED = 1
#: A request's tree does not fit ``max_context`` (acceptance was cut; the request finished).
STATUS_CONTEXT_FULL = 2
#: ``kv_indices`` is too small for the step's prefixes (not written).
STATUS_KV_CAPACITY = 4
#: A SGLang mask buffer is too small for the step (not written).
STATUS_MASK_CAPACITY = 8
#: A logits row had no value above -inf (NaN counts as -inf), or a target token was outside
#: the vocabulary; a request whose next token came from such a row finished with
#: :data:`FINISH_NONFINITE`.
STATUS_NONFINITE = 16

# -- finish codes: the ``finished`` word of an accept record
#: A stop token, a full context or the token limit.
FINISH_DONE = 1
#: The walk ended at a node whose target row was not finite (no next token).
FINISH_NONFINITE = 2

# -- record layout
#: int32 words of an accept record before the emitted tokens:
#: ``[accepted_count, num_emitted, bonus_token, finished]``.
RECORD_HEADER = 4
#: int32 words of a runner ring entry before the records: ``[step, status, free slots, active requests]``.
RING_HEADER = 4

# -- limits of a DDTree plan
#: Drafted depths per request (``depth_limit``; the accept walk holds ``MAX_DEPTH + 1`` nodes).
MAX_DEPTH = 32
#: Tree nodes besides the root (``budget``), and the largest top-K.
MAX_BUDGET = 512
#: Request slots of a plan (``max_batch``; compile's per-request prefix sums hold ``MAX_BATCH + 1``).
MAX_BATCH = 1024

#: The log-prob that replaces -inf and NaN (the most negative float32; Python only, the kernels
#: write ``-FLT_MAX``).
LP_FLOOR = float(np.finfo(np.float32).min)

#: ``DDTreePlan.flags`` bit: the one-warp heap for every request instead of the parallel search
#: (tests only; 0 = the fast paths).
FLAG_LEGACY_SEARCH = 1

# -- DDTree kernel geometry (the launchers' block sizes and workspace formulas use them too)
#: Threads of a ``ddtree_topk_chunks_*`` CTA.
DDTREE_TOPK_THREADS = 320
#: Logits per thread of a chunk CTA (a chunk is ``DDTREE_TOPK_THREADS * DDTREE_TOPK_ELEMS`` tokens).
DDTREE_TOPK_ELEMS = 24
#: Threads of a ``ddtree_build`` CTA.
DDTREE_BUILD_THREADS = 512
#: Chunk candidates per thread of ``ddtree_build``'s row merge.
DDTREE_MERGE_ELEMS = 24
#: Bytes of a chunk CTA's shared memory (``ChunkSmem``, cu/ddtree/topk.cuh; a static_assert checks
#: it): the least dynamic shared memory of ``ddtree_build`` in a threshold plan, whose build
#: refines a row the threshold failed, or runs the chunk top-K over it (cu/ddtree/build.cuh,
#: refine_row and chunk_fallback_row; static_asserts check that this holds both).
DDTREE_FALLBACK_SHARED_BYTES = 41_600
#: Threads of ``ddtree_compile``, ``ddtree_accept``, ``ddtree_commit*``.
DDTREE_SMALL_THREADS = 256
#: Threshold top-K (``DDTreePlan(topk="threshold")``, driverlevel._topk_threshold): logits the
#: sample kernel reads per row (its 256 threads hold 16 each).
DDTREE_TK_SAMPLE_VALUES = 4096
#: Threads of a ``ddtree_topk_stream_*`` CTA, and its 16-byte fp32 loads per thread per tile
#: (bf16: half as many; 16 tokens per thread either way).
DDTREE_TK_STREAM_THREADS = 256
DDTREE_TK_STREAM_VECS = 4
#: Stream CTAs per SM the kernel is built for (its ``__launch_bounds__``: <= 64 registers).
DDTREE_TK_STREAM_CTAS_PER_SM = 4
#: Candidates one warp of the stream kernel stages in shared memory before it flushes them.
DDTREE_TK_WARP_STAGE = 64

#: Every constant passed to the kernels (``-DDL_<name>``), by name.
KERNEL_CONSTANTS = (
    "STATUS_POOL_EXHAUSTED", "STATUS_CONTEXT_FULL", "STATUS_KV_CAPACITY", "STATUS_MASK_CAPACITY",
    "STATUS_NONFINITE", "FINISH_DONE", "FINISH_NONFINITE", "RECORD_HEADER", "RING_HEADER",
    "MAX_DEPTH", "MAX_BUDGET", "MAX_BATCH", "FLAG_LEGACY_SEARCH",
    "DDTREE_TOPK_THREADS", "DDTREE_TOPK_ELEMS", "DDTREE_BUILD_THREADS", "DDTREE_MERGE_ELEMS",
    "DDTREE_FALLBACK_SHARED_BYTES", "DDTREE_SMALL_THREADS", "DDTREE_TK_SAMPLE_VALUES", "DDTREE_TK_STREAM_THREADS",
    "DDTREE_TK_STREAM_VECS",
    "DDTREE_TK_STREAM_CTAS_PER_SM", "DDTREE_TK_WARP_STAGE",
)


def kernel_defines() -> dict:
    """``{"DL_STATUS_POOL_EXHAUSTED": 1, ..., "DL_RECORD_HEADER": 4, ...}`` for NVRTC
    (``cu/constants.cuh`` requires every one of them)."""
    g = globals()
    return {f"DL_{name}": int(g[name]) for name in KERNEL_CONSTANTS}


def mask_words(budget: int) -> int:
    """uint32 words per node of a tree's ancestor bitmask: ``ceil((budget + 1) / 32)``, the
    verify bitmask's :func:`~driverlevel._mask.bitmask_words` of the ``budget + 1`` nodes.

    Raises
    ------
    TypeError
        ``budget`` is not an integer (a float or a bool is refused, never truncated):
        ``"budget must be an int >= 0, got float 16.5"``.
    ValueError
        ``budget`` is negative: ``"budget must be an int >= 0, got -1"``."""
    return bitmask_words(non_negative_int("budget", budget) + 1)
