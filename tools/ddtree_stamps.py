"""Per-phase time of ``ddtree_build`` (a developer tool for the tree build's speed): where the tree
build's last launch spends its time.

Builds a :class:`~driverlevel.DDTreePlan` whose kernels are compiled with ``-DDL_STAMPS=1``
(``cu/ddtree/stamps.cuh``, ``cu/phase_stamps.cuh``: thread 0 of each CTA of ``ddtree_build``, and for ``lsedone`` the
first thread of the row merge's log-sum-exp warp, records the SM clock and the
global timer at named points into module globals; without the define the kernels are unchanged),
runs one build of the benchmark's inputs (``benchmarks/bench_ddtree.py``: by default its random
drafter rows, nearly flat, whose trees are stars; ``--drafter peaked`` for deep trees; vocabulary
163,840 (``--vocab``), depth 15) after a warm-up, and prints two tables:

* per phase, the median and maximum cycles over the CTAs that passed it (differences of
  ``clock64`` within one CTA):

  * the row merge, every row CTA: ``merge`` (from ``entry``, the kernel's first instruction, to the
    start of the row merge just past its PDL wait: about the wait for the top-K kernels), ``loaded`` (candidates in
    registers, block max), ``selected``
    (the K-th largest), ``lse`` (the picked ones placed), then two overlapped parts, ``lsedone``
    (the last warp's log-sum-exp) and ``sortdone`` (thread 0's part of the bitonic sort), in
    clock order, and ``sorted`` (both done, the top-K written). The phases are differences of
    consecutive points in clock order, so the one after ``lse`` ends at whichever of the two
    overlapped points came first;
  * the request's last CTA: ``last`` (the counter after the fence), ``lp`` (log-probs to shared
    memory; warp 0 also finds the search's bounds of the keys there), ``srchpro`` (the search's
    prologue: the histogram cleared), ``d1count`` / ``d1gen`` (the first depth's children
    counted / stored), ``depth`` 1..15 (the parallel search's rounds; ``pop`` 4, 8, .. 60
    instead where the one-warp heap runs; with ``--detail-depth N`` also ``count``, ``scan``,
    ``offs``, ``gen`` and ``bstar`` inside depth N), ``generate`` (the loop's end), ``searched``
    (the ranking, or the one-warp heap), ``nodes`` (nodes and ancestor masks);
* a timeline in µs of the global timer from the first CTA's ``merge`` point: when the row CTAs
  start and finish their merge (first, median, last), and when each request's last CTA reaches
  its search and its end.

With ``--chain``, also the top-K kernels' CTAs (``DDT_TK_STAMP``: entry, past the PDL wait (the
sample kernel: its keys loaded), exit; the stream's CTAs also ``tile0`` (its first tile done),
``looped`` (its last), ``flushed`` (its warps' staged candidates appended) and ``reduced`` (past
the barrier of the segment's sums))
and a timeline of the whole chain, sample, stream and ``ddtree_build`` (which runs the chunk fallback of
a row the threshold failed itself), in µs of the
global timer from the sample kernel's first CTA: how the launches overlap as they run with PDL (Nsight
Compute serialises them). ``--flush read`` evicts L2 before the stamped build as bench_ddtree does
(256 MB read, then a spin kernel, ``--spin-us``, 500 µs by default, so that the host's launches are all
queued; 100 µs left some of the eager build's launches late in the thirty-sixth session). A chain
whose kernel entered well after the previous one's end says so: its launch was late.
``--flush drafted`` writes the drafter logits again after that read (bench_ddtree's ``--flush
drafted``): the logits in L2 as a drafter leaves them, the build's code and other data not.
``--repeat N`` takes N stamped builds and prints a line per build before the tables (the last
build's): one stamped build can be an outlier (the thirty-sixth session saw the merge's phases
2.3x longer in some single builds, shared-memory-only phases included).
``--evict-code`` runs, before that flush, a kernel of ~290 KB of straight-line code on every SM
(``bench_ddtree.CodeEvict``), so that no SM's instruction caches still hold ``ddtree_build``'s code from the
warm-up, as in a decode step where the verify kernel and the model run between two builds.

A record costs a few tens of cycles (a global store by thread 0), so the phases are close to the
uninstrumented kernel's; bench_ddtree's times stay the reference.

Usage::

    python tools/ddtree_stamps.py [--batch 1 8] [--budget 256] [--logits-dtype float32] [--chain --flush read]
                                  [--evict-code] [--repeat 5] [--spin-us 100]

Needs a GPU.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import phase_stamps  # noqa: E402  (tools/phase_stamps.py)


def parse_args(argv=None) -> argparse.Namespace:
    from driverlevel.ddtree import TOPK_MODES

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8], help="requests per build (1..16: the stamp rows of "
                    "cu/ddtree/stamps.cuh hold ddtree_build's CTAs below row 256)")
    ap.add_argument("--budget", type=int, nargs="+", default=[256], help="tree budgets (1..512)")
    ap.add_argument("--vocab", type=int, default=163_840,
                    help="the drafter's vocabulary (bench_ddtree's --vocab: Kimi's by default; the demo step's is "
                         "32768); a multiple of 8, >= 512, within the merge's capacity at each --budget")
    ap.add_argument("--logits-dtype", choices=("float32", "bfloat16"), default="float32",
                    help="the drafter logits' dtype")
    ap.add_argument("--drafter", choices=("random", "peaked", "jittered", "clustered"), default="random",
                    help="bench_ddtree's drafter rows: random (nearly flat; star trees), peaked or jittered (deep "
                         "trees), clustered (random, plus large logits in runs of 16 ids: some rows fall back)")
    ap.add_argument("--topk", choices=TOPK_MODES, default="threshold",
                    help="the plan's top-K (DDTreePlan's topk): the merge of a threshold row's candidates, or of the "
                         "chunk kernel's (--chain then shows the chunk kernel, its times from that kernel's first "
                         "CTA, and no stream table)")
    ap.add_argument("--search", choices=("parallel", "heap"), default="parallel",
                    help="parallel, or heap (DDTreePlan.flags = FLAG_LEGACY_SEARCH)")
    ap.add_argument("--detail-depth", type=int, default=None, metavar="N",
                    help="also stamp the steps inside the parallel search's depth N (1..15; -DDL_STAMPS_DETAIL=N): "
                         "count (thread 0's parents), scan, offs, gen, bstar; the depth stamps then stop at 10")
    ap.add_argument("--chain", action="store_true",
                    help="also the top-K kernels' stamps and the timeline of the whole chain (sample, stream, "
                         "chunks, build)")
    ap.add_argument("--evict-code", action="store_true",
                    help="before the stamped build (and its flush), run a kernel with ~290 KB of code on every SM: "
                         "the build's code leaves the SMs' instruction caches")
    ap.add_argument("--twice", action="store_true",
                    help="a diagnostic: each row CTA runs its merge twice and the last CTA its parallel search "
                         "twice (-DDL_STAMPS_TWICE, one copy of the code); the tables show the second runs, whose "
                         "code is in the SMs' instruction caches. The sample kernel runs its select twice too: "
                         "the chain's sample keys -> exit then spans both runs (its excess over a plain stamped "
                         "build's is the warm select)")
    ap.add_argument("--rowseen", action="store_true",
                    help="a diagnostic for --chain: before its PDL wait, thread 0 of each stream CTA polls its "
                         "row's sample exit record (at most 50 µs; -DDL_STAMPS_ROWSEEN) and stamps ``rowseen``: "
                         "when a per-row handoff of T, instead of the wait for the whole sample grid, would let "
                         "it go on (compare ``stream waited``); the poll's loads add a little traffic")
    ap.add_argument("--flush", choices=("read", "drafted", "none"), default="none",
                    help="read: evict L2 before the stamped build (bench_ddtree's --flush read) and queue the "
                         "build behind a spin (--spin-us); drafted: read, then the drafter logits written again "
                         "(bench_ddtree's --flush drafted: the logits in L2, the build's code not); none: the build "
                         "right after its warm-up")
    ap.add_argument("--spin-us", type=int, default=500, metavar="US",
                    help="with --flush read or drafted: the spin kernel's length (µs, 0..100000) that the host's launches "
                         "queue behind; a chain whose launches were queued late says so (launch_gaps)")
    ap.add_argument("--repeat", type=int, default=1, metavar="N",
                    help="stamped builds per batch and budget (1..50), each after the same eviction, flush and "
                         "spin; with N > 1 a line per build (the merge's phases and the end) comes before the "
                         "tables, which are the last build's: one stamped build can be an outlier")
    args = ap.parse_args(argv)
    for name, values, lo, hi in (("--batch", args.batch, 1, 16), ("--budget", args.budget, 1, 512),
                                 ("--spin-us", [args.spin_us], 0, 100_000), ("--repeat", [args.repeat], 1, 50)):
        bad = [v for v in values if not lo <= v <= hi]
        if bad:
            ap.error(f"{name} must be in {lo}..{hi}, got {bad if len(values) > 1 else bad[0]}")  # (a list for nargs)
    if args.detail_depth is not None and not 1 <= args.detail_depth <= 15:
        ap.error(f"--detail-depth must be in 1..15, got {args.detail_depth}")
    if args.vocab < 512 or args.vocab % 8:
        ap.error(f"--vocab must be a multiple of 8, >= 512, got {args.vocab}")
    from driverlevel.ddtree import check_merge_capacity
    for budget in args.budget:  # DDTreePlan's vocabulary x budget rule, before any GPU work
        try:
            check_merge_capacity(args.vocab, budget)
        except ValueError as exc:
            ap.error(f"--vocab {args.vocab} with budget {budget}: {exc}")
    return args


def stamp_defines(detail_depth=None, twice=False, rowseen=False) -> dict:
    """The defines a stamped build adds to ddtree.cu's: DL_STAMPS, DL_STAMPS_DETAIL for
    ``--detail-depth``, DL_STAMPS_TWICE for ``--twice`` and DL_STAMPS_ROWSEEN for ``--rowseen``."""
    return {"DL_STAMPS": 1, **({"DL_STAMPS_DETAIL": int(detail_depth)} if detail_depth is not None else {}),
            **({"DL_STAMPS_TWICE": 1} if twice else {}), **({"DL_STAMPS_ROWSEEN": 1} if rowseen else {})}


def point_name(point: str, arg: int) -> str:
    """A record's name in the tables: ``depth`` points carry their depth, the heap's ``pop`` points
    their pop count."""
    if point == "depth":
        return f"depth {arg:2d}"
    return f"pop {arg:3d}" if point == "pop" else point


def chronological(ctas: dict) -> dict:
    """Each CTA's records ordered by their SM clock (the slots are not in time order)."""
    return {k: sorted(v, key=lambda r: r[2]) for k, v in ctas.items()}


