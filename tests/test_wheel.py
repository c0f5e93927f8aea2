"""The kernel sources ship inside the wheel and are found from an installed copy (CPU only).

Builds a wheel of this checkout, installs it into a temporary directory and, in a
fresh interpreter whose working directory is elsewhere, checks that
``kernel_source_dir()`` points inside the installed package and lists the .cu files.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _can_build_offline() -> str | None:
    """Why a --no-build-isolation wheel build cannot work here, or None."""
    try:
        import setuptools
    except ImportError:
        return "setuptools is not installed (pip install '.[test]' brings it)"
    major_minor = tuple(int(x) for x in setuptools.__version__.split(".")[:2])
    if major_minor < (70, 1):
        if importlib.util.find_spec("wheel") is None:  # setuptools < 70.1 builds wheels through it
            return f"setuptools {setuptools.__version__} needs the 'wheel' package (pip install '.[test]' brings a newer setuptools)"
    return None


def _run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert r.returncode == 0, f"{cmd} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    return r


def test_wheel_ships_kernel_sources(tmp_path):
    why = _can_build_offline()
    if why:
        pytest.skip(why)
    if not (REPO / "pyproject.toml").is_file():
        pytest.skip("not running from a source checkout")
    dist, target, elsewhere = tmp_path / "dist", tmp_path / "site", tmp_path / "elsewhere"
    elsewhere.mkdir()
    # Build from a clean copy: setuptools writes build/ and *.egg-info next to the sources,
    # and a stale build/ of the checkout could hide a file missing from the package data.
    src = tmp_path / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(
        ".git", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".venv", "out"))
    _run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "-q", "-w", str(dist)],
         cwd=tmp_path)
    (whl,) = dist.glob("driverlevel-*.whl")
    names = zipfile.ZipFile(whl).namelist()
    cu_files = sorted(p.name for p in (REPO / "cu").glob("*.cu"))
    headers = sorted(p.relative_to(REPO / "cu").as_posix() for p in (REPO / "cu").rglob("*.cuh"))
    assert "common.cuh" in headers and "ddtree/params.cuh" in headers
    for name in cu_files + headers:
        assert f"driverlevel/cu/{name}" in names, f"{name} is missing from the wheel"

    _run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target", str(target), str(whl)],
         cwd=tmp_path)
    probe = ("import json, driverlevel, driverlevel._compile as c; "
             "print(json.dumps({'pkg': driverlevel.__file__, 'dir': str(c.kernel_source_dir()), "
             "'sources': c.kernel_sources()}))")
    env = {"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path),
           "DRIVERLEVEL_CACHE": "0", "PYTHONNOUSERSITE": "1"}
    out = json.loads(_run([sys.executable, "-c", probe], cwd=elsewhere, env=env).stdout.strip().splitlines()[-1])
    assert Path(out["pkg"]).resolve().is_relative_to(target.resolve()), out
    assert Path(out["dir"]).resolve() == (target / "driverlevel" / "cu").resolve(), out
    assert out["sources"] == cu_files

    # ... and the installed copy compiles a kernel from its own sources (NVRTC, no GPU)
    compile_probe = ("import driverlevel.selftest as s; c = s.compile('sm_90'); "
                     "print(sorted(c.resources)[0], len(c.data) > 0)")
    r = _run([sys.executable, "-c", compile_probe], cwd=elsewhere, env=env)
    assert r.stdout.split() == ["add_i64", "True"]
    # ddtree.cu includes its stages' headers from cu/ddtree/: shipped and found in the install
    ddtree_probe = ("import driverlevel.ddtree as d, driverlevel._compile as c; "
                    "cub = c.compile_file(d.SOURCE, 'sm_90', d.compile_defines('sm_90'), use_cache=False); "
                    "print(len(cub.resources), len(cub.data) > 0)")
    r = _run([sys.executable, "-c", ddtree_probe], cwd=elsewhere, env=env)
    assert r.stdout.split() == ["11", "True"]


def test_one_version_everywhere():
    """pyproject's version, ``driverlevel.__version__`` and the compile cache key's version agree
    (three copies: the cache module cannot import the package without a cycle)."""
    import re
    from pathlib import Path

    import driverlevel
    from driverlevel import _compile

    text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    declared = re.search(r'^version\s*=\s*"([^"]+)"', text, re.M).group(1)
    assert driverlevel.__version__ == declared == _compile._PACKAGE_VERSION
