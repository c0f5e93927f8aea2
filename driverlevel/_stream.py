"""CUDA streams and events (driver API).

Every call works in the device's primary context whatever the calling thread has
current, and leaves the caller's context current on return (see
:mod:`driverlevel._device`). An event recorded, or waited on, inside a driverlevel
capture is tied to the captured graph's lifetime.
"""

from __future__ import annotations

import numbers
import weakref

from cuda.bindings import driver

from . import _capture_guard
from ._capture_guard import ensure_not_capturing, stream_is_capturing
from ._checks import int_in_range, stream_arg
from ._errors import check

__all__ = ["Stream", "Event"]


def _release(kind, handle, ctx):
    from ._memory import _release as release  # deferred during captures, relaxed otherwise

    release(kind, handle, ctx)


_HANDLE_FORMS = "an int stream address, a CUstream or an object with __cuda_stream__"
#: The special stream handles: the legacy default stream (0 and ``CU_STREAM_LEGACY``) and the per-thread
#: default stream. Each names the default stream of the context current at the call, not one stream.
_SPECIAL_STREAMS = frozenset((0, int(driver.CU_STREAM_LEGACY), int(driver.CU_STREAM_PER_THREAD)))


def _stream_handle_arg(handle):
    """``handle`` (what :meth:`Stream.from_handle` documents) as a ``CUstream``, or ``TypeError`` / ``ValueError``.

    Only a Python or numpy integer is read as an address: another driver handle (a ``CUevent``,
    a ``CUgraph``...) has ``__index__`` too, and would be taken for a stream otherwise.
    """
    if isinstance(handle, driver.CUstream):
        return handle
    proto = getattr(type(handle), "__cuda_stream__", None)
    if proto is not None:  # the CUDA stream protocol: (version, address), a method (or, in old producers, a property)
        pair = handle.__cuda_stream__
        if callable(pair):
            pair = pair()
        if not (isinstance(pair, tuple) and len(pair) == 2 and pair[0] == 0):
            raise TypeError(f"handle.__cuda_stream__ must give (0, address) (version 0 of the CUDA stream "
                            f"protocol), got {pair!r}")
        return driver.CUstream(int_in_range("handle.__cuda_stream__ address", pair[1], 0, (1 << 64) - 1))
    if isinstance(handle, bool) or not isinstance(handle, numbers.Integral):
        raise TypeError(f"handle must be {_HANDLE_FORMS}, got {type(handle).__name__} {handle!r}")
    return driver.CUstream(int_in_range("handle", handle, 0, (1 << 64) - 1))  # (an address: 64 bits)


def _check_stream_context(handle, device) -> None:
    """``ValueError`` unless the stream ``handle`` belongs to ``device``'s primary context (asks the driver).

    One ``cuStreamGetCtx``; on a mismatch the device of the stream's context is looked up for the
    message (:func:`~driverlevel._device.context_ordinal`: push, ``cuCtxGetDevice``, pop). The
    special handles (:data:`_SPECIAL_STREAMS`) are not asked about: they resolve to the context
    current at each call, which driverlevel makes the primary one.
    """
    h = int(handle)
    if h in _SPECIAL_STREAMS:
        return
    ctx = check("cuStreamGetCtx", driver.cuStreamGetCtx(handle), f"stream 0x{h:x}")
    if int(ctx) == int(device.context):
        return
    from ._device import context_ordinal  # at the call: the tests replace context_ordinal

    ordinal = context_ordinal(ctx)
    if ordinal != device.ordinal:
        raise ValueError(f"stream 0x{h:x} belongs to device {ordinal}, not to device {device.ordinal}: "
                         f"borrow it with Stream.from_handle(handle, {ordinal})")
    raise ValueError(f"stream 0x{h:x} belongs to a context of device {ordinal} other than its primary context "
                     f"(made with cuCtxCreate, or a green context); driverlevel works in the primary context only")


