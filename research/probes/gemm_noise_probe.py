"""The demo drafter's GEMM with and without its noise, and the target's LM head shape (fifty-third session).

``drafter_parts.py`` timed ``mla_gemm`` over the drafter's 120 rows x 32,768 x 512 at ~42 µs with the
noise epilogue (76 µs before drafter-both landed) and ~225 µs without it, the same kernel and grid
(H100; the H200 too). Very likely the probe's bug (not re-measured): it never ran the plain drafter's own chain, so the
GEMM gathered rows by guesses nobody wrote. This runs each drafter's chain first, then times its
GEMM eagerly and in graphs (36.4 µs without noise, 42.5 with it, in a graph on the H200), so that
Nsight Compute can also profile them side by side:

    python research/probes/gemm_noise_probe.py [--repeat 10] [--shapes]
    ncu --clock-control none --profile-from-start off -k regex:mla_gemm --set full \
        python research/probes/gemm_noise_probe.py --repeat 1 --profile

``--profile`` brackets only the timed eager launches with ``cuProfilerStart`` / ``cuProfilerStop``
(so ``--profile-from-start off`` leaves out the model's construction GEMMs, which a plain ``-k``
filter caught in the fifty-third session's call 7). The last two rows are the target's LM head shape
(128 and 136 rows of hidden states x 32,768 x 512, fp32 out, no gather, no noise; 136 rows, the
DDTree step's at batch 8 / budget 16, run the 144-row tile since the fifty-fifth session: 35.4 µs in
the step's per-launch marks on an H100, 44.7 before). ``--shapes`` (fifty-fourth session) adds every GEMM shape of
the target's forward at 128 and 8 rows, each in a graph, to compare pipeline variants of
``mla_gemm`` (research/patches/gemm-stages.patch, gemm-bk64.patch) GEMM by GEMM.
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
    ap.add_argument("--shapes", action="store_true",
                    help="also every GEMM shape of the target's forward at 128 and 8 rows, in graphs")
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
            dev.set_current()  # (cuProfilerStart needs a current context; driverlevel restores the caller's)
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
            dev.set_current()
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
    for rows in (128, 136):  # (136: the DDTree step's rows at batch 8, budget 16, on the 144-row tile)
        lm_out = dl.DeviceBuffer.allocate(dev, rows * a.vocab * 4, label="lm_out").as_array((rows, a.vocab), np.float32)
        lm = model.gemm(model.embed, model.w_lm, lm_out, m_max=rows)  # embed rows stand in for h
        lm.launch(s)
        us = timed(lm)
        print(f"lm head {rows} rows   median {statistics.median(us):8.2f} µs  min {min(us):8.2f}")
    if a.shapes:
        forward_shapes(dl, dev, s, model, timed)
    return 0


def forward_shapes(dl, dev, s, model, timed):
    """Every GEMM shape of the demo target's forward (q, kv, the split-K output projection with its
    reduce, the LM head) at the tree step's 136 rows (batch 8 x 17 nodes: one 144-row tile where
    gemm_schedule takes it, the LM head; else two 128-row tiles, the second with 8 rows), 128 rows and
    the autoregressive step's 8 (the 32-row tile), each alone in a graph: median µs of --repeat replays, with the schedule's (row tile, splits)
    and the bytes of B and C over that time. A is all ones (its values do not change the time);
    nothing is checked."""
    from driverlevel.demo.mla_model import gemm_schedule
    ws_elems = 4 * 128 * max(model.w_q.shape[0], model.w_lm.shape[0])
    ws = dl.DeviceBuffer.allocate(dev, ws_elems * 4, label="split-K ws").as_array((ws_elems,), np.float32)
    for rows in (136, 128, 8):  # (136: the DDTree step's rows at batch 8, budget 16: 8 x 17)
        for name, w, out in (("q", model.w_q, "bf16"), ("kv", model.w_kv, "bf16"),
                             ("o", model.w_o, "bf16"), ("lm head", model.w_lm, "f32")):
            n, k = w.shape
            a_src = dl.DeviceBuffer.allocate(dev, rows * k * 2, label=f"a {name}").as_array((rows, k), dl.bfloat16)
            a_src.fill_u32(0x3F803F80, s)  # bf16 1.0 pairs
            dt = np.float32 if out == "f32" else dl.bfloat16
            c = dl.DeviceBuffer.allocate(dev, rows * n * 4, label=f"c {name}").as_array((rows, n), dt)
            ln = model.gemm(a_src, w, c, m_max=rows, workspace=ws)
            with dl.capture(s) as cap:
                ln.launch(s)
            gx = cap.graph.instantiate(upload_stream=s)
            gx.launch(s)
            us = statistics.median(timed(gx, profile=False))
            bm, splits = gemm_schedule(rows, n, k, dev.sm_count, model.gemm_ctas)  # (the model's own choice)
            nbytes = n * k * 2 + rows * n * (4 if out == "f32" else 2)
            print(f"shape {name:<8} {rows:4d} x {n:6d} x {k:5d}  tile {bm:3d} splits {splits:2d}  "
                  f"graph {us:8.2f} µs  {nbytes / us / 1e6:6.2f} TB/s (B + C)")


if __name__ == "__main__":
    raise SystemExit(main())
