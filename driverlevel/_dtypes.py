"""Element types of device arrays, including bfloat16 (which numpy lacks).

bfloat16 data is stored as 16-bit patterns; on the host it appears as
``numpy.uint16`` arrays holding the bit patterns (see :func:`bf16_bits_to_f32`
and :func:`f32_to_bf16_bits`). numpy arrays of ``ml_dtypes.bfloat16`` (the type JAX and
TensorFlow use) are accepted too, and so is that type as a dtype; ml_dtypes is not a
dependency: its type is recognised by what numpy says of it (:func:`is_ml_bfloat16`).
"""

from __future__ import annotations

import numpy as np

__all__ = ["bfloat16", "as_dtype", "dtype_name", "storage_dtype", "f32_to_bf16_bits", "bf16_bits_to_f32"]


class _BFloat16:
    """The bfloat16 element type (1 sign, 8 exponent, 7 mantissa bits; 2 bytes).

    numpy has no bfloat16, so ``driverlevel.bfloat16`` (the one instance) is what
    :meth:`WorkspacePool.carve`, :meth:`DeviceBuffer.as_array` and :class:`DeviceArray` take
    as ``dtype`` for bf16 data (``"bfloat16"``, ``"bf16"`` and ``ml_dtypes.bfloat16`` are
    accepted too: :data:`BF16_FORMS`). On the host the data appears as ``numpy.uint16`` bit
    patterns: :meth:`DeviceArray.to_numpy` returns them and :meth:`DeviceArray.copy_from_host`
    expects them (or an ``ml_dtypes.bfloat16`` array, whose bytes are the same).
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


#: Every way of naming bfloat16 as a dtype that :func:`as_dtype` accepts, as the messages list them.
BF16_FORMS = 'driverlevel.bfloat16, "bfloat16", "bf16" or ml_dtypes.bfloat16'
#: What a device array may hold: bool, the integers and the IEEE floats, in the device's
#: (little-endian) byte order, and bfloat16 (named in any of :data:`BF16_FORMS`).
SUPPORTED = f"bool, int8/16/32/64, uint8/16/32/64, float16/32/64 or bfloat16 ({BF16_FORMS})"


def is_ml_bfloat16(dt) -> bool:
    """True if ``dt`` is ml_dtypes' ``bfloat16`` numpy dtype (or that scalar type), without importing ml_dtypes.

    ml_dtypes registers bfloat16 with numpy as a 2-byte dtype of kind ``'V'`` named
    ``"bfloat16"`` whose scalar type is its own (a ``numpy.generic``, not a ``numpy.void``).
    A plain or structured void dtype that happens to carry that name (a ``numpy.void``
    subclass, or one with fields) is not it: nothing says its bytes are bf16.
    """
    if isinstance(dt, np.dtype):
        d = dt
    elif isinstance(dt, type) and issubclass(dt, np.generic):
        d = np.dtype(dt)
    else:
        return False
    return (d.kind == "V" and d.itemsize == 2 and d.name == "bfloat16" and d.fields is None
            and d.subdtype is None and not issubclass(d.type, np.void))


def as_dtype(dt):
    """Normalise ``dt`` to a ``numpy.dtype`` or :data:`bfloat16`.

    Accepts numpy dtypes and type objects, strings (``"bfloat16"``, ``"bf16"``,
    ``"float32"``…), :data:`bfloat16` itself and ml_dtypes' ``bfloat16`` (its type or its
    numpy dtype, :func:`is_ml_bfloat16`). Only the element types a kernel can read are
    accepted: bool, the signed and unsigned integers of 1 to 8 bytes, float16, float32,
    float64 and bfloat16, in native byte order.

    Raises
    ------
    TypeError
        If ``dt`` names no supported type: None (numpy would read it as float64), a
        string numpy does not know, or a numpy type outside the list above (object,
        str, datetime, complex, structured or plain void even when named "bfloat16",
        big-endian...); the message lists what is accepted (:data:`SUPPORTED`):
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
    if is_ml_bfloat16(d):  # ml_dtypes.bfloat16, its dtype, or "bfloat16" read by numpy once ml_dtypes is imported
        return bfloat16
    ok = (d.kind in "biu" and d.itemsize in (1, 2, 4, 8)) or (d.kind == "f" and d.itemsize in (2, 4, 8))
    if not ok or d.fields is not None or d.subdtype is not None or not d.isnative:
        shown = d.str if d.fields is None else str(d)
        if d.kind == "V" and not issubclass(d.type, np.void):  # another library's type (ml_dtypes' float8...)
            shown = f"{d.name} ({d.str})"
        elif d.kind == "V" and "bfloat16" in d.name:  # named like it, but not ml_dtypes' type: say so
            kind = "structured" if d.fields is not None else "plain"
            shown = f"{shown} named {d.name!r} (a {kind} void type, not ml_dtypes.bfloat16)"
        raise TypeError(f"unsupported dtype {shown}: a device array holds {SUPPORTED}")
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
    """Round float values to bfloat16 (round to nearest even); return uint16 bit patterns.

    ``x`` (numbers: floats, ints, bools, or arrays of them) is converted to float32 first, then
    rounded; the result has its shape (a scalar gives a 0-d array). float64 input is thus
    rounded twice, to float32 and then to bfloat16, which can differ from rounding it to bfloat16
    directly by one bf16 ulp where the float32 step lands exactly halfway (1 + 2**-8 + 2**-30
    gives 1.0, not 1.0078125). Values past bf16's range round to +-inf, infinities stay
    infinite, and NaN becomes a quiet NaN with the same sign (the upper bits of its payload kept).

    Raises
    ------
    TypeError
        For ``None``, strings, datetimes, object arrays and other input that is not numbers
        (they were turned into NaN or into their raw integers before).
    """
    a = np.asarray(x)
    if a.dtype.kind not in "biuf" and not is_ml_bfloat16(a.dtype):
        raise TypeError(f"f32_to_bf16_bits takes numbers (float, int or bool values), got "
                        f"{'None' if x is None else f'dtype {a.dtype}'}")
    with np.errstate(over="ignore"):  # a value past float32's range becomes +-inf, as documented
        f = np.require(a.astype(np.float32, copy=False), requirements="C")  # keeps a 0-d shape
    u = f.view(np.uint32).astype(np.uint64)
    rounding = np.uint64(0x7FFF) + ((u >> np.uint64(16)) & np.uint64(1))
    out = ((u + rounding) >> np.uint64(16)).astype(np.uint16)
    nan = np.isnan(f)
    if nan.any():
        out = np.where(nan, ((u >> np.uint64(16)) | np.uint64(0x0040)).astype(np.uint16), out)
    return np.asarray(out, dtype=np.uint16).reshape(f.shape)  # (numpy's 0-d arithmetic gives scalars)


