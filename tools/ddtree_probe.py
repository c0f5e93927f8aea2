"""Per-kernel GPU µs of the DDTree stages (development probe, needs a GPU).

For each shape (budgets 16/256/512 x batch 1/8 by default; vocab 163,840, depth_limit 15,
fp32 drafter logits, bf16 target logits shaped like benchmarks/bench_ddtree.py) the
individual kernel launches of build / compile / accept / commit are queued behind the
spin kernel ``spin_wait_ns`` with an event between every two launches, so the events see
GPU time only. Rows:

* ``topk_chunks`` / ``build``: the two kernels of the tree build; ``build[b=0]`` is the
  build kernel with every request's budget set to 0 (the row merge alone), so
  ``build - build[b=0]`` is the best-first search (and the node/mask output).
* ``argmax`` / ``accept``: the two kernels of accept from target logits; ``accept[tok]``
  is accept from given target tokens (what accept costs once the argmax is known);
  ``floor`` = bytes of the target rows / the HBM traffic (read + write) of a
  device-to-device copy measured here.

``--impl`` picks what to time: ``new`` (this checkout), ``heap`` (this checkout with the
one-warp heap forced, ``FLAG_LEGACY_SEARCH``), or ``orig=DIR`` (a saved copy of
``ddtree.py`` + ``ddtree.cu`` in DIR, to compare against an earlier version); several
may be given, comma separated, and are timed on the same inputs.

``--trace`` also compiles a copy of cu/ddtree.cu with the ``DDT_PROBE`` points recording
clock64 / %globaltimer / %smid and prints, per kernel of the build, the cycles of every
phase (median / max over CTAs), CTA lifetimes, how many CTAs share an SM, and the SM clock.

Usage: python tools/ddtree_probe.py [--budgets 16,256,512] [--batches 1,8] [--reps 15]
                                    [--impl new,heap,orig=build/orig] [--trace]
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import statistics
import sys

import numpy as np

import driverlevel as dl
from driverlevel import ddtree, selftest
from driverlevel._compile import compile_source
from driverlevel._dtypes import f32_to_bf16_bits
from driverlevel.ddtree import DDTreeState

VOCAB, DEPTH = 163_840, 15


TRACE_DEFINE = r"""
#define DDT_PROBE(k) do { if (threadIdx.x == 0 && p.dense_cache) { \
  unsigned long long* q_ = reinterpret_cast<unsigned long long*>(p.dense_cache) + \
    ((static_cast<unsigned long long>(blockIdx.z) * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x) * 48 + 3 * (k); \
  unsigned long long g_; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g_)); \
  unsigned s_; asm volatile("mov.u32 %0, %%smid;" : "=r"(s_)); \
  q_[0] = clock64(); q_[1] = g_; q_[2] = s_ + 1; } } while (0)
