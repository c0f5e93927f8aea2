"""tools/kernel_cache.py (CPU only): the kernel cache exported from one machine and imported on another
loads as a cache hit with the same cubin; --since takes what a run compiled or loaded; parts; refusals."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import json
import os
import shutil
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
    assert "imported 3 entries (0.0 MB) from 1 part(s)" in capsys.readouterr().out
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
    (out / "notes.txt").write_text("kept")
    n, nbytes, parts = kc.export(out, None, 0.001)  # ~1 KB parts
    assert n == 4 and len(parts) >= 2 and all(p.stat().st_size <= int(0.001 * (1 << 20)) for p in parts)
    assert [p.name for p in parts] == [f"kernel-cache.tgz.{i}" for i in range(len(parts))]
    assert sorted(out.iterdir()) == sorted([*parts, out / "kernel-cache.json", out / "notes.txt"])
    _use_cache(monkeypatch, b)
    assert kc.import_(out) == (4, 0, nbytes, len(parts))
    assert _entries(b) == _entries(a)


def _hand_made_export(src: Path, members):
    """An export of hand-made members (name, bytes) with a manifest that matches it."""
    src.mkdir()
    with tarfile.open(src / "kernel-cache.tgz.0", "w:gz") as tar:
        for n, data in members:
            info = tarfile.TarInfo(n)
            info.size = len(data)
            info.mtime = 4_000_000_000  # (2096: an import dates it now at the latest)
            tar.addfile(info, io.BytesIO(data))
    part = (src / "kernel-cache.tgz.0").read_bytes()
    (src / "kernel-cache.json").write_text(json.dumps({"entries": len(members), "parts": [
        {"name": "kernel-cache.tgz.0", "bytes": len(part), "sha256": hashlib.sha256(part).hexdigest()}]}))


GOOD = "b" * 64 + ".cubin"


@pytest.mark.parametrize("name", ["../evil.cubin", "notakey.cubin", "sub/" + "a" * 64 + ".cubin", GOOD + "\n"])
def test_an_archive_with_anything_but_entries_is_refused_before_anything_is_written(kc, tmp_path, monkeypatch,
                                                                                      capsys, name):
    _hand_made_export(tmp_path / "kc", [(GOOD, b"abc"), (name, b"abc")])
    cache = tmp_path / "cache"
    _use_cache(monkeypatch, cache)
    assert kc.main(["import", str(tmp_path / "kc")]) == 1
    assert "is not a cache entry" in capsys.readouterr().err
    assert not cache.exists() or list(cache.iterdir()) == []


def test_an_imported_entry_is_never_dated_in_the_future(kc, tmp_path, monkeypatch):
    _hand_made_export(tmp_path / "kc", [(GOOD, b"abc")])
    _use_cache(monkeypatch, tmp_path / "cache")
    assert kc.import_(tmp_path / "kc")[:3] == (1, 0, 3)
    assert (tmp_path / "cache" / GOOD).stat().st_mtime <= time.time()


def _flip_last_part(d: Path):
    p = sorted(d.glob("kernel-cache.tgz.*"))[-1]
    b = bytearray(p.read_bytes())
    b[len(b) // 2] ^= 1
    p.write_bytes(bytes(b))


def _short_last_part(d: Path):
    p = sorted(d.glob("kernel-cache.tgz.*"))[-1]
    p.write_bytes(p.read_bytes()[:-4])


def _drop_a_part(d: Path):
    (d / "kernel-cache.tgz.1").unlink()


def _no_manifest(d: Path):
    (d / "kernel-cache.json").unlink()


def _crc_off_but_rehashed(d: Path):  # a damaged stream whose manifest was made to match: gzip's own check
    p = sorted(d.glob("kernel-cache.tgz.*"), key=lambda q: int(q.suffix[1:]))[-1]
    b = bytearray(p.read_bytes())
    b[-6] ^= 1
    p.write_bytes(bytes(b))
    m = json.loads((d / "kernel-cache.json").read_text())
    m["parts"][-1].update(bytes=len(b), sha256=hashlib.sha256(bytes(b)).hexdigest())
    (d / "kernel-cache.json").write_text(json.dumps(m))


@pytest.mark.parametrize("damage, words", [(_flip_last_part, "its size does, its SHA-256 differs"),
                                           (_short_last_part, "B listed): a damaged or mixed export"),
                                           (_drop_a_part, "kernel-cache.tgz.1 of the export is missing"),
                                           (_no_manifest, "no kernel-cache.json"),
                                           (_crc_off_but_rehashed, "CRC")])
def test_a_damaged_export_writes_nothing(kc, tmp_path, monkeypatch, capsys, damage, words):
    _use_cache(monkeypatch, tmp_path / "a")
    for i in range(4):
        _build(i)
    n, _, parts = kc.export(tmp_path / "kc", None, 0.001)
    assert len(parts) >= 2
    damage(tmp_path / "kc")
    _use_cache(monkeypatch, tmp_path / "b")
    assert kc.main(["import", str(tmp_path / "kc")]) == 1
    assert words in capsys.readouterr().err
    assert not (tmp_path / "b").exists() or list((tmp_path / "b").iterdir()) == []


def test_a_newer_export_over_an_older_one_imports_the_newer(kc, tmp_path, monkeypatch):
    _use_cache(monkeypatch, tmp_path / "a")
    for i in range(4):
        _build(i)
    _, _, old_parts = kc.export(tmp_path / "old", None, 0.001)  # several small parts
    _build(9)
    n, _, new_parts = kc.export(tmp_path / "new", None, 15)     # one part
    assert len(old_parts) > len(new_parts) == 1 and n == 5
    for p in old_parts[1:]:  # the older export's later parts copied beside the newer one's
        shutil.copy(p, tmp_path / "new" / p.name)
    _use_cache(monkeypatch, tmp_path / "b")
    assert kc.import_(tmp_path / "new")[:2] == (5, 0)


def test_a_failed_write_leaves_no_temporary_file(kc, tmp_path, monkeypatch):
    _use_cache(monkeypatch, tmp_path / "a")
    _build(0)
    kc.export(tmp_path / "kc", None, 15)
    _use_cache(monkeypatch, tmp_path / "b")

    def full(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(kc.os, "replace", full)
    with pytest.raises(OSError, match="No space"):
        kc.import_(tmp_path / "kc")
    assert list((tmp_path / "b").iterdir()) == []


def test_clear_errors(kc, tmp_path, monkeypatch, capsys):
    _use_cache(monkeypatch, tmp_path / "cache")
    _build(0)
    assert kc.main(["import", str(tmp_path)]) == 1
    assert "no kernel-cache.json" in capsys.readouterr().err
    # review s54: a path that does not exist was "not a tools/kernel_cache.py export" (exit 1)
    (tmp_path / "a.tar").write_text("")
    for path, words in ((tmp_path / "nope", "nope: no such directory"), (tmp_path / "a.tar", "a.tar: not a directory")):
        with pytest.raises(SystemExit) as e:
            kc.main(["import", str(path)])
        assert e.value.code == 2
        assert words in capsys.readouterr().err
    for bad in (["--since", str(tmp_path / "nope")], ["--part-mib", "inf"], ["--part-mib", "0"]):
        with pytest.raises(SystemExit) as e:
            kc.main(["export", str(tmp_path / "kc"), *bad])
        assert e.value.code == 2
        assert " export [-h]" in capsys.readouterr().err  # the subcommand's usage, not the tool's
    (tmp_path / "file").write_text("")
    assert kc.main(["export", str(tmp_path / "file" / "kc")]) == 1
    assert "export to" in capsys.readouterr().err
    # a fresh-user trial (sixty-fourth session): an export to a file was mkdir's "[Errno 17] File exists", exit 1
    with pytest.raises(SystemExit) as e:
        kc.main(["export", str(tmp_path / "file")])
    assert e.value.code == 2
    assert "file: not a directory (an export is a directory of parts)" in capsys.readouterr().err
    assert (tmp_path / "file").read_text() == ""
    monkeypatch.setenv("DRIVERLEVEL_CACHE", "maybe")
    assert kc.main(["export", str(tmp_path / "kc")]) == 1
    assert "DRIVERLEVEL_CACHE" in capsys.readouterr().err
    monkeypatch.setenv("DRIVERLEVEL_CACHE", "0")
    with pytest.raises(SystemExit, match="disk cache is disabled"):
        kc.main(["export", str(tmp_path / "kc")])


def test_a_missing_or_misnamed_cache_is_an_error_and_keeps_an_earlier_export(kc, tmp_path, monkeypatch, capsys):
    _use_cache(monkeypatch, tmp_path / "cache")
    _build(0)
    assert kc.main(["export", str(tmp_path / "kc")]) == 0
    assert f"of the kernel cache {tmp_path / 'cache'} " in capsys.readouterr().out
    before = sorted((p.name, p.read_bytes()) for p in (tmp_path / "kc").iterdir())
    (tmp_path / "afile").write_text("")
    for cdir, words in ((tmp_path / "typo", "is missing"), (tmp_path / "afile", "is not a directory")):
        _use_cache(monkeypatch, cdir)
        assert kc.main(["export", str(tmp_path / "kc")]) == 1
        err = capsys.readouterr().err
        assert words in err and str(cdir) in err
        assert sorted((p.name, p.read_bytes()) for p in (tmp_path / "kc").iterdir()) == before


def test_an_import_into_a_cache_path_that_is_a_file_names_the_cache(kc, tmp_path, monkeypatch, capsys):
    """DRIVERLEVEL_CACHE_DIR naming a file: the import says the cache is not a directory, as the export
    does, not mkdir's bare "File exists" (which seemed to blame the export's directory)."""
    _use_cache(monkeypatch, tmp_path / "cache")
    _build(0)
    assert kc.main(["export", str(tmp_path / "kc")]) == 0
    capsys.readouterr()
    (tmp_path / "afile").write_text("x")
    _use_cache(monkeypatch, tmp_path / "afile")
    assert kc.main(["import", str(tmp_path / "kc")]) == 1
    err = capsys.readouterr().err
    assert f"the kernel cache {tmp_path / 'afile'} is not a directory" in err and "Errno" not in err
    assert (tmp_path / "afile").read_text() == "x"


def test_an_empty_dir_argument_is_refused(kc, tmp_path, monkeypatch, capsys):
    _use_cache(monkeypatch, tmp_path / "cache")
    monkeypatch.chdir(tmp_path)
    for cmd in ("export", "import"):
        with pytest.raises(SystemExit) as e:
            kc.main([cmd, ""])
        assert e.value.code == 2 and "DIR must not be empty" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("manifest", [
    {"entries": 1, "parts": [{"name": "kernel-cache.tgz.0", "bytes": 1e400, "sha256": "x"}]},
    {"entries": 1, "parts": [{"name": "kernel-cache.tgz.0", "bytes": None, "sha256": "x"}]},
    {"entries": "many", "parts": [{"name": "kernel-cache.tgz.0", "bytes": 1, "sha256": "x"}]},
    {"entries": 1, "parts": "kernel-cache.tgz.0"},
    ["kernel-cache.tgz.0"],
])
def test_a_malformed_manifest_is_one_line_and_exit_1(kc, tmp_path, monkeypatch, capsys, manifest):
    _use_cache(monkeypatch, tmp_path / "cache")
    (tmp_path / "kc").mkdir()
    (tmp_path / "kc" / "kernel-cache.tgz.0").write_bytes(b"x")
    # (json.dumps writes 1e400 as Infinity, which json.loads reads back as a float: the crafted case)
    (tmp_path / "kc" / "kernel-cache.json").write_text(json.dumps(manifest))
    assert kc.main(["import", str(tmp_path / "kc")]) == 1
    assert "not a manifest of this tool" in capsys.readouterr().err
    assert not (tmp_path / "cache").exists()


def test_without_the_package_it_says_how_to_get_it(tmp_path):
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # -S: no site-packages, so an installed (editable) driverlevel is not found either; run outside the checkout
    r = subprocess.run([sys.executable, "-S", str(REPO / "tools" / "kernel_cache.py"), "export", str(tmp_path / "kc")],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1, r
    assert "cannot import driverlevel" in r.stderr and "Traceback" not in r.stderr
