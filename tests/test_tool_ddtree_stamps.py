"""tools/ddtree_stamps.py without a GPU: its argument checks, the parsing of the kernel's stamp
lines into per-phase cycles, and the stamped ddtree.cu compiling (NVRTC) while the plain build
stays free of the instrumentation."""

import importlib.util
from pathlib import Path

import pytest

import driverlevel as dl
from driverlevel import ddtree

_spec = importlib.util.spec_from_file_location("ddtree_stamps", Path(__file__).parents[1] / "tools" / "ddtree_stamps.py")
stamps = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(stamps)


def test_argument_ranges():
    assert stamps.parse_args([]).batch == [1, 8]
    with pytest.raises(SystemExit):
        stamps.parse_args(["--batch", "0"])
    with pytest.raises(SystemExit):
        stamps.parse_args(["--budget", "600"])


def test_lines_to_phases():
    lines = ["unrelated output",
             "ddt 0 3 merge 0 1000", "ddt 0 3 loaded 1500 1400", "ddt 0 3 selected 0 2400",
             "ddt 0 3 lse 0 2500", "ddt 0 3 sorted 0 3100",
             "ddt 0 7 merge 0 50", "ddt 0 7 loaded 1400 350", "ddt 0 7 selected 0 1550",
             "ddt 0 7 lse 0 1650", "ddt 0 7 sorted 0 2150", "ddt 0 7 last 0 2300", "ddt 0 7 lp 0 2700",
             "ddt 0 7 depth 1 2900", "ddt 0 7 depth 2 3400", "ddt 0 7 generated 90 3500",
             "ddt 0 7 searched 256 4500", "ddt 0 7 nodes 257 5000"]
    ctas = stamps.parse_lines(lines)
    assert sorted(ctas) == [(0, 3), (0, 7)] and ctas[(0, 3)][1] == ("loaded", 1500, 1400)
    ph = stamps.phases(ctas)
    assert sorted(ph["loaded"]) == [300, 400] and sorted(ph["selected"]) == [1000, 1200]
    assert ph["depth  1"] == [200] and ph["depth  2"] == [500] and ph["searched"] == [1000]
    rows = stamps.report(ph, 2_000_000)
    assert rows[1].split()[0] == "loaded" and rows[1].split()[2] == "350"
    assert any(r.startswith("depth  2") for r in rows) and rows[-1].startswith("nodes")


def test_stamped_build_compiles_and_the_plain_one_has_no_printf():
    plain = dl.runtime.compile_file("ddtree.cu", "sm_90", ddtree.compile_defines("sm_90"))
    stamped = dl.runtime.compile_file("ddtree.cu", "sm_90", {**ddtree.compile_defines("sm_90"), "DL_DDTREE_STAMPS": 1})
    assert stamped.resources["ddtree_build"].spills == 0
    assert plain.resources["ddtree_build"].stack_bytes == 0  # no printf frame
    assert stamped.resources["ddtree_build"].stack_bytes > 0
