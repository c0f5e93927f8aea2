"""Where the demo decode step's GPU time goes, stage by stage: the DDTree step's launches (as
DecodeStepRunner._launch_step queues them) with a one-thread kernel writing %globaltimer between
them (research/probes/step_marks.cu), captured as one graph and replayed; prints the median µs of
each stage over the replays. The marks add ~1-2 µs per stage (a launch each) and end the PDL chain
nowhere (they follow ordinary launches only; the build's programmatic launch stays right after the
stream kernel). A probe for the thirty-eighth session's finding that the build's programmatic launch
costs the budget-16 step ~6 µs while the build chain itself ends at the same time
(research/ddtree_build.md).

    python research/probes/step_marks.py [--batch 8] [--budget 16] [--replays 200]
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
    a = ap.parse_args()
    import driverlevel as dl
    from driverlevel._compile import compile_source
    from driverlevel._module import load_module
    from driverlevel.demo import Drafter, MLAModel, MLAModelConfig
    from driverlevel.runner import DecodeStepRunner

    dev = dl.Device(0)
    rng = np.random.default_rng(0)
    prompt_len, depth = 512, 15
    lens = [max(2, prompt_len - (b * (prompt_len // 2)) // max(a.batch - 1, 1)) for b in range(a.batch)]
    prompts = [rng.integers(0, a.vocab, size=n).tolist() for n in lens]
    model = MLAModel(dev, MLAModelConfig(vocab_size=a.vocab, num_heads=9, seed=0))
    s = dev.create_stream()
    drafter = Drafter(model, max_batch=a.batch, depth_limit=depth, name="ddtree.drafter")
    r = DecodeStepRunner(dev, model=model, drafter=drafter, max_batch=a.batch, budget=a.budget, depth_limit=depth,
                         max_context=prompt_len + 2 * a.replays * (depth + 1) + 600, max_prompt_len=prompt_len, stream=s)
    kernel = load_module(dev, compile_source((HERE / "step_marks.cu").read_text(), "step_marks.cu", dev.arch)).kernel("mark")
    names = ["drafter", "build", "compile", "target forward", "accept", "limit + commit + publish"]
    marks = dl.DeviceBuffer.allocate(dev, 8 * (len(names) + 1), label="marks").as_array((len(names) + 1,), np.uint64)
    ml = [kernel.prepare((1, 1, 1), (1, 1, 1), [marks, np.int32(i)]) for i in range(len(names) + 1)]

    def launch_step(stream):  # DecodeStepRunner._launch_step with the marks between its launches
        ml[0].launch(stream)
        r.drafter.run(stream)
        ml[1].launch(stream)
        r.tree.build(stream, r.drafter.logits, r.state)
        ml[2].launch(stream)
        r.tree.compile(stream, r.state)
        ml[3].launch(stream)
        r.target_forward(stream, r.buffers)
        ml[4].launch(stream)
        r.tree.accept(stream, r.state, target_logits=r.logits)
        ml[5].launch(stream)
        r._limit.launch(stream)
        r.tree.commit(stream, r.state)
        r._publish.launch(stream)
        ml[6].launch(stream)
        r._ready = True

    r._launch_step = launch_step
    r.reset(prompts, 2 * a.replays * (depth + 1))
    r.capture()
    r.gpu_timing = False
    rows = []
    for i in range(a.replays + 20):
        r.step(graph=True)
        r.collect()
        s.synchronize()
        if i >= 20:
            t = marks.to_numpy().astype(np.int64)
            rows.append(np.diff(t) / 1e3)
    rows = np.array(rows)
    print(f"# batch {a.batch}, budget {a.budget}, pdl {r.tree.pdl}, {len(rows)} replays: median µs per stage")
    for j, n in enumerate(names):
        print(f"{n:<26} {statistics.median(rows[:, j]):8.2f}")
    print(f"{'total':<26} {statistics.median(rows.sum(axis=1)):8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
