"""CUDA streams and events (driver API).

Every call works in the device's primary context whatever the calling thread has
current, and leaves the caller's context current on return (see
:mod:`driverlevel._device`). An event recorded, or waited on, inside a driverlevel
capture is tied to the captured graph's lifetime.
"""

from __future__ import annotations

import weakref

from cuda.bindings import driver

from . import _capture_guard
from ._capture_guard import ensure_not_capturing, stream_is_capturing
from ._checks import non_negative_int
from ._errors import check

__all__ = ["Stream", "Event"]


def _release(kind, handle, ctx):
    from ._memory import _release as release  # deferred during captures, relaxed otherwise

    release(kind, handle, ctx)


class Stream:
    """A CUDA stream (``CUstream``) owned by driverlevel, or a borrowed foreign one.

    Create with :meth:`Device.create_stream` (non-blocking, priority 0 by default; there is
    no public constructor) or borrow an existing handle with :meth:`Stream.from_handle` (a
    borrowed stream is never destroyed by us). Every plan's ``run`` queues its kernels on
    the stream it is given; :func:`~driverlevel.capture` records what is queued on one.

    Attributes
    ----------
    device : Device
        The device the stream belongs to (work runs in its primary context).
    handle : CUstream
        The driver handle; ``int(stream)`` is its address.

    Raises
    ------
    RuntimeError
        ``Stream()`` called directly.
    CaptureError
        From :meth:`synchronize` while the stream is being captured.
    CudaError
        If the driver refuses a call (e.g. ``cuStreamCreateWithPriority``).
    """

    def __init__(self, *args, **kwargs):
        raise RuntimeError("Stream has no public constructor: use Device.create_stream() or Stream.from_handle()")

    @classmethod
    def _create(cls, device, non_blocking=True, priority=0):
        self = object.__new__(cls)
        flags = driver.CUstream_flags.CU_STREAM_NON_BLOCKING if non_blocking else driver.CUstream_flags.CU_STREAM_DEFAULT
        with device.activated():
            self._handle = check("cuStreamCreateWithPriority", driver.cuStreamCreateWithPriority(flags, priority))
        self.device = device
        self._capture = None  # the CaptureSession recording this stream, if any
        self._finalizer = weakref.finalize(self, _release, "stream", self._handle, device.context)
        return self

    @classmethod
    def from_handle(cls, handle, device):
        """Borrow a foreign stream (an int address or a ``CUstream``); it is not destroyed by us.

        Parameters
        ----------
        handle : int or CUstream
            e.g. ``torch.cuda.current_stream().cuda_stream`` or CuPy's ``stream.ptr``.
        device : Device or int
            The device the stream belongs to (an int ordinal is opened as :class:`Device`).

        Raises
        ------
        TypeError
            ``handle`` is neither a ``CUstream`` nor an int (a float or a bool is refused), or
            ``device`` is neither a Device nor an int ordinal (None included).
        ValueError
            ``handle`` or the device ordinal is negative.
        DriverUnavailableError
            ``device`` is an int and there is no usable driver.
        """
        from ._device import _check_device_arg

        if not isinstance(handle, driver.CUstream):
            handle = driver.CUstream(non_negative_int("handle", handle))
        device = _check_device_arg(device)
        self = object.__new__(cls)
        self._handle = handle
        self.device = device
        self._capture = None
        self._finalizer = None
        return self

    @property
    def handle(self):
        """The ``CUstream``."""
        return self._handle

    def __int__(self) -> int:
        return int(self._handle)

    def is_capturing(self) -> bool:
        """True while this stream is being captured into a graph."""
        return stream_is_capturing(self)

    def synchronize(self) -> None:
        """Block the host until all work queued on this stream is done.

        Raises
        ------
        CaptureError
            If a capture is active (synchronizing would invalidate it).
        """
        ensure_not_capturing("Stream.synchronize()", self)
        with self.device.activated():
            check("cuStreamSynchronize", driver.cuStreamSynchronize(self._handle))

    def wait(self, event: "Event") -> None:
        """Make future work on this stream wait for ``event`` (capture-safe).

        Inside a capture this is how a side stream joins it (fork) and rejoins the
        origin stream (join); the event is tied to the captured graph.
        """
        with self.device.activated():
            check("cuStreamWaitEvent", driver.cuStreamWaitEvent(self._handle, event.handle, 0))
        _capture_guard.note_use(self, event)

    def close(self) -> None:
        """Destroy the stream now (idempotent; borrowed streams are left alone)."""
        if self._finalizer is not None:
            self._finalizer()

    def __repr__(self) -> str:
        return f"<Stream 0x{int(self._handle):x} on {self.device!r}>"


