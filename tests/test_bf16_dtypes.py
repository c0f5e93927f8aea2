"""bfloat16 (CPU only): ``driverlevel.bfloat16``, ``"bfloat16"``, ``"bf16"`` and ml_dtypes' bfloat16 are one
dtype (a void lookalike is refused), every dtype message lists those forms, and the bf16 <-> float32
converters keep a scalar's shape and NaN's sign and take only 16-bit integer patterns.
"""

from __future__ import annotations

import numpy as np
import pytest
from cuda.bindings import driver

from driverlevel import DeviceArray, _dtypes, bfloat16
from driverlevel._dtypes import bf16_bits_to_f32, f32_to_bf16_bits
from driverlevel.reference.attention import bf16_to_f32, f32_to_bf16, round_to_bf16
from driver_stub_util import DEV0, OK, PTR, calls  # noqa: F401 (calls: a fixture)


# -- one bfloat16 dtype, ml_dtypes' included -----------------------------------------------------------------
class bfloat(np.void):
    """numpy names a void dtype of this type, 2 bytes, "bfloat16": a lookalike of ml_dtypes' dtype."""


def test_a_void_dtype_named_bfloat16_is_refused_clearly_without_ml_dtypes():
    plain, structured = np.dtype((bfloat, 2)), np.dtype((bfloat, [("x", "<u2")]))
    assert plain.name == structured.name == "bfloat16" and plain.kind == "V" and plain.itemsize == 2
    for dt, kind in ((plain, "plain"), (structured, "structured")):
        assert not _dtypes.is_ml_bfloat16(dt)
        with pytest.raises(TypeError) as ei:
            DeviceArray(PTR, (4,), dt, DEV0)
        assert f"named 'bfloat16' (a {kind} void type, not ml_dtypes.bfloat16): a device array holds" in str(ei.value)
        assert str(ei.value).endswith(_dtypes.SUPPORTED)
        host = np.zeros(4, dt)
        with pytest.raises(TypeError, match="expected host dtype uint16 for a bfloat16 array"):
            DeviceArray(PTR, (4,), bfloat16, DEV0).copy_from_host(host)


def test_every_dtype_message_lists_the_same_bfloat16_forms():
    forms = 'driverlevel.bfloat16, "bfloat16", "bf16" or ml_dtypes.bfloat16'
    assert _dtypes.BF16_FORMS == forms
    with pytest.raises(TypeError) as ei:
        DeviceArray(PTR, (4,), np.complex64, DEV0)
    assert str(ei.value).endswith(f"or bfloat16 ({forms})")
    from driverlevel.ddtree import _logit_dtype

    with pytest.raises(TypeError) as ei:
        _logit_dtype("logits_dtype", "float16")
    assert forms in str(ei.value)
    with pytest.raises(TypeError) as ei:
        DeviceArray(PTR, (4,), bfloat16, DEV0).copy_from_host(np.zeros(4, np.float32))
    assert "ml_dtypes.bfloat16" in str(ei.value)


def test_ml_dtypes_bfloat16_is_bfloat16():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bf = ml_dtypes.bfloat16
    assert _dtypes.is_ml_bfloat16(np.dtype(bf)) and _dtypes.is_ml_bfloat16(bf)
    for dt in (bf, np.dtype(bf), "bfloat16"):
        assert _dtypes.as_dtype(dt) is bfloat16
    a = DeviceArray(PTR, (3,), bf, DEV0)
    assert a.dtype is bfloat16 and a.nbytes == 6
    from driverlevel.ddtree import _logit_dtype

    assert _logit_dtype("logits_dtype", bf) is bfloat16
    values = np.array([1.0, -2.5, 3.0e38], bf)
    bits = values.view(np.uint16)
    np.testing.assert_array_equal(_dtypes.bf16_bits_to_f32(values), values.astype(np.float32))  # read as bits
    np.testing.assert_array_equal(_dtypes.bf16_bits_to_f32(bits), values.astype(np.float32))


def test_copy_from_host_takes_an_ml_dtypes_bfloat16_array_as_its_bits(calls, monkeypatch):
    import ctypes

    ml_dtypes = pytest.importorskip("ml_dtypes")
    host = np.array([[1.0, 2.0], [-0.5, 65280.0]], ml_dtypes.bfloat16)
    seen = []
    monkeypatch.setattr(driver, "cuMemcpyHtoDAsync", lambda dst, src, n, h: seen.append(ctypes.string_at(src, n)) or (OK,))
    DeviceArray(PTR, (2, 2), bfloat16, DEV0).copy_from_host(host)
    assert seen == [host.view(np.uint16).tobytes()]


