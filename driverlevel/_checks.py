"""Argument checks shared by the plans: integers, device arrays, dtypes and shapes, before any launch.

Each check raises ``TypeError`` or ``ValueError`` naming the argument, what was
expected and what was given. The module imports nothing at load time, so the pure
modules (``_mask``, ``_workspace_formula``) use it too.
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._array import DeviceArray

__all__ = ["positive_int", "non_negative_int", "int_in_range", "power_of_two", "int_tuple", "device_array_arg",
           "dtype_is", "need_dtype", "need_shape", "stream_arg", "foreign_stream_hint", "is_bool", "bool_arg"]


def positive_int(name: str, value: object) -> int:
    """``value`` as a Python ``int``, checked to be a positive integer.

    Python and numpy integers (anything with ``__index__``) are accepted; ``bool`` and
    floats are not, even when integral.

    Raises
    ------
    TypeError
        ``value`` is not an integer: ``"max_q must be a positive int, got float 2.0"``.
    ValueError
        ``value < 1``: ``"max_q must be a positive int, got 0"``.

    Example
    -------
    >>> positive_int("max_q", 16)
    16
    """
    return _int_at_least(name, value, 1, "a positive int")


def non_negative_int(name: str, value: object) -> int:
    """``value`` as a Python ``int``, checked to be an integer >= 0 (as :func:`positive_int`, 0 allowed).

    Raises
    ------
    TypeError
        ``value`` is not an integer (bool and floats included).
    ValueError
        ``value < 0``: ``"nbytes must be an int >= 0, got -1"``.
    """
    return _int_at_least(name, value, 0, "an int >= 0")


def int_in_range(name: str, value: object, lo: int, hi: int) -> int:
    """``value`` as a Python ``int``, checked to be an integer in ``lo .. hi`` (both included).

    Python and numpy integers are accepted; ``bool`` and floats are not, even when integral,
    so nothing is truncated or wrapped.

    Raises
    ------
    TypeError
        ``value`` is not an integer: ``"value must be an int in 0 .. 255, got float 1.5"``.
    ValueError
        ``value`` is outside ``lo .. hi``: ``"value must be an int in 0 .. 255, got 256"``.

    Example
    -------
    >>> int_in_range("value", 255, 0, 255)
    255
    """
    want = f"an int in {lo} .. {hi}"
    v = _as_int(name, value, want)
    if not lo <= v <= hi:
        raise ValueError(f"{name} must be {want}, got {v!r}")
    return v


def power_of_two(name: str, value: object) -> int:
    """``value`` as a Python ``int``, checked to be a power of two >= 1 (byte alignments).

    Raises
    ------
    TypeError
        ``value`` is not an integer (bool and floats included), as :func:`positive_int`.
    ValueError
        ``value`` is < 1 or not a power of two: ``"alignment must be a positive power of two, got 3"``.
    """
    v = _as_int(name, value, "a positive power of two")
    if v < 1 or v & (v - 1):
        raise ValueError(f"{name} must be a positive power of two, got {v!r}")
    return v


def int_tuple(name: str, value: object) -> tuple:
    """``value`` (an int, or a sequence of ints) as a tuple of Python ``int`` (shapes, strides).

    Each entry must be an integer as :func:`positive_int` understands it (``__index__``;
    bool and floats refused, never truncated); a single integer is a 1-tuple. The sign is
    the caller's to check (a shape's extents are >= 0, strides may be negative).

    Raises
    ------
    TypeError
        ``value`` is a str/bytes, is not iterable, or holds a non-integer:
        ``"shape must be an int or a sequence of ints, got float 2.9 at index 0 of (2.9,)"``.

    Example
    -------
    >>> int_tuple("shape", 4), int_tuple("shape", (2, 3))
    ((4,), (2, 3))
    """
    want = "an int or a sequence of ints"
    if isinstance(value, (str, bytes, bool)):
        raise TypeError(f"{name} must be {want}, got {type(value).__name__} {value!r}")
    try:
        return (int(operator.index(value)),)  # one integer (a numpy array of several is not one)
    except TypeError:
        pass
    try:
        items = tuple(value)
    except TypeError:
        raise TypeError(f"{name} must be {want}, got {type(value).__name__} {value!r}") from None
    out = []
    for i, v in enumerate(items):
        try:
            if isinstance(v, bool):
                raise TypeError
            out.append(int(operator.index(v)))
        except TypeError:
            raise TypeError(f"{name} must be {want}, got {type(v).__name__} {v!r} at index {i} of {items!r}") from None
    return tuple(out)


def _as_int(name: str, value: object, want: str) -> int:
    """``value`` as a Python int (``__index__``; bool and floats refused), or ``TypeError`` naming ``name``."""
    if is_bool(value):  # numpy 1's np.bool_ has __index__ too
        raise TypeError(f"{name} must be {want}, got bool {value!r}")
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be {want}, got {type(value).__name__} {value!r}") from None
    return int(v)


def _int_at_least(name: str, value: object, minimum: int, want: str) -> int:
    v = _as_int(name, value, want)
    if v < minimum:
        raise ValueError(f"{name} must be {want}, got {v!r}")
    return v


_AS_DEVICE_ARRAY = None  # driverlevel._array.as_device_array, bound at the first call (no import at load time)


def _load_as_device_array():
    global _AS_DEVICE_ARRAY
    from ._array import as_device_array

    _AS_DEVICE_ARRAY = as_device_array
    return as_device_array


def device_array_arg(name, x, device, *, writable: bool = False, owner: str = "the plan") -> DeviceArray:
    """``x`` as a C-contiguous :class:`DeviceArray` on ``device`` (no copy).

    Pass ``writable=True`` for an array the caller's launch writes (an output, or a state
    field the kernels update): a read-only array (``readonly``, e.g. imported from a
    ``__cuda_array_interface__`` whose ``data`` is ``(ptr, True)``) is refused then.
    ``owner`` names what ``device`` belongs to in the other-device message.

    A foreign array is checked where it is imported (:func:`~driverlevel.runtime.as_device_array`):
    a DLPack one by the device id its ``__dlpack_device__()`` gives, a
    ``__cuda_array_interface__`` one by asking the driver which device its pointer is on;
    managed memory (either protocol) is taken whatever device it was allocated on.

    Raises
    ------
    TypeError
        ``x`` is None, host memory, or exports no array protocol.
    ValueError
        ``x`` is on another device (ours or a foreign array), not C-contiguous, or not aligned to
        its element size (the kernels' loads would fault); or ``writable`` and ``x`` is read-only:
        ``"out is read-only, but the launch writes it"``; or ``x`` views driverlevel memory that was
        closed (``DeviceBuffer.close``, ``PinnedHostBuffer.close``, ``WorkspacePool.close``): its address
        may belong to a newer allocation.
    """
    if x is None:
        raise TypeError(f"{name} is required")
    try:
        a = (_AS_DEVICE_ARRAY or _load_as_device_array())(x, device)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{name}: {exc}") from None
    if a.device.ordinal != device.ordinal:
        raise ValueError(f"{name} is on device {a.device.ordinal}, {owner} on device {device.ordinal}")
    if not a.is_c_contiguous:
        raise ValueError(f"{name} must be C-contiguous, got strides {a.strides} for shape {a.shape}")
    if a.ptr % a.itemsize:  # a kernel's element loads would fault (a sticky misaligned-address error)
        raise ValueError(f"{name} must start on a {a.itemsize}-byte aligned device address (its element size), "
                         f"got 0x{a.ptr:x}")
    if writable and a.readonly:
        raise ValueError(f"{name} is read-only, but the launch writes it")
    a._require_live(name)
    return a


_STREAM = None  # driverlevel._stream.Stream, bound at the first call (deferred: no import at load time)


def _load_stream():
    global _STREAM
    from ._stream import Stream

    _STREAM = Stream
    return Stream


def stream_arg(name, stream, device=None, owner="the plan"):
    """``stream``, checked to be a driverlevel :class:`~driverlevel.Stream` before a plan launches on it.

    The test :func:`driverlevel.capture` makes: an instance of :class:`~driverlevel.Stream`
    (from ``Device.create_stream()``, or a foreign stream borrowed with ``Stream.from_handle``).
    An :class:`~driverlevel.Event`, a :class:`~driverlevel.runtime.Graph` or a
    :class:`~driverlevel.runtime.GraphExec` has a ``handle`` and a ``device`` too, but its handle is
    not a ``CUstream``: it is refused like any other object. With ``device``, the stream must
    belong to that device too (a launch on another device's stream fails in the driver);
    ``owner`` names what ``device`` belongs to in that message.

    Raises
    ------
    TypeError
        ``stream`` is anything else (None, an int, a str, an Event, a raw ``CUstream``, a CuPy or
        PyTorch stream...):
        ``"stream must be a driverlevel Stream (Device.create_stream() or Stream.from_handle), got Event"``.
    ValueError
        ``device`` is given and the stream is on another device:
        ``"stream is on device 1, but the plan is on device 0"``; or the stream was closed
        (``Stream.close``: its handle is destroyed and may name a newer stream).
    """
    if not isinstance(stream, _STREAM or _load_stream()):
        raise TypeError(f"{name} must be a driverlevel Stream (Device.create_stream() or Stream.from_handle), "
                        f"got {type(stream).__name__}{foreign_stream_hint(stream)}")
    stream._require_open(name)
    if device is not None and stream.device is not device and stream.device.ordinal != device.ordinal:
        raise ValueError(f"{name} is on device {stream.device.ordinal}, but {owner} is on device {device.ordinal}")
    return stream


def foreign_stream_hint(obj) -> str:
    """``""``, or for what looks like another library's stream (CuPy's, PyTorch's, cuda.core's: an
    object with ``__cuda_stream__`` or ``cuda_stream``, or a class named ``...Stream`` outside
    driverlevel) a parenthesis naming its class and how to borrow it, for a ``TypeError``'s message."""
    t = type(obj)
    if t.__module__.startswith("driverlevel"):
        return ""
    if hasattr(obj, "__cuda_stream__") or hasattr(obj, "cuda_stream") or t.__name__.endswith("Stream"):
        return (f" ({t.__module__}.{t.__qualname__}: borrow another library's stream with "
                f"driverlevel.Stream.from_handle(handle, device))")
    return ""


_DTYPE_NAMES: dict = {}  # dtype -> its name (numpy computes ``dtype.name`` anew at each access: ~1 µs)


def dtype_is(a: DeviceArray, *names) -> bool:
    """True if ``a``'s dtype name is one of ``names`` (``"bfloat16"``, ``"int64"``…)."""
    dt = a.dtype
    n = _DTYPE_NAMES.get(dt)
    if n is None:
        n = _DTYPE_NAMES[dt] = dt.name
    return n in names


def need_dtype(name, a, *names):
    """Raise ``TypeError`` unless ``a``'s dtype is one of ``names``."""
    if not dtype_is(a, *names):
        raise TypeError(f"{name} must have dtype {' or '.join(names)}, got {a.dtype.name}")


def need_shape(name, a, shape):
    """Raise ``ValueError`` unless ``a.shape == shape``."""
    if a.shape != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {a.shape}")


def is_bool(value: object) -> bool:
    """True for ``True`` / ``False`` and numpy's bool scalars (``np.True_``); False for anything else, ints
    and strings included (``"no"`` is truthy, ``0`` / ``1`` are no flags)."""
    if isinstance(value, bool):
        return True
    t = type(value)
    return t.__module__ == "numpy" and t.__name__ in ("bool", "bool_")  # numpy 2 / 1; numpy imported lazily


def bool_arg(name: str, value: object) -> bool:
    """``value`` as a Python ``bool``, checked to be a real bool (or numpy's, :func:`is_bool`).

    Raises
    ------
    TypeError
        For anything else: ``"use_cache must be a bool, got str 'no'"``.
    """
    if not is_bool(value):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    return bool(value)
