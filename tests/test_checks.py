"""The shared argument checks of ``driverlevel._checks`` (CPU only)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from driverlevel import _checks
from driverlevel._checks import positive_int
from driverlevel._mask import bitmask_words
from driverlevel._workspace_formula import partial_workspace_bytes

PACKAGE = Path(__file__).resolve().parent.parent / "driverlevel"


@pytest.mark.parametrize("value", [1, 7, np.int32(3), np.int64(2**40), np.uint8(5)])
def test_positive_int_accepts_python_and_numpy_ints(value):
    out = positive_int("n", value)
    assert out == int(value) and type(out) is int


@pytest.mark.parametrize("value, exc, message", [
    (0, ValueError, "n must be a positive int, got 0"),
    (-3, ValueError, "n must be a positive int, got -3"),
    (np.int64(0), ValueError, "n must be a positive int, got 0"),
    (True, TypeError, "n must be a positive int, got bool True"),
    (2.0, TypeError, "n must be a positive int, got float 2.0"),
    ("4", TypeError, "n must be a positive int, got str '4'"),
    (None, TypeError, "n must be a positive int, got NoneType None"),
])
def test_positive_int_refuses(value, exc, message):
    with pytest.raises(exc) as ei:
        positive_int("n", value)
    assert str(ei.value) == message


def test_the_pure_modules_use_it():
    with pytest.raises(ValueError, match="max_q must be a positive int, got 0"):
        bitmask_words(0)
    with pytest.raises(TypeError, match="tile_rows must be a positive int, got bool"):
        partial_workspace_bytes(8, True)


def test_no_hand_written_positive_int_check_is_left():
    allowed = {"_checks.py"}
    found = sorted(p.name for p in PACKAGE.rglob("*.py") if "must be a positive int" in p.read_text()
                   and p.name not in allowed)
    assert found == []


# -- review15: the helpers the memory API now shares ---------------------------------------------------
def test_int_tuple():
    from driverlevel._checks import int_tuple

    assert int_tuple("shape", 4) == (4,) and int_tuple("shape", ()) == ()
    out = int_tuple("shape", [np.int64(2), np.uint8(3), -1])  # the sign is the caller's to check
    assert out == (2, 3, -1) and all(type(v) is int for v in out)
    assert int_tuple("shape", np.array([5, 6])) == (5, 6)
    for value, words in [
        ((2.9,), "shape must be an int or a sequence of ints, got float 2.9 at index 0 of (2.9,)"),
        (4.7, "shape must be an int or a sequence of ints, got float 4.7"),
        ("4", "shape must be an int or a sequence of ints, got str '4'"),
        (b"4", "shape must be an int or a sequence of ints, got bytes b'4'"),
        (True, "shape must be an int or a sequence of ints, got bool True"),
        ((1, True), "shape must be an int or a sequence of ints, got bool True at index 1 of (1, True)"),
        ((1, None), "shape must be an int or a sequence of ints, got NoneType None at index 1 of (1, None)"),
        (None, "shape must be an int or a sequence of ints, got NoneType None"),
    ]:
        with pytest.raises(TypeError) as ei:
            int_tuple("shape", value)
        assert str(ei.value) == words


def test_power_of_two():
    from driverlevel._checks import power_of_two

    assert [power_of_two("alignment", v) for v in (1, 2, 256, np.int64(4096))] == [1, 2, 256, 4096]
    for value, exc, words in [
        (0, ValueError, "alignment must be a positive power of two, got 0"),
        (-256, ValueError, "alignment must be a positive power of two, got -256"),
        (3, ValueError, "alignment must be a positive power of two, got 3"),
        (True, TypeError, "alignment must be a positive power of two, got bool True"),
        (256.0, TypeError, "alignment must be a positive power of two, got float 256.0"),
        ("256", TypeError, "alignment must be a positive power of two, got str '256'"),
    ]:
        with pytest.raises(exc) as ei:
            power_of_two("alignment", value)
        assert str(ei.value) == words


def test_device_array_arg_refuses_read_only_outputs():
    from types import SimpleNamespace

    from driverlevel import DeviceArray
    from driverlevel._checks import device_array_arg

    dev = SimpleNamespace(ordinal=0)
    ro = DeviceArray(0x10000, (4,), np.float32, dev, readonly=True)
    assert device_array_arg("q", ro, dev) is ro  # read-only inputs are fine
    with pytest.raises(ValueError) as ei:
        device_array_arg("out", ro, dev, writable=True)
    assert str(ei.value) == "out is read-only, but the launch writes it"
    rw = DeviceArray(0x10000, (4,), np.float32, dev)
    assert device_array_arg("out", rw, dev, writable=True) is rw


# -- bool_arg ------------------------------------------------------------------------------------------------
def test_bool_arg():
    import numpy as np

    from driverlevel._checks import bool_arg, is_bool

    assert bool_arg("x", True) is True and bool_arg("x", np.False_) is False
    assert [is_bool(v) for v in (True, np.True_, 1, "yes", None, np.int8(1))] == [True, True, False, False, False,
                                                                                 False]
    with pytest.raises(TypeError, match=r"^flag must be a bool, got str 'no'$"):
        bool_arg("flag", "no")


# -- numpy 1's bool scalar is a bool to the int checks -------------------------------------------------------
class _Numpy1Bool:
    """What numpy 1's ``np.bool_`` looks like to the checks: module numpy, name bool_, and an
    ``__index__`` (deprecated there, gone in numpy 2)."""

    def __init__(self, v):
        self.v = v

    def __index__(self):
        return int(self.v)


_Numpy1Bool.__module__ = "numpy"


_Numpy1Bool.__name__ = "bool_"


def test_int_checks_refuse_numpy1_bools():
    """The mends' note: _checks._as_int refused Python's bool only; numpy 1's bool scalar has
    __index__ and passed as 0 or 1."""
    for check in (_checks.positive_int, _checks.non_negative_int):
        with pytest.raises(TypeError, match="got bool"):
            check("max_q", _Numpy1Bool(True))
    with pytest.raises(TypeError, match="got bool"):
        _checks.int_in_range("depth", _Numpy1Bool(True), 0, 10)
    assert _checks.positive_int("max_q", np.int64(3)) == 3


@pytest.mark.parametrize("dtype, ptr, ok", [(np.float32, 0x1002, False), (np.int64, 0x1004, False),
                                            (np.int64, 0x1008, True), (np.uint8, 0x1001, True)])
def test_device_array_arg_refuses_an_array_off_its_element_alignment(dtype, ptr, ok):
    """A base address that is no multiple of the element size would fault in the kernels' loads (a
    sticky misaligned-address error ends the CUDA context): a ValueError naming the argument instead
    (review finding; DeviceArray itself takes any address)."""
    from types import SimpleNamespace

    import driverlevel as dl

    dev = SimpleNamespace(ordinal=0)
    a = dl.DeviceArray(ptr, (4,), dtype, dev)
    if ok:
        assert _checks.device_array_arg("logits", a, dev) is a
    else:
        with pytest.raises(ValueError, match=f"logits must start on a {np.dtype(dtype).itemsize}-byte aligned"):
            _checks.device_array_arg("logits", a, dev)