def bf16_bits_to_f32(bits) -> np.ndarray:
    """Widen bfloat16 bit patterns (uint16) to float32 exactly; the result has the shape of ``bits``.

    An ``ml_dtypes.bfloat16`` array is read as the bit patterns it holds (not converted
    value by value to uint16 first). Integers of other types are taken when they are bit
    patterns: int16 by its bits, wider ones in ``[0, 0xFFFF]``; either byte order (``'>u2'``
    is read by value).

    Raises
    ------
    TypeError
        ``bits`` is neither integers nor ``ml_dtypes.bfloat16`` (a float is not truncated to bits).
    ValueError
        An integer outside ``[0, 0xFFFF]`` (other than int16).
    """
    b = np.asarray(bits)
    if is_ml_bfloat16(b.dtype):
        b = b.view(np.uint16)
    elif b.dtype.kind not in "iu":
        raise TypeError(f"bf16 bit patterns must be integers (uint16) or ml_dtypes.bfloat16, got dtype {b.dtype}")
    elif b.dtype.itemsize == 2:  # (a byte-swapped array, e.g. '>u2', to native order first: its values)
        b = (b if b.dtype.isnative else b.astype(b.dtype.newbyteorder("="))).view(np.uint16)
    elif b.size and (int(b.min()) < 0 or int(b.max()) > 0xFFFF):
        raise ValueError(f"bf16 bit patterns must be in [0, 0xFFFF], got values in [{int(b.min())}, {int(b.max())}]")
    b = np.require(b.astype(np.uint16), requirements="C")  # keeps a 0-d shape
    return np.asarray(b.astype(np.uint32) << np.uint32(16), dtype=np.uint32).reshape(b.shape).view(np.float32)
