"""Device buffers, pinned host buffers and the workspace pool.

Everything a captured graph points into is allocated here before capture; the
pool hands out named, aligned carve-outs of one up-front allocation, whose
addresses never change. Every live allocation is registered so that the graph
audit (:meth:`Graph.kernel_nodes`) can say which pool and carve-out a kernel
argument points into, and so that a captured graph can keep alive every
allocation its nodes point into (see "Lifetime rules" in :class:`driverlevel.runtime.Graph`).

Releasing memory while a capture runs
-------------------------------------
A :class:`DeviceBuffer`, :class:`PinnedHostBuffer` or :class:`WorkspacePool` may
lose its last reference at any moment: ``del``, a reference cycle collected by
``gc.collect()`` (or by the collector running on its own, inside any
allocation), or ``close()``. ``cuMemFree``/``cuMemFreeHost`` are not
stream-ordered: they may synchronize the device, and CUDA counts them among the
"potentially unsafe" calls that invalidate a stream capture in progress
(``CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`` for the calling thread in global or
thread-local mode, and for every thread while a global-mode capture runs). So a
release never calls them blindly:

1. While a driverlevel capture is in progress in any thread and any mode
   (:func:`~driverlevel._capture_guard.captures_in_progress`, a process-wide
   counter maintained by :func:`driverlevel.capture`), the free is *deferred*:
   the handle's address is put on a process-wide list and no driver call is made.
2. The list is drained at safe points: when the last driverlevel capture ends,
   at the next :meth:`DeviceBuffer.allocate` / :meth:`PinnedHostBuffer.allocate`
   outside a capture, and by :func:`release_deferred` (public as
   ``driverlevel.runtime.release_deferred()``).
3. Otherwise (and when draining) the free runs with the calling thread's capture
   interaction mode switched to ``CU_STREAM_CAPTURE_MODE_RELAXED``
   (``cuThreadExchangeStreamCaptureMode``, restored right after), with the
   device's primary context pushed. Relaxed mode is CUDA's documented way to make a
   potentially unsafe call without invalidating a capture that driverlevel cannot
   see (``torch.cuda.graph`` in another or the same thread). Should the driver
   still refuse the free with a capture error, the address goes back on the
   deferred list instead of leaking.

The memory of a released handle therefore stays allocated until the capture that
was running ends; :func:`deferred_count` says how many frees are pending. Modules,
streams, events, graphs and executable graphs are released through the same path.
"""

from __future__ import annotations

import bisect
import collections
import collections.abc
import ctypes
import math
import operator
import sys
import threading
import warnings
import weakref
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from cuda.bindings import driver

from . import _capture_guard
from ._array import DeviceArray
from ._capture_guard import ensure_not_capturing
from ._checks import bool_arg, int_tuple, non_negative_int, positive_int, power_of_two
from ._dtypes import as_dtype, storage_dtype
from ._errors import PoolExhaustedError, check

__all__ = ["DeviceBuffer", "PinnedHostBuffer", "WorkspacePool", "Carve", "PointerOwner", "lookup_pointer", "align_up",
           "release_deferred", "deferred_count"]


def align_up(n: int, alignment: int) -> int:
    """Round ``n`` (bytes, >= 0) up to a multiple of ``alignment`` (a power of two >= 1), in Python ints.

    Raises ``TypeError`` for a non-integer or a bool (numpy ints are taken, a float is not
    truncated) and ``ValueError`` for a negative ``n`` or an ``alignment`` that is not a power of
    two (0, 3, -8: the bit trick would give a wrong answer)."""
    n, alignment = non_negative_int("n", n), power_of_two("alignment", alignment)
    return (n + alignment - 1) & ~(alignment - 1)


def format_bytes(n: int) -> str:
    """``n`` bytes as the messages give sizes: ``"17,369,088 bytes (16.6 MiB)"`` (``"512 bytes"`` below 1 KiB)."""
    n = operator.index(n)
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n:,} bytes ({n / size:.1f} {unit})"
    return f"{n:,} bytes"


#: The largest byte count an allocation, a view or a carve-out may have: an int64 (the kernels'
#: and DLPack's offsets are int64; no device or host memory comes near it).
MAX_NBYTES = (1 << 63) - 1


def _label_arg(label) -> str:
    """``label`` checked: a str (a buffer's or pool's name in reports and errors), else TypeError."""
    if not isinstance(label, str):
        raise TypeError(f"label must be a str, got {type(label).__name__} {label!r}")
    return label


