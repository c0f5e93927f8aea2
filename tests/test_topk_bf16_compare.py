"""The threshold stream's bf16 candidate test (cu/ddtree/topk_threshold.cuh: tk_bf16_ceil and
tk_ge_bf16x2): for every bf16 logit x and a float threshold T, x >= T exactly as the fp32
compare says it, NaN never a candidate.

CPU: the probe compiles on every architecture without spills, and is one set.ge.u32.bf16x2 from
sm_90 (two fp32 compares below). GPU: all 65,536 bf16 bit patterns against thresholds that are
bf16 values (what the sample kernel gives) and that are not (the rounding branch), signed zeros,
subnormals and the largest finite values, against numpy's float32 compare; both the GPU's own
compare (set.ge.bf16x2 from sm_90) and the fp32 one that sm_80 to sm_89 use (tk_ge_bf16x2_f32).
The mask's bit layout, the warp scan and the stream's direct path (more than a warp stage of
candidates in one warp tile: up to 112 fp32 / 167 bf16 of them in the clustered row of
test_threshold_fallback_rows_are_exact) are checked end to end by the DDTree GPU tests.
"""

from __future__ import annotations

import numpy as np
import pytest

import driverlevel as dl
from driverlevel import ddtree
from driverlevel._compile import SUPPORTED_ARCHS
from ptx_util import ptx_entries, ptx_of

PROBE = """#include "common.cuh"
#include "constants.cuh"
#include "ddtree/params.cuh"
#include "ddtree/keys.cuh"
#include "ddtree/topk_threshold.cuh"
// out[t * n + i]: tk_ge_bf16x2 of word i (two bf16 logits) against thresholds[t] rounded up to bf16;
// out[(nt + t) * n + i]: the same by tk_ge_bf16x2_f32 (the fp32 compares of sm_80 to sm_89)
extern "C" __global__ void tk_bf16_compare_probe(const float* thresholds, const unsigned* words, unsigned* out,
                                                 int n, int nt) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x, t = blockIdx.y;
  if (i >= n || t >= nt) return;
  const unsigned t2 = ddt::tk_bf16_ceil(thresholds[t]) * 0x00010001u;
  out[static_cast<size_t>(t) * n + i] = ddt::tk_ge_bf16x2(words[i], t2);
  out[static_cast<size_t>(nt + t) * n + i] = ddt::tk_ge_bf16x2_f32(words[i], t2);
}
"""
NAME = "tk_bf16_compare_probe.cu"


def _compile(arch):
    return dl.runtime.compile_source(PROBE, NAME, arch, ddtree.compile_defines(arch))


@pytest.mark.parametrize("arch", SUPPORTED_ARCHS)
def test_the_bf16_candidate_test_is_one_bf16x2_set_from_sm_90(arch):
    ptx = ptx_entries(ptx_of(PROBE, NAME, arch, ddtree.compile_defines(arch)))["tk_bf16_compare_probe"]
    sm90 = int(arch[3:]) >= 90
    assert ptx.count("set.ge.u32.bf16x2") == int(sm90), ptx  # (the fp32 twin's compares are setp)
    res = _compile(arch).resources["tk_bf16_compare_probe"]
    assert res.spills == 0


def _thresholds(rng):
    """float32 thresholds: bf16 values, values between two bf16 values, signed zeros, subnormals,
    the largest finite values, each sign."""
    bf = (rng.integers(0, 1 << 16, 200, dtype=np.uint32) << 16).view(np.float32)
    bf = bf[np.isfinite(bf)]
    between = (rng.integers(0, 1 << 32, 200, dtype=np.uint64).astype(np.uint32)).view(np.float32)
    between = between[np.isfinite(between)]
    special = np.array([0.0, -0.0, 1e-40, -1e-40, 1.5e-45, -1.5e-45, np.finfo(np.float32).max,
                        -np.finfo(np.float32).max, 3.3895314e38, 1.0, -1.0, 1.0000001, -1.0000001,
                        0.99999994, -0.99999994], dtype=np.float32)
    # a bf16 value plus or minus one float32 ulp: the nearest non-bf16 thresholds on each side
    near = np.concatenate([np.nextafter(bf[:50], np.float32(np.inf)), np.nextafter(bf[:50], np.float32(-np.inf))])
    t = np.concatenate([bf, between, special, near.astype(np.float32)]).astype(np.float32)
    return t[np.isfinite(t)]


@pytest.mark.gpu
def test_every_bf16_logit_against_float_thresholds_matches_the_fp32_compare(device, stream):
    rng = np.random.default_rng(50)
    thresholds = _thresholds(rng)
    halves = np.arange(1 << 16, dtype=np.uint32)  # every bf16 bit pattern (NaNs and infinities included)
    words = halves[0::2] | (halves[1::2] << 16)   # word i: patterns 2i (low half) and 2i + 1
    n, nt = words.size, thresholds.size
    mod = dl.load_module(device, _compile(device.arch))
    d_thr = dl.DeviceBuffer.allocate(device, thresholds.nbytes, label="thresholds").as_array(thresholds.shape, np.float32)
    d_thr.copy_from_host(thresholds)
    d_words = dl.DeviceBuffer.allocate(device, words.nbytes, label="words").as_array(words.shape, np.uint32)
    d_words.copy_from_host(words)
    out = dl.DeviceBuffer.allocate(device, 2 * n * nt * 4, label="out").as_array((2, nt, n), np.uint32)
    out.fill_u32(0x5A5A5A5A, stream)  # poisoned: neither 0 nor 0xffff in either half
    mod.kernel("tk_bf16_compare_probe").launch(stream, ((n + 255) // 256, nt), 256,
                                               [d_thr, d_words, out, np.int32(n), np.int32(nt)])
    got = out.to_numpy(stream)
    x = (halves << 16).view(np.float32)  # each bf16 pattern's float32 value, exactly
    with np.errstate(invalid="ignore"):
        want = x[None, :] >= thresholds[:, None]  # NaN: False
    want_words = np.where(want[:, 0::2], 0xFFFF, 0).astype(np.uint32) | np.where(want[:, 1::2], 0xFFFF0000, 0).astype(np.uint32)
    for which, g in zip(("tk_ge_bf16x2", "tk_ge_bf16x2_f32"), got):
        bad = np.argwhere(g != want_words)
        assert bad.size == 0, (f"{which}: {len(bad)} mismatches, first: threshold {thresholds[bad[0][0]]!r}, "
                               f"word {words[bad[0][1]]:#010x}: got {g[tuple(bad[0])]:#010x}, "
                               f"want {want_words[tuple(bad[0])]:#010x}")
    assert want.any() and not want.all()  # the thresholds cut the patterns somewhere