def split_warmer(ctas: dict, depth_limit: int, row: int = 0) -> tuple:
    """``(the other CTAs' records, the code warmer's)``: ddtree_build's CTA (depth_limit, 0) runs the
    search on data of its own (cu/ddtree/build.cuh); its stamp row is ``0 * (depth_limit + 1) +
    depth_limit``. Its records (``[]`` when it stamped nothing) stay out of the tables. ``row`` 1:
    the second warmer, CTA (depth_limit, 1) (from batch 2 at budgets up to 16: the heap's warmer), stamp row ``depth_limit + 1 + depth_limit``."""
    key = row * (depth_limit + 1) + depth_limit
    rows = {k: v for k, v in ctas.items() if k != key}
    return rows, list(ctas.get(key, []))


def warmer_points(warmer: list, t0: int) -> str:
    """The code warmer's points in time order as ``name µs`` (µs after ``t0``, the first CTA's
    ``merge``, global timer ns): where its lead over the request's search goes."""
    return ", ".join(f"{point_name(p, a)} {(t - t0) / 1e3:.2f}" for p, a, _, t in sorted(warmer, key=lambda r: r[3]))


def order_of(ctas: dict) -> list[str]:
    """Point names in time order: those of the CTA with the most records, then any others."""
    names = []
    for recs in sorted(chronological(ctas).values(), key=len, reverse=True):
        names += [n for n in (point_name(p, a) for p, a, _, _ in recs) if n not in names]
    return names


