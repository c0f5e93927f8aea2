"""Carry driverlevel's kernel cache (compiled cubins) from one GPU machine to the next.

A fresh device machine spends most of a GPU-suite run in NVRTC: the tests compile their own
kernel variants, ~15 s each. The cache entries that one machine wrote are valid on the next one of
the same image, since an entry's key already holds everything its cubin depends on (the source and
its headers, the CUDA headers, the program's path, the options and defines, the architecture, the
NVRTC version and the package version: ``driverlevel._compile``), and an entry whose checksum does
not match is recompiled, never loaded. So an entry that comes back stale or damaged costs a compile,
never a wrong kernel.

Usage::

    touch /tmp/mark                                       # on the device, before the run
    ...                                                   # the GPU tests (their compiles, their cache hits)
    python tools/kernel_cache.py export $OUT/kc --since /tmp/mark
    # here: copy $OUT/kc's parts into a carried, git-ignored folder, e.g. .kcache/
    python tools/kernel_cache.py import .kcache           # on the next device machine, before the run

``export`` writes the cache's entries (``<sha256 key>.cubin``; with ``--since FILE`` only those
written or loaded after FILE's modification time, i.e. what that run used: loading an entry sets
its modification time) as one gzip'ed tar, split into parts ``kernel-cache.tgz.0``, ``.1``, ... of at
most ``--part-mib`` MiB each (the device tool brings back files of at most 16 MiB), and a manifest,
``kernel-cache.json`` (the parts in order with their sizes and SHA-256, the entry count). It removes
an earlier export's parts and manifest from DIR first. ``import`` checks the manifest's parts (sizes,
hashes), then every member of the archive (a regular file named like an entry, the archive read to
its end, so that gzip's own checksum is checked too), and only then writes the entries into the cache
(``DRIVERLEVEL_CACHE_DIR`` or the default, as the package finds it), each atomically, keeping those
already there. A part the manifest does not name is ignored; a missing, short or altered one is an
error before anything is written. Both print one line (entries, bytes, parts). Exit status 2 on bad
arguments (``import`` of a path that is no directory included), 1 on a damaged export, an unusable
cache directory or a failed write.

An entry is a hit only where its key matches: the same checkout path (the device machine's copy of
the repository is always at the same place), NVRTC version, package version and CUDA headers. After
a partial run (``-x``, some test files, ``REVERSED=1``), ``--since`` exports only what that run
touched: export after a whole run, or keep the previous export beside the new one.

Needs no GPU.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import math
import os
import time
import re
import sys
import tarfile
from pathlib import Path

PART_PREFIX = "kernel-cache.tgz."
MANIFEST = "kernel-cache.json"
ENTRY = re.compile(r"[0-9a-f]{64}\.cubin")  # (fullmatch) driverlevel._compile's entry names; temporaries start with '.'
PART = re.compile(re.escape(PART_PREFIX) + r"\d+")  # (fullmatch)


class _Parts(io.RawIOBase):
    """The archive's parts read back to back, as one stream."""

    def __init__(self, paths):
        self._files = [open(p, "rb") for p in paths]
        self._i = 0

    def readable(self):
        return True

    def readinto(self, b):
        while self._i < len(self._files):
            n = self._files[self._i].readinto(b)
            if n:
                return n
            self._i += 1
        return 0

    def close(self):
        for f in self._files:
            f.close()
        super().close()


class _Split(io.RawIOBase):
    """A writable stream cut into files DIR/kernel-cache.tgz.0, .1, ... of at most ``limit`` bytes each."""

    def __init__(self, directory: Path, limit: int):
        self._dir, self._limit = directory, limit
        self.paths: list[Path] = []
        self._f = None
        self._left = 0
        self.total = 0

    def writable(self):
        return True

    def write(self, b):
        view = memoryview(b)
        while len(view):
            if self._left == 0:
                if self._f is not None:
                    self._f.close()
                self.paths.append(self._dir / f"{PART_PREFIX}{len(self.paths)}")
                self._f = open(self.paths[-1], "wb")
                self._left = self._limit
            n = min(self._left, len(view))
            self._f.write(view[:n])
            view = view[n:]
            self._left -= n
            self.total += n
        return len(b)

    def close(self):
        if self._f is not None:
            self._f.close()
            self._f = None
        super().close()


def _compile_module():
    """driverlevel._compile (where the cache lives and how an entry is written), or SystemExit with a
    line that says how to make it importable."""
    try:
        from driverlevel import _compile
    except ImportError as exc:
        raise SystemExit(f"kernel_cache.py: cannot import driverlevel ({exc}): install the package "
                         f"(pip install -e .) or set PYTHONPATH to the checkout") from None
    return _compile


