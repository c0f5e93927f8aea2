"""A small typed view of device memory, and zero-copy exchange with other libraries.

:class:`DeviceArray` is ``(pointer, shape, dtype, strides, device)`` plus an owner
that keeps the memory alive. It exports ``__cuda_array_interface__`` (version 3)
and DLPack (``__dlpack__`` / ``__dlpack_device__``), and :func:`as_device_array`
accepts any object exporting either protocol (CuPy, PyTorch, JAX, Numba) without
copying. DLPack goes both ways in either capsule: DLPack 1.0's versioned one
(``"dltensor_versioned"``, which carries a read-only flag) when the consumer asks for it
with ``max_version``, else the legacy ``"dltensor"``; an import asks for the versioned one
and takes either, a read-only flag making a read-only :class:`DeviceArray`.

Importing never synchronizes implicitly: a DLPack producer is asked for its
capsule with ``stream=-1`` ("no synchronization" in the DLPack protocol), so no
event is recorded or waited on any of the producer's streams — which would be
illegal while that stream is being captured (e.g. inside ``torch.cuda.graph``).
The ``stream`` of a version-3 ``__cuda_array_interface__`` is not synchronized
with either. Order your streams explicitly (events, or run on the producer's
stream with :meth:`Stream.from_handle`). Integer index arrays (int32, int64) are
viewed as they are: no dtype conversion, no copy.
"""

from __future__ import annotations

import collections.abc
import ctypes
import math
import operator

import numpy as np
from cuda.bindings import driver

from . import _capture_guard
from ._capture_guard import ensure_not_capturing
from ._checks import bool_arg, int_in_range, int_tuple, stream_arg
from ._device import Device, _check_device_arg
from ._dtypes import as_dtype, bfloat16, is_ml_bfloat16, storage_dtype
from ._errors import check

__all__ = ["DeviceArray", "as_device_array"]


def array_key(a) -> object:
    """What launches packed for the :class:`DeviceArray` ``a`` depend on: its address, shape and dtype
    (0 for None). A plan's cache of packed launches is keyed on these: the same address with another
    shape or dtype (a smaller ``free_slots``, an int64 ``req_to_token``) must pack anew."""
    return 0 if a is None else (int(a.ptr), a.shape, a.dtype)


def _c_strides(shape, itemsize):
    strides = []
    acc = operator.index(itemsize)
    for n in reversed(shape):
        strides.append(acc)
        acc *= max(operator.index(n), 1)  # Python ints: a numpy extent would wrap the product
    return tuple(reversed(strides))


def _device_arg(device):
    """``device`` as a :class:`Device`: an int ordinal is opened with ``_check_device_arg``
    (as every other entry point does); an object with Device's interface (an ``ordinal``, e.g. a
    test's stand-in) is kept; None, bool, float, str and the like are a ``TypeError``."""
    if isinstance(device, Device):
        return device
    if hasattr(device, "ordinal") and not hasattr(device, "__index__") and not isinstance(device, (str, bytes)):
        return device
    return _check_device_arg(device)


def _ptr_arg(ptr) -> int:
    if isinstance(ptr, driver.CUdeviceptr):
        return int(ptr)
    if isinstance(ptr, bool) or not hasattr(ptr, "__index__"):
        raise TypeError(f"DeviceArray: ptr must be an int device address, got {type(ptr).__name__} {ptr!r}")
    return int(operator.index(ptr))


