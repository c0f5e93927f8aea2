"""Plug your own target forward into the captured DDTree step.

A runtime that is not driverlevel (your C++ engine, JAX, a research loop) keeps its own
model and kernels and lets :class:`driverlevel.runner.DecodeStepRunner` run the rest of the
step: drafter, tree build, tree compile, greedy accept, commit. The contract is one
callable::

    target_forward(stream, buffers)      # driverlevel.interfaces.TargetForward; buffers: TargetBuffers

It must only *launch* work on ``stream`` (it is captured into the step's graph once and
replayed every step; no allocation, no synchronization, no host reads): read
``buffers.input_ids`` / ``positions`` / ``metadata`` (SGLang dtypes, the tree's bitmask in
``metadata.custom_mask``), write every row's latent KV into ``buffers.kv_cache`` at
``metadata.out_cache_loc`` (skipping a slot of -1: the pool ran out) and float32 logits into
``buffers.logits``. The row count of a step is on the device (``buffers.num_rows`` =
``qo_indptr[bs]``); rows past it belong to no request (token 0, slot -1: write nothing). For prompts the runner calls it at ``reset`` with ``mask_format="causal"`` and
``buffers.logits = None``. :class:`driverlevel.interfaces.TargetBuffers` says what every row
attends to.

Here "your runtime" is driverlevel's demo model up to the residual stream followed by a
hand-written LM head kernel compiled with NVRTC (any kernel launched on ``stream`` works
the same way: a cuBLAS call, a Triton kernel, a CuPy RawKernel). The tokens are checked
against plain greedy decoding with the built-in model.

Run:  python examples/external_target_forward.py      (needs a GPU)
"""

from __future__ import annotations

import argparse
import math
import sys

import numpy as np

import driverlevel as dl
from driverlevel.runtime import require_gpu
from driverlevel.demo import Drafter, MLAModel, MLAModelConfig
from driverlevel.runner import AutoregressiveRunner, DecodeStepRunner

MY_LM_HEAD = r"""
#include <cuda_bf16.h>
// logits[r, v] = sum_k h[r, k] * w[v, k]; grid (ceil(vocab / 256), min(max_rows, 65535)), block 256:
// gridDim.y is at most 65,535, fewer than max_rows can be (256 requests x 513 rows), so rows stride by it.
extern "C" __global__ void my_lm_head(const __nv_bfloat16* h, const __nv_bfloat16* w, float* logits,
                                      const long long* num_rows, int d, int vocab) {
  const int v = blockIdx.x * blockDim.x + threadIdx.x;
  if (v >= vocab) return;
  const long long rows = *num_rows;           // the step's row count lives on the device
  for (long long r = blockIdx.y; r < rows; r += gridDim.y) {
    float acc = 0.f;
    for (int k = 0; k < d; ++k) acc += __bfloat162float(h[r * d + k]) * __bfloat162float(w[(long long)v * d + k]);
    logits[r * vocab + v] = acc;
  }
}
"""


class MyTargetForward:
    """A target forward from "another runtime": it only launches kernels on the given stream."""

    def __init__(self, model: MLAModel, *, max_batch: int, max_q: int):
        self.model = model
        self.tree_plan = model.forward_plan(max_batch=max_batch, max_q=max_q, mask_format="bitmask", name="my.tree")
        self.prefill_plan = None
        cubin = dl.compile_source(MY_LM_HEAD, "my_lm_head.cu", model.device.arch)
        self.lm_head = dl.load_module(model.device, cubin).kernel("my_lm_head")
        self._bound = None

    def bind(self, buffers) -> None:
        """Optional hook: the runner calls it before capturing, so the capture only records launches."""
        if self._bound == buffers.key():
            return
        self.tree_plan.prepare(buffers.input_ids, buffers.positions, buffers.metadata, buffers.kv_cache,
                               num_rows=buffers.num_rows, stop_after="hidden")
        V, D = self.model.vocab_size, self.model.d_model
        self._head = self.lm_head.prepare((math.ceil(V / 256), min(buffers.max_rows, 65535), 1), 256,
                                          [self.tree_plan.h, self.model.w_lm, buffers.logits, buffers.num_rows,
                                           np.int32(D), np.int32(V)])
        self._bound = buffers.key()

    def __call__(self, stream, buffers) -> None:
        if buffers.mask_format == "causal":  # prompts (called by reset, never captured): only the KV matters
            # (a DecodeStepRunner's steps are "bitmask"; an AutoregressiveRunner's are "causal" too, and
            # then carry logits: this forward serves the DDTree runner only)
            if (self.prefill_plan is None or self.prefill_plan.max_q < buffers.max_q
                    or self.prefill_plan.max_batch < buffers.batch_size):
                self.prefill_plan = self.model.forward_plan(max_batch=buffers.batch_size, max_q=buffers.max_q,
                                                            mask_format="causal", name="my.prefill")
            self.prefill_plan.prepare(buffers.input_ids, buffers.positions, buffers.metadata, buffers.kv_cache,
                                      num_rows=buffers.num_rows, stop_after="attention")
            self.prefill_plan.run(stream)
            return
        self.bind(buffers)           # packs once (host only); the graph replays the packed launches
        self.tree_plan.run(stream)   # embedding, projections, KV into the cache, verify attention, residual
        self._head.launch(stream)    # "our" LM head


def main() -> int:
    # no options: --help prints this docstring; anything else is a usage error (exit 2)
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    require_gpu()
    dev = dl.Device(0)
    model = MLAModel(dev, MLAModelConfig(vocab_size=8192, num_heads=9, seed=0))
    B, budget, max_new = 4, 24, 128
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, model.vocab_size, size=n).tolist() for n in (200, 150, 90, 20)]
    kw = dict(max_batch=B, max_context=200 + max_new + budget + 2, max_prompt_len=200)

    mine = MyTargetForward(model, max_batch=B, max_q=budget + 1)
    drafter = Drafter(model, max_batch=B, depth_limit=15)
    dd = DecodeStepRunner(dev, target_forward=mine, drafter=drafter, vocab_size=model.vocab_size, budget=budget,
                          depth_limit=15, **kw)
    res = dd.generate(prompts, max_new)          # captures the step with MyTargetForward inside, replays it
    names = [k.name for k in dd.graph.kernel_nodes()]
    print(f"captured step: {len(names)} kernels, including ours: {', '.join(n for n in names if n.startswith('my_'))}")
    ar = AutoregressiveRunner(dev, model=model, **kw).generate(prompts, max_new)
    same = res.tokens == ar.tokens
    print(f"DDTree with an external target forward: {res.steps} steps, {res.tokens_per_step:.2f} tokens/step; "
          f"tokens {'==' if same else '!='} greedy decoding with the built-in model")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