def test_the_test_extra_brings_ml_dtypes():
    """CI installs '.[test]': without ml_dtypes there, every ml_dtypes test is skipped and cannot fail."""
    import re
    from pathlib import Path

    text = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    test_extra = re.search(r"^test = \[(.*)\]$", text, re.M)
    assert test_extra and re.search(r'"ml_dtypes[^"]*"', test_extra.group(1)), test_extra


# -- the bf16 converters -------------------------------------------------------------------------------------
@pytest.mark.parametrize("f, x, want", [
    (f32_to_bf16, 1.0, 0x3F80), (f32_to_bf16_bits, np.float32(1.0), 0x3F80),
    (round_to_bf16, 1.0, 1.0), (bf16_bits_to_f32, 0x3F80, 1.0), (bf16_bits_to_f32, np.uint16(0x3F80), 1.0),
    (bf16_to_f32, np.uint16(0x3F80), 1.0),
])
def test_bf16_converters_keep_a_scalars_0d_shape(f, x, want):
    got = f(x)
    # (a numpy scalar has .shape == () too: the docstrings promise an array)
    assert isinstance(got, np.ndarray) and got.shape == () and got == want, type(got)
    assert f(np.full((2, 3), x)).shape == (2, 3)


@pytest.mark.parametrize("f", [f32_to_bf16, f32_to_bf16_bits, round_to_bf16])
def test_values_past_the_range_round_to_inf_without_a_warning(f):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's "overflow encountered in cast" would be an error
        got = f([1e39, -1e39, 1.0])
    want = [0x7F80, 0xFF80, 0x3F80] if f is not round_to_bf16 else [np.inf, -np.inf, 1.0]
    assert np.asarray(got).tolist() == want


@pytest.mark.parametrize("f", [f32_to_bf16, f32_to_bf16_bits, round_to_bf16])
@pytest.mark.parametrize("x", [None, "1.5", np.array(["2020-01-01"], dtype="datetime64[D]"),
                               np.array([1, None], dtype=object), np.array([1 + 2j])])
def test_what_is_not_numbers_is_refused(f, x):
    """None became a NaN, a datetime its raw day count, an object array NaN where None was, a complex
    its real part (with numpy's warning): all refused now."""
    with pytest.raises(TypeError, match="takes numbers"):
        f(x)


def test_float64_is_rounded_to_float32_first_as_documented():
    """1 + 2**-8 + 2**-30 lies above the bf16 halfway point 1 + 2**-8, but its float32 rounding is that
    halfway point exactly, which ties to even: 1.0 (0x3F80), not 1.0078125 (0x3F81)."""
    assert int(f32_to_bf16_bits(1 + 2**-8 + 2**-30)) == 0x3F80
    assert int(f32_to_bf16_bits(1 + 2**-8 + 2**-22)) == 0x3F81  # above halfway in float32 too
    assert f32_to_bf16_bits(np.array([True, False])).tolist() == [0x3F80, 0]


def test_both_f32_to_bf16_converters_keep_the_sign_of_nan():
    x = np.array([np.nan, -np.nan, 1.5, -np.inf, 3.4e38], np.float32)
    got = f32_to_bf16_bits(x)
    np.testing.assert_array_equal(got, f32_to_bf16(x))
    assert got[:2].tolist() == [0x7FC0, 0xFFC0]
    assert np.isnan(bf16_bits_to_f32(got[:2])).all() and np.signbit(bf16_bits_to_f32(got[:2])).tolist() == [False, True]


@pytest.mark.parametrize("bits", [1.5, np.array([1.0]), [True], np.float32(2)])
def test_bf16_bits_to_f32_refuses_what_is_not_integer_bits(bits):
    with pytest.raises(TypeError, match="bf16 bit patterns must be integers"):
        bf16_bits_to_f32(bits)


def test_bf16_bits_to_f32_refuses_integers_that_are_no_16_bit_pattern():
    with pytest.raises(ValueError, match=r"\[0, 0xFFFF\]"):
        bf16_bits_to_f32([0x3F80, 0x10000])
    with pytest.raises(ValueError, match=r"\[0, 0xFFFF\]"):
        bf16_bits_to_f32(np.array([-1], np.int32))
    assert bf16_bits_to_f32(np.array([-16512], np.int16)).tolist() == [-1.0]  # int16 0xBF80 by its bits
    assert bf16_bits_to_f32([0x3F80, 0xBF80]).tolist() == [1.0, -1.0]