class DeviceArray:
    """A typed, strided view of device memory.

    Parameters
    ----------
    ptr : int
        Device address of element ``[0, ..., 0]`` (an int or a ``CUdeviceptr``).
    shape : tuple of int
        Integers >= 0 (an int is a 1-D shape); floats and bools are refused, not truncated.
    dtype : numpy dtype or :data:`driverlevel.bfloat16`
        bool, an integer, float16/32/64 or bfloat16 (see :func:`~driverlevel._dtypes.as_dtype`).
    device : Device or int
        An int is the ordinal of a device, opened as :class:`Device` (which needs the driver).
    strides : tuple of int, optional
        Byte strides; C-contiguous when omitted.
    owner : object, optional
        Kept alive as long as this view (a buffer, a pool, a foreign array).
    readonly : bool
        Exported as read-only through ``__cuda_array_interface__`` (its ``data`` flag);
        :meth:`copy_from_host`, :meth:`copy_from`, :meth:`fill_bytes`, :meth:`fill_u32` and the
        plans' outputs refuse a read-only array. Through DLPack, the versioned capsule
        (DLPack 1.0, which :meth:`__dlpack__` exports to a consumer that passes
        ``max_version=(1, 0)`` or later) carries it as its read-only flag; the legacy capsule
        has no such flag, so a consumer of that one gets the memory writable.

    Raises
    ------
    TypeError
        For a ``ptr``, extent or stride that is not an integer (a float, a bool, a str), an
        unsupported ``dtype`` (object, str, datetime, complex, structured...), or a ``device``
        that is neither a Device nor an int ordinal (None included), or a ``readonly`` that is
        not a bool (``"no"`` is refused, not read as True).
    ValueError
        For an address outside 0 .. 2**64 - 1, a negative extent, strides whose count differs
        from the shape's, elements that reach past the 64-bit address space (``ptr`` 2**64 - 8
        with 16 bytes), or a negative device ordinal.
    DriverUnavailableError
        ``device`` is an int and there is no usable driver.

    Notes
    -----
    A bfloat16 array exports DLPack only: ``__cuda_array_interface__`` has no bfloat16 type
    string, so reading it raises ``TypeError`` (view it as uint16 bit patterns with
    :meth:`view` for a consumer of that protocol).

    A DeviceArray is a view of this process's device memory: ``pickle``, ``copy.copy`` and
    ``copy.deepcopy`` raise ``TypeError`` (copy the contents with :meth:`to_numpy`). Its copies,
    fills and reads, and every plan given it, raise ``ValueError`` once the buffer or pool it views
    was closed.
    """

    __slots__ = ("ptr", "shape", "dtype", "strides", "device", "owner", "readonly", "_contig", "__weakref__")

    def __init__(self, ptr, shape, dtype, device, strides=None, owner=None, readonly=False):
        self.ptr = _ptr_arg(ptr)
        if not 0 <= self.ptr < 1 << 64:
            raise ValueError(f"DeviceArray: ptr must be a device address in 0 .. 2**64 - 1, got {self.ptr}")
        self.shape = int_tuple("DeviceArray: shape", shape)
        if any(n < 0 for n in self.shape):
            raise ValueError(f"DeviceArray: shape {self.shape} has a negative extent")
        self.dtype = as_dtype(dtype)
        self.strides = (int_tuple("DeviceArray: strides", strides) if strides is not None
                        else _c_strides(self.shape, self.dtype.itemsize))
        if len(self.strides) != len(self.shape):
            raise ValueError(f"DeviceArray: {len(self.strides)} strides {self.strides} for the {len(self.shape)} "
                             f"dimensions of shape {self.shape}")
        if 0 not in self.shape:  # the last byte any element may touch must be an address too
            hi = self.ptr + sum((n - 1) * st for n, st in zip(self.shape, self.strides) if st > 0) \
                + self.dtype.itemsize
            lo = self.ptr + sum((n - 1) * st for n, st in zip(self.shape, self.strides) if st < 0)
            if lo < 0 or hi > 1 << 64:
                raise ValueError(f"DeviceArray: shape {self.shape} and strides {self.strides} from ptr 0x{self.ptr:x} "
                                 f"reach past the 64-bit address space")
        self.readonly = bool_arg("DeviceArray: readonly", readonly)  # (before the device: no driver needed)
        self.device = _device_arg(device)
        self.owner = owner
        self._contig = None  # (shape, strides, dtype, is_c_contiguous), computed at the first ask

    def __reduce__(self):
        # Without this, pickle saved the bare address of an imported array (meaningless in another
        # process) and failed on a carved one with "cannot pickle '_thread.lock' object".
        raise TypeError("a DeviceArray is a view of this process's device memory and cannot be pickled or "
                        "copied; copy its contents to the host with to_numpy()")

    # -- geometry -------------------------------------------------------------
    @property
    def ndim(self) -> int:
        """Number of dimensions (``len(shape)``)."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """Number of elements (the product of ``shape``; 1 for a 0-d array)."""
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        """Bytes of the elements (``size * itemsize``; the extent of a strided view may be larger)."""
        return self.size * self.itemsize

    @property
    def is_c_contiguous(self) -> bool:
        """Whether the strides are C order's (extents of 1 may have any stride)."""
        c = self._contig  # (every plan call asks for each array: answered once per shape, strides and dtype)
        shape, strides, dtype = self.shape, self.strides, self.dtype
        if c is not None and c[0] is shape and c[1] is strides and c[2] is dtype:
            return c[3]
        if math.prod(shape) <= 1:
            yes = True
        else:
            want = _c_strides(shape, dtype.itemsize)
            yes = all(n == 1 or s == w for n, s, w in zip(shape, strides, want))
        self._contig = (shape, strides, dtype, yes)
        return yes

    def reshape(self, *shape) -> "DeviceArray":
        """A C-contiguous view with a new shape (same number of elements).

        Raises
        ------
        TypeError
            An extent is not an integer (a float or a bool is refused, not truncated).
        ValueError
            This array is not C-contiguous, or the new shape has another number of elements
            (counted with Python ints: numpy extents whose product wraps are not taken for a
            match), or a negative extent (``-1`` too: every extent is given, none is inferred).
        """
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        shape = int_tuple("reshape: shape", shape)
        if any(n < 0 for n in shape):
            raise ValueError(f"reshape: shape {shape} has a negative extent (DeviceArray.reshape infers none, "
                             f"-1 included: give every extent, e.g. reshape({self.size}) for a flat view)")
        if not self.is_c_contiguous:
            raise ValueError("reshape needs a C-contiguous array")
        if math.prod(shape) != self.size:
            raise ValueError(f"cannot reshape {self.shape} into {shape}")
        return DeviceArray(self.ptr, shape, self.dtype, self.device, owner=self, readonly=self.readonly)

    def view(self, dtype) -> "DeviceArray":
        """Reinterpret a C-contiguous array as another dtype of the same item size (a view, no copy).

        Raises
        ------
        TypeError
            ``dtype`` is not supported (what :class:`DeviceArray` refuses).
        ValueError
            This array is not C-contiguous, or ``dtype`` has another item size.
        """
        dt = as_dtype(dtype)
        if dt.itemsize != self.itemsize or not self.is_c_contiguous:
            raise ValueError(f"view({dt}) needs a C-contiguous array of item size {dt.itemsize}")
        return DeviceArray(self.ptr, self.shape, dt, self.device, owner=self, readonly=self.readonly)

    def __getitem__(self, idx) -> "DeviceArray":
        """Basic indexing on the first axis only (an int or a step-1 slice); ``IndexError`` on a 0-d array."""
        if not self.shape:
            raise IndexError("a 0-d DeviceArray cannot be indexed (it has no axis)")
        n = self.shape[0]
        if isinstance(idx, (int, np.integer)) and not isinstance(idx, bool):
            i = int(idx) + (n if idx < 0 else 0)
            if not 0 <= i < n:
                raise IndexError(f"index {idx} out of range for axis 0 of size {n}")
            return DeviceArray(self.ptr + i * self.strides[0], self.shape[1:], self.dtype, self.device,
                               self.strides[1:], owner=self, readonly=self.readonly)
        if isinstance(idx, slice):
            start, stop, step = idx.indices(n)
            if step != 1:
                raise IndexError("only step-1 slices are supported")
            stop = max(stop, start)
            return DeviceArray(self.ptr + start * self.strides[0], (stop - start,) + self.shape[1:], self.dtype,
                               self.device, self.strides, owner=self, readonly=self.readonly)
        raise IndexError("DeviceArray supports only an int or a slice on the first axis")

    def __len__(self) -> int:
        """The first extent; a ``TypeError`` for a 0-d array, as numpy's ``len()`` of a 0-d array."""
        if not self.shape:
            raise TypeError("len() of unsized object (a 0-d DeviceArray)")
        return self.shape[0]

    def __int__(self) -> int:
        return self.ptr

    def __array__(self, dtype=None, copy=None):
        """Refused: numpy cannot read device memory. Without this, ``np.asarray(a)`` would walk
        :meth:`__getitem__` and build an object array of 0-d views, and ``np.asarray(a,
        dtype=np.uint64)`` the elements' device addresses (``int()`` of a view is its pointer)."""
        raise TypeError(f"a DeviceArray {self.shape} {self.dtype.name} is device memory, which numpy cannot "
                        f"read implicitly: copy it to the host with to_numpy(stream) (or from another "
                        f"DeviceArray with copy_from(src, stream))")

    def __repr__(self) -> str:
        return f"DeviceArray(ptr=0x{self.ptr:x}, shape={self.shape}, dtype={self.dtype.name}, device={self.device.ordinal})"

    # -- host transfers (not capture-safe) and device-side fills (capture-safe) ----------
    def _require_contiguous(self, what):
        if not self.is_c_contiguous:
            raise ValueError(f"{what} needs a C-contiguous DeviceArray, got strides {self.strides} for shape {self.shape}")

    def _stream(self, what, stream):
        """``stream`` checked to be a driverlevel Stream of this array's device (before anything is queued)."""
        return stream_arg(f"{what}: stream", stream, self.device, "the array")

    def _freed_owner(self):
        """The driverlevel allocation this array views (a :class:`~driverlevel.DeviceBuffer`,
        :class:`~driverlevel.PinnedHostBuffer` or :class:`~driverlevel.WorkspacePool`, through any chain
        of views) if it was closed, else None (also for foreign memory, which driverlevel cannot see)."""
        o = self.owner
        for _ in range(100_000):  # (views of views; bounded: an owner cycle made by hand must not hang)
            if not isinstance(o, DeviceArray):
                break
            o = o.owner
        return o if o is not None and not (_MEMORY or _memory())._is_live(o) else None

    def _require_live(self, what):
        o = self._freed_owner()
        if o is not None:
            raise ValueError(f"{what}: the memory of this array was freed ({o!r} was closed); nothing was queued")

    def _require_writable(self, what):
        if self.readonly:
            raise ValueError(f"{what}: this DeviceArray is read-only (readonly=True, e.g. imported from a read-only "
                             f"array), so it may not be written")

    def copy_from_host(self, src, stream=None) -> "DeviceArray":
        """Copy a host array into this device array; complete when it returns.

        Parameters
        ----------
        src : numpy.ndarray
            This array's shape and matching dtype (for bfloat16, uint16 bit
            patterns or an ``ml_dtypes.bfloat16`` array); any host memory (pageable or pinned).
        stream : Stream, optional
            Without one, the copy runs on a private non-blocking stream of the
            device and that stream is synchronized: the bytes are in device memory
            when the call returns, so work queued afterwards on *any* stream
            (including non-blocking ones) sees them. It does not wait for work
            already queued on other streams that may still read or write this array:
            pass that stream to order the copy after it. With ``stream``, the copy is
            queued on it (after the work already there) and the stream is synchronized
            before return (the pageable source may be freed right after).

        Not capture-safe: raises :class:`CaptureError` while a capture is active,
        because a copy from pageable host memory cannot be recorded into a graph.

        Raises
        ------
        ValueError, TypeError
            On a shape or dtype mismatch, or (``ValueError``) when this array is read-only or
            its memory was freed (a closed DeviceBuffer, PinnedHostBuffer or WorkspacePool), before anything is copied.
        TypeError
            ``stream`` is neither None nor a driverlevel :class:`~driverlevel.Stream` (a raw
            handle, another library's stream: borrow it with ``Stream.from_handle``).
        ValueError
            ``stream`` belongs to another device than this array or was closed.
        CaptureError
            While a driverlevel capture is active in this thread (or in global mode).
        """
        self._require_live("copy_from_host")
        self._require_writable("copy_from_host")
        self._require_contiguous("copy_from_host")
        a = np.require(src, requirements="C")  # keeps a 0-d source 0-d (ascontiguousarray makes it (1,))
        want = storage_dtype(self.dtype)
        if self.dtype is bfloat16 and is_ml_bfloat16(a.dtype):
            a = a.view(want)  # the same bytes: ml_dtypes' bfloat16 is bf16
        if a.dtype != want:
            also = " (its bit patterns; an ml_dtypes.bfloat16 array is taken too)" if self.dtype is bfloat16 else ""
            raise TypeError(f"copy_from_host: expected host dtype {want} for a {self.dtype.name} array{also}, "
                            f"got {a.dtype}")
        if a.shape != self.shape:
            raise ValueError(f"copy_from_host: expected shape {self.shape}, got {a.shape}")
        if stream is not None:
            self._stream("copy_from_host", stream)
        ensure_not_capturing("DeviceArray.copy_from_host()", stream)
        if a.nbytes == 0:
            return self
        with self.device.activated():
            h = self.device._copy_stream() if stream is None else stream.handle
            check("cuMemcpyHtoDAsync", driver.cuMemcpyHtoDAsync(self.ptr, a.ctypes.data, a.nbytes, h))
            check("cuStreamSynchronize", driver.cuStreamSynchronize(h))
        return self

    def to_numpy(self, stream=None) -> np.ndarray:
        """Copy to a new host array (bfloat16 comes back as uint16 bit patterns).

        With ``stream``, the copy is queued on it (after the work already there) and the stream
        is synchronized before return; the legacy default stream is not touched. Without one,
        the copy (``cuMemcpyDtoH``) is ordered only against the legacy default stream: it does
        not wait for kernels still queued on driverlevel's non-blocking streams, so pass the
        stream that wrote the array (or synchronize it first). Not capture-safe.

        Returns
        -------
        numpy.ndarray
            This array's shape, C-contiguous, in the storage dtype.

        Raises
        ------
        ValueError
            If this array is not C-contiguous or its memory was freed (a closed DeviceBuffer,
            PinnedHostBuffer or WorkspacePool), or ``stream`` belongs to another device or was
            closed.
        TypeError
            ``stream`` is neither None nor a driverlevel :class:`~driverlevel.Stream`.
        CaptureError
            While a driverlevel capture is active in this thread (or in global mode).
        """
        self._require_live("to_numpy")
        self._require_contiguous("to_numpy")
        if stream is not None:
            self._stream("to_numpy", stream)
        ensure_not_capturing("DeviceArray.to_numpy() (a device-to-host copy)", stream)
        out = np.empty(self.shape, dtype=storage_dtype(self.dtype))
        if out.nbytes == 0:
            return out
        with self.device.activated():
            if stream is None:
                check("cuMemcpyDtoH", driver.cuMemcpyDtoH(out.ctypes.data, self.ptr, out.nbytes))
            else:  # on the caller's stream: nothing touches the legacy stream, which would break
                # another thread's capture of a blocking stream
                check("cuMemcpyDtoHAsync",
                      driver.cuMemcpyDtoHAsync(out.ctypes.data, self.ptr, out.nbytes, stream.handle))
                check("cuStreamSynchronize", driver.cuStreamSynchronize(stream.handle))
        return out

    def copy_from(self, src: "DeviceArray", stream) -> "DeviceArray":
        """Device-to-device copy from ``src`` (same nbytes), queued on ``stream``. Capture-safe.

        Inside a driverlevel capture both arrays (and their owners) are tied to the graph.
        Both arrays must be on the same device: a copy between two devices (a peer copy) is
        not supported. A foreign ``src`` is imported for this array's device (managed memory
        allocated on another device is taken, as :func:`as_device_array` takes it).

        Raises
        ------
        ValueError
            If this array is read-only, either array's memory was freed (a closed buffer or
            pool), or ``src`` is on another device than this array
            (``"copy_from: the source is on device 1, this array on device 0 ..."``), is not
            C-contiguous or has another byte size, or ``stream`` belongs to another device than
            this array or was closed; all before anything is queued.
        TypeError
            ``src`` exports no device array protocol, or ``stream`` is not a driverlevel
            :class:`~driverlevel.Stream`.
        """
        self._require_live("copy_from")
        self._require_writable("copy_from")
        self._require_contiguous("copy_from")
        try:
            src = as_device_array(src, self.device)  # a foreign src: checked where it is imported
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"copy_from: src: {exc}") from None
        if src.device.ordinal != self.device.ordinal:  # a DeviceArray passes through as it is
            raise ValueError(f"copy_from: the source is on device {src.device.ordinal}, this array on device "
                             f"{self.device.ordinal}: copies between devices (peer copies) are not supported")
        if src.nbytes != self.nbytes or not src.is_c_contiguous:
            raise ValueError(f"copy_from: need a C-contiguous source of {self.nbytes} bytes, got {src!r}")
        src._require_live("copy_from: src")
        self._stream("copy_from", stream)
        if self.nbytes:
            with self.device.activated():
                check("cuMemcpyDtoDAsync", driver.cuMemcpyDtoDAsync(self.ptr, src.ptr, self.nbytes, stream.handle))
            _capture_guard.note_use(stream, self, src)
        return self

    def fill_bytes(self, value: int, stream) -> "DeviceArray":
        """Set every byte to ``value`` (0..255) on ``stream``. Capture-safe (a memset node).

        Raises
        ------
        TypeError
            ``value`` is not an integer (a bool or a float is refused, never truncated), or
            ``stream`` is not a driverlevel :class:`~driverlevel.Stream`.
        ValueError
            ``value`` is outside 0 .. 255 (it was wrapped: 256 filled zeros), this array is
            read-only, freed (a closed DeviceBuffer, PinnedHostBuffer or WorkspacePool) or not
            C-contiguous, or ``stream`` belongs to another device or was closed; all before
            anything is queued.
        """
        value = int_in_range("fill_bytes: value", value, 0, 0xFF)
        self._require_live("fill_bytes")
        self._require_writable("fill_bytes")
        self._require_contiguous("fill_bytes")
        self._stream("fill_bytes", stream)
        if self.nbytes:
            with self.device.activated():
                check("cuMemsetD8Async", driver.cuMemsetD8Async(self.ptr, value, self.nbytes, stream.handle))
            _capture_guard.note_use(stream, self)
        return self

    def fill_u32(self, word: int, stream) -> "DeviceArray":
        """Set every 32-bit word to ``word`` (e.g. ``0x7FC00000`` poisons fp32 with NaN). Capture-safe.

        Raises
        ------
        TypeError
            ``word`` is not an integer (a bool or a float is refused, never truncated), or
            ``stream`` is not a driverlevel :class:`~driverlevel.Stream`.
        ValueError
            ``word`` is outside 0 .. 2**32 - 1 (a negative word, e.g. -1 for 0xFFFFFFFF, is
            refused: write the unsigned word), this array is read-only, freed (a closed buffer or
            pool), not C-contiguous or its byte size is not a multiple of 4, or ``stream``
            belongs to another device or was closed; all before anything is queued.
        """
        word = int_in_range("fill_u32: word", word, 0, 0xFFFFFFFF)
        self._require_live("fill_u32")
        self._require_writable("fill_u32")
        self._require_contiguous("fill_u32")
        if self.nbytes % 4:
            raise ValueError(f"fill_u32 needs a multiple of 4 bytes, got {self.nbytes}")
        self._stream("fill_u32", stream)
        if self.nbytes:
            with self.device.activated():
                check("cuMemsetD32Async", driver.cuMemsetD32Async(self.ptr, word, self.nbytes // 4, stream.handle))
            _capture_guard.note_use(stream, self)
        return self

    # -- __cuda_array_interface__ ---------------------------------------------------------
    @property
    def __cuda_array_interface__(self) -> dict:
        if self.dtype is bfloat16:
            raise TypeError("bfloat16 has no __cuda_array_interface__ typestr; use DLPack or view('uint16')")
        strides = None if self.is_c_contiguous else self.strides
        return {
            "shape": self.shape,
            "typestr": self.dtype.str,
            "data": (self.ptr, self.readonly),
            "version": 3,
            "strides": strides,
        }

    # -- DLPack ----------------------------------------------------------------------------
    def __dlpack_device__(self):
        return (_kDLCUDA, self.device.ordinal)

    def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
        """Export as a DLPack capsule. No copy, no synchronization.

        ``max_version``, the highest DLPack version the consumer reads (``(major, minor)``),
        selects the capsule: with a major version of 1 or more, a ``"dltensor_versioned"``
        capsule holding a ``DLManagedTensorVersioned`` of version (1, 0) whose flags are
        ``DLPACK_FLAG_BITMASK_READ_ONLY`` for a :attr:`readonly` array and 0 otherwise; with
        None (a consumer older than DLPack 1.0) or a major version of 0, the legacy
        ``"dltensor"`` capsule (``DLManagedTensor``), which cannot mark the array read-only.

        driverlevel queues work on explicit streams, so the consumer is responsible for
        ordering; ``stream`` is accepted for protocol compatibility.

        A consumer that takes the capsule and then refuses it (numpy's ``from_dlpack``: device
        memory) frees the export all the same, but its own error cannot reach its caller: Python
        prints it as an ignored exception of the capsule's destructor, and the consumer's call
        raises ``SystemError`` (returned NULL without setting an exception).

        Raises
        ------
        TypeError
            ``max_version`` is neither None nor a tuple of two ints.
        BufferError
            ``max_version`` holds a negative number, ``copy`` is true, ``dl_device`` is not
            this array's device, or the strides are not whole items.
        """
        versioned = _wants_versioned(max_version)
        if copy:
            raise BufferError("DeviceArray.__dlpack__ does not copy")
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(f"cannot export to DLPack device {dl_device}")
        return _export_dlpack(self, versioned)


# ------------------------------------------------------------------------------------------
# DLPack structures (dlpack.h: the legacy ABI of v0.8 and the versioned one of v1.0)
_kDLCUDA = 2
_kDLCUDAHost = 3
_kDLCUDAManaged = 13
_kDLInt, _kDLUInt, _kDLFloat, _kDLBfloat, _kDLBool = 0, 1, 2, 4, 6
_DLPACK_VERSION = (1, 0)  # the DLManagedTensorVersioned layout driverlevel reads and writes
_FLAG_READ_ONLY = 1 << 0  # DLPACK_FLAG_BITMASK_READ_ONLY


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _DLManagedTensor(ctypes.Structure):
    pass


class _DLManagedTensorVersioned(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]
_DELETER_VERSIONED = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensorVersioned))
_DLManagedTensorVersioned._fields_ = [
    ("version", _DLPackVersion),  # first, where every major version keeps it
    ("manager_ctx", ctypes.c_void_p),
    ("deleter", _DELETER_VERSIONED),
    ("flags", ctypes.c_uint64),
    ("dl_tensor", _DLTensor),
]

