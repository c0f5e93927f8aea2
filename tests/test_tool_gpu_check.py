"""tools/gpu_check.sh without a GPU (CPU only): --help, the kernel-cache options and PACK=1 (the steps
that need no GPU; SKIP_TESTS=1 leaves the GPU tests out)."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "tools" / "gpu_check.sh"


def _run(tmp_path, **env):
    e = {k: v for k, v in os.environ.items() if k not in ("KERNEL_CACHE_IN", "KERNEL_CACHE_OUT", "PACK", "BENCH",
                                                            "TWICE", "REVERSED", "WORKERS", "NVRTC_WHEEL")}
    e.update(OUT=str(tmp_path / "out"), PYTHON=sys.executable, SKIP_TESTS="1",
             DRIVERLEVEL_CACHE_DIR=str(tmp_path / "cache"), **env)
    return subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=e, timeout=300)


def test_help_names_the_new_settings():
    r = subprocess.run(["bash", str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and all(w in r.stdout for w in ("KERNEL_CACHE_IN", "KERNEL_CACHE_OUT", "PACK=1"))


def test_cache_in_without_an_export_is_skipped_and_pack_leaves_one_archive(tmp_path):
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
