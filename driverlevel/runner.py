"""The decode-step runner: one whole speculative-decoding step as one CUDA graph.

:class:`DecodeStepRunner` owns every buffer of a batch of requests (the paged latent KV
cache, the request state and slot pool -- :attr:`~DecodeStepRunner.state`, a
:class:`~driverlevel.request_state.RequestState` that the DDTree kernels read under the same
names --, the verify metadata, the logits, the DDTree workspaces and a mapped pinned mirror
of each step's results), all allocated before capture. One step is::

    draft      drafter logits [bs, depth_limit, vocab]           (the DraftModel)
    build      DDTree best-first tree of <= budget nodes          (driverlevel.ddtree)
    compile    input ids, positions, slots, qo/kv indptr, bitmask (driverlevel.ddtree)
    forward    target logits over every tree node                 (the TargetForward)
    accept     greedy walk from the root, bonus token, stop tokens (driverlevel.ddtree)
    commit     paged: keep accepted slots, free the rest          (driverlevel.ddtree)
    publish    max-new-tokens limit, records into the host mirror (runner.cu)

:meth:`DecodeStepRunner.capture` records it once; :meth:`~DecodeStepRunner.step` replays
it (one ``cuGraphLaunch`` and one event record). The host learns what each step produced
by reading the mapped pinned ring after the step's event: no copy call, no
synchronization inside the step. Finished requests (a stop token, ``max_new_tokens``, or a
full context) stay inactive in the same graph; :meth:`~DecodeStepRunner.reset` starts new
requests in the same buffers, so the graph is never captured again.

:class:`AutoregressiveRunner` is the baseline with the same model: one token per request
per step (``q_len`` 1, the verify attention with a causal chain of length 1), captured
and replayed the same way.

Plugging in a target and a drafter
----------------------------------
The runners know the target model and the drafter only through the protocols of
:mod:`driverlevel.interfaces`:

* ``model=`` a :class:`~driverlevel.interfaces.TargetModel` (``vocab_size`` and
  ``forward_plan(...)``): the runner makes the step's forward and the prefill's from it;
* or ``target_forward=`` a :class:`~driverlevel.interfaces.TargetForward` (with
  ``vocab_size=``): called as ``target_forward(stream, buffers)`` with a
  :class:`TargetBuffers`, for the step (captured) and, with ``buffers.logits = None``, for
  the prompts of every :meth:`~DecodeStepRunner.reset`; see
  ``examples/external_target_forward.py``;
* ``drafter=`` a :class:`~driverlevel.interfaces.DraftModel` (``logits``,
  ``prepare(root_tokens)``, ``run(stream)``), required by :class:`DecodeStepRunner`.

The demo model and drafter (:mod:`driverlevel.demo`) plug in this way; nothing in this
module knows them.
"""

from __future__ import annotations

import ctypes
import inspect
import operator
import time
from dataclasses import dataclass, field

import numpy as np

from ._array import DeviceArray
from ._capture_guard import ensure_not_capturing
from ._checks import bool_arg, device_array_arg, int_tuple, is_bool, non_negative_int, positive_int, stream_arg
from ._compile import CompileVariant, compile_file, normalize_arch
from ._constants import (
    FINISH_DONE,
    FINISH_NONFINITE,
    MAX_BUDGET,
    MAX_DEPTH,
    RECORD_HEADER,
    RING_HEADER,
    STATUS_NONFINITE,
    kernel_defines,
)
from ._device import _check_device_arg
from ._device_error import DeviceErrorWord, error_defines
from ._dtypes import bfloat16
from ._graph import capture as _capture
from ._memory import PinnedHostBuffer, WorkspacePool
from ._module import check_pdl_arg, load_module, resolve_pdl
from .argmax import MAX_ROW_LEN, argmax_rows_launch
from .argmax import load as _load_argmax
from .ddtree import DDTreePlan, check_merge_capacity
from .interfaces import DraftModel, TargetBuffers, TargetForward, TargetModel
from .request_state import RequestState
from .verify_attention import MAX_SPLITS, VerifyMetadata

__all__ = [
    "DecodeStepRunner",
    "AutoregressiveRunner",
    "TargetBuffers",
    "TargetForward",
    "TargetModel",
    "DraftModel",
    "GenerationResult",
    "RECORD_HEADER",
    "RING_HEADER",
    "STATUS_NONFINITE",
    "FINISH_DONE",
    "FINISH_NONFINITE",
    "compile_defines",
    "compile_variants",
    "dynamic_shared_bytes",
]

SOURCE = "runner.cu"
# RECORD_HEADER, RING_HEADER, the STATUS_* bits and the FINISH_* codes are driverlevel._constants'
# (documented there; compiled into runner.cu as -DDL_<NAME>), re-exported here.


class _StepParams(ctypes.Structure):
    """ctypes mirror of ``StepParams`` in cu/runner.cu."""

    _fields_ = [
        ("root_tokens", ctypes.c_uint64), ("active", ctypes.c_uint64), ("seq_lens", ctypes.c_uint64),
        ("remaining", ctypes.c_uint64), ("req_to_token", ctypes.c_uint64), ("req_pool_indices", ctypes.c_uint64),
        ("stop_tokens", ctypes.c_uint64), ("free_slots", ctypes.c_uint64), ("free_count", ctypes.c_uint64),
        ("qo_indptr", ctypes.c_uint64), ("kv_indptr", ctypes.c_uint64), ("kv_indices", ctypes.c_uint64),
        ("input_ids", ctypes.c_uint64), ("positions", ctypes.c_uint64), ("out_cache_loc", ctypes.c_uint64),
        ("argmax_part", ctypes.c_uint64), ("records", ctypes.c_uint64),
        ("ring", ctypes.c_uint64), ("step_counter", ctypes.c_uint64), ("status", ctypes.c_uint64),
        ("error", ctypes.c_uint64), ("accepted_count", ctypes.c_uint64),
        ("tree_state", ctypes.c_uint64),
        ("scratch_slot", ctypes.c_int64), ("free_capacity", ctypes.c_int64), ("r2t_rows", ctypes.c_int64),
        ("bs", ctypes.c_int32), ("max_context", ctypes.c_int32), ("n_stop", ctypes.c_int32),
        ("record_width", ctypes.c_int32), ("ring_slots", ctypes.c_int32), ("kv_capacity", ctypes.c_int32),
    ]


def compile_defines(arch) -> dict:
    """NVRTC defines of ``cu/runner.cu``: the StepParams layout (checked by static_assert), the
    shared constants (:func:`driverlevel._constants.kernel_defines`) and the error word's numbers."""
    normalize_arch(arch)
    d = {f"DL_OFF_S_{name}": getattr(_StepParams, name).offset for name, *_ in _StepParams._fields_}
    d["DL_SIZEOF_S"] = ctypes.sizeof(_StepParams)
    d.update(kernel_defines())
    d.update(error_defines())
    return d


#: Largest ``max_batch`` of a runner.
MAX_RUNNER_BATCH = 256

#: Largest ``ring_slots`` of a runner: each slot is two timing events and a pinned ring entry, made
#: at construction (a billion slots would spend hours creating events).
MAX_RING_SLOTS = 4096


def dynamic_shared_bytes(arch) -> dict:
    """Worst-case dynamic shared memory of the record kernels: ``max_batch * record_width * 4`` B at
    ``max_batch = 256`` and ``record_width = RECORD_HEADER + 1`` (``ar_commit``) or
    ``RECORD_HEADER + MAX_DEPTH + 1`` (``publish_records``)."""
    normalize_arch(arch)
    return {"ar_commit": MAX_RUNNER_BATCH * (RECORD_HEADER + 1) * 4,
            "publish_records": MAX_RUNNER_BATCH * (RECORD_HEADER + MAX_DEPTH + 1) * 4}