# Private prototypes of the capsule API (ctypes.pythonapi's shared function objects are
# left alone: other libraries set their own argtypes on them).
_DLTENSOR = b"dltensor"
_USED_DLTENSOR = b"used_dltensor"
_DLTENSOR_VERSIONED = b"dltensor_versioned"
_USED_DLTENSOR_VERSIONED = b"used_dltensor_versioned"
_PyCapsule_New = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)(
    ("PyCapsule_New", ctypes.pythonapi))
_PyCapsule_GetPointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))
_PyCapsule_IsValid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_IsValid", ctypes.pythonapi))
_PyCapsule_SetName = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_SetName", ctypes.pythonapi))
# The same two calls on a raw PyObject* address: the capsule destructor runs while the
# capsule's reference count is already 0, so it must never make a Python reference to it.
_PyCapsule_IsValid_raw = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_IsValid", ctypes.pythonapi))
_PyCapsule_GetPointer_raw = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))

# Exported tensors alive in some consumer: address of the DLManagedTensor(Versioned) -> keep-alive tuple.
_exported: dict[int, tuple] = {}


def _forget_export(mt_ptr):
    """The deleter of an exported tensor (either kind): drops what kept it and its array alive."""
    _exported.pop(ctypes.cast(mt_ptr, ctypes.c_void_p).value, None)


