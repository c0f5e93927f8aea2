"""What the runner plugs in: a target forward and a drafter, through small documented protocols.

:class:`~driverlevel.runner.DecodeStepRunner` runs draft → tree build → tree compile →
**target forward** → accept → commit as one CUDA graph, and
:class:`~driverlevel.runner.AutoregressiveRunner` prepare → **target forward** → argmax →
commit. They own every buffer of the step
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

When the runner calls what
--------------------------
- ``reset(prompts, ...)`` (not captured): the drafter's optional ``reset()``, then the target
  forward once over every prompt but its last token (``mask_format="causal"``,
  ``logits=None``), only when some prompt has two tokens or more. A forward may allocate
  there; the prefill is never captured.
- ``capture()``: the forward's optional ``bind(buffers)``, then one step recorded into the
  graph (``DraftModel.run`` and the forward launch once each), replayed by every
  ``step(graph=True)``.
- ``step(graph=False)`` (eager): the same calls again on every step, so host logic in them
  runs per step there and only once in graph mode; keep the two equivalent.
- ``collect()``: the forward's optional ``check_errors()`` at the collect of the last step launched
  (or earlier, once the runner's own error words report one): while later steps are queued, a
  forward's error may be reported a few steps late.

The stream is a :class:`~driverlevel.Stream`: ``stream.handle`` is a cuda-python ``CUstream``,
``int(stream.handle)`` its address (what a C engine takes). driverlevel works in each device's
primary context and captures in ``"thread_local"`` mode; work on a side stream is captured when
that stream waits on an event recorded on ``stream`` and ``stream`` waits on one recorded after
it (CUDA's fork/join). The graph keeps driverlevel's own memory alive; a forward's own
weights and buffers must outlive the runner's graph.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ._array import DeviceArray, array_key
from .verify_attention import VerifyMetadata

__all__ = ["TargetBuffers", "TargetForward", "TargetModel", "DraftModel"]


@dataclass(frozen=True)
class TargetBuffers:
    """What a target forward reads and writes in one step (device arrays, fixed for the runner's life).

    The rows
    --------
    Rows are packed by request: request ``b`` owns rows ``[qo_indptr[b], qo_indptr[b + 1])``
    (none while it is inactive), and the step has ``num_rows = qo_indptr[bs]`` of them, a value
    on the device only. A DDTree step's request has its tree's nodes as rows, node ``i`` at row
    ``qo_indptr[b] + i``, the root (the last accepted token, whose KV is not in the cache yet)
    first and every parent before its children; an autoregressive step has one row per active
    request; prefill has every prompt token but the last.

    **Rows at or past ``num_rows`` belong to no request**: a step writes token 0, position 0 and
    slot -1 (DDTree: write nothing) or the scratch slot (autoregressive) there, so a fixed-shape
    forward that computes every ``max_rows`` row writes no live token's KV; their mask rows are
    stale and their logits rows ignored. (Prefill's padding rows hold token 0, position 0 and
    the scratch slot too.) A forward indexing with -1 must mask it: numpy-style indexing would
    wrap it to the last slot.

    What a row attends to: its request's committed prefix, ``kv_indices[kv_indptr[b] :
    kv_indptr[b + 1]]`` (the slots of positions ``0 .. seq_lens[b] - 1``, in order; where the
    request's ``req_to_token`` held a bad slot, reported as bad metadata, DDTree writes -1 and
    the autoregressive step the scratch slot, whose KV is garbage; none at prefill,
    where ``kv_indptr`` is all zeros and ``kv_indices`` holds one unused entry), plus
    the rows of its own request that ``mask_format`` lets it see, through their
    ``out_cache_loc``: ``"bitmask"``: bit ``j`` (least significant first) of word ``w`` of
    ``custom_mask[qo_indptr[b] + i]`` says node ``32 w + j`` is visible to node ``i`` (set for
    the node itself and its ancestors); ``"causal"``: rows ``0 .. i`` of the request.

    Attributes
    ----------
    input_ids : int32 ``[max_rows]``
        Token of every row.
    positions : int64 ``[max_rows]``
        Position of every row: the request's committed length + the node's depth (the root at
        ``seq_lens[b]``).
    metadata : VerifyMetadata
        ``qo_indptr`` int64 ``[bs + 1]``, ``kv_indptr`` int32 ``[bs + 1]``, ``kv_indices``
        int64 (``[max_batch * max_context]``; ``[1]`` at prefill), ``out_cache_loc`` int64
        ``[max_rows]``, ``custom_mask`` (uint32 ``[max_rows, ceil(max_q / 32)]`` for
        ``"bitmask"``, None for ``"causal"``) and ``mask_indptr`` (None). All read-only for the
        forward: the accept and the commit read them after it.
    kv_cache : bf16 ``[num_slots, 576]``
        The paged latent cache, one slot per token (512 ``c_kv`` then 64 ``k_pe``), with
        ``num_slots = max_batch * (max_context + rows per request) + 1``; the last slot is the
        runner's scratch slot. Row ``r``'s KV goes to slot ``out_cache_loc[r]``; a slot of
        **-1 means write nothing** (a DDTree step whose slot pool ran out: the step's status
        then carries ``STATUS_POOL_EXHAUSTED``). The runners never read or write this array
        themselves: a forward with other layouts or several layers may keep caches of its own
        with ``kv_cache.shape[0]`` rows, indexed by the same slots. (bfloat16 arrays export
        DLPack, not ``__cuda_array_interface__``: view it as uint16 for the latter.)
    logits : float32 ``[max_rows, vocab]`` or None
        Output: row ``r`` holds the next-token logits after ``input_ids[r]``; accept reads row
        ``qo_indptr[b] + i`` as node ``i``'s. None at prefill (only the KV matters then).
    num_rows : int64 ``[1]``
        ``qo_indptr[bs]``: the rows of this step, on the device.
    max_rows, batch_size, max_q : int
        ``max_rows = batch_size * max_q``; ``batch_size`` is the fixed ``bs`` of the metadata
        (prefill: ``max_q = max(1, max_prompt_len - 1)``; its ``max_rows`` may be larger
        than the step's).
    mask_format : str
        ``"bitmask"`` (a DDTree step) or ``"causal"`` (prefill, autoregressive step).
    sglang : dict or None
        SGLang ``custom_mask``/``mask_indptr`` (``TreeMaskMode.FULL_MASK`` and ``QLEN_ONLY``
        layouts). None in the runners' buffers, which compile the bitmask only; a caller driving
        :class:`~driverlevel.ddtree.DDTreePlan` itself gets them with ``mask_formats=``.
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
        """Address, shape and dtype of every buffer and the sizes (a forward packed for one key may be
        replayed for it; :func:`~driverlevel._array.array_key`)."""
        m = self.metadata
        k = array_key
        return (k(self.input_ids), k(self.positions), k(m.qo_indptr), k(m.kv_indptr), k(m.kv_indices),
                k(m.out_cache_loc), k(m.custom_mask), k(m.mask_indptr), k(self.kv_cache), k(self.logits),
                k(self.num_rows), self.max_rows, self.batch_size, self.max_q, self.mask_format)


@runtime_checkable
class TargetForward(Protocol):
    """The target model's forward over one step's rows, launched on the runner's stream.

    ``forward(stream, buffers)`` reads ``buffers.input_ids``, ``buffers.positions`` and
    ``buffers.metadata`` (see :class:`TargetBuffers` for which rows are valid and what each
    attends to), writes the KV of every row below ``num_rows`` whose ``out_cache_loc`` is not
    -1 into ``buffers.kv_cache`` and, in a step, float32 logits into ``buffers.logits``.
    The runner also calls it at ``reset`` for the prompts, with ``buffers.logits = None`` and
    ``mask_format="causal"`` (see the module docstring for when each call happens). With
    ``target_forward=`` one object serves both calls: tell them apart by ``buffers.mask_format``
    (an autoregressive runner's steps are causal too, with logits) and size anything from
    ``buffers`` (``bind`` or the first call), not from the runner's arguments.

    Inside a step it may only launch work on ``stream`` (it is captured with the rest of the
    step): no allocation, synchronization or device-to-host read, and every per-step value read
    from device memory (``num_rows`` included).

    The runner's kernel after the forward (the argmax of the logits) may be a programmatic
    dependent launch (the runner's ``pdl``, default on sm_90+): it waits at its entry for the
    forward's last kernel to complete, and through it for everything before, as a plain stream
    would order it, provided that kernel, if it is itself launched programmatically, runs
    ``griddepcontrol.wait`` in at least one CTA (as CUDA requires of any kernel launched so that
    depends on earlier work). Otherwise pass ``pdl=False`` to the runner.

    Optional members
    ----------------
    bind(buffers) -> None
        Called by ``capture()`` before the capture begins (not before prefill or eager steps),
        so that argument packing and kernel attributes are settled and the capture only
        records launches.
    check_errors() -> None
        Raise if a kernel of the forward found bad per-step metadata since the last check;
        ``collect()`` calls it at the collect of the last step launched (or earlier, after an
        error in the runner's own words). The runner's ``reset`` does not
        clear the forward's own error state.
    pools : sequence of WorkspacePool
        The device pools the forward owns, counted in the runner's ``workspace_bytes`` and
        kept alive by its graph.

    Non-finite logits are allowed: a row with nothing above -inf has posterior token 0, and a
    request whose accepted walk ends at such a row finishes with ``FINISH_NONFINITE``.

    Example
    -------
    >>> def forward(stream, buffers):                                   # doctest: +SKIP
    ...     if buffers.mask_format == "causal":                          # prompts: KV only
    ...         my_engine.prefill(int(stream.handle), buffers)
    ...     else:
    ...         my_engine.launch_verify(int(stream.handle), buffers.input_ids.ptr, buffers.metadata,
    ...                                 buffers.kv_cache.ptr, buffers.logits.ptr)
    >>> runner = DecodeStepRunner(dev, target_forward=forward, drafter=drafter, vocab_size=V, ...)  # doctest: +SKIP
    """

    def __call__(self, stream, buffers: TargetBuffers) -> None: ...


@runtime_checkable
class TargetModel(Protocol):
    """A target model that makes forwards sized by the runner (the runners' ``model=``).

    Attributes
    ----------
    vocab_size : int
        Columns of the logits (>= 2); the drafter's logits have the same columns. A
        :class:`~driverlevel.runner.DecodeStepRunner` also needs ``ceil(vocab_size / 7680) *
        min(budget, vocab_size) <= 12288`` (the tree build's row merge; up to 184,320 tokens at
        budget 512); token ids are int32.

    Methods
    -------
    forward_plan(*, max_batch, max_q, num_splits, mask_format, name) -> TargetForward
        A forward for ``max_batch`` requests of at most ``max_q`` rows each:
        ``mask_format`` is ``"bitmask"`` (tree rows, ``max_q = budget + 1``) or
        ``"causal"`` (prompts and the autoregressive step); ``num_splits`` caps the verify
        attention's split-KV pieces (None: its GPU scheduler decides every step);
        ``name`` labels its pools. The runner makes one for the step and one for prefill
        (``max_q = max(1, max_prompt_len - 1)``, ``num_splits = prefill_splits``).
    """

    vocab_size: int

    def forward_plan(self, *, max_batch: int, max_q: int, num_splits: int | None = None, mask_format: str = "bitmask",
                     name: str = "forward") -> TargetForward: ...


@runtime_checkable
class DraftModel(Protocol):
    """The drafter of a DDTree step: per-depth logits of the tokens after each root.

    Attributes
    ----------
    logits : DeviceArray, float32 ``[max_batch, depth_limit, vocab]``, C-contiguous, on the runner's device
        Written by :meth:`run`: row ``[b, i]`` is the drafter's logits (natural-log units,
        any offset) for position ``seq_lens[b] + i + 1`` of request ``b``. The DDTree
        build reads it right after :meth:`run`, in the same graph; it reads the rows of
        inactive requests too, so the whole array must exist, but their values do not matter.
        A row whose maximum is not finite gets log-probs of ``LP_FLOOR`` and sets
        ``STATUS_NONFINITE`` in the step's status (``runner.last_status``); nothing is raised.

    Methods
    -------
    prepare(root_tokens) -> None
        Called once by the runner with its int32 ``[max_batch]`` device array of root
        tokens (every request's last accepted token, whose KV is not in the cache yet: the
        root of its next tree, at position ``seq_lens[b]``; accept rewrites it every step);
        :meth:`run` reads it on the device.
    run(stream) -> None
        Launch the drafter on ``stream`` (captured with the rest of the step).

    The protocol gives the drafter the root tokens only: no ``seq_lens``, accepted path or
    target hidden states, so a drafter that needs its request's context (EAGLE-style) must
    hold references to what it needs itself (e.g. the runner's ``state`` arrays, after
    construction); the runner offers no hook after accept.

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
