"""One DDTree build run eagerly twice, for Nsight Compute (the top-K launches of the second build).

With ``--topk threshold`` a build launches sample, stream and the tree kernel (which runs the
chunk fallback of a row the threshold failed itself); skip the first build's top-K launches and
read the second's::

    ncu --clock-control none -k regex:ddtree_topk -s 2 -c 2 --section SpeedOfLight \\
        python benchmarks/profile_topk.py --batch 8 --budget 256

Usage: python benchmarks/profile_topk.py [--batch B] [--budget K] [--topk chunked|threshold]
                                         [--logits-dtype float32|bfloat16] [--search parallel|heap]
                                         [--drafter random|peaked|jittered|clustered]

The tree kernel's own profile (where its search stalls, per SASS instruction)::

    ncu --clock-control none -k regex:ddtree_build -s 1 -c 1 --section SourceCounters \\
        --warp-sampling-interval 0 -o build python benchmarks/profile_topk.py --budget 16 --drafter jittered
    ncu -i build.ncu-rep --page source --print-source sass --csv
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


#: The largest --batch: bench_ddtree's make_inputs allocates bf16 target logits for every tree node,
#: batch x (budget + 1) x 163,840 x 2 bytes, 43 GB at batch 256 and budget 512 (plus 2.5 GB of drafter
#: logits): the largest run fits an 80 GB GPU. (DDTreePlan itself takes up to 1024.)
MAX_BATCH = 256


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=8, help="requests (default 8)")
    ap.add_argument("--budget", type=int, default=256, help="tree budget, 1..512 (default 256)")
    ap.add_argument("--topk", choices=("chunked", "threshold"), default="threshold",
                    help="the build's top-K (default threshold)")
    ap.add_argument("--logits-dtype", choices=("float32", "bfloat16"), default="float32",
                    help="drafter logits dtype (default float32)")
    ap.add_argument("--search", choices=("parallel", "heap"), default="parallel",
                    help="the tree search of ddtree_build (heap: FLAG_LEGACY_SEARCH, the one-warp heap; "
                         "default parallel)")
    ap.add_argument("--drafter", choices=("random", "peaked", "jittered", "clustered"), default="random",
                    help="bench_ddtree's drafter rows: random (star trees; default), peaked / jittered (deep "
                         "trees) or clustered (random plus runs of strong ids: some rows fail the threshold "
                         "and ddtree_build refines them)")
    args = ap.parse_args(argv)
    if args.batch < 1 or not 1 <= args.budget <= 512:
        ap.error(f"--batch must be >= 1 and --budget in 1..512, got {args.batch} and {args.budget}")
    if args.batch > MAX_BATCH:  # before the GPU check, not an out-of-memory error after the compile
        ap.error(f"--batch must be <= {MAX_BATCH} (the target logits are batch x (budget + 1) x 163840 bf16: "
                 f"43 GB at batch {MAX_BATCH} and budget 512), got {args.batch}")
    sys.path.insert(0, str(Path(__file__).parent))
    import numpy as np

    import driverlevel as dl
    from driverlevel._device import require_gpu
    from driverlevel.ddtree import DDTreePlan
    from bench_ddtree import DEPTH, VOCAB, make_inputs

    require_gpu()
    dev = dl.Device(0)
    stream = dev.create_stream()
    plan = DDTreePlan(dev, max_batch=args.batch, depth_limit=DEPTH, vocab=VOCAB, budget=args.budget,
                      max_context=4096, logits_dtype=args.logits_dtype, target_dtype="bfloat16", topk=args.topk)
    if args.search == "heap":
        plan.flags = dl.ddtree.FLAG_LEGACY_SEARCH
    rng = np.random.default_rng(1000 * args.batch + args.budget)
    _, logits, _, _, state, snap = make_inputs(dev, stream, rng, plan, args.batch, args.logits_dtype, args.drafter)
    for _ in range(2):
        for k, a in snap.items():
            getattr(state, k).copy_from(a, stream)
        plan.build(stream, logits, state)
    stream.synchronize()
    print(f"batch {args.batch}, budget {args.budget}, {args.topk} top-K, {args.logits_dtype} logits: "
          f"{args.drafter} drafter, {args.search} search: {plan.tk_nseg} stream segments of {plan.tk_seg_len} tokens per row", file=sys.stderr)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
    import tool_output  # (tools/tool_output.py: a failed write of stdout is one line, exit 2)

    sys.exit(tool_output.run(main, "benchmarks/profile_topk.py"))
