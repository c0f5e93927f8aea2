"""tools/bench_ddtree_ab.py without a GPU: medians per configuration and side, the B - A
difference of the medians, the cumulative parts, and clear errors for files that are not
bench_ddtree results or sides that hold different configurations."""

import importlib.util
import json
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("bench_ddtree_ab", Path(__file__).parents[1] / "tools" / "bench_ddtree_ab.py")
ab = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ab)


def _write(path, rows):
    path.write_text(json.dumps({"device": "test", "results": rows}))
    return str(path)


def _row(batch, budget, build, topk, step, parts=None):
    return {"batch": batch, "budget": budget, "topk": "threshold",
            "gpu_us": {"build": build, "topk": topk, "step": step, "compile": 1.0},
            "build_parts_cumulative_us": parts or []}


def test_medians_and_differences(tmp_path, capsys):
    a = [_write(tmp_path / f"a{i}.json", [_row(1, 16, b, 14.0 + i, 70.0, [7.0, 13.0 + i, 14.0, b])])
         for i, b in enumerate((52.0, 53.0, 60.0))]
    b = [_write(tmp_path / f"b{i}.json", [_row(1, 16, x, 14.0, 57.0)]) for i, x in enumerate((40.0, 39.0))]
    assert ab.main(a + ["--vs"] + b) == 0
    out = capsys.readouterr().out.splitlines()
    build = next(line for line in out if " build " in line).split()
    assert build[:3] == ["1/16", "threshold", "build"]
    assert build[3:6] == ["52.0", "53.0", "60.0"] and build[6:8] == ["40.0", "39.0"]
    assert float(build[-1]) == pytest.approx(39.5 - 53.0)  # medians 53.0 and 39.5
    topk = next(line for line in out if " topk " in line).split()
    assert float(topk[-1]) == pytest.approx(14.0 - 15.0)
    parts = next(line for line in out if "parts" in line)
    assert "A 7.0 14.0 14.0 53.0  B" in parts  # per position medians; B recorded none


def test_sides_with_different_configurations_are_refused(tmp_path, capsys):
    a = _write(tmp_path / "a.json", [_row(1, 16, 50.0, 14.0, 70.0), _row(8, 16, 60.0, 30.0, 90.0)])
    b = _write(tmp_path / "b.json", [_row(1, 16, 50.0, 14.0, 70.0)])
    with pytest.raises(SystemExit) as e:
        ab.main([a, "--vs", b])
    assert e.value.code == 2
    assert "different configurations" in capsys.readouterr().err


def test_a_file_that_is_not_a_result_is_named(tmp_path, capsys):
    good = _write(tmp_path / "a.json", [_row(1, 16, 50.0, 14.0, 70.0)])
    bad = tmp_path / "notes.json"
    bad.write_text('{"device": "x"}')
    for other in (str(bad), str(tmp_path / "missing.json")):
        with pytest.raises(SystemExit) as e:
            ab.main([good, "--vs", other])
        assert e.value.code == 2
        assert Path(other).name in capsys.readouterr().err


def test_the_sessions_own_result_files_compare():
    """The twenty-first session's call 2 (main against the heap switch, jittered rows): the table
    BENCHMARKS quotes (-13.7 µs at 1 / 16)."""
    r = Path(__file__).parents[1] / "benchmarks" / "results" / "2026-12-02-h200-s21-call2-bench_ddtree"
    a = ab.load_side([f"{r}-main-jittered-1.json", f"{r}-main-jittered-2.json"])
    b = ab.load_side([f"{r}-sw-jittered-1.json", f"{r}-sw-jittered-2.json"])
    line = next(x for x in ab.table(a, b) if x.split()[:3] == ["1/16", "threshold", "build"])
    assert float(line.split()[-1]) == pytest.approx(-13.66, abs=0.01)


def test_any_topk_pairs_two_modes(tmp_path, capsys):
    """--any-topk pairs main's threshold rows with a patch's persistent-build rows by batch and
    budget; without it the two sides hold different configurations (exit 2)."""
    a = [_write(tmp_path / "a.json", [_row(8, 256, 49.0, 32.0, 200.0)])]
    fused = dict(_row(8, 256, 45.0, 45.0, 196.0), topk="fused")
    b = [_write(tmp_path / "b.json", [fused])]
    with pytest.raises(SystemExit) as ei:
        ab.main(a + ["--vs"] + b)
    assert ei.value.code == 2 and "different configurations" in capsys.readouterr().err
    assert ab.main(["--any-topk"] + a + ["--vs"] + b) == 0
    build = next(line for line in capsys.readouterr().out.splitlines() if " build " in line).split()
    assert build[:3] == ["8/256", "any", "build"] and float(build[-1]) == pytest.approx(-4.0)


def test_files_measured_differently_are_refused(tmp_path, capsys):
    """A peaked drafter's file against a random drafter's: the difference would be the drafter's, so
    the settings beside the rows must agree (exit 2, naming the setting); one an older file lacks is
    not compared."""
    def write(name, **settings):
        path = tmp_path / name
        path.write_text(json.dumps({"device": "test", **settings, "results": [_row(1, 16, 50.0, 14.0, 70.0)]}))
        return str(path)

    a, b = write("a.json", drafter="peaked", vocab=163840), write("b.json", drafter="random", vocab=163840)
    with pytest.raises(SystemExit) as e:
        ab.main([a, "--vs", b])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "measured differently: drafter is 'peaked' in" in err and "a.json" in err and "b.json" in err
    old = write("old.json")  # (no drafter, no vocab recorded)
    assert ab.main([a, "--vs", old]) == 0


