"""tools/tool_output.py: a tool whose standard output cannot be written (``> /dev/full``, ``| head``,
a closed descriptor) says so in one line on stderr and exits 2, not with a traceback and status 1
(which sass_compare.py uses for "a kernel differs")."""

import errno
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
_spec = importlib.util.spec_from_file_location("tool_output", ROOT / "tools" / "tool_output.py")
tool_output = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tool_output)


@pytest.mark.parametrize("err", [BrokenPipeError(errno.EPIPE, "Broken pipe"), OSError(errno.ENOSPC, "No space left on device")])
def test_a_failed_write_is_one_line_and_status_2(err, capsys, monkeypatch):
    monkeypatch.setattr(os, "dup2", lambda *a: None)  # (pytest's captured stdout stays as it is)

    def main():
        raise err

    assert tool_output.run(main, "tools/x.py") == 2
    assert capsys.readouterr().err == f"tools/x.py: cannot write the output: {err.strerror}\n"


def test_other_errors_and_statuses_pass_through():
    assert tool_output.run(lambda: 1, "tools/x.py") == 1

    def exits():
        sys.exit(3)

    assert tool_output.run(exits, "tools/x.py") == 3
    with pytest.raises(FileNotFoundError):  # (an OSError naming a file is the tool's own error)
        tool_output.run(lambda: open("/nonexistent/x"), "tools/x.py")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_tool_writing_to_a_full_disk(tmp_path):
    """bench_ddtree_ab.py's table to /dev/full: one line, exit 2."""
    f = tmp_path / "a.json"
    f.write_text(json.dumps({"device": "test", "results": [
        {"batch": 1, "budget": 16, "topk": "threshold", "gpu_us": {"build": 30.0, "topk": 15.0, "step": 44.0}}]}))
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, str(ROOT / "tools" / "bench_ddtree_ab.py"), str(f), "--vs", str(f)],
                           stdout=full, stderr=subprocess.PIPE, text=True)
    assert r.returncode == 2
    assert r.stderr == "tools/bench_ddtree_ab.py: cannot write the output: No space left on device\n"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("unbuffered", ["", "1"], ids=["buffered", "unbuffered"])
def test_help_to_a_full_disk_is_a_failed_write_too(unbuffered):
    """argparse swallows an OSError of its own --help write: with unbuffered output (or a device that
    fails at once) the tool exited 0 having printed nothing."""
    env = dict(os.environ, PYTHONUNBUFFERED=unbuffered)
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, str(ROOT / "tools" / "ncu_stalls.py"), "--help"], stdout=full,
                           stderr=subprocess.PIPE, text=True, env=env)
    assert (r.returncode, r.stderr) == (2, "tools/ncu_stalls.py: cannot write the output: No space left on device\n")


def test_argparse_is_left_as_it_was():
    import argparse

    before = argparse.ArgumentParser._print_message
    assert tool_output.run(lambda: 0, "tools/x.py") == 0
    assert argparse.ArgumentParser._print_message is before


def test_every_script_in_tools_reports_a_failed_write():
    """Every script of tools/ runs its main through tool_output.run (a fresh-user trial found
    cluster_probe.py's ``--help > /dev/full`` exiting 0 with nothing printed); the two libraries
    (tool_output.py, phase_stamps.py) say so when run."""
    libraries = {"tool_output.py", "phase_stamps.py"}
    scripts = [p for p in sorted((ROOT / "tools").glob("*.py")) if p.name not in libraries]
    assert len(scripts) >= 9
    missing = [p.name for p in scripts if "tool_output.run(main" not in p.read_text()]
    assert not missing, f"scripts not reporting a failed write through tool_output.run: {missing}"



