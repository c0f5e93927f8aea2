"""What the runner plugs in: a target forward and a drafter, through small documented protocols.

:class:`~driverlevel.runner.DecodeStepRunner` and
:class:`~driverlevel.runner.AutoregressiveRunner` run draft → tree build → tree compile →
**target forward** → accept → commit as one CUDA graph. They own every buffer of the step
and know the target model and the drafter only through these protocols, so the demo model
(:mod:`driverlevel.demo`), the external target of ``examples/external_target_forward.py``
and a non-torch runtime plug in the same way:

:class:`TargetForward`
    ``forward(stream, buffers)`` launches the target on one step's :class:`TargetBuffers`.
:class:`TargetModel`
    A factory of forwards sized by the runner (``model=``): ``vocab_size`` and
    ``forward_plan(max_batch=, max_q=, num_splits=, mask_format=, name=)``.
:class:`DraftModel`
    The drafter of a DDTree step: ``logits``, ``prepare(root_tokens)``, ``run(stream)``.

Every call the runner makes inside a step (``TargetForward.__call__``, ``DraftModel.run``)
is captured into the step's graph once and replayed: it may only *launch* work on the given
stream (no allocation, no synchronization, no device-to-host read), and it must read
everything that varies per step from device memory. Members marked optional are looked up
with ``getattr`` and skipped when absent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ._array import DeviceArray
from .verify_attention import VerifyMetadata

__all__ = ["TargetBuffers", "TargetForward", "TargetModel", "DraftModel"]


@dataclass(frozen=True)
class TargetBuffers:
    """What a target forward reads and writes in one step (device arrays, fixed for the runner's life).

    Attributes
    ----------
    input_ids : int32 ``[max_rows]``
        Token of every row (draft-tree node; root first per request). Rows past
        ``qo_indptr[bs]`` are stale and must be ignored.
    positions : int64 ``[max_rows]``
        Position of every row (committed length + depth).
    metadata : VerifyMetadata
        ``qo_indptr`` int64 ``[bs + 1]``, ``kv_indptr`` int32 ``[bs + 1]``, ``kv_indices``
        int64, ``out_cache_loc`` int64 ``[max_rows]`` (where each row's latent KV must be
        written), ``custom_mask`` (uint32 bitmask ``[max_rows, words]``, or None for a
        causal chain) and ``mask_indptr`` (None).
    kv_cache : bf16 ``[num_slots, 576]``
        The paged latent cache (512 ``c_kv`` + 64 ``k_pe`` per slot).
    logits : float32 ``[max_rows, vocab]`` or None
        Output. None during prefill (only the KV of the rows matters then).
    num_rows : int64 ``[1]``
        ``qo_indptr[bs]``: the rows of this step, on the device.
    max_rows, batch_size, max_q : int
        ``max_rows = batch_size * max_q``; ``batch_size`` is the fixed ``bs`` of the metadata.
    mask_format : str
        ``"bitmask"`` (a DDTree step) or ``"causal"`` (prefill, autoregressive step).
    sglang : dict or None
        SGLang ``custom_mask``/``mask_indptr`` in the FULL and QLEN_ONLY layouts, where
        the tree kernels produce them.
    """

    input_ids: DeviceArray
    positions: DeviceArray
    metadata: VerifyMetadata
    kv_cache: DeviceArray
    logits: DeviceArray | None
    num_rows: DeviceArray
    max_rows: int
    batch_size: int
    max_q: int
    mask_format: str
    sglang: dict | None = None

    def key(self) -> tuple:
        """Addresses of every buffer (a forward packed for one key may be replayed for it)."""
        m = self.metadata
        ptr = lambda a: 0 if a is None else int(a.ptr)  # noqa: E731
        return (ptr(self.input_ids), ptr(self.positions), ptr(m.qo_indptr), ptr(m.kv_indptr), ptr(m.kv_indices),
                ptr(m.out_cache_loc), ptr(m.custom_mask), ptr(m.mask_indptr), ptr(self.kv_cache), ptr(self.logits),
                self.max_rows, self.mask_format)


@runtime_checkable
class TargetForward(Protocol):
    """The target model's forward over one step's rows, launched on the runner's stream.

    ``forward(stream, buffers)`` reads ``buffers.input_ids`` (int32 ``[max_rows]``),
    ``buffers.positions`` (int64 ``[max_rows]``) and ``buffers.metadata`` (SGLang dtypes:
    ``qo_indptr`` int64 ``[bs + 1]``, ``kv_indptr`` int32 ``[bs + 1]``, ``kv_indices`` int64,
    ``out_cache_loc`` int64 ``[max_rows]``, the tree's uint32 bitmask ``[max_rows, words]``
    in ``custom_mask`` or None for a causal chain), writes every row's latent KV (bf16
    ``[576]``: 512 ``c_kv`` + 64 ``k_pe``) into ``buffers.kv_cache[out_cache_loc[row]]`` and
    float32 logits ``[max_rows, vocab]`` into ``buffers.logits``. The step's row count is on
    the device (``buffers.num_rows`` = ``qo_indptr[bs]``); rows past it are stale. The runner
    also calls it once per ``reset`` for the prompts, with ``buffers.logits = None`` and a
    causal ``buffers.mask_format``: only the KV matters then.

    It may only launch work on ``stream`` (it is captured with the rest of the step).

    Optional members
    ----------------
    bind(buffers) -> None
        Called by ``capture()`` before the capture begins, so that argument packing and
        kernel attributes are settled and the capture only records launches.
    check_errors() -> None
        Raise if a kernel of the forward found bad per-step metadata since the last check;
        the runner calls it after every step it collects.
    pools : sequence of WorkspacePool
        The device pools the forward owns, counted in the runner's ``workspace_bytes`` and
        kept alive by its graph.

    Example
    -------
    >>> def forward(stream, buffers):                                   # doctest: +SKIP
    ...     my_engine.launch_verify(stream.handle, buffers.input_ids.ptr, buffers.metadata, buffers.logits)
    >>> runner = DecodeStepRunner(dev, target_forward=forward, drafter=drafter, vocab_size=V, ...)
    """

    def __call__(self, stream, buffers: TargetBuffers) -> None: ...


@runtime_checkable
class TargetModel(Protocol):
    """A target model that makes forwards sized by the runner (the runners' ``model=``).

    Attributes
    ----------
    vocab_size : int
        Columns of the logits (>= 2).

    Methods
    -------
    forward_plan(*, max_batch, max_q, num_splits, mask_format, name) -> TargetForward
        A forward for ``max_batch`` requests of at most ``max_q`` rows each:
        ``mask_format`` is ``"bitmask"`` (tree rows, ``max_q = budget + 1``) or
        ``"causal"`` (prompts and the autoregressive step); ``num_splits`` caps the verify
        attention's split-KV pieces (None: its GPU scheduler decides every step);
        ``name`` labels its pools. The runner makes one for the step and one for prefill
        (``max_q = max_prompt_len - 1``, ``num_splits = prefill_splits``).
    """

    vocab_size: int

    def forward_plan(self, *, max_batch: int, max_q: int, num_splits: int | None = None, mask_format: str = "bitmask",
                     name: str = "forward") -> TargetForward: ...


@runtime_checkable
class DraftModel(Protocol):
    """The drafter of a DDTree step: per-depth logits of the tokens after each root.

    Attributes
    ----------
    logits : DeviceArray, float32 ``[max_batch, depth_limit, vocab]``, C-contiguous
        Written by :meth:`run`: row ``[b, i]`` is the drafter's logits (natural-log units,
        any offset) for position ``seq_lens[b] + i + 1`` of request ``b``. The DDTree
        build reads it right after :meth:`run`, in the same graph.

    Methods
    -------
    prepare(root_tokens) -> None
        Called once by the runner with its int32 ``[max_batch]`` device array of root
        tokens (the last committed token of every request, which accept rewrites every
        step); :meth:`run` reads it on the device.
    run(stream) -> None
        Launch the drafter on ``stream`` (captured with the rest of the step).

    Optional members
    ----------------
    reset() -> None
        Called by the runner's ``reset`` (not capture-safe), e.g. to rewind a noise counter.
    pools : sequence of WorkspacePool
        The device pools the drafter owns, counted in the runner's ``workspace_bytes``.
    """

    logits: DeviceArray

    def prepare(self, root_tokens: DeviceArray) -> None: ...

    def run(self, stream) -> None: ...
