"""One decode-step graph per GPU, as tensor-parallel ranks run it.

Each rank (one thread per listed GPU; an ordinal may repeat to try it on one GPU)
builds its own model, pools and DDTree step, captures it in thread-local mode and
replays it; the ranks must produce the same tokens and no graph may point into
another GPU's pools.

    python examples/multi_gpu.py 0,1          # two GPUs
    python examples/multi_gpu.py 0,0          # two ranks on one GPU
"""

import argparse
import sys

from driverlevel.runtime import require_gpu
from driverlevel.demo.multi_device import RankConfig, parse_devices, run_ranks_threads


def parse_args(argv=None) -> list:
    """The GPU ordinals of the one optional argument (default ``0,0``); a bad list or an extra
    argument is a usage error (exit 2), before the GPU check."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("devices", nargs="?", default="0,0", metavar="LIST",
                    help="GPU ordinals, comma-separated (default: 0,0, two ranks on GPU 0)")
    args = ap.parse_args(argv)
    try:
        return parse_devices(args.devices)
    except ValueError as exc:
        ap.error(str(exc))


def main(argv=None) -> int:
    devices = parse_args(argv)
    require_gpu()
    results = run_ranks_threads(devices, RankConfig(replays=1000))
    for r in results:
        print(f"rank {r.rank} on GPU {r.device} ({r.device_name}): {r.replays} replays, capture {r.capture_ms:.1f} ms, "
              f"step median {r.step_median_us:.0f} us, foreign pointers {r.foreign_pointers}")
    same = all(r.tokens == results[0].tokens for r in results)
    print("identical tokens on every rank:", same)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
