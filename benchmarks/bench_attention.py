"""Verify-attention benchmark: seed-like shapes, median µs, effective TFLOP/s and prefix GB/s.

Measured side by side in one run with the machine's own ceilings (bf16 matrix
rate through cuBLAS, device-to-device copy bandwidth, both via PyTorch, which is
used here only to make random data on the GPU and to measure the ceilings).
L2 is flushed (a 256 MB write) before every timed call, as in the peer
measurements of shared/ANCHORS.md. Each call is a replay of a CUDA graph holding the plan's kernels, queued behind
the flush so that no host time falls between the events. The peer columns quote
those measurements
(SGLang Triton tree path and chain path on the same kind of machine): no peer
kernel is installed on the benchmark machine.

Usage: python benchmarks/bench_attention.py [--quick] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import numpy as np

# Peer medians (ms) from shared/ANCHORS.md: (heads, batch, prefix) -> (tree 16, tree 64, tree 256, chain 16)
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


def bench_shape(dl, torch, dev, stream, heads, bs, prefix, ntok, iters, mask_format="bitmask", chain=False):
    from driverlevel.reference.trees import build_mask, chain_tree, random_tree
    from driverlevel.verify_attention import VerifyAttention, VerifyMetadata, suggest_num_splits, tile_config

    rng = np.random.default_rng(heads * 1000 + bs * 100 + ntok)
    cfg = tile_config(dev.arch, ntok * heads)
    splits = suggest_num_splits(dev, bs, ntok, heads, prefix)
    num_slots = bs * (prefix + ntok) + 1024
    kv = torch.randn(num_slots, 576, dtype=torch.bfloat16, device="cuda")
    q = torch.randn(bs * ntok, heads, 576, dtype=torch.bfloat16, device="cuda")
    perm = torch.randperm(num_slots, device="cuda")
    kv_indices = perm[: bs * prefix].contiguous()
    out_cache_loc = perm[bs * prefix: bs * prefix + bs * ntok].contiguous()
    qo_indptr = torch.arange(bs + 1, device="cuda", dtype=torch.int64) * ntok
    kv_indptr = (torch.arange(bs + 1, device="cuda", dtype=torch.int64) * prefix).to(torch.int32)
    trees = [chain_tree(ntok) if chain else random_tree(ntok, rng) for _ in range(bs)]
    plan = VerifyAttention(dev, heads, max_batch=bs, max_q=ntok, num_splits=splits,
                           mask_format="causal" if chain else mask_format)
    mask = None
    if not chain:
        mask_np, _ = build_mask(trees, [prefix] * bs, "bitmask", words_per_token=plan.mask_words)
        mask = torch.from_numpy(mask_np.view(np.int32)).cuda().view(torch.int32)
    out = torch.empty(bs * ntok, heads, 512, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(bs * ntok, heads, dtype=torch.float32, device="cuda")
    flush = dl.DeviceBuffer.allocate(dev, 256 << 20, label="l2-flush").as_array()
    meta = VerifyMetadata(qo_indptr, kv_indptr, kv_indices, out_cache_loc, mask)
    torch.cuda.synchronize()
    plan.run(stream, q, kv, meta, out, lse)  # eager once (compiles, validates)
    with dl.capture(stream) as cap:
        plan.run(stream, q, kv, meta, out, lse)
    graph_exec = cap.graph.instantiate(upload_stream=stream)
    start, end = dev.create_event(), dev.create_event()
    graph_exec.launch(stream)
    stream.synchronize()
    times = []
    for _ in range(iters):
        # The L2 flush runs on the same stream just before the timed replay, so the
        # replay is already queued when it starts: no host time inside the events.
        flush.fill_bytes(iters & 0xFF, stream)
        start.record(stream)
        graph_exec.launch(stream)
        end.record(stream)
        end.synchronize()
        times.append(start.elapsed_ms(end))
    ms = statistics.median(times)
    rows = bs * ntok * heads
    flop = 2.0 * rows * (prefix + ntok) * (576 + 512)
    res = dict(heads=heads, batch=bs, prefix=prefix, draft_tokens=ntok, chain=chain, num_splits=splits,
               tile=f"M{cfg.rows}xN{cfg.keys}", median_ms=ms, tflops=flop / (ms / 1e3) / 1e12,
               prefix_gbs=bs * prefix * 1152 / (ms / 1e3) / 1e9)
    del kv, q, out, lse, flush, plan, graph_exec, cap
    torch.cuda.empty_cache()
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a few shapes only")
    ap.add_argument("--json", help="write results here")
    args = ap.parse_args(argv)
    import torch

    import driverlevel as dl

    dev = dl.Device(0)
    stream = dev.create_stream()
    print(f"# {dev.name} ({dev.arch}, {dev.sm_count} SMs), {time.strftime('%Y-%m-%d')}", flush=True)
    tflops_ceiling, gbs_ceiling = ceilings(torch)
    print(f"# ceilings: bf16 matmul 8192^3 {tflops_ceiling:.0f} TFLOP/s, D2D copy {gbs_ceiling:.0f} GB/s", flush=True)
    if args.quick:
        shapes = [(9, 1, 32768), (16, 8, 32768), (9, 1, 200000)]
        ntoks = (16, 256)
    else:
        shapes = [(h, b, p) for b in (1, 8) for p in (4096, 32768, 131072, 200000) for h in (9, 16)]
        ntoks = (16, 64, 256)
    results = []
    hdr = f"{'heads':>5} {'bs':>3} {'prefix':>7} {'tok':>4} {'splits':>6} {'ms':>9} {'TFLOP/s':>8} {'GB/s':>7} {'peer ms':>8} {'x peer':>7}"
    print(hdr, flush=True)
    for heads, bs, prefix in shapes:
        peer = ANCHOR_PEERS.get((heads, bs, prefix))
        for k, ntok in enumerate(ntoks):
            iters = 5 if bs * prefix * ntok * heads > 2e9 else 10
            r = bench_shape(dl, torch, dev, stream, heads, bs, prefix, ntok, iters)
            pk = {16: 0, 64: 1, 256: 2}[ntok]
            r["peer_tree_ms"] = peer[pk] if peer else None
            r["speedup_vs_peer"] = peer[pk] / r["median_ms"] if peer else None
            results.append(r)
            print(f"{heads:>5} {bs:>3} {prefix:>7} {ntok:>4} {r['num_splits']:>6} {r['median_ms']:>9.3f} {r['tflops']:>8.1f} "
                  f"{r['prefix_gbs']:>7.0f} {r['peer_tree_ms'] or float('nan'):>8.3f} {r['speedup_vs_peer'] or float('nan'):>7.1f}", flush=True)
        if peer:  # the chain peer: 16 draft tokens, causal
            r = bench_shape(dl, torch, dev, stream, heads, bs, prefix, 16, 10, chain=True)
            r["peer_chain_ms"] = peer[3]
            r["speedup_vs_peer"] = peer[3] / r["median_ms"]
            results.append(r)
            print(f"{heads:>5} {bs:>3} {prefix:>7} {'16c':>4} {r['num_splits']:>6} {r['median_ms']:>9.3f} {r['tflops']:>8.1f} "
                  f"{r['prefix_gbs']:>7.0f} {peer[3]:>8.3f} {r['speedup_vs_peer']:>7.1f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=dev.name, arch=dev.arch, date=time.strftime("%Y-%m-%d"),
                           ceiling_tflops=tflops_ceiling, ceiling_copy_gbs=gbs_ceiling, results=results), f, indent=1)
    return results


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