def _nbytes_arg(nbytes, minimum: int = 1) -> int:
    """``nbytes`` checked as :func:`positive_int` (``minimum=0``: :func:`non_negative_int`) and <= MAX_NBYTES."""
    n = positive_int("nbytes", nbytes) if minimum else non_negative_int("nbytes", nbytes)
    if n > MAX_NBYTES:
        raise ValueError(f"nbytes must be at most 2**63 - 1, got {n}")
    return n


def _shape_nbytes(shape: tuple, itemsize: int) -> int:
    """The byte size of a C-contiguous ``shape`` with Python ints (never wraps, unlike ``np.prod``
    or a product of numpy ints)."""
    return math.prod(operator.index(n) for n in shape) * operator.index(itemsize)


def _carve_end(start: int, specs, alignment: int) -> int:
    """The byte offset where ``specs`` (``(shape, dtype)`` pairs) end when carved in order from offset
    ``start``, each at a multiple of ``alignment`` (at least its dtype's item size), as
    :meth:`WorkspacePool.carve` places them; Python ints throughout.

    Raises ``TypeError`` for an extent that is not an integer or an unsupported dtype, ``ValueError``
    for a negative extent."""
    if isinstance(specs, (str, bytes, collections.abc.Mapping)) or not isinstance(specs, collections.abc.Iterable):
        raise TypeError(f"specs must be a list of (shape, dtype) pairs, got {type(specs).__name__} {specs!r}")
    end = start
    for i, spec in enumerate(specs):
        if not isinstance(spec, (tuple, list)) or len(spec) != 2:
            got = f"a {len(spec)}-tuple" if isinstance(spec, tuple) else type(spec).__name__
            raise TypeError(f"specs[{i}] must be a (shape, dtype) pair, got {got} {spec!r}"
                            + (" (carve() takes the name; required_bytes does not)" if isinstance(spec, tuple)
                               and len(spec) == 3 and isinstance(spec[0], str) else ""))
        shape, dtype = spec
        shape = int_tuple("shape", shape)
        if any(d < 0 for d in shape):
            raise ValueError(f"shape extents must be >= 0, got {shape}")
        dt = as_dtype(dtype)
        end = align_up(end, max(alignment, dt.itemsize)) + _shape_nbytes(shape, dt.itemsize)
    return end


# -- registry of live allocations (for the graph audit) ---------------------------------
_reg_lock = threading.Lock()
_registry: "weakref.WeakValueDictionary[int, object]" = weakref.WeakValueDictionary()


def _register(obj) -> None:
    with _reg_lock:
        _registry[id(obj)] = obj


def _is_live(obj) -> bool:
    """False once the allocation was closed (its address range may belong to a newer one); True for
    anything that is not one of driverlevel's allocations (no finalizer of its own or of a pool's buffer)."""
    fin = getattr(obj, "_finalizer", None)
    if fin is None:
        fin = getattr(getattr(obj, "_buffer", None), "_finalizer", None)
    return not isinstance(fin, weakref.finalize) or fin.alive


def _require_open(obj, what: str) -> None:
    """``ValueError`` naming ``what`` if the allocation ``obj`` was closed: a new view of it would point at
    freed memory (a host view of freed pinned memory crashes the process when read)."""
    if not _is_live(obj):
        raise ValueError(f"{what}: {obj!r} was closed; its memory is freed")


class PointerOwner(NamedTuple):
    """Where a device address lies: the allocation's label, carve-out, offset and device ordinal."""

    label: str
    carve: "str | None"
    offset: int
    device: "int | None"


def lookup_pointer(ptr: int):
    """Find the registered allocation that contains device address ``ptr``.

    Returns
    -------
    PointerOwner or None
        ``(label, carve, offset, device)``: the allocation's label (``"pool:attn"``…),
        the carve-out name or None, the byte offset in the allocation, and the ordinal
        of the device it belongs to; None when no live driverlevel allocation contains
        ``ptr``.

    Raises
    ------
    TypeError
        ``ptr`` is not an integer address (a float, a bool, a str, None), nor a ``CUdeviceptr``
        or a :class:`~driverlevel.DeviceArray` (whose ``ptr`` is looked up).
    """
    ptr = _address_arg(ptr)
    with _reg_lock:
        objs = [o for o in _registry.values() if _is_live(o)]
    hits = [o for o in objs if o._range()[0] <= ptr < o._range()[0] + o._range()[1]]
    if not hits:
        return None
    # A pool and its backing buffer both contain the address: prefer the pool (it knows carve names).
    obj = next((o for o in hits if hasattr(o, "_carve_at")), hits[0])
    base = obj._range()[0]
    carve = obj._carve_at(ptr - base) if hasattr(obj, "_carve_at") else None
    return PointerOwner(obj.label, carve, ptr - base, getattr(obj.device, "ordinal", None))


