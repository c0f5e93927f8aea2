"""Where the demo decode step's GPU time goes, stage by stage: the DDTree step's launches (as
DecodeStepRunner._launch_step queues them) with a one-thread kernel writing %globaltimer between
them (research/probes/step_marks.cu), captured as one graph and replayed; prints the median µs of
each stage over the replays. The marks add ~1-2 µs per stage (a launch each) and end the PDL chain
nowhere (they follow ordinary launches only; the build's programmatic launch stays right after the
stream kernel). A probe for the thirty-eighth session's finding that the build's programmatic launch
costs the budget-16 step ~6 µs while the build chain itself ends at the same time
(research/ddtree_build.md).

    python research/probes/step_marks.py [--batch 8] [--budget 16] [--replays 200] [--per-launch | --every-launch | --keep 0,6]

``--keep 0,6``: only the marks at the step's start and end (the fewest added launches), then one
more boundary at a time: the seven stage marks of the thirty-eighth session made the programmatic
build 1 µs faster where bench_step (no marks) sees it 6 µs slower, so some boundary's mark changes
what the programmatic launch costs; which one names the kernel it interacts with.

``--per-launch``: a mark before every ordinary (not programmatic) launch of the step instead of
between its stages (``PreparedLaunch.launch`` wrapped while the step is captured), so each line is
one kernel, with the programmatic launches after it (the build's stream and ddtree_build follow
the sample kernel's line) and the mark's own launch (~1-2 µs each).

``--every-launch`` (sm_90+): a mark before every launch, the programmatic ones too. Since the
fifty-ninth session most of the step's launches are programmatic, so ``--per-launch`` splits it
in three only. Before a programmatic launch the mark is itself a programmatic launch of a kernel
that waits for the kernel before it, writes the time and lets the next start (``mark_pdl``): each
line is then one kernel, from its predecessor's completion to its own, with its launch overlapped
as in the step, but a kernel that starts before its predecessor has completed (the verify
attention's partial kernel beside its scheduler, the build's stream beside the sample) no longer
does: those lines and the total run longer than in the unmarked step.
"""
import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--budget", type=int, default=16)
    ap.add_argument("--replays", type=int, default=200)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--per-launch", action="store_true", help="a mark before every ordinary launch")
    ap.add_argument("--every-launch", action="store_true",
                    help="a mark before every launch, programmatic ones included (sm_90+; see the docstring)")
    ap.add_argument("--keep", default="0,1,2,3,4,5,6",
                    help="the stage marks launched (0: the step's start, 1: after the drafter, 2: after the build, "
                         "3: after compile, 4: after the target forward, 5: after accept, 6: the end); the others "
                         "are left out and their stages merge, to find which boundary changes the step")
    a = ap.parse_args()
    import driverlevel as dl
    from driverlevel._compile import compile_source
    from driverlevel._module import load_module
    from demo_step import DEPTH, PROMPT_LEN, demo_runner

    dev = dl.Device(0)
    r, s, prompts = demo_runner(dev, a.batch, a.budget, a.vocab, PROMPT_LEN + 2 * a.replays * (DEPTH + 1) + 600)
    module = load_module(dev, compile_source((HERE / "step_marks.cu").read_text(), "step_marks.cu", dev.arch))
    kernel = module.kernel("mark")
    if a.every_launch:
        if int(dev.arch[3:]) < 90:
            ap.error(f"--every-launch needs sm_90 or newer (programmatic launches), GPU 0 is {dev.arch}")
        a.per_launch = True
    names = ["drafter", "build", "compile", "target forward", "accept", "limit + commit + publish"]
    marks = dl.DeviceBuffer.allocate(dev, 8 * (len(names) + 1), label="marks").as_array((len(names) + 1,), np.uint64)
    ml = [kernel.prepare((1, 1, 1), (1, 1, 1), [marks, np.int32(i)]) for i in range(len(names) + 1)]

    keep = sorted({int(k) for k in a.keep.split(",")})
    if not keep or keep[0] < 0 or keep[-1] > 6 or len(keep) < 2:
        ap.error(f"--keep: two or more of 0..6, got {a.keep!r}")

    def mark(i, stream):
        if i in keep:
            ml[i].launch(stream)

    def launch_step(stream):  # DecodeStepRunner._launch_step with the marks between its launches
        mark(0, stream)
        r.drafter.run(stream)
        mark(1, stream)
        r.tree.build(stream, r.drafter.logits, r.state)
        mark(2, stream)
        r.tree.compile(stream, r.state)
        mark(3, stream)
        r.target_forward(stream, r.buffers)
        mark(4, stream)
        r.tree.accept(stream, r.state, target_logits=r.logits)
        mark(5, stream)
        r._limit.launch(stream)
        r.tree.commit(stream, r.state)
        r._publish.launch(stream)
        mark(6, stream)
        r._ready = True

    from driverlevel._module import PreparedLaunch

    per_launch = []  # kernel names, one per mark but the last
    plain_launch = PreparedLaunch.launch
    if a.per_launch:
        pmarks = dl.DeviceBuffer.allocate(dev, 8 * 257, label="per-launch marks").as_array((257,), np.uint64)
        pml = [kernel.prepare((1, 1, 1), (1, 1, 1), [pmarks, np.int32(i)]) for i in range(257)]
        if a.every_launch:
            pml_pdl = [module.kernel("mark_pdl").prepare((1, 1, 1), (1, 1, 1), [pmarks, np.int32(i)], programmatic=True)
                       for i in range(257)]
        run_step = type(r)._launch_step.__get__(r)

        def marked(self, stream):  # (the marks themselves go through plain_launch)
            if not self.programmatic:
                plain_launch(pml[len(per_launch)], stream)
                per_launch.append(self.kernel.name)
            elif a.every_launch:
                plain_launch(pml_pdl[len(per_launch)], stream)
                per_launch.append(self.kernel.name)
            plain_launch(self, stream)

        def launch_step(stream):  # noqa: F811 - the runner's own step, every ordinary launch marked
            per_launch.clear()  # (the names of the last call: the captured one)
            PreparedLaunch.launch = marked
            try:
                run_step(stream)
            finally:
                PreparedLaunch.launch = plain_launch
            plain_launch(pml[len(per_launch)], stream)  # the step's end
        marks = pmarks
    r._launch_step = launch_step
    r.reset(prompts, 2 * a.replays * (DEPTH + 1))
    r.capture()
    if a.per_launch:
        names = list(per_launch)
    else:  # the kept marks' stages, merged where a mark is left out
        names = [" + ".join(names[keep[j]:keep[j + 1]]) for j in range(len(keep) - 1)]
    r.gpu_timing = True  # the runner's events around each replay, as bench_step reads them
    rows, event_us = [], []
    for i in range(a.replays + 20):
        r.step(graph=True)
        k = r._launched - 1
        r.collect()
        s.synchronize()
        if i >= 20:
            t = marks.to_numpy().astype(np.int64)
            t = t[:len(names) + 1] if a.per_launch else t[keep]
            rows.append(np.diff(t) / 1e3)
            event_us.append(r.step_gpu_ms(k) * 1e3)
    rows = np.array(rows)
    print(f"# batch {a.batch}, budget {a.budget}, pdl {r.tree.pdl}, {len(rows)} replays: median µs per "
          f"{'launch' if a.every_launch else 'ordinary launch (and the programmatic ones after it)' if a.per_launch else 'stage'}")
    for j, n in enumerate(names):
        print(f"{n:<34} {statistics.median(rows[:, j]):8.2f}")
    print(f"{'total':<34} {statistics.median(rows.sum(axis=1)):8.2f}")
    # bench_step's "graph GPU µs" (events around the replay) and what of it lies outside the marks:
    # the graph's start before the first mark and its end after the last
    outside = np.array(event_us) - rows.sum(axis=1)
    print(f"{'events around the replay':<34} {statistics.median(event_us):8.2f}")
    print(f"{'outside the first and last marks':<34} {statistics.median(outside):8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
