"""SASS of one compiled kernel variant, and the schedule facts that Nsight otherwise needs a GPU for.

Compiles a kernel file in one of the variants ``driverlevel compile`` builds (the launchers'
``compile_variants``), disassembles the cubin with ``nvdisasm`` and prints either the SASS of
the chosen kernels (with their branch labels, ``.L_x_7:``) or (``--stats``) per kernel:
instructions by opcode, and for every ``HMMA`` how many instructions earlier the ``LDSM``
(``ldmatrix``) that produced one of its operands was issued -- the distance ptxas left to cover
the shared-memory latency (a histogram; short distances are what Nsight reports as
short-scoreboard stalls on the ``HMMA``).

``nvdisasm`` is found with ``cuda.pathfinder`` (the NVIDIA wheel ``nvidia-cuda-nvdisasm``, a
CUDA toolkit, or ``PATH``); this tool needs no GPU::

    pip install nvidia-cuda-nvdisasm
    python tools/sass.py verify_attention.cu --arch sm_120 --variant 0 --kernel verify_attn_partial --stats
    python tools/sass.py verify_attention.cu --list          # default: GPU 0's arch, or sm_120

``--variant`` is an index into ``--list`` (default 0, the launcher's default variant).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from driverlevel._compile import CompileVariant

_INS = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_FUN = re.compile(r"^\.text\.(\S+):")


def nvdisasm() -> str:
    """Path of ``nvdisasm``; SystemExit with the install hint when there is none."""
    from cuda.pathfinder import find_nvidia_binary_utility

    path = find_nvidia_binary_utility("nvdisasm")
    if path is None:
        raise SystemExit("tools/sass.py: no nvdisasm found; install one with `pip install nvidia-cuda-nvdisasm`")
    return path


_LABEL_DEF = re.compile(r"^\s*(\.L_x_\d+):")


def parse_nvdisasm(text: str, labels: bool = False) -> dict[str, list[str]]:
    """``{kernel: [instruction, ...]}`` of ``nvdisasm -c`` output (predicates kept; directives
    dropped; branch labels' definitions dropped too, or with ``labels`` kept in place as entries
    ``".L_x_7:"``, so that a branch's target can be located)."""
    kernels: dict[str, list[str]] = {}
    cur = None
    for line in text.splitlines():
        m = _FUN.search(line)
        if m:
            cur = kernels.setdefault(m.group(1), [])
            continue
        m = _LABEL_DEF.search(line)
        if m and labels and cur is not None:
            cur.append(m.group(1) + ":")
            continue
        m = _INS.search(line)
        if m and cur is not None:
            cur.append(m.group(2))
    return kernels


def disassemble(cubin: bytes, labels: bool = False) -> dict[str, list[str]]:
    """:func:`parse_nvdisasm` of the cubin's disassembly."""
    with tempfile.TemporaryDirectory() as d:
        f = Path(d) / "k.cubin"
        f.write_bytes(cubin)
        out = subprocess.run([nvdisasm(), "-c", str(f)], capture_output=True, text=True, check=True).stdout
    return parse_nvdisasm(out, labels)


def _regs(tok: str, n: int) -> set[int]:
    m = re.match(r"R(\d+)", tok)
    return set(range(int(m.group(1)), int(m.group(1)) + n)) if m else set()


def stats(instructions: list[str]) -> tuple[Counter, Counter]:
    """(instructions by opcode, histogram of LDSM -> HMMA distances in instructions, capped at 40).

    The distance of an ``HMMA`` is the smallest over its A (4 registers) and B (2) operands of
    the instructions since the ``LDSM`` that last wrote one of them; operands last written by
    anything else are not counted. Straight-line order, so across a loop's back edge it is an
    estimate."""
    ops, dist = Counter(), Counter()
    writer: dict[int, tuple[int, bool]] = {}  # register -> (index, written by LDSM)
    for i, ins in enumerate(instructions):
        body = re.sub(r"^@!?U?P\w+\s+", "", ins)
        op = body.split()[0]
        args = [a.strip() for a in body[len(op):].split(",")]
        ops[op.split(".")[0]] += 1
        if op.startswith("HMMA"):
            srcs = _regs(args[1], 4) | _regs(args[2], 2)
            d = [i - writer[r][0] for r in srcs if r in writer and writer[r][1]]
            if d:
                dist[min(min(d), 40)] += 1
            for r in _regs(args[0], 4):
                writer[r] = (i, False)
        elif op.startswith("LDSM"):
            for r in _regs(args[0], 4):
                writer[r] = (i, True)
        elif args and args[0].startswith("R") and not op.startswith(("ST", "RED", "ATOM")):
            for r in _regs(args[0], 1):
                writer[r] = (i, False)
    return ops, dist


def _tile_variant(ap: argparse.ArgumentParser, args) -> CompileVariant:
    """verify_attention.cu's variant for ``--tile``; ``ap.error`` (exit 2) for a bad one."""
    if args.file != "verify_attention.cu":
        ap.error("--tile is for verify_attention.cu")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from bench_tiles import parse_tile_config

    from driverlevel._compile import shared_limit
    from driverlevel.verify_attention import compile_variant, tile_config

    try:  # its one-line message (it raises SystemExit for its other callers)
        cfg = parse_tile_config(args.tile.partition("=")[2] if "=" in args.tile else args.tile,
                                f"--tile {args.tile!r}")
        if cfg is None:  # native: the arch's default
            cfg = tile_config(args.arch)
        elif callable(cfg):  # native_rs
            cfg = cfg(args.arch, None)
    except SystemExit as e:
        ap.error(str(e.code))
    if cfg.shared_bytes > shared_limit(args.arch):
        ap.error(f"tile {cfg.label} needs {cfg.shared_bytes:,} B of shared memory, "
                 f"{args.arch} allows {shared_limit(args.arch):,}")
    return compile_variant(args.arch, cfg)


def main(argv=None) -> int:
    from driverlevel.cli import LAUNCHERS, compile_variants
    from driverlevel.runtime import compile_file

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file", choices=sorted(LAUNCHERS), help="kernel file of cu/")
    ap.add_argument("--arch", default=None, help="target architecture (default: GPU 0's, or sm_120 without a GPU, "
                    "as `driverlevel compile`)")
    ap.add_argument("--variant", type=int, default=None, help="index into --list (default 0: the default variant)")
    ap.add_argument("--kernel", default="", help="regular expression on kernel names (default: all)")
    ap.add_argument("--tile", default="", help="verify_attention.cu only: a bench_tiles.py tile spec "
                    "(e.g. 64x1x16x4w) instead of --variant")
    ap.add_argument("--list", action="store_true", help="list the variants and exit")
    ap.add_argument("--stats", action="store_true", help="opcode counts and LDSM -> HMMA distances, not the SASS")
    args = ap.parse_args(argv)
    from driverlevel._compile import check_arch

    # Every option is checked before anything is compiled: a bad one is a usage error (exit 2 with the
    # usage line), as in benchmarks/.
    if args.arch is None:
        from driverlevel.cli import _default_arch

        args.arch = _default_arch()
    try:
        args.arch = check_arch(args.arch)  # as `driverlevel compile --arch` does
    except ValueError as e:
        ap.error(f"--arch: {e}")
    try:
        kernel_re = re.compile(args.kernel)
    except re.error as e:
        ap.error(f"--kernel {args.kernel!r} is not a regular expression: {e}")
    from driverlevel._compile import check_compile_env

    try:
        check_compile_env()  # DRIVERLEVEL_CACHE / _LINEINFO: a usage error, not the compile's traceback
    except ValueError as e:
        ap.error(str(e))
    variants = compile_variants(args.file, args.arch)
    if args.list:
        for i, v in enumerate(variants):
            print(f"{i:3d}  {v.label or '(the only variant)'}")
        return 0
    if args.tile and args.variant is not None:
        ap.error("--tile and --variant each choose the variant: give one of them")
    if args.tile:
        v = _tile_variant(ap, args)
    else:
        args.variant = 0 if args.variant is None else args.variant
        if not 0 <= args.variant < len(variants):
            ap.error(f"--variant {args.variant} out of range 0..{len(variants) - 1} (see --list)")
        v = variants[args.variant]
    # (the SASS with its branch labels' definitions, ".L_x_7:", so that a branch can be followed)
    kernels = disassemble(compile_file(args.file, v.target or args.arch, v.defines).data, labels=not args.stats)
    if not any(kernel_re.search(n) for n in kernels):  # (known only once compiled; still before any output)
        ap.error(f"--kernel {args.kernel!r} matches none of {sorted(kernels)}")
    print(f"// {args.file} {v.target or args.arch} [{v.label or 'the only variant'}]")
    for name, ins in kernels.items():
        if not kernel_re.search(name):
            continue
        if not args.stats:
            print(f"// {name}: {sum(not i.endswith(':') for i in ins)} instructions")
            print("\n".join(ins))
            continue
        ops, dist = stats(ins)
        print(f"{name}: {len(ins)} instructions; " + ", ".join(f"{k} {n}" for k, n in ops.most_common(12)))
        if dist:
            print("  LDSM -> HMMA distance (instructions: HMMAs): "
                  + ", ".join(f"{d}{'+' if d == 40 else ''}: {n}" for d, n in sorted(dist.items())))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import tool_output  # (tools/tool_output.py: a failed write of stdout is one line, exit 2)

    sys.exit(tool_output.run(main, "tools/sass.py"))
