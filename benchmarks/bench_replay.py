"""Graph-replay latency benchmark (same code as ``driverlevel bench replay``).

Host µs per replay of a graph of 1, 10 and 50 trivial kernels through driverlevel,
through a bare ``cuGraphLaunch`` loop on the same exec, through
``torch.cuda.CUDAGraph.replay()`` (if torch is installed) and as eager launches.
See :mod:`driverlevel.bench_replay`.

Usage: python benchmarks/bench_replay.py [--nodes 1,10,50] [--replays 10000] [--repeats 5]
                                         [--device 0] [--no-torch] [--json out.json]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv=None) -> int:
    from driverlevel._cli_common import json_path_problem
    from driverlevel.bench_replay import MAX_REPEATS, MAX_REPLAYS, main_from_options, options_problem, parse_node_counts

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="1,10,50", help="comma-separated kernel counts per graph (default 1,10,50)")
    ap.add_argument("--replays", type=int, default=10_000,
                    help=f"calls per variant and repetition (100 to {MAX_REPLAYS:,}; default 10,000)")
    ap.add_argument("--repeats", type=int, default=5,
                    help=f"repetitions (1 to {MAX_REPEATS}; default 5); medians are reported")
    ap.add_argument("--device", type=int, default=0, help="GPU ordinal (default 0)")
    ap.add_argument("--no-torch", action="store_true", help="skip the torch.cuda.CUDAGraph peer")
    ap.add_argument("--json", default=None, metavar="PATH", help="also write JSON ('-' for stdout, the table then goes to stderr)")
    a = ap.parse_args(argv)
    try:
        counts = parse_node_counts(a.nodes)
    except ValueError as exc:
        ap.error(f"--nodes: {exc}")
    problem = options_problem(a.replays, a.repeats)
    if problem:
        ap.error(problem)
    if a.device < 0:
        ap.error(f"--device must be a GPU ordinal >= 0, got {a.device}")
    problem = json_path_problem(a.json)
    if problem:
        ap.error(f"--json: {problem}")
    return main_from_options(counts, a.replays, a.repeats, a.device, not a.no_torch, a.json)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
    import tool_output  # (tools/tool_output.py: a failed write of stdout is one line, exit 2)

    sys.exit(tool_output.run(main, "benchmarks/bench_replay.py"))