_dl_deleter = _DELETER(_forget_export)
_dl_deleter_versioned = _DELETER_VERSIONED(_forget_export)

_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)

# The consumer's pending exception, moved out of the way in the capsule destructor: a consumer that
# refuses the tensor (numpy: "Unsupported device in DLTensor") drops the capsule with its error set,
# and Python code run under a set error fails at its first call (the destructor then never freed the
# export, and the consumer's error was lost). PyErr_Fetch and PyErr_NormalizeException through
# private function objects without argtypes: byref arguments convert without a Python-level call,
# which the pending error would fail. Raw pointers, each reference released with Py_DecRef.
_api = ctypes.PyDLL(ctypes.pythonapi._name, handle=ctypes.pythonapi._handle)
_PyErr_Fetch = _api.PyErr_Fetch
_PyErr_Fetch.restype = None
_PyErr_NormalizeException = _api.PyErr_NormalizeException
_PyErr_NormalizeException.restype = None
_Py_DecRef = ctypes.PYFUNCTYPE(None, ctypes.c_void_p)(("Py_DecRef", ctypes.pythonapi))
_err_cells = (ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p())
_err_refs = tuple(ctypes.byref(c) for c in _err_cells)


@_CAPSULE_DESTRUCTOR
def _capsule_destructor(capsule_ptr):
    # Called when the capsule dies. If no consumer renamed it to "used_dltensor" or
    # "used_dltensor_versioned", the tensor was never taken and we delete it ourselves.
    _PyErr_Fetch(*_err_refs)  # (first: see _api above)
    pending = None
    if _err_cells[0].value:
        _PyErr_NormalizeException(*_err_refs)
        pending = ctypes.cast(_err_cells[1].value, ctypes.py_object).value if _err_cells[1].value else None
    for cell in _err_cells:
        if cell.value:
            _Py_DecRef(cell.value)
        cell.value = None
    for name in (_DLTENSOR, _DLTENSOR_VERSIONED):
        if _PyCapsule_IsValid_raw(capsule_ptr, name):
            _exported.pop(_PyCapsule_GetPointer_raw(capsule_ptr, name), None)
    if pending is not None:
        # The consumer's error cannot be set again from here (a ctypes callback that returns with
        # an error set is reported as failed): raised, Python prints it as this callback's, and the
        # consumer's call then ends in a SystemError (returned NULL without setting an exception).
        raise pending


