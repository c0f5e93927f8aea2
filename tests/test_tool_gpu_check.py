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
    e.update(OUT=str(tmp_path / "out"), PYTHON=sys.executable, SKIP_TESTS="1", DRIVERLEVEL_CACHE_DIR=str(tmp_path / "cache"))
    e.update(env)
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=e, timeout=300, cwd=cwd)


def test_help_names_the_new_settings():
    r = subprocess.run(["bash", str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60)
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
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["gpu_check-logs.tgz", "kc"]
    assert sorted(p.name for p in (out / "kc").iterdir()) == ["kernel-cache.json", "kernel-cache.tgz.0"]
    with tarfile.open(out / "gpu_check-logs.tgz") as t:
        names = t.getnames()
    assert {"info.log", "environment.log", "install.log", "kernel-cache-out.log"} <= set(names)


@pytest.mark.parametrize("env, words", [({"SKIP_TESTS": "maybe"}, "SKIP_TESTS='maybe' is not understood"),
                                        ({"PACK": "2"}, "PACK='2' is not understood"),
                                        ({"TWICE": "y"}, "TWICE='y' is not understood"),
                                        ({"WORKERS": "eight"}, "WORKERS='eight' must be a positive number")])
def test_settings_are_refused_before_anything_runs(tmp_path, env, words):
    r = _run(tmp_path, **env)
    assert r.returncode == 2 and words in r.stderr, r.stderr
    assert not (tmp_path / "out").exists()
    r = _run(tmp_path, "-k", "x")
    assert r.returncode == 2 and "unknown option '-k'" in r.stderr


def test_no_gpu_means_no_test_passed_a_failure_and_paths_are_the_callers(tmp_path):
    """On this CPU-only machine every GPU test skips: the step is "no-pass" and the exit status 1. OUT and
    the test file are given relative to the caller's directory (here tests/, not the checkout's root)."""
    import shutil

    rel = os.path.relpath(tmp_path / "logs", REPO / "tests")
    r = _run(tmp_path, "test_decode_step_fuzz_gpu.py", cwd=REPO / "tests", OUT=rel, SKIP_TESTS="off")
    try:
        assert r.returncode == 1, r.stdout[-2000:] + r.stderr[-2000:]
        table = r.stdout[r.stdout.index("=== summary"):].splitlines()
        row = next(t for t in table if t.startswith("gpu-tests"))
        assert row.split()[1] == "no-pass" and "skipped" in row, row
        assert (tmp_path / "logs" / "gpu-tests.log").is_file()
    finally:
        shutil.rmtree(REPO / "tests" / rel, ignore_errors=True)  # (only if it had gone to the wrong place)