def compile_variants(arch) -> list:
    """The one way ``runner.cu`` is compiled on ``arch``, with its worst-case dynamic shared memory."""
    return [CompileVariant(compile_defines(arch), dynamic_shared_bytes(arch))]


def _load(device):
    arch = normalize_arch(device.arch)
    return load_module(device, compile_file(SOURCE, arch, compile_defines(arch)))


# ---------------------------------------------------------------------------------------------

@dataclass
class GenerationResult:
    """What :meth:`DecodeStepRunner.generate` produced.

    Attributes
    ----------
    tokens : list of list of int
        Per request, the generated tokens (stop token included, at most ``max_new_tokens``).
    steps : int
        Steps run.
    step_seconds : list of float
        Host wall time of every step (launch to event), seconds.
    tokens_per_step : float
        Mean tokens produced per (step, active request): the acceptance length.
    finished : list of bool
    finish_codes : list of int
        Per request, the ``finished`` word of its last record: 0 (still running),
        :data:`FINISH_DONE` or :data:`FINISH_NONFINITE`.
    """

    tokens: list
    steps: int
    step_seconds: list = field(default_factory=list)
    tokens_per_step: float = 0.0
    finished: list = field(default_factory=list)
    finish_codes: list = field(default_factory=list)


def _int_in(name, v, lo, hi) -> int:
    """``v`` as an int in ``[lo, hi]``: TypeError for a non-integer (bool and floats included, as the
    plans), ValueError for one out of range; both name the argument."""
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{name} must be an int in [{lo}, {hi}], got {type(v).__name__} {v!r}")
    if not lo <= v <= hi:
        raise ValueError(f"{name} must be an int in [{lo}, {hi}], got {v!r}")
    return int(v)


def _check_options(cls, kw: dict) -> None:
    """TypeError naming the public runner class ``cls`` for a keyword that neither it nor
    :class:`_RunnerBase` takes (the runners pass their other keywords on to the base, whose own
    error would name the private class)."""
    allowed = set(inspect.signature(_RunnerBase.__init__).parameters) - {"self", "device"}
    for k in kw:
        if k not in allowed:
            raise TypeError(f"{cls.__name__}() got an unexpected keyword argument {k!r}")


def _is_int(x) -> bool:
    """One integer as :func:`~driverlevel._checks.int_tuple` takes it (``__index__``; no bool, no float,
    no numpy array of several)."""
    if is_bool(x) or (isinstance(x, np.ndarray) and x.ndim):
        return False
    try:
        operator.index(x)
    except TypeError:
        return False
    return True


def _is_seq(x) -> bool:
    """Iterable and not a str / bytes (whose items would be read as tokens)."""
    return hasattr(x, "__iter__") and not isinstance(x, (str, bytes))


def _as_int_list(name, x, n):
    if _is_int(x):
        return [int(operator.index(x))] * n
    if not _is_seq(x):
        raise TypeError(f"{name} must be an int or a sequence of ints (one per request), got {type(x).__name__} {x!r}")
    x = list(int_tuple(name, x))
    if len(x) != n:
        raise ValueError(f"{name} must be an int or one per request ({n}), got {len(x)}")
    return x


def _prompt_lists(prompts) -> list:
    """``prompts`` as lists of Python ints: a sequence of token sequences; floats, bools and str refused."""
    if not _is_seq(prompts):
        raise TypeError(f"prompts must be a sequence of prompts, each a sequence of int token ids, "
                        f"got {type(prompts).__name__} {prompts!r}"[:300])
    out = []
    for i, p in enumerate(prompts):
        if not _is_seq(p):
            hint = "; for one request write prompts=[[...]]" if _is_int(p) else ""
            raise TypeError(f"prompts[{i}] must be a sequence of int token ids, got {type(p).__name__} {p!r}{hint}")
        out.append(list(int_tuple(f"prompts[{i}]", p)))
    return out


def _stop_lists(stop_tokens, n: int) -> list:
    """``stop_tokens`` (None, an int, a list for all, or one list per request) as ``n`` lists of ints.

    A flat sequence of ints is always the list for all (``[5, 7]`` with two requests: both stop on
    5 and 7); per request it is one list each (``[[5], [7]]``), where an int entry, once any entry
    is a list, stands for a one-token list."""
    if stop_tokens is None:
        return [[] for _ in range(n)]
    if _is_int(stop_tokens):
        return [[int(operator.index(stop_tokens))] for _ in range(n)]
    if not _is_seq(stop_tokens):
        raise TypeError(f"stop_tokens must be None, an int, a sequence of ints or one per request, "
                        f"got {type(stop_tokens).__name__} {stop_tokens!r}")
    items = list(stop_tokens)
    if all(_is_int(s) for s in items):  # one list for all ([] included: no stop token)
        return [list(int_tuple("stop_tokens", items)) for _ in range(n)]
    per = []
    for i, s in enumerate(items):
        if not (_is_int(s) or _is_seq(s)):
            raise TypeError(f"stop_tokens[{i}] must be an int or a sequence of ints, got {type(s).__name__} {s!r}")
        per.append(list(int_tuple(f"stop_tokens[{i}]", s)))
    if len(per) != n:
        raise ValueError(f"stop_tokens: one list per request ({n}) expected, got {len(per)}")
    return per


#: What both runners' docstrings share, written once and put in by :func:`_with_base_kwargs`:
#: the ``num_splits`` parameter, the keyword arguments of :class:`_RunnerBase`, the common errors.
_NUM_SPLITS_DOC = """    num_splits : int, optional
        Cap on the split-KV pieces of one (request, row tile) pair of the verify attention;
        default None: its scheduler kernel splits each step's work on the GPU. With
        ``target_forward=`` the runner makes no verify plan: the value (and ``prefill_splits``) is
        only checked to be a positive int and kept as ``self.num_splits`` for the caller's forward.
"""
_COMMON_RAISES_DOC = """    CaptureError
        If constructed during a capture (it allocates).
    NvrtcError, CudaError
        If the kernels cannot be compiled or loaded.
"""
_BASE_KWARGS_DOC = """    Other keyword arguments
    -----------------------
    prefill_splits : int
        ``num_splits`` of the prefill's forward (default 1; with ``model=`` only).
    max_stop_tokens : int
        Stop tokens per request :meth:`reset` accepts (default 4).
    ring_slots : int
        Steps that may be in flight before :meth:`step` collects the oldest (default 64; at most
        ``MAX_RING_SLOTS``, 4096).
    stream : Stream, optional
        The stream the steps run on (default: a new one on ``device``); a driverlevel Stream
        (``TypeError`` otherwise, before the device is opened) of ``device`` (``ValueError``
        otherwise).
    slot_seed : int
        Seed of the shuffled free-slot stack :meth:`reset` builds (default 0).
    pdl : bool, optional
        Programmatic dependent launch of the runner's own kernels after the target's forward (its
        argmax and record kernels) and, for :class:`DecodeStepRunner`, of its
        :class:`~driverlevel.ddtree.DDTreePlan`'s (``DDTreePlan(pdl=)``). None (default): where the
        device is sm_90 or newer; True on a device below sm_90 raises ``ValueError`` (once the device
        is opened, before anything is created on it); anything but None, True or False
        ``TypeError`` (before the device is opened). The resolved value is ``self.pdl``. Each
        such kernel waits at its entry for the kernel before it, before anything else. The model's own launches
        follow the model (``MLAModel(pdl=)``). False everywhere gives a step of ordinary launches
        only (slower by ~1 µs a launch; for bisecting an ordering question).
    name : str
        Label of the runner's pools.
"""