_CAPSULE_DESTRUCTOR_ADDR = ctypes.cast(_capsule_destructor, ctypes.c_void_p).value


def _wants_versioned(max_version) -> bool:
    """Whether a consumer's ``max_version`` asks for DLPack 1.0's versioned capsule (a major version >= 1)."""
    if max_version is None:
        return False
    if (not isinstance(max_version, tuple) or len(max_version) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in max_version)):
        raise TypeError(f"DeviceArray.__dlpack__: max_version must be None or a (major, minor) tuple of two ints, "
                        f"got {type(max_version).__name__} {max_version!r}")
    if min(max_version) < 0:
        raise BufferError(f"DeviceArray.__dlpack__: max_version {max_version} names no DLPack version "
                          f"(a negative number)")
    return max_version[0] >= 1


def _dl_dtype(dt) -> _DLDataType:
    if dt is bfloat16:
        return _DLDataType(_kDLBfloat, 16, 1)
    code = {"i": _kDLInt, "u": _kDLUInt, "f": _kDLFloat, "b": _kDLBool}.get(dt.kind)
    if code is None:
        raise BufferError(f"dtype {dt} has no DLPack equivalent")
    return _DLDataType(code, dt.itemsize * 8, 1)


def _fill_dl_tensor(t: _DLTensor, arr: DeviceArray) -> tuple:
    """Describe ``arr`` in the DLTensor ``t``; returns the shape and strides arrays ``t`` points to
    (to be kept alive as long as ``t``)."""
    nd = arr.ndim
    shape = (ctypes.c_int64 * max(nd, 1))(*arr.shape)
    strides = (ctypes.c_int64 * max(nd, 1))(*[s // arr.itemsize for s in arr.strides])
    t.data = arr.ptr
    t.device = _DLDevice(_kDLCUDA, arr.device.ordinal)
    t.ndim = nd
    t.dtype = _dl_dtype(arr.dtype)
    t.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
    t.strides = ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64))
    t.byte_offset = 0
    return shape, strides


