"""Tile configurations of the verify-attention plan side by side: same inputs, same run.

Each named configuration is forced with ``tile=`` (``native`` = the one ``tile_config``
picks for this GPU) and timed as in ``bench_attention.py`` (graph replays behind a 256 MB L2
flush, median). Every configuration's output is compared with the first one's (relative
Frobenius difference), so a variant that computes something else shows up.

Usage: python benchmarks/bench_tiles.py [--quick] [--json out.json] [--tile NAME=ROWSxCSPLITxKEYSxSTAGES[q][r][p][b][w][c[N]][s][d][g][v][_N] ...]
[--ratio A/B ...] [--define DL_NAME=INT ...]
(``q`` = Q fragments in registers, ``r`` = the reduce-scatter S exchange, ``p`` = P V over row
pairs, ``pv_rows=32``, ``b`` = K tiles by bulk copies, ``w`` = QK and PV warps, e.g. ``64x1x16x4w``, ``c`` = with two QK accumulator sets (``cN``: N of them), ``s`` = the mask and softmax in the PV warps (``pv_softmax``), ``d`` = the QK warps' softmax deferred by a tile (``qk_skew``), ``g`` = the QK warps' S by wgmma (``wgmma``, sm_90 only), ``v`` = the PV warps' P V by wgmma too (``wgmma_pv``: ``64x1x32x4wdgv_20`` is sm_90's default tile), ``_N`` = N k-steps of Q in a QK warp's registers, e.g. ``64x1x16x4w_28``), e.g. ``--tile sm120=32x4x32x2q
--tile sm120rs=32x4x32x2qr``; ``NAME=native`` is the tile ``tile_config`` picks for the shape, ``NAME=native_rs``
the same with the reduce-scatter exchange, ``NAME=sm_120`` what ``tile_config("sm_120")`` returns.
``--ratio A/B`` adds a column of A's TFLOP/s over B's to the summary table printed last.
``--define DL_NAME=INT`` compiles every tile of the run with an extra kernel define (a compile-time knob
of ``cu/verify_attention.cu``, e.g. ``DL_SKEW_STORE_AT``; experiments only).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import sys
import time
from pathlib import Path


SPEC_GRAMMAR = "ROWSxCSPLITxKEYSxSTAGES[q][r][p][b][w][c[N]][s][d][g][v][_QREGS], native, native_rs or sm_120"


def parse_tile(spec):
    """NAME=SPEC -> (NAME, tile): a TileConfig, None (native) or a function of (arch, rows) (native_rs).

    Raises SystemExit with a one-line message for a spec without ``NAME=`` or a bad SPEC."""
    name, eq, cfg = spec.partition("=")
    if not eq or not name:
        raise SystemExit(f"bad --tile {spec!r}: want NAME=SPEC, SPEC one of {SPEC_GRAMMAR}")
    return name, parse_tile_config(cfg, f"--tile {spec!r}")


def parse_tile_config(cfg, what=None):
    """SPEC (no name) -> a TileConfig, None (native) or a function of (arch, rows) (native_rs).

    Raises SystemExit with a one-line message (naming ``what``, default the spec) for a bad SPEC or
    a shape TileConfig refuses."""
    from dataclasses import replace

    from driverlevel.verify_attention import TileConfig, tile_config

    what = what or repr(cfg)
    if cfg.strip().lower() in ("native", "native_rs", "sm_120"):  # names in any case, as architectures are
        cfg = cfg.strip().lower()
    if cfg == "native":
        return None
    if cfg == "native_rs":
        def native_rs(arch, rows):
            c = tile_config(arch, rows)
            if c.ws:
                raise SystemExit(f"{what}: {arch}'s tile has QK and PV warps, no S exchange to change")
            return replace(c, exchange="reduce_scatter")

        return native_rs
    if cfg == "sm_120":
        return tile_config("sm_120")
    m = re.fullmatch(r"(\d+)x(\d+)x(\d+)x(\d+)(q?)(r?)(p?)(b?)(w?)(c\d?)?(s?)(d?)(g?)(v?)(?:_(\d+))?", cfg)
    if not m:
        raise SystemExit(f"bad {what}: want {SPEC_GRAMMAR}")
    r, c, k, s, q, x, pv, bulk, ws, chains, pvsm, skew, wg, wgpv, qregs = m.groups()
    try:
        return TileConfig(rows=int(r), csplit=int(c), keys=int(k), stages=int(s), qreg=bool(q),
                          exchange="reduce_scatter" if x else "allreduce", pv_rows=32 if pv else 16,
                          bulk=bool(bulk), ws=bool(ws), qk_chains=(int(chains[1:]) if chains[1:] else 2) if chains else 1,
                          q_regs=int(qregs) if qregs else 32, pv_softmax=bool(pvsm), qk_skew=bool(skew),
                          wgmma=bool(wg), wgmma_pv=bool(wgpv))
    except (TypeError, ValueError) as e:
        raise SystemExit(f"bad {what}: {e}") from None


def summary(results, names, ratios):
    """Print the TFLOP/s of every tile and the ratios A/B, one line per shape, then their geometric means."""
    tf = {(r["heads"], r["batch"], r["prefix"], r["draft_tokens"], r["tile_name"]): r["tflops"] for r in results}
    shapes_done = list(dict.fromkeys(k[:4] for k in tf))
    print("\n# summary: TFLOP/s" + (" and ratios " + ", ".join("/".join(x) for x in ratios) if ratios else ""))
    print(f"{'heads':>5} {'bs':>3} {'prefix':>7} {'tok':>4} " + " ".join(f"{n:>9}" for n in names)
          + " " + " ".join(f"{'/'.join(x):>17}" for x in ratios))
    logs = {x: [] for x in ratios}
    for sh in shapes_done:
        cells = [f"{tf[sh + (n,)]:9.1f}" for n in names]
        for a, b in ratios:
            q = tf[sh + (a,)] / tf[sh + (b,)]
            logs[(a, b)].append(math.log(q))
            cells.append(f"{q:17.3f}")
        print(f"{sh[0]:>5} {sh[1]:>3} {sh[2]:>7} {sh[3]:>4} " + " ".join(cells))
    if ratios:
        print(f"{'geometric mean':>23} " + " ".join(" " * 9 for _ in names) + " "
              + " ".join(f"{math.exp(sum(logs[x]) / len(logs[x])):17.3f}" for x in ratios), flush=True)


def parse_defines(items):
    """``["DL_X=3", ...]`` -> ``{"DL_X": 3}``; SystemExit with a one-line message for anything else."""
    out = {}
    for item in items:
        m = re.fullmatch(r"(DL_[A-Z0-9_]+)=(-?\d+)", item)
        if not m:
            raise SystemExit(f"bad --define {item!r}: want DL_NAME=INT, e.g. DL_SKEW_STORE_AT=27")
        out[m.group(1)] = int(m.group(2))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="8 shapes (9 or 16 heads; prefixes 4k-200k; 16 and 256 tokens) instead of 36")
    ap.add_argument("--tile", action="append", default=[], metavar="NAME=SPEC",
                    help=f"a tile to time (repeatable; default native=native sm120=sm_120); SPEC: {SPEC_GRAMMAR}")
    ap.add_argument("--ratio", action="append", default=[], help="A/B: summary column of A's TFLOP/s over B's")
    ap.add_argument("--define", action="append", default=[], metavar="DL_NAME=INT",
                    help="an extra NVRTC define for verify_attention.cu in every tile (repeatable; for experiments "
                         "with the kernel's compile-time knobs, e.g. DL_SKEW_STORE_AT=27)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH")
    args = ap.parse_args(argv)
    # Every option is checked before the GPU check and the minutes of measuring: a bad one is a usage error
    # (exit 2 with the usage line), as in the other scripts.
    try:
        tiles = [parse_tile(t) for t in (args.tile or ["native=native", "sm120=sm_120"])]
        defines = parse_defines(args.define)
    except SystemExit as e:  # the parsers' one-line message (they raise SystemExit for their other callers)
        ap.error(str(e.code))
    names = [n for n, _ in tiles]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:  # the summary keys its columns by name: a second tile of one name would overwrite the first
        ap.error(f"--tile: name {twice[0]!r} given twice (each tile needs a name of its own)")
    ratios = [tuple(r.split("/")) for r in args.ratio]
    for a_b in ratios:
        if len(a_b) != 2 or not set(a_b) <= set(names):
            ap.error(f"bad --ratio {'/'.join(a_b)!r}: want A/B with A, B among {names}")
    from driverlevel._cli_common import dump_json_file, json_path_problem

    problem = json_path_problem(args.json, stdout_ok=False)  # (the table goes to stdout)
    if problem:
        ap.error(f"--json: {problem}")
    sys.path.insert(0, str(Path(__file__).parent))
    import driverlevel as dl
    from bench_attention import require_gpu_and_torch

    torch = require_gpu_and_torch("bench_tiles.py")

    from bench_attention import make_data, time_plan
    from driverlevel import verify_attention as va
    from driverlevel.verify_attention import VerifyAttention

    if defines:  # (benchmark only: every plan of this process compiles with them)
        plain = va.compile_defines
        va.compile_defines = lambda arch, config=None: {**plain(arch, config), **defines}

    dev = dl.Device(0)
    stream = dev.create_stream()
    flush = dl.DeviceBuffer.allocate(dev, 256 << 20, label="l2-flush").as_array()
    print(f"# {dev.name} ({dev.arch}), {time.strftime('%Y-%m-%d %H:%M')}; tiles: "
          + ", ".join(f"{n}=" + ("this GPU's default" if t is None else "its default with the reduce-scatter exchange"
                                 if callable(t) else t.label) for n, t in tiles)
          + (f"; extra defines {defines}" if defines else ""), flush=True)
    if args.quick:
        shapes = [(h, b, p, n) for h, b, p in ((9, 1, 32768), (16, 8, 4096), (16, 8, 32768), (9, 1, 200000))
                  for n in (16, 256)]
    else:
        shapes = [(h, b, p, n) for b in (1, 8) for p in (4096, 32768, 131072) for h in (9, 16) for n in (16, 64, 256)]
    print(f"{'heads':>5} {'bs':>3} {'prefix':>7} {'tok':>4} " + " ".join(f"{n:>16}" for n, _ in tiles)
          + "   (ms / TFLOP/s; max rel diff vs first)", flush=True)
    results = []
    for heads, bs, prefix, ntok in shapes:
        iters = 5 if bs * prefix * ntok * heads > 2e9 else 10
        d = None
        row, first, worst = [], None, 0.0
        for name, tile in tiles:
            if callable(tile):
                tile = tile(dev.arch, ntok * heads)
            plan = VerifyAttention(dev, heads, max_batch=bs, max_q=ntok, tile=tile)
            if d is None:
                d = make_data(torch, dev, heads, [prefix] * bs, ntok, False, plan.mask_words, heads * 1000 + bs * 100 + ntok)
            ms, out = time_plan(dl, dev, stream, flush, plan, d, iters)
            plan.check_errors(stream)
            flop = 2.0 * bs * ntok * heads * (prefix + ntok) * (576 + 512)
            diff = 0.0
            if first is None:
                first = out
            else:
                diff = float((out.float() - first.float()).norm() / first.float().norm())
                worst = max(worst, diff)
            c = plan.config
            results.append(dict(heads=heads, batch=bs, prefix=prefix, draft_tokens=ntok, tile_name=name,
                                tile=dataclasses.asdict(c),
                                median_ms=ms, tflops=flop / (ms / 1e3) / 1e12, rel_diff_vs_first=diff))
            row.append(f"{ms:8.3f}/{flop / (ms / 1e3) / 1e12:6.1f}")
            del plan
        print(f"{heads:>5} {bs:>3} {prefix:>7} {ntok:>4} " + " ".join(f"{x:>16}" for x in row) + f"   {worst:.1e}",
              flush=True)
        del d, first
        torch.cuda.empty_cache()
    summary(results, names, ratios)
    if args.json:
        status = dump_json_file(args.json, dict(device=dev.name, arch=dev.arch, date=time.strftime("%Y-%m-%d"),
                                                results=results))
        if status:
            sys.exit(status)
    return results


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
    import tool_output  # (tools/tool_output.py: a failed write of stdout is one line, exit 2)

    sys.exit(tool_output.run(lambda: 0 if main() else 1, "benchmarks/bench_tiles.py"))
