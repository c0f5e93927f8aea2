"""Hash the code of every compiled kernel variant: to show that a refactor changed no SASS.

Compiles every variant of every kernel file that ``driverlevel compile`` builds (the launchers'
``compile_variants``) for the given architectures, without the cache, and records per variant a
hash of each ELF section that holds code or launch-relevant data (``.text.*``,
``.nv.constant0.*``, ``.nv.shared.*``). The whole cubin is not compared: its symbol and string
tables change with names that do not reach the code (a device function's parameter type, for
instance), while comments and line shifts change nothing at all.

Usage::

    python tools/code_sections.py before.json [--arch sm_90,sm_120] [--kernel verify_attention.cu]
    (edit)
    python tools/code_sections.py after.json --compare before.json    # exit 1 if any section differs

Needs no GPU.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import struct
import sys

ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120")
KEPT = (".text", ".nv.constant0", ".nv.shared")


def elf_sections(data: bytes) -> dict:
    """``{name: bytes}`` of a little-endian ELF64 file (NOBITS sections give empty bytes)."""
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise ValueError("not an ELF64 file")
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    raw = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab = raw[shstrndx][4]
    out = {}
    for name, typ, _flags, _addr, offset, size in raw:
        n = data[strtab + name: data.index(b"\0", strtab + name)].decode()
        out[n] = b"" if typ == 8 else data[offset: offset + size]
    return out


def hashes(archs, kernels) -> dict:
    from driverlevel.runtime import compile_file
    from driverlevel.cli import LAUNCHERS, compile_variants

    out = {}
    for filename in kernels or sorted(LAUNCHERS):
        for arch in archs:
            for v in compile_variants(filename, arch):
                cubin = compile_file(filename, arch, v.defines, use_cache=False)
                key = f"{filename} {arch} {v.label}"
                out[key] = {n: hashlib.sha256(b).hexdigest()[:16] for n, b in elf_sections(cubin.data).items()
                            if n.startswith(KEPT)}
                print(f"{key}: {len(out[key])} sections", file=sys.stderr, flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="JSON file to write")
    ap.add_argument("--arch", default=",".join(ARCHS), help=f"comma-separated architectures (default {','.join(ARCHS)})")
    ap.add_argument("--kernel", action="append", help="a kernel file of cu/ (repeatable; default: all)")
    ap.add_argument("--compare", help="a JSON file written earlier: report the variants whose sections differ, and "
                                      "which sections (exit 1 if any)")
    a = ap.parse_args(argv)
    # everything that can be wrong is checked before the (uncached, minutes-long) compiles: the output path
    # first (its directory exists and is writable, it is no directory), as the benchmarks check --json
    from driverlevel._cli_common import json_path_problem

    problem = json_path_problem(a.out)
    if a.out == "-":  # json_path_problem's stdout: this tool writes a file
        problem = "'-' (stdout) is not supported: give the path of the JSON file to write"
    if problem:
        ap.error(f"out: {problem}")
    from driverlevel._compile import check_arch
    from driverlevel.cli import LAUNCHERS

    try:
        archs = [check_arch(x) for x in a.arch.split(",")]  # as `driverlevel compile --arch` checks
    except ValueError as exc:
        ap.error(f"--arch: {exc}")
    for k in a.kernel or ():
        if k not in LAUNCHERS:
            ap.error(f"--kernel {k!r}: not a kernel file of cu/ (one of {', '.join(sorted(LAUNCHERS))})")
    old = None
    if a.compare:
        try:
            with open(a.compare) as f:
                old = json.load(f)
        except (OSError, ValueError) as exc:
            ap.error(f"--compare {a.compare!r}: {exc}")
    h = hashes(archs, a.kernel)
    with open(a.out, "w") as f:
        json.dump(h, f, indent=1)
    if old is None:
        return 0
    differ = sorted(k for k in set(h) | set(old) if h.get(k) != old.get(k))
    for k in differ:
        if k in h and k in old:
            sections = sorted(n for n in set(h[k]) | set(old[k]) if h[k].get(n) != old[k].get(n))
            print(f"differs: {k}: {', '.join(sections)}")
        else:
            print(f"differs: {k}: {'new' if k in h else 'gone'}")
    print(f"{len(h) - len([k for k in differ if k in h])} of {len(h)} variants have identical code sections")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