"""


def load_module_copy(name, py_path, cu_text):
    s = importlib.util.spec_from_file_location(f"driverlevel._ddtree_probe_{name}", py_path)
    mod = importlib.util.module_from_spec(s)
    sys.modules[s.name] = mod  # dataclasses look the module up
    s.loader.exec_module(mod)
    mod.compile_file = lambda _src, arch, defines, **kw: compile_source(cu_text, f"ddtree_probe_{name}.cu", arch, defines)
    return mod


def load_impl(spec):
    """(name, module, flags) for one --impl entry."""
    if spec == "new":
        return "new", ddtree, 0
    if spec == "heap":
        return "heap", ddtree, ddtree.FLAG_LEGACY_SEARCH
    if spec.startswith("orig="):
        d = pathlib.Path(spec[5:])
        return "orig", load_module_copy("orig", d / "ddtree.py", (d / "ddtree.cu").read_text()), 0
    raise ValueError(f"unknown --impl {spec!r}")


def make_inputs(dev, stream, rng, batch, budget, logits_dtype, max_context):
    n_nodes = budget + 1
    x = rng.standard_normal((batch, DEPTH, VOCAB), dtype=np.float32) * 2.0
    top = rng.integers(0, VOCAB, (batch, DEPTH, 4))
    for j, boost in enumerate((9.0, 6.0, 5.0, 4.0)):
        np.put_along_axis(x, top[:, :, j:j + 1], boost, axis=2)
    bf16 = logits_dtype == "bfloat16"
    logits = dl.DeviceBuffer.allocate(dev, x.size * (2 if bf16 else 4)).as_array(
        x.shape, dl.bfloat16 if bf16 else np.float32)
    logits.copy_from_host(f32_to_bf16_bits(x) if bf16 else x)
    rows = batch * n_nodes
    target = dl.DeviceBuffer.allocate(dev, rows * VOCAB * 2).as_array((rows, VOCAB), dl.bfloat16)
    block = min(rows, 64)
    t = rng.standard_normal((block, VOCAB), dtype=np.float32)
    t[np.arange(block), top[0, np.arange(block) % DEPTH, 0]] = 12.0
    target[:block].copy_from_host(f32_to_bf16_bits(t))
    for r0 in range(block, rows, block):
        n = min(block, rows - r0)
        target[r0:r0 + n].copy_from(target[:n], stream)
    tokens = dl.DeviceBuffer.allocate(dev, rows * 4).as_array((rows,), np.int32)
    tokens.copy_from_host(rng.integers(0, VOCAB, rows).astype(np.int32))
    state = DDTreeState.allocate(dev, max_batch=batch, max_context=max_context,
                                 num_slots=batch * (max_context + n_nodes), budgets=True)
    prefix = min(1000, max_context - n_nodes)
    slots = rng.permutation(state.free_slots.shape[0]).astype(np.int64)
    table = np.full((batch, max_context), -1, np.int32)
    table[:, :prefix] = slots[:batch * prefix].reshape(batch, prefix)
    free = slots[batch * prefix:]
    snap = dict(active=np.ones(batch, np.uint8), root_tokens=rng.integers(0, VOCAB, batch).astype(np.int32),
                committed_lens=np.full(batch, prefix, np.int64), req_pool_indices=np.arange(batch, dtype=np.int64),
                req_to_token=table, budgets=np.full(batch, budget, np.int32),
                free_slots=np.concatenate([free, slots[:batch * prefix]]), free_count=np.array([free.size], np.int64))
    stream.synchronize()
    return logits, target, tokens, state, snap


class Timer:
    def __init__(self, dev, stream, reps):
        self.dev, self.stream, self.reps = dev, stream, reps
        self.spin = selftest.load(dev).kernel("spin_wait_ns").prepare(1, 32, [np.int64(150_000)])
        self.ev = [dev.create_event() for _ in range(16)]

    def run(self, launches, pre=None):
        """Median GPU µs of every launch in ``launches`` (list of PreparedLaunch), in order."""
        st, ev = self.stream, self.ev
        per = [[] for _ in launches]
        for r in range(self.reps + 2):
            if pre is not None:
                pre()
            self.spin.launch(st)
            ev[0].record(st)
            for i, ln in enumerate(launches):
                ln.launch(st)
                ev[i + 1].record(st)
            st.synchronize()
            if r >= 2:
                for i in range(len(launches)):
                    per[i].append(ev[i].elapsed_ms(ev[i + 1]) * 1e3)
        return [statistics.median(v) for v in per]


def cached(plan, tag, n=None):
    out = []
    for key, lns in plan._cache.items():
        if key[0] == tag:
            out = lns
    return out


def copy_bandwidth(dev, stream, timer, nbytes=512 << 20):
    buf = dl.DeviceBuffer.allocate(dev, 2 * nbytes).as_array((2, nbytes), np.uint8)
    st, ev = stream, timer.ev
    ts = []
    for r in range(7):
        ev[0].record(st)
        buf[1].copy_from(buf[0], st)
        ev[1].record(st)
        st.synchronize()
        if r >= 2:
            ts.append(ev[0].elapsed_ms(ev[1]) * 1e-3)
    return 2 * nbytes / statistics.median(ts)  # bytes read + written per second (HBM traffic)


def probe_impl(dev, stream, timer, impl, batch, budget, inputs, logits_dtype, max_context):
    name, mod, flags = impl
    logits, target, tokens, state, snap = inputs
    state = mod.DDTreeState(**{f: getattr(state, f) for f in state.__dataclass_fields__})
    plan = mod.DDTreePlan(dev, max_batch=batch, depth_limit=DEPTH, vocab=VOCAB, budget=budget,
                          max_context=max_context, logits_dtype=logits_dtype, target_dtype="bfloat16")
    if flags:
        plan.flags = flags

    def restore():
        state.upload(**snap)

    restore()
    plan.build(stream, logits, state)
    plan.compile(stream, state)
    plan.accept(stream, state, target_logits=target)
    plan.commit(stream, state)
    plan.accept(stream, state, target_tokens=tokens)
    stream.synchronize()
    restore()
    res = {}
    b_lns = cached(plan, "build")
    res["topk_chunks"], res["build"] = timer.run(b_lns, pre=restore)
    state.upload(budgets=np.zeros(batch, np.int32))
    _, res["build[b=0]"] = timer.run(b_lns)
    restore()
    plan.build(stream, logits, state)
    stream.synchronize()
    nodes = plan.node_counts.to_numpy()
    depth = int(plan.depths.to_numpy().max())
    (res["compile"],) = timer.run(cached(plan, "compile"))

    def pre_accept():
        restore()
        plan.compile(stream, state)

    acc = [lns for key, lns in plan._cache.items() if key[0] == "accept"]
    res["argmax"], res["accept"] = timer.run(acc[0], pre=pre_accept)
    (res["accept[tok]"],) = timer.run(acc[1], pre=pre_accept)

    def pre_commit():
        restore()
        plan.compile(stream, state)
        plan.accept(stream, state, target_logits=target)

    (res["commit"],) = timer.run(cached(plan, "commit"), pre=pre_commit)
    rows = int(nodes.sum())
    info = f"nodes/request {nodes.tolist()} depth {depth} argmax {plan.argmax_grid} CTAs x {plan.argmax_splits} splits"
    del plan
    return res, rows, info


def print_trace(name, o, pts, t0):
    """o: [ctas, 16, 3] (clock64, globaltimer, smid + 1) per probe point."""
    seen = o[:, :, 2] > 0
    clk, gt = o[:, :, 0], o[:, :, 1]
    parts = []
    for k in range(1, pts):
        ok = seen[:, k] & seen[:, k - 1]
        if ok.any():
            d = clk[ok, k] - clk[ok, k - 1]
            parts.append(f"{k - 1}-{k}: {int(np.median(d))}/{int(d.max())}")
    end_pt = max(k for k in range(pts) if seen[:, k].any()) if name == "topk_chunks" else 4
    first = np.flatnonzero(seen[:, 0])
    done = first[seen[first, end_pt]]
    life_ns = gt[done, end_pt] - gt[done, 0]
    life_clk = clk[done, end_pt] - clk[done, 0]
    ghz = float(np.median(life_clk / np.maximum(life_ns, 1))) if done.size else float("nan")
    starts, ends = gt[first, 0] - t0, gt[done, end_pt] - t0
    sm = o[first, 0, 2]
    conc = 0
    for smid in np.unique(sm):
        ctas = first[sm == smid]
        ev = sorted([(gt[i, 0], 1) for i in ctas] + [(gt[i, end_pt], -1) for i in ctas if seen[i, end_pt]])
        run = 0
        for _, e in ev:
            run += e
            conc = max(conc, run)
    print(f"    {name}: {first.size} CTAs on {np.unique(sm).size} SMs, <= {conc} at once per SM; starts "
          f"{starts.min()}..{starts.max()} ns, ends {ends.min() if ends.size else -1}..{ends.max() if ends.size else -1}"
          f" ns; CTA life median {int(np.median(life_ns)) if life_ns.size else -1} ns ({ghz:.2f} GHz); "
          + ", ".join(parts))
    if name == "build":
        for i in np.flatnonzero(seen[:, 5])[:2]:
            ph = [int(clk[i, k] - clk[i, k - 1]) for k in range(5, 9) if seen[i, k] and seen[i, k - 1]]
            print(f"      last CTA {i}: phases 4-5..7-8 cycles {ph}, ends {gt[i, 8] - t0} ns")


def trace(dev, stream, timer, batch, budget, inputs, logits_dtype, max_context):
    """Phase breakdown of ddtree_topk_chunks_* and ddtree_build from DDT_PROBE points."""
    here = pathlib.Path(ddtree.__file__)
    text = TRACE_DEFINE + (here.parent.parent / "cu" / "ddtree.cu").read_text()
    if not (here.parent / "cu").exists():
        text = TRACE_DEFINE + (pathlib.Path(dl.__file__).parent.parent / "cu" / "ddtree.cu").read_text()
    mod = load_module_copy("trace", here, text)
    logits, target, tokens, state, snap = inputs
    state = mod.DDTreeState(**{f: getattr(state, f) for f in state.__dataclass_fields__})
    plan = mod.DDTreePlan(dev, max_batch=batch, depth_limit=DEPTH, vocab=VOCAB, budget=budget,
                          max_context=max_context, logits_dtype=logits_dtype, target_dtype="bfloat16")
    state.upload(**snap)
    plan.build(stream, logits, state)
    stream.synchronize()
    nctas = [g[0] * g[1] * g[2] for g in (ln.grid for ln in cached(plan, "build"))]
    bufs = [dl.DeviceBuffer.allocate(dev, n * 48 * 8).as_array((n, 16, 3), np.uint64) for n in nctas]
    lns = []
    for ln, buf in zip(cached(plan, "build"), bufs):  # the plan's launches share one params struct: copy it
        pv = type(ln._values[0]).from_buffer_copy(ln._values[0])
        pv.dense_cache = buf.ptr
        lns.append(ln.kernel.prepare(ln.grid, ln.block, [pv], ln.shared_mem))
    for _ in range(3):
        state.upload(**snap)
        for buf in bufs:
            buf.fill_bytes(0, stream)
        timer.spin.launch(stream)
        for ln in lns:
            ln.launch(stream)
        stream.synchronize()
    out = [buf.to_numpy().astype(np.int64) for buf in bufs]
    print(f"  trace budget {budget} batch {batch} (cycles per phase: median / max over CTAs; ns from the first CTA start)")
    seen_any = [o[:, :, 1][o[:, :, 2] > 0] for o in out]
    if any(a.size == 0 for a in seen_any):
        print("    no probe records")
        return
    t0 = min(int(a.min()) for a in seen_any)
    for name, o, pts in (("topk_chunks", out[0], 6), ("build", out[1], 9)):
        try:
            print_trace(name, o, pts, t0)
        except Exception as e:
            print(f"    {name}: analysis failed: {type(e).__name__}: {e}")
    del plan


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budgets", default="16,256,512")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--impl", default="new")
    ap.add_argument("--max-context", type=int, default=4096)
    ap.add_argument("--logits-dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--trace", action="store_true", help="also print the DDT_PROBE phase breakdown")
    args = ap.parse_args(argv)
    if dl.device_count() == 0:
        print("ddtree_probe: no CUDA GPU", file=sys.stderr)
        return 1
    impls = [load_impl(s) for s in args.impl.split(",")]
    dev = dl.Device(0)
    stream = dev.create_stream()
    timer = Timer(dev, stream, args.reps)
    bw = copy_bandwidth(dev, stream, timer)
    print(f"{dev.name}: device-to-device copy {bw / 1e12:.2f} TB/s (read + write); GPU µs per kernel, median of "
          f"{args.reps}", flush=True)
    rng = np.random.default_rng(0)
    for batch in (int(b) for b in args.batches.split(",")):
        for budget in (int(b) for b in args.budgets.split(",")):
            inputs = make_inputs(dev, stream, rng, batch, budget, args.logits_dtype, args.max_context)
            cols, rows = {}, 0
            for impl in impls:
                try:
                    cols[impl[0]], rows, info = probe_impl(dev, stream, timer, impl, batch, budget, inputs,
                                                           args.logits_dtype, args.max_context)
                    print(f"  [{impl[0]}] {info}", flush=True)
                except Exception as e:  # keep probing the other implementations
                    print(f"  [{impl[0]}] failed: {type(e).__name__}: {e}", flush=True)
            floor = rows * VOCAB * 2 / bw * 1e6
            print(f"== budget {budget} batch {batch}: {rows} target rows, {rows * VOCAB * 2 / 1e6:.1f} MB "
                  f"(argmax floor {floor:.1f} µs at the copy's {bw / 1e12:.2f} TB/s of traffic)")
            names = list(cols)
            print(f"  {'kernel':>14} " + " ".join(f"{n:>9}" for n in names))
            keys = list(next(iter(cols.values())).keys()) if cols else []
            for k in keys:
                print(f"  {k:>14} " + " ".join(f"{cols[n].get(k, float('nan')):9.1f}" for n in names))
            for n in names:
                c = cols[n]
                print(f"  [{n}] build stage {c['topk_chunks'] + c['build']:.1f}, search+output "
                      f"{c['build'] - c['build[b=0]']:.1f}, argmax {rows * VOCAB * 2 / c['argmax'] / 1e6:.2f} TB/s, "
                      f"accept+commit {c['argmax'] + c['accept'] + c['commit']:.1f} "
                      f"(argmax known: {c['accept[tok]'] + c['commit']:.1f})", flush=True)
            if args.trace:
                try:
                    trace(dev, stream, timer, batch, budget, inputs, args.logits_dtype, args.max_context)
                except Exception as e:
                    print(f"  trace failed: {type(e).__name__}: {e}", flush=True)
            del inputs
    return 0


if __name__ == "__main__":
    sys.exit(main())