class Event:
    """A CUDA event (``CUevent``): a marker in a stream's work, to wait on or to time.

    Create with :meth:`Device.create_event` (``timing=True`` by default; there is no
    public constructor). :meth:`record` places it on a stream, :meth:`Stream.wait`
    makes another stream wait for it (inside a capture: fork and join of side
    streams), :meth:`elapsed_ms` gives the GPU time between two completed events.

    Attributes
    ----------
    device : Device
    timing : bool
        False for ``create_event(timing=False)`` (lighter, but :meth:`elapsed_ms` fails).

    Example
    -------
    >>> start, end = dev.create_event(), dev.create_event()          # doctest: +SKIP
    >>> start.record(stream); exec_.launch(stream); end.record(stream)  # doctest: +SKIP
    >>> end.synchronize()                                            # doctest: +SKIP
    >>> us = start.elapsed_ms(end) * 1e3                              # GPU µs of the replay  # doctest: +SKIP
    """

    def __init__(self, *args, **kwargs):
        raise RuntimeError("Event has no public constructor: use Device.create_event()")

    @classmethod
    def _create(cls, device, timing=True):
        self = object.__new__(cls)
        flags = driver.CUevent_flags.CU_EVENT_DEFAULT if timing else driver.CUevent_flags.CU_EVENT_DISABLE_TIMING
        with device.activated():
            self._handle = check("cuEventCreate", driver.cuEventCreate(flags))
        self.device = device
        self.timing = timing
        self._finalizer = weakref.finalize(self, _release, "event", self._handle, device.context)
        return self

    @property
    def handle(self):
        """The ``CUevent`` (owned by this object; do not destroy it)."""
        return self._handle

    def record(self, stream: Stream) -> "Event":
        """Record the event on ``stream`` (capture-safe: a dependency or event-record node);
        returns the event, so ``ev = dev.create_event().record(s)`` chains."""
        with self.device.activated():
            check("cuEventRecord", driver.cuEventRecord(self._handle, stream.handle))
        _capture_guard.note_use(stream, self)
        return self

    def synchronize(self) -> None:
        """Block the host until the event has completed.

        Raises
        ------
        CaptureError
            While a stream of this thread (or any, in global mode) is being captured.
        """
        ensure_not_capturing("Event.synchronize()")
        with self.device.activated():
            check("cuEventSynchronize", driver.cuEventSynchronize(self._handle))

    def query(self) -> bool:
        """True if all work before the event's record has completed."""
        with self.device.activated():
            (err,) = driver.cuEventQuery(self._handle)
        if err == driver.CUresult.CUDA_SUCCESS:
            return True
        if err == driver.CUresult.CUDA_ERROR_NOT_READY:
            return False
        check("cuEventQuery", (err,))
        return False

    def elapsed_ms(self, end: "Event") -> float:
        """GPU time from this event to ``end``, in milliseconds (resolution about 0.5 µs).

        Both events must have been recorded and completed (:meth:`synchronize` on ``end``).

        Raises
        ------
        CudaError
            ``CUDA_ERROR_NOT_READY`` if either has not completed yet,
            ``CUDA_ERROR_INVALID_HANDLE`` if either was created with ``timing=False`` or
            never recorded.
        """
        with self.device.activated():
            return float(check("cuEventElapsedTime", driver.cuEventElapsedTime(self._handle, end.handle)))

    def close(self) -> None:
        """Destroy the event now (idempotent)."""
        self._finalizer()
