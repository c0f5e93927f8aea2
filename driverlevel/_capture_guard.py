"""Which streams are being captured, so that unsafe calls can refuse politely.

CUDA invalidates a stream capture when a prohibited call (an allocation, a
synchronization, a device-to-host copy) is made from the capturing thread (or
from any thread, in global mode). driverlevel records its own captures here and
every call of the package that is not capture-safe asks :func:`ensure_not_capturing`
first, which raises :class:`~driverlevel.CaptureError` with the fix instead of
letting the capture break.
"""

from __future__ import annotations

import threading

from cuda.bindings import driver

from ._errors import CaptureError

__all__ = ["ensure_not_capturing", "stream_is_capturing"]

_lock = threading.Lock()
# id(session) -> (stream handle as int, mode name, thread ident)
_active: dict[int, tuple[int, str, int]] = {}


def register(session_id: int, stream_int: int, mode: str) -> None:
    with _lock:
        _active[session_id] = (stream_int, mode, threading.get_ident())


def unregister(session_id: int) -> None:
    with _lock:
        _active.pop(session_id, None)


def stream_is_capturing(stream) -> bool:
    """True if ``stream`` (a :class:`~driverlevel.Stream` or a ``CUstream``) is capturing."""
    handle = getattr(stream, "handle", stream)
    h = int(handle)
    with _lock:
        if any(s == h for s, _, _ in _active.values()):
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