def _address_arg(ptr) -> int:
    """``ptr`` of :func:`lookup_pointer` as an int: a ``CUdeviceptr`` or an object with an int ``ptr`` (a
    DeviceArray) by its address; an integer as it is; a float (never truncated), bool, str or None refused."""
    if isinstance(ptr, driver.CUdeviceptr):
        return int(ptr)
    inner = getattr(ptr, "ptr", None)
    if inner is not None and not isinstance(ptr, (str, bytes)):
        ptr = inner
    if isinstance(ptr, bool) or not hasattr(ptr, "__index__"):
        raise TypeError(f"lookup_pointer: ptr must be an int device address (or a CUdeviceptr or a DeviceArray), "
                        f"got {type(ptr).__name__} {ptr!r}")
    return operator.index(ptr)


def owners_of(pointers) -> list:
    """The live registered allocations (pools preferred over their backing buffers) containing ``pointers``.

    Used by :func:`driverlevel.capture` to tie to a graph every allocation its nodes
    point into. Unknown addresses are ignored.
    """
    with _reg_lock:
        objs = [o for o in _registry.values() if _is_live(o)]
    spans = sorted(((int(b), int(b) + int(n), o) for o in objs for b, n in [o._range()] if n > 0),
                   key=lambda t: t[0])
    starts = [t[0] for t in spans]
    found = {}
    for p in pointers:
        p = int(p)
        i = bisect.bisect_right(starts, p) - 1
        # Allocations do not overlap, except a pool and its backing buffer (same range):
        # look at the few spans that start at or before p, nearest first.
        for base, end, o in spans[max(i - 3, 0):i + 1]:
            if base <= p < end:
                found[id(o)] = o
    return list(found.values())


# -- releasing memory (deferred while a capture is in progress) --------------------------
_SUCCESS = driver.CUresult.CUDA_SUCCESS
_RELAXED = driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
_CAPTURE_ERRORS = frozenset(
    int(getattr(driver.CUresult, n)) for n in (
        "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED",
        "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT", "CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD",
        "CUDA_ERROR_CAPTURED_EVENT",
    ) if hasattr(driver.CUresult, n)
)
# (kind, address, context) of releases not done yet; deque append/popleft are atomic under the GIL,
# so a finalizer run by the collector in the middle of a drain is safe.
_deferred: "collections.deque[tuple]" = collections.deque()


_FREE = {
    "device": lambda h: driver.cuMemFree(h),
    "host": lambda h: driver.cuMemFreeHost(h),
    "module": lambda h: driver.cuModuleUnload(h),
    "stream": lambda h: driver.cuStreamDestroy(h),
    "event": lambda h: driver.cuEventDestroy(h),
    "graph": lambda h: driver.cuGraphDestroy(h),
    "exec": lambda h: driver.cuGraphExecDestroy(h),
}


def _free_now(kind: str, ptr, ctx) -> bool:
    """Release one handle in ``ctx`` under relaxed capture mode; False if the driver refused for capture.

    ``kind`` is ``"device"`` (cuMemFree), ``"host"`` (cuMemFreeHost), ``"module"``
    (cuModuleUnload), ``"stream"`` (cuStreamDestroy), ``"event"`` (cuEventDestroy),
    ``"graph"`` (cuGraphDestroy) or ``"exec"`` (cuGraphExecDestroy).
    """
    try:
        err, old_mode = driver.cuThreadExchangeStreamCaptureMode(_RELAXED)
    except Exception:  # interpreter shutdown: the bindings may be gone already
        return True
    try:
        (perr,) = driver.cuCtxPushCurrent(ctx)
        if perr != _SUCCESS:
            return True  # the context is gone (process exit): its memory went with it
        try:
            (ferr,) = _FREE[kind](ptr)
        finally:
            driver.cuCtxPopCurrent()
        if int(ferr) in _CAPTURE_ERRORS:
            return False
        if int(ferr) != _SUCCESS:  # a finalizer cannot raise to anyone: say so instead of hiding it
            warnings.warn(f"driverlevel: releasing a {kind} handle failed: {ferr.name}", RuntimeWarning, stacklevel=2)
        return True
    finally:
        if err == _SUCCESS:
            driver.cuThreadExchangeStreamCaptureMode(old_mode)


