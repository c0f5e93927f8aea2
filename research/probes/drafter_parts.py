"""Where the demo drafter's ~77 µs of the decode step goes (research/ddtree_build.md, forty-second
session): its two launches timed apart, with and without the noise epilogue.

The thirty-eighth session's step marks put the drafter stage (``draft_chain``, then ``mla_gemm`` over
``batch * 15`` rows x vocab x 512 with the noise epilogue) at 77 µs of the 280 µs DDTree step at
batch 8, where its bytes (the 33.5 MB LM head and 15.7 MB of fp32 logits) and FLOPs (4 GFLOP) take
~10-15 µs. This probe captures each part in its own graph and times it:

    python research/probes/drafter_parts.py [--batch 8] [--vocab 32768] [--replays 200] [--flush]

Rows (median µs of one replay between two events; ``x20`` rows: twenty launches in one graph, per
launch, the launch gaps of a graph included):

- ``chain``: ``draft_chain`` alone (a thread per guess reads it from the chain table in one load
  since the fifty-third session; before, one thread per request walked ``depth - 1`` dependent
  loads of the successor table);
- ``gemm noise`` / ``gemm no noise``: ``mla_gemm`` with the drafter's noise (std 1) and without
  (the same GEMM, epilogue scale and store only). Until the fifty-third session the ``no noise``
  rows never ran the plain drafter's own chain (its "drafter no noise" row ran the noisy one's), so
  its GEMM gathered rows by guesses nobody had written, and ``mla_gemm`` did not bound its gather:
  they read ~220 µs on the H100 and the H200, where ``gemm_noise_probe.py`` times the same GEMM
  without noise at 36.4 µs replayed in a graph (H200, call 9). Fixed here; not re-measured since;
- ``drafter``: both launches, as the step runs them.

``--flush`` writes 128 MB before every replay (the LM head then comes from HBM); without it the
weights stay in L2 (60 MiB on the H200) across replays. In the decode step the target's LM head
(the same ``w_lm``) runs between two drafter launches, so the truth lies between the two.
"""
import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

DEPTH = 15


def demo_drafters(dev, vocab: int, batch: int, drafters: dict):
    """The demo model (9 heads, seed 0) at ``vocab`` tokens, ``batch`` random root tokens (seed 0) and
    one prepared :class:`driverlevel.demo.Drafter` per entry of ``drafters`` (name -> noise_std), at
    depth :data:`DEPTH`. Returns ``(model, roots, {name: drafter})``; gemm_noise_probe.py uses it too."""
    import driverlevel as dl
    from driverlevel.demo import Drafter, MLAModel, MLAModelConfig

    model = MLAModel(dev, MLAModelConfig(vocab_size=vocab, num_heads=9, seed=0))
    rng = np.random.default_rng(0)
    roots = dl.DeviceBuffer.allocate(dev, 4 * batch, label="roots").as_array((batch,), np.int32)
    roots.copy_from_host(rng.integers(0, vocab, size=batch).astype(np.int32))
    out = {name: Drafter(model, max_batch=batch, depth_limit=DEPTH, noise_std=std, name=name).prepare(roots)
           for name, std in drafters.items()}
    return model, roots, out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--replays", type=int, default=200)
    ap.add_argument("--flush", action="store_true", help="write 128 MB before every timed replay")
    a = ap.parse_args()
    import driverlevel as dl

    dev = dl.Device(0)
    s = dev.create_stream()
    _, _, d = demo_drafters(dev, a.vocab, a.batch, {"noisy": 1.0, "plain": 0.0})
    noisy, plain = d["noisy"], d["plain"]
    flush = dl.DeviceBuffer.allocate(dev, 128 << 20, label="flush").as_array() if a.flush else None

    def graph(launches, repeat=1):
        for ln in launches:  # eager once: kernel attributes, module loads
            ln.launch(s)
        s.synchronize()
        with dl.capture(s) as cap:
            for _ in range(repeat):
                for ln in launches:
                    ln.launch(s)
        return cap.graph.instantiate(upload_stream=s)

    start, end = dev.create_event(), dev.create_event()

    def time(gx, per=1):
        gx.launch(s)
        s.synchronize()
        us = []
        for i in range(a.replays):
            if flush is not None:
                flush.fill_bytes(i & 0xFF, s)
            start.record(s)
            gx.launch(s)
            end.record(s)
            end.synchronize()
            us.append(start.elapsed_ms(end) * 1e3 / per)
        return statistics.median(us)

    chain, gemm = noisy._launches
    chain0, gemm0 = plain._launches
    for ln in (chain, chain0):  # each drafter's guesses written once before its GEMM runs alone
        ln.launch(s)
    rows = [("chain", [chain]), ("gemm noise", [gemm]), ("gemm no noise", [gemm0]), ("drafter", [chain, gemm]),
            ("drafter no noise", [chain0, gemm0])]
    print(f"# batch {a.batch}, depth {DEPTH}, vocab {a.vocab}, {a.batch * DEPTH} GEMM rows x 512, "
          f"flush {'128 MB' if flush is not None else 'none'}, {a.replays} replays: median µs")
    for rnd in range(2):
        for name, launches in rows:
            one = time(graph(launches))
            x20 = time(graph(launches, 20), 20)
            print(f"round {rnd}  {name:<18} {one:8.2f}   x20 {x20:8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
