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
