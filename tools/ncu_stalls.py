#!/usr/bin/env python3
"""Warp-stall samples of one kernel per SASS instruction, from Nsight Compute's source page.

Reads the CSV that ``ncu -i REPORT.ncu-rep --page source --print-source sass --csv`` prints for a
report collected with ``--section SourceCounters`` (the recipe for ddtree_build is in
``benchmarks/profile_topk.py``) and prints where the samples fall: the totals by stall reason (the
``stall_*`` columns: ``no_inst`` is an instruction-cache miss or fetch wait, ``wait`` a fixed-latency
dependency, ``short_sb`` a shared-memory result, ``barrier`` a block barrier), the same per block of
instructions, and the instructions with the most samples. ``--range`` restricts everything to SASS
rows [A, B) (row 0 is the first instruction), e.g. one loop found in the per-block table.

Samples count warps, not time: a warp waiting at a barrier is sampled as often as the one that works,
so a one-warp phase (the heap) shows as few samples next to the barrier of the other fifteen.

Usage: python tools/ncu_stalls.py SASS.csv [--range A B] [--block 250] [--top 15]
"""

from __future__ import annotations

import argparse
import collections
import csv
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def read_rows(path):
    """The instruction rows of an ncu source-page CSV: a list of dicts with 'sass', 'samples',
    'executed' and 'stalls' (reason -> samples, not-issued columns left out).

    Raises ValueError when the file has no SASS / sample columns (not a ``--page source`` CSV of a
    report with SourceCounters)."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    start = next((i for i, r in enumerate(rows) if SAMPLES in r), None)
    if start is None:
        raise ValueError(f"{path}: no {SAMPLES!r} column (collect with --section SourceCounters and print "
                         "with --page source --print-source sass --csv)")
    hdr = rows[start]
    ix = {h: i for i, h in enumerate(hdr)}
    if "Source" not in ix:
        raise ValueError(f"{path}: no 'Source' column")
    reasons = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    out = []
    for r in rows[start + 1:]:
        if len(r) < len(hdr):
            continue
        num = lambda name: int(r[ix[name]] or 0) if name in ix and r[ix[name]].strip().lstrip("-").isdigit() else 0
        out.append({"sass": r[ix["Source"]].strip(), "samples": num(SAMPLES), "executed": num(EXECUTED),
                    "stalls": {h[len("stall_"):]: num(h) for h in reasons}})
    return out


def by_reason(rows):
    """Samples per stall reason over `rows`, largest first."""
    c = collections.Counter()
    for r in rows:
        c.update(r["stalls"])
    return [(k, v) for k, v in c.most_common() if v]


def fmt_reasons(pairs, total, n=5):
    return ", ".join(f"{k} {v} ({100 * v / total:.0f}%)" for k, v in pairs[:n]) if total else "-"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", help="ncu --page source --print-source sass --csv output")
    ap.add_argument("--range", nargs=2, type=int, metavar=("A", "B"), help="SASS rows [A, B) only")
    ap.add_argument("--block", type=int, default=250, help="instructions per block of the per-block table")
    ap.add_argument("--top", type=int, default=15, help="instructions listed")
    args = ap.parse_args(argv)
    if args.block < 1 or args.top < 0:
        ap.error("--block must be >= 1 and --top >= 0")
    try:
        rows = read_rows(args.csv)
    except (OSError, ValueError) as e:
        ap.error(str(e))
    a, b = args.range if args.range else (0, len(rows))
    if not 0 <= a < b <= len(rows):
        ap.error(f"--range must lie in [0, {len(rows)}] with A < B, got {a} {b}")
    sel = list(enumerate(rows))[a:b]
    total = sum(r["samples"] for _, r in sel)
    print(f"{args.csv}: SASS rows {a}..{b - 1} of {len(rows)}, {total} samples")
    print(f"  by reason: {fmt_reasons(by_reason([r for _, r in sel]), total, 8)}")
    print(f"  per block of {args.block} instructions (blocks with >= 1% of the samples):")
    blocks = collections.defaultdict(list)
    for i, r in sel:
        blocks[i // args.block].append(r)
    for k in sorted(blocks):
        s = sum(r["samples"] for r in blocks[k])
        if total and s >= 0.01 * total:
            ex = [r["executed"] for r in blocks[k] if r["executed"]]
            span = f"executed {min(ex)}..{max(ex)}" if ex else "not executed"
            print(f"    {k * args.block:6d}  {s:6d}  {span:22s} {fmt_reasons(by_reason(blocks[k]), s, 3)}")
    print(f"  top {args.top} instructions:")
    for i, r in sorted(sel, key=lambda t: -t[1]["samples"])[:args.top]:
        if r["samples"]:
            top = sorted(r["stalls"].items(), key=lambda kv: -kv[1])[:2]
            print(f"    {i:6d}  {r['samples']:5d}  x{r['executed']:<5d} {r['sass'][:56]:56s} "
                  + ", ".join(f"{k} {v}" for k, v in top if v))
    return 0


if __name__ == "__main__":
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import tool_output  # (tools/tool_output.py: a failed write of stdout is one line, exit 2)

    sys.exit(tool_output.run(main, "tools/ncu_stalls.py"))
