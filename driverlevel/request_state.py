"""The request state and the slot pool: one set of device arrays, one set of names.

Every kernel that reads or advances requests -- the DDTree stages (``cu/ddtree/*.cuh``,
through :class:`~driverlevel.ddtree.DDTreePlan`) and the runner's own kernels
(``cu/runner.cu``, through :class:`~driverlevel.runner.DecodeStepRunner` and
:class:`~driverlevel.runner.AutoregressiveRunner`) -- takes the same :class:`RequestState`,
under the same field names, which are SGLang's where SGLang has the array
(``req_to_token``, ``req_pool_indices``, ``seq_lens``). ``cu/request_state.cuh`` states the
same contract on the device side.

Fields (device arrays; ``B`` = max_batch)
-----------------------------------------
``active`` uint8 ``[B]``
    1 for a live request; accept (or the runner's commit) clears it when the request finishes.
``root_tokens`` int32 ``[B]``
    The last committed token, whose KV is not cached yet: node 0 of the next draft tree,
    the input of the next autoregressive step. Accept writes the next one.
``seq_lens`` int64 ``[B]``
    Tokens whose KV is cached (SGLang's ``seq_lens`` of the verify step: the prefix every
    draft token sees); the root sits at position ``seq_lens[b]``. Commit advances it.
``req_pool_indices`` int64 ``[B]``
    Row of ``req_to_token`` of each request (SGLang's).
``req_to_token`` int32 or int64 ``[rows, max_context]``
    Cache slot of every cached position (SGLang's ``req_to_token_pool.req_to_token``).
``free_slots`` int64 ``[capacity]``, ``free_count`` int64 ``[1]``
    The slot pool: a stack of free cache slots, ``free_slots[:free_count]``, top at
    ``free_count - 1``; slot ids lie in ``[0, capacity)``. A step pops the slots of its
    rows; commit pushes the rejected ones back.
``stop_tokens`` int32 ``[B, n_stop]``, optional
    Stop tokens per request, -1 padded.
``budgets`` int32 ``[B]``, optional
    Per-request DDTree node budgets (clamped to ``[0, plan.budget]``); None = the plan's.
``remaining`` int32 ``[B]``, optional
    Tokens each request may still emit (the runner's ``max_new_tokens`` countdown).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ._array import DeviceArray, array_key, as_device_array
from ._checks import bool_arg, non_negative_int, positive_int
from ._device import _check_device_arg
from ._memory import MAX_NBYTES, WorkspacePool, _label_arg

__all__ = ["RequestState", "ARRAY_FIELDS"]

#: The device-array fields of a :class:`RequestState`, in order.
ARRAY_FIELDS = ("active", "root_tokens", "seq_lens", "req_pool_indices", "req_to_token", "free_slots", "free_count",
                "budgets", "stop_tokens", "remaining")


@dataclass
class RequestState:
    """Per-request device state and the slot pool, read and updated by the runner's and DDTree's kernels.

    Build one with :meth:`allocate` (carved from a pool, every array of the right dtype and
    shape). The constructor is a container for arrays the caller owns: :class:`DeviceArray`
    fields are kept as they are, and a foreign CUDA array (CuPy, PyTorch, JAX, Numba: anything
    :func:`~driverlevel.runtime.as_device_array` takes) is viewed as one without a copy, the view
    holding the foreign array alive, on the device its memory is on (managed memory: the device
    it was allocated on, which the plans then require; pass such a field as an
    ``as_device_array(x, device)`` view to use it from another device). It checks nothing
    else: the plans check each array's device, dtype and shape in every call that takes the
    state (``TypeError`` / ``ValueError`` naming the field, before any launch).

    Raises
    ------
    TypeError, ValueError
        A field that is neither None, a :class:`DeviceArray` nor a CUDA array
        :func:`~driverlevel.runtime.as_device_array` takes (a numpy array, a host list), given to
        the constructor or assigned later; the message names the field.

    Attributes
    ----------
    active : uint8 ``[max_batch]``
    root_tokens : int32 ``[max_batch]``
    seq_lens : int64 ``[max_batch]``
    req_pool_indices : int64 ``[max_batch]``
    req_to_token : int32 or int64 ``[rows, max_context]``
    free_slots : int64 ``[capacity]``
    free_count : int64 ``[1]``
    budgets : int32 ``[max_batch]`` or None
    stop_tokens : int32 ``[max_batch, n_stop]`` or None
    remaining : int32 ``[max_batch]`` or None
        See :mod:`driverlevel.request_state` for what each holds.
    pool : WorkspacePool or None
        The pool the arrays were carved from by :meth:`allocate` (None for arrays the caller owns).

    Example
    -------
    >>> state = RequestState.allocate(dev, max_batch=8, max_context=8192, num_slots=1 << 16)  # doctest: +SKIP
    >>> state.upload(active=np.ones(8, np.uint8), req_pool_indices=np.arange(8))              # doctest: +SKIP
    """

    active: DeviceArray
    root_tokens: DeviceArray
    seq_lens: DeviceArray
    req_pool_indices: DeviceArray
    req_to_token: DeviceArray
    free_slots: DeviceArray
    free_count: DeviceArray
    budgets: DeviceArray | None = None
    stop_tokens: DeviceArray | None = None
    remaining: DeviceArray | None = None
    pool: WorkspacePool | None = field(default=None, repr=False, compare=False)

    def __setattr__(self, name, value):
        # Foreign arrays become DeviceArray views as they are set (by the constructor or later):
        # key(), upload() and the plans' launch parameters read .ptr / .shape / .dtype of every field.
        if name in ARRAY_FIELDS and value is not None and not isinstance(value, DeviceArray):
            try:
                value = as_device_array(value)
            except (TypeError, ValueError) as e:
                raise type(e)(f"RequestState.{name}: {e}") from e
        object.__setattr__(self, name, value)

    @staticmethod
    def specs(*, max_batch: int, max_context: int, num_slots: int, req_rows: int | None = None, n_stop: int = 0,
              budgets: bool = False, remaining: bool = False, r2t_dtype=np.int32) -> list:
        """``(name, shape, dtype)`` of every array :meth:`allocate` carves, in carve order.

        Raises
        ------
        TypeError, ValueError
            Naming the argument: a count that is not a positive int (``n_stop``: >= 0),
            ``budgets`` / ``remaining`` not a bool (numpy's included), an
            ``r2t_dtype`` other than int32 / int64, or (``ValueError``) ``num_slots`` above
            2**31 with an int32 ``req_to_token`` (its slot ids would wrap).
        """
        max_batch, max_context, num_slots = (positive_int(pname, v) for pname, v in (
            ("max_batch", max_batch), ("max_context", max_context), ("num_slots", num_slots)))
        if req_rows is not None:
            req_rows = positive_int("req_rows", req_rows)
        n_stop = non_negative_int("n_stop", n_stop)
        budgets, remaining = bool_arg("budgets", budgets), bool_arg("remaining", remaining)  # 1 or "no" is no flag
        try:  # numpy's own error ("data type 'x' not understood") would not name the argument
            r2t = None if r2t_dtype is None else np.dtype(r2t_dtype)
        except TypeError:
            r2t = None
        if r2t not in (np.dtype(np.int32), np.dtype(np.int64)):
            raise TypeError(f"r2t_dtype must be int32 or int64, got {r2t_dtype!r}" if r2t is None
                            else f"r2t_dtype must be int32 or int64, got {r2t}")
        if np.dtype(r2t_dtype) == np.int32 and num_slots > 1 << 31:
            raise ValueError(f"num_slots must be at most 2**31 with an int32 req_to_token (slot ids "
                             f"0 .. num_slots - 1 are stored in it), got {num_slots}; use r2t_dtype=np.int64")
        rows = max_batch if req_rows is None else req_rows
        specs = [("active", (max_batch,), np.uint8), ("root_tokens", (max_batch,), np.int32),
                 ("seq_lens", (max_batch,), np.int64), ("req_pool_indices", (max_batch,), np.int64),
                 ("req_to_token", (rows, max_context), r2t_dtype), ("free_slots", (num_slots,), np.int64),
                 ("free_count", (1,), np.int64)]
        if budgets:
            specs.append(("budgets", (max_batch,), np.int32))
        if n_stop:
            specs.append(("stop_tokens", (max_batch, n_stop), np.int32))
        if remaining:
            specs.append(("remaining", (max_batch,), np.int32))
        return specs

    @classmethod
    def allocate(cls, device, *, max_batch: int, max_context: int, num_slots: int, req_rows: int | None = None,
                 n_stop: int = 0, budgets: bool = False, remaining: bool = False, r2t_dtype=np.int32,
                 label: str = "request_state") -> "RequestState":
        """Allocate a state (zeroed, pool empty) in a new :class:`WorkspacePool` (not capture-safe).

        Parameters
        ----------
        device : Device or int
        max_batch, max_context : int
        num_slots : int
            Capacity of the free-slot stack (the KV pool's slots).
        req_rows : int, optional
            Rows of ``req_to_token`` (default ``max_batch``).
        n_stop : int
            Stop tokens per request (0: no ``stop_tokens`` array).
        budgets, remaining : bool
            Allocate the per-request ``budgets`` / ``remaining`` arrays.
        r2t_dtype : numpy dtype
            int32 (SGLang) or int64.
        label : str
            The pool's label and the carve-outs' prefix.

        Raises
        ------
        TypeError, ValueError
            What :meth:`specs` raises, ``ValueError`` when the arrays together would need more
            than 2**63 - 1 bytes (the size is computed exactly, with Python ints), and
            ``TypeError`` for a ``label`` that is not a str; all before the device is touched.
        CaptureError
            During a capture (it allocates and synchronizes).
        """
        # The arguments are checked before the device is touched (a bad count is a ValueError, also without a GPU).
        specs = cls.specs(max_batch=max_batch, max_context=max_context, num_slots=num_slots, req_rows=req_rows,
                          n_stop=n_stop, budgets=budgets, remaining=remaining, r2t_dtype=r2t_dtype)
        nbytes = WorkspacePool.required_bytes([(s, d) for _, s, d in specs])
        if nbytes > MAX_NBYTES:
            raise ValueError(f"the request state would need {nbytes:,} bytes (max_batch={max_batch}, "
                             f"max_context={max_context}, num_slots={num_slots}): more than 2**63 - 1")
        label = _label_arg(label)
        device = _check_device_arg(device)
        pool = WorkspacePool.allocate(device, nbytes, label=label)
        arrays = {name: pool.carve(f"{label}.{name}", shape, dt) for name, shape, dt in specs}
        stream = device.create_stream()
        for a in arrays.values():
            a.fill_bytes(0, stream)
        stream.synchronize()
        return cls(**arrays, pool=pool)

    def arrays(self) -> dict:
        """The device arrays present (None fields left out), by field name."""
        return {k: getattr(self, k) for k in ARRAY_FIELDS if getattr(self, k) is not None}

    def key(self) -> tuple:
        """Address, shape and dtype of every field (0 for None; :func:`~driverlevel._array.array_key`):
        launches packed for one key may be replayed for it. (Addresses alone were not enough: the
        packed parameters hold ``free_slots``' length, ``req_to_token``'s rows and dtype and
        ``stop_tokens``' width.)"""
        return tuple(array_key(getattr(self, k)) for k in ARRAY_FIELDS)

    def upload(self, *, stream=None, **host_arrays) -> None:
        """Copy host arrays into the named fields (not capture-safe), e.g. ``upload(active=a)``.

        ``stream`` (keyword only) orders the copies after the work already queued on it (each
        is queued there and the stream synchronized before the call returns); without one they
        run on a private stream of the device and do not wait for other streams
        (:meth:`DeviceArray.copy_from_host`).

        Each value is converted to the field's dtype only when that is exact: integer values
        (numpy integer arrays, Python ints) must lie in the field's range (an int64 array of
        token ids fits ``root_tokens`` int32 only when every id does); bool values are taken
        for ``active`` only (True -> 1). Floats, bools elsewhere, strings and other objects are
        refused, even when integral: nothing is truncated or wrapped. A value of the field's
        size but another shape is reshaped (e.g. a flat ``req_to_token``). Every value is
        checked before the first byte is copied, so a refused call writes nothing.

        Raises
        ------
        ValueError
            For a field this state does not have; for a field whose array is read-only or not
            C-contiguous; for a value with the wrong number of elements or a ragged one (rows of
            different lengths); for an integer outside the field's dtype range (the message
            names the field, the first bad value and its index).
        TypeError
            For a value that is not an integer array (floats, bool outside ``active``, str, None,
            a generator or other objects; checked before the number of elements), or a
            ``stream`` that is not a driverlevel :class:`~driverlevel.Stream`.
        ValueError
            Also for a ``stream`` of another device than the state's arrays, or a closed one;
            checked before the first copy.
        CaptureError
            During a stream capture (the copies are synchronous).
        """
        checked = []
        for name, value in host_arrays.items():
            if name not in ARRAY_FIELDS:
                raise ValueError(f"RequestState has no field {name!r}; fields: {', '.join(ARRAY_FIELDS)}")
            dst = getattr(self, name)
            if dst is None:
                raise ValueError(f"this state has no {name!r} array")
            if dst.readonly or not dst.is_c_contiguous:  # what copy_from_host refuses, asked before any copy
                raise ValueError(f"upload: {name} is {'read-only' if dst.readonly else 'not C-contiguous'}: "
                                 f"it cannot be copied into")
            checked.append((dst, _exact_host_array(name, value, dst)))
        _check_stream("upload", stream, [dst for dst, _ in checked])
        for dst, host in checked:
            dst.copy_from_host(host, stream)

    def download(self, stream=None) -> dict:
        """Host copies of every array present (not capture-safe), by field name.

        With ``stream`` the copies are queued on it, after the work already there (pass the
        stream that writes the state), and it is synchronized before return. Without one they
        are synchronous but ordered only against the legacy default stream: they do not wait
        for kernels still queued on driverlevel's (non-blocking) streams, so synchronize the
        stream that writes the state first.

        Raises
        ------
        TypeError, ValueError
            ``stream`` is not a driverlevel :class:`~driverlevel.Stream`, or is on another
            device than the state's arrays, or closed (before any copy).
        CaptureError
            During a stream capture.
        """
        arrays = self.arrays()
        _check_stream("download", stream, arrays.values())
        return {k: a.to_numpy(stream) for k, a in arrays.items()}


def _check_stream(what: str, stream, arrays) -> None:
    """``stream`` (unless None) checked against every array's device before the first copy of ``what``."""
    if stream is not None:
        for a in arrays:
            a._stream(what, stream)


def _exact_host_array(name: str, value, dst: DeviceArray) -> np.ndarray:
    """``value`` as a host array of ``dst``'s dtype and shape, refused unless the conversion is exact.

    The values' type is checked before their count (None, a str or a generator is a TypeError,
    not "must have shape (8,), got shape ()").
    """
    want = np.dtype(dst.dtype)
    try:
        a = np.asarray(value)
    except ValueError as exc:  # e.g. rows of different lengths
        raise ValueError(f"upload: {name} is not a rectangular array of integers ({exc})") from None
    ints = None
    if want.kind in "iu" and a.dtype != want:
        if a.dtype.kind == "b":
            if name != "active":
                raise TypeError(f"upload: {name} must hold {want} integers, got bool values")
        elif a.dtype.kind == "O":  # e.g. Python ints too large for int64: check each one exactly
            flat = a.ravel()
            for i, v in enumerate(flat):
                if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
                    where = f" at flat index {i}" if a.ndim else ""
                    raise TypeError(f"upload: {name} must hold {want} integers, got {type(v).__name__} {v!r}{where}")
            ints = [int(v) for v in flat]
        elif a.dtype.kind not in "iu":
            raise TypeError(f"upload: {name} must hold {want} integers, got dtype {a.dtype} "
                            f"(convert it yourself if the values are meant to be integers)")
    if a.size != int(np.prod(dst.shape, dtype=object)):
        raise ValueError(f"upload: {name} must have shape {dst.shape} ({int(np.prod(dst.shape, dtype=object))} "
                         f"elements), got shape {a.shape}")
    a = a.reshape(dst.shape)
    if want.kind not in "iu":  # no such field today: keep copy_from_host's strict dtype check
        return a
    if a.dtype == want:
        return a
    if a.dtype.kind == "b":
        return a.astype(want)
    info = np.iinfo(want)
    if ints is None:
        bad = np.flatnonzero((a.ravel() < info.min) | (a.ravel() > info.max)) if a.size else []
        first = (int(bad[0]), int(a.ravel()[bad[0]])) if len(bad) else None
    else:
        first = next(((i, v) for i, v in enumerate(ints) if not info.min <= v <= info.max), None)
    if first is not None:
        i, v = first
        raise ValueError(f"upload: {name} value {v} at flat index {i} does not fit {want} "
                         f"([{info.min}, {info.max}])")
    return (a if ints is None else np.array(ints, dtype=object).reshape(dst.shape)).astype(want)
