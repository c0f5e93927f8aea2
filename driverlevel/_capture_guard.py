"""Which streams are being captured, so that unsafe calls can refuse politely.

CUDA invalidates a stream capture when a prohibited call (an allocation, a
synchronization, a device-to-host copy) is made from the capturing thread (or
from any thread, in global mode). driverlevel records its own captures here and
every call of the package that is not capture-safe asks :func:`ensure_not_capturing`
first, which raises :class:`~driverlevel.CaptureError` with the fix instead of
letting the capture break.

Two more process-wide records live here, both maintained by
:func:`driverlevel.capture`:

* :func:`captures_in_progress` — how many driverlevel captures are running in
  any thread. While it is non-zero, handles released by the garbage collector
  (or closed) do not free their memory: the free is deferred until the last
  capture ends (see :mod:`driverlevel._memory`).
* the keep-alive lists of the captures in progress, by CUDA capture id.
  :func:`note_use` (called by every launch, memset, copy and event record of
  driverlevel) looks the stream's capture id up with ``cuStreamGetCaptureInfo``
  and appends the objects the recorded work uses to that capture's list, so a
  side stream joined into a capture by events (fork/join) is covered too. The
  lookup costs one driver call per operation, and only while a driverlevel
  capture is in progress anywhere; otherwise :func:`note_use` is one dict check.
"""

from __future__ import annotations

import threading

from cuda.bindings import driver

from ._errors import CaptureError

__all__ = ["ensure_not_capturing", "stream_is_capturing", "captures_in_progress", "note_use"]

_lock = threading.Lock()
# id(session) -> (stream handle as int, mode name, thread ident)
_active: dict[int, tuple[int, str, int]] = {}
#: ``CU_STREAM_PER_THREAD``: the same handle in every thread, a different stream in each.
_PER_THREAD_STREAM = 2
# Number of driverlevel captures between cuStreamBeginCapture and cuStreamEndCapture (any thread),
# in all and per device ordinal; device-wide synchronizations in progress, per device ordinal.
_in_progress = 0
_cv = threading.Condition(threading.Lock())
_capturing_on: dict = {}
_syncing_on: dict = {}
#: Seconds a device-wide synchronization waits for other threads' captures to end.
DEVICE_SYNC_WAIT_S = 300.0
# CUDA capture id -> the keep-alive list of the driverlevel capture with that id.
_keep_by_id: dict[int, list] = {}

_SUCCESS = driver.CUresult.CUDA_SUCCESS
_ACTIVE = driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE


def register(session_id: int, stream_int: int, mode: str) -> None:
    with _lock:
        _active[session_id] = (stream_int, mode, threading.get_ident())


def unregister(session_id: int) -> None:
    with _lock:
        _active.pop(session_id, None)


def begin_capture(ordinal=None) -> None:
    """Count one more driverlevel capture in progress (called before ``cuStreamBeginCapture``).

    Waits while a device-wide synchronization of the same device runs in another thread.
    """
    global _in_progress
    with _cv:
        while _syncing_on.get(ordinal, 0):
            _cv.wait()
        _capturing_on[ordinal] = _capturing_on.get(ordinal, 0) + 1
        _in_progress += 1


def end_capture(ordinal=None) -> int:
    """Count one capture less (after ``cuStreamEndCapture``); returns how many remain (all devices)."""
    global _in_progress
    with _cv:
        _capturing_on[ordinal] = _capturing_on.get(ordinal, 1) - 1
        _in_progress -= 1
        _cv.notify_all()
        return _in_progress