def phases(ctas: dict) -> dict:
    """``{phase name: [cycles, ...]}``: consecutive points of each CTA (in clock order), named by
    the later one."""
    out = defaultdict(list)
    for stamps in chronological(ctas).values():
        for (_, _, c0, _), (p1, a1, c1, _) in zip(stamps, stamps[1:]):
            out[point_name(p1, a1)].append(c1 - c0)
    return out


def row_counts(ctas: dict) -> list[str]:
    """Lines on the rows' merge, from the arguments of its stamps (min / median / max over the rows;
    no line for a point no row stamped): ``loaded``'s is the row's ``n_cand`` (candidates >= T that
    the stream listed, or the build's chunk fallback's), ``selected``'s -1 for a row ranked by the
    merge's histogram (build.cuh, ``hist_rank``), else the select's histogram levels plus 64 x the
    values its warp ranking gathered (keys.cuh, ``SelectSmem::levels``; a crowded row's select stamps
    over its histogram's stamp). The select's work grows with both."""
    def summary(values):
        return f"{min(values)} / {statistics.median(values):g} / {max(values)}"

    args = defaultdict(list)
    for recs in ctas.values():
        for p, a, _, _ in recs:
            args[p].append(a)
    out = []
    if n := args.get("loaded"):
        out.append(f"candidates per row (loaded): {summary(n)} over {len(n)} rows")
    if sel := args.get("selected"):
        hist = sum(a < 0 for a in sel)
        if hist:
            out.append(f"rows ranked by the merge's histogram (selected): {hist} of {len(sel)}")
        if sel := [a for a in sel if a >= 0]:
            out.append(f"select per row (selected): levels {summary([a % 64 for a in sel])}, gathered "
                       f"{summary([a // 64 for a in sel])} over {len(sel)} rows")
    return out


