"""Compare two sets of ``benchmarks/bench_ddtree.py --json`` results: an A/B of the DDTree build.

Each side is one or more result files (interleaved runs of the same tree, e.g. main and a branch
run alternately in one device call). Per (batch, budget, top-K mode) it prints every run's value
and the difference of the medians, B - A, for the build, the top-K launches and the whole step
(GPU µs), then the medians of the build's cumulative launch times (sample, +stream, +fallback,
+tree). The numbers in BENCHMARKS.md's A/B tables come from this table.

Usage::

    python tools/bench_ddtree_ab.py A1.json [A2.json ...] --vs B1.json [B2.json ...]

Rows pair by batch, budget, top-K mode and programmatic launch (``pdl``: a ``--pdl both`` file's
off and on rows are two configurations, not two runs). Every file must have been measured the same
way: the settings each records beside its rows (device, vocabulary, depth limit, logits dtype,
drafter, search, L2 flush...) must agree over both sides, a setting an older file lacks excepted.

Needs no GPU. Exits 2 with a message when a file cannot be read or is not bench_ddtree JSON, when
the files' settings differ, when a side's files hold no rows (nothing to compare), or when the two
sides do not hold the same configurations (also when they have none in common).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

COLUMNS = ("build", "topk", "step")


def _read(p: str) -> dict:
    """File ``p``'s JSON object with its ``results`` list (raises ``ValueError`` naming the file)."""
    try:
        text = Path(p).read_text()
    except OSError as exc:
        raise ValueError(f"{p}: cannot read it ({exc.strerror or exc})") from exc
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"{p}: not JSON ({exc})") from exc
    if not isinstance(data, dict) or not isinstance(data.get("results"), list):
        raise ValueError(f"{p}: not a bench_ddtree result file (no 'results' list)")
    return data


def check_settings(paths: list[str]) -> None:
    """Raises ``ValueError`` naming the setting and two files when the files' settings (every
    top-level entry but ``results``) differ; a setting one file lacks (an older bench_ddtree) is not
    compared."""
    seen: dict = {}
    for p in paths:
        for k, v in _read(p).items():
            if k == "results":
                continue
            if k in seen and seen[k][0] != v:
                raise ValueError(f"the files were measured differently: {k} is {seen[k][0]!r} in {seen[k][1]} "
                                 f"but {v!r} in {p}")
            seen.setdefault(k, (v, p))


def load_side(paths: list[str], any_topk: bool = False) -> dict:
    """``{(batch, budget, topk, pdl): {column: [µs, ...], "parts": [[µs, ...], ...]}}`` over the
    files (``any_topk``: the key's topk is ``"any"``, for an A/B of two top-K modes, e.g. main's
    threshold build against a patch's persistent one; ``pdl`` None where a row does not record it).

    Raises ``ValueError`` naming the file when one cannot be read or has no ``results`` list of
    bench_ddtree rows (batch, budget, top-K mode, GPU µs)."""
    out: dict = {}
    for p in paths:
        data = _read(p)
        try:
            for r in data["results"]:
                if not isinstance(r, dict):  # (r.get below: an AttributeError, a traceback)
                    row = json.dumps(r)
                    raise TypeError(f"a row is {row[:60]}{'...' if len(row) > 60 else ''}, not an object")
                pdl = r.get("pdl")
                key = (int(r["batch"]), int(r["budget"]), "any" if any_topk else str(r.get("topk", "")),
                       None if pdl is None else bool(pdl))
                entry = out.setdefault(key, {c: [] for c in COLUMNS} | {"parts": []})
                for c in COLUMNS:
                    entry[c].append(float(r["gpu_us"][c]))
                entry["parts"].append([float(x) for x in r.get("build_parts_cumulative_us") or []])
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{p}: not a bench_ddtree result file of this format (a row without "
                             f"{exc} or with a bad value)" if isinstance(exc, KeyError) else
                             f"{p}: not a bench_ddtree result file ({type(exc).__name__}: {exc})") from exc
    return out


def median_parts(parts: list[list[float]]) -> list[float]:
    """Per position, the median over the runs that recorded the build's cumulative parts."""
    runs = [p for p in parts if p]
    return [statistics.median(x) for x in zip(*runs)] if runs else []


def _order(key: tuple) -> tuple:
    """A configuration's sort key: ``pdl`` None (not recorded) before off and on (None and a bool do not compare)."""
    batch, budget, topk, pdl = key
    return batch, budget, topk, -1 if pdl is None else int(pdl)


def table(a: dict, b: dict) -> list[str]:
    """The comparison's lines (raises ``ValueError`` when a side holds no rows, nothing to compare, or
    when the configurations differ: rows with none in common are configurations that differ)."""
    for side, rows in (("A", a), ("B", b)):
        if not rows:
            raise ValueError(f"nothing to compare: side {side}'s files hold no rows")
    if not set(a) & set(b):
        raise ValueError(f"nothing to compare: the two sides hold different configurations, none in common: "
                         f"A {sorted(a, key=_order)}, B {sorted(b, key=_order)}")
    if set(a) != set(b):
        raise ValueError(f"the two sides hold different configurations: {sorted(set(a) ^ set(b), key=_order)}")
    both_pdl = len({k[3] for k in a}) > 1  # (a --pdl both file: its rows' top-K labelled with it)
    w = 15 if both_pdl else 9
    lines = [f"{'batch/budget':>12} {'top-K':>{w}} {'column':>6} {'A runs':>24} {'B runs':>24} {'B-A med':>8}"]
    for key in sorted(a, key=_order):
        batch, budget, topk, pdl = key
        if both_pdl:
            topk = f"{topk}/{'pdl' if pdl else 'nopdl' if pdl is not None else '?'}"
        for c in COLUMNS:
            ra, rb = a[key][c], b[key][c]
            diff = statistics.median(rb) - statistics.median(ra)
            lines.append(f"{f'{batch}/{budget}':>12} {topk:>{w}} {c:>6} {' '.join(f'{x:.1f}' for x in ra):>24} "
                         f"{' '.join(f'{x:.1f}' for x in rb):>24} {diff:+8.2f}")
        pa, pb = median_parts(a[key]["parts"]), median_parts(b[key]["parts"])
        if pa or pb:
            lines.append(f"{'':>12} {'':>{w}} parts  A {' '.join(f'{x:.1f}' for x in pa)}  B {' '.join(f'{x:.1f}' for x in pb)}")
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
        check_settings(args.a + args.vs)
        lines = table(load_side(args.a, args.any_topk), load_side(args.vs, args.any_topk))
    except ValueError as exc:
        ap.exit(2, f"{ap.prog}: error: {exc}\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import tool_output  # (tools/tool_output.py: a failed write of stdout is one line, exit 2)

    sys.exit(tool_output.run(main, "tools/bench_ddtree_ab.py"))
