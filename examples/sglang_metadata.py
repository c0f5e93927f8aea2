"""SGLang-style verify metadata without conversion copies: FULL and QLEN_ONLY ``custom_mask`` + ``mask_indptr``.

A serving engine hands over, in their native dtypes and without conversion copies (the
Triton backend's convention: ``kv_indptr``/``kv_indices`` cover the committed prefix only):
``qo_indptr`` int64 [bs+1], ``kv_indptr`` int32 [bs+1], ``kv_indices`` int64,
``out_cache_loc`` int64 [total_q], ``custom_mask`` uint8 (``torch.bool`` in eager engines:
the same byte) and ``mask_indptr`` int64 [bs+1]. Two mask layouts exist (SGLang's
``TreeMaskMode.FULL_MASK`` and ``QLEN_ONLY``):

* FULL: per request a ``q_len x (prefix_len + q_len)`` row-major block (what SGLang's
  ``extend_attention_fwd`` reads; its prefix columns are not read, here or there by default);
* QLEN_ONLY: per request a ``q_len x q_len`` block. SGLang builds no ``mask_indptr`` for it
  (the blocks sit at ``n * n * b``): this example passes the offsets, which are the same
  every step when every request has ``n`` rows.

This example builds both the way SGLang does, passes the buffers straight to
``VerifyAttention`` plans with ``mask_format="full"`` / ``"qlen_only"``, and shows that
they give exactly the output of the packed bitmask plan. If PyTorch is installed the
buffers are torch tensors (``custom_mask`` as ``torch.bool``), else driverlevel arrays.

Run:  python examples/sglang_metadata.py          (needs a GPU)
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import driverlevel as dl
from driverlevel.runtime import bf16_bits_to_f32, f32_to_bf16_bits, require_gpu
from driverlevel.reference.trees import build_bitmask, build_full_mask, build_qlen_only_mask, make_metadata, random_tree
from driverlevel.verify_attention import VerifyAttention


def to_device(dev, host, as_bool=False):
    """A device copy of ``host``: a torch tensor when torch is installed, else a driverlevel array."""
    try:
        import torch

        t = torch.from_numpy(np.ascontiguousarray(host)).cuda()
        return t.bool() if as_bool else t
    except ImportError:
        host = np.ascontiguousarray(host)
        buf = dl.DeviceBuffer.allocate(dev, max(host.nbytes, 16), label="example")
        return buf.as_array(host.shape, host.dtype).copy_from_host(host)


def main() -> int:
    # no options: --help prints this docstring; anything else is a usage error (exit 2)
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    require_gpu()
    dev = dl.Device(0)
    stream = dev.create_stream()
    rng = np.random.default_rng(1)
    heads, prefix, q_lens = 16, [500, 37, 2048], [24, 5, 64]
    trees = [random_tree(n, rng) for n in q_lens]
    md = make_metadata(prefix, q_lens, sum(prefix) + sum(q_lens) + 100, rng)
    q = to_device(dev, f32_to_bf16_bits(rng.standard_normal((md.total_q, heads, 576)).astype(np.float32)))
    kv = to_device(dev, f32_to_bf16_bits(rng.standard_normal((md.num_slots, 576)).astype(np.float32)))
    full, full_indptr = build_full_mask(trees, md.prefix_lens)        # uint8, int64 — SGLang FULL
    qlen, qlen_indptr = build_qlen_only_mask(trees)                    # uint8, int64 — QLEN_ONLY
    bitmask = build_bitmask(trees, 2)                                  # uint32 [total_q, 2]
    common = dict(qo_indptr=to_device(dev, md.qo_indptr), kv_indptr=to_device(dev, md.kv_indptr),
                  kv_indices=to_device(dev, md.kv_indices), out_cache_loc=to_device(dev, md.out_cache_loc))
    variants = {
        "full": dict(common, custom_mask=to_device(dev, full, as_bool=True), mask_indptr=to_device(dev, full_indptr)),
        "qlen_only": dict(common, custom_mask=to_device(dev, qlen, as_bool=True), mask_indptr=to_device(dev, qlen_indptr)),
        "bitmask": dict(common, custom_mask=to_device(dev, bitmask)),
    }
    try:  # buffers made by torch on its own stream: let those copies land before we launch
        import torch

        torch.cuda.synchronize()
    except ImportError:
        pass
    outs = {}
    for fmt, meta in variants.items():  # a plain dict is accepted as the metadata
        plan = VerifyAttention(dev, heads, max_batch=3, max_q=64, mask_format=fmt)
        out = dl.DeviceBuffer.allocate(dev, md.total_q * heads * 512 * 2).as_array((md.total_q, heads, 512), dl.bfloat16)
        plan.run(stream, q, kv, meta, out)
        outs[fmt] = bf16_bits_to_f32(out.to_numpy(stream))
        print(f"{fmt:>9}: custom_mask {getattr(meta.get('custom_mask'), 'dtype', None)}, output checksum "
              f"{float(np.abs(outs[fmt]).sum()):.6e}")
    same = all(np.array_equal(outs["bitmask"], o) for o in outs.values())
    print("all three mask layouts give identical outputs" if same else "MISMATCH between mask layouts")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
