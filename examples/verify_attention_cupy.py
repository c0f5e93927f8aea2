"""Verify attention on arrays owned by CuPy, on a CuPy stream, with no copies.

driverlevel takes any array exporting ``__cuda_array_interface__`` (or DLPack). CuPy has
no bfloat16 dtype, so bf16 data travels as ``uint16`` bit patterns, which the plan
accepts for ``q``, ``kv_cache`` and ``out``. The launch goes on CuPy's stream, borrowed
with :meth:`driverlevel.Stream.from_handle` (never destroyed by driverlevel).

Run:  python examples/verify_attention_cupy.py      (needs a GPU and cupy-cuda13x)
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import driverlevel as dl
from driverlevel.runtime import bf16_bits_to_f32, f32_to_bf16_bits, require_gpu
from driverlevel.reference.attention import verify_attention_reference
from driverlevel.reference.trees import build_bitmask, make_metadata, random_tree
from driverlevel.verify_attention import VerifyAttention, VerifyMetadata


def main() -> int:
    # no options: --help prints this docstring; anything else is a usage error (exit 2)
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    require_gpu()
    try:
        import cupy as cp
    except ImportError:
        print("This example needs CuPy (pip install cupy-cuda13x).", file=sys.stderr)
        return 2
    dev = dl.Device(0)
    rng = np.random.default_rng(0)
    heads, sm_scale = 9, 1.0 / np.sqrt(192.0)

    # Two requests: prefixes of 300 and 1000 tokens, draft trees of 16 and 7 nodes.
    trees = [random_tree(16, rng), random_tree(7, rng)]
    md = make_metadata([300, 1000], [16, 7], 4096, rng)
    q_bits = f32_to_bf16_bits(rng.standard_normal((md.total_q, heads, 576)).astype(np.float32))
    kv_bits = f32_to_bf16_bits(rng.standard_normal((md.num_slots, 576)).astype(np.float32))
    mask = build_bitmask(trees, 1)

    cs = cp.cuda.Stream(non_blocking=True)
    with cs:  # every CuPy array below belongs to CuPy's memory pool
        q = cp.asarray(q_bits)                     # uint16 [total_q, 9, 576]: bf16 bit patterns
        kv = cp.asarray(kv_bits)                   # uint16 [num_slots, 576]
        meta = VerifyMetadata(
            qo_indptr=cp.asarray(md.qo_indptr),    # int64, as SGLang hands them over
            kv_indptr=cp.asarray(md.kv_indptr),    # int32
            kv_indices=cp.asarray(md.kv_indices),  # int64
            out_cache_loc=cp.asarray(md.out_cache_loc),
            custom_mask=cp.asarray(mask),          # uint32 [total_q, 1] packed ancestor bitmask
        )
        out = cp.empty((md.total_q, heads, 512), dtype=cp.uint16)
        lse = cp.empty((md.total_q, heads), dtype=cp.float32)
    cs.synchronize()

    plan = VerifyAttention(dev, heads, max_batch=2, max_q=16, sm_scale=sm_scale, mask_format="bitmask")
    stream = dl.Stream.from_handle(cs.ptr, dev)
    plan.run(stream, q, kv, meta, out, lse)          # no copies: pointers go straight to the kernel
    cs.synchronize()

    ref_out, ref_lse = verify_attention_reference(q_bits, kv_bits, md.qo_indptr, md.kv_indptr, md.kv_indices,
                                                  md.out_cache_loc, mask, "bitmask", sm_scale)
    got = bf16_bits_to_f32(cp.asnumpy(out))
    err = np.linalg.norm(got - ref_out) / np.linalg.norm(ref_out)
    lerr = np.abs(cp.asnumpy(lse) - ref_lse).max()
    print(f"VerifyAttention on CuPy arrays: relative error {err:.2e} (bf16 output), LSE error {lerr:.1e}")
    print(plan)
    return 0 if err < 5e-3 and lerr < 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
