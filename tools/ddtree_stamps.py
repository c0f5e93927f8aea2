"""Per-phase cycles of ``ddtree_build`` (issue 12): where the tree build's last launch spends its time.

Builds a :class:`~driverlevel.DDTreePlan` whose kernels are compiled with ``-DDL_DDTREE_STAMPS=1``
(``cu/ddtree/stamps.cuh``: thread 0 of each CTA of ``ddtree_build`` prints the SM clock at named
points; without the define the kernels are unchanged), runs one build of the benchmark's inputs
(``benchmarks/bench_ddtree.py``: peaked random drafter logits, vocabulary 163,840, depth 15) after
a warm-up, and prints the median and maximum cycles of each phase:

* the row merge, every row CTA: ``loaded`` (candidates in registers, block max), ``selected``
  (the K-th largest), ``lse`` (the picked ones placed, the row's log-sum-exp), ``sorted`` (the
  bitonic sort, the top-K written);
* the request's last CTA: ``last`` (the counter after the fence), ``lp`` (log-probs to shared
  memory), ``depth`` 1..15 (the parallel search's rounds), ``generated`` (the loop's end),
  ``searched`` (the ranking, or the one-warp heap), ``nodes`` (nodes and ancestor masks).

Differences are taken within one CTA only (``clock64`` is per SM). The printing itself costs a
few hundred cycles per point, so compare phases with each other, not with bench_ddtree's times.

Usage::

    python tools/ddtree_stamps.py [--batch 1 8] [--budget 256] [--logits-dtype float32]

Needs a GPU.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8], help="requests per build (1..64)")
    ap.add_argument("--budget", type=int, nargs="+", default=[256], help="tree budgets (1..512)")
    ap.add_argument("--logits-dtype", choices=("float32", "bfloat16"), default="float32")
    args = ap.parse_args(argv)
    for name, values, lo, hi in (("--batch", args.batch, 1, 64), ("--budget", args.budget, 1, 512)):
        bad = [v for v in values if not lo <= v <= hi]
        if bad:
            ap.error(f"{name} must be in {lo}..{hi}, got {bad}")
    return args


def parse_lines(lines) -> dict:
    """``{(request, row): [(point, arg, clock), ...]}`` from the kernel's ``ddt`` lines."""
    ctas = defaultdict(list)
    for line in lines:
        f = line.split()
        if len(f) == 6 and f[0] == "ddt":
            ctas[(int(f[1]), int(f[2]))].append((f[3], int(f[4]), int(f[5])))
    return ctas


def phases(ctas: dict) -> dict:
    """``{phase name: [cycles, ...]}``: consecutive points of each CTA, named by the later one."""
    out = defaultdict(list)
    for stamps in ctas.values():
        for (_, _, c0), (p1, a1, c1) in zip(stamps, stamps[1:]):
            out[f"depth {a1:2d}" if p1 == "depth" else p1].append(c1 - c0)
    return out


def report(out: dict, clock_khz: int) -> list[str]:
    order = ["loaded", "selected", "lse", "sorted", "last", "lp"] + sorted(k for k in out if k.startswith("depth")) \
        + ["generated", "searched", "nodes"]
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

    dev = dl.Device(0)
    err, clock_khz = driver.cuDeviceGetAttribute(driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_CLOCK_RATE,
                                                 driver.cuDeviceGet(dev.ordinal)[1])
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuDeviceGetAttribute(CLOCK_RATE) failed: {err}")
    from bench_ddtree import DEPTH, VOCAB, make_inputs

    plain = ddtree.compile_defines
    ddtree.compile_defines = lambda arch: {**plain(arch), "DL_DDTREE_STAMPS": 1}
    stream = dev.create_stream()
    try:
        for batch in args.batch:
            for budget in args.budget:
                plan = ddtree.DDTreePlan(dev, max_batch=batch, depth_limit=DEPTH, vocab=VOCAB, budget=budget,
                                         max_context=4096, logits_dtype=args.logits_dtype, target_dtype="bfloat16",
                                         topk="threshold")
                rng = np.random.default_rng(1000 * batch + budget)
                _, logits, _, _, state, _ = make_inputs(dev, stream, rng, plan, batch, args.logits_dtype)
                plan.build(stream, logits, state)  # warm-up (its lines go to stdout, flushed at the sync)
                stream.synchronize()
                sys.stdout.flush()
                saved = os.dup(1)
                with tempfile.TemporaryFile() as tmp:
                    os.dup2(tmp.fileno(), 1)
                    try:
                        plan.build(stream, logits, state)
                        stream.synchronize()
                    finally:
                        os.dup2(saved, 1)
                        os.close(saved)
                    tmp.seek(0)
                    lines = tmp.read().decode(errors="replace").splitlines()
                ctas = parse_lines(lines)
                print(f"# ddtree_build, batch {batch}, budget {budget}, {args.logits_dtype} logits, "
                      f"{len(ctas)} CTAs stamped, SM clock {clock_khz / 1e6:.2f} GHz")
                print("\n".join(report(phases(ctas), clock_khz)), flush=True)
    finally:
        ddtree.compile_defines = plain
    return 0


if __name__ == "__main__":
    sys.exit(main())
