"""Verify-attention benchmark: seed-like shapes, median µs, effective TFLOP/s and prefix GB/s.

Measured side by side in one run with the machine's own ceilings (bf16 matrix
rate through cuBLAS, device-to-device copy bandwidth, both via PyTorch, which is
used here only to make random data on the GPU and to measure the ceilings).
L2 is flushed (a 256 MB write) before every timed call, as in the project's peer
measurements (their medians: ``ANCHOR_PEERS`` below). Each call is a replay of a CUDA graph holding the plan's kernels, queued behind
the flush so that no host time falls between the events. The peer columns quote
those measurements
(SGLang Triton tree path and chain path on the same kind of machine): no peer
kernel is installed on the benchmark machine. The "v1" columns are the kernel of
2026-11-30 (host-fixed split count, ``benchmarks/baseline/``) on the same inputs in
the same run; the first lines are issue 9's ragged batch, the scheduler's own GPU
time and the workspace formula.

Usage: python benchmarks/bench_attention.py [--quick] [--json out.json]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from pathlib import Path

if __name__ == "__main__":  # (run as a script: a missing package or dependency is one line, exit 2)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
    import tool_output

    tool_output.require_package("benchmarks/bench_attention.py")

import numpy as np  # noqa: E402

# Peer medians (ms), the project's anchor measurements on an H200 (SGLang 0.5.23: the Triton tree path
# extend_attention_fwd and the chain path verify_mla): (heads, batch, prefix) -> (tree 16, tree 64, tree 256, chain 16)
ANCHOR_PEERS = {
    (9, 1, 4096): (0.687, 0.653, 0.688, 0.117), (16, 1, 4096): (0.653, 0.652, 0.699, 0.110),
    (9, 1, 32768): (5.37, 5.09, 5.10, 0.287), (16, 1, 32768): (5.09, 5.08, 5.16, 0.258),
    (9, 1, 131072): (21.3, 20.2, 20.2, 0.857), (16, 1, 131072): (20.2, 20.2, 20.4, 0.748),
    (9, 1, 200000): (32.5, 30.9, 30.9, 1.296), (16, 1, 200000): (30.9, 30.8, 31.2, 1.148),
    (9, 8, 4096): (0.666, 1.38, 3.38, 0.267), (16, 8, 4096): (0.666, 1.32, 5.38, 0.259),
    (9, 8, 32768): (5.13, 10.7, 25.6, 1.233), (16, 8, 32768): (5.13, 10.2, 40.8, 1.354),
    (9, 8, 131072): (20.5, 42.7, 101.9, 4.566), (16, 8, 131072): (20.4, 40.6, 162.6, 5.077),
    (9, 8, 200000): (31.2, 65.2, 155.5, 6.915), (16, 8, 200000): (31.2, 62.1, 247.9, 7.779),
}


def require_gpu_and_torch(script: str, why: str = "it makes the random inputs"):
    """The GPU check (one sentence and exit 2 without a GPU), then PyTorch, or exit with one line
    saying why ``benchmarks/<script>`` needs it; returns the ``torch`` module."""
    from driverlevel._device import require_gpu

    require_gpu()
    try:
        import torch
    except ImportError:
        sys.exit(f"benchmarks/{script} needs PyTorch with CUDA ({why}): pip install torch")
    return torch


def ceilings(torch):
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    times = []
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    for _ in range(10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        a @ b
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    tflops = 2 * 8192**3 / statistics.median(times) / 1e12
    n = 1 << 30
    x = torch.empty(n, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    times = []
    for _ in range(3):
        y.copy_(x)
    torch.cuda.synchronize()
    for _ in range(10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        y.copy_(x)
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) / 1e3)
    gbs = 2 * n / statistics.median(times) / 1e9
    del a, b, x, y
    return tflops, gbs


def make_data(torch, dev, heads, prefixes, ntok, chain, words, seed):
    """Random bf16 inputs on the GPU for requests with these prefix lengths and ``ntok`` draft tokens each."""
    from driverlevel.reference.trees import build_mask, chain_tree, random_tree
    from driverlevel.verify_attention import VerifyMetadata

    rng = np.random.default_rng(seed)
    bs = len(prefixes)
    total_prefix = int(sum(prefixes))
    num_slots = total_prefix + bs * ntok + 1024
    kv = torch.randn(num_slots, 576, dtype=torch.bfloat16, device="cuda")
    q = torch.randn(bs * ntok, heads, 576, dtype=torch.bfloat16, device="cuda")
    perm = torch.randperm(num_slots, device="cuda")
    kv_indices = perm[:total_prefix].contiguous()
    out_cache_loc = perm[total_prefix: total_prefix + bs * ntok].contiguous()
    qo_indptr = torch.arange(bs + 1, device="cuda", dtype=torch.int64) * ntok
    kv_indptr = torch.tensor(np.concatenate([[0], np.cumsum(prefixes)]), device="cuda", dtype=torch.int32)
    trees = [chain_tree(ntok) if chain else random_tree(ntok, rng) for _ in range(bs)]
    mask = None
    if not chain:
        mask_np, _ = build_mask(trees, list(prefixes), "bitmask", words_per_token=words)
        mask = torch.from_numpy(mask_np.view(np.int32)).cuda().view(torch.int32)
    out = torch.empty(bs * ntok, heads, 512, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(bs * ntok, heads, dtype=torch.float32, device="cuda")
    meta = VerifyMetadata(qo_indptr, kv_indptr, kv_indices, out_cache_loc, mask)
    return dict(q=q, kv=kv, meta=meta, out=out, lse=lse)


def time_graph(dl, dev, stream, flush, graph_exec, iters):
    """Median ms of graph replays, each queued right behind an L2 flush (no host time inside the events)."""
    start, end = dev.create_event(), dev.create_event()
    graph_exec.launch(stream)
    stream.synchronize()
    times = []
    for i in range(iters):
        flush.fill_bytes(i & 0xFF, stream)
        start.record(stream)
        graph_exec.launch(stream)
        end.record(stream)
        end.synchronize()
        times.append(start.elapsed_ms(end))
    return statistics.median(times)


def time_plan(dl, dev, stream, flush, plan, d, iters):
    """Capture ``plan.run`` once and time its replays; returns (median ms, output copy)."""
    import torch

    torch.cuda.synchronize()
    plan.run(stream, d["q"], d["kv"], d["meta"], d["out"], d["lse"])  # eager once
    with dl.capture(stream) as cap:
        plan.run(stream, d["q"], d["kv"], d["meta"], d["out"], d["lse"])
    gx = cap.graph.instantiate(upload_stream=stream)
    ms = time_graph(dl, dev, stream, flush, gx, iters)
    stream.synchronize()
    return ms, d["out"].clone()


def bench_shape(dl, torch, dev, stream, flush, heads, prefixes, ntok, iters, chain=False, baseline=True, tile=None):
    """The new plan and (``baseline``) the 2026-11-30 kernel with its suggested split count, same inputs.

    ``tile``: a :class:`~driverlevel.verify_attention.TileConfig` forced on the new plan, or an
    architecture (``"sm_120"``): the tile ``tile_config`` returns there for this shape's rows per
    request. The 2026-11-30 kernel runs its own tile of that day for the same architecture (the
    device's, or ``tile``'s name; ``baseline.v1.v1_tile_config``): today's warp-specialized tiles
    are not shapes it can run.
    """
    from driverlevel.verify_attention import VerifyAttention, tile_config

    from baseline.v1 import V1Plan, suggest_num_splits

    bs = len(prefixes)
    v1_arch = tile if isinstance(tile, str) else None
    if isinstance(tile, str):
        tile = tile_config(tile, ntok * heads)
    cfg = tile or tile_config(dev.arch, ntok * heads)
    fmt = "causal" if chain else "bitmask"
    plan = VerifyAttention(dev, heads, max_batch=bs, max_q=ntok, mask_format=fmt, tile=tile)
    d = make_data(torch, dev, heads, prefixes, ntok, chain, plan.mask_words, heads * 1000 + bs * 100 + ntok)
    ms, out_new = time_plan(dl, dev, stream, flush, plan, d, iters)
    rows = bs * ntok * heads
    keys = sum(prefixes) + bs * ntok
    flop = 2.0 * ntok * heads * keys * (576 + 512)
    res = dict(heads=heads, batch=bs, prefix=max(prefixes), prefixes=list(prefixes), draft_tokens=ntok, chain=chain,
               tile=f"M{cfg.rows}xN{cfg.keys}", num_parts=plan.num_parts, median_ms=ms,
               tflops=flop / (ms / 1e3) / 1e12, prefix_gbs=sum(prefixes) * 1152 / (ms / 1e3) / 1e9,
               workspace_bytes=plan.workspace_bytes, rows=rows)
    if baseline:
        splits = suggest_num_splits(dev, bs, ntok, heads, max(prefixes), arch=v1_arch)
        v1 = V1Plan(dev, heads, max_batch=bs, max_q=ntok, num_splits=splits, mask_format=fmt, arch=v1_arch)
        ms1, out_old = time_plan(dl, dev, stream, flush, v1, d, iters)
        diff = (out_new.float() - out_old.float()).norm() / out_old.float().norm()
        res.update(v1_ms=ms1, v1_splits=splits, v1_workspace_bytes=v1.workspace_bytes, speedup_vs_v1=ms1 / ms,
                   rel_diff_vs_v1=float(diff), v1_tile=f"M{v1.cfg.rows}xN{v1.cfg.keys}xC{v1.cfg.csplit}")
        del v1
    del d, plan
    torch.cuda.empty_cache()
    return res


def bench_breakdown(dl, dev, stream, flush, heads, prefixes, ntok, iters=20):
    """Median ms of graphs holding the first 1, 2 and 3 of the plan's kernels (scheduler, partial, combine)."""
    import torch

    from driverlevel.verify_attention import VerifyAttention

    plan = VerifyAttention(dev, heads, max_batch=len(prefixes), max_q=ntok)
    d = make_data(torch, dev, heads, prefixes, ntok, False, plan.mask_words, 2)
    plan.run(stream, d["q"], d["kv"], d["meta"], d["out"], d["lse"])
    res = []
    for n in (1, 2, 3):
        with dl.capture(stream) as cap:
            for ln in plan._launches[:n]:
                ln.launch(stream)
        res.append(time_graph(dl, dev, stream, flush, cap.graph.instantiate(upload_stream=stream), iters))
    return res