def _cache_dir() -> Path:
    d = _compile_module().cache_dir()
    if d is None:
        raise SystemExit("kernel_cache.py: the disk cache is disabled (DRIVERLEVEL_CACHE=0): nothing to export or import into")
    return Path(d)


def export(dest: Path, since: Path | None, part_mib: float) -> tuple[int, int, list[Path]]:
    """Write the cache's entries (those modified after ``since``'s modification time, if given) into
    ``dest`` as parts of a gzip'ed tar of at most ``part_mib`` MiB each and the manifest; return
    (entries, entry bytes, part paths). Raises ``FileNotFoundError`` when the cache directory is
    missing or not a directory (a typo in ``DRIVERLEVEL_CACHE_DIR`` would otherwise export nothing
    and succeed), before ``dest`` is touched."""
    cdir = _cache_dir()
    if not cdir.is_dir():  # (checked before an earlier export in dest is removed)
        raise FileNotFoundError(f"the kernel cache {cdir} is {'not a directory' if cdir.exists() else 'missing'} "
                                f"(DRIVERLEVEL_CACHE_DIR, or nothing was compiled on this machine yet)")
    after = since.stat().st_mtime if since is not None else None
    names = sorted(n for n in os.listdir(cdir) if ENTRY.fullmatch(n))
    chosen = []
    for n in names:
        st = (cdir / n).stat()
        if after is None or st.st_mtime >= after:
            chosen.append((n, st.st_size))
    dest.mkdir(parents=True, exist_ok=True)
    for old in [*dest.glob(PART_PREFIX + "*"), dest / MANIFEST]:
        if old.is_file() and (old.name == MANIFEST or PART.fullmatch(old.name)):
            old.unlink()
    out = _Split(dest, max(16, int(part_mib * (1 << 20))))
    with tarfile.open(fileobj=out, mode="w|gz", format=tarfile.PAX_FORMAT) as tar:
        for n, _ in chosen:
            tar.add(cdir / n, arcname=n, recursive=False)
    out.close()
    parts = [{"name": p.name, "bytes": p.stat().st_size, "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
             for p in out.paths]
    (dest / MANIFEST).write_text(json.dumps({"entries": len(chosen), "parts": parts}, indent=1) + "\n")
    return len(chosen), sum(s for _, s in chosen), out.paths


def _checked_parts(src: Path) -> tuple[list[Path], int]:
    """The manifest's parts of the export in ``src``, in order, each checked against its size and
    SHA-256, and the manifest's entry count. Raises ``FileNotFoundError`` (no manifest, a part missing)
    or ``ValueError`` (a malformed manifest, a part that does not match)."""
    mf = src / MANIFEST
    if not mf.is_file():
        raise FileNotFoundError(f"no {MANIFEST} in {src} (not a tools/kernel_cache.py export)")
    try:
        m = json.loads(mf.read_text())
        listed = [(e["name"], int(e["bytes"]), str(e["sha256"])) for e in m["parts"]]
        entries = int(m["entries"])
    except (ValueError, KeyError, TypeError, OverflowError) as exc:  # (OverflowError: int(1e400))
        raise ValueError(f"{mf}: not a manifest of this tool ({exc})") from None
    if not listed or [n for n, _, _ in listed] != [f"{PART_PREFIX}{i}" for i in range(len(listed))]:
        raise ValueError(f"{mf}: the parts must be {PART_PREFIX}0 .. {PART_PREFIX}N-1 in order")
    paths = []
    for name, size, sha in listed:
        p = src / name
        if not p.is_file():
            raise FileNotFoundError(f"{src}: part {name} of the export is missing")
        data = p.read_bytes()
        if len(data) != size:
            raise ValueError(f"{src}: part {name} does not match the manifest ({len(data)} B, {size} B listed): "
                             f"a damaged or mixed export")
        if hashlib.sha256(data).hexdigest() != sha:
            raise ValueError(f"{src}: part {name} does not match the manifest (its size does, its SHA-256 "
                             f"differs): a damaged or mixed export")
        paths.append(p)
    return paths, entries


def import_(src: Path) -> tuple[int, int, int, int]:
    """Write the entries of the export in ``src`` into the cache (keeping those already there);
    return (entries written, entries already there, bytes written, parts). Raises
    ``FileNotFoundError`` or ``ValueError`` (the manifest, a part, a member that is not a regular file
    named like an entry, an entry count that differs from the manifest's) and ``tarfile.TarError`` /
    ``EOFError`` / ``OSError`` (gzip's checksum, a truncated stream) before anything is written."""
    _write_atomically = _compile_module()._write_atomically
    parts, entries = _checked_parts(src)
    n = 0
    with gzip.GzipFile(fileobj=_Parts(parts)) as gz, tarfile.open(fileobj=gz, mode="r|") as tar:
        for m in tar:
            if not m.isreg() or not ENTRY.fullmatch(m.name):
                raise ValueError(f"{src}: archive member {m.name!r} is not a cache entry (a regular file <sha256>.cubin)")
            n += 1
        while gz.read(1 << 20):  # to the end: gzip checks its CRC and length there (gzip.BadGzipFile, an OSError)
            pass
    if n != entries:
        raise ValueError(f"{src}: the archive holds {n} entries, the manifest says {entries}")
    cdir = _cache_dir()
    if cdir.exists() and not cdir.is_dir():  # (mkdir's "File exists" would seem to blame the export)
        raise NotADirectoryError(f"the kernel cache {cdir} is not a directory (DRIVERLEVEL_CACHE_DIR)")
    cdir.mkdir(parents=True, exist_ok=True)
    written = kept = nbytes = 0
    now = time.time()
    with gzip.GzipFile(fileobj=_Parts(parts)) as gz, tarfile.open(fileobj=gz, mode="r|") as tar:
        for m in tar:
            path = cdir / m.name
            if path.exists():
                kept += 1
                continue
            data = tar.extractfile(m).read()
            # (dated by its compile or last use where it came from, never later than now)
            _write_atomically(path, data, mtime=min(m.mtime, now))
            written += 1
            nbytes += len(data)
    return written, kept, nbytes, len(parts)


def _dir_arg(text: str) -> Path:
    if not text.strip():  # (an unset shell variable: "" would mean the current directory)
        raise argparse.ArgumentTypeError("DIR must not be empty")
    return Path(text)


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="{export,import}")
    e = sub.add_parser("export", help="write the cache's entries into DIR as parts kernel-cache.tgz.0, .1, ...")
    e.add_argument("dir", type=_dir_arg)
    e.add_argument("--since", type=Path, help="only the entries written or loaded after this file's modification time")
    e.add_argument("--part-mib", type=float, default=15.0, help="largest part in MiB (default 15)")
    i = sub.add_parser("import", help="write the entries of DIR's parts kernel-cache.tgz.0, .1, ... into the cache")
    i.add_argument("dir", type=_dir_arg)
    args = ap.parse_args(argv)
    if args.cmd == "export":
        if args.dir.exists() and not args.dir.is_dir():  # (a usage error, as import's: mkdir said "File exists")
            e.error(f"{args.dir}: not a directory (an export is a directory of parts)")
        if args.since is not None and not args.since.exists():
            e.error(f"--since {args.since}: no such file")
        if not (math.isfinite(args.part_mib) and args.part_mib > 0):
            e.error(f"--part-mib must be a positive number (got {args.part_mib})")
        try:
            n, b, paths = export(args.dir, args.since, args.part_mib)
        except (ValueError, OSError) as exc:  # a bad DRIVERLEVEL_CACHE value, an unwritable DIR, a cache entry gone
            print(f"kernel_cache.py: export to {args.dir} failed: {exc}", file=sys.stderr)
            return 1
        size = sum(p.stat().st_size for p in paths)
        print(f"exported {_count(n, 'entry', 'entries')} ({b / 1e6:.1f} MB) of the kernel cache {_cache_dir()} "
              f"as {len(paths)} part(s), {size / 1e6:.1f} MB, in {args.dir}")
        return 0
    if not args.dir.is_dir():  # (a usage error, as export's --since: not a damaged export)
        why = "not a directory (an export is a directory of parts)" if args.dir.exists() else "no such directory"
        i.error(f"{args.dir}: {why}")
    try:
        w, k, b, nparts = import_(args.dir)
    except (ValueError, tarfile.TarError, EOFError, OSError) as exc:  # (FileNotFoundError is an OSError)
        print(f"kernel_cache.py: import from {args.dir} failed: {exc}", file=sys.stderr)
        return 1
    print(f"imported {_count(w, 'entry', 'entries')} ({b / 1e6:.1f} MB) from {nparts} part(s) into the cache; "
          f"{k} {'was' if k == 1 else 'were'} there already")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import tool_output  # (tools/tool_output.py: a failed write of stdout is one line, exit 2)

    sys.exit(tool_output.run(main, "tools/kernel_cache.py"))