def _with_base_kwargs(cls):
    """Class decorator: put the shared parts where ``cls``'s docstring says ``{num_splits}``,
    ``{other keyword arguments}`` and ``{common raises}``."""
    if cls.__doc__:  # None under python -OO
        for key, text in (("num_splits", _NUM_SPLITS_DOC), ("other keyword arguments", _BASE_KWARGS_DOC),
                          ("common raises", _COMMON_RAISES_DOC)):
            cls.__doc__ = cls.__doc__.replace("    {" + key + "}\n", text)
    return cls


class _RunnerBase:
    """Buffers, prefill, capture and the host mirror shared by both runners."""

    kind = "base"
    _rows_per_request = 1

    def __init__(self, device, *, model=None, target_forward=None, vocab_size: int | None = None,
                 max_batch: int, max_context: int, max_prompt_len: int, num_splits: int | None = None,
                 prefill_splits: int = 1, max_stop_tokens: int = 4, ring_slots: int = 64, stream=None,
                 slot_seed: int = 0, pdl: bool | None = None, name: str = "runner"):
        max_batch, max_context = positive_int("max_batch", max_batch), positive_int("max_context", max_context)
        if int(max_batch) * int(max_context) > 2**31 - 1:
            # kv_indptr and the kernels' kv_capacity are int32
            raise ValueError(f"max_batch * max_context = {max_batch} * {max_context} = {int(max_batch) * int(max_context)} "
                             f"exceeds 2**31 - 1, the range of the int32 kv_indptr: lower max_batch or max_context")
        if (model is None) == (target_forward is None):
            raise ValueError("pass exactly one of model= (a TargetModel) or target_forward= (a TargetForward)")
        if model is not None and not isinstance(model, TargetModel):
            raise TypeError(f"model= must be a driverlevel.interfaces.TargetModel (vocab_size and forward_plan()), "
                            f"got {type(model).__name__}")
        if target_forward is not None and not callable(target_forward):
            raise TypeError(f"target_forward= must be a driverlevel.interfaces.TargetForward (a callable "
                            f"forward(stream, buffers)), got {type(target_forward).__name__}")
        # Every argument is checked before the device is touched (a bad one is its TypeError /
        # ValueError, also without a GPU), then the subclass's own (_check_more_args).
        max_prompt_len = positive_int("max_prompt_len", max_prompt_len)
        if num_splits is not None:
            num_splits = positive_int("num_splits", num_splits)
        prefill_splits = positive_int("prefill_splits", prefill_splits)
        ring_slots = positive_int("ring_slots", ring_slots)
        max_stop_tokens = positive_int("max_stop_tokens", max_stop_tokens)
        slot_seed = non_negative_int("slot_seed", slot_seed)
        if max_batch > MAX_RUNNER_BATCH:
            raise ValueError(f"max_batch must be <= {MAX_RUNNER_BATCH}, got {max_batch}")
        if ring_slots > MAX_RING_SLOTS:
            raise ValueError(f"ring_slots must be <= {MAX_RING_SLOTS}, got {ring_slots}")
        if model is not None:  # the model's forwards are VerifyAttention plans: their limit, checked now
            for split_name, splits in (("num_splits", num_splits), ("prefill_splits", prefill_splits)):
                if splits is not None and splits > MAX_SPLITS:
                    raise ValueError(f"{split_name} must be <= {MAX_SPLITS} (the verify attention's limit), "
                                     f"got {splits}")
        if model is not None:
            vocab_size = model.vocab_size
        elif vocab_size is None:
            raise ValueError("vocab_size is required with target_forward=")
        src = "model.vocab_size" if model is not None else "vocab_size"
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, (int, np.integer)):
            raise TypeError(f"{src} must be an int >= 2, got {type(vocab_size).__name__} {vocab_size!r}")
        if vocab_size < 2:
            raise ValueError(f"{src} must be an int >= 2, got {vocab_size!r}")
        if vocab_size > MAX_ROW_LEN:  # the greedy argmax's limit (argmax_layout), checked before the device
            raise ValueError(f"{src} must be <= {MAX_ROW_LEN:,} (2**30, the argmax kernels' row length), "
                             f"got {vocab_size:,}")
        if max_prompt_len > max_context:
            raise ValueError(f"max_prompt_len ({max_prompt_len}) exceeds max_context ({max_context})")
        need = max_prompt_len + 1 + self._rows_per_request  # what reset() asks of its longest prompt
        if need > max_context:
            raise ValueError(f"max_prompt_len ({max_prompt_len}) leaves no room in max_context ({max_context}): "
                             f"a prompt that long needs {need} positions (1 new token and one step's "
                             f"{self._rows_per_request} rows more); use max_prompt_len <= "
                             f"{max_context - 1 - self._rows_per_request} or max_context >= {need}")
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, got {type(name).__name__}")
        if stream is not None:
            stream_arg("stream", stream)
        self.model = model
        self.vocab_size = int(vocab_size)
        self.max_batch = int(max_batch)
        self.max_context = int(max_context)
        self.max_prompt_len = int(max_prompt_len)
        self.num_splits = num_splits
        self.n_stop = max_stop_tokens
        self.ring_slots = ring_slots
        self.slot_seed = slot_seed
        self.name = name
        self._check_more_args()
        check_pdl_arg(pdl)  # (before the device is opened)
        self.device = _check_device_arg(device)
        #: Whether the runner's own kernels are programmatic launches (the ``pdl`` keyword resolved
        #: for the device; before anything is created or compiled).
        self.pdl = resolve_pdl(pdl, self.device.arch)
        if stream is not None:
            stream_arg("stream", stream, self.device, "the runner")
        ensure_not_capturing(f"{type(self).__name__}()")
        self.stream = stream if stream is not None else self.device.create_stream()
        self._module = _load(self.device)
        self.max_rows = self.max_batch * self._rows_per_request
        # The cache holds every request's context plus one step's nodes, and one scratch slot.
        self.num_slots = self.max_batch * (self.max_context + self._rows_per_request) + 1
        self.scratch_slot = self.num_slots - 1
        self.record_width = RECORD_HEADER + self._emit_width()

        B, C, S, R, V = self.max_batch, self.max_context, self.num_slots, self.max_rows, self.vocab_size
        self.kv_pool = WorkspacePool.allocate(self.device, WorkspacePool.required_bytes([((S, 576), bfloat16)]),
                                              label=f"{name}.kv_cache")
        self.kv_cache = self.kv_pool.carve("kv_cache", (S, 576), bfloat16)
        #: The request state and the slot pool (:class:`~driverlevel.request_state.RequestState`), shared with
        #: the DDTree kernels: ``active``, ``root_tokens``, ``seq_lens``, ``req_pool_indices`` (identity),
        #: ``req_to_token`` int32 ``[max_batch, max_context]``, ``free_slots`` ``[num_slots]``,
        #: ``free_count``, ``stop_tokens`` ``[max_batch, max_stop_tokens]`` and ``remaining``.
        self.state = RequestState.allocate(self.device, max_batch=B, max_context=C, num_slots=S, n_stop=self.n_stop,
                                           remaining=True, label=f"{name}.request_state")
        specs = [((1,), np.uint64), ((1,), np.int32),
                 ((B + 1,), np.int64), ((B + 1,), np.int32), ((B * C,), np.int64), ((R,), np.int32), ((R,), np.int64),
                 ((R,), np.int64), ((R,), np.uint64), ((B, self.record_width), np.int32)]
        self.step_pool = WorkspacePool.allocate(self.device, WorkspacePool.required_bytes(specs), label=f"{name}.step")
        sp = self.step_pool
        self.step_counter = sp.carve("step_counter", (1,), np.uint64)
        self.status = sp.carve("status", (1,), np.int32)
        self.qo_indptr = sp.carve("qo_indptr", (B + 1,), np.int64)
        self.kv_indptr = sp.carve("kv_indptr", (B + 1,), np.int32)
        self.kv_indices = sp.carve("kv_indices", (B * C,), np.int64)
        self.input_ids = sp.carve("input_ids", (R,), np.int32)
        self.positions = sp.carve("positions", (R,), np.int64)
        self.out_cache_loc = sp.carve("out_cache_loc", (R,), np.int64)
        #: argmax.cu's composite per q row (the autoregressive step's next token; ar_commit reads and clears it).
        self.argmax_part = sp.carve("argmax_part", (R,), np.uint64)
        self.records = sp.carve("records", (B, self.record_width), np.int32)
        zero = self.device.create_stream()
        sp_all = DeviceArray(sp.base, (sp.capacity,), np.uint8, self.device, owner=sp)
        sp_all.fill_bytes(0, zero)  # no request is active until reset()
        zero.synchronize()
        self.logits_pool = WorkspacePool.allocate(self.device, WorkspacePool.required_bytes([((R, V), np.float32)]),
                                                  label=f"{name}.logits")
        self.logits = self.logits_pool.carve("logits", (R, V), np.float32)
        self.entry_words = RING_HEADER + B * self.record_width
        self.ring = PinnedHostBuffer.allocate(self.device, self.ring_slots * self.entry_words * 4, mapped=True,
                                              label=f"{name}.mirror")
        self._ring_host = self.ring.numpy((self.ring_slots, self.entry_words), np.int32)
        self._ring_dev = self.ring.as_array((self.ring_slots * self.entry_words,), np.int32)
        #: The device error word the runner's kernels report bad per-step metadata in.
        self.error_word = DeviceErrorWord(self.device, label=f"{type(self).__name__} {name}")
        self._events = [self.device.create_event(timing=True) for _ in range(self.ring_slots)]
        self._start_events = [self.device.create_event(timing=True) for _ in range(self.ring_slots)]
        #: The step whose start event each ring slot holds (-1: none, or its step ran without gpu_timing).
        self._timed = [-1] * self.ring_slots

        # Prefill: prompt[:-1] of every request through a causal plan sized for the longest prompt.
        P = max(1, self.max_prompt_len - 1)
        pspecs = [((B * P,), np.int32), ((B * P,), np.int64), ((B * P,), np.int64), ((B + 1,), np.int64),
                  ((B + 1,), np.int32), ((1,), np.int64)]
        self.prefill_pool = WorkspacePool.allocate(self.device, WorkspacePool.required_bytes(pspecs),
                                                   label=f"{name}.prefill")
        pp = self.prefill_pool
        self._pf_ids = pp.carve("input_ids", (B * P,), np.int32)
        self._pf_pos = pp.carve("positions", (B * P,), np.int64)
        self._pf_loc = pp.carve("out_cache_loc", (B * P,), np.int64)
        self._pf_qo = pp.carve("qo_indptr", (B + 1,), np.int64)
        self._pf_kvp = pp.carve("kv_indptr", (B + 1,), np.int32)
        self._pf_kvi = pp.carve("kv_indices", (1,), np.int64)
        self.prefill_buffers = TargetBuffers(
            input_ids=self._pf_ids, positions=self._pf_pos,
            metadata=VerifyMetadata(self._pf_qo, self._pf_kvp, self._pf_kvi, self._pf_loc, None, None),
            kv_cache=self.kv_cache, logits=None, num_rows=self._pf_qo[B:], max_rows=B * P, batch_size=B, max_q=P,
            mask_format="causal")
        if model is not None:
            self.prefill_forward = model.forward_plan(max_batch=B, max_q=P, num_splits=int(prefill_splits),
                                                      mask_format="causal", name=f"{name}.prefill")
            self.target_forward = None  # set by the subclass
        else:
            self.prefill_forward = target_forward
            self.target_forward = target_forward
        self._exec = None
        self._graph = None
        #: Record an event before every step too, so that :meth:`step_gpu_ms` works (one more
        #: ``cuEventRecord`` of host time per step; benchmarks of the launch overhead turn it off).
        self.gpu_timing = True
        #: Keep every collected step's records (int32 ``[max_batch, record_width]``) in :attr:`history`.
        self.keep_history = False
        self.history: list = []
        self._n_requests = 0
        self._launched = 0
        self._collected = 0
        self._outputs: list = []
        self._finished: list = []
        self._finish_codes: list = []
        self._max_new: list = []
        self._step_tokens = 0
        self._step_active = 0
        #: The collected step's status bits, free slots and active requests (None before a step is collected).
        self.last_status = self.last_free_slots = self.last_active = None
        self._ready = False

    def _check_more_args(self) -> None:
        """The subclass's own argument checks, run after the base's and before the device is touched."""

    # -- sizes ---------------------------------------------------------------------------------
    def _emit_width(self) -> int:
        return 1

    def _pools(self) -> list:
        pools = [self.kv_pool, self.state.pool, self.step_pool, self.logits_pool, self.prefill_pool]
        for obj in (getattr(self, "forward", None), self.prefill_forward):
            pools += list(getattr(obj, "pools", ()))  # TargetForward's optional member
        tree = getattr(self, "tree", None)
        if tree is not None:
            pools.append(tree.pool)
        pools += list(getattr(getattr(self, "drafter", None), "pools", ()))  # DraftModel's optional member
        seen, out = set(), []
        for p in pools:
            if id(p) not in seen:
                seen.add(id(p))
                out.append(p)
        return out

    @property
    def workspace_bytes(self) -> int:
        """Device bytes of every pool this runner allocated (KV cache included; model weights not)."""
        return sum(p.capacity for p in self._pools())

    def memory_report(self) -> str:
        """One line per pool: label and bytes."""
        return "\n".join(f"  {p.label:<32} {p.capacity / 2**20:10.1f} MiB" for p in self._pools())

    # -- reset and prefill ---------------------------------------------------------------------
    def reset(self, prompts, max_new_tokens, stop_tokens=None) -> None:
        """Start new requests in the runner's buffers (not capture-safe: host copies and a prefill).

        Parameters
        ----------
        prompts : sequence of int sequences
            At most ``max_batch`` prompts of 1 .. ``max_prompt_len`` tokens. The tokens but
            the last are prefilled (their latent KV is written to the cache); the last is the
            first step's root.
        max_new_tokens : int or sequence of int
            Tokens to generate per request (>= 1).
        stop_tokens : None, int, or sequence
            One stop token for all, a list for all (``[]``: none), or one list per request
            (at most ``max_stop_tokens`` each, every one in ``[0, vocab_size)``). A flat sequence
            of ints is always the one list for all: different stops per request are written as
            one list each, ``[[5], [7]]`` (once any entry is a list, an int entry stands for a
            one-token list: ``[5, [7, 9]]``). A request ends after emitting one.

        Raises
        ------
        ValueError
            Too many prompts, an empty or too long prompt, out-of-vocabulary tokens (stop
            tokens included), more stop tokens per request than the runner holds, a
            ``max_new_tokens`` below 1 or a sequence of them of another length than
            ``prompts``, or a context that ``max_context`` cannot hold: each request needs
            ``len(prompt) + max_new_tokens + rows <= max_context``, with ``rows`` one step's rows
            per request (1 autoregressive, ``budget + 1`` DDTree). That is a little more than the
            kernels use (one or two positions); the constructor already refused a
            ``max_prompt_len`` whose prompts could never fit (``max_prompt_len + 1 + rows``
            above ``max_context``).
        TypeError
            ``prompts`` not a sequence of int sequences (a flat list of ints, a str), or a token,
            ``max_new_tokens`` or stop token that is not an int (floats and bools are refused,
            not truncated); the message names the argument.
        CaptureError
            During a stream capture (reset copies and synchronizes).
        """
        ensure_not_capturing(f"{type(self).__name__}.reset()", self.stream)
        self._ready = False  # (until this reset completes: a failed one leaves no half-started run to step)
        prompts = _prompt_lists(prompts)
        n = len(prompts)
        B, C = self.max_batch, self.max_context
        if not 1 <= n <= B:
            raise ValueError(f"need 1 .. max_batch={B} prompts, got {n}")
        for i, p in enumerate(prompts):
            if not 1 <= len(p) <= self.max_prompt_len:
                raise ValueError(f"prompt {i} has {len(p)} tokens; allowed 1 .. max_prompt_len={self.max_prompt_len}")
            if min(p) < 0 or max(p) >= self.vocab_size:
                raise ValueError(f"prompt {i} has tokens outside [0, vocab_size={self.vocab_size})")
        max_new = _as_int_list("max_new_tokens", max_new_tokens, n)
        for i, (p, m) in enumerate(zip(prompts, max_new)):
            if m < 1:
                raise ValueError(f"max_new_tokens must be >= 1, got {m} for request {i}")
            need = len(p) + m + self._rows_per_request
            if need > C:
                raise ValueError(f"request {i} needs a context of {need} (prompt {len(p)} + {m} new + one step of "
                                 f"{self._rows_per_request}), more than max_context={C}")
        stops = np.full((B, self.n_stop), -1, np.int32)
        for i, s in enumerate(_stop_lists(stop_tokens, n)):
            if len(s) > self.n_stop:
                raise ValueError(f"request {i} has {len(s)} stop tokens, more than max_stop_tokens={self.n_stop}")
            if any(not 0 <= t < self.vocab_size for t in s):
                raise ValueError(f"request {i} has stop tokens outside [0, vocab_size={self.vocab_size}): {s}")
            stops[i, :len(s)] = s

        # Slots: a shuffled stack of every slot but the scratch one; prompts take from the top.
        rng = np.random.default_rng(self.slot_seed)
        stack = rng.permutation(self.num_slots - 1).astype(np.int64)
        top = stack.shape[0]
        r2t = np.zeros((B, C), np.int32)
        committed = np.zeros(B, np.int64)
        roots = np.zeros(B, np.int32)
        active = np.zeros(B, np.uint8)
        remaining = np.zeros(B, np.int32)
        P = max(1, self.max_prompt_len - 1)
        pf_ids = np.zeros(B * P, np.int32)
        pf_pos = np.zeros(B * P, np.int64)
        pf_loc = np.full(B * P, self.scratch_slot, np.int64)
        pf_qo = np.zeros(B + 1, np.int64)
        row = 0
        for b, p in enumerate(prompts):
            k = len(p) - 1
            slots = stack[top - k:top][::-1].copy()
            top -= k
            r2t[b, :k] = slots
            committed[b] = k
            roots[b] = p[-1]
            active[b] = 1
            remaining[b] = max_new[b]
            pf_ids[row:row + k] = p[:-1]
            pf_pos[row:row + k] = np.arange(k)
            pf_loc[row:row + k] = slots
            row += k
            pf_qo[b + 1] = row
        pf_qo[n + 1:] = row
        pool = np.full(self.num_slots, -1, np.int64)
        pool[:top] = stack[:top]

        s = self.stream
        s.synchronize()
        st = self.state
        for arr, host in ((st.root_tokens, roots), (st.active, active), (st.seq_lens, committed),
                          (st.remaining, remaining), (st.req_to_token, r2t), (st.stop_tokens, stops),
                          (st.req_pool_indices, np.arange(B, dtype=np.int64)),
                          (st.free_slots, pool), (st.free_count, np.array([top], np.int64)),
                          (self.step_counter, np.zeros(1, np.uint64)), (self.status, np.zeros(1, np.int32)),
                          (self._pf_ids, pf_ids), (self._pf_pos, pf_pos), (self._pf_loc, pf_loc), (self._pf_qo, pf_qo),
                          (self._pf_kvp, np.zeros(B + 1, np.int32)), (self._pf_kvi, np.zeros(1, np.int64))):
            arr.copy_from_host(host)
        self._reset_extra(prompts)
        if row > 0:
            self.prefill_forward(s, self.prefill_buffers)
        s.synchronize()
        self._ring_host[:] = -1
        self.error_word.clear()  # (the stream is idle: no kernel writes it now)
        self.history = []
        self._n_requests = n
        self._launched = self._collected = 0
        self._timed = [-1] * self.ring_slots
        self._outputs = [[] for _ in range(n)]
        self._finished = [False] * n
        self._finish_codes = [0] * n
        self._max_new = max_new
        self._step_tokens = self._step_active = 0
        self._step_seconds: list = []
        self._host_committed = committed.copy()
        self._free_after_reset = top
        self.last_status = self.last_free_slots = self.last_active = None  # (set by each collected step)
        self._ready = True

    def _reset_extra(self, prompts) -> None:
        pass

    # -- the step ---------------------------------------------------------------------------------
    def _launch_step(self, stream) -> None:
        raise NotImplementedError

    def _warm(self) -> None:
        """Pack every launch of the step and set kernel attributes, so that capture only records."""
        bind = getattr(self.target_forward, "bind", None)
        if bind is not None:
            bind(self.buffers)

    def capture(self):
        """Capture one step into a CUDA graph and instantiate it (once; replayed by :meth:`step`).

        Returns
        -------
        GraphExec

        Raises
        ------
        CaptureError
            If something in the step (e.g. a user ``target_forward``) breaks the capture.
        """
        ensure_not_capturing(f"{type(self).__name__}.capture()", self.stream)
        self._warm()
        t0 = time.perf_counter()
        with _capture(self.stream) as cap:
            self._launch_step(self.stream)
            cap.keep_alive(*self._pools(), self.ring, self)
        self._graph = cap.graph
        self._exec = cap.graph.instantiate(upload_stream=self.stream)
        self.capture_seconds = time.perf_counter() - t0
        return self._exec

    @property
    def graph(self):
        """The captured :class:`~driverlevel.runtime.Graph` (None before :meth:`capture`)."""
        return self._graph

    @property
    def graph_exec(self):
        """The instantiated step graph (:class:`~driverlevel.runtime.GraphExec`), or None before :meth:`capture`."""
        return self._exec

    def step(self, graph: bool = True) -> None:
        """Queue one step: a graph replay (``graph=True``, after :meth:`capture`) or the same launches eagerly.

        Returns without waiting for the step; its results are read by :meth:`collect`. At most
        ``ring_slots`` steps may be in flight: with that many queued, it first collects the
        oldest, which blocks until that step has run.

        Raises
        ------
        TypeError
            ``graph`` is not a bool.
        RuntimeError
            Before :meth:`reset`, or ``graph=True`` before :meth:`capture`.
        MetadataError
            From the collect of the oldest step (see :meth:`collect`).
        """
        graph = bool_arg("graph", graph)
        if not self._ready:
            raise RuntimeError(f"{type(self).__name__}.step() before reset(prompts, ...)")
        if graph and self._exec is None:
            raise RuntimeError("step(graph=True) before capture(): call capture() or step(graph=False)")
        if self._launched - self._collected >= self.ring_slots:
            self.collect(self._launched - self.ring_slots + 1)
        i = self._launched % self.ring_slots
        self._timed[i] = self._launched if self.gpu_timing else -1
        if self.gpu_timing:
            self._start_events[i].record(self.stream)
        if graph:
            self._exec.launch(self.stream)
        else:
            self._launch_step(self.stream)
        self._events[i].record(self.stream)
        self._launched += 1

    def collect(self, upto: int | None = None) -> int:
        """Wait for the steps launched so far (or up to step index ``upto``, exclusive) and read their results.

        Returns the number of steps read. Tokens are appended to :attr:`outputs`.

        Raises
        ------
        TypeError, ValueError
            ``upto`` is not an int >= 0 (a float or a bool is refused, not truncated).
        RuntimeError
            The host mirror of a step does not hold that step (the device step counter and
            the host disagree).
        MetadataError
            A kernel of a collected step found bad per-step metadata (:meth:`check_errors`). While
            steps launched after the collected one are still queued, the words are only looked at
            (nothing is cleared under a kernel that may be writing): an error seen there
            synchronizes the stream and is raised, possibly a later step's; the full check,
            the forward's own ``check_errors`` included, runs at the collect of the last step
            launched.
        """
        upto = self._launched if upto is None else min(non_negative_int("upto", upto), self._launched)
        n = 0
        while self._collected < upto:
            k = self._collected
            i = k % self.ring_slots
            self._events[i].synchronize()
            entry = self._ring_host[i]
            if entry[0] != (k & 0x7FFFFFFF):
                raise RuntimeError(f"mirror entry {i} holds step {entry[0]}, expected {k}: the device step counter "
                                   f"and the host disagree (was the state changed behind the runner's back?)")
            recs = entry[RING_HEADER:].reshape(self.max_batch, self.record_width)
            if self.keep_history:
                self.history.append(recs.copy())
            for b in range(self._n_requests):
                if self._finished[b]:
                    continue
                r = recs[b]
                ne = int(r[1])
                if r[0] > 0 or ne > 0:
                    self._step_active += 1
                if ne > 0:
                    room = self._max_new[b] - len(self._outputs[b])
                    toks = [int(t) for t in r[RECORD_HEADER:RECORD_HEADER + ne]][:max(room, 0)]
                    self._outputs[b].extend(toks)
                    self._step_tokens += len(toks)
                if r[3] or len(self._outputs[b]) >= self._max_new[b]:
                    self._finished[b] = True
                    self._finish_codes[b] = int(r[3]) if r[3] else FINISH_DONE
            self.last_status = int(entry[1])
            self.last_free_slots = int(entry[2])
            self.last_active = int(entry[3])
            self._collected += 1
            n += 1
            if self._collected == self._launched:
                self.check_errors()
            elif any(w.read()[0] for w in self._error_words()):
                # Later steps are still queued and may be writing the words: a kernel sets its code before
                # its request and field, and check() clears the word. Let them finish first (on an error only).
                self.stream.synchronize()
                self.check_errors()
            # (else: checked by the collect that finds no step queued after it, or that sees an error)
        return n

    def _error_words(self) -> list:
        """The device error words this runner's own kernels and its DDTree plan write."""
        tree = getattr(self, "tree", None)
        return [self.error_word] + ([tree.error_word] if tree is not None else [])

    def check_errors(self) -> None:
        """Raise :class:`~driverlevel.MetadataError` if a kernel of the step found bad per-step
        metadata (a committed length past ``max_context``, a pool count or slot id outside the
        pool, ...) since the last check. :meth:`collect` calls it at the collect of the last step
        launched, and earlier only once it sees the runner's or the DDTree plan's error word set
        (after synchronizing the stream).

        Reads mapped memory only: call it after the step's work is complete.

        Raises
        ------
        MetadataError
            Naming the plan, the first bad request and the field (the word is cleared).
        """
        self.error_word.check()
        tree = getattr(self, "tree", None)
        if tree is not None:
            tree.check_errors()
        for fwd in (getattr(self, "forward", None), self.prefill_forward):
            check = getattr(fwd, "check_errors", None)  # TargetForward's optional member
            if check is not None:
                check()

    def step_gpu_ms(self, k: int) -> float:
        """GPU milliseconds of step ``k`` (a step index since :meth:`reset`, counted from 0).

        Step ``k`` must be collected, must have run with :attr:`gpu_timing` on, and its ring slot
        must not have been taken by a later step (it is one of the last ``ring_slots`` launched).

        Raises
        ------
        TypeError
            ``k`` is not an int (a float or a bool is refused).
        ValueError
            Step ``k`` is not collected yet, its events were reused by a later step, or it ran
            with ``gpu_timing`` off.
        """
        k = non_negative_int("k", k)
        if k >= self._collected:
            raise ValueError(f"step_gpu_ms({k}): step {k} is not collected yet ({self._collected} collected)")
        i = k % self.ring_slots
        if self._timed[i] != k:
            raise ValueError(f"step_gpu_ms({k}): no timing of step {k}: it ran with gpu_timing off, or its ring slot "
                             f"was taken by a later step (only the last ring_slots={self.ring_slots} launched keep "
                             f"their events)")
        return self._start_events[i].elapsed_ms(self._events[i])

    @property
    def outputs(self) -> list:
        """Per request, the tokens generated so far (collected steps only)."""
        return [list(o) for o in self._outputs]

    @property
    def all_finished(self) -> bool:
        """Whether every request of the last :meth:`reset` has finished, as far as :meth:`collect` has read."""
        return all(self._finished)

    @property
    def tokens_per_step(self) -> float:
        """Mean tokens per (step, active request) so far: the acceptance length."""
        return self._step_tokens / max(self._step_active, 1)

    def free_slots(self) -> int:
        """Free slots of the pool now (synchronizes; not capture-safe)."""
        ensure_not_capturing("free_slots()", self.stream)
        self.stream.synchronize()
        return int(self.state.free_count.to_numpy()[0])

    def committed_lengths(self) -> np.ndarray:
        """int64 ``[max_batch]`` committed lengths now (synchronizes)."""
        self.stream.synchronize()
        return self.state.seq_lens.to_numpy()

    def check_slots(self) -> None:
        """Check the slot pool's conservation: the free stack and the committed slots (each request's
        first ``seq_lens`` entries of its ``req_to_token`` row) are together every slot but the
        scratch one, each exactly once.

        Raises
        ------
        AssertionError
            With the counts or the slot, if slots leaked, were freed twice, or are committed and
            free at once (or committed twice); or if ``seq_lens`` or ``req_pool_indices`` lie
            outside ``req_to_token``, or a committed or free slot outside the pool.
        """
        self.stream.synchronize()
        free = int(self.state.free_count.to_numpy()[0])
        lens = self.state.seq_lens.to_numpy().astype(np.int64)
        committed = int(lens.sum())
        total = self.num_slots - 1
        if free + committed != total:
            raise AssertionError(f"slot pool out of balance: {free} free + {committed} committed != {total} slots")
        stack = self.state.free_slots.to_numpy()[:free]
        if np.unique(stack).shape[0] != free:
            raise AssertionError("the free-slot stack holds a slot twice")
        r2t, rows = self.state.req_to_token.to_numpy(), self.state.req_pool_indices.to_numpy()
        if (lens < 0).any() or (lens > r2t.shape[1]).any() or (rows < 0).any() or (rows >= r2t.shape[0]).any():
            raise AssertionError(f"seq_lens {lens.tolist()} or req_pool_indices {rows.tolist()} outside req_to_token")
        held = np.concatenate([r2t[rows[b], :lens[b]].astype(np.int64) for b in range(lens.shape[0])] + [stack])
        if held.size and (held.min() < 0 or held.max() >= total):
            raise AssertionError(f"a committed or free slot outside 0 .. {total - 1}: {held.min()} .. {held.max()}")
        values, counts = np.unique(held, return_counts=True)
        if (counts > 1).any():
            raise AssertionError(f"slot {int(values[counts > 1][0])} is committed and free at once, or committed twice")

    def generate(self, prompts, max_new_tokens, stop_tokens=None, *, graph: bool = True, max_steps: int | None = None,
                 progress=None) -> GenerationResult:
        """Reset, then step until every request finished (or ``max_steps``); one step in flight at a time.

        Parameters
        ----------
        prompts, max_new_tokens, stop_tokens
            As :meth:`reset`.
        graph : bool
            Replay the captured graph (captured on first use) or launch eagerly.
        max_steps : int, optional
            At most this many steps (>= 1); default: enough for every request to finish.
        progress : callable, optional
            Called with the number of tokens produced by each step (e.g. a tqdm ``update``).

        Raises
        ------
        TypeError, ValueError
            As :meth:`reset`; and for a ``graph`` that is not a bool, a ``max_steps`` that is
            not a positive int, or a ``progress`` that is not callable (before the reset).
        """
        graph = bool_arg("graph", graph)
        if max_steps is not None:
            max_steps = positive_int("max_steps", max_steps)
        if progress is not None and not callable(progress):
            raise TypeError(f"progress must be a callable or None, got {type(progress).__name__}")
        self.reset(prompts, max_new_tokens, stop_tokens)
        if graph and self._exec is None:
            self.capture()
        limit = max_steps if max_steps is not None else sum(self._max_new) + 2
        steps = 0
        times = []
        while not self.all_finished and steps < limit:
            before = self._step_tokens
            t0 = time.perf_counter()
            self.step(graph)
            self.collect()
            times.append(time.perf_counter() - t0)
            steps += 1
            if progress is not None:
                progress(self._step_tokens - before)
        return GenerationResult(self.outputs, steps, times, self.tokens_per_step, list(self._finished),
                                list(self._finish_codes))

    def _step_params(self) -> _StepParams:
        p = _StepParams()
        st = self.state
        p.root_tokens, p.active, p.seq_lens, p.remaining = st.root_tokens.ptr, st.active.ptr, st.seq_lens.ptr, st.remaining.ptr
        p.req_to_token, p.req_pool_indices, p.stop_tokens = st.req_to_token.ptr, st.req_pool_indices.ptr, st.stop_tokens.ptr
        p.free_slots, p.free_count = st.free_slots.ptr, st.free_count.ptr
        p.qo_indptr, p.kv_indptr, p.kv_indices = self.qo_indptr.ptr, self.kv_indptr.ptr, self.kv_indices.ptr
        p.input_ids, p.positions, p.out_cache_loc = self.input_ids.ptr, self.positions.ptr, self.out_cache_loc.ptr
        p.argmax_part, p.records = self.argmax_part.ptr, self.records.ptr
        p.ring, p.step_counter, p.status = self._ring_dev.ptr, self.step_counter.ptr, self.status.ptr
        p.error = self.error_word.device_ptr
        p.scratch_slot, p.free_capacity, p.r2t_rows = self.scratch_slot, self.num_slots, st.req_to_token.shape[0]
        p.bs, p.max_context, p.n_stop = self.max_batch, self.max_context, self.n_stop
        p.record_width, p.ring_slots, p.kv_capacity = self.record_width, self.ring_slots, self.max_batch * self.max_context
        return p

    def _prepare_record_kernel(self, kname: str, params: _StepParams):
        threads = max(32, -(-self.max_batch // 32) * 32)
        kern = self._module.kernel(kname)
        # (programmatic with pdl: the record kernels start with dl::pdl_enter, cu/runner.cu)
        ln = kern.prepare((1, 1, 1), threads, [params], self.max_batch * self.record_width * 4, programmatic=self.pdl)
        ln.keep(self)
        return ln


@_with_base_kwargs
class AutoregressiveRunner(_RunnerBase):
    """Plain greedy decoding, one token per request per step, captured as one CUDA graph.

    The same model and attention kernel as :class:`DecodeStepRunner`, with a causal plan
    of one row per request: ``ar_prepare`` (runner.cu) builds the metadata from
    ``req_to_token`` and pops a slot per active request, the target forward computes the
    logits, ``argmax_rows_f32`` (:mod:`driverlevel.argmax`) picks the next tokens and ``ar_commit`` appends the slots,
    advances the requests, handles stop tokens and ``max_new_tokens``, and publishes.

    Parameters
    ----------
    device : Device or int
    model : TargetModel, optional
        Makes the step's forward (``max_q = 1``, causal) and the prefill's; e.g. the demo's
        :class:`~driverlevel.demo.mla_model.MLAModel`.
    target_forward : TargetForward, optional
        Instead of ``model``; see :mod:`driverlevel.interfaces`.
    vocab_size : int, optional
        Required with ``target_forward``.
    max_batch : int
    max_context : int
        Most tokens (prompt + generated) of one request.
    max_prompt_len : int
    {num_splits}

    {other keyword arguments}

    Raises
    ------
    ValueError
        For out-of-range sizes (``max_batch`` above ``MAX_RUNNER_BATCH`` (256),
        ``max_batch * max_context`` above ``2**31 - 1``, ``max_prompt_len`` above
        ``max_context - 2`` (a prompt that long needs one new token and one step's row more),
        a count below 1, ``vocab_size`` below 2 or above ``2**30``, a negative
        ``slot_seed``, with ``model`` a ``num_splits`` or ``prefill_splits`` above the
        verify attention's ``MAX_SPLITS`` (1024)), for neither or both of ``model`` /
        ``target_forward``, or ``target_forward`` without ``vocab_size``.
    TypeError
        If ``model`` is not a :class:`~driverlevel.interfaces.TargetModel`,
        ``target_forward`` not callable, ``name`` not a str, ``stream`` not a driverlevel
        Stream, or a count or ``vocab_size`` not an int (bool and floats included, even when
        integral).
        These ``TypeError`` / ``ValueError`` come before the device is touched (nothing
        is allocated or compiled, and they are raised as such also without a GPU).
    {common raises}
    """

    kind = "autoregressive"
    _rows_per_request = 1

    def __init__(self, device, *, model=None, target_forward=None, vocab_size=None, max_batch: int,
                 max_context: int, max_prompt_len: int, num_splits: int | None = None, name: str = "ar", **kw):
        _check_options(type(self), kw)
        super().__init__(device, model=model, target_forward=target_forward, vocab_size=vocab_size,
                         max_batch=max_batch, max_context=max_context, max_prompt_len=max_prompt_len,
                         num_splits=num_splits, name=name, **kw)
        B = self.max_batch
        self.buffers = TargetBuffers(
            input_ids=self.input_ids, positions=self.positions,
            metadata=VerifyMetadata(self.qo_indptr, self.kv_indptr, self.kv_indices, self.out_cache_loc, None, None),
            kv_cache=self.kv_cache, logits=self.logits, num_rows=self.qo_indptr[B:], max_rows=B, batch_size=B,
            max_q=1, mask_format="causal")
        if model is not None:
            self.forward = model.forward_plan(max_batch=B, max_q=1, num_splits=self.num_splits, mask_format="causal",
                                              name=f"{name}.target")
            self.target_forward = self.forward
        else:
            self.forward = None
        params = self._step_params()
        #: ``cu/argmax.cu`` loaded on the device (:mod:`driverlevel.argmax`).
        self._argmax_module = _load_argmax(self.device)
        self._prep = self._module.kernel("ar_prepare").prepare((B, 1, 1), 256, [params])
        self._prep.keep(self)
        self._argmax = argmax_rows_launch(self.device, self.logits, m_max=B, part=self.argmax_part,
                                          num_rows=self.qo_indptr[B:], module=self._argmax_module,
                                          programmatic=self.pdl)
        self._commit = self._prepare_record_kernel("ar_commit", params)

    def _launch_step(self, stream) -> None:
        self._prep.launch(stream)
        self.target_forward(stream, self.buffers)
        self._argmax.launch(stream)
        self._commit.launch(stream)


@_with_base_kwargs
class DecodeStepRunner(_RunnerBase):
    """The DDTree decode step (draft, tree, verify, accept, commit) as one CUDA graph.

    Parameters
    ----------
    device : Device or int
    model : TargetModel, optional
        Makes the step's forward (``max_q = budget + 1``, bitmask) and the prefill's; e.g. the
        demo's :class:`~driverlevel.demo.mla_model.MLAModel`.
    target_forward : TargetForward, optional
        ``target_forward(stream, buffers: TargetBuffers)`` instead of ``model``.
    drafter : DraftModel
        Required: ``logits`` (float32 ``[max_batch, depth_limit, vocab]``),
        ``prepare(root_tokens)`` and ``run(stream)``; see :mod:`driverlevel.interfaces`. The
        demo's is :class:`driverlevel.demo.Drafter`.
    vocab_size : int, optional
        Required with ``target_forward``.
    max_batch : int
    budget : int
        Tree nodes besides the root (the verify call has ``budget + 1`` rows per request).
    depth_limit : int
        Depths the drafter proposes (block size - 1; default 15).
    max_context : int
        Most tokens (prompt + generated) of one request.
    max_prompt_len : int
    {num_splits}

    {other keyword arguments}

    Raises
    ------
    ValueError
        For out-of-range sizes (``max_batch`` above ``MAX_RUNNER_BATCH`` (256),
        ``max_batch * max_context`` above ``2**31 - 1``, ``max_prompt_len`` above
        ``max_context - 2 - budget`` (a prompt that long needs one new token and one step's
        ``budget + 1`` rows more), ``budget`` outside ``[1, MAX_BUDGET]``, ``depth_limit`` outside
        ``[1, MAX_DEPTH]``, a count below 1, ``vocab_size`` below 2 or above ``2**30``, a negative
        ``slot_seed``, with ``model`` a ``num_splits`` or ``prefill_splits`` above the
        verify attention's ``MAX_SPLITS`` (1024)), for a ``vocab_size`` x ``budget`` the
        DDTree row merge cannot hold (:func:`driverlevel.ddtree.check_merge_capacity`:
        ``ceil(vocab / 7680) * min(budget, vocab) <= 12288``), for ``drafter.logits`` not float32
        ``[max_batch, depth_limit, vocab]``, for neither or both of ``model`` /
        ``target_forward``, or ``target_forward`` without ``vocab_size``.
    TypeError
        If ``model`` is not a :class:`~driverlevel.interfaces.TargetModel`, ``drafter`` not a
        :class:`~driverlevel.interfaces.DraftModel`, ``target_forward`` not callable,
        ``name`` not a str, ``stream`` not a driverlevel Stream, or ``budget``,
        ``depth_limit``, a count or ``vocab_size`` not an int (bool and floats included, even
        when integral).
        These ``TypeError`` / ``ValueError`` come before the device is touched (nothing
        is allocated or compiled, and they are raised as such also without a GPU).
        Once the device is open, before anything is launched: ``ValueError`` for a
        ``drafter.logits`` on another device, not C-contiguous or misaligned, ``TypeError``
        for one in host memory (a numpy array).
    {common raises}

    Example
    -------
    >>> from driverlevel.demo import Drafter, MLAModel                       # doctest: +SKIP
    >>> model = MLAModel(dev)  # doctest: +SKIP
    >>> drafter = Drafter(model, max_batch=8, depth_limit=15)  # doctest: +SKIP
    >>> r = DecodeStepRunner(dev, model=model, drafter=drafter, max_batch=8, budget=32, max_context=2048,  # doctest: +SKIP
    ...                      max_prompt_len=512, num_splits=4)
    >>> res = r.generate(prompts, max_new_tokens=256)                        # capture + replay  # doctest: +SKIP
    >>> res.tokens_per_step  # doctest: +SKIP
    """

    kind = "ddtree"

    def __init__(self, device, *, model=None, target_forward=None, drafter: DraftModel, vocab_size=None, max_batch: int,
                 budget: int, depth_limit: int = 15, max_context: int, max_prompt_len: int, num_splits: int | None = None,
                 name: str = "ddtree", **kw):
        _check_options(type(self), kw)
        if not isinstance(drafter, DraftModel):
            raise TypeError(f"drafter= must be a driverlevel.interfaces.DraftModel (logits, prepare(root_tokens), "
                            f"run(stream)), got {type(drafter).__name__}")
        self.budget = _int_in("budget", budget, 1, MAX_BUDGET)
        self.depth_limit = _int_in("depth_limit", depth_limit, 1, MAX_DEPTH)
        self._rows_per_request = self.budget + 1
        self._drafter_arg = drafter
        super().__init__(device, model=model, target_forward=target_forward, vocab_size=vocab_size,
                         max_batch=max_batch, max_context=max_context, max_prompt_len=max_prompt_len,
                         num_splits=num_splits, name=name, **kw)
        B, Q = self.max_batch, self._rows_per_request
        # Its device, contiguity and alignment need the opened device: checked now, not at the first
        # step's build, which runs after drafter.run() has launched.
        device_array_arg("drafter.logits", drafter.logits, self.device, owner="the runner")
        self.drafter = drafter
        drafter.prepare(self.state.root_tokens)
        #: The DDTree stages over :attr:`state` (build + compile before the target forward, accept
        #: + commit after it).
        self.tree = DDTreePlan(self.device, max_batch=B, depth_limit=self.depth_limit, vocab=self.vocab_size,
                               budget=self.budget, max_context=self.max_context, logits_dtype="float32",
                               pdl=self.pdl, name=f"{name}.tree")
        t = self.tree
        self.buffers = TargetBuffers(
            input_ids=t.input_ids, positions=t.positions, metadata=t.metadata(), kv_cache=self.kv_cache,
            logits=self.logits, num_rows=t.qo_indptr[B:], max_rows=B * Q, batch_size=B, max_q=Q, mask_format="bitmask")
        if model is not None:
            self.forward = model.forward_plan(max_batch=B, max_q=Q, num_splits=self.num_splits, mask_format="bitmask",
                                              name=f"{name}.target")
            self.target_forward = self.forward
        else:
            self.forward = None
        params = self._step_params()
        params.records = t.records.ptr
        params.accepted_count = t.accepted_count.ptr
        params.tree_state = t.step.ptr
        self._limit = self._prepare_record_kernel("limit_records", params)
        self._publish = self._prepare_record_kernel("publish_records", params)

    def _check_more_args(self) -> None:
        # The DDTreePlan built below refuses a vocabulary x budget its row merge cannot hold: checked now.
        check_merge_capacity(self.vocab_size, self.budget)
        # drafter.logits' dtype and shape follow from the arguments: checked before anything is allocated.
        want = (self.max_batch, self.depth_limit, self.vocab_size)
        lg = self._drafter_arg.logits
        dt = getattr(lg, "dtype", None)
        if dt is None or getattr(dt, "name", None) != "float32" or tuple(getattr(lg, "shape", ())) != want:
            if lg is None:
                got = "None"
            elif dt is None:
                got = f"{type(lg).__name__} without a dtype"
            else:
                got = f"{getattr(dt, 'name', dt)} {list(getattr(lg, 'shape', ()))}"
            raise ValueError(f"drafter.logits must be float32 [max_batch, depth_limit, vocab] = {list(want)}, "
                             f"got {got}")

    def _emit_width(self) -> int:
        return self.depth_limit + 1

    def _reset_extra(self, prompts) -> None:
        if hasattr(self.drafter, "reset"):
            self.drafter.reset()
        self.tree.error_word.clear()  # the build re-arms the plan's counters itself; only stale errors go

    def _launch_step(self, stream) -> None:
        self.drafter.run(stream)
        self.tree.build(stream, self.drafter.logits, self.state)
        self.tree.compile(stream, self.state)
        self.target_forward(stream, self.buffers)
        self.tree.accept(stream, self.state, target_logits=self.logits)
        self._limit.launch(stream)  # max_new_tokens cuts the accepted path before its KV is committed
        self.tree.commit(stream, self.state)
        self._publish.launch(stream)