def test_pdl_off_and_on_rows_are_two_configurations(tmp_path, capsys):
    """A --pdl both file's rows: off and on are not pooled as two runs of one configuration."""
    rows = [dict(_row(1, 16, 33.0, 16.0, 46.0), pdl=False), dict(_row(1, 16, 30.0, 15.0, 44.0), pdl=True)]
    a = _write(tmp_path / "a.json", rows)
    assert ab.main([a, "--vs", a]) == 0
    builds = [line.split() for line in capsys.readouterr().out.splitlines() if " build " in line]
    assert [(x[1], x[3]) for x in builds] == [("threshold/nopdl", "33.0"), ("threshold/pdl", "30.0")]


def test_a_missing_file_is_said_to_be_missing(tmp_path, capsys):
    good = _write(tmp_path / "a.json", [_row(1, 16, 50.0, 14.0, 70.0)])
    with pytest.raises(SystemExit):
        ab.main([good, "--vs", str(tmp_path / "missing.json")])
    assert "missing.json: cannot read it" in capsys.readouterr().err


@pytest.mark.parametrize("rows, words", [
    ([1], "a row is 1, not an object"),
    ([_row(1, 16, 50.0, 14.0, 70.0), "x"], 'a row is "x", not an object'),
    ([None], "a row is null, not an object"),
])
@pytest.mark.parametrize("side", ["a", "b"])
def test_a_row_that_is_not_an_object_is_a_one_line_error(tmp_path, capsys, rows, words, side):
    """``{"results": [1]}`` on either side ended in an AttributeError traceback ('int' object has no
    attribute 'get'), exit status 1: now the one-line error of the other malformed rows, exit 2."""
    good = _write(tmp_path / "good.json", [_row(1, 16, 50.0, 14.0, 70.0)])
    bad = _write(tmp_path / "bad.json", rows)
    with pytest.raises(SystemExit) as e:
        ab.main([bad, "--vs", good] if side == "a" else [good, "--vs", bad])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"bad.json: not a bench_ddtree result file (TypeError: {words})" in err, err


@pytest.mark.parametrize("a_rows, b_rows, words", [
    ([], [], "nothing to compare: side A's files hold no rows"),
    ([_row(1, 16, 50.0, 14.0, 70.0)], [], "nothing to compare: side B's files hold no rows"),
    ([], [_row(1, 16, 50.0, 14.0, 70.0)], "nothing to compare: side A's files hold no rows"),
    # rows with none in common: nothing is compared either (the sides' configurations differ, exit 2 as before)
    ([_row(1, 16, 50.0, 14.0, 70.0)], [_row(8, 64, 50.0, 14.0, 70.0)],
     "nothing to compare: the two sides hold different configurations, none in common: A [(1, 16, 'threshold', "
     "None)], B [(8, 64, 'threshold', None)]"),
])
def test_sides_with_nothing_to_compare_are_refused(tmp_path, capsys, a_rows, b_rows, words):
    """``{"results": []}`` against itself printed an empty table, exit status 0."""
    a, b = _write(tmp_path / "a.json", a_rows), _write(tmp_path / "b.json", b_rows)
    with pytest.raises(SystemExit) as e:
        ab.main([a, "--vs", b])
    assert e.value.code == 2
    out = capsys.readouterr()
    assert out.err == f"bench_ddtree_ab.py: error: {words}\n" or out.err.endswith(f": error: {words}\n"), out.err
    assert out.out == ""


def test_an_empty_file_beside_one_with_rows_still_compares(tmp_path, capsys):
    """Emptiness is judged per side: a side's other files hold its configurations."""
    row = [_row(1, 16, 50.0, 14.0, 70.0)]
    a = [_write(tmp_path / "a1.json", row), _write(tmp_path / "a2.json", [])]
    assert ab.main(a + ["--vs", _write(tmp_path / "b.json", row)]) == 0
    assert " build " in capsys.readouterr().out


def test_configurations_with_and_without_pdl_are_named_not_a_traceback(tmp_path, capsys):
    """A row that records pdl against one that does not: the differing configurations are listed (sorting
    them compared None with a bool: a TypeError traceback)."""
    off = dict(_row(1, 16, 33.0, 16.0, 46.0), pdl=False)
    a = _write(tmp_path / "a.json", [_row(1, 16, 50.0, 14.0, 70.0), off])
    b = _write(tmp_path / "b.json", [dict(_row(1, 16, 30.0, 15.0, 44.0), pdl=True), off])
    with pytest.raises(SystemExit) as e:
        ab.main([a, "--vs", b])
    assert e.value.code == 2
    assert capsys.readouterr().err.endswith("different configurations: [(1, 16, 'threshold', None), "
                                            "(1, 16, 'threshold', True)]\n")