def _export_dlpack(arr: DeviceArray, versioned: bool):
    """A new capsule of ``arr``: ``"dltensor_versioned"`` (DLPack 1.0, with the read-only flag) or
    the legacy ``"dltensor"``."""
    if any(s % arr.itemsize for s in arr.strides):
        raise BufferError("DLPack needs strides that are a multiple of the item size")
    if versioned:
        mt = _DLManagedTensorVersioned(version=_DLPackVersion(*_DLPACK_VERSION), deleter=_dl_deleter_versioned,
                                       flags=_FLAG_READ_ONLY if arr.readonly else 0)
        name = _DLTENSOR_VERSIONED
    else:
        mt = _DLManagedTensor(deleter=_dl_deleter)
        name = _DLTENSOR
    keep = _fill_dl_tensor(mt.dl_tensor, arr)
    addr = ctypes.addressof(mt)
    _exported[addr] = (mt, keep, arr)
    return _PyCapsule_New(addr, name, _CAPSULE_DESTRUCTOR_ADDR)


class _ImportedDLPack:
    """Owns a consumed DLPack tensor and calls its deleter when dropped.

    ``mt`` is a pointer typed as its capsule's kind (``_DLManagedTensor`` or
    ``_DLManagedTensorVersioned``): the deleter read through it takes that pointer type."""

    def __init__(self, capsule, mt):
        self._capsule = capsule
        self._mt = mt

    def __del__(self):
        try:
            deleter = self._mt.contents.deleter
            if deleter:
                deleter(self._mt)
        except Exception:
            pass


def _other_device(obj, where: str, ordinal: int, device) -> ValueError:
    """The error of a foreign array ``obj`` on device ``ordinal`` (as ``where`` says) imported for ``device``."""
    return ValueError(f"{type(obj).__name__} is on device {ordinal} ({where}), not on device {device.ordinal}")


def _ask_capsule(obj):
    """``obj``'s DLPack capsule, asked for without synchronization and in the versioned kind.

    stream=-1: "no synchronization" (DLPack protocol). stream=None would ask a CUDA producer to
    order its current stream before the legacy default stream (torch records and waits on an
    event), which invalidates a capture in progress on that stream. A producer older than
    DLPack 1.0 refuses the max_version keyword (and an older one the stream keyword too) with
    a TypeError: it is asked again without them.
    """
    try:
        return obj.__dlpack__(stream=-1, max_version=_DLPACK_VERSION)
    except TypeError:
        pass
    try:
        return obj.__dlpack__(stream=-1)
    except TypeError:
        return obj.__dlpack__()


def _take_capsule(capsule, producer: str):
    """Consume a DLPack capsule of either kind: its owner (which calls the tensor's deleter when
    dropped) and whether the tensor is read-only (never, for a legacy capsule).

    A versioned tensor of another major version than 1 is refused before the capsule is renamed,
    so that its producer's capsule destructor deletes it (its other fields may be laid out
    otherwise: only the version is read)."""
    if _PyCapsule_IsValid(capsule, _DLTENSOR_VERSIONED):
        mt = ctypes.cast(_PyCapsule_GetPointer(capsule, _DLTENSOR_VERSIONED),
                         ctypes.POINTER(_DLManagedTensorVersioned))
        version = mt.contents.version
        if version.major != _DLPACK_VERSION[0]:
            raise TypeError(f"{producer} exported a DLPack tensor of version {version.major}.{version.minor}: "
                            f"driverlevel reads DLPack {_DLPACK_VERSION[0]}.x (and legacy capsules)")
        _PyCapsule_SetName(capsule, _USED_DLTENSOR_VERSIONED)
        return _ImportedDLPack(capsule, mt), bool(mt.contents.flags & _FLAG_READ_ONLY)
    if _PyCapsule_IsValid(capsule, _DLTENSOR):
        mt = ctypes.cast(_PyCapsule_GetPointer(capsule, _DLTENSOR), ctypes.POINTER(_DLManagedTensor))
        _PyCapsule_SetName(capsule, _USED_DLTENSOR)
        return _ImportedDLPack(capsule, mt), False
    raise TypeError(f"{producer}.__dlpack__() returned {capsule!r}, not an unconsumed DLPack capsule "
                    f"('dltensor_versioned' or 'dltensor')")


def _np_dtype(dtype: _DLDataType):
    """The dtype of a DLPack data type (bfloat16 included); a ``TypeError`` for what DeviceArray cannot hold."""
    code, bits, lanes = dtype.code, dtype.bits, dtype.lanes
    if lanes != 1:
        raise TypeError("vector DLPack dtypes are not supported")
    if code == _kDLBfloat and bits == 16:
        return bfloat16
    kind = {_kDLInt: "i", _kDLUInt: "u", _kDLFloat: "f", _kDLBool: "b"}.get(code)
    if kind is None:
        raise TypeError(f"unsupported DLPack dtype code {code}")
    return np.dtype("?") if kind == "b" else np.dtype(f"{kind}{bits // 8}")