def _release(kind: str, ptr, ctx) -> None:
    """The finalizer of every handle that owns memory, a module, a stream or an event.

    Runs on ``del``, in ``gc.collect()`` or on ``close()``, in any thread.
    """
    try:
        if _capture_guard.captures_in_progress():
            _deferred.append((kind, ptr, ctx))
            return
        if not _free_now(kind, ptr, ctx):
            _deferred.append((kind, ptr, ctx))
    except Exception as exc:
        if sys.is_finalizing():  # interpreter shutdown: the bindings may be gone already
            return
        warnings.warn(f"driverlevel: releasing a {kind} handle failed: {exc!r}", RuntimeWarning, stacklevel=2)


def release_deferred() -> int:
    """Free the memory of handles released while a capture was in progress.

    Called by driverlevel itself when the last capture ends and before each new
    allocation; call it to get the memory back at a moment of your choosing (e.g.
    after a ``torch.cuda.graph`` capture that driverlevel could not see).

    Returns
    -------
    int
        How many allocations were freed; 0 while a driverlevel capture is still in
        progress in any thread (nothing is freed then).
    """
    if _capture_guard.captures_in_progress():
        return 0
    done = 0
    retry = []
    for _ in range(len(_deferred)):
        try:
            item = _deferred.popleft()
        except IndexError:
            break
        if _free_now(*item):
            done += 1
        else:
            retry.append(item)
    _deferred.extend(retry)
    return done


def deferred_count() -> int:
    """How many released allocations wait for :func:`release_deferred` (0 outside captures)."""
    return len(_deferred)


def _refuse_copy(obj):
    """``__reduce__`` of the allocations: ``pickle`` / ``copy.copy`` / ``copy.deepcopy`` raise TypeError (a copy
    shared the allocation and its finalizer, a copied pool handed out carve-outs overlapping the original's, and
    an unpickled one looked closed)."""
    memory = "pinned host" if isinstance(obj, PinnedHostBuffer) else "device"
    raise TypeError(f"a {type(obj).__name__} owns this process's {memory} memory and cannot be pickled or copied")


