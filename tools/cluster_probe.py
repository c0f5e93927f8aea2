#!/usr/bin/env python3
"""How many thread-block clusters of ddtree_build's CTAs the GPU can hold at once, per cluster size.

A question before trying "one cluster per request" (research/ddtree_build.md, twenty-second
session, next step 5): the last row CTA would read the other rows of its request from their shared
memory (distributed shared memory) instead of from L2 after a global counter. A request has
``depth_limit`` row CTAs (15 in bench_ddtree and the demo; 16 with the code warmer), each of 512
threads with the plan's dynamic shared memory, so the cluster is larger than the portable 8 and the
kernel must allow non-portable sizes. ``cuOccupancyMaxActiveClusters`` answers, per cluster size,
how many such clusters can be resident together: the demo's batch 8 needs 8 of them.

Only queries the driver: nothing is launched, and the kernel's attribute
``CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED`` is set on this process's copy of the module
only. Needs a GPU with clusters (sm_90 or later).

Usage: python tools/cluster_probe.py [--depth 15] [--budget 16 256] [--sizes 2 4 8 12 15 16]
"""

from __future__ import annotations

import argparse
import sys

#: CUDA's portable cluster size limit (CUDA Programming Guide, "Thread Block Clusters").
PORTABLE_MAX = 8


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--depth", type=int, default=15, help="the plan's depth_limit (row CTAs per request)")
    ap.add_argument("--budget", type=int, nargs="+", default=[16, 256], help="tree budgets (dynamic shared memory)")
    ap.add_argument("--sizes", type=int, nargs="+", default=[2, 4, 8, 12, 15, 16], help="cluster sizes (CTAs)")
    args = ap.parse_args(argv)
    if not 1 <= args.depth <= 32:
        ap.error(f"--depth must be in 1..32, got {args.depth}")
    if any(not 1 <= b <= 512 for b in args.budget):
        ap.error(f"--budget values must be in 1..512, got {args.budget}")
    if any(not 1 <= s <= 32 for s in args.sizes):
        ap.error(f"--sizes values must be in 1..32, got {args.sizes}")
    return args


def cluster_config(driver, size, threads, dynamic_shared):
    """A ``CUlaunchConfig`` of ``size`` clusters of ``size`` CTAs each (the grid must be a multiple of
    the cluster), for ``cuOccupancyMaxActiveClusters``."""
    cfg = driver.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = size * size, 1, 1
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = threads, 1, 1
    cfg.sharedMemBytes = dynamic_shared
    a = driver.CUlaunchAttribute()
    a.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    a.value.clusterDim.x, a.value.clusterDim.y, a.value.clusterDim.z = size, 1, 1
    cfg.attrs = [a]
    cfg.numAttrs = 1
    return cfg


def main(argv=None):
    args = parse_args(argv)
    from cuda.bindings import driver

    import driverlevel as dl
    from driverlevel._device import require_gpu
    from driverlevel.ddtree import DDTreePlan

    require_gpu()
    dev = dl.Device(0)
    if int(dev.arch.split("_")[1]) < 90:
        print(f"{dev.name} ({dev.arch}) has no thread-block clusters (sm_90 and later)", file=sys.stderr)
        return 1
    print(f"{dev.name} ({dev.arch}), {dev.sm_count} SMs: clusters of ddtree_build CTAs (512 threads) resident at once")
    print(f"{'budget':>6} {'dyn. smem B':>11}  " + "  ".join(f"{s:>4}" for s in args.sizes))
    for budget in args.budget:
        plan = DDTreePlan(dev, max_batch=1, depth_limit=args.depth, vocab=163_840, budget=budget, max_context=4096)
        kern = plan._module.kernel("ddtree_build")
        kern._set_attribute(driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
        dyn = plan.build_smem  # (build_shared_bytes(depth_limit, k, budget): what each launch asks for)
        cells = []
        for s in args.sizes:
            with dev.activated():
                err, n = driver.cuOccupancyMaxActiveClusters(kern._func, cluster_config(driver, s, 512, dyn))
            cells.append(f"{n:>4}" if err == driver.CUresult.CUDA_SUCCESS else f"{'err':>4}")
            if err != driver.CUresult.CUDA_SUCCESS:
                print(f"  size {s}: {err.name}", file=sys.stderr)
        print(f"{budget:>6} {dyn:>11,}  " + "  ".join(cells))
    print(f"(portable sizes are at most {PORTABLE_MAX}; 'err': the driver refused that size)")
    return 0


if __name__ == "__main__":
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import tool_output  # (tools/tool_output.py: a failed write of stdout is one line, exit 2)

    sys.exit(tool_output.run(main, "tools/cluster_probe.py"))
