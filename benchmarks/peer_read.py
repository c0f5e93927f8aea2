"""The machine's read-bandwidth ceiling for the top-K's input, and PyTorch as a peer.

Times, on the logits shape of ``bench_ddtree`` (batch x depth 15 x vocab 163,840), a plain
row max (``torch.amax``: one read of every logit, the floor any top-K pays) and
``torch.topk(K)`` with CUDA events (median of N runs, each after an L2-flushing write of
256 MB), and prints µs and TB/s (logit bytes / time). PyTorch is a peer here, never a
dependency of driverlevel.

Usage: python benchmarks/peer_read.py [--batch 8] [--k 256] [--dtype float32|bfloat16]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


DEPTH, VOCAB = 15, 163_840  # bench_ddtree's logits: batch x depth x vocab
#: The largest --batch: driverlevel's MAX_BATCH (a plan's request slots). Its logits are
#: 1024 x 15 x 163,840 float32 = 10 GB, torch.topk's values and int64 indices at the largest
#: --k 30 GB more: the largest run fits an 80 GB GPU.
MAX_BATCH = 1024
#: The most repetitions of each measurement (each one writes 256 MB first).
MAX_REPS = 10_000


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8],
                    help="requests per build, one or more (default 1 8)")
    ap.add_argument("--k", type=int, default=256, help="top-K per row (default 256)")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                    help="logits dtype (default float32)")
    ap.add_argument("--reps", type=int, default=50, help="timed repetitions (default 50)")
    args = ap.parse_args(argv)
    if min(args.batch) < 1 or args.k < 1 or args.reps < 1:
        ap.error("--batch, --k and --reps must be >= 1")
    for opt, value, hi, why in (
            ("--batch", max(args.batch), MAX_BATCH, f"{MAX_BATCH} x {DEPTH} x {VOCAB} logits are 10 GB in float32"),
            ("--k", args.k, VOCAB, f"torch.topk takes at most a row's {VOCAB} logits"),
            ("--reps", args.reps, MAX_REPS, "each writes 256 MB before it is timed")):
        if value > hi:  # before the GPU check, not an out-of-memory error (or hours) into the run
            ap.error(f"{opt} must be <= {hi} ({why}), got {value}")
    import statistics

    sys.path.insert(0, str(Path(__file__).parent))
    from bench_attention import require_gpu_and_torch

    torch = require_gpu_and_torch("peer_read.py", "it is the peer measured")

    dt = getattr(torch, args.dtype)
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    print(f"| batch | bytes MB | amax µs (TB/s) | topk µs (TB/s) |  [{torch.cuda.get_device_name()}, {args.dtype}]")
    for b in args.batch:
        x = torch.randn(b, DEPTH, VOCAB, device="cuda").to(dt)
        nbytes = x.numel() * x.element_size()
        res = []
        for fn in (lambda: x.amax(-1), lambda: torch.topk(x, args.k, dim=-1)):
            ts = []
            for _ in range(args.reps):
                flush.fill_(1)
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                fn()
                e1.record()
                torch.cuda.synchronize()
                ts.append(e0.elapsed_time(e1) * 1e3)
            us = statistics.median(ts)
            res.append(f"{us:.1f} ({nbytes / us / 1e6:.2f})")
        print(f"| {b} | {nbytes / 1e6:.1f} | {res[0]} | {res[1]} |")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
    import tool_output  # (tools/tool_output.py: a failed write of stdout is one line, exit 2)

    sys.exit(tool_output.run(main, "benchmarks/peer_read.py"))
