"""tools/ncu_stalls.py without a GPU: an ncu source-page CSV (the layout ``ncu --page source
--print-source sass --csv`` prints: a kernel-name line, then the header) turned into stall totals,
per-block sums and the top instructions; bad files and ranges are refused with a clear message."""

import csv
import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("ncu_stalls", Path(__file__).parents[1] / "tools" / "ncu_stalls.py")
ncu_stalls = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ncu_stalls)

HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Warp Stall Sampling (Not-issued Samples)",
          "Instructions Executed", "stall_barrier", "stall_no_inst", "stall_wait", "stall_no_inst (Not Issued)"]


def write_csv(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["Kernel Name", "ddtree_build", ""])
        w.writerow(HEADER)
        for i, (sass, barrier, no_inst, wait, executed) in enumerate(rows):
            w.writerow([hex(0x1000 + 16 * i), f"      {sass}", barrier + no_inst + wait, no_inst, executed,
                        barrier, no_inst, wait, 99])  # the not-issued column must not be counted


@pytest.fixture
def sample_csv(tmp_path):
    p = tmp_path / "k-sass.csv"
    write_csv(p, [("LDS R1, [R2]", 0, 3, 5, 16), ("BAR.SYNC 0x0", 40, 0, 0, 32), ("IADD3 R1, R1, 1, RZ", 0, 7, 1, 16),
                  ("EXIT", 0, 0, 0, 0)])
    return p


def test_rows_and_reasons(sample_csv):
    rows = ncu_stalls.read_rows(sample_csv)
    assert [r["sass"] for r in rows] == ["LDS R1, [R2]", "BAR.SYNC 0x0", "IADD3 R1, R1, 1, RZ", "EXIT"]
    assert [r["samples"] for r in rows] == [8, 40, 8, 0]
    assert rows[1]["executed"] == 32
    assert ncu_stalls.by_reason(rows) == [("barrier", 40), ("no_inst", 10), ("wait", 6)]
    assert ncu_stalls.by_reason(rows[2:]) == [("no_inst", 7), ("wait", 1)]


def test_report_with_range_and_blocks(sample_csv, capsys):
    assert ncu_stalls.main([str(sample_csv), "--range", "0", "3", "--block", "2", "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert "SASS rows 0..2 of 4, 56 samples" in out
    assert "barrier 40 (71%), no_inst 10 (18%), wait 6 (11%)" in out
    # blocks [0, 2) = 48 samples and [2, 4) = 8 samples, both >= 1%
    assert "     0      48  executed 16..32" in out and "     2       8  executed 16..16" in out
    top = out.split("top 2 instructions:")[1].splitlines()
    assert "BAR.SYNC 0x0" in top[1] and "barrier 40" in top[1]
    assert len([ln for ln in top if ln.strip()]) == 2


@pytest.mark.parametrize("argv, msg", [(["--range", "3", "3"], "--range must lie in [0, 4]"),
                                       (["--range", "0", "9"], "--range must lie in [0, 4]"),
                                       (["--block", "0"], "--block must be >= 1")])
def test_bad_arguments(sample_csv, capsys, argv, msg):
    with pytest.raises(SystemExit):
        ncu_stalls.main([str(sample_csv), *argv])
    assert msg in capsys.readouterr().err


def test_not_a_source_page(tmp_path, capsys):
    p = tmp_path / "details.csv"
    p.write_text('"ID","Kernel Name","Metric Name"\n"0","ddtree_build","Duration"\n')
    with pytest.raises(SystemExit):
        ncu_stalls.main([str(p)])
    assert "no 'Warp Stall Sampling (All Samples)' column" in capsys.readouterr().err
