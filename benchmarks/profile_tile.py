"""One verify-attention shape run eagerly twice by one tile configuration, for Nsight Compute.

The second ``verify_attn_partial`` launch is the one to read::

    ncu --clock-control none -k regex:verify_attn_partial -s 1 -c 1 --section SpeedOfLight \\
        python benchmarks/profile_tile.py --tile sm_120

Usage: python benchmarks/profile_tile.py [--heads H] [--batch B] [--prefix P] [--tokens T]
                                         [--tile native|sm_120] [--spec SPEC]

``native`` / ``sm_120``: the tile ``tile_config`` returns for this GPU / for sm_120; ``--spec``
any tile in ``bench_tiles.py``'s notation instead, e.g. ``64x2x32x2rp`` (sm_90's tile before the
ws tile, sm_100's today), ``64x2x32x2rpb`` (the same with bulk copies), ``32x4x32x2qrpb``
(sm_120's before the ws tile), ``64x1x32x3wc_24`` (sm_80's ws tile), ``64x1x32x4wd_20`` (sm_90's tile
before the twenty-seventh session), ``64x1x32x4wdg_20`` (the same with the QK warps' S by wgmma),
``64x1x32x4wdgv_20`` (sm_90's since the twenty-eighth session: P V by wgmma too).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


#: Each option's largest value, and why.
UPPER = {
    "heads": (128, "an MLA model's heads, as bench_step.py's --heads"),
    "batch": (1024, "VerifyAttention's MAX_BATCH"),
    "prefix": (2**31 - 1, "VerifyMetadata's kv_indptr is int32"),
    # about twice the 513 nodes (budget 512 + 1) a DDTree step verifies; the host builds each request's
    # tree mask in Python, O(tokens^2): ~20 s at batch 1024 and 1024 tokens
    "tokens": (1024, "twice the draft tokens a DDTree step verifies at most"),
}
#: The most device memory the inputs may take: they must fit an 80 GB GPU beside the plan's workspace.
MAX_INPUT_BYTES = 64 << 30


def input_bytes(heads: int, batch: int, prefix: int, tokens: int) -> int:
    """Device bytes of ``bench_attention.make_data``'s inputs: the bf16 KV cache (576 values per slot) and
    its int64 slot permutation, bf16 q (576) and out (512) and float32 lse per token and head, the
    uint32 bitmask, and the int64 / int32 index arrays."""
    slots = batch * (prefix + tokens) + 1024
    rows = batch * tokens
    return (slots * (576 * 2 + 8) + rows * heads * (576 * 2 + 512 * 2 + 4) + rows * -(-tokens // 32) * 4
            + batch * prefix * 8 + rows * 8 + (batch + 1) * 12)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--heads", type=int, default=16, help="query heads (default 16)")
    ap.add_argument("--batch", type=int, default=2, help="requests (default 2)")
    ap.add_argument("--prefix", type=int, default=32768, help="cached tokens per request (default 32768)")
    ap.add_argument("--tokens", type=int, default=256, help="draft tokens per request (default 256)")
    ap.add_argument("--tile", choices=["native", "sm_120"], default="native", type=str.lower,
                    help="native: the GPU's default tile; sm_120: the sm_120 tile forced (default native)")
    ap.add_argument("--spec", help="a bench_tiles.py tile spec instead of --tile, e.g. 64x1x32x3w")
    args = ap.parse_args(argv)
    # The options are checked before the GPU is: a bad one is a usage error (exit 2 with the usage line).
    for name in ("heads", "batch", "prefix", "tokens"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    for name, (hi, why) in UPPER.items():
        if getattr(args, name) > hi:
            ap.error(f"--{name} must be <= {hi} ({why}), got {getattr(args, name)}")
    need = input_bytes(args.heads, args.batch, args.prefix, args.tokens)
    if need > MAX_INPUT_BYTES:  # not an out-of-memory error from torch after the GPU check
        ap.error(f"--batch {args.batch} x (--prefix {args.prefix} + --tokens {args.tokens}) with --heads {args.heads} "
                 f"needs {need / 2**30:.1f} GiB of inputs on the GPU, more than {MAX_INPUT_BYTES >> 30} GiB: "
                 f"lower --batch, --prefix, --tokens or --heads")
    sys.path.insert(0, str(Path(__file__).parent))
    spec_tile = None
    if args.spec:
        from bench_tiles import parse_tile_config

        try:
            spec_tile = parse_tile_config(args.spec.partition("=")[2] if "=" in args.spec else args.spec,
                                          f"--spec {args.spec!r}")
        except SystemExit as e:  # parse_tile_config's one-line message
            ap.error(str(e.code))
    import driverlevel as dl
    from bench_attention import require_gpu_and_torch

    torch = require_gpu_and_torch("profile_tile.py")

    from bench_attention import make_data

    from driverlevel.verify_attention import VerifyAttention, tile_config

    dev = dl.Device(0)
    stream = dev.create_stream()
    tile = tile_config("sm_120") if args.tile == "sm_120" else None
    if args.spec:
        tile = spec_tile
    plan = VerifyAttention(dev, args.heads, max_batch=args.batch, max_q=args.tokens, tile=tile)
    d = make_data(torch, dev, args.heads, [args.prefix] * args.batch, args.tokens, False, plan.mask_words, 1)
    torch.cuda.synchronize()
    for _ in range(2):
        plan.run(stream, d["q"], d["kv"], d["meta"], d["out"], d["lse"])
    stream.synchronize()
    plan.check_errors(stream)
    print(f"{args.heads} heads x {args.batch} x {args.prefix} prefix x {args.tokens} tokens, {plan!r}", file=sys.stderr)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
    import tool_output  # (tools/tool_output.py: a failed write of stdout is one line, exit 2)

    sys.exit(tool_output.run(main, "benchmarks/profile_tile.py"))