def _from_dlpack(obj, device):
    from ._device import Device

    got = obj.__dlpack_device__()
    if (not isinstance(got, (tuple, list)) or len(got) != 2
            or not all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) for v in got)):
        raise TypeError(f"{type(obj).__name__}.__dlpack_device__() must return a (device_type, device_id) pair of "
                        f"ints (DLPack), got {got!r}")
    dev_type, dev_id = got
    if int(dev_type) not in (_kDLCUDA, _kDLCUDAManaged, _kDLCUDAHost):
        raise TypeError(f"{type(obj).__name__} lives on DLPack device type {dev_type}, not CUDA")
    # Device memory is checked before the capsule is taken (managed and pinned host memory are
    # reachable from every device: their device id does not bind them).
    if int(dev_type) == _kDLCUDA and device is not None and int(dev_id) != device.ordinal:
        raise _other_device(obj, "its __dlpack_device__()", int(dev_id), device)
    owner, readonly = _take_capsule(_ask_capsule(obj), type(obj).__name__)
    t = owner._mt.contents.dl_tensor
    dt = _np_dtype(t.dtype)
    shape = tuple(t.shape[i] for i in range(t.ndim))
    strides = tuple(t.strides[i] * dt.itemsize for i in range(t.ndim)) if t.strides else None
    dev = device if device is not None else Device(int(dev_id))
    return DeviceArray(int(t.data or 0) + int(t.byte_offset), shape, dt, dev, strides, owner=owner,
                       readonly=readonly)


def _opaque_cai(cai) -> bool:
    """True if a ``__cuda_array_interface__`` names an opaque type (``'<V2'``); a malformed one is
    not opaque here (``_from_cai`` says what is wrong with it)."""
    try:
        return np.dtype(cai["typestr"]).kind == "V"
    except (KeyError, TypeError, ValueError):
        return False


def _from_cai(obj, device):
    from ._device import Device

    cai = obj.__cuda_array_interface__
    what = f"{type(obj).__name__}.__cuda_array_interface__"
    if not isinstance(cai, collections.abc.Mapping):
        raise TypeError(f"{what} must be a dict (CUDA Array Interface v3), got {type(cai).__name__}")
    missing = [k for k in ("data", "typestr", "shape") if k not in cai]
    if missing:
        raise TypeError(f"{what} lacks {', '.join(repr(k) for k in missing)} (CUDA Array Interface v3: "
                        f"'shape', 'typestr' and 'data' are required)")
    data = cai["data"]
    if not isinstance(data, (tuple, list)) or len(data) != 2:
        raise TypeError(f"{what}['data'] must be a (pointer, read_only) pair, got {data!r}")
    ptr, readonly = data
    if isinstance(ptr, bool) or not isinstance(ptr, (int, np.integer)):  # (a float was truncated, True read as 1)
        raise TypeError(f"{what}['data'][0] must be an integer device address, got {type(ptr).__name__} {ptr!r}")
    if cai.get("mask") is not None:  # CAI v3: a consumer that cannot honour a mask must refuse it
        raise TypeError(f"{what} has a 'mask' (a masked array): driverlevel reads every element and supports "
                        f"no masks; pass the unmasked data")
    if not isinstance(cai["typestr"], str):  # (np.dtype(None) is float64, np.dtype(int) int64)
        raise TypeError(f"{what}['typestr'] must be a str such as '<f4' (CUDA Array Interface v3), "
                        f"got {type(cai['typestr']).__name__} {cai['typestr']!r}")
    try:
        dt = np.dtype(cai["typestr"])
        shape = tuple(cai["shape"])
    except TypeError as exc:
        raise TypeError(f"{what}: 'typestr' {cai['typestr']!r} or 'shape' {cai['shape']!r} is not valid: {exc}") \
            from None
    strides = cai.get("strides")
    # What DeviceArray checks of the fields, here before the device is opened and the driver asked
    # about the pointer: without a GPU a malformed interface is still a TypeError / ValueError.
    as_dtype(dt)
    shape = int_tuple(f"{what}: 'shape'", shape)
    if any(n < 0 for n in shape):
        raise ValueError(f"{what}: 'shape' {shape} has a negative extent")
    if strides is not None and len(int_tuple(f"{what}: 'strides'", strides)) != len(shape):
        raise ValueError(f"{what}: {len(strides)} 'strides' {tuple(strides)} for the {len(shape)} dimensions of "
                         f"'shape' {shape}")
    if not 0 <= int(ptr) < 1 << 64:  # (DeviceArray says so too, but only after the driver was asked)
        raise ValueError(f"{what}['data'][0] must be a device address in 0 .. 2**64 - 1, got {int(ptr)}")
    if not isinstance(readonly, (bool, np.bool_)):  # ("no" was read as True)
        raise TypeError(f"{what}['data'][1] must be a bool (read_only), got {type(readonly).__name__} {readonly!r}")
    if not ptr and math.prod(shape) != 0:  # CAI v3: a NULL pointer only for a zero-size array
        raise ValueError(f"{what}: its data pointer is 0 (NULL) but its shape {shape} holds elements; a kernel "
                         f"would read address 0")
    if device is not None:
        device = _device_arg(device)
    # The stream in v3 is the producer's; the consumer would synchronize with it.
    # driverlevel does not synchronize implicitly; order your streams explicitly.
    if ptr:  # the interface names no device: the driver knows where the pointer is
        ordinal = _pointer_ordinal(int(ptr), device)
        if device is None:
            device = Device(ordinal)
        elif ordinal != device.ordinal and not _pointer_is_managed(int(ptr)):
            # managed memory (cuMemAllocManaged) is reachable from every device, as DLPack's
            # kDLCUDAManaged is: the device it was allocated on does not bind it
            raise _other_device(obj, f"the driver's answer for its pointer 0x{int(ptr):x}", ordinal, device)
    elif device is None:
        device = Device(0)
    return DeviceArray(int(ptr or 0), shape, dt, device, strides, owner=obj, readonly=bool(readonly))


