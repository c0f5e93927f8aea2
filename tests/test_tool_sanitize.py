"""tools/sanitize.sh without a GPU (CPU only): its help, its refusal of unknown runs before anything runs,
and its summary of each run, with a stand-in for compute-sanitizer that records its arguments."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tools" / "sanitize.sh"

STUB = """#!/usr/bin/env bash
# a compute-sanitizer stand-in: records its arguments, prints a summary per tool, exits as the real one would
echo "$@" >> "$STUB_LOG"
echo "${DRIVERLEVEL_LINEINFO:-unset}" > "$STUB_LOG.lineinfo"
[ "$1" = --version ] && { echo "Version 2099.1"; exit 0; }
case "$2" in  # (pytest -q's last line first: STUB_PYTEST, default three tests passed)
  memcheck)  echo "${STUB_PYTEST:-3 passed in 0.50s}"; echo "========= ERROR SUMMARY: 0 errors"; exit 0 ;;
  racecheck) echo "${STUB_PYTEST:-3 passed in 0.50s}"
             echo "========= RACECHECK SUMMARY: 2 hazards displayed (2 errors, 0 warnings)"; exit 97 ;;
  synccheck) sleep 5; exit 0 ;;
esac
exit 3
"""


def _run(tmp_path, *args, env=None):
    stub = tmp_path / "compute-sanitizer"
    stub.write_text(STUB)
    stub.chmod(0o755)
    own = ("K", "SANITIZER_ARGS", "PLAN", "LINEINFO", "TIMEOUT", "PRINT_LIMIT", "JOBS")  # settings (and old ones): the test's only
    e = dict({k: v for k, v in os.environ.items() if k not in own}, SANITIZER=str(stub), STUB_LOG=str(tmp_path / "calls.txt"), OUT=str(tmp_path / "out"),
             PYTHON=sys.executable, **(env or {}))
    r = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=e, timeout=60)
    calls = (tmp_path / "calls.txt").read_text().splitlines() if (tmp_path / "calls.txt").exists() else []
    return r, [c for c in calls if c != "--version"]


@pytest.mark.parametrize("args", [["--help"], ["memcheck:step", "-h"], ["-k", "x", "--help", "racecheck:ddtree"]])
def test_help_prints_the_header_and_runs_nothing(tmp_path, args):
    r, calls = _run(tmp_path, *args)
    assert r.returncode == 0 and calls == []
    assert "memcheck" in r.stdout and "GROUP is one of" in r.stdout and "#" not in r.stdout.splitlines()[0]


@pytest.mark.parametrize("run, words", [("memcheck:nope", "unknown group 'nope'"),
                                        ("leakcheck:ddtree", "unknown tool 'leakcheck'")])
def test_an_unknown_run_is_refused_before_any_run(tmp_path, run, words):
    r, calls = _run(tmp_path, "memcheck:step", run)
    assert r.returncode == 2 and words in r.stderr and calls == []


def test_each_run_is_summarised_with_the_sanitizers_own_line(tmp_path):
    r, calls = _run(tmp_path, "memcheck:step", "racecheck:ddtree", "synccheck:verify", "--timeout", "2")
    assert r.returncode == 1, r.stdout + r.stderr
    table = r.stdout[r.stdout.index("=== summary"):].splitlines()
    assert table[2].split()[:3] == ["memcheck", "step", "clean"] and "ERROR SUMMARY: 0 errors" in table[2]
    assert table[3].split()[:3] == ["racecheck", "ddtree", "ERRORS"] and "2 hazards displayed" in table[3]
    assert table[4].split()[:3] == ["synccheck", "verify", "timeout"]
    extra = {"memcheck": ["--report-api-errors", "no"], "racecheck": [], "synccheck": []}
    assert len(calls) == 3 and all(
        c.split()[:6 + len(extra[t])] == ["--tool", t, *extra[t], "--error-exitcode", "97", "--print-limit", "30"]
        for c, t in zip(calls, ["memcheck", "racecheck", "synccheck"]))
    assert calls[0].endswith("-m pytest -q -m gpu -p no:cacheprovider tests/test_decode_step_fuzz_gpu.py")
    assert "tests/test_ddtree_robust_gpu.py tests/test_ddtree_gpu.py -k corrupted or poisoned or" in calls[1]
    assert calls[2].endswith("tests/test_verify_attention_gpu.py -k corrupted or more_than_max_q or padded or one_long "
                             "or int32_index or device_schedule or 1000_random or pool_of_pool_bytes or batches_ragged "
                             "or more_splits")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "memcheck-step.log", "racecheck-ddtree.log", "synccheck-verify.log"]


@pytest.mark.parametrize("lineinfo, seen", [("1", "1"), ("0", "unset")])
def test_the_plan_from_the_environment_and_lineinfo(tmp_path, monkeypatch, lineinfo, seen):
    monkeypatch.delenv("DRIVERLEVEL_LINEINFO", raising=False)
    r, calls = _run(tmp_path, env={"PLAN": "memcheck:step", "LINEINFO": lineinfo})
    assert r.returncode == 0 and len(calls) == 1 and calls[0].startswith("--tool memcheck")
    assert (tmp_path / "calls.txt.lineinfo").read_text().strip() == seen


def test_the_default_plan_racechecks_the_verify_kernel_too(tmp_path):
    """Since the warp roles' barriers were paired (2026-12-05), racecheck reports no false hazard on the verify
    kernel: the default plan gains racecheck of the seven verify tests that showed the 59 (the whole verify group
    takes longer than 300 s under racecheck)."""
    r, calls = _run(tmp_path, "--timeout", "2")  # (the stand-in's racecheck reports 2 hazards; its synccheck sleeps 5 s)
    assert r.returncode == 1, r.stdout + r.stderr
    assert [c.split()[1] for c in calls] == ["memcheck", "memcheck", "memcheck", "racecheck", "synccheck", "racecheck"]
    assert calls[-1].endswith("tests/test_verify_schedule_gpu.py tests/test_verify_attention_gpu.py -k (padded or "
                              "int32_index or batches_ragged or more_splits) and not 200k")
    table = r.stdout[r.stdout.index("=== summary"):].splitlines()
    assert table[1].index("status") == table[-1].index("clean" if "clean" in table[-1] else "ERRORS")  # columns line up
    assert [row.split()[:2] for row in table[2:]] == [
        ["memcheck", "ddtree"], ["memcheck", "verify"], ["memcheck", "step"], ["racecheck", "ddtree"],
        ["synccheck", "ddtree"], ["racecheck", "verify-race"]]


def test_no_sanitizer_is_a_clear_error(tmp_path):
    e = dict(os.environ, SANITIZER=str(tmp_path / "missing"), OUT=str(tmp_path / "out"), TIMEOUT="5")
    r = subprocess.run(["bash", str(SCRIPT), "memcheck:step"], capture_output=True, text=True, env=e, timeout=60)
    assert r.returncode == 2 and f"SANITIZER='{tmp_path / 'missing'}' is not an executable file" in r.stderr
    # the old variable's note comes first, on a machine without a sanitizer too (the fresh-user trial: it did not)
    assert r.stderr.startswith("sanitize.sh: note: the environment's TIMEOUT is not read")
    bare = tmp_path / "bin"  # none set, none on PATH, none under /usr/local/cuda*/bin (skipped where one is)
    bare.mkdir()
    if any(Path("/usr/local").glob("cuda*/bin/compute-sanitizer")):
        return
    e = dict({k: v for k, v in os.environ.items() if k != "SANITIZER"}, OUT=str(tmp_path / "out"),
             PATH=f"{bare}:/usr/bin:/bin")
    r = subprocess.run(["bash", str(SCRIPT), "memcheck:step"], capture_output=True, text=True, env=e, timeout=60)
    assert r.returncode == 2 and "no compute-sanitizer found (set SANITIZER to its path)" in r.stderr


@pytest.mark.parametrize("args, env, words", [
    (["-x"], {}, "unknown option '-x'"),
    (["memcheck"], {}, "'memcheck' is not a TOOL:GROUP pair"),
    ([], {"PLAN": " "}, "no run to do (PLAN is empty)"),
    (["memcheck:step", "--timeout", "abc"], {}, "--timeout 'abc' must be a whole number of seconds, 1 or more"),
    (["memcheck:step", "-t", "1.5"], {}, "--timeout '1.5' must be a whole number of seconds"),
    (["memcheck:step"], {"LINEINFO": "maybe"}, "LINEINFO='maybe' is not understood"),
])
def test_settings_are_checked_before_the_sanitizer_is_looked_for_and_nothing_is_left(tmp_path, args, env, words):
    e = dict(os.environ, SANITIZER=str(tmp_path / "missing"), TMPDIR=str(tmp_path), **env)
    e.pop("OUT", None)
    r = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=e, timeout=60)
    assert r.returncode == 2 and words in r.stderr and "compute-sanitizer" not in r.stderr, r.stderr
    assert list(tmp_path.iterdir()) == []  # no empty log directory left behind


@pytest.mark.parametrize("value", ["yes", "On", "true"])
def test_lineinfo_takes_what_driverlevel_takes(tmp_path, monkeypatch, value):
    monkeypatch.delenv("DRIVERLEVEL_LINEINFO", raising=False)
    r, calls = _run(tmp_path, "memcheck:step", env={"LINEINFO": value})
    assert r.returncode == 0 and (tmp_path / "calls.txt.lineinfo").read_text().strip() == "1"


def test_the_groups_select_what_their_help_says():
    """The -k expressions select the counts the header gives (collected on the CPU, where GPU tests skip)."""
    import re

    text = SCRIPT.read_text()
    for group, want in (("ddtree", 22), ("verify", 23)):
        var = "DDTREE_K" if group == "ddtree" else "VERIFY_K"
        k = " ".join(re.findall(rf'^{var}="(?:\${var} )?([^"]*)"', text, re.M))
        files = {"ddtree": ["tests/test_ddtree_robust_gpu.py", "tests/test_ddtree_gpu.py"],
                 "verify": ["tests/test_verify_schedule_gpu.py", "tests/test_verify_attention_gpu.py"]}[group]
        r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                            *files, "-k", k], capture_output=True, text=True, cwd=REPO, timeout=120)
        got = re.search(r"(\d+)/\d+ tests collected", r.stdout)
        assert got and int(got.group(1)) == want, (group, k, r.stdout[-300:])
        assert f"({want} tests)" in text


def test_k_replaces_the_groups_expression_and_sanitizer_args_reach_every_run(tmp_path):
    r, calls = _run(tmp_path, "-k", "test_build_matches_reference and 3001", "racecheck:ddtree", "memcheck:step",
                    env={"SANITIZER_ARGS": "--racecheck-report hazard"})
    assert r.returncode == 1 and len(calls) == 2, r.stdout + r.stderr
    assert calls[0].startswith("--tool racecheck --racecheck-report hazard --error-exitcode 97")
    assert calls[0].endswith("tests/test_ddtree_gpu.py -k test_build_matches_reference and 3001")
    assert calls[1].startswith("--tool memcheck --report-api-errors no --racecheck-report hazard")
    assert calls[1].endswith("tests/test_decode_step_fuzz_gpu.py -k test_build_matches_reference and 3001")


def test_an_empty_k_runs_the_group_files_whole(tmp_path):
    r, calls = _run(tmp_path, "memcheck:ddtree", "-k", "")
    assert r.returncode == 0 and calls[0].endswith("tests/test_ddtree_robust_gpu.py tests/test_ddtree_gpu.py")


def test_runs_at_once_keep_the_summarys_order_and_status(tmp_path):
    # synccheck's stand-in sleeps 5 s and is cut at 2: the slow run first, the others finish before it
    r, calls = _run(tmp_path, "-t", "2", "synccheck:verify", "memcheck:step", "racecheck:ddtree", "--jobs=3")
    assert r.returncode == 1, r.stdout + r.stderr
    table = r.stdout[r.stdout.index("=== summary"):].splitlines()
    assert [t.split()[:3] for t in table[2:5]] == [["synccheck", "verify", "timeout"], ["memcheck", "step", "clean"],
                                                   ["racecheck", "ddtree", "ERRORS"]]
    assert len(calls) == 3
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "memcheck-step.log", "racecheck-ddtree.log", "synccheck-verify.log"]
    (tmp_path / "b").mkdir()  # three runs, two at a time: the third waits for a slot
    ok, calls = _run(tmp_path / "b", "-j", "2", "memcheck:step", "memcheck:ddtree", "memcheck:verify")
    assert ok.returncode == 0 and ok.stdout.count(" clean ") == 3 and len(calls) == 3, ok.stdout
    table = ok.stdout[ok.stdout.index("=== summary"):].splitlines()
    assert [t.split()[1] for t in table[2:5]] == ["step", "ddtree", "verify"]


def test_a_run_named_twice_is_refused(tmp_path):
    r, calls = _run(tmp_path, "memcheck:step", "racecheck:ddtree", "memcheck:step")
    assert r.returncode == 2 and "a run named twice: memcheck:step" in r.stderr and calls == []


@pytest.mark.parametrize("jobs", ["0", "two", "-1"])
def test_jobs_must_be_a_positive_count(tmp_path, jobs):
    r, calls = _run(tmp_path, "memcheck:step", "--jobs", jobs)
    assert r.returncode == 2 and f"--jobs '{jobs}'" in r.stderr and calls == []


@pytest.mark.parametrize("args, words", [(["-k"], "-k needs an expression"), (["--timeout"], "--timeout needs"),
                                         (["-j"], "-j needs a number"), (["--timeout=0"], "--timeout '0' must be"),
                                         (["--verbose"], "unknown option '--verbose'"),
                                         (["-k", "a", "-k", "b"], "-k given twice"),
                                         (["--", "-k"], "'-k' is not a TOOL:GROUP pair"),
                                         (["-j0"], "--jobs '0' must be a whole number")])
def test_an_option_without_its_value_or_unknown_is_refused(tmp_path, args, words):
    r, calls = _run(tmp_path, "memcheck:step", *args)
    assert r.returncode == 2 and words in r.stderr and calls == [], r.stderr


def test_the_shells_k_timeout_and_jobs_change_nothing(tmp_path):
    """The old settings' names are common in shells and CI: inherited, they must not narrow or cut a run (a
    note says they are not read)."""
    r, calls = _run(tmp_path, "memcheck:ddtree", env={"K": "nothing_matches_this", "TIMEOUT": "abc", "JOBS": "0"})
    assert r.returncode == 0, r.stdout + r.stderr
    for name in ("K", "TIMEOUT", "JOBS"):
        assert f"the environment's {name} is not read" in r.stderr
    assert "tests/test_ddtree_gpu.py -k corrupted or poisoned or nonfinite" in calls[0], calls  # the group's own -k
    assert "nothing_matches_this" not in calls[0]


@pytest.mark.parametrize("pytest_line", ["22 skipped, 114 deselected in 0.31s", "1 skipped in 0.20s",
                                         "no tests ran in 0.05s"])
def test_a_run_in_which_no_test_passed_is_not_clean(tmp_path, pytest_line):
    """All skipped (no GPU visible: tests/conftest.py skips) or none selected: the sanitizer saw no kernel."""
    r, calls = _run(tmp_path, "memcheck:step", "memcheck:ddtree", env={"STUB_PYTEST": pytest_line})
    assert r.returncode == 1 and len(calls) == 2, r.stdout + r.stderr
    table = r.stdout[r.stdout.index("=== summary"):].splitlines()
    for row, group in zip(table[2:4], ("step", "ddtree")):
        assert row.split()[:3] == ["memcheck", group, "no-pass"] and "(no test passed)" in row, row
    (tmp_path / "b").mkdir()
    ok, _ = _run(tmp_path / "b", "memcheck:step", env={"STUB_PYTEST": "1 passed, 2 skipped in 3.1s"})
    assert ok.returncode == 0 and " clean " in ok.stdout


def test_a_relative_out_is_the_callers(tmp_path):
    stub = tmp_path / "compute-sanitizer"
    stub.write_text(STUB)
    stub.chmod(0o755)
    e = dict({k: v for k, v in os.environ.items() if k not in ("K", "PLAN", "JOBS", "TIMEOUT")}, SANITIZER=str(stub),
             STUB_LOG=str(tmp_path / "calls.txt"), OUT="rel/logs", PYTHON=sys.executable)
    r = subprocess.run(["bash", str(SCRIPT), "memcheck:step"], capture_output=True, text=True, env=e, cwd=tmp_path,
                       timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "rel" / "logs" / "memcheck-step.log").is_file()
    assert not (REPO / "rel").exists()


def test_attached_values_and_leading_zeros(tmp_path):
    r, calls = _run(tmp_path, "-kfoo and bar", "-t05", "-j02", "memcheck:step", "memcheck:ddtree")
    assert r.returncode == 0 and len(calls) == 2, r.stdout + r.stderr
    assert all(c.endswith("-k foo and bar") for c in calls), calls
    assert "memcheck ddtree done:" in r.stdout or "memcheck step done:" in r.stdout  # (printed with --jobs > 1)


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_an_interrupt_stops_every_run_and_prints_the_summary_so_far(tmp_path, jobs):
    """Ctrl-C reaches the script's process group, not the runs' (timeout gives each its own): the script stops
    them itself, starts no other, and says which were stopped and which never started (exit 130)."""
    stub = tmp_path / "compute-sanitizer"
    stub.write_text('#!/usr/bin/env bash\n[ "$1" = --version ] && { echo "Version 1"; exit 0; }\n'
                    'echo "$$" >> "$STUB_PIDS"\nsleep 60\necho "3 passed"\n')
    stub.chmod(0o755)
    pids = tmp_path / "pids"
    e = dict({k: v for k, v in os.environ.items() if k not in ("K", "PLAN", "JOBS", "TIMEOUT")}, SANITIZER=str(stub),
             STUB_PIDS=str(pids), OUT=str(tmp_path / "out"), PYTHON=sys.executable)
    p = subprocess.Popen(["bash", str(SCRIPT), "-j", jobs, "-t", "90", "memcheck:step", "memcheck:ddtree",
                          "racecheck:ddtree"], env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (not pids.exists() or len(pids.read_text().split()) < int(jobs)):
        time.sleep(0.1)
    assert pids.exists(), "no run started"
    os.killpg(p.pid, signal.SIGINT)
    out, _ = p.communicate(timeout=30)
    assert p.returncode == 130, out
    table = out[out.index("=== summary"):].splitlines()
    started = ["memcheck:step", "memcheck:ddtree"][:int(jobs)]
    for row, run in zip(table[2:], started):
        assert row.split()[:3] == [*run.split(":"), "interrupted"], row
    not_started = ["memcheck:step", "memcheck:ddtree", "racecheck:ddtree"][int(jobs):]
    assert f"(interrupted: not started: {' '.join(not_started)})" in out
    time.sleep(0.5)
    for pid in pids.read_text().split():  # no run left behind
        assert not Path(f"/proc/{pid}").exists(), f"sanitizer stand-in {pid} still runs"
