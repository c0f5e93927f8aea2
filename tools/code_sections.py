"""Hash the code of every compiled kernel variant: to show that a refactor changed no SASS.

Compiles every variant of every kernel file that ``driverlevel compile`` builds (the launchers'
``compile_variants``) for the given architectures, without the cache, and records per variant a
hash of each ELF section that holds code or what the code and its launch depend on: the code
(``.text.*``), the kernels' attributes (``.nv.info`` and ``.nv.info.*``: launch bounds, max
threads, min CTAs per SM, registers, stack, parameters...), the constant banks
(``.nv.constant*``), the initial values of ``__device__`` globals (``.nv.global.init``), the
shared memory (``.nv.shared.*``, by size: it has no bytes) and the relocations of those sections
(``.rela.text.*``...). Symbol indices in the relocations and attributes are replaced by the
symbols' names, since the indices move with the symbol table. The whole cubin is not compared:
its symbol and string tables change with names that do not reach the code (a device function's
parameter type, for instance), while comments and line shifts change nothing at all. Files
written by an earlier version of this tool (which hashed fewer sections) are not comparable.

Usage::

    python tools/code_sections.py before.json [--arch sm_90,sm_120] [--kernel verify_attention.cu]
    (edit)
    python tools/code_sections.py after.json --compare before.json    # exit 1 if any section differs

Only the variants in both files are compared; a variant in one file only (another ``--arch`` or
``--kernel`` selection) is listed as ``new`` or ``gone`` and makes the exit status 1 only with
``--strict``; no variant in both files is exit status 1. The output file may not be the one compared with.
A ``--compare`` file that is not this tool's output (``{"FILE ARCH LABEL": {section: hash}}``, at least one
variant) is a usage error, exit status 2, found before anything is compiled.

Needs no GPU.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import struct
import sys

ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120")
#: Sections hashed (by name prefix); the debug sections, the symbol and string tables and the notes are not.
KEPT = (".text", ".nv.info", ".nv.constant", ".nv.global.init", ".nv.shared",
        ".rela.text", ".rela.nv.constant", ".rela.nv.global.init",
        ".rel.text", ".rel.nv.constant", ".rel.nv.global.init")
SHT_SYMTAB, SHT_RELA, SHT_NOBITS, SHT_REL = 2, 4, 8, 9
#: .nv.info attributes (EIATTR_*) whose payload holds symbol indices: the first 4 bytes of every
#: 8-byte record (PARAM_CBANK, FRAME_SIZE, MIN_STACK_SIZE, MAX_STACK_SIZE, REGCOUNT), or every
#: 4 bytes (EXTERNS).
INFO_SYM_PAIRS = {0x0A, 0x11, 0x12, 0x23, 0x2F}
INFO_SYM_LIST = {0x0F}


def _cstr(data: bytes, at: int) -> str:
    return data[at: data.index(b"\0", at)].decode()


def _raw_sections(data: bytes) -> list:
    """``[(name, type, link, bytes)]`` of a little-endian ELF64 file (NOBITS sections give empty bytes)."""
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise ValueError("not an ELF64 file")
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    raw = [struct.unpack_from("<IIQQQQI", data, shoff + i * shentsize) for i in range(shnum)]
    strtab = raw[shstrndx][4]
    return [(_cstr(data, strtab + name), typ, link, size, b"" if typ == SHT_NOBITS else data[offset: offset + size])
            for name, typ, _flags, _addr, offset, size, link in raw]


def elf_sections(data: bytes) -> dict:
    """``{name: bytes}`` of a little-endian ELF64 file (NOBITS sections give empty bytes)."""
    return {name: body for name, _t, _l, _s, body in _raw_sections(data)}


def _symbol_names(secs: list) -> list:
    """A stable name for every symbol of the (first) symbol table: a section's symbol is named after
    its section, a function that is not a kernel (no ``.text.<name>`` section of its own) after
    where it sits (``.text.k+0x340``: a device function's mangled name is not code), any other
    symbol (kernels, globals) by its name."""
    for _name, typ, link, _size, body in secs:
        if typ == SHT_SYMTAB:
            strings = secs[link][4]
            out = []
            for off in range(0, len(body) - 23, 24):
                st_name, st_info, _other, shndx, value = struct.unpack_from("<IBBHQ", body, off)
                name = _cstr(strings, st_name)
                section = secs[shndx][0] if shndx < len(secs) else None
                if st_info & 0xF == 3 and section is not None:  # STT_SECTION
                    name = section
                elif st_info & 0xF == 2 and section is not None and section != f".text.{name}":  # STT_FUNC
                    name = f"{section}+{value:#x}"
                out.append(name)
            return out
    return []


def _sym(names: list, i: int) -> str:
    return names[i] if 0 <= i < len(names) else f"#{i}"


def _relocations(body: bytes, entsize: int, names: list) -> bytes:
    """A relocation section with each symbol index replaced by the symbol's name."""
    lines = []
    for off in range(0, len(body) - entsize + 1, entsize):
        r_offset, r_info = struct.unpack_from("<QQ", body, off)
        addend = struct.unpack_from("<q", body, off + 16)[0] if entsize == 24 else 0
        lines.append(f"{r_offset:#x} {r_info & 0xFFFFFFFF} {_sym(names, r_info >> 32)} {addend}")
    return "\n".join(lines).encode()


def _attributes(body: bytes, names: list) -> bytes:
    """A .nv.info section as sorted records with symbol indices replaced by names (its bytes if it
    does not parse as EIATTR records)."""
    records, off = [], 0
    while off < len(body):
        if off + 4 > len(body):
            return body
        fmt, attr, value = struct.unpack_from("<BBH", body, off)
        off += 4
        if fmt != 0x04:  # EIFMT_NVAL / BVAL / HVAL: the value is in the header
            records.append(f"{fmt} {attr:#x} {value}")
            continue
        payload = body[off: off + value]
        if len(payload) != value:
            return body
        off += value
        words = [struct.unpack_from("<I", payload, i)[0] for i in range(0, value - value % 4, 4)]
        if attr in INFO_SYM_LIST:
            words = [_sym(names, w) for w in words]
        elif attr in INFO_SYM_PAIRS and value % 8 == 0:
            words = [_sym(names, w) if i % 2 == 0 else w for i, w in enumerate(words)]
        records.append(f"{fmt} {attr:#x} {words} {payload[value - value % 4:].hex()}")
    return "\n".join(sorted(records)).encode()


def section_hashes(data: bytes) -> dict:
    """``{section: hash}`` of the sections of a cubin that :data:`KEPT` selects (see the module docstring)."""
    secs = _raw_sections(data)
    names = _symbol_names(secs)
    out = {}
    for name, typ, _link, size, body in secs:
        if not name.startswith(KEPT):
            continue
        if typ == SHT_NOBITS:
            body = f"NOBITS {size}".encode()
        elif typ in (SHT_RELA, SHT_REL):
            body = _relocations(body, 24 if typ == SHT_RELA else 16, names)
        elif name == ".nv.info" or name.startswith(".nv.info."):
            body = _attributes(body, names)
        out[name] = hashlib.sha256(body).hexdigest()[:16]
    return out


def hashes(archs, kernels) -> dict:
    from driverlevel.runtime import compile_file
    from driverlevel.cli import LAUNCHERS, compile_variants

    out = {}
    for filename in kernels or sorted(LAUNCHERS):
        for arch in archs:
            for v in compile_variants(filename, arch):
                cubin = compile_file(filename, v.target or arch, v.defines, use_cache=False)
                key = f"{filename} {arch} {v.label}"
                out[key] = section_hashes(cubin.data)
                print(f"{key}: {len(out[key])} sections", file=sys.stderr, flush=True)
    return out


def _json_kind(v) -> str:
    """What a JSON value is, in a few words (``a number (5)``, ``an array``, ``null``)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return f"a boolean ({str(v).lower()})"
    if isinstance(v, (int, float)):
        return f"a number ({v!r})"
    if isinstance(v, str):
        return f"a string ({_short(v)})"
    return "an array" if isinstance(v, list) else "an object"


def _short(text: str, n: int = 80) -> str:
    """``text`` quoted, cut after ``n`` characters (an error message stays one readable line)."""
    return repr(text[:n]) + ("..." if len(text) > n else "")


def compare_file_problem(data) -> str | None:
    """Why ``data`` (a ``--compare`` file's JSON) is not what :func:`hashes` gives and ``main`` writes,
    ``{"FILE ARCH LABEL": {section: hash}}`` with at least one variant; None when it is."""
    if not isinstance(data, dict):
        return f"not a code_sections.py file: {_json_kind(data)}, not an object of variants"
    if not data:
        return "holds no variants: nothing to compare with"
    for key, sections in data.items():
        if len(key.split(" ", 2)) != 3:  # (the label may be empty: 'argmax.cu sm_90 ')
            return f"not a code_sections.py file: {_short(key)} is not a variant ('FILE ARCH LABEL')"
        if not isinstance(sections, dict):
            return (f"not a code_sections.py file: variant {_short(key)} is {_json_kind(sections)}, not an "
                    f"object of section hashes")
        for name, h in sections.items():
            if not isinstance(h, str):
                return (f"not a code_sections.py file: section {_short(name)} of variant {_short(key)} is "
                        f"{_json_kind(h)}, not a hash string")
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="JSON file to write")
    ap.add_argument("--arch", default=",".join(ARCHS), help=f"comma-separated architectures or 'all', as `driverlevel "
                    f"compile --arch` takes them (default {','.join(ARCHS)})")
    ap.add_argument("--kernel", action="append", help="a kernel file of cu/ (repeatable; default: all)")
    ap.add_argument("--compare", help="a JSON file written earlier (not the output file): report the variants of both "
                                      "files whose sections differ, and which sections (exit 1 if any)")
    ap.add_argument("--strict", action="store_true", help="with --compare: a variant in one file only (new or gone) "
                                                          "also makes the exit status 1")
    a = ap.parse_args(argv)
    # everything that can be wrong is checked before the (uncached, minutes-long) compiles: the output path
    # first (its directory exists and is writable, it is no directory), as the benchmarks check --json
    from driverlevel._cli_common import dump_json_file, json_path_problem

    problem = json_path_problem(a.out)
    if a.out == "-":  # json_path_problem's stdout: this tool writes a file
        problem = "'-' (stdout) is not supported: give the path of the JSON file to write"
    if problem:
        ap.error(f"out: {problem}")
    from driverlevel._compile import check_compile_options
    from driverlevel.cli import LAUNCHERS

    try:  # (--arch as `driverlevel compile --arch` checks it, then DRIVERLEVEL_CACHE / _LINEINFO)
        archs = check_compile_options([a.arch])
    except ValueError as exc:
        ap.error(str(exc))
    for k in a.kernel or ():
        if k not in LAUNCHERS:
            ap.error(f"--kernel {k!r}: not a kernel file of cu/ (one of {', '.join(sorted(LAUNCHERS))})")
    old = None
    if a.strict and not a.compare:
        ap.error("--strict needs --compare")
    if a.compare and os.path.realpath(a.compare) == os.path.realpath(a.out):
        ap.error(f"--compare {a.compare!r} is the output file: it would be overwritten before the comparison")
    if a.compare:
        try:
            with open(a.compare) as f:
                old = json.load(f)
        except (OSError, ValueError) as exc:
            ap.error(f"--compare {a.compare!r}: {exc}")
        problem = compare_file_problem(old)  # (a wrong structure failed only after the compiles)
        if problem:
            ap.error(f"--compare {a.compare!r}: {problem}")
    h = hashes(archs, a.kernel)
    if dump_json_file(a.out, h, label="out"):
        return 2
    if old is None:
        return 0
    both = sorted(set(h) & set(old))
    differ = [k for k in both if h[k] != old[k]]
    for k in differ:
        sections = sorted(n for n in set(h[k]) | set(old[k]) if h[k].get(n) != old[k].get(n))
        print(f"differs: {k}: {', '.join(sections)}")
    # variants of one file only (another --arch or --kernel selection): information, not a difference
    only = sorted((k, "new") for k in set(h) - set(old)) + sorted((k, "gone") for k in set(old) - set(h))
    for k, what in only:
        print(f"{what}: {k}{'' if a.strict else ' (not compared)'}")
    print(f"{len(both) - len(differ)} of {len(both)} variants in both files have identical code sections")
    if not both:
        print("no variant is in both files: nothing was compared")
    return 1 if differ or not both or (a.strict and only) else 0


if __name__ == "__main__":
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import tool_output  # (tools/tool_output.py: a failed write of stdout is one line, exit 2)

    sys.exit(tool_output.run(main, "tools/code_sections.py"))
