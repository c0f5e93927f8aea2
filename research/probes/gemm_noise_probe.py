"""The demo drafter's GEMM with and without its noise, and the target's LM head shape (fifty-third session).

``drafter_parts.py`` timed ``mla_gemm`` over the drafter's 120 rows x 32,768 x 512 at ~42 µs with the
noise epilogue (76 µs before drafter-both landed) and ~225 µs without it, the same kernel and grid
(H100; the H200 too). Very likely the probe's bug (not re-measured): it never ran the plain drafter's own chain, so the
GEMM gathered rows by guesses nobody wrote. This runs each drafter's chain first, then times its
GEMM eagerly and in graphs (36.4 µs without noise, 42.5 with it, in a graph on the H200), so that
Nsight Compute can also profile them side by side:

    python research/probes/gemm_noise_probe.py [--repeat 10]
    ncu --clock-control none --profile-from-start off -k regex:mla_gemm --set full \
        python research/probes/gemm_noise_probe.py --repeat 1 --profile

``--profile`` brackets only the timed eager launches with ``cuProfilerStart`` / ``cuProfilerStop``
(so ``--profile-from-start off`` leaves out the model's construction GEMMs, which a plain ``-k``
filter caught in the fifty-third session's call 7). The last row is the target's LM head shape
(128 rows of hidden states x 32,768 x 512, fp32 out, no gather, no noise: 53-61 µs in the decode
step's per-launch marks on the H100).
"""
import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from drafter_parts import demo_drafters  # noqa: E402  (the same model, roots and drafters)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--profile", action="store_true", help="cuProfilerStart/Stop around the timed launches")
    a = ap.parse_args()
    from cuda.bindings import driver
    import driverlevel as dl

    dev = dl.Device(0)
    s = dev.create_stream()
    model, _, drafters = demo_drafters(dev, a.vocab, a.batch, {f"noise {std}": std for std in (1.0, 0.0, 1e-30)})
    start, end = dev.create_event(), dev.create_event()

    def timed(ln, profile=True):  # µs of each of a.repeat launches of ln (a launch or a graph exec)
        s.synchronize()
        profile = profile and a.profile
        if profile:
            err, = driver.cuProfilerStart()
            assert err == driver.CUresult.CUDA_SUCCESS, err
        us = []
        for _ in range(a.repeat):
            start.record(s)
            ln.launch(s)
            end.record(s)
            end.synchronize()
            us.append(start.elapsed_ms(end) * 1e3)
        if profile:
            err, = driver.cuProfilerStop()
            assert err == driver.CUresult.CUDA_SUCCESS, err
        return us

    for name, d in drafters.items():
        chain, gemm = d._launches
        chain.launch(s)
        us = timed(gemm)
        z = d.logits.to_numpy(s)
        graphs = []
        for launches in ([gemm], [chain, gemm], [gemm] * 4):
            with dl.capture(s) as cap:
                for ln in launches:
                    ln.launch(s)
            graphs.append(cap.graph.instantiate(upload_stream=s))
        gus = []
        for gx in graphs:
            gx.launch(s)  # uploaded and warm
            gus.append(statistics.median(timed(gx, profile=False)))
        print(f"gemm {name:<12} graph: gemm {gus[0]:8.2f}  chain+gemm {gus[1]:8.2f}  4 gemms {gus[2]:8.2f} µs")
        print(f"gemm {name:<12} median {statistics.median(us):8.2f} µs  min {min(us):8.2f}  "
              f"logits finite {np.isfinite(z).mean():.3f}  zero {np.mean(z == 0):.3f}  "
              f"denormal {np.mean((z != 0) & (np.abs(z) < 1.2e-38)):.3f}")
    rows = 128
    lm_out = dl.DeviceBuffer.allocate(dev, rows * a.vocab * 4, label="lm_out").as_array((rows, a.vocab), np.float32)
    lm = model.gemm(model.embed, model.w_lm, lm_out, m_max=rows)  # embed rows 0..127 stand in for h
    lm.launch(s)
    us = timed(lm)
    print(f"lm head {rows} rows   median {statistics.median(us):8.2f} µs  min {min(us):8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