class DeviceBuffer:
    """One ``cuMemAlloc`` allocation, freed when the object is closed or collected.

    Create with :meth:`DeviceBuffer.allocate` (there is no public constructor) and view it
    with :meth:`as_array`; a captured graph that points into it keeps it alive. For many
    arrays of one plan, one :class:`WorkspacePool` is the better fit.

    Attributes
    ----------
    ptr : int
        Device address.
    nbytes : int
        Size in bytes.
    device : Device
    label : str
        Shown in graph audits and error messages.

    Raises
    ------
    RuntimeError
        ``DeviceBuffer()`` called directly.
    TypeError
        ``pickle``, ``copy.copy`` or ``copy.deepcopy`` of it (it owns the memory).
    """

    __reduce__ = _refuse_copy

    def __init__(self, *a, **k):
        raise RuntimeError("DeviceBuffer has no public constructor: use DeviceBuffer.allocate(device, nbytes)")

    @classmethod
    def allocate(cls, device, nbytes: int, label: str = "buffer") -> "DeviceBuffer":
        """Allocate ``nbytes`` of device memory on ``device``.

        Raises
        ------
        TypeError, ValueError
            ``nbytes`` is not a positive integer, or is above 2**63 - 1; ``label`` is not a str
            (checked before the device is touched).
        CaptureError
            While a capture is active (allocation would invalidate it).
        CudaError
            ``CUDA_ERROR_OUT_OF_MEMORY`` and the like.
        """
        from ._device import _check_device_arg

        nbytes = _nbytes_arg(nbytes)  # before the device is touched
        label = _label_arg(label)
        device = _check_device_arg(device)
        ensure_not_capturing("DeviceBuffer.allocate() (cuMemAlloc)")
        if _deferred:
            release_deferred()
        with device.activated():
            dptr = check("cuMemAlloc", driver.cuMemAlloc(nbytes), f"{nbytes} bytes for {label!r}")
        self = object.__new__(cls)
        self.ptr = int(dptr)
        self.nbytes = nbytes
        self.device = device
        self.label = label
        self._finalizer = weakref.finalize(self, _release, "device", dptr, device.context)
        _register(self)
        return self

    def _range(self):
        return self.ptr, self.nbytes

    def as_array(self, shape=None, dtype=np.uint8) -> DeviceArray:
        """A :class:`DeviceArray` view of the buffer (default: all bytes as uint8).

        Raises
        ------
        TypeError
            ``shape`` holds a non-integer, or ``dtype`` is not supported.
        ValueError
            ``shape`` has a negative extent, or the view is larger than the buffer; or the buffer
            was closed.
        """
        _require_open(self, "as_array")
        dt = as_dtype(dtype)
        shape = (self.nbytes // dt.itemsize,) if shape is None else int_tuple("shape", shape)
        if any(n < 0 for n in shape):
            raise ValueError(f"shape {shape} has a negative extent")
        n = _shape_nbytes(shape, dt.itemsize)
        if n > self.nbytes:
            raise ValueError(f"view of {n} bytes exceeds the buffer's {self.nbytes}")
        return DeviceArray(self.ptr, shape, dt, self.device, owner=self)

    def close(self) -> None:
        """Free the memory now (idempotent). Views must no longer be used (the array methods and the
        plans refuse views of a closed buffer); new views are refused.

        While a driverlevel capture is in progress the free is deferred until it
        ends (see the module docstring); never invalidates a capture.
        """
        self._finalizer()

    def __repr__(self):
        return f"<DeviceBuffer {self.label!r} 0x{self.ptr:x} {self.nbytes} B on {self.device!r}>"


class PinnedHostBuffer:
    """Page-locked host memory (``cuMemHostAlloc``), optionally mapped into the device.

    A mapped buffer has a device address (:attr:`device_ptr`) that kernels may write;
    the host reads the same bytes through :meth:`numpy` after an event, without any
    copy call.

    Create with :meth:`PinnedHostBuffer.allocate` (there is no public constructor).

    Attributes
    ----------
    host_ptr : int
        Host address.
    device_ptr : int or None
        Device address of a mapped buffer, None otherwise.
    nbytes : int
        Size in bytes.
    mapped : bool
    device : Device
    label : str

    Raises
    ------
    RuntimeError
        ``PinnedHostBuffer()`` called directly.
    TypeError
        ``pickle``, ``copy.copy`` or ``copy.deepcopy`` of it (it owns the memory).
    """

    __reduce__ = _refuse_copy

    def __init__(self, *a, **k):
        raise RuntimeError("PinnedHostBuffer has no public constructor: use PinnedHostBuffer.allocate(device, nbytes)")

    @classmethod
    def allocate(cls, device, nbytes: int, *, mapped: bool = False, label: str = "pinned") -> "PinnedHostBuffer":
        """Allocate ``nbytes`` of pinned host memory; ``mapped=True`` also maps it into ``device``.

        Raises
        ------
        TypeError, ValueError
            ``nbytes`` is not a positive integer, or is above 2**63 - 1; ``mapped`` is not a
            bool (``"no"`` and 0 are refused, not read as flags); ``label`` is not a str;
            ``device`` is neither a Device nor an int ordinal (all checked before the device is
            touched).
        DriverUnavailableError
            ``device`` is an int and there is no usable driver.
        CaptureError
            While a capture is active.
        CudaError
            If ``cuMemHostAlloc`` fails (e.g. out of memory).
        """
        from ._device import _check_device_arg

        nbytes = _nbytes_arg(nbytes)  # before the device is touched
        mapped = bool_arg("mapped", mapped)
        label = _label_arg(label)
        device = _check_device_arg(device)
        ensure_not_capturing("PinnedHostBuffer.allocate() (cuMemHostAlloc)")
        if _deferred:
            release_deferred()
        flags = driver.CU_MEMHOSTALLOC_PORTABLE
        if mapped:
            flags |= driver.CU_MEMHOSTALLOC_DEVICEMAP
        with device.activated():
            hptr = check("cuMemHostAlloc", driver.cuMemHostAlloc(nbytes, flags), f"{nbytes} bytes")
            self = object.__new__(cls)
            self.host_ptr = int(hptr)
            self.nbytes = nbytes
            self.device = device
            self.mapped = mapped
            self.label = label
            self._finalizer = weakref.finalize(self, _release, "host", hptr, device.context)
            self.device_ptr = int(check("cuMemHostGetDevicePointer", driver.cuMemHostGetDevicePointer(hptr, 0))) if mapped else None
        _register(self)
        return self

    def _range(self):
        return (self.device_ptr, self.nbytes) if self.device_ptr is not None else (0, 0)

    def _view(self, shape, itemsize: int, dtype_name: str, offset) -> tuple:
        """``(shape, offset, nbytes)`` of a view, checked to lie inside the buffer (Python ints throughout)."""
        offset = non_negative_int("offset", offset)
        if offset % itemsize:
            raise ValueError(f"offset must be a multiple of {dtype_name}'s item size {itemsize}, got {offset}")
        if offset > self.nbytes:
            raise ValueError(f"offset {offset} is past the end of the buffer's {self.nbytes} bytes")
        shape = ((self.nbytes - offset) // itemsize,) if shape is None else int_tuple("shape", shape)
        if any(n < 0 for n in shape):
            raise ValueError(f"shape {shape} has a negative extent")
        n = _shape_nbytes(shape, itemsize)
        if offset + n > self.nbytes:
            raise ValueError(f"view of {n} bytes at offset {offset} exceeds the buffer's {self.nbytes}")
        return shape, offset, n

    def numpy(self, shape=None, dtype=np.uint8, offset: int = 0) -> np.ndarray:
        """A numpy view of the host bytes (no copy); bfloat16 appears as uint16.

        Parameters
        ----------
        shape : tuple of int, optional
            Default: as many whole items as fit after ``offset``.
        dtype : numpy dtype or :data:`driverlevel.bfloat16`
        offset : int
            Byte offset of the view's start: >= 0, a multiple of the dtype's item size, and
            with the view inside the buffer.

        Raises
        ------
        TypeError
            ``offset`` or an extent of ``shape`` is not an integer, or ``dtype`` is not supported.
        ValueError
            ``offset`` is negative, not a multiple of the item size or past the end; ``shape``
            has a negative extent; or the view does not fit in the buffer; or the buffer was
            closed (a view of freed host memory would crash the process when read; views taken
            before :meth:`close` must not be used after it).

        The view keeps the buffer alive: its memory lives as long as the buffer or any view
        (an explicit :meth:`close` still frees it).
        """
        _require_open(self, "numpy")
        dt = storage_dtype(dtype)
        shape, offset, n = self._view(shape, dt.itemsize, as_dtype(dtype).name, offset)
        # The view's base is a ctypes array that holds this buffer: a view keeps the memory alive (a view of a
        # temporary buffer, ``PinnedHostBuffer.allocate(...).numpy()``, read freed memory and crashed); made per
        # call, so that the buffer itself holds no reference cycle and is freed as soon as it and its views go.
        raw = (ctypes.c_uint8 * self.nbytes).from_address(self.host_ptr)
        raw._driverlevel_owner = self
        return np.frombuffer(raw, np.uint8)[offset:offset + n].view(dt).reshape(shape)  # (frombuffer: ~1 µs)

    def as_array(self, shape=None, dtype=np.uint8, offset: int = 0) -> DeviceArray:
        """The device-side view of a mapped buffer (``shape``, ``dtype`` and ``offset`` as in :meth:`numpy`).

        Raises
        ------
        TypeError
            ``offset`` or an extent of ``shape`` is not an integer, or ``dtype`` is not supported.
        ValueError
            If the buffer was not allocated with ``mapped=True``; or ``offset`` is negative, not
            a multiple of the item size or past the end; ``shape`` has a negative extent; or the
            view does not fit in the buffer; or the buffer was closed.
        """
        _require_open(self, "as_array")
        if not self.mapped:
            raise ValueError("as_array() needs a buffer allocated with mapped=True")
        dt = as_dtype(dtype)
        shape, offset, _ = self._view(shape, dt.itemsize, dt.name, offset)
        return DeviceArray(self.device_ptr + offset, shape, dt, self.device, owner=self)

    def close(self) -> None:
        """Free the pinned memory now (idempotent; deferred while a capture is in progress).
        Views taken before (:meth:`numpy`, :meth:`as_array`) must no longer be used; new ones are
        refused."""
        self._finalizer()

    def __repr__(self):
        where = f" mapped 0x{self.device_ptr:x}" if self.device_ptr is not None else ""
        return f"<PinnedHostBuffer {self.label!r} 0x{self.host_ptr:x}{where} {self.nbytes} B on {self.device!r}>"


@dataclass(frozen=True)
class Carve:
    """One named carve-out of a :class:`WorkspacePool`.

    Attributes
    ----------
    name : str
    offset : int
        Byte offset from the pool's base (aligned).
    nbytes : int
    shape : tuple
    dtype : str
    """

    name: str
    offset: int
    nbytes: int
    shape: tuple
    dtype: str


class WorkspacePool:
    """One device allocation made up front, handed out as named aligned carve-outs.

    Carve-outs have stable addresses for the pool's lifetime, so a captured graph
    may point into them and be replayed forever. Nothing is ever freed
    individually; the whole pool is freed when closed or collected (a graph that
    points into it keeps it alive).

    Create with :meth:`WorkspacePool.allocate`. Size it with :meth:`required_bytes` (or a
    plan's ``pool_bytes``).

    Attributes
    ----------
    device : Device
        The device the pool's memory is on.
    base : int
        Device address of the pool's first byte (``cuMemAlloc``'s, aligned to at least 256 B).
    capacity : int
        Bytes held (``nbytes`` rounded up to ``alignment``).
    alignment : int
        The carve-outs' default start alignment, bytes (a power of two).
    label : str
        The name used in reports and error messages.

    Example
    -------
    >>> pool = WorkspacePool.allocate(dev, 1 << 20, label="attn")      # doctest: +SKIP
    >>> lse = pool.carve("lse", (64, 9), "float32")                     # doctest: +SKIP
    >>> print(pool.report())                                             # doctest: +SKIP

    ``pickle``, ``copy.copy`` and ``copy.deepcopy`` of a pool raise ``TypeError`` (it owns the
    memory; a copy handed out carve-outs overlapping the original's).
    """

    DEFAULT_ALIGNMENT = 256

    __reduce__ = _refuse_copy

    def __init__(self, *a, **k):
        raise RuntimeError("WorkspacePool has no public constructor: use WorkspacePool.allocate(device, nbytes)")

    @classmethod
    def allocate(cls, device, nbytes: int, *, label: str = "workspace", alignment: int = DEFAULT_ALIGNMENT) -> "WorkspacePool":
        """Allocate a pool of ``nbytes`` (rounded up to ``alignment``; 0 gives one ``alignment``
        unit, a pool is never empty) on ``device``.

        Raises
        ------
        TypeError
            ``nbytes`` or ``alignment`` is not an integer (a float or a bool is refused, not
            truncated), or ``label`` is not a str.
        ValueError
            ``nbytes`` is negative or, rounded up to ``alignment``, above 2**63 - 1, or
            ``alignment`` is not a positive power of two; all before the device is touched.
        TypeError, ValueError, DriverUnavailableError
            For a ``device`` that is neither a Device nor an int ordinal, a negative ordinal,
            or an int without a usable driver (as :class:`~driverlevel.Device` raises).
        CaptureError
            While a capture is active.
        CudaError
            If the allocation fails (e.g. out of memory).
        """
        alignment = power_of_two("alignment", alignment)
        asked = _nbytes_arg(nbytes, minimum=0)
        nbytes = max(align_up(asked, alignment), alignment)
        if nbytes > MAX_NBYTES:  # (the rounded size: the message names both)
            raise ValueError(f"nbytes {asked} rounded up to the alignment ({alignment}) is {nbytes}, over 2**63 - 1")
        label = _label_arg(label)
        self = object.__new__(cls)
        self._buffer = DeviceBuffer.allocate(device, nbytes, label=f"pool:{label}")
        self.label = label
        self.device = self._buffer.device
        self.alignment = alignment
        self.capacity = nbytes
        self.base = self._buffer.ptr
        self._used = 0
        self._carves: dict[str, Carve] = {}
        self._lock = threading.Lock()
        _register(self)
        return self

    @staticmethod
    def required_bytes(specs, alignment: int = DEFAULT_ALIGNMENT) -> int:
        """Bytes a pool needs for ``specs``, a list of ``(shape, dtype)`` carved in order.

        Each carve-out starts at a multiple of ``alignment`` (at least its dtype's item size),
        as :meth:`carve` places it. The sum is computed with Python ints, so it is exact for
        any shape (it may exceed what :meth:`allocate` accepts, which then refuses it).

        Raises
        ------
        TypeError
            ``specs`` is not a list of ``(shape, dtype)`` pairs, ``alignment`` or an extent is not
            an integer (floats and bools are refused, not truncated), or a dtype is not supported
            (what :meth:`carve` refuses too).
        ValueError
            ``alignment`` is not a positive power of two, or a shape has a negative extent.
        """
        alignment = power_of_two("alignment", alignment)
        return align_up(_carve_end(0, specs, alignment), alignment)

    @property
    def used(self) -> int:
        """Bytes handed out so far (including alignment padding)."""
        return self._used

    @property
    def free(self) -> int:
        """Bytes not handed out yet (``capacity - used``; a carve may need some of it for alignment)."""
        return self.capacity - self._used

    def _range(self):
        return self.base, self.capacity

    def _carve_at(self, offset: int):
        for c in self._carves.values():
            if c.offset <= offset < c.offset + max(c.nbytes, 1):
                return c.name
        return None

    def carve(self, name: str, shape, dtype, *, alignment: int | None = None) -> DeviceArray:
        """Hand out a new named C-contiguous array from the pool.

        Parameters
        ----------
        name : str
            Unique within the pool, not empty; shown in :meth:`report` and in graph audits.
        shape : tuple of int
            Extents >= 0 (an int is a 1-D shape).
        dtype : numpy dtype, str, or :data:`driverlevel.bfloat16`
            bool, an integer, float16/32/64 or bfloat16.
        alignment : int, optional
            Byte alignment of the start, a power of two (default: the pool's, 256); the start
            is aligned to at least the dtype's item size whatever is asked. The offset is
            aligned from the pool's :attr:`base`, so an address alignment above ``cuMemAlloc``'s
            (256 B at least) is only relative to the base.

        Raises
        ------
        TypeError
            ``name`` is not a str; an extent of ``shape`` or ``alignment`` is not an integer
            (floats and bools are refused, not truncated); or ``dtype`` is not supported.
        ValueError
            If ``name`` is empty or already carved, ``shape`` has a negative extent, or
            ``alignment`` is not a positive power of two; or the pool was closed.
        PoolExhaustedError
            If the pool has too little room left (sizes are Python ints: an oversized shape
            is refused here, never wrapped); the message gives the sizes.
        """
        _require_open(self, "carve")
        if not isinstance(name, str):
            raise TypeError(f"carve name must be a str, got {type(name).__name__} {name!r}")
        if not name:
            raise ValueError("carve name must not be empty")
        dt = as_dtype(dtype)
        shape = int_tuple(f"carve {name!r}: shape", shape)
        if any(s < 0 for s in shape):
            raise ValueError(f"carve {name!r}: negative dimension in shape {shape}")
        nbytes = _shape_nbytes(shape, dt.itemsize)
        al = max(self.alignment if alignment is None else power_of_two("alignment", alignment), dt.itemsize)
        with self._lock:
            if name in self._carves:
                raise ValueError(f"pool {self.label!r} already has a carve-out named {name!r}")
            offset = align_up(self._used, al)
            if offset + nbytes > self.capacity:
                raise PoolExhaustedError(
                    f"pool {self.label!r} is exhausted: carve-out {name!r} needs {format_bytes(nbytes)} at offset "
                    f"{offset:,}, so the pool would need {format_bytes(offset + nbytes)}, but it holds "
                    f"{format_bytes(self.capacity)}, of which {format_bytes(self.capacity - self._used)} are free. "
                    f"Size the pool with WorkspacePool.required_bytes() or the plan's pool_bytes."
                )
            self._used = offset + nbytes
            self._carves[name] = Carve(name, offset, nbytes, shape, dt.name)
        return DeviceArray(self.base + offset, shape, dt, self.device, owner=self)

    def _require_room(self, specs, what: str) -> None:
        """Raise :class:`PoolExhaustedError` unless ``specs`` (``(shape, dtype)`` pairs, carved in this
        order as :meth:`carve` places them) fit in what is left of the pool; nothing is carved.

        For a plan given a pool of the caller's: refused before its first carve-out, with the
        bytes the plan needs and the bytes the pool has, instead of at whichever carve-out runs out.
        """
        with self._lock:
            used = self._used
        end = _carve_end(used, specs, self.alignment)
        if end > self.capacity:
            raise PoolExhaustedError(
                f"pool {self.label!r} is too small for {what}: its carve-outs need {format_bytes(end - used)}, but "
                f"the pool has {format_bytes(self.capacity - used)} free (it holds {format_bytes(self.capacity)}). "
                f"Allocate it with at least the plan's pool_bytes, or let the plan allocate its own.")

    def carves(self) -> list:
        """The :class:`Carve` records in carving order."""
        return list(self._carves.values())

    def report(self) -> str:
        """A table of what is carved where (offset, bytes, shape, dtype)."""
        lines = [f"pool {self.label!r} on {self.device!r}: base 0x{self.base:x}, "
                 f"{self._used:,} of {self.capacity:,} bytes used"]
        lines.append(f"  {'name':<28} {'offset':>14} {'bytes':>14}  shape / dtype")
        for c in self._carves.values():
            lines.append(f"  {c.name:<28} {c.offset:>14,} {c.nbytes:>14,}  {c.shape} {c.dtype}")
        return "\n".join(lines)

    def close(self) -> None:
        """Free the pool now (idempotent). Arrays carved from it must no longer be used (the array
        methods and the plans refuse them, and a plan built on the pool refuses to run); new carves
        are refused."""
        self._buffer.close()

    def __repr__(self):
        return f"<WorkspacePool {self.label!r} {self._used}/{self.capacity} B on {self.device!r}>"
