"""Compare two sets of ``benchmarks/bench_ddtree.py --json`` results: an A/B of the DDTree build.

Each side is one or more result files (interleaved runs of the same tree, e.g. main and a branch
run alternately in one device call). Per (batch, budget, top-K mode) it prints every run's value
and the difference of the medians, B - A, for the build, the top-K launches and the whole step
(GPU µs), then the medians of the build's cumulative launch times (sample, +stream, +fallback,
+tree). The numbers in BENCHMARKS.md's A/B tables come from this table.

Usage::

    python tools/bench_ddtree_ab.py A1.json [A2.json ...] --vs B1.json [B2.json ...]

Needs no GPU. Exits 2 with a message when a file is not bench_ddtree JSON, or when the two sides
do not hold the same configurations.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

COLUMNS = ("build", "topk", "step")


def load_side(paths: list[str], any_topk: bool = False) -> dict:
    """``{(batch, budget, topk): {column: [µs, ...], "parts": [[µs, ...], ...]}}`` over the files
    (``any_topk``: the key's topk is ``"any"``, for an A/B of two top-K modes, e.g. main's threshold
    build against a patch's persistent one).

    Raises ``ValueError`` naming the file when one has no ``results`` list of bench_ddtree rows."""
    out: dict = {}
    for p in paths:
        try:
            data = json.loads(Path(p).read_text())
            rows = data["results"]
            for r in rows:
                key = (int(r["batch"]), int(r["budget"]), "any" if any_topk else str(r.get("topk", "")))
                entry = out.setdefault(key, {c: [] for c in COLUMNS} | {"parts": []})
                for c in COLUMNS:
                    entry[c].append(float(r["gpu_us"][c]))
                entry["parts"].append([float(x) for x in r.get("build_parts_cumulative_us") or []])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{p}: not a bench_ddtree result file ({type(exc).__name__}: {exc})") from exc
    return out


def median_parts(parts: list[list[float]]) -> list[float]:
    """Per position, the median over the runs that recorded the build's cumulative parts."""
    runs = [p for p in parts if p]
    return [statistics.median(x) for x in zip(*runs)] if runs else []


def table(a: dict, b: dict) -> list[str]:
    """The comparison's lines (raises ``ValueError`` when the configurations differ)."""
    if set(a) != set(b):
        raise ValueError(f"the two sides hold different configurations: {sorted(set(a) ^ set(b))}")
    lines = [f"{'batch/budget':>12} {'top-K':>9} {'column':>6} {'A runs':>24} {'B runs':>24} {'B-A med':>8}"]
    for key in sorted(a):
        batch, budget, topk = key
        for c in COLUMNS:
            ra, rb = a[key][c], b[key][c]
            diff = statistics.median(rb) - statistics.median(ra)
            lines.append(f"{f'{batch}/{budget}':>12} {topk:>9} {c:>6} {' '.join(f'{x:.1f}' for x in ra):>24} "
                         f"{' '.join(f'{x:.1f}' for x in rb):>24} {diff:+8.2f}")
        pa, pb = median_parts(a[key]["parts"]), median_parts(b[key]["parts"])
        if pa or pb:
            lines.append(f"{'':>12} {'':>9} parts  A {' '.join(f'{x:.1f}' for x in pa)}  B {' '.join(f'{x:.1f}' for x in pb)}")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", nargs="+", help="side A: bench_ddtree --json files")
    ap.add_argument("--vs", nargs="+", required=True, metavar="B", help="side B: bench_ddtree --json files")
    ap.add_argument("--any-topk", action="store_true",
                    help="pair rows by batch and budget whatever their top-K mode (an A/B of two modes: main's "
                         "threshold build against a patch's persistent one, research/patches/ab_next.sh with "
                         "VARIANT_TOPK=fused)")
    args = ap.parse_args(argv)
    try:
        lines = table(load_side(args.a, args.any_topk), load_side(args.vs, args.any_topk))
    except ValueError as exc:
        ap.exit(2, f"{ap.prog}: error: {exc}\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
