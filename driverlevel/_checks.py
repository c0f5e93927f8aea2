"""Argument checks shared by the plans: device arrays, dtypes and shapes, before any launch.

Each check raises ``TypeError`` or ``ValueError`` naming the argument, what was
expected and what was given.
"""

from __future__ import annotations

from ._array import DeviceArray, as_device_array

__all__ = ["device_array_arg", "dtype_is", "need_dtype", "need_shape"]


def device_array_arg(name, x, device) -> DeviceArray:
    """``x`` as a C-contiguous :class:`DeviceArray` on ``device`` (no copy).

    Raises
    ------
    TypeError
        ``x`` is None, host memory, or exports no array protocol.
    ValueError
        ``x`` is on another device or not C-contiguous.
    """
    if x is None:
        raise TypeError(f"{name} is required")
    try:
        a = as_device_array(x, device)
    except TypeError as exc:
        raise TypeError(f"{name}: {exc}") from None
    if a.device.ordinal != device.ordinal:
        raise ValueError(f"{name} is on device {a.device.ordinal}, the plan on device {device.ordinal}")
    if not a.is_c_contiguous:
        raise ValueError(f"{name} must be C-contiguous, got strides {a.strides} for shape {a.shape}")
    return a


def dtype_is(a: DeviceArray, *names) -> bool:
    """True if ``a``'s dtype name is one of ``names`` (``"bfloat16"``, ``"int64"``…)."""
    return a.dtype.name in names


def need_dtype(name, a, *names):
    """Raise ``TypeError`` unless ``a``'s dtype is one of ``names``."""
    if not dtype_is(a, *names):
        raise TypeError(f"{name} must have dtype {' or '.join(names)}, got {a.dtype.name}")


def need_shape(name, a, shape):
    """Raise ``ValueError`` unless ``a.shape == shape``."""
    if a.shape != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {a.shape}")