class device_sync_guard:
    """``with device_sync_guard(ordinal, what):`` no driverlevel capture runs on that device inside.

    CUDA forbids synchronizing a context while any of its streams is capturing
    (it would invalidate the capture, even one running in thread-local mode in
    another thread). Entering waits for the device's captures in other threads to
    end (at most :data:`DEVICE_SYNC_WAIT_S`) and holds new ones back until exit.

    Raises
    ------
    CaptureError
        If the captures did not end in time.
    """

    __slots__ = ("_ordinal", "_what")

    def __init__(self, ordinal, what: str):
        self._ordinal = ordinal
        self._what = what

    def __enter__(self):
        o = self._ordinal
        with _cv:
            _syncing_on[o] = _syncing_on.get(o, 0) + 1
            if not _cv.wait_for(lambda: not _capturing_on.get(o, 0), timeout=DEVICE_SYNC_WAIT_S):
                _syncing_on[o] -= 1
                _cv.notify_all()
                raise CaptureError(
                    f"{self._what} waited {DEVICE_SYNC_WAIT_S:.0f} s for another thread's capture on device {o} "
                    f"to end: synchronizing a device while one of its streams is captured would invalidate "
                    f"that capture. Synchronize your own stream (Stream.synchronize()) instead.")
        return self

    def __exit__(self, *exc):
        with _cv:
            _syncing_on[self._ordinal] -= 1
            _cv.notify_all()
        return False


def captures_in_progress() -> int:
    """How many driverlevel captures are in progress in any thread (0: none)."""
    return _in_progress


def capture_id(stream_handle):
    """The CUDA capture id of a capturing stream, or None if it is not capturing."""
    ret = driver.cuStreamGetCaptureInfo(stream_handle)
    if ret[0] != _SUCCESS or ret[1] != _ACTIVE:
        return None
    return int(ret[2])


def register_keep(cap_id: int, keep: list) -> None:
    with _lock:
        _keep_by_id[cap_id] = keep


def unregister_keep(cap_id) -> None:
    with _lock:
        _keep_by_id.pop(cap_id, None)


def note_use(stream, *objs) -> None:
    """Tie ``objs`` to the graph being captured on ``stream``, if a driverlevel capture records it.

    ``stream`` is a :class:`~driverlevel.Stream` (or anything with ``handle``).
    A stream that a driverlevel capture began on is found directly; any other
    stream (a side stream joined by events, a borrowed one) is asked for its
    capture id. Work captured by foreign code (e.g. ``torch.cuda.graph``) is not
    tracked: keep what it uses alive yourself.
    """
    if not _keep_by_id:  # no driverlevel capture in progress: the eager hot path
        return
    session = getattr(stream, "_capture", None)
    if session is not None:
        session._kept.extend(objs)
        return
    handle = getattr(stream, "handle", stream)
    if int(handle) == 0:
        return
    cap = capture_id(handle)
    if cap is None:
        return
    keep = _keep_by_id.get(cap)
    if keep is not None:
        keep.extend(objs)


def stream_is_capturing(stream) -> bool:
    """True if ``stream`` (a :class:`~driverlevel.Stream` or a ``CUstream``) is capturing."""
    handle = getattr(stream, "handle", stream)
    h = int(handle)
    me = threading.get_ident()
    with _lock:  # (handle 2, CU_STREAM_PER_THREAD, names each thread's own stream: only this thread's counts)
        if any(s == h and (h != _PER_THREAD_STREAM or tid == me) for s, _, tid in _active.values()):
            return True
    if h == 0:
        return False
    err, status = driver.cuStreamIsCapturing(handle)
    return err == driver.CUresult.CUDA_SUCCESS and \
        status == driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE


def ensure_not_capturing(what: str, stream=None) -> None:
    """Raise :class:`CaptureError` if ``what`` would break an active capture.

    Parameters
    ----------
    what : str
        The operation, e.g. ``"DeviceBuffer allocation (cuMemAlloc)"``.
    stream : Stream or CUstream, optional
        The stream the operation works on, if any.
    """
    me = threading.get_ident()
    with _lock:
        entries = list(_active.values())
    for s, mode, tid in entries:
        if tid == me or mode == "global":
            where = "this thread" if tid == me else f"thread {tid} (global mode)"
            raise CaptureError(
                f"{what} is not capture-safe: stream 0x{s:x} is being captured into a CUDA graph "
                f"by {where} (mode {mode}). Do it before capture() begins (allocate from a "
                f"WorkspacePool made up front) or after the capture ends."
            )
    if stream is not None and stream_is_capturing(stream):
        raise CaptureError(
            f"{what} is not capture-safe: its stream is being captured into a CUDA graph. "
            f"Do it before capture() begins or after the capture ends."
        )
