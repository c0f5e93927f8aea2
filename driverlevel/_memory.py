"""Device buffers, pinned host buffers and the workspace pool.

Everything a captured graph points into is allocated here before capture; the
pool hands out named, aligned carve-outs of one up-front allocation, whose
addresses never change. Every live allocation is registered so that the graph
audit (:meth:`Graph.kernel_nodes`) can say which pool and carve-out a kernel
argument points into.
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from cuda.bindings import driver

from ._array import DeviceArray
from ._capture_guard import ensure_not_capturing
from ._dtypes import as_dtype, storage_dtype
from ._errors import PoolExhaustedError, check

__all__ = ["DeviceBuffer", "PinnedHostBuffer", "WorkspacePool", "Carve", "PointerOwner", "lookup_pointer", "align_up"]


def align_up(n: int, alignment: int) -> int:
    """Round ``n`` up to a multiple of ``alignment`` (a power of two)."""
    return (int(n) + alignment - 1) & ~(alignment - 1)


# -- registry of live allocations (for the graph audit) ---------------------------------
_reg_lock = threading.Lock()
_registry: "weakref.WeakValueDictionary[int, object]" = weakref.WeakValueDictionary()


def _register(obj) -> None:
    with _reg_lock:
        _registry[id(obj)] = obj


def _is_live(obj) -> bool:
    """False once the allocation was closed (its address range may belong to a newer one)."""
    fin = getattr(obj, "_finalizer", None)
    if fin is None:
        fin = getattr(getattr(obj, "_buffer", None), "_finalizer", None)
    return fin is None or fin.alive


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
    """
    ptr = int(ptr)
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


def _free_device(ptr, ctx):
    try:
        driver.cuCtxPushCurrent(ctx)
        driver.cuMemFree(ptr)
        driver.cuCtxPopCurrent()
    except Exception:
        pass


def _free_host(ptr, ctx):
    try:
        driver.cuCtxPushCurrent(ctx)
        driver.cuMemFreeHost(ptr)
        driver.cuCtxPopCurrent()
    except Exception:
        pass