def bench_scheduler(dl, dev, stream, heads=9, bs=8, ntok=16, iters=200):
    """GPU time of the scheduler kernel alone (graph of that one node, back-to-back replays)."""
    import torch

    from driverlevel.verify_attention import VerifyAttention

    plan = VerifyAttention(dev, heads, max_batch=bs, max_q=ntok)
    d = make_data(torch, dev, heads, [200_000] + [4096] * (bs - 1), ntok, False, plan.mask_words, 1)
    plan.run(stream, d["q"], d["kv"], d["meta"], d["out"], d["lse"])
    with dl.capture(stream) as cap:
        plan._launches[0].launch(stream)
    gx = cap.graph.instantiate(upload_stream=stream)
    start, end = dev.create_event(), dev.create_event()
    for _ in range(10):
        gx.launch(stream)
    start.record(stream)
    for _ in range(iters):
        gx.launch(stream)
    end.record(stream)
    end.synchronize()
    return start.elapsed_ms(end) * 1e3 / iters


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a few shapes only")
    ap.add_argument("--no-baseline", action="store_true", help="skip the 2026-11-30 kernel")
    ap.add_argument("--tile", choices=("native", "sm_120", "both"), default="native", type=str.lower,
                    help="tile configuration: this GPU's, the one tile_config('sm_120', rows per request) returns "
                         "(forced with tile=), or both side by side")
    ap.add_argument("--json", help="write results here")
    args = ap.parse_args(argv)
    from driverlevel._cli_common import dump_json_file, json_path_problem

    problem = json_path_problem(args.json, stdout_ok=False)  # before the GPU check and the minutes of measuring
    if problem:
        ap.error(f"--json: {problem}")
    import driverlevel as dl

    torch = require_gpu_and_torch("bench_attention.py", "it makes the random inputs and measures the ceilings")

    from driverlevel.verify_attention import VerifyAttention, tile_config

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    dev = dl.Device(0)
    stream = dev.create_stream()
    print(f"# {dev.name} ({dev.arch}, {dev.sm_count} SMs), {time.strftime('%Y-%m-%d')}", flush=True)
    tflops_ceiling, gbs_ceiling = ceilings(torch)
    print(f"# ceilings: bf16 matmul 8192^3 {tflops_ceiling:.0f} TFLOP/s, D2D copy {gbs_ceiling:.0f} GB/s", flush=True)
    flush = dl.DeviceBuffer.allocate(dev, 256 << 20, label="l2-flush").as_array()
    base = not args.no_baseline
    results, extra = [], {}

    tiles = {"native": [("native", None)], "sm_120": [("sm_120", "sm_120")],
             "both": [("native", None), ("sm_120", "sm_120")]}[args.tile]

    # -- the ragged batch of issue 9 ---------------------------------------------------------
    for tname, tile in tiles:
        alone = bench_shape(dl, torch, dev, stream, flush, 9, [200_000], 16, 10, baseline=base, tile=tile)
        ragged = bench_shape(dl, torch, dev, stream, flush, 9, [200_000] + [4096] * 7, 16, 10, baseline=base,
                             tile=tile)
        rg = dict(alone=alone, ragged=ragged, ratio=ragged["median_ms"] / alone["median_ms"],
                  v1_ratio=(ragged["v1_ms"] / alone["median_ms"]) if base else None)
        extra.setdefault("ragged", {})[tname] = rg
        print(f"# [{tname} tile {ragged['tile']}] ragged 1x200k + 7x4k, 9 heads, 16 tokens: {ragged['median_ms']:.3f} "
              f"ms = {rg['ratio']:.2f}x the 200k request alone ({alone['median_ms']:.3f} ms)"
              + (f"; 2026-11-30 kernel: {ragged['v1_ms']:.3f} ms ({ragged['v1_splits']} splits) = "
                 f"{rg['v1_ratio']:.2f}x" if base else ""), flush=True)
    us = bench_scheduler(dl, dev, stream)
    extra["scheduler_us"] = us
    print(f"# scheduler kernel alone (batch 8): {us:.2f} us per replay", flush=True)
    for shape in ((9, [32768], 16), (9, [200_000], 256), (16, [32768] * 8, 256)):
        bd = bench_breakdown(dl, dev, stream, flush, *shape)
        extra.setdefault("breakdown", []).append(dict(heads=shape[0], prefixes=shape[1], ntok=shape[2], ms=bd))
        print(f"# breakdown {shape[0]} heads, {len(shape[1])} x {shape[1][0]}, {shape[2]} tokens: scheduler "
              f"{bd[0] * 1e3:.1f} us, + partial {bd[1] * 1e3:.1f} us, + combine {bd[2] * 1e3:.1f} us", flush=True)
    extra["workspace"] = {}  # from the plans themselves (their grid comes from the device's occupancy)
    for tname, tile in tiles:
        wplan = VerifyAttention(dev, 9, max_batch=8, max_q=256, tile=tile_config(tile, 9 * 256) if tile else None)
        extra["workspace"][f"{tname}_b8_q256_h9"] = wplan.workspace_bytes  # the published formula
        extra["workspace"][f"{tname}_b8_q256_h9_pool"] = wplan.pool_bytes  # with the carve-outs' alignment
        del wplan
    extra["workspace"]["v1_seed_16_splits"] = 8 * 256 * 9 * 16 * 513 * 4
    print("# workspace: " + ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in extra["workspace"].items()), flush=True)

    if args.quick:
        shapes = [(9, 1, 32768), (16, 8, 4096), (16, 8, 32768), (9, 1, 200000)]
        ntoks = (16, 256)
    else:
        shapes = [(h, b, p) for b in (1, 8) for p in (4096, 32768, 131072, 200000) for h in (9, 16)]
        ntoks = (16, 64, 256)
    hdr = (f"{'tile':>7} {'heads':>5} {'bs':>3} {'prefix':>7} {'tok':>4} {'ms':>8} {'TFLOP/s':>8} {'v1 ms':>8} "
           f"{'x v1':>6} {'peer ms':>8} {'x peer':>7}")
    print(hdr, flush=True)
    for heads, bs, prefix in shapes:
        peer = ANCHOR_PEERS.get((heads, bs, prefix))
        for ntok, (tname, tile) in itertools.product(ntoks + (("16c",) if peer else ()), tiles):
            chain = ntok == "16c"
            n = 16 if chain else ntok
            iters = 5 if bs * prefix * n * heads > 2e9 else 10
            r = bench_shape(dl, torch, dev, stream, flush, heads, [prefix] * bs, n, iters, chain=chain, baseline=base,
                            tile=tile)
            pk = 3 if chain else {16: 0, 64: 1, 256: 2}[n]
            r["tile_config"] = tname
            r["peer_ms"] = peer[pk] if peer else None
            r["speedup_vs_peer"] = peer[pk] / r["median_ms"] if peer else None
            results.append(r)
            print(f"{tname:>7} {heads:>5} {bs:>3} {prefix:>7} {str(ntok):>4} {r['median_ms']:>8.3f} {r['tflops']:>8.1f} "
                  f"{r.get('v1_ms', float('nan')):>8.3f} {r.get('speedup_vs_v1', float('nan')):>6.2f} "
                  f"{r['peer_ms'] or float('nan'):>8.3f} {r['speedup_vs_peer'] or float('nan'):>7.1f}", flush=True)
    if args.json:
        status = dump_json_file(args.json, dict(
            device=dev.name, arch=dev.arch, date=time.strftime("%Y-%m-%d"),
            ceiling_tflops=tflops_ceiling, ceiling_copy_gbs=gbs_ceiling, extra=extra, results=results))
        if status:
            sys.exit(status)
    return results


if __name__ == "__main__":  # (tool_output, imported above: a failed write of stdout is one line, exit 2)
    sys.exit(tool_output.run(lambda: 0 if main() else 1, "benchmarks/bench_attention.py"))