def measured_clock_ghz(ctas: dict, min_ns: int = 2000):
    """The SM clock the stamps saw: over each CTA whose stamps span at least ``min_ns`` of the global
    timer, its ``clock64`` cycles over ``%globaltimer`` ns from its first to its last stamp; the median
    over those CTAs (GHz), or None when none spans that long. The tables' µs use the device's nominal
    clock; a lower measured clock (power or thermal limits) makes the real phases that much longer."""
    rates = []
    for recs in ctas.values():
        c0, c1 = min(r[2] for r in recs), max(r[2] for r in recs)
        g0, g1 = min(r[3] for r in recs), max(r[3] for r in recs)
        if g1 - g0 >= min_ns:
            rates.append((c1 - c0) / (g1 - g0))
    return statistics.median(rates) if rates else None


#: First stamp rows of the top-K kernels' CTAs (DDT_TK_ROW_* of cu/ddtree/stamps.cuh); ddtree_build's
#: rows are below the first.
TK_ROWS = (("sample", 256), ("stream", 512), ("chunks", 4608))


def check_stamp_rows(plan) -> None:
    """Raise ``ValueError`` unless every CTA of ``plan``'s build has stamp rows of its own: ddtree_build's
    ``(depth_limit + 1) * max_batch`` CTAs below the sample's first row, each top-K kernel's grid below
    the next kernel's first row, all below DL_STAMP_ROWS (cu/phase_stamps.cuh). Overlapping rows would
    mix two CTAs' records silently."""
    rows = plan.max_batch * plan.depth_limit
    threshold = plan.topk == "threshold"  # (chunked: the chunk kernel alone, one CTA per chunk)
    grids = {"ddtree_build": (plan.depth_limit + 1) * plan.max_batch, "sample": rows if threshold else 0,
             "stream": plan.tk_nseg * rows if threshold else 0, "chunks": 0 if threshold else plan.num_chunks * rows}
    room = {"ddtree_build": TK_ROWS[0][1], "sample": TK_ROWS[1][1] - TK_ROWS[0][1],
            "stream": TK_ROWS[2][1] - TK_ROWS[1][1], "chunks": phase_stamps.ROWS - TK_ROWS[2][1]}
    over = [f"{k} {grids[k]} CTAs > {room[k]} rows" for k in grids if grids[k] > room[k]]
    if over:
        raise ValueError("the stamped build has more CTAs than stamp rows: " + ", ".join(over))


def split_topk(ctas: dict) -> tuple:
    """``(ddtree_build's rows, the top-K kernels' rows)``; the latter with each point named after its
    kernel (``"stream waited"``)."""
    build = {k: v for k, v in ctas.items() if k < TK_ROWS[0][1]}
    topk = {}
    for k, v in ctas.items():
        kernel = [n for n, base in TK_ROWS if k >= base]
        if kernel:
            topk[k] = [(f"{kernel[-1]} {p}", a, c, g) for p, a, c, g in v]
    return build, topk


