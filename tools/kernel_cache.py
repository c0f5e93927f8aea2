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
its modification time) as one gzip'ed tar, split into parts ``kernel-cache.tgz.00``, ``.01``, ...
of at most ``--part-mib`` MiB each (the device tool brings back files of at most 16 MiB). It
removes older ``kernel-cache.tgz.*`` parts from DIR first, so that DIR holds one archive. ``import``
joins the parts in order and writes each entry into the cache (``DRIVERLEVEL_CACHE_DIR`` or the
default, as the package finds it) atomically, keeping entries already there; anything in the archive
other than a regular file named like an entry is refused before anything is written. Both print one
line: entries, bytes, parts. Exit status 2 on bad arguments, 1 on a damaged archive or an unusable
cache directory.

Needs no GPU.
"""

from __future__ import annotations

import argparse
import io
import os
import re
import sys
import tarfile
from pathlib import Path

PART_PREFIX = "kernel-cache.tgz."
ENTRY = re.compile(r"^[0-9a-f]{64}\.cubin$")  # driverlevel._compile's entry names (temporaries start with '.')


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
    """A writable stream cut into files DIR/kernel-cache.tgz.NN of at most ``limit`` bytes each."""

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
                self.paths.append(self._dir / f"{PART_PREFIX}{len(self.paths):02d}")
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


def _cache_dir() -> Path:
    from driverlevel._compile import cache_dir

    d = cache_dir()
    if d is None:
        raise SystemExit("kernel_cache.py: the disk cache is disabled (DRIVERLEVEL_CACHE=0): nothing to export or import into")
    return Path(d)


def export(dest: Path, since: Path | None, part_mib: float) -> tuple[int, int, list[Path]]:
    """Write the cache's entries (those modified after ``since``'s modification time, if given) into
    ``dest`` as parts of a gzip'ed tar of at most ``part_mib`` MiB each; return (entries, entry
    bytes, part paths)."""
    cdir = _cache_dir()
    after = since.stat().st_mtime if since is not None else None
    names = sorted(n for n in (os.listdir(cdir) if cdir.is_dir() else []) if ENTRY.match(n))
    chosen = []
    for n in names:
        st = (cdir / n).stat()
        if after is None or st.st_mtime >= after:
            chosen.append((n, st.st_size))
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob(PART_PREFIX + "*"):
        old.unlink()
    out = _Split(dest, max(1, int(part_mib * (1 << 20))))
    with tarfile.open(fileobj=out, mode="w|gz", format=tarfile.PAX_FORMAT) as tar:
        for n, _ in chosen:
            tar.add(cdir / n, arcname=n, recursive=False)
    out.close()
    return len(chosen), sum(s for _, s in chosen), out.paths


def import_(src: Path) -> tuple[int, int, int]:
    """Write the entries of the archive in ``src`` into the cache (keeping those already there);
    return (entries written, entries already there, bytes written). Raises ``ValueError`` for a
    member that is not a regular file named like an entry, before anything is written."""
    parts = sorted(src.glob(PART_PREFIX + "*"))
    if not parts:
        raise FileNotFoundError(f"no {PART_PREFIX}NN parts in {src}")
    # (the members are checked on a first pass, the entries written on a second: nothing half-imported)
    with tarfile.open(fileobj=_Parts(parts), mode="r|gz") as tar:
        for m in tar:
            if not m.isreg() or not ENTRY.match(m.name):
                raise ValueError(f"{src}: archive member {m.name!r} is not a cache entry (a regular file <sha256>.cubin)")
    cdir = _cache_dir()
    cdir.mkdir(parents=True, exist_ok=True)
    written = kept = nbytes = 0
    with tarfile.open(fileobj=_Parts(parts), mode="r|gz") as tar:
        for m in tar:
            path = cdir / m.name
            if path.exists():
                kept += 1
                continue
            data = tar.extractfile(m).read()
            tmp = cdir / f".tmp-import-{os.getpid()}-{m.name}"
            tmp.write_bytes(data)
            os.utime(tmp, (m.mtime, m.mtime))  # its compile (or last use) time on the machine it came from
            os.replace(tmp, path)
            written += 1
            nbytes += len(data)
    return written, kept, nbytes


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export", help="write the cache's entries into DIR as kernel-cache.tgz.NN parts")
    e.add_argument("dir", type=Path)
    e.add_argument("--since", type=Path, help="only the entries written or loaded after this file's modification time")
    e.add_argument("--part-mib", type=float, default=15.0, help="largest part in MiB (default 15)")
    i = sub.add_parser("import", help="write the entries of DIR's kernel-cache.tgz.NN parts into the cache")
    i.add_argument("dir", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "export":
        if args.since is not None and not args.since.exists():
            ap.error(f"--since {args.since}: no such file")
        if not args.part_mib > 0:
            ap.error(f"--part-mib must be positive (got {args.part_mib})")
        n, b, paths = export(args.dir, args.since, args.part_mib)
        size = sum(p.stat().st_size for p in paths)
        print(f"exported {n} entries ({b / 1e6:.1f} MB) as {len(paths)} part(s), {size / 1e6:.1f} MB, in {args.dir}")
        return 0
    try:
        w, k, b = import_(args.dir)
    except (FileNotFoundError, ValueError, tarfile.TarError, EOFError, OSError) as exc:
        print(f"kernel_cache.py: import from {args.dir} failed: {exc}", file=sys.stderr)
        return 1
    print(f"imported {w} entries ({b / 1e6:.1f} MB) into the cache; {k} were there already")
    return 0


if __name__ == "__main__":
    sys.exit(main())
