"""tools/gpu_check.sh without a GPU (CPU only): --help, the kernel-cache options and PACK=1 (the steps
that need no GPU; SKIP_TESTS=1 leaves the GPU tests out), its settings refused before anything runs,
paths from the caller's directory, and a test step in which every test skipped counted as failed."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tools" / "gpu_check.sh"


def _run(tmp_path, *args, cwd=None, **env):
    e = {k: v for k, v in os.environ.items() if k not in ("KERNEL_CACHE_IN", "KERNEL_CACHE_OUT", "PACK", "BENCH",
                                                            "TWICE", "REVERSED", "WORKERS", "NVRTC_WHEEL")}
    # SKIP_INSTALL: the script's pip install -e . would turn the caller's driverlevel into this checkout
    e.update(OUT=str(tmp_path / "out"), PYTHON=sys.executable, SKIP_TESTS="1", SKIP_INSTALL="1",
             DRIVERLEVEL_CACHE_DIR=str(tmp_path / "cache"))
    e.update(env)
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=e, timeout=300, cwd=cwd)


@pytest.mark.parametrize("args", [["--help"], ["tests/test_demo_gpu.py", "-h"]])
def test_help_names_the_new_settings(args):
    r = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and all(w in r.stdout for w in ("KERNEL_CACHE_IN", "KERNEL_CACHE_OUT", "PACK=1"))


def test_cache_in_without_an_export_is_skipped_and_pack_leaves_one_archive(tmp_path):
    (tmp_path / "cache").mkdir()  # (an empty cache: a missing one is an export error)
    r = _run(tmp_path, KERNEL_CACHE_IN=str(tmp_path / "nothing"), KERNEL_CACHE_OUT=str(tmp_path / "out" / "kc"),
             PACK="1")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    table = r.stdout[r.stdout.index("=== summary"):]
    assert "gpu_check-logs.tgz" in table.splitlines()[0]
    assert any(t.split()[:2] == ["kernel-cache-in", "skipped"] for t in table.splitlines())
    assert any(t.split()[:2] == ["kernel-cache-out", "ok"] for t in table.splitlines())
    assert any(t.split()[:2] == ["install", "skipped"] for t in table.splitlines())  # the environment untouched
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check-logs.tgz", "kc"]
    assert sorted(p.name for p in (out / "kc").iterdir()) == ["kernel-cache.json", "kernel-cache.tgz.0"]
    with tarfile.open(out / "gpu_check-logs.tgz") as t:
        names = t.getnames()
    assert {"info.log", "environment.log", "install.log", "kernel-cache-out.log"} <= set(names)


@pytest.mark.parametrize("env, words", [({"SKIP_TESTS": "maybe"}, "SKIP_TESTS='maybe' is not understood"),
                                        ({"PACK": "2"}, "PACK='2' is not understood"),
                                        ({"SKIP_INSTALL": "y"}, "SKIP_INSTALL='y' is not understood"),
                                        ({"TWICE": "y"}, "TWICE='y' is not understood"),
                                        ({"WORKERS": "eight"}, "WORKERS='eight' must be a positive number"),
                                        ({"WORKERS_REVERSED": "0"}, "WORKERS_REVERSED='0' must be a positive")])
def test_settings_are_refused_before_anything_runs(tmp_path, env, words):
    r = _run(tmp_path, **env)
    assert r.returncode == 2 and words in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()
    r = _run(tmp_path, "-k", "x")
    assert r.returncode == 2 and "unknown option '-k'" in r.stderr


def test_no_test_passed_is_a_failure_and_paths_are_the_callers(tmp_path):
    """A test step in which every test skipped (no GPU here) is "no-pass" and the exit status 1. OUT and the
    test file are given relative to the caller's directory (outside the checkout), not the checkout's root."""
    caller = tmp_path / "caller"
    (caller / "sub").mkdir(parents=True)
    (caller / "sub" / "test_only_skips.py").write_text(
        "import pytest\n\n\n@pytest.mark.gpu\ndef test_needs_a_gpu():\n    pytest.skip('no GPU here')\n")
    assert not (REPO / "logs").exists() and not (REPO / "sub").exists()
    r = _run(tmp_path, "sub/test_only_skips.py", cwd=caller, OUT="logs", SKIP_TESTS="off")
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
    table = r.stdout[r.stdout.index("=== summary"):].splitlines()
    row = next(t for t in table if t.startswith("gpu-tests"))
    assert row.split()[1] == "no-pass" and "1 skipped" in row, row
    assert (caller / "logs" / "gpu-tests.log").is_file() and not (REPO / "logs").exists()


def test_nvrtc_wheel_keeps_spaces_and_is_taken_from_the_callers_directory(tmp_path):
    """NVRTC_WHEEL is a glob: expanded where it was given, each match one argument of pip (a path may hold spaces)."""
    wheels = tmp_path / "my wheels"
    wheels.mkdir()
    (wheels / "nvidia_cuda_nvrtc-13.0.88-py3-none-any.whl").write_bytes(b"")
    log = tmp_path / "pip-args.txt"
    stub = tmp_path / "python"  # records pip's arguments (one per line), runs everything else
    stub.write_text(f'#!/usr/bin/env bash\nif [ "$1 $2" = "-m pip" ]; then printf "%s\\n" "$@" >> "{log}"; exit 0; fi\n'
                    f'exec "{sys.executable}" "$@"\n')
    stub.chmod(0o755)
    r = _run(tmp_path, cwd=tmp_path, PYTHON=str(stub), NVRTC_WHEEL="my wheels/*.whl", SKIP_INSTALL="0")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    installs = [c.splitlines() for c in log.read_text().split("-m\n")[1:]]
    assert installs == [["pip", "install", "-q", "--no-deps", str(wheels / "nvidia_cuda_nvrtc-13.0.88-py3-none-any.whl")],
                        ["pip", "install", "-q", "--no-deps", "--no-build-isolation", "-e", "."]]
    log.unlink()  # SKIP_INSTALL=1: pip is not called at all
    r = _run(tmp_path, cwd=tmp_path, PYTHON=str(stub), NVRTC_WHEEL="my wheels/*.whl")
    assert r.returncode == 0 and not log.exists(), r.stdout[-2000:] + r.stderr[-2000:]