def chain_origin(topk: dict) -> str:
    """The point the chain's times count from: the sample kernel's first ``entry`` (a threshold build's
    first kernel), or the chunk kernel's for a chunked build, which has no sample kernel."""
    points = {point for recs in topk.values() for point, *_ in recs}
    return "sample entry" if "sample entry" in points or "chunks entry" not in points else "chunks entry"


def chain_timeline(build: dict, topk: dict) -> list[str]:
    """The whole chain's timeline (µs from its first kernel's first ``entry``, :func:`chain_origin`):
    the top-K kernels' points, then ddtree_build's entry, merge start, rows sorted, and the search's
    end."""
    keep = ("entry", "merge", "sorted", "last", "nodes")
    rows = dict(topk)
    for k, v in build.items():
        rows[("build", k)] = [(f"build {p}", a, c, g) for p, a, c, g in v if p in keep]
    points = ("entry", "keys", "rowseen", "waited", "tile0", "looped", "flushed", "reduced",
              "exit")  # (rowseen and the four after waited: stream)
    order = [f"{n} {p}" for n, _ in TK_ROWS for p in points] + [f"build {p}" for p in keep]
    return phase_stamps.timeline(rows, order, chain_origin(topk))


def stream_by_sm(topk: dict) -> list[str]:
    """The stream kernel's CTAs grouped by how many of them ran on one SM (the top-K stamps'
    argument is the SM, cu/ddtree/stamps.cuh): per group the SMs, the CTAs, the median and last
    exit in µs from the sample's first entry, and the median µs from a CTA's PDL wait to its exit.
    Every stream CTA streams the same bytes, so if the SMs that hold more CTAs finish later, their
    CTAs got smaller shares of the bandwidth (the twenty-ninth session's question about batch 8's
    480 CTAs on 132 SMs)."""
    starts = [g for recs in topk.values() for point, _, _, g in recs if point == "sample entry"]
    if not starts:
        return ["(no sample entry recorded)"]
    t0 = min(starts)
    per_sm = defaultdict(list)  # SM -> [(waited ns or None, exit ns)]
    for recs in topk.values():
        at = {point: (arg, g) for point, arg, _, g in recs}
        if "stream exit" in at:
            sm, gexit = at["stream exit"]
            per_sm[sm].append((at["stream waited"][1] if "stream waited" in at else None, gexit))
    if not per_sm:
        return ["(no stream exit recorded)"]
    groups = defaultdict(list)
    for ctas in per_sm.values():
        groups[len(ctas)].extend(ctas)
    lines = [f"{'CTAs / SM':>9s} {'SMs':>5s} {'CTAs':>5s} {'median exit':>11s} {'last exit':>9s} {'median work':>11s}"]
    for n in sorted(groups):
        exits = [(e - t0) / 1e3 for _, e in groups[n]]
        work = [(e - w) / 1e3 for w, e in groups[n] if w is not None]
        lines.append(f"{n:9d} {len(groups[n]) // n:5d} {len(exits):5d} {statistics.median(exits):11.2f} "
                     f"{max(exits):9.2f} {statistics.median(work) if work else float('nan'):11.2f}")
    return lines


#: The merge's phases that ``repeat_lines`` follows from build to build: its select, the placing of
#: the picked composites (shared memory only) and the sort; the search's end.
REPEAT_PHASES = ("selected", "lse", "sorted", "searched")