def _pointer_ordinal(ptr: int, device=None) -> int:
    """The ordinal of the device whose memory ``ptr`` addresses, asked through its context.

    ``CU_POINTER_ATTRIBUTE_CONTEXT`` first: one driver call when it is ``device``'s primary
    context; another context's device comes from :func:`~driverlevel._device.context_ordinal` (three calls).
    ``CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`` is asked only for memory with no context (mapped
    with the virtual memory management API), because cuda.bindings from PR #1451 (January 2026)
    until the fix of NVIDIA/cuda-python#2928 reads that attribute from the wrong field and
    answers 0 for every pointer: an array on device 1 would look like device 0's.
    """
    from ._device import context_ordinal, init_driver  # at the call: the tests replace context_ordinal

    init_driver()
    what = "of 0x{:x}, a __cuda_array_interface__ pointer".format(ptr)
    ctx = check("cuPointerGetAttribute",
                driver.cuPointerGetAttribute(driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_CONTEXT, ptr),
                f"CU_POINTER_ATTRIBUTE_CONTEXT {what}")
    if int(ctx):
        if device is not None and int(ctx) == int(device.context):
            return device.ordinal
        return context_ordinal(ctx)
    attr = driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
    return int(check("cuPointerGetAttribute", driver.cuPointerGetAttribute(attr, ptr),
                     f"CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL {what}"))


def _pointer_is_managed(ptr: int) -> bool:
    """Whether ``ptr`` is managed memory (``CU_POINTER_ATTRIBUTE_IS_MANAGED``, one call).

    Asked only when :func:`_pointer_ordinal` named another device than the one wanted, so an
    import on the pointer's own device still costs one driver call. Not one
    ``cuPointerGetAttributes`` for both attributes: that call answers ``CUDA_SUCCESS`` with
    default values for a pointer the driver does not know, where ``cuPointerGetAttribute``
    fails (the :class:`CudaError` that says the pointer is not CUDA memory).
    """
    attr = driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_IS_MANAGED
    return bool(check("cuPointerGetAttribute", driver.cuPointerGetAttribute(attr, ptr),
                      f"CU_POINTER_ATTRIBUTE_IS_MANAGED of 0x{ptr:x}, a __cuda_array_interface__ pointer"))


_MEMORY = None  # driverlevel._memory, bound at the first use (it imports this module: no import at load time)


def _memory():
    global _MEMORY
    if _MEMORY is None:
        from . import _memory as m

        _MEMORY = m
    return _MEMORY


def _is_own_buffer(obj) -> bool:
    """Whether ``obj`` is one of driverlevel's buffers (a foreign class with an ``as_array`` method is not:
    its ``as_array`` may return anything, a numpy array included)."""
    m = _MEMORY or _memory()
    return isinstance(obj, (m.DeviceBuffer, m.PinnedHostBuffer))


def as_device_array(obj, device=None) -> DeviceArray:
    """View ``obj`` as a :class:`DeviceArray` without copying.

    A foreign array's device is checked against ``device`` where it is imported (once per
    call, never per graph replay): a DLPack array by the device id of its
    ``__dlpack_device__()`` (before its capsule is taken), a ``__cuda_array_interface__``
    array by asking the driver which device its pointer is on (``cuPointerGetAttribute``,
    which the interface, naming no device, needs). Managed memory is reachable from every
    device and is taken whatever device it was allocated on: DLPack's ``kDLCUDAManaged``
    (and pinned host memory, ``kDLCUDAHost``), and a ``__cuda_array_interface__`` pointer
    the driver says is managed (``CU_POINTER_ATTRIBUTE_IS_MANAGED``, asked only when the
    pointer's device is not ``device``). A :class:`DeviceArray` is passed through as it is
    (its device is known: compare ``a.device`` yourself, as the plans do).

    A DLPack producer is asked for DLPack 1.0's versioned capsule (``__dlpack__(stream=-1,
    max_version=(1, 0))``; a producer without the ``max_version`` keyword, older than DLPack
    1.0, is asked again without it) and either capsule is taken: a versioned tensor flagged
    read-only (``DLPACK_FLAG_BITMASK_READ_ONLY``) is imported ``readonly=True``; a legacy
    capsule cannot say so, and its array is writable. The ``readonly`` of a
    ``__cuda_array_interface__`` array is its ``data`` flag.

    Parameters
    ----------
    obj : DeviceArray, or any object with ``__cuda_array_interface__`` or ``__dlpack__``
        CuPy, PyTorch, JAX, Numba arrays, our buffers.
    device : Device or int, optional
        The device the memory must be on (read from the array when omitted).

    Raises
    ------
    (A ``__cuda_array_interface__``'s fields, and a numpy array, are checked before ``device`` is
    opened: these ``TypeError`` / ``ValueError`` need no GPU.)
    TypeError
        If ``obj`` exports neither protocol or lives in host memory, ``device`` is neither
        a Device nor an int ordinal, a ``__cuda_array_interface__`` is malformed (its data
        pointer not an integer, its read-only flag not a bool or its ``typestr`` not a str
        included), ``__dlpack_device__()`` is no pair of ints, or a DLPack producer gives no
        unconsumed DLPack capsule or a versioned tensor of another major version than 1 (left
        unconsumed, for its producer to delete).
    ValueError
        If a foreign ``obj`` is on another device than ``device`` (the message names both) and
        is not managed memory; a ``__cuda_array_interface__`` pointer is NULL for a non-empty
        array or outside 0 .. 2**64 - 1; or ``obj`` is one of driverlevel's buffers that was
        closed (or a PinnedHostBuffer that is not mapped).
    CudaError
        If the driver cannot say where a ``__cuda_array_interface__`` pointer is (not CUDA
        memory).
    """
    if isinstance(obj, DeviceArray):
        return obj
    if isinstance(obj, np.ndarray):
        raise TypeError("a numpy array lives in host memory; copy it with DeviceArray.copy_from_host() first")
    if _is_own_buffer(obj):  # a DeviceBuffer or a (mapped) PinnedHostBuffer: its whole bytes
        if device is not None:
            _device_arg(device)  # (its type checked, as for a foreign array)
        return obj.as_array()
    try:
        obj.__cuda_array_interface__
        has_cai = True
    except (AttributeError, TypeError, RuntimeError):  # e.g. torch bfloat16 refuses CAI
        has_cai = False
    if has_cai and hasattr(obj, "__dlpack__") and _opaque_cai(obj.__cuda_array_interface__):
        has_cai = False  # e.g. torch exports bfloat16 as an opaque '<V2': DLPack names the type
    if has_cai:  # (the interface's fields are checked before the device is opened)
        return _from_cai(obj, device)
    if hasattr(obj, "__dlpack__"):
        return _from_dlpack(obj, None if device is None else _device_arg(device))
    raise TypeError(f"{type(obj).__name__} exports neither __cuda_array_interface__ nor __dlpack__")