def _event_arg(name: str, event) -> "Event":
    """``event``, checked to be a driverlevel :class:`Event` (``TypeError`` naming ``name`` otherwise)
    that was not closed (``ValueError``)."""
    if not isinstance(event, Event):
        raise TypeError(f"{name} must be a driverlevel Event (Device.create_event()), got {type(event).__name__}")
    event._require_open(name)
    return event


def _require_open(obj, what: str) -> None:
    """``ValueError`` if ``obj`` (a Stream or an Event) was closed: its handle is destroyed, and the driver
    may already have given the same value to a newer stream or event. A borrowed stream (no finalizer)
    is the lender's to close."""
    fin = getattr(obj, "_finalizer", None)
    if fin is not None and not fin.alive:
        kind = type(obj).__name__
        raise ValueError(f"{what}: this {kind} was closed ({kind}.close); create a new one")


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
    ValueError
        From its methods, and from any call given it, once it was closed (:meth:`close`).
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
        """Borrow a foreign stream; it is not destroyed by us.

        The driver is asked which context the stream belongs to (``cuStreamGetCtx``, once,
        here): driverlevel works in ``device``'s primary context, so a stream of another
        device, or of another context (``cuCtxCreate``, a green context), is refused now
        instead of failing at its first launch. The special handles 0 (the legacy default
        stream), ``CU_STREAM_LEGACY`` (1) and ``CU_STREAM_PER_THREAD`` (2) name the default
        stream of whatever context is current, which driverlevel makes ``device``'s primary
        one, and are taken as they are.

        Parameters
        ----------
        handle : int, CUstream, or an object with ``__cuda_stream__``
            The stream's address as a Python or numpy integer (e.g.
            ``torch.cuda.current_stream().cuda_stream`` or CuPy's ``stream.ptr``), a
            ``cuda.bindings.driver.CUstream``, or a stream object of the CUDA stream protocol
            (``__cuda_stream__``, a method or attribute giving ``(version, address)``, e.g. a
            ``cuda.core`` stream).
        device : Device or int
            The device the stream belongs to (an int ordinal is opened as :class:`Device`).

        Raises
        ------
        TypeError
            ``handle`` is none of those (a float, a bool, a str, another driver handle such as a
            ``CUevent``...), ``__cuda_stream__`` gives no ``(version, address)`` pair, or
            ``device`` is neither a Device nor an int ordinal (None included).
        ValueError
            ``handle`` is outside 0 .. 2**64 - 1 or the device ordinal is negative; or the
            stream belongs to another device than ``device`` (the message names both), or to a
            context of ``device`` other than its primary context.
        DriverUnavailableError
            ``device`` is an int and there is no usable driver.
        CudaError
            If the driver cannot say which context the stream belongs to (or, when that is not
            ``device``'s primary context, which device the context is on).
        """
        from ._device import _check_device_arg

        handle = _stream_handle_arg(handle)
        device = _check_device_arg(device)
        _check_stream_context(handle, device)
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

    _require_open = _require_open

    def is_capturing(self) -> bool:
        """True while this stream is being captured into a graph (``ValueError`` once it was closed)."""
        self._require_open("Stream.is_capturing")
        return stream_is_capturing(self)

    def synchronize(self) -> None:
        """Block the host until all work queued on this stream is done.

        Raises
        ------
        ValueError
            This stream was closed.
        CaptureError
            If a capture is active (synchronizing would invalidate it).
        CudaError
            If a kernel queued before failed (the error of an asynchronous launch, e.g. an
            illegal address, is reported here).
        """
        self._require_open("Stream.synchronize")
        ensure_not_capturing("Stream.synchronize()", self)
        with self.device.activated():
            check("cuStreamSynchronize", driver.cuStreamSynchronize(self._handle))

    def wait(self, event: "Event") -> None:
        """Make future work on this stream wait for ``event`` (capture-safe).

        Inside a capture this is how a side stream joins it (fork) and rejoins the
        origin stream (join); the event is tied to the captured graph. The event may belong
        to another device (CUDA allows a wait across devices).

        Raises
        ------
        TypeError
            ``event`` is not a driverlevel :class:`Event` (checked before the driver is called).
        ValueError
            This stream or ``event`` was closed.
        CudaError
            If ``cuStreamWaitEvent`` fails.
        """
        _event_arg("event", event)
        self._require_open("Stream.wait")
        with self.device.activated():
            check("cuStreamWaitEvent", driver.cuStreamWaitEvent(self._handle, event.handle, 0))
        _capture_guard.note_use(self, event)

    def close(self) -> None:
        """Destroy the stream now (idempotent; borrowed streams are left alone). Afterwards its own
        methods, and every plan, array or capture call given it, raise ``ValueError``; the two hot
        paths, ``PreparedLaunch.launch`` and ``GraphExec.launch``, do not look (the latter names a
        closed stream only when the driver refuses its handle)."""
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

    _require_open = _require_open

    @property
    def handle(self):
        """The ``CUevent`` (owned by this object; do not destroy it)."""
        return self._handle

    def record(self, stream: Stream) -> "Event":
        """Record the event on ``stream`` (capture-safe: a dependency or event-record node);
        returns the event, so ``ev = dev.create_event().record(s)`` chains.

        Raises
        ------
        TypeError
            ``stream`` is not a driverlevel :class:`Stream` (a raw handle or another library's
            stream: borrow it with :meth:`Stream.from_handle`).
        ValueError
            ``stream`` belongs to another device than the event (CUDA refuses that record), or
            this event or ``stream`` was closed.
        CudaError
            If ``cuEventRecord`` fails.
        """
        self._require_open("Event.record")
        stream_arg("stream", stream, self.device, "the event")
        with self.device.activated():
            check("cuEventRecord", driver.cuEventRecord(self._handle, stream.handle))
        _capture_guard.note_use(stream, self)
        return self

    def synchronize(self) -> None:
        """Block the host until the event has completed.

        Raises
        ------
        ValueError
            This event was closed.
        CaptureError
            While a stream of this thread (or any, in global mode) is being captured.
        CudaError
            If work before the event's record failed (an asynchronous launch's error).
        """
        self._require_open("Event.synchronize")
        ensure_not_capturing("Event.synchronize()")
        with self.device.activated():
            check("cuEventSynchronize", driver.cuEventSynchronize(self._handle))

    def query(self) -> bool:
        """True if all work before the event's record has completed (never blocks).

        Raises
        ------
        ValueError
            This event was closed.
        CudaError
            For any answer of ``cuEventQuery`` but success and ``CUDA_ERROR_NOT_READY`` (e.g. an
            asynchronous launch's error).
        """
        self._require_open("Event.query")
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
        TypeError
            ``end`` is not a driverlevel :class:`Event`.
        ValueError
            ``end`` belongs to another device (CUDA times events of one device only), or either
            event was closed.
        CudaError
            ``CUDA_ERROR_NOT_READY`` if either has not completed yet,
            ``CUDA_ERROR_INVALID_HANDLE`` if either was created with ``timing=False`` or
            never recorded.
        """
        self._require_open("Event.elapsed_ms")
        _event_arg("end", end)
        if end.device is not self.device and end.device.ordinal != self.device.ordinal:
            raise ValueError(f"end is an event of device {end.device.ordinal}, this event of device "
                             f"{self.device.ordinal}: elapsed_ms times two events of one device")
        with self.device.activated():
            return float(check("cuEventElapsedTime", driver.cuEventElapsedTime(self._handle, end.handle)))

    def close(self) -> None:
        """Destroy the event now (idempotent). Afterwards its methods, and a stream's ``wait`` or an
        ``elapsed_ms`` given it, raise ``ValueError``."""
        self._finalizer()
