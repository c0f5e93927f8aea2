"""Element types of device arrays, including bfloat16 (which numpy lacks).

bfloat16 data is stored as 16-bit patterns; on the host it appears as
``numpy.uint16`` arrays holding the bit patterns (see :func:`bf16_bits_to_f32`
and :func:`f32_to_bf16_bits`).
"""

from __future__ import annotations

import numpy as np

__all__ = ["bfloat16", "as_dtype", "dtype_name", "storage_dtype", "f32_to_bf16_bits", "bf16_bits_to_f32"]


class _BFloat16:
    """The bfloat16 element type (1 sign, 8 exponent, 7 mantissa bits; 2 bytes).

    numpy has no bfloat16, so ``driverlevel.bfloat16`` (the one instance) is what
    :meth:`WorkspacePool.carve`, :meth:`DeviceBuffer.as_array` and :class:`DeviceArray` take
    as ``dtype`` for bf16 data (``"bfloat16"`` and ``"bf16"`` are accepted too). On the
    host the data appears as ``numpy.uint16`` bit patterns: :meth:`DeviceArray.to_numpy`
    returns them and :meth:`DeviceArray.copy_from_host` expects them.
    """

    name = "bfloat16"
    itemsize = 2
    kind = "bf"
    storage = np.dtype(np.uint16)

    def __repr__(self) -> str:
        return "driverlevel.bfloat16"

    def __reduce__(self):
        return "bfloat16"


bfloat16 = _BFloat16()


#: What a device array may hold besides bfloat16: bool, the integers and the IEEE floats, in the
#: device's (little-endian) byte order.
SUPPORTED = "bool, int8/16/32/64, uint8/16/32/64, float16/32/64 or bfloat16"


def as_dtype(dt):
    """Normalise ``dt`` to a ``numpy.dtype`` or :data:`bfloat16`.

    Accepts numpy dtypes and type objects, strings (``"bfloat16"``, ``"bf16"``,
    ``"float32"``…) and :data:`bfloat16` itself. Only the element types a kernel can
    read are accepted: bool, the signed and unsigned integers of 1 to 8 bytes, float16,
    float32, float64 and bfloat16, in native byte order.

    Raises
    ------
    TypeError
        If ``dt`` names no supported type: None (numpy would read it as float64), a
        string numpy does not know, or a numpy type outside the list above (object,
        str, datetime, complex, structured, big-endian...):
        ``"unsupported dtype <U8: a device array holds bool, int8/16/32/64, ..."``.
    """
    if dt is bfloat16:
        return bfloat16
    if isinstance(dt, str) and dt.lower() in ("bfloat16", "bf16"):
        return bfloat16
    if dt is None:
        raise TypeError(f"unsupported dtype None: a device array holds {SUPPORTED}")
    try:
        d = np.dtype(dt)
    except TypeError as exc:
        raise TypeError(f"unsupported dtype {dt!r}: a device array holds {SUPPORTED}") from exc
    ok = (d.kind in "biu" and d.itemsize in (1, 2, 4, 8)) or (d.kind == "f" and d.itemsize in (2, 4, 8))
    if not ok or d.fields is not None or d.subdtype is not None or not d.isnative:
        raise TypeError(f"unsupported dtype {d.str if d.fields is None else d}: a device array holds {SUPPORTED}")
    return d


def dtype_name(dt) -> str:
    """Human name of a dtype: ``"bfloat16"``, ``"float32"``…"""
    dt = as_dtype(dt)
    return dt.name


def storage_dtype(dt) -> np.dtype:
    """The numpy dtype that holds elements of ``dt`` on the host (uint16 for bfloat16)."""
    dt = as_dtype(dt)
    return dt.storage if dt is bfloat16 else dt


def f32_to_bf16_bits(x) -> np.ndarray:
    """Round float values to bfloat16 (round to nearest even); return uint16 bit patterns."""
    f = np.ascontiguousarray(np.asarray(x, dtype=np.float32))
    u = f.view(np.uint32).astype(np.uint64)
    rounding = 0x7FFF + ((u >> 16) & 1)
    out = ((u + rounding) >> 16).astype(np.uint16)
    nan = np.isnan(f)
    if nan.any():
        out[nan] = 0x7FC0
    return out


def bf16_bits_to_f32(bits) -> np.ndarray:
    """Widen bfloat16 bit patterns (uint16) to float32 exactly."""
    b = np.ascontiguousarray(np.asarray(bits, dtype=np.uint16))
    return (b.astype(np.uint32) << 16).view(np.float32)
