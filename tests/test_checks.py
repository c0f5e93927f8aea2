"""The shared argument checks of ``driverlevel._checks`` (CPU only)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

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
