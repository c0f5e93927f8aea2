"""Where the DDTree build's time goes inside the demo decode step: the build's kernels compiled with
stamps (tools/ddtree_stamps.py's -DDL_STAMPS=1), the step captured and replayed as bench_step does,
and the last replay's chain timeline (sample, stream, ddtree_build; µs from the sample's first CTA)
printed for a few replays. A probe for the thirty-eighth session's finding that the build's
programmatic launch costs the batch-8 / budget-16 step ~6 µs (research/ddtree_build.md).

    python research/probes/step_stamps.py [--batch 8] [--budget 16] [--replays 3]
"""
import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--budget", type=int, default=16)
    ap.add_argument("--replays", type=int, default=3)
    ap.add_argument("--vocab", type=int, default=32768)
    a = ap.parse_args()
    import ddtree_stamps as ts
    import phase_stamps

    import driverlevel as dl
    from driverlevel import ddtree
    from demo_step import PROMPT_LEN, demo_runner

    plain = ddtree.compile_defines
    ddtree.compile_defines = lambda arch, topk="threshold": {**plain(arch, topk), **ts.stamp_defines()}
    dev = dl.Device(0)
    r, s, prompts = demo_runner(dev, a.batch, a.budget, a.vocab, PROMPT_LEN + 2000)
    r.reset(prompts, 1500)
    r.capture()
    r.gpu_timing = False
    for _ in range(30):
        r.step(graph=True)
        if r._launched - r._collected >= r.ring_slots - 1:
            r.collect()
    r.collect()
    s.synchronize()
    mod = r.tree._module
    for i in range(a.replays):
        phase_stamps.zero_stamps(mod)
        r.step(graph=True)
        r.collect()
        s.synchronize()
        ctas, topk = ts.split_topk(phase_stamps.read_stamps(mod))
        ctas, warmer = ts.split_warmer(ctas, r.tree.depth_limit)
        print(f"# replay {i}: batch {a.batch}, budget {a.budget}, pdl {r.tree.pdl}")
        print("\n".join(ts.chain_timeline(ctas, topk)), flush=True)
    ddtree.compile_defines = plain
    return 0


if __name__ == "__main__":
    sys.exit(main())
