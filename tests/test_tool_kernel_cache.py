"""tools/kernel_cache.py (CPU only): the kernel cache exported from one machine and imported on another
loads as a cache hit with the same cubin; --since takes what a run compiled or loaded; parts; refusals."""

from __future__ import annotations

import importlib.util
import io
import os
import tarfile
import time
from pathlib import Path

import pytest

from driverlevel import _compile
from driverlevel._compile import compile_source

REPO = Path(__file__).resolve().parents[1]
SRC = 'extern "C" __global__ void kc_add(float* x, float v) { x[threadIdx.x] += v * %d; }\n'


@pytest.fixture(scope="module")
def kc():
    spec = importlib.util.spec_from_file_location("kernel_cache_under_test", REPO / "tools" / "kernel_cache.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _use_cache(monkeypatch, d: Path):
    monkeypatch.setenv("DRIVERLEVEL_CACHE_DIR", str(d))
    monkeypatch.delenv("DRIVERLEVEL_CACHE", raising=False)
    _compile._clear_memory_cache()


def _build(i: int):
    return compile_source(SRC % i, f"kc{i}.cu", "sm_90")


def _entries(d: Path):
    return sorted(p.name for p in d.iterdir() if kc_entry(p.name))


def kc_entry(name):
    return name.endswith(".cubin") and not name.startswith(".")


def test_exported_entries_load_as_hits_on_another_cache(kc, tmp_path, monkeypatch, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    _use_cache(monkeypatch, a)
    first = [_build(i) for i in range(3)]
    assert not any(c.cache_hit for c in first)
    assert kc.main(["export", str(tmp_path / "kc")]) == 0
    assert "exported 3 entries" in capsys.readouterr().out
    _use_cache(monkeypatch, b)
    assert kc.main(["import", str(tmp_path / "kc")]) == 0
    assert "imported 3 entries" in capsys.readouterr().out
    assert _entries(b) == _entries(a)
    again = [_build(i) for i in range(3)]
    assert all(c.cache_hit for c in again)
    assert [c.data for c in again] == [c.data for c in first]
    # importing again keeps what is there
    assert kc.main(["import", str(tmp_path / "kc")]) == 0
    out = capsys.readouterr().out
    assert "imported 0 entries" in out and "3 were there already" in out


def test_since_takes_what_the_run_compiled_or_loaded(kc, tmp_path, monkeypatch):
    a = tmp_path / "a"
    _use_cache(monkeypatch, a)
    for i in range(3):
        _build(i)
    old = time.time() - 3600
    for p in a.iterdir():
        os.utime(p, (old, old))
    mark = tmp_path / "mark"
    mark.touch()
    _compile._clear_memory_cache()
    assert _build(1).cache_hit  # loaded: its time is now
    _build(7)                   # compiled
    n, _, parts = kc.export(tmp_path / "kc", mark, 15)
    assert n == 2
    with tarfile.open(fileobj=kc._Parts(parts), mode="r|gz") as tar:
        names = sorted(m.name for m in tar)
    keys = sorted(c.key + ".cubin" for c in (_build(1), _build(7)))
    assert names == keys


def test_parts_split_and_join_and_old_parts_go(kc, tmp_path, monkeypatch):
    a, b, out = tmp_path / "a", tmp_path / "b", tmp_path / "kc"
    _use_cache(monkeypatch, a)
    for i in range(4):
        _build(i)
    out.mkdir()
    (out / "kernel-cache.tgz.17").write_bytes(b"stale")
    n, nbytes, parts = kc.export(out, None, 0.001)  # ~1 KB parts
    assert n == 4 and len(parts) >= 2 and all(p.stat().st_size <= int(0.001 * (1 << 20)) for p in parts)
    assert sorted(out.iterdir()) == sorted(parts)
    _use_cache(monkeypatch, b)
    assert kc.import_(out) == (4, 0, nbytes)
    assert _entries(b) == _entries(a)


@pytest.mark.parametrize("name", ["../evil.cubin", "notakey.cubin", "sub/" + "a" * 64 + ".cubin"])
def test_an_archive_with_anything_but_entries_is_refused_before_anything_is_written(kc, tmp_path, monkeypatch,
                                                                                      capsys, name):
    src = tmp_path / "kc"
    src.mkdir()
    good = "b" * 64 + ".cubin"
    with tarfile.open(src / "kernel-cache.tgz.00", "w:gz") as tar:
        for n in (good, name):
            info = tarfile.TarInfo(n)
            info.size = 3
            tar.addfile(info, io.BytesIO(b"abc"))
    cache = tmp_path / "cache"
    _use_cache(monkeypatch, cache)
    assert kc.main(["import", str(src)]) == 1
    assert "is not a cache entry" in capsys.readouterr().err
    assert not cache.exists() or list(cache.iterdir()) == []


def test_clear_errors(kc, tmp_path, monkeypatch, capsys):
    _use_cache(monkeypatch, tmp_path / "cache")
    assert kc.main(["import", str(tmp_path)]) == 1
    assert "no kernel-cache.tgz.NN parts" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        kc.main(["export", str(tmp_path / "kc"), "--since", str(tmp_path / "nope")])
    assert e.value.code == 2
    monkeypatch.setenv("DRIVERLEVEL_CACHE", "0")
    with pytest.raises(SystemExit, match="disk cache is disabled"):
        kc.main(["export", str(tmp_path / "kc")])
