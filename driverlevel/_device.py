"""CUDA devices and their primary contexts, through the driver API.

A :class:`Device` is a process-wide singleton per ordinal (``Device(0) is
Device(0)``). It retains the device's primary context once, so objects may be used
from any thread and no code assumes device 0.

The current context
-------------------
driverlevel always works in the device's **primary** context, whatever the
calling thread has current: nothing (another library popped it), a foreign
context (one made with ``cuCtxCreate``), or the primary context of another
device. No thread-local record of "current" is trusted: every entry point asks
the driver (``cuCtxGetCurrent``, one cheap call) and, when the primary context is
not current, pushes it for the duration of the call and pops it afterwards
(:meth:`Device.activated`), so the caller finds its own context current again on
return. Allocations, streams, events, module loads, launches, captures and
graphs therefore always belong to the primary context, and the module cache
(keyed by device ordinal) never hands out a module of a foreign context.
:meth:`Device.set_current` is the explicit "make primary current and leave it"
for code that wants that.
"""

from __future__ import annotations

import operator
import sys
import threading
import weakref
from dataclasses import dataclass

from cuda.bindings import driver

from ._checks import is_bool
from ._errors import CudaError, DriverUnavailableError, check

__all__ = ["Device", "DeviceProperties", "device_count", "driver_version", "init_driver", "NO_GPU_MESSAGE",
           "NO_GPU_EXIT_STATUS", "gpu_usable", "require_gpu"]

#: The message of the :class:`DriverUnavailableError` raised when the driver library itself is missing.
NO_DRIVER_LIBRARY_MESSAGE = ("the NVIDIA driver library (libcuda) could not be loaded: no NVIDIA driver is installed, "
                             "or it is not on the library search path")

_init_lock = threading.Lock()
_initialized = False
_SUCCESS = driver.CUresult.CUDA_SUCCESS


def init_driver() -> None:
    """Load the CUDA driver library and call ``cuInit`` once per process.

    Raises
    ------
    DriverUnavailableError
        If the driver library is missing or reports no device.
    """
    global _initialized
    if _initialized:
        return
    with _init_lock:
        if _initialized:
            return
        try:
            (err,) = driver.cuInit(0)
        except Exception as exc:  # the driver library (libcuda) could not be loaded: cuInit never ran
            # code and name say "no device" for callers that test them; the message does not quote them,
            # since no driver call returned them.
            what = NO_DRIVER_LIBRARY_MESSAGE
            raise DriverUnavailableError("cuInit", int(driver.CUresult.CUDA_ERROR_NO_DEVICE), "CUDA_ERROR_NO_DEVICE",
                                         what, str(exc), message=what) from exc
        check("cuInit", (err,))
        _initialized = True


def driver_version() -> tuple[int, int]:
    """The CUDA version the installed driver supports, as ``(major, minor)``."""
    init_driver()
    v = check("cuDriverGetVersion", driver.cuDriverGetVersion())
    return v // 1000, (v % 1000) // 10


def device_count() -> int:
    """Number of CUDA devices visible to this process (after ``CUDA_VISIBLE_DEVICES``).

    Returns 0 instead of raising :class:`~driverlevel.DriverUnavailableError` when there
    is no driver library or no device; the GPU tests are skipped when it is 0.

    Raises
    ------
    CudaError
        If the driver loads but ``cuDeviceGetCount`` fails.
    """
    try:
        init_driver()
    except DriverUnavailableError:
        return 0
    return int(check("cuDeviceGetCount", driver.cuDeviceGetCount()))


#: The one sentence every command, benchmark and example prints (to stderr) when it needs a
#: GPU and none is usable; it then exits with :data:`NO_GPU_EXIT_STATUS`.
NO_GPU_MESSAGE = "This needs an NVIDIA GPU with a working CUDA driver, and none is usable on this machine (`driverlevel info` says what it finds; `driverlevel compile` works without one)."
#: Exit status of a command that needs a GPU run without one (2, as click uses for usage errors).
NO_GPU_EXIT_STATUS = 2


def gpu_usable() -> bool:
    """True if at least one CUDA device is visible and the driver initialises.

    Unlike :func:`device_count`, a driver that fails to initialise (version mismatch,
    ``CUDA_VISIBLE_DEVICES=""``) counts as no GPU instead of raising.
    """
    try:
        return device_count() > 0
    except CudaError:
        return False


