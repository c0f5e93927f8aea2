"""CPU tests of driverlevel._constants, the one source of the constants that Python and the
DDTree / runner kernels share (issue 13 item 3)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np
import pytest

import driverlevel as dl
from driverlevel import _constants, ddtree, runner
from driverlevel.reference import ddtree as ref

PKG = Path(dl.__file__).resolve().parent


def test_every_kernel_constant_is_required_by_constants_cuh():
    """constants.cuh stops a compile without any of them (#error); the kernels spell no value of
    their own (each of their names of a shared constant is ``= DL_<NAME>``)."""
    cu = dl._compile.kernel_source_dir()
    text = (cu / "constants.cuh").read_text()
    required = set(re.findall(r"#ifndef DL_(\w+)\n#error", text))
    assert required == set(_constants.KERNEL_CONSTANTS)
    runner_cu = (cu / "runner.cu").read_text()
    assert '#include "constants.cuh"' in runner_cu
    for name, value in re.findall(r"constexpr int (k\w+) = (\w+);", runner_cu):
        assert value.startswith("DL_") and value[3:] in _constants.KERNEL_CONSTANTS, (name, value)
    assert _constants.kernel_defines() == {f"DL_{n}": getattr(_constants, n) for n in _constants.KERNEL_CONSTANTS}


def test_launchers_and_reference_re_export_the_same_values():
    for mod in (ddtree, ref):
        for name in ("STATUS_POOL_EXHAUSTED", "STATUS_CONTEXT_FULL", "STATUS_KV_CAPACITY", "STATUS_MASK_CAPACITY",
                     "STATUS_NONFINITE", "FINISH_DONE", "FINISH_NONFINITE", "RECORD_HEADER", "LP_FLOOR"):
            assert getattr(mod, name) == getattr(_constants, name), (mod.__name__, name)
    for name in ("RECORD_HEADER", "RING_HEADER", "STATUS_NONFINITE", "FINISH_DONE", "FINISH_NONFINITE"):
        assert getattr(runner, name) == getattr(_constants, name)
    assert ddtree.MAX_DEPTH == _constants.MAX_DEPTH and ddtree.MAX_BUDGET == _constants.MAX_BUDGET
    assert _constants.LP_FLOOR == float(np.finfo(np.float32).min)
    # status bits are distinct single bits; one name per bit
    bits = [v for k, v in vars(_constants).items() if k.startswith("STATUS_")]
    assert len(bits) == len(set(bits)) and all(b & (b - 1) == 0 for b in bits)
    assert not hasattr(runner, "STATUS_POOL_EMPTY")


@pytest.mark.parametrize("budget, words", [(1, 1), (31, 1), (32, 2), (63, 2), (511, 16), (512, 17)])
def test_mask_words(budget, words):
    assert _constants.mask_words(budget) == words == ref.mask_words(budget)


def _imports(path: Path) -> set:
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level:  # relative to driverlevel (these modules sit in it)
                mod = "driverlevel." + mod if mod else "driverlevel"
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


@pytest.mark.parametrize("name", ["ddtree.py", "runner.py", "_constants.py"])
def test_the_product_does_not_import_the_reference(name):
    assert not any(m.startswith("driverlevel.reference") for m in _imports(PKG / name))


def test_the_reference_imports_the_neutral_module_not_the_product():
    imps = _imports(PKG / "reference" / "ddtree.py")
    assert "driverlevel._constants" in imps
    assert not any(m.startswith(("driverlevel.ddtree", "driverlevel.runner")) for m in imps)


def test_capture_demo_ranges_derive_from_the_plan_limits():
    from driverlevel.demo.capture_demo import capture_demo

    opts = {p.name: p for p in capture_demo.params}
    assert (opts["depth_limit"].type.min, opts["depth_limit"].type.max) == (1, _constants.MAX_DEPTH)
    assert (opts["budget"].type.min, opts["budget"].type.max) == (1, _constants.MAX_BUDGET)


# -- mask_words takes ints only ------------------------------------------------------------------------------
@pytest.mark.parametrize("budget, exc, words", [
    (31.9, TypeError, "^budget must be an int >= 0, got float 31.9$"),  # was mask_words(31) == 1
    (False, TypeError, "^budget must be an int >= 0, got bool False$"),
    (-1, ValueError, "^budget must be an int >= 0, got -1$"),
])
def test_mask_words_refuses_what_is_not_an_int(budget, exc, words):
    from driverlevel._constants import mask_words

    with pytest.raises(exc, match=words):
        mask_words(budget)


def test_mask_words_of_ints():
    from driverlevel._constants import mask_words

    assert [mask_words(b) for b in (0, 30, 31, 32, np.int64(512))] == [1, 1, 1, 2, 17]