def repeat_lines(builds: list, clock_khz: int) -> list[str]:
    """One line per stamped build of ``--repeat`` (``builds``: each build's row CTAs' records, the
    code warmer split off): the median µs of each of REPEAT_PHASES over its CTAs (nominal clock;
    ``-`` where no CTA passed it) and its end, the last ``nodes`` point in µs of the global timer
    from its first ``merge``. A build whose phases all stand well above the others' was slowed as a
    whole (its code, say, fetched from DRAM), not in one phase."""
    lines = [f"{'build':>5s} " + " ".join(f"{k:>9s}" for k in REPEAT_PHASES) + f" {'end µs':>8s}"]
    for i, ctas in enumerate(builds):
        out = phases(ctas)
        cols = [f"{statistics.median(out[k]) / clock_khz * 1e3:9.2f}" if out.get(k) else f"{'-':>9s}"
                for k in REPEAT_PHASES]
        merges = [g for recs in ctas.values() for p, _, _, g in recs if p == "merge"]
        ends = [g for recs in ctas.values() for p, _, _, g in recs if p == "nodes"]
        end = f"{(max(ends) - min(merges)) / 1e3:8.2f}" if merges and ends else f"{'-':>8s}"
        lines.append(f"{i + 1:5d} " + " ".join(cols) + f" {end}")
    return lines


def launch_gaps(build: dict, topk: dict, min_gap_us: float = 5.0) -> list[str]:
    """Lines for the chain's late launches: each kernel (stream, ddtree_build; the chunk kernel of a
    chunked build or an older chain, which launched it between the two) whose first CTA entered more
    than ``min_gap_us`` after the previous stamped kernel's last CTA exited. Launched with PDL, a kernel's CTAs enter
    before the previous kernel ends, so such a gap means its launch reached the GPU late: most often
    a host that had not queued it when the spin ended (raise ``--spin-us``). The chain's timeline
    from that kernel on then measures the host, not the kernels. ``[]`` when there is none."""
    first, last = {}, {}
    for recs in topk.values():
        for point, _, _, g in recs:
            kernel, _, name = point.partition(" ")
            if name == "entry":
                first[kernel] = min(first.get(kernel, g), g)
            elif name == "exit":
                last[kernel] = max(last.get(kernel, g), g)
    entries = [g for recs in build.values() for p, _, _, g in recs if p == "entry"]
    if entries:
        first["build"] = min(entries)
    out = []
    chain = [k for k in ("sample", "stream", "chunks", "build") if k in first or k in last]
    for prev, nxt in zip(chain, chain[1:]):
        if prev in last and nxt in first and (gap := (first[nxt] - last[prev]) / 1e3) > min_gap_us:
            name = "ddtree_build" if nxt == "build" else f"the {nxt} kernel"
            out.append(f"late launch: {name}'s first CTA entered {gap:.2f} µs after the {prev} kernel's last "
                       f"exit (with PDL it enters before): its launch was queued late; raise --spin-us")
    return out


def timeline(ctas: dict) -> list[str]:
    """The global timer's view (µs from the first CTA's ``merge``): first / median / last CTA per point."""
    return phase_stamps.timeline(ctas, order_of(ctas), "merge", point_name)