def require_gpu() -> None:
    """Exit the process with status 2 and :data:`NO_GPU_MESSAGE` on stderr if no GPU is usable.

    For scripts and commands that cannot do anything without a GPU; call it before
    touching a device (and before importing optional GPU-only libraries), so the user
    sees one sentence instead of a traceback.

    Raises
    ------
    SystemExit
        With code :data:`NO_GPU_EXIT_STATUS` (2) when :func:`gpu_usable` is False.

    Example
    -------
    >>> from driverlevel.runtime import require_gpu  # doctest: +SKIP
    >>> require_gpu()          # returns on a GPU machine, exits 2 elsewhere  # doctest: +SKIP
    """
    if not gpu_usable():
        print(NO_GPU_MESSAGE, file=sys.stderr, flush=True)
        raise SystemExit(NO_GPU_EXIT_STATUS)


@dataclass(frozen=True)
class DeviceProperties:
    """Static properties of a device.

    Attributes
    ----------
    name : str
    compute_capability : tuple of int
        ``(major, minor)``, e.g. ``(9, 0)`` for an H200.
    sm_count : int
        Number of multiprocessors.
    max_shared_memory_per_block_optin : int
        Bytes of shared memory a block may use after opting in (dynamic limit).
    max_shared_memory_per_block : int
        Bytes of shared memory a block may use without opting in (48 KB).
    l2_cache_bytes : int
    total_memory_bytes : int
    max_shared_memory_per_multiprocessor : int
        Bytes of shared memory of one SM, shared by its resident blocks (0 where unknown).
    """

    name: str
    compute_capability: tuple
    sm_count: int
    max_shared_memory_per_block_optin: int
    max_shared_memory_per_block: int
    l2_cache_bytes: int
    total_memory_bytes: int
    max_shared_memory_per_multiprocessor: int = 0

    @property
    def arch(self) -> str:
        """The NVRTC architecture name, e.g. ``"sm_90"``."""
        major, minor = self.compute_capability
        return f"sm_{major}{minor}"


def _attr(dev, attr) -> int:
    return int(check("cuDeviceGetAttribute", driver.cuDeviceGetAttribute(attr, dev), attr.name))


def _release_primary(dev_handle):
    try:
        driver.cuDevicePrimaryCtxRelease(dev_handle)
    except Exception:  # interpreter shutdown: the bindings may be gone already
        pass