def test_every_benchmark_reports_a_failed_write():
    """The benchmarks too: argparse swallows a failed ``--help`` write, so ``bench_step.py --help >
    /dev/full`` exited 0 having printed nothing (the sixty-fourth session's fix)."""
    scripts = sorted((ROOT / "benchmarks").glob("*.py"))
    assert len(scripts) >= 8
    missing = [p.name for p in scripts if "tool_output.run(" not in p.read_text()]
    assert not missing, f"benchmarks not reporting a failed write through tool_output.run: {missing}"
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_step.py"), "--help"], stdout=full,
                           stderr=subprocess.PIPE, text=True, timeout=120)
    assert (r.returncode, r.stderr) == (2, "benchmarks/bench_step.py: cannot write the output: "
                                           "No space left on device\n")

@pytest.mark.parametrize("variable, value", [("DRIVERLEVEL_CACHE", "bogus"), ("DRIVERLEVEL_LINEINFO", "2")])
@pytest.mark.parametrize("tool, args", [
    ("sass.py", ["argmax.cu", "--arch", "sm_90", "--stats"]),
    ("sass_compare.py", ["argmax.cu", "--arch", "sm_90"]),
    ("code_sections.py", ["{tmp}/x.json", "--arch", "sm_90", "--kernel", "argmax.cu"]),
])
def test_a_bad_compile_variable_is_a_usage_error_of_the_tools(tool, args, variable, value, tmp_path):
    """An unrecognised DRIVERLEVEL_CACHE / DRIVERLEVEL_LINEINFO is one usage error (exit 2, the
    variable and its value named) before anything is compiled, as in `driverlevel compile`: not a
    traceback from the first compile (the fresh-user trial of the sixty-third session)."""
    env = dict(os.environ, **{variable: value})
    r = subprocess.run([sys.executable, str(ROOT / "tools" / tool), *(a.format(tmp=tmp_path) for a in args)],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert f"error: {variable}={value!r} is not understood" in r.stderr
    assert not (tmp_path / "x.json").exists()


SCRIPTS = sorted(p for d in ("tools", "benchmarks") for p in (ROOT / d).glob("*.py"))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_help_without_the_package_is_never_a_traceback(script, tmp_path):
    """A Python that cannot import driverlevel or numpy (``-S``: no site-packages; no PYTHONPATH; run
    from elsewhere): ``--help`` prints the help (exit 0), or one line that names what to install
    (exit 2); never a traceback. ddtree_stamps.py, sass.py, sass_compare.py, bench_ddtree.py,
    bench_replay.py, bench_attention.py and bench_step.py ended in a ModuleNotFoundError."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-S", str(script), "--help"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=60)
    assert "Traceback" not in r.stderr, r.stderr
    if r.returncode == 0:
        assert "usage:" in r.stdout
    else:
        assert r.returncode == 2, (r.returncode, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert ("cannot import" in r.stderr or "is a library" in r.stderr
                or "is the stamp reader" in r.stderr), r.stderr


def test_a_module_missing_inside_the_package_is_not_hidden():
    """Only the package and its dependencies get the one line: any other missing module is a bug
    of its own and propagates."""
    def main():
        name = "driverlevel" + "._nope"  # (not one dotted name: test_public_api resolves those)
        raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    with pytest.raises(ModuleNotFoundError):
        tool_output.run(main, "tools/x.py")

    def missing():
        raise ModuleNotFoundError("No module named 'numpy'", name="numpy")

    assert tool_output.run(missing, "tools/x.py") == 2


def test_closed_stderr_sends_nothing_to_stdout(tmp_path):
    """``2>&-``: a tool's one-line error went to standard output (Python's ``print(file=None)``),
    where a caller reads its table or JSON; now it is dropped, and the exit status still says it."""
    r = subprocess.run([sys.executable, str(ROOT / "tools" / "bench_ddtree_ab.py"), str(tmp_path / "none.json"),
                        "--vs", str(tmp_path / "none.json")], stdout=subprocess.PIPE, text=True, timeout=60,
                       preexec_fn=lambda: os.close(2))
    assert r.returncode == 2
    assert r.stdout == ""
