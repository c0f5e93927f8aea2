"""Is the build's programmatic launch's ~6 µs step cost (research/ddtree_build.md, thirty-eighth
session) a cost of back-to-back replays? bench_step times the demo decode step's graph with its
replays queued back to back (up to ring_slots - 1 in flight, events around each); the step probes
(step_stamps.py, step_marks.py) synchronize after every replay, and there the programmatic build
costs nothing. This probe times the same captured step both ways, alternating, in one process:

    python research/probes/step_sync.py [--batch 8] [--budget 16] [--steps 200] [--rounds 2] [--with-ar]

Prints, per round, the median GPU µs per replay (the runner's events around each replay) queued back
to back and with a synchronize after each. Run it on main and on research/patches/build-nopdl.patch
(research/patches/patched_tree.sh) to compare. ``--with-ar`` first builds and captures bench_step's
AutoregressiveRunner on the same model and stream (its allocations and graph in the process).

Thirty-ninth session (H200, batch 8, budget 16): back to back main 279.6-281.7 µs against
build-nopdl's 282.4-283.0; with ``--with-ar`` 287.4 against 288.1; bench_step in the same call
286.1 against 280.8. The step's time depends on what else the process holds, not on the launch.
"""
import argparse
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1] / "benchmarks"))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--budget", type=int, default=16)
    ap.add_argument("--steps", type=int, default=200, help="replays per measurement")
    ap.add_argument("--rounds", type=int, default=2, help="measurements of each kind, alternating")
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--with-ar", action="store_true",
                    help="also build bench_step's AutoregressiveRunner on the same model and stream first (its memory)")
    a = ap.parse_args()
    import driverlevel as dl
    from bench_step import _gpu_us  # (bench_step's own timing: replays back to back, events around each)
    from demo_step import DEPTH, PROMPT_LEN, demo_runner

    dev = dl.Device(0)
    per_reset = 2 * a.steps + 40
    r, s, prompts = demo_runner(dev, a.batch, a.budget, a.vocab, PROMPT_LEN + per_reset * (DEPTH + 1) + 600)
    if a.with_ar:
        from driverlevel.runner import AutoregressiveRunner

        ar = AutoregressiveRunner(dev, model=r.model, max_batch=a.batch, max_context=r.max_context,
                                  max_prompt_len=PROMPT_LEN, stream=s)
        ar.reset(prompts, 64)
        ar.capture()
    r.reset(prompts, per_reset * (DEPTH + 1))
    r.capture()
    r.gpu_timing = True

    def back_to_back() -> float:
        return _gpu_us(r, a.steps, True)

    def synced() -> float:
        us = []
        for _ in range(a.steps):
            r.step(graph=True)
            k = r._launched - 1
            r.collect()
            s.synchronize()
            us.append(r.step_gpu_ms(k) * 1e3)
        return statistics.median(us)

    print(f"# batch {a.batch}, budget {a.budget}, pdl {r.tree.pdl}, {a.steps} replays per measurement: median GPU µs")
    for i in range(a.rounds):
        for name, f in (("back to back", back_to_back), ("synchronized", synced)):
            r.reset(prompts, per_reset * (DEPTH + 1))
            for _ in range(20):  # warm-up
                r.step(graph=True)
            r.collect()
            s.synchronize()
            print(f"round {i}  {name:<13} {f():8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