class Device:
    """A CUDA device (by ordinal) and its retained primary context.

    ``Device(ordinal)`` returns the one object of that ordinal for the process.

    Parameters
    ----------
    ordinal : int
        Device ordinal in ``[0, device_count())``, as CUDA enumerates them
        (after ``CUDA_VISIBLE_DEVICES``); a numpy integer is accepted too.

    Raises
    ------
    TypeError
        ``ordinal`` is not an integer (a bool is not one).
    ValueError
        ``ordinal`` out of range; a negative one before the driver is touched.
    DriverUnavailableError
        No driver or no device.
    """

    _instances: dict = {}
    _lock = threading.Lock()

    def __new__(cls, ordinal: int = 0):
        if isinstance(ordinal, Device):
            return ordinal
        # Bad input is found before the driver is touched: a ValueError even on a machine without one.
        if isinstance(ordinal, bool):
            raise TypeError("Device ordinal must be an int, got bool")
        try:
            ordinal = operator.index(ordinal)  # int and numpy integers, as the plans accept
        except TypeError:
            raise TypeError(f"Device ordinal must be an int, got {type(ordinal).__name__}") from None
        if ordinal < 0:
            raise ValueError(f"device ordinal {ordinal} out of range: ordinals are 0 or more")
        with cls._lock:
            inst = cls._instances.get(ordinal)
            if inst is not None:
                return inst
            init_driver()
            n = int(check("cuDeviceGetCount", driver.cuDeviceGetCount()))
            if n == 0:
                raise DriverUnavailableError("cuDeviceGetCount", int(driver.CUresult.CUDA_ERROR_NO_DEVICE),
                                             "CUDA_ERROR_NO_DEVICE", "no CUDA device is visible")
            if not 0 <= ordinal < n:
                raise ValueError(f"device ordinal {ordinal} out of range: {n} device(s) visible")
            inst = super().__new__(cls)
            inst._init(ordinal)
            cls._instances[ordinal] = inst
            return inst

    def _init(self, ordinal: int) -> None:
        self.ordinal = ordinal
        self._dev = check("cuDeviceGet", driver.cuDeviceGet(ordinal))
        self._ctx = check("cuDevicePrimaryCtxRetain", driver.cuDevicePrimaryCtxRetain(self._dev))
        self._ctx_int = int(self._ctx)
        self._finalizer = weakref.finalize(self, _release_primary, self._dev)
        self._props = None
        self._copy_stream_handle = None
        self._copy_lock = threading.Lock()

    # -- context -----------------------------------------------------------
    def set_current(self) -> None:
        """Make this device's primary context current in the calling thread, and leave it so.

        Asks the driver which context is current (``cuCtxGetCurrent``: no cached
        thread-local record is trusted, since another library may have popped or
        replaced it) and calls ``cuCtxSetCurrent`` only when it is not the primary
        context. driverlevel's own entry points use :meth:`activated` instead, which
        restores the caller's context afterwards.

        Raises
        ------
        CudaError
            If ``cuCtxSetCurrent`` fails.
        """
        err, cur = driver.cuCtxGetCurrent()
        if err != _SUCCESS or int(cur) != self._ctx_int:
            check("cuCtxSetCurrent", driver.cuCtxSetCurrent(self._ctx))

    def _push(self) -> bool:
        """Make the primary context current; True if it was pushed (then :meth:`_pop` after)."""
        err, cur = driver.cuCtxGetCurrent()
        if err == _SUCCESS and int(cur) == self._ctx_int:
            return False
        check("cuCtxPushCurrent", driver.cuCtxPushCurrent(self._ctx))
        return True

    def _pop(self) -> None:
        check("cuCtxPopCurrent", driver.cuCtxPopCurrent())

    def activated(self) -> "_Activation":
        """Context manager: the primary context is current inside, the caller's is restored after.

        A no-op (one ``cuCtxGetCurrent``) when the primary context is already current;
        otherwise ``cuCtxPushCurrent`` on entry and ``cuCtxPopCurrent`` on exit, so a
        caller with no context, or with a foreign one, finds it current again.

        Example
        -------
        >>> with dev.activated():                                # doctest: +SKIP
        ...     driver.cuMemGetInfo()
        """
        return _Activation(self)

    def _copy_stream(self):
        """A private non-blocking stream for synchronous host copies (created once; call inside activated())."""
        if self._copy_stream_handle is None:
            with self._copy_lock:
                if self._copy_stream_handle is None:
                    self._copy_stream_handle = check("cuStreamCreate", driver.cuStreamCreate(
                        driver.CUstream_flags.CU_STREAM_NON_BLOCKING))
        return self._copy_stream_handle

    def is_current(self) -> bool:
        """True if this device's primary context is current in the calling thread (asks the driver)."""
        err, cur = driver.cuCtxGetCurrent()
        return err == _SUCCESS and int(cur) == self._ctx_int

    @property
    def context(self):
        """The retained primary ``CUcontext``."""
        return self._ctx

    def synchronize(self) -> None:
        """Wait for all work on this device (not capture-safe).

        CUDA forbids synchronizing a context while any of its streams is being
        captured, even by another thread in thread-local mode (the capture would be
        invalidated). So this waits until driverlevel captures on this device running
        in other threads have ended, and holds new ones back until the
        synchronization is done.

        Raises
        ------
        CaptureError
            Called from a thread that is capturing (or while a global-mode capture
            runs), or another thread's capture did not end within
            ``driverlevel._capture_guard.DEVICE_SYNC_WAIT_S`` seconds.
        """
        from ._capture_guard import device_sync_guard, ensure_not_capturing

        ensure_not_capturing("Device.synchronize()")
        with device_sync_guard(self.ordinal, "Device.synchronize()"), self.activated():
            check("cuCtxSynchronize", driver.cuCtxSynchronize())

    # -- properties --------------------------------------------------------
    @property
    def properties(self) -> DeviceProperties:
        """:class:`DeviceProperties` of this device (read once)."""
        if self._props is None:
            A = driver.CUdevice_attribute
            name = check("cuDeviceGetName", driver.cuDeviceGetName(256, self._dev))
            name = name.split(b"\x00", 1)[0].decode()
            total = int(check("cuDeviceTotalMem", driver.cuDeviceTotalMem(self._dev)))
            self._props = DeviceProperties(
                name=name,
                compute_capability=(
                    _attr(self._dev, A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
                    _attr(self._dev, A.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR),
                ),
                sm_count=_attr(self._dev, A.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
                max_shared_memory_per_block_optin=_attr(
                    self._dev, A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
                max_shared_memory_per_block=_attr(self._dev, A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK),
                l2_cache_bytes=_attr(self._dev, A.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE),
                total_memory_bytes=total,
                max_shared_memory_per_multiprocessor=_attr(
                    self._dev, A.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR),
            )
        return self._props

    @property
    def name(self) -> str:
        """The GPU's name, e.g. ``"NVIDIA H200"``."""
        return self.properties.name

    @property
    def compute_capability(self) -> tuple:
        """``(major, minor)``, e.g. ``(9, 0)``."""
        return self.properties.compute_capability

    @property
    def arch(self) -> str:
        """NVRTC architecture of this device, e.g. ``"sm_90"``."""
        return self.properties.arch

    @property
    def sm_count(self) -> int:
        """Streaming multiprocessors of the GPU."""
        return self.properties.sm_count

    def mem_info(self) -> tuple[int, int]:
        """``(free_bytes, total_bytes)`` of device memory right now."""
        with self.activated():
            free, total = check("cuMemGetInfo", driver.cuMemGetInfo())
        return int(free), int(total)

    # -- factories -----------------------------------------------------------
    def create_stream(self, *, non_blocking: bool = True, priority: int = 0):
        """Create a :class:`~driverlevel.Stream` on this device.

        Parameters
        ----------
        non_blocking : bool
            True (default): ``CU_STREAM_NON_BLOCKING``, no implicit synchronization with the
            legacy default stream; False: ``CU_STREAM_DEFAULT``.
        priority : int
            CUDA's stream priority: lower numbers are higher priority; 0 is the default. A
            value outside the device's range (``cuCtxGetStreamPriorityRange``, e.g. -5 .. 0)
            is clamped to it by the driver.

        Raises
        ------
        TypeError
            ``non_blocking`` not a bool (``"no"`` and ``0`` are refused, not read as flags), or
            ``priority`` not an int (a bool or a float is refused, not truncated); before the
            driver is called.
        ValueError
            ``priority`` outside the C int range.
        CudaError
            If the driver refuses ``cuStreamCreateWithPriority``.
        """
        from ._checks import _as_int, bool_arg
        from ._stream import Stream

        non_blocking = bool_arg("non_blocking", non_blocking)
        priority = _as_int("priority", priority, "an int")
        if not -2**31 <= priority < 2**31:
            raise ValueError(f"priority must be a C int (lower is higher priority; the driver clamps it to the "
                             f"device's range), got {priority}")
        return Stream._create(self, non_blocking=non_blocking, priority=priority)

    def create_event(self, *, timing: bool = True):
        """Create a :class:`~driverlevel.Event` on this device.

        Parameters
        ----------
        timing : bool
            True (default): the event records time (:meth:`Event.elapsed_ms`); False:
            ``CU_EVENT_DISABLE_TIMING``, lighter for pure synchronization.

        Raises
        ------
        TypeError
            ``timing`` not a bool (``"no"`` and ``0`` are refused, not read as flags), before
            the driver is called.
        CudaError
            If the driver refuses ``cuEventCreate``.
        """
        from ._checks import bool_arg
        from ._stream import Event

        return Event._create(self, timing=bool_arg("timing", timing))

    def __repr__(self) -> str:
        return f"Device({self.ordinal})"

    def __reduce__(self):
        return (Device, (self.ordinal,))


class _Activation:
    """``with device.activated():`` (see :meth:`Device.activated`)."""

    __slots__ = ("_dev", "_pushed")

    def __init__(self, dev):
        self._dev = dev
        self._pushed = False

    def __enter__(self):
        self._pushed = self._dev._push()
        return self._dev

    def __exit__(self, *exc):
        if self._pushed:
            self._pushed = False
            self._dev._pop()
        return False


def current_device_or_none():
    """The :class:`Device` whose primary context is current in this thread (asks the driver), or None."""
    err, cur = driver.cuCtxGetCurrent()
    if err != _SUCCESS:
        return None
    ctx = int(cur)
    for d in list(Device._instances.values()):
        if d._ctx_int == ctx:
            return d
    return None


def context_ordinal(ctx) -> int:
    """The ordinal of the device of CUDA context ``ctx``: ``cuCtxGetDevice`` with ``ctx`` pushed
    for the call and popped again (the caller's current context is unchanged).

    Raises
    ------
    CudaError
        If the driver refuses the push, the question or the pop.
    """
    check("cuCtxPushCurrent", driver.cuCtxPushCurrent(ctx))
    try:
        ret = driver.cuCtxGetDevice()
    finally:
        popped = driver.cuCtxPopCurrent()
    check("cuCtxPopCurrent", popped[:1])
    return int(check("cuCtxGetDevice", ret))


def _check_device_arg(device) -> "Device":
    if isinstance(device, Device):
        return device
    if hasattr(device, "__index__") and not is_bool(device):  # numpy 1's bool_ has __index__
        ordinal = operator.index(device)  # an int, or a numpy integer
        if ordinal < 0:
            raise ValueError(f"device must be an ordinal >= 0, got {ordinal}")
        return Device(ordinal)
    raise TypeError(f"device must be a driverlevel.Device or an int ordinal, got {type(device).__name__}")