class DeviceBuffer:
    """One ``cuMemAlloc`` allocation, freed when the object is closed or collected.

    Create with :meth:`DeviceBuffer.allocate`.

    Attributes
    ----------
    ptr : int
        Device address.
    nbytes : int
    device : Device
    label : str
    """

    def __init__(self, *a, **k):
        raise RuntimeError("DeviceBuffer has no public constructor: use DeviceBuffer.allocate(device, nbytes)")

    @classmethod
    def allocate(cls, device, nbytes: int, label: str = "buffer") -> "DeviceBuffer":
        """Allocate ``nbytes`` of device memory on ``device``.

        Raises
        ------
        CaptureError
            While a capture is active (allocation would invalidate it).
        CudaError
            ``CUDA_ERROR_OUT_OF_MEMORY`` and the like.
        """
        from ._device import _check_device_arg

        device = _check_device_arg(device)
        nbytes = int(nbytes)
        if nbytes <= 0:
            raise ValueError(f"nbytes must be positive, got {nbytes}")
        ensure_not_capturing("DeviceBuffer.allocate() (cuMemAlloc)")
        device.set_current()
        dptr = check("cuMemAlloc", driver.cuMemAlloc(nbytes), f"{nbytes} bytes for {label!r}")
        self = object.__new__(cls)
        self.ptr = int(dptr)
        self.nbytes = nbytes
        self.device = device
        self.label = label
        self._finalizer = weakref.finalize(self, _free_device, dptr, device.context)
        _register(self)
        return self

    def _range(self):
        return self.ptr, self.nbytes

    def as_array(self, shape=None, dtype=np.uint8) -> DeviceArray:
        """A :class:`DeviceArray` view of the buffer (default: all bytes as uint8)."""
        dt = as_dtype(dtype)
        if shape is None:
            shape = (self.nbytes // dt.itemsize,)
        arr = DeviceArray(self.ptr, shape, dt, self.device, owner=self)
        if arr.nbytes > self.nbytes:
            raise ValueError(f"view of {arr.nbytes} bytes exceeds the buffer's {self.nbytes}")
        return arr

    def close(self) -> None:
        """Free the memory now (idempotent). Views must no longer be used."""
        self._finalizer()

    def __repr__(self):
        return f"<DeviceBuffer {self.label!r} 0x{self.ptr:x} {self.nbytes} B on {self.device!r}>"


class PinnedHostBuffer:
    """Page-locked host memory (``cuMemHostAlloc``), optionally mapped into the device.

    A mapped buffer has a device address (:attr:`device_ptr`) that kernels may write;
    the host reads the same bytes through :meth:`numpy` after an event, without any
    copy call.

    Create with :meth:`PinnedHostBuffer.allocate`.
    """

    def __init__(self, *a, **k):
        raise RuntimeError("PinnedHostBuffer has no public constructor: use PinnedHostBuffer.allocate()")

    @classmethod
    def allocate(cls, device, nbytes: int, *, mapped: bool = False, label: str = "pinned") -> "PinnedHostBuffer":
        """Allocate ``nbytes`` of pinned host memory; ``mapped=True`` also maps it into ``device``."""
        from ._device import _check_device_arg

        device = _check_device_arg(device)
        nbytes = int(nbytes)
        if nbytes <= 0:
            raise ValueError(f"nbytes must be positive, got {nbytes}")
        ensure_not_capturing("PinnedHostBuffer.allocate() (cuMemHostAlloc)")
        device.set_current()
        flags = driver.CU_MEMHOSTALLOC_PORTABLE
        if mapped:
            flags |= driver.CU_MEMHOSTALLOC_DEVICEMAP
        hptr = check("cuMemHostAlloc", driver.cuMemHostAlloc(nbytes, flags), f"{nbytes} bytes")
        self = object.__new__(cls)
        self.host_ptr = int(hptr)
        self.nbytes = nbytes
        self.device = device
        self.mapped = mapped
        self.label = label
        self._finalizer = weakref.finalize(self, _free_host, hptr, device.context)
        self.device_ptr = int(check("cuMemHostGetDevicePointer", driver.cuMemHostGetDevicePointer(hptr, 0))) if mapped else None
        self._bytes = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(self.host_ptr))
        _register(self)
        return self

    def _range(self):
        return (self.device_ptr, self.nbytes) if self.device_ptr is not None else (0, 0)

    def numpy(self, shape=None, dtype=np.uint8, offset: int = 0) -> np.ndarray:
        """A numpy view of the host bytes (no copy); bfloat16 appears as uint16."""
        dt = storage_dtype(dtype)
        if shape is None:
            shape = ((self.nbytes - offset) // dt.itemsize,)
        n = int(np.prod(shape)) * dt.itemsize
        if offset + n > self.nbytes:
            raise ValueError(f"view of {n} bytes at offset {offset} exceeds the buffer's {self.nbytes}")
        return self._bytes[offset:offset + n].view(dt).reshape(shape)

    def as_array(self, shape=None, dtype=np.uint8, offset: int = 0) -> DeviceArray:
        """The device-side view of a mapped buffer.

        Raises
        ------
        ValueError
            If the buffer was not allocated with ``mapped=True``.
        """
        if not self.mapped:
            raise ValueError("as_array() needs a buffer allocated with mapped=True")
        dt = as_dtype(dtype)
        if shape is None:
            shape = ((self.nbytes - offset) // dt.itemsize,)
        arr = DeviceArray(self.device_ptr + offset, shape, dt, self.device, owner=self)
        if offset + arr.nbytes > self.nbytes:
            raise ValueError("view exceeds the buffer")
        return arr

    def close(self) -> None:
        self._finalizer()


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

    Create with :meth:`WorkspacePool.allocate`. Size it with :meth:`required_bytes`.

    Example
    -------
    >>> pool = WorkspacePool.allocate(dev, 1 << 20, label="attn")      # doctest: +SKIP
    >>> lse = pool.carve("lse", (64, 9), "float32")                     # doctest: +SKIP
    >>> print(pool.report())                                             # doctest: +SKIP
    """

    DEFAULT_ALIGNMENT = 256

    def __init__(self, *a, **k):
        raise RuntimeError("WorkspacePool has no public constructor: use WorkspacePool.allocate(device, nbytes)")

    @classmethod
    def allocate(cls, device, nbytes: int, *, label: str = "workspace", alignment: int = DEFAULT_ALIGNMENT) -> "WorkspacePool":
        """Allocate a pool of ``nbytes`` (rounded up to ``alignment``) on ``device``.

        Raises
        ------
        CaptureError
            While a capture is active.
        CudaError
            If the allocation fails (e.g. out of memory).
        """
        if alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"alignment must be a power of two, got {alignment}")
        nbytes = max(align_up(int(nbytes), alignment), alignment)
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
        """Bytes a pool needs for ``specs``, a list of ``(shape, dtype)`` carved in order."""
        total = 0
        for shape, dtype in specs:
            n = int(np.prod(shape, dtype=np.int64)) * as_dtype(dtype).itemsize
            total = align_up(total, alignment) + n
        return align_up(total, alignment)

    @property
    def used(self) -> int:
        """Bytes handed out so far (including alignment padding)."""
        return self._used

    @property
    def free(self) -> int:
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
            Unique within the pool; shown in :meth:`report` and in graph audits.
        shape : tuple of int
        dtype : numpy dtype, str, or :data:`driverlevel.bfloat16`
        alignment : int, optional
            Byte alignment of the start (default: the pool's, 256).

        Raises
        ------
        ValueError
            If ``name`` is already carved.
        PoolExhaustedError
            If the pool has too little room left; the message gives the sizes.
        """
        dt = as_dtype(dtype)
        shape = tuple(int(s) for s in (shape if isinstance(shape, (tuple, list)) else (shape,)))
        if any(s < 0 for s in shape):
            raise ValueError(f"carve {name!r}: negative dimension in shape {shape}")
        nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        al = alignment or self.alignment
        with self._lock:
            if name in self._carves:
                raise ValueError(f"pool {self.label!r} already has a carve-out named {name!r}")
            offset = align_up(self._used, al)
            if offset + nbytes > self.capacity:
                raise PoolExhaustedError(
                    f"pool {self.label!r} is exhausted: carve-out {name!r} needs {nbytes} bytes at offset {offset}, "
                    f"but the pool holds {self.capacity} bytes ({self.capacity - self._used} free). "
                    f"Size the pool with WorkspacePool.required_bytes() or the plan's workspace_bytes."
                )
            self._used = offset + nbytes
            self._carves[name] = Carve(name, offset, nbytes, shape, dt.name)
        return DeviceArray(self.base + offset, shape, dt, self.device, owner=self)

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
        """Free the pool now (idempotent). Arrays carved from it must no longer be used."""
        self._buffer.close()

    def __repr__(self):
        return f"<WorkspacePool {self.label!r} {self._used}/{self.capacity} B on {self.device!r}>"
