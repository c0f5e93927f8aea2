"""The benchmarks' 2026-11-30 verify-attention kernel (benchmarks/baseline, CPU only): it runs its own
tiles of that day, which the package's warp-specialized tiles no longer are (a ws tile's 352 threads
were launched on its 96-thread kernel: CUDA_ERROR_INVALID_VALUE on the H200, 2026-12-05)."""

from __future__ import annotations

import pytest
from bench_util import load_bench

from driverlevel._compile import shared_limit


@pytest.fixture(scope="module")
def v1():
    return load_bench("baseline/v1")


@pytest.mark.parametrize("arch, rows, want", [
    ("sm_90", 144, (48, 2, 32)),    # 9 heads x 16 tokens: 3 x 48 rows
    ("sm_90", 4096, (64, 2, 32)),   # 16 heads x 256 tokens
    ("sm_80", 144, (48, 2, 32)),    # the 64-row 32-key tile does not fit its 166,912 B
    ("sm_120", 144, (32, 4, 16)),
    ("sm_89", 4096, (32, 4, 16)),
])
def test_the_baseline_takes_that_days_tile(v1, arch, rows, want):
    t = v1.v1_tile_config(arch, rows)
    assert (t.rows, t.csplit, t.keys) == want and t.shared_bytes <= shared_limit(arch)
    assert t.threads == t.rows // 16 * t.csplit * 32


@pytest.mark.parametrize("arch", ["sm_90", "sm_120"])
def test_the_baseline_kernel_compiles_for_its_tiles_without_spills(v1, arch):
    for t in {v1.v1_tile_config(arch, r) for r in (144, 4096)}:
        cub = v1.compile_v1(arch, t)
        r = cub.resources["verify_attn_partial"]
        assert r.spills == 0, (arch, t, r)
        assert r.shared_bytes + t.shared_bytes <= shared_limit(arch)