def report(out: dict, clock_khz: int, order: list[str]) -> list[str]:
    """Table lines: per phase (in ``order``, then any other), the CTAs, median and maximum cycles."""
    order = [k for k in order if k in out] + [k for k in out if k not in order]
    rows = [f"{'phase':12s} {'CTAs':>5s} {'median cyc':>11s} {'max cyc':>9s} {'median µs':>10s}"]
    for k in order:
        if k in out:
            v = out[k]
            med = statistics.median(v)
            rows.append(f"{k:12s} {len(v):5d} {med:11.0f} {max(v):9d} {med / clock_khz * 1e3:10.2f}")
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import numpy as np
    from cuda.bindings import driver

    import driverlevel as dl
    from driverlevel import ddtree

    from driverlevel._device import require_gpu

    require_gpu()  # (one sentence and exit 2 without a GPU)
    dev = dl.Device(0)
    err, clock_khz = driver.cuDeviceGetAttribute(driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_CLOCK_RATE,
                                                 driver.cuDeviceGet(dev.ordinal)[1])
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuDeviceGetAttribute(CLOCK_RATE) failed: {err}")
    import bench_ddtree
    from bench_ddtree import DEPTH, CodeEvict, L2Flush, make_inputs

    bench_ddtree.VOCAB = args.vocab  # (make_inputs and drafter_logits read the module's)

    from driverlevel import selftest

    plain = ddtree.compile_defines
    extra = stamp_defines(args.detail_depth, args.twice, args.rowseen)
    ddtree.compile_defines = lambda arch, topk="threshold": {**plain(arch, topk), **extra}
    stream = dev.create_stream()
    flush = L2Flush(dev, stream, args.flush) if args.flush != "none" else None
    spin = selftest.load(dev).kernel("spin_wait_ns")
    evict = CodeEvict(dev) if args.evict_code else None
    try:
        for batch in args.batch:
            for budget in args.budget:
                plan = ddtree.DDTreePlan(dev, max_batch=batch, depth_limit=DEPTH, vocab=args.vocab, budget=budget,
                                         max_context=4096, logits_dtype=args.logits_dtype, target_dtype="bfloat16",
                                         topk=args.topk)
                check_stamp_rows(plan)
                if args.search == "heap":
                    plan.flags = ddtree.FLAG_LEGACY_SEARCH
                rng = np.random.default_rng(1000 * batch + budget)
                _, logits, _, _, state, _ = make_inputs(dev, stream, rng, plan, batch, args.logits_dtype,
                                                        args.drafter)
                if args.flush == "drafted":  # the logits written again after each flush
                    flush.draft_from(dev, stream, logits)
                plan.build(stream, logits, state)  # warm-up
                stream.synchronize()
                builds = []
                for _ in range(args.repeat):
                    phase_stamps.zero_stamps(plan._module)
                    if evict is not None:
                        evict(stream)
                    if flush is not None:
                        flush(stream, 0)
                        spin.launch(stream, 1, 32, [np.int64(args.spin_us * 1000)])
                    plan.build(stream, logits, state)
                    stream.synchronize()
                    ctas, topk = split_topk(phase_stamps.read_stamps(plan._module))
                    ctas, second = split_warmer(ctas, plan.depth_limit, 1) if batch > 1 else (ctas, [])
                    builds.append((*split_warmer(ctas, plan.depth_limit), topk, second))
                ctas, warmer, topk, second = builds[-1]
                print(f"# ddtree_build, batch {batch}, budget {budget}, vocab {args.vocab}, {args.logits_dtype} logits "
                      f"({args.drafter} drafter, {args.topk} top-K, {args.search} search), "
                      f"{len(ctas)} CTAs stamped, SM clock {clock_khz / 1e6:.2f} GHz nominal (the µs below), "
                      + (f"{ghz:.2f} GHz measured" if (ghz := measured_clock_ghz(ctas)) is not None
                         else "measured: no CTA spans 2 µs"))
                if len(builds) > 1:
                    print(f"# {len(builds)} stamped builds, median µs of the row merge's phases and the search's "
                          f"(the tables below: the last build)")
                    print("\n".join(repeat_lines([c for c, _, _, _ in builds], clock_khz)))
                print("\n".join(report(phases(ctas), clock_khz, order_of(ctas))))
                for line in row_counts(ctas):
                    print(line)
                print("\n".join(timeline(ctas)), flush=True)
                if args.chain:
                    l2 = {"read": "L2 flushed", "drafted": "L2 flushed, the logits written again", "none": "L2 warm"}
                    first = "sample" if chain_origin(topk) == "sample entry" else "chunk"
                    print(f"# the chain ({l2[args.flush]}"
                          f"{', code evicted from the SMs' if evict is not None else ''}), µs from the {first} "
                          f"kernel's first CTA")
                    print("\n".join(chain_timeline(ctas, topk)), flush=True)
                    for line in launch_gaps(ctas, topk):
                        print(line, flush=True)
                    if plan.topk == "threshold":  # (a chunked build has no stream kernel)
                        print("# the stream's CTAs by how many shared an SM (µs from the sample's first entry)")
                        print("\n".join(stream_by_sm(topk)), flush=True)
                merges = [r[3] for v in ctas.values() for r in v if r[0] == "merge"]
                for name, row, recs in (("code warmer", 0, warmer), ("second warmer", 1, second)):
                    if recs and merges:
                        t0 = min(merges)
                        print(f"{name} (CTA ({plan.depth_limit}, {row})): {len(recs)} points, done "
                              f"{(max(r[3] for r in recs) - t0) / 1e3:.2f} µs after the first merge "
                              f"({warmer_points(recs, t0)})", flush=True)
    finally:
        ddtree.compile_defines = plain
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import tool_output  # (tools/tool_output.py: a failed write of stdout is one line, exit 2)

    sys.exit(tool_output.run(main, "tools/ddtree_stamps.py"))
