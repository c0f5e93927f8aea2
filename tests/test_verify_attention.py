"""Verify attention without a GPU: compile for every architecture (a spilling tile warns), tile arithmetic
(TileConfig refuses what the kernel rejects), the workspace formula and input validation."""

from __future__ import annotations

import ctypes
import math
import re
import warnings
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import driverlevel as dl
from driverlevel import verify_attention as va
from driverlevel._compile import MAX_SHARED_PER_BLOCK, compile_file, nvrtc_version
from ptx_util import ptx_entries, ptx_of
from driverlevel.verify_attention import (_CONFIGS, TileConfig, VerifyAttention, VerifyMetadata, _Params, compile_defines,
                                         compile_variants, tile_config, tile_configs)


# every target `--arch` accepts (sm_87, sm_103, sm_121 too: ptxas allocates differently there,
# e.g. a ws variant that is spill-free on sm_80 and sm_90 spilled 16 B on sm_87)
@pytest.mark.parametrize("arch", sorted(MAX_SHARED_PER_BLOCK, key=lambda a: int(a[3:])))
def test_compiles_for_every_arch_without_spills_within_shared_memory(arch):
    cfgs = {tile_config(arch)} | {tile_config(arch, r) for r in (144, 2304, 16)}
    for cfg in cfgs:
        cub = compile_file("verify_attention.cu", cfg.nvrtc_target(arch), compile_defines(arch, cfg))
        assert set(cub.resources) == {"verify_attn_schedule", "verify_attn_partial", "verify_attn_combine"}
        for name, res in cub.resources.items():
            assert res.registers > 0, name
            assert res.spills == 0, f"{name} spills {res.spills} B on {arch}"
            assert res.stack_bytes == 0, f"{name} uses a stack frame on {arch}"
        part = cub.resources["verify_attn_partial"]
        assert part.shared_bytes + cfg.shared_bytes <= MAX_SHARED_PER_BLOCK[arch]
        # the scheduler's static tables stay under the 48 KB static limit
        assert cub.resources["verify_attn_schedule"].shared_bytes <= 48 * 1024
    if arch == "sm_120":
        assert tile_config(arch).shared_bytes <= 99 * 1024


SM90_TARGET = tile_config("sm_90").nvrtc_target("sm_90")  # what sm_90's default tile compiles for (sm_90a: wgmma)


def test_layout_mismatch_fails_the_compile():
    defines = compile_defines("sm_90")
    defines["DL_OFF_lse"] += 8
    with pytest.raises(dl.NvrtcError, match="offset differs"):
        compile_file("verify_attention.cu", SM90_TARGET, defines, use_cache=False)


@pytest.mark.parametrize("missing", ["DL_FIELD_QO_INDPTR", "DL_ERR_INCONSISTENT", "DL_VA_MAX_PARTS",
                                     "DL_VA_REQUEST_BYTES", "DL_SMEM_BYTES"])
def test_compile_without_the_launchers_defines_fails(missing):
    """Each names the public way to compile (review 17: the private _device_error.error_defines() was named)."""
    defines = compile_defines("sm_90")
    del defines[missing]
    with pytest.raises(dl.NvrtcError, match=r'#error directive: "compile with driverlevel\.verify_attention\.'
                                            r'compile_variants\(\)"'):
        compile_file("verify_attention.cu", SM90_TARGET, defines, use_cache=False)


@pytest.mark.parametrize("arch, cfg", [("sm_90", None), ("sm_120", None),
                                       ("sm_90", TileConfig(rows=64, csplit=2, keys=32, stages=2, exchange="reduce_scatter",
                                                            pv_rows=32, bulk=True))])
def test_host_shared_bytes_are_checked_against_the_kernel_layout(arch, cfg):
    # the host launches with TileConfig.shared_bytes: a formula that undercounts (the mbarriers
    # or the row sums at the end would land past the allocation) must not compile
    defines = compile_defines(arch, cfg)
    defines["DL_SMEM_BYTES"] -= 8
    with pytest.raises(dl.NvrtcError, match="differs from TileConfig.shared_bytes"):
        compile_file("verify_attention.cu", (cfg or tile_config(arch)).nvrtc_target(arch), defines, use_cache=False)


def test_row_pairs_need_the_reduce_scatter_exchange_in_the_kernel_too():
    defines = compile_defines("sm_90", TileConfig(rows=64, csplit=2, keys=32, stages=2))
    defines["DL_PV_ROWS"] = 32
    with pytest.raises(dl.NvrtcError, match="32 PV rows need the reduce-scatter exchange"):
        compile_file("verify_attention.cu", "sm_90", defines, use_cache=False)


@pytest.mark.parametrize("arch", ["sm_90", "sm_100", "sm_120"])
@pytest.mark.parametrize("keys, stages", [(16, 4), (32, 3)])
def test_ws_tile_compiles_with_the_hosts_shared_memory_size(arch, keys, stages):
    # QK warps + PV warps: 12 warps of 64 rows; the kernel's static_assert checks its layout
    # against TileConfig.shared_bytes (research/verify_ws.md)
    cfg = TileConfig(rows=64, csplit=1, keys=keys, stages=stages, ws=True)
    assert cfg.threads == 384 and cfg.label.endswith(" ws")
    if cfg.shared_bytes > MAX_SHARED_PER_BLOCK[arch]:  # (32 keys x 3 stages on sm_120: 132,960 B > 101,376 B)
        from driverlevel.verify_attention import _check_tile_fits

        with pytest.raises(ValueError, match=f"it needs {cfg.shared_bytes} B per block, more than the "
                                             f"{MAX_SHARED_PER_BLOCK[arch]} B {arch} allows"):
            _check_tile_fits(cfg, arch)  # refused by the host, never launched
        return
    cub = compile_file("verify_attention.cu", arch, compile_defines(arch, cfg))
    assert cub.resources["verify_attn_partial"].registers <= 168


def test_ws_tile_rejects_what_it_does_not_support():
    with pytest.raises(ValueError, match="qk_chains must be"):
        TileConfig(rows=64, csplit=2, keys=32, stages=2, qk_chains=2)
    assert TileConfig(rows=64, csplit=1, keys=16, stages=4, ws=True, qk_chains=2).defines()["DL_QK_CHAINS"] == 2
    assert TileConfig(rows=64, csplit=1, keys=16, stages=3, ws=True, qk_chains=4).defines()["DL_QK_CHAINS"] == 4
    for bad in (0, 5):
        with pytest.raises(ValueError, match="qk_chains must be"):
            TileConfig(rows=64, csplit=1, keys=32, stages=3, ws=True, qk_chains=bad)
    for bad in (dict(csplit=2), dict(stages=2), dict(qreg=True), dict(exchange="reduce_scatter"), dict(bulk=True),
                dict(rows=16), dict(rows=80), dict(rows=96), dict(rows=128), dict(keys=48), dict(keys=64)):  # (96/128 rows spill; > 32 keys: u32 mask words)
        kw = dict(rows=64, csplit=1, keys=32, stages=3, ws=True) | bad
        with pytest.raises(ValueError, match="ws=True needs"):
            TileConfig(**kw)
    for bad in (0, 33):
        with pytest.raises(ValueError, match="q_regs must be"):
            TileConfig(rows=64, csplit=1, keys=16, stages=3, ws=True, q_regs=bad)
    with pytest.raises(ValueError, match="q_regs must be"):
        TileConfig(rows=64, csplit=2, keys=32, stages=2, q_regs=24)  # ws only
    with pytest.raises(ValueError, match="pv_softmax=True needs ws"):
        TileConfig(rows=64, csplit=2, keys=32, stages=2, pv_softmax=True)
    for bad in (dict(stages=3), dict(pv_softmax=True), dict(ws=False, csplit=2)):
        with pytest.raises(ValueError, match="qk_skew=True needs"):
            TileConfig(**(dict(rows=64, csplit=1, keys=32, stages=4, ws=True, qk_skew=True) | bad))
    with pytest.raises(TypeError, match="qk_skew must be a bool"):
        TileConfig(rows=64, csplit=1, keys=32, stages=4, ws=True, qk_skew=1)
    assert TileConfig(rows=64, csplit=1, keys=32, stages=4, ws=True, qk_skew=True).defines()["DL_WS_SKEW"] == 1


@pytest.mark.parametrize("cfg", [TileConfig(rows=64, csplit=1, keys=16, stages=3, ws=True, q_regs=1),
                                 TileConfig(rows=32, csplit=1, keys=16, stages=3, ws=True, qk_chains=2, q_regs=24),
                                 TileConfig(rows=32, csplit=1, keys=32, stages=5, ws=True, q_regs=13),
                                 TileConfig(rows=48, csplit=1, keys=32, stages=3, ws=True, qk_chains=2, q_regs=24,
                                            pv_softmax=True),
                                 TileConfig(rows=64, csplit=1, keys=16, stages=3, ws=True, pv_softmax=True),
                                 TileConfig(rows=64, csplit=1, keys=32, stages=4, ws=True, q_regs=24, qk_skew=True),
                                 TileConfig(rows=48, csplit=1, keys=16, stages=5, ws=True, qk_chains=2, q_regs=28,
                                            qk_skew=True)])
def test_ws_variants_outside_the_defaults_compile_with_the_hosts_layout(cfg):
    # the kernel checks its shared-memory layout against TileConfig.shared_bytes (static_assert):
    # Q mostly from shared memory, 32 rows (2 QK + 4 PV warps), more stages
    defines = compile_defines("sm_90", cfg)
    cub = compile_file("verify_attention.cu", "sm_90", defines)
    assert cub.resources["verify_attn_partial"].registers > 0
    assert cfg.threads == (cfg.rows // 16 + (4 if cfg.rows == 32 else 8)) * 32
    # ... and the layout check is live for these shapes: a host size 16 B off does not compile
    defines["DL_SMEM_BYTES"] += 16
    with pytest.raises(dl.NvrtcError, match="differs from TileConfig.shared_bytes"):
        compile_file("verify_attention.cu", "sm_90", defines, use_cache=False)


def test_scheduler_record_sizes_are_checked_against_the_formula():
    defines = compile_defines("sm_90")
    defines["DL_VA_REQUEST_BYTES"] += 8
    with pytest.raises(dl.NvrtcError, match="VaRequest differs from REQUEST_RECORD_BYTES"):
        compile_file("verify_attention.cu", SM90_TARGET, defines, use_cache=False)


def test_tile_shared_memory_formula_and_choice():
    for cfg in _CONFIGS:
        if cfg.ws and cfg.pv_softmax:  # Q's columns not in registers, K stages, 1 P slot, 1 alpha slot, 2 fp32 S slots, l, WsSeg
            assert cfg.shared_bytes == (cfg.rows * ((36 - cfg.q_regs) * 32 + 16) + cfg.stages * cfg.keys * 1168
                                        + cfg.rows * (2 * cfg.keys + 16) + cfg.rows * 4 + 2 * cfg.rows * (cfg.keys + 8) * 4
                                        + cfg.rows * 4 + 96)
            assert cfg.threads == (cfg.rows // 16 + 8) * 32
            continue
        if cfg.ws:  # Q's columns not in registers, K stages, 2 P slots, 2 alpha slots, l and m, 2 mask-word slots, WsSeg
            assert cfg.shared_bytes == (cfg.rows * ((36 - cfg.q_regs) * 32 + 16) + cfg.stages * cfg.keys * 1168
                                        + 2 * cfg.rows * (2 * cfg.keys + 16) + 2 * cfg.rows * 4 + cfg.rows * 4
                                        + 2 * cfg.rows * 4 + 96)
            assert cfg.threads == (cfg.rows // 16 + (4 if cfg.rows == 32 else 8)) * 32  # QK warps + PV warps
            continue
        warps = (cfg.rows // 16) * cfg.csplit
        x = warps * (cfg.keys // 8) * 128 * 4
        q = 0 if cfg.qreg else cfg.rows * 1168
        rs = cfg.rows * (2 * cfg.keys + 16) + cfg.rows * cfg.csplit * 4 if cfg.exchange == "reduce_scatter" else 0
        pv = cfg.rows * 4 if cfg.pv_rows == 32 else 0  # the final row sums, read across a row pair
        bars = 8 * cfg.stages if cfg.bulk else 0  # one mbarrier per K stage
        assert cfg.shared_bytes == q + cfg.stages * cfg.keys * 1168 + x + rs + pv + bars
        assert cfg.defines()["DL_BULK"] == int(cfg.bulk)
        assert cfg.threads == warps * 32
        assert cfg.defines()["DL_EXCHANGE"] == (cfg.exchange == "reduce_scatter")
        assert cfg.defines()["DL_PV_ROWS"] == cfg.pv_rows
    # sm_120: Q in registers, so two 32-key stages fit 99 KB; the reduce-scatter exchange adds a
    # P buffer (32 x 80 B) and row maxima (32 x 4 floats)
    ar120 = TileConfig(rows=32, csplit=4, keys=32, stages=2, qreg=True)
    assert ar120.shared_bytes == 2 * 32 * 1168 + 8 * 4 * 128 * 4 == 91_136
    rs120 = TileConfig(rows=32, csplit=4, keys=32, stages=2, qreg=True, exchange="reduce_scatter")
    assert rs120.shared_bytes == 91_136 + 32 * 80 + 32 * 4 * 4 == 94_208
    # the default: P V over the row pair (+ 32 row sums)
    pv120 = TileConfig(rows=32, csplit=4, keys=32, stages=2, qreg=True, exchange="reduce_scatter", pv_rows=32)
    assert pv120.shared_bytes == 94_208 + 32 * 4 == 94_336
    # ... and K tiles by bulk copies (+ two mbarriers; cp.async on sm_86/sm_89)
    bulk120 = replace(pv120, bulk=True)
    assert bulk120.shared_bytes == 94_336 + 16 and bulk120.label.endswith("pv32 bulk")
    # the 99 KB parts' default since 2026-12-01: QK warps + PV warps, 3 stages of 16 keys, 24 of
    # Q's latent k-steps in registers (the other 8 + rope: 64 rows x 400 B), the 96-byte segment record
    ws120 = TileConfig(rows=64, csplit=1, keys=16, stages=3, ws=True, qk_chains=2, q_regs=24)
    assert ws120.shared_bytes == 64 * 400 + 3 * 16 * 1168 + 2 * 64 * 48 + 512 + 256 + 512 + 96 == 89_184
    assert ws120.label == "rows=64 csplit=1 keys=16 stages=3 ws chains=2 qregs=24" and ws120.threads == 384
    # ... and at 144 rows (9 heads x 16 tokens) its 48-row twin: 3 QK warps, 8 PV warps of 48 x 64
    ws120_48 = replace(ws120, rows=48)
    assert ws120_48.shared_bytes == 48 * 400 + 3 * 16 * 1168 + 2 * 48 * 48 + 384 + 192 + 384 + 96 == 80_928
    assert ws120_48.threads == (3 + 8) * 32
    for arch in ("sm_86", "sm_89", "sm_120"):
        assert tile_config(arch) == ws120 == tile_config(arch, 4096) == tile_config(arch, 9 * 256)
        assert tile_config(arch, 9 * 16) == ws120_48
        assert tile_configs(arch) == [ws120, ws120_48]
    assert not any(c.bulk for c in [tile_config(a, r) for a in ("sm_80", "sm_90", "sm_100") for r in (None, 144, 256)])
    with pytest.raises(ValueError, match="pv_rows=32 needs"):
        TileConfig(rows=48, csplit=2, keys=32, stages=2, exchange="reduce_scatter", pv_rows=32)
    with pytest.raises(ValueError, match="pv_rows=32 needs"):
        TileConfig(rows=64, csplit=2, keys=32, stages=2, pv_rows=32)
    with pytest.raises(ValueError, match="pv_rows must be"):
        TileConfig(rows=64, csplit=2, keys=32, stages=2, exchange="reduce_scatter", pv_rows=64)
    # the 32-row tiles stay selectable with tile= (compiled on demand, not by CI's default list)
    assert all(c.shared_bytes <= 101_376 for c in (bulk120, pv120, rs120, ar120))
    native_rs = TileConfig(rows=64, csplit=2, keys=32, stages=2, exchange="reduce_scatter")
    native_pv = TileConfig(rows=64, csplit=2, keys=32, stages=2, exchange="reduce_scatter", pv_rows=32)
    # sm_80 and sm_90 since 2026-12-01: QK warps + PV warps over 3 stages of 32 keys, and its
    # 48-row twin at 144 rows (3 x 48 instead of 3 x 64) whose PV warps also do the mask and the
    # softmax (one P slot, one slot of rescale factors, two fp32 S slots of 48 x 40 floats)
    ws90 = TileConfig(rows=64, csplit=1, keys=32, stages=3, ws=True, qk_chains=2, q_regs=24)
    assert ws90.shared_bytes == 64 * 400 + 3 * 32 * 1168 + 2 * 64 * 80 + 512 + 256 + 512 + 96 == 149_344
    ws90_48 = replace(ws90, rows=48, pv_softmax=True)
    assert ws90_48.shared_bytes == 48 * 400 + 3 * 32 * 1168 + 48 * 80 + 192 + 2 * 48 * 160 + 192 + 96 == 151_008
    assert ws90_48.label.endswith(" pvsm") and ws90_48.defines()["DL_WS_PVSM"] == 1
    # sm_90 since the thirteenth session: the QK warps' softmax a tile behind their mma (qk_skew),
    # 4 stages, one accumulator set, 20 Q k-steps in registers (64 rows x 528 B); sm_80's 163 KB
    # do not hold it
    skew90 = TileConfig(rows=64, csplit=1, keys=32, stages=4, ws=True, q_regs=20, qk_skew=True)
    assert skew90.shared_bytes == 64 * 528 + 4 * 32 * 1168 + 2 * 64 * 80 + 512 + 256 + 512 + 96 == 194_912
    assert skew90.label == "rows=64 csplit=1 keys=32 stages=4 ws qregs=20 skew" and skew90.defines()["DL_WS_SKEW"] == 1
    # sm_90 since the twenty-seventh session: the same with the QK warps' S by wgmma (sm_90a), the
    # same shared memory (K stages swizzled within the same bytes); the tile without it selectable
    wg90 = replace(skew90, wgmma=True, wgmma_pv=True)
    assert wg90.shared_bytes == 194_912 and wg90.label == skew90.label + " wgmma pv" and wg90.defines()["DL_WS_WGMMA"] == 1
    assert wg90.defines()["DL_WS_WGMMA_PV"] == 1
    assert wg90.nvrtc_target("sm_90") == "sm_90a" and skew90.nvrtc_target("sm_90") == "sm_90"
    for arch, first in (("sm_80", []), ("sm_90", [wg90, skew90])):
        assert tile_configs(arch) == first + [ws90, ws90_48]
        big = first[0] if first else ws90
        assert tile_config(arch) == tile_config(arch, 9 * 256) == tile_config(arch, 16 * 16) == big
        assert tile_config(arch, 9 * 16) == tile_config(arch, 48) == tile_config(arch, 16) == ws90_48
        # the fewest row tiles first: 240 rows are 4 x 64, not 5 x 48 (which would pad less)
        assert tile_config(arch, 240) == tile_config(arch, 192) == big
    # sm_100: the ws tile spills there (NVRTC 13), so the reduce-scatter 64-row tile with P V over
    # row pairs, and at 144 rows (9 heads x 16 tokens) the 48-row reduce-scatter tile (3 tiles of
    # 48, not of 64: 4% faster there in bench_tiles; 3 row groups make no pairs)
    rs48 = TileConfig(rows=48, csplit=2, keys=32, stages=2, exchange="reduce_scatter")
    assert tile_config("sm_100") == tile_config("sm_100", 9 * 256) == native_pv and native_pv.shared_bytes == 171_776
    assert tile_config("sm_100", 9 * 16) == rs48 and rs48.shared_bytes == 147_328
    assert tile_configs("sm_100") == [native_pv, native_rs, replace(native_pv, bulk=True),
                                      TileConfig(rows=64, csplit=2, keys=32, stages=2),
                                      TileConfig(rows=48, csplit=2, keys=32, stages=2), rs48]
    assert tile_config("sm_80").shared_bytes <= MAX_SHARED_PER_BLOCK["sm_80"]


def test_reduce_scatter_needs_whole_n_tiles_per_warp():
    with pytest.raises(ValueError, match="exchange must be one of"):
        TileConfig(rows=32, csplit=4, keys=32, stages=2, exchange="allgather")
    with pytest.raises(ValueError, match="keys/8 divisible by csplit"):
        TileConfig(rows=32, csplit=4, keys=16, stages=2, exchange="reduce_scatter")  # 2 n-tiles, 4 warps
    with pytest.raises(ValueError, match="csplit > 1"):
        TileConfig(rows=16, csplit=1, keys=32, stages=2, exchange="reduce_scatter")
    assert TileConfig(rows=64, csplit=2, keys=16, stages=2, exchange="reduce_scatter").defines()["DL_EXCHANGE"] == 1


def test_reduce_scatter_static_assert_matches_the_python_check():
    defines = compile_defines("sm_90", TileConfig(rows=32, csplit=4, keys=16, stages=2))
    defines["DL_EXCHANGE"] = 1
    with pytest.raises(dl.NvrtcError, match="reduce-scatter exchange needs"):
        compile_file("verify_attention.cu", "sm_90", defines, use_cache=False)


def test_workspace_formula_is_bounded_by_the_grid():
    # H200: 132 parts of the 64-row tile, whatever the batch (the seed deployment needed 605 MB)
    assert VerifyAttention.workspace_bytes_for(132, 64, 8) == 2 * 132 * 64 * (512 * 2 + 4) + 40 * 8 + 64 * 132 + 16
    assert VerifyAttention.workspace_bytes_for(132, 64, 64) < 64 * 10**6
    for args in ((10**6, 64, 8), (132, 63, 8), (132, 64, 10**6)):
        with pytest.raises(ValueError, match="no plan has"):
            VerifyAttention.workspace_bytes_for(*args)


def test_params_mirror_layout():
    assert ctypes.sizeof(_Params) == 20 * 8 + 10 * 4
    assert _Params.scale_log2.offset == 160


# -- validation, with a fake device: errors must come before any launch ------------------

FAKE = SimpleNamespace(ordinal=0)


def fake_plan(heads=9, max_batch=4, max_q=16, mask_format="bitmask"):
    from driverlevel._mask import bitmask_words, parse_mask_format

    plan = VerifyAttention.__new__(VerifyAttention)
    plan.device = FAKE
    plan.num_heads, plan.max_batch, plan.max_q = heads, max_batch, max_q
    plan.mask_format = parse_mask_format(mask_format)
    plan.mask_words = bitmask_words(max_q)
    return plan


def arr(shape, dtype, device=FAKE, strides=None):
    return dl.DeviceArray(0x10000, shape, dtype, device, strides)


def good(total_q=20, bs=2, heads=9, fmt="bitmask"):
    meta = VerifyMetadata(arr((bs + 1,), np.int64), arr((bs + 1,), np.int32), arr((100,), np.int64),
                          arr((total_q,), np.int64), arr((total_q, 1), np.uint32))
    if fmt in ("full", "qlen_only"):
        meta.custom_mask = arr((999,), np.uint8)
        meta.mask_indptr = arr((bs + 1,), np.int64)
    if fmt == "causal":
        meta.custom_mask = None
    return dict(q=arr((total_q, heads, 576), dl.bfloat16), kv_cache=arr((5000, 576), dl.bfloat16), metadata=meta,
                out=arr((total_q, heads, 512), dl.bfloat16), lse=arr((total_q, heads), np.float32))


def call(plan, **kw):
    return plan._validate(kw["q"], kw["kv_cache"], kw["metadata"], kw["out"], kw["lse"])


@pytest.mark.parametrize("fmt", ["bitmask", "full", "qlen_only", "causal"])
def test_valid_inputs_pass(fmt):
    call(fake_plan(mask_format=fmt), **good(fmt=fmt))


@pytest.mark.parametrize("mutate, exc, words", [
    (lambda k: k.update(q=arr((20, 9, 576), np.float32)), TypeError, "q must have dtype bfloat16"),
    (lambda k: k.update(q=arr((20, 8, 576), dl.bfloat16)), ValueError, r"q must have shape \[total_q, 9, 576\]"),
    (lambda k: k.update(q=arr((20, 9, 576), dl.bfloat16, strides=(2 * 576 * 9 * 2, 576 * 2, 2))), ValueError, "q must be C-contiguous"),
    (lambda k: k.update(q=arr((65, 9, 576), dl.bfloat16)), ValueError, "more than max_batch"),
    (lambda k: k.update(kv_cache=arr((50, 512), dl.bfloat16)), ValueError, "kv_cache must have shape"),
    (lambda k: setattr(k["metadata"], "qo_indptr", arr((3,), np.float32)), TypeError, "qo_indptr must have dtype int64 or int32"),
    (lambda k: setattr(k["metadata"], "qo_indptr", arr((7,), np.int64)), ValueError, "max_batch=4"),
    (lambda k: setattr(k["metadata"], "kv_indptr", arr((4,), np.int32)), ValueError, "kv_indptr must have the same length"),
    (lambda k: setattr(k["metadata"], "kv_indptr", arr((3,), np.uint32)), TypeError, "kv_indptr must have dtype int32 or int64"),
    (lambda k: setattr(k["metadata"], "kv_indices", arr((3,), np.int16)), TypeError, "kv_indices must have dtype int64 or int32"),
    (lambda k: setattr(k["metadata"], "out_cache_loc", arr((19,), np.int64)), ValueError, r"out_cache_loc must have shape \(20,\)"),
    (lambda k: setattr(k["metadata"], "custom_mask", arr((20, 2), np.uint32)), ValueError, "custom_mask must have shape"),
    (lambda k: setattr(k["metadata"], "custom_mask", arr((20, 1), np.uint8)), TypeError, "custom_mask must have dtype"),
    (lambda k: setattr(k["metadata"], "custom_mask", None), TypeError, "custom_mask is required"),
    (lambda k: k.update(out=arr((20, 9, 576), dl.bfloat16)), ValueError, r"out must have shape \(20, 9, 512\)"),
    (lambda k: k.update(lse=arr((20, 9), np.float64)), TypeError, "lse must have dtype float32"),
    (lambda k: k.update(out=arr((20, 9, 512), dl.bfloat16, device=SimpleNamespace(ordinal=1))), ValueError, "out is on device 1"),
    (lambda k: k.update(q=np.zeros((20, 9, 576), np.uint16)), TypeError, "q: a numpy array lives in host memory"),
])
def test_bad_inputs_name_the_argument(mutate, exc, words):
    kw = good()
    mutate(kw)
    with pytest.raises(exc, match=words):
        call(fake_plan(), **kw)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_int32_and_int64_index_arrays_are_accepted(dtype):
    kw = good()
    m = kw["metadata"]
    m.qo_indptr, m.kv_indptr = arr((3,), dtype), arr((3,), dtype)
    m.kv_indices, m.out_cache_loc = arr((100,), dtype), arr((20,), dtype)
    call(fake_plan(), **kw)


def test_sglang_formats_need_mask_indptr():
    kw = good(fmt="full")
    kw["metadata"].mask_indptr = None
    with pytest.raises(TypeError, match="mask_indptr is required"):
        call(fake_plan(mask_format="full"), **kw)
    kw = good(fmt="causal")
    kw["metadata"].custom_mask = arr((20, 1), np.uint32)
    with pytest.raises(ValueError, match="pass no custom_mask"):
        call(fake_plan(mask_format="causal"), **kw)


def test_constructor_checks_its_arguments_before_the_device():
    """Bad arguments raise ValueError / TypeError before any driver call (so also without a GPU;
    on a machine without one, device 0 would raise DriverUnavailableError once they pass)."""
    for kw, exc, words in [(dict(num_heads=0), ValueError, "num_heads must be a positive int"),
                           (dict(max_batch=5000), ValueError, "max_batch must be <="),
                           (dict(qk_dim=192), ValueError, "only MLA absorbed heads"),
                           (dict(qk_dim="576"), TypeError, "qk_dim must be a positive int, got str"),  # (review 39)
                           (dict(qk_dim=576.0), TypeError, "qk_dim must be a positive int, got float"),
                           (dict(v_dim=True), TypeError, "v_dim must be a positive int"),
                           (dict(sm_scale=-1.0), ValueError, "sm_scale must be a positive finite"),
                           (dict(sm_scale=1e-45), ValueError, r"sm_scale \* log2\(e\) must be a normal float32"),
                           (dict(sm_scale=1e-39), ValueError, r"sm_scale \* log2\(e\) must be a normal float32"),
                           (dict(sm_scale=3e38), ValueError, r"sm_scale \* log2\(e\) must be a normal float32"),
                           (dict(mask_format="bogus"), ValueError, "mask_format must be one of"),
                           (dict(tile="x"), TypeError, "tile must be a TileConfig"),
                           (dict(arch="sm_75"), ValueError, "unsupported architecture"),
                           (dict(arch="sm_999"), ValueError, "unsupported architecture 'sm_999': NVRTC"),
                           (dict(arch=object()), TypeError, "arch must be a str"),
                           (dict(arch=True), TypeError, "arch must be a str"),
                           (dict(num_parts=0), ValueError, "num_parts must be a positive int"),
                           (dict(pdl="on"), TypeError, "pdl must be None, True or False"),
                           (dict(pool="x"), TypeError, "pool must be a WorkspacePool"),
                           (dict(name=None), TypeError, "name must be a str"),
                           (dict(arch="sm_80", pdl=True), ValueError, "pdl=True needs sm_90"),
                           (dict(arch="sm_120", tile=TileConfig(rows=64, csplit=2, keys=32, stages=2,
                                                                exchange="reduce_scatter", pv_rows=32)),
                            ValueError, "needs 171776 B per block, more than the 101376 B sm_120 allows")]:
        args = dict(num_heads=9, max_batch=2, max_q=16) | kw
        with pytest.raises(exc, match=words):
            VerifyAttention(object(), **args)  # (an invalid device: never reached)
    with pytest.raises(TypeError, match="device must be"):  # ... and valid arguments reach it
        VerifyAttention(object(), 9, max_batch=2, max_q=16)
    for arch in (np.int64(90), 90, (9, 0), "sm_90"):  # (numpy ints too, as normalize_arch takes them)
        with pytest.raises(TypeError, match="device must be"):
            VerifyAttention(object(), 9, max_batch=2, max_q=16, arch=arch)
    with pytest.raises(ValueError, match="device must be an ordinal >= 0"):
        VerifyAttention(-1, 9, max_batch=2, max_q=16)


def test_tile_config_rejects_bad_shapes_and_types():
    for kw, exc, words in [(dict(rows=0), ValueError, "rows must be a multiple of 16"),
                           (dict(rows=-16), ValueError, "rows must be"), (dict(rows=24), ValueError, "rows must be"),
                           (dict(keys=24), ValueError, "keys must be"), (dict(csplit=3), ValueError, "csplit must be"),
                           (dict(stages=1), ValueError, "stages must be in 2..8"),
                           (dict(stages=10**9), ValueError, "stages must be in 2..8"),
                           (dict(rows=128, csplit=8), ValueError, "csplit must be"),
                           (dict(rows="64"), TypeError, "rows must be an int"),
                           (dict(q_regs=24.0, ws=True, stages=3), TypeError, "q_regs must be an int"),
                           (dict(ws="yes"), TypeError, "ws must be a bool")]:
        args = dict(rows=64, csplit=1, keys=16, stages=2) | kw
        with pytest.raises(exc, match=words):
            TileConfig(**args)
    assert TileConfig(rows=np.int64(64), csplit=2, keys=32, stages=2).threads == 256


def test_constructor_rejects_bad_parameters(monkeypatch):
    monkeypatch.setattr("driverlevel.verify_attention._check_device_arg", lambda d: FAKE)
    for kw, words in [(dict(num_splits=0), "num_splits must be a positive int"),
                      (dict(num_splits=5000), "num_splits must be <="),
                      (dict(max_batch=5000), "max_batch must be <="),
                      (dict(num_parts=5000), "num_parts must be <="),
                      (dict(num_parts=0), "num_parts must be a positive int"),
                      (dict(max_q=-1), "max_q must be a positive int"),
                      (dict(qk_dim=128), "only MLA absorbed heads"),
                      (dict(sm_scale=float("nan")), "sm_scale must be a positive finite"),
                      (dict(mask_format="tree"), "mask_format must be one of")]:
        args = dict(max_batch=2, max_q=16, num_splits=4)
        args.update(kw)
        with pytest.raises(ValueError, match=words):
            VerifyAttention(0, 9, **args)
    assert math.isclose(dl.verify_attention.DEFAULT_SM_SCALE if hasattr(dl, "verify_attention") else 1 / math.sqrt(192),
                        1 / math.sqrt(192))


def test_verify_kernels_programmatic_waits():
    """In the PTX of cu/verify_attention.cu (sm_90, every default tile): the combine kernel
    (launched programmatically by VerifyAttention(pdl=True)) waits before its first load; the
    partial kernel, which starts while the scheduler runs, waits only after its last global
    access (so its grid never completes before the scheduler's, whose entries the combine reads);
    the scheduler and the partial kernel let their successor start; the scheduler itself (an
    ordinary launch) does not wait. In the source, the partial kernel's code reads none of the
    scheduler's tables (it computes its own cuts): only the scheduler and the combine name them."""
    from driverlevel import verify_attention as va

    # any access outside the kernel's parameters, shared and local memory: global or generic loads,
    # stores, atomics and reductions, and asynchronous copies
    mem = re.compile(r"\b(?:ld|st|atom|red)\.(?!param|shared|local|const)|\bcp\.async")
    for cfg in va.tile_configs("sm_90"):
        ptx = ptx_entries(ptx_of((dl._compile.kernel_source_dir() / "verify_attention.cu").read_text(),
                            "verify_attention.cu", cfg.nvrtc_target("sm_90"), va.compile_defines("sm_90", cfg)))
        body = ptx["verify_attn_combine"]
        first = mem.search(body)
        assert first is not None and "griddepcontrol.wait;" in body
        assert body.index("griddepcontrol.wait;") < first.start(), f"combine: {first.group(0)} before the wait"
        body = ptx["verify_attn_partial"]
        last_wait = body.rindex("griddepcontrol.wait;")
        assert mem.search(body, last_wait) is None, "partial: a global access after its wait"
        assert mem.search(body[:last_wait]) is not None
        assert "griddepcontrol.launch_dependents;" in body
        assert "griddepcontrol.launch_dependents;" in ptx["verify_attn_schedule"]
        assert "griddepcontrol.wait;" not in ptx["verify_attn_schedule"]
    src = (dl._compile.kernel_source_dir() / "verify_attention.cu").read_text()
    partial = src[src.index("// The partial kernel: one persistent CTA per part."):src.index("// The combine kernel:")]
    assert "verify_attn_partial(" in partial and "run_part_ws(" in partial
    for table in ("p.reqs", "p.cuts", "p.entries"):
        assert table not in partial, f"the partial kernel reads the scheduler's {table}"


def test_tile_config_and_sm_scale_argument_types():
    assert tile_config("sm_90", np.int64(144)) == tile_config("sm_90", 144)
    assert tile_config("sm_90", 0) == tile_config("sm_90")
    with pytest.raises(ValueError, match=r"^rows_per_request must be an int >= 0, got -5$"):
        tile_config("sm_90", -5)
    with pytest.raises(TypeError, match="rows_per_request must be an int"):
        tile_config("sm_90", 2.5)
    with pytest.raises(TypeError, match="rows_per_request must be an int"):
        tile_config("sm_90", "x")
    # a numpy float scale is a float; a bool is not a scale
    with pytest.raises(TypeError, match="device must be"):  # np.float32 passes the argument checks
        VerifyAttention(object(), 9, max_batch=2, max_q=16, sm_scale=np.float32(0.1))
    with pytest.raises(TypeError, match="sm_scale must be a real number"):
        VerifyAttention(object(), 9, max_batch=2, max_q=16, sm_scale=True)


def test_wgmma_tile_is_sm_90_only_and_checked_before_the_device():
    """The wgmma tile (sm_90's default since the twenty-seventh session) needs ws, 64 rows, 32 keys
    and no pv_softmax; it compiles for sm_90a, and a plan that forces it elsewhere fails before
    the device, naming the tile."""
    wg = tile_config("sm_90")
    assert wg.wgmma and wg.nvrtc_target("sm_90") == "sm_90a" and wg.nvrtc_target("sm_90a") == "sm_90a"
    for bad in (dict(ws=False, csplit=2, qk_skew=False, q_regs=32, stages=2), dict(rows=48), dict(keys=16),
                dict(qk_skew=False, stages=3, pv_softmax=True)):
        with pytest.raises(ValueError, match="wgmma=True needs"):
            replace(wg, **bad)
    with pytest.raises(TypeError, match="wgmma must be a bool"):
        replace(wg, wgmma="yes")
    with pytest.raises(TypeError, match="wgmma_pv must be a bool"):
        replace(wg, wgmma_pv=1)
    with pytest.raises(ValueError, match="wgmma_pv=True needs wgmma=True"):
        replace(wg, wgmma=False)
    for arch in ("sm_80", "sm_100", "sm_120"):
        assert not any(c.wgmma for c in tile_configs(arch))
        with pytest.raises(ValueError, match="only sm_90 has"):
            wg.nvrtc_target(arch)
    with pytest.raises(ValueError, match="only sm_90 has"):
        VerifyAttention(0, 16, max_batch=1, max_q=16, tile=wg, arch="sm_80")  # (no device is touched)
    variants = compile_variants("sm_90")
    assert [v.target for v in variants] == ["sm_90a"] + [""] * (len(variants) - 1)
    assert all(v.target == "" for a in ("sm_80", "sm_120") for v in compile_variants(a))


def test_wgmma_tile_issues_wgmma_and_fences_its_copies():
    """sm_90's default tile computes S with wgmma (36 k-steps a tile) after a proxy fence of the
    landed copies; the same tile without wgmma has neither."""
    wg = tile_config("sm_90")
    src = (dl._compile.kernel_source_dir() / "verify_attention.cu").read_text()
    ptx = ptx_entries(ptx_of(src, "verify_attention.cu", "sm_90a", compile_defines("sm_90", wg)))["verify_attn_partial"]
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16") == 36
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16") == 2  # (P V, with wgmma_pv)
    assert "fence.proxy.async.shared::cta" in ptx and "wgmma.wait_group.sync.aligned 0" in ptx
    plain = replace(wg, wgmma=False, wgmma_pv=False)
    ptx = ptx_entries(ptx_of(src, "verify_attention.cu", "sm_90", compile_defines("sm_90", plain)))["verify_attn_partial"]
    assert "wgmma" not in ptx and "fence.proxy.async" not in ptx
    with pytest.raises(dl.NvrtcError, match="DL_WS_WGMMA needs the sm_90a target"):
        compile_file("verify_attention.cu", "sm_90", compile_defines("sm_90", wg), use_cache=False)


def test_wgmma_tile_needs_whole_q_slabs():
    """Review 27: with q_regs 21 the Q tile's last 64-column slab would run past its bytes into K
    stage 0 (silently wrong S); the tile refuses q_regs that are not multiples of 4, and the kernel
    has the same static_assert."""
    wg = tile_config("sm_90")
    for bad in (21, 30, 1):
        with pytest.raises(ValueError, match="q_regs a multiple of 4"):
            replace(wg, q_regs=bad)
    assert replace(wg, q_regs=12).q_regs == 12
    defines = compile_defines("sm_90", wg)
    defines["DL_WS_QREGS"] = 21
    with pytest.raises(dl.NvrtcError, match="whole 64-column slabs"):
        compile_file("verify_attention.cu", "sm_90a", defines, use_cache=False)


# -- max_q * num_heads in Python ints ------------------------------------------------------------------------
def test_verify_attention_checks_max_q_times_heads_in_python_ints():
    with np.errstate(over="ignore"), pytest.raises(ValueError, match=r"^max_q \* num_heads must be < 2\*\*31, "
                                                                     r"got 65536 \* 65536$"):
        VerifyAttention(None, np.int32(65536), max_batch=1, max_q=np.int32(65536))
    assert VerifyAttention.workspace_bytes_for(np.int32(132), np.int32(64), np.int32(8)) == \
        VerifyAttention.workspace_bytes_for(132, 64, 8)


# -- TileConfig's bool fields; numpy bools are no numbers ----------------------------------------------------
_WS_TILE = dict(rows=64, csplit=1, keys=32, stages=4, ws=True)


@pytest.mark.parametrize("field, bad, words", [
    ("ws", "yes", "^TileConfig.ws must be a bool, got str 'yes'$"),
    ("qk_skew", 1, "^TileConfig.qk_skew must be a bool, got int 1$"),
    ("bulk", None, "^TileConfig.bulk must be a bool, got NoneType None$"),
    ("pv_softmax", 0.0, "^TileConfig.pv_softmax must be a bool, got float 0.0$"),
])
def test_tile_config_bool_fields_name_what_they_got(field, bad, words):
    """The message names the type as every other 'must be a bool' of the package (_checks.bool_arg)."""
    from driverlevel.verify_attention import TileConfig

    with pytest.raises(TypeError, match=words):
        TileConfig(**(_WS_TILE | {field: bad}))


def test_tile_config_stores_numpy_bools_as_python_bools():
    from driverlevel.verify_attention import TileConfig

    cfg = TileConfig(**(_WS_TILE | dict(ws=np.True_, qk_skew=np.True_, qreg=np.False_)))
    assert type(cfg.ws) is bool and type(cfg.qk_skew) is bool and type(cfg.qreg) is bool
    assert cfg == TileConfig(**(_WS_TILE | dict(qk_skew=True))) and cfg.defines()["DL_WS_SKEW"] == 1
    assert "np." not in repr(cfg)


@pytest.mark.parametrize("call", ["tile_config", "sm_scale"])
def test_numpy_bools_are_refused_as_numbers(call):
    """rows_per_request and sm_scale refuse numpy's bool as they refuse Python's (through _checks.is_bool)."""
    from driverlevel import verify_attention as va

    with pytest.raises(TypeError, match="rows_per_request must be an int or None, got bool" if call == "tile_config"
                       else r"sm_scale must be a real number \(float or int\), got bool"):
        if call == "tile_config":
            va.tile_config("sm_90", rows_per_request=np.True_)
        else:
            va._check_sm_scale(np.True_)


# -- TileConfig refuses what the kernel's static_asserts reject ----------------------------------------------
REPO = Path(__file__).resolve().parents[1]


# (tile fields, the kernel's static_assert message that rejects them, the words of TileConfig's ValueError)
_KERNEL_REJECTS = [
    (dict(rows=64, csplit=1, keys=48, stages=2), "row loaders assume whole threads per row",
     "row loaders assume whole threads per row"),
    (dict(rows=16, csplit=1, keys=16, stages=2, qreg=True), "mask words: whole keys per thread, whole warps",
     "mask words: whole keys per thread, whole warps"),
    (dict(rows=16, csplit=2, keys=16, stages=2, exchange="reduce_scatter"),
     "mask words: whole keys per thread, whole warps", "mask words: whole keys per thread, whole warps"),
    (dict(rows=48, csplit=1, keys=48, stages=2), "whole loader threads per key row",
     "whole loader threads per key row"),
    (dict(rows=128, csplit=4, keys=16, stages=2, bulk=True), "a key row's threads are lanes of one warp",
     "a key row's threads are lanes of one warp"),
    (dict(rows=32, csplit=4, keys=16, stages=2, qreg=True), "the requests of the prefix pass do not fit",
     "the requests of the prefix pass need"),
]


def _unchecked(**fields) -> TileConfig:
    """A TileConfig without __post_init__'s checks (to hand the kernel what TileConfig refuses)."""
    cfg = object.__new__(TileConfig)
    full = dict(qreg=False, exchange="allreduce", pv_rows=16, bulk=False, ws=False, qk_chains=1, q_regs=32,
                pv_softmax=False, qk_skew=False) | fields
    for k, v in full.items():
        object.__setattr__(cfg, k, v)
    return cfg


def _static_asserts(cfg: TileConfig, arch: str = "sm_90") -> list[str]:
    """The static_assert messages NVRTC's front end reports for ``cfg`` (no code generation)."""
    try:
        compile_file("verify_attention.cu", arch, compile_defines(arch, cfg), extra_options=["-fdevice-syntax-only"],
                     use_cache=False)
    except dl.NvrtcError as exc:
        found = re.findall(r'static assertion failed with "([^"]*)"', str(exc))
        assert found, str(exc)[:2000]
        return found
    return []


@pytest.mark.parametrize("fields, kernel_words, words", _KERNEL_REJECTS)
def test_tile_config_rejects_what_the_kernel_rejects(fields, kernel_words, words):
    # the kernel refuses the tile at compile time ...
    assert any(kernel_words in m for m in _static_asserts(_unchecked(**fields))), fields
    # ... so TileConfig refuses it at construction, naming the same constraint
    with pytest.raises(ValueError, match=re.escape(words)):
        TileConfig(**fields)


# 96 x 48: 192 threads, 384 loader threads; bulk with 128 rows x 2: 32 threads a key row (one warp);
# 32 rows x 4 qreg, 3 stages: 64,160 B below the tile's records (58,032 needed; 2 stages have 45,472)
@pytest.mark.parametrize("fields", [dict(rows=96, csplit=1, keys=48, stages=2),
                                    dict(rows=32, csplit=1, keys=64, stages=2),
                                    dict(rows=128, csplit=2, keys=16, stages=2, bulk=True),
                                    dict(rows=32, csplit=4, keys=16, stages=3, qreg=True),
                                    dict(rows=80, csplit=1, keys=16, stages=2),
                                    dict(rows=32, csplit=1, keys=16, stages=3, ws=True, q_regs=32)])
def test_tiles_next_to_the_kernels_limits_are_accepted_by_both(fields):
    cfg = TileConfig(**fields)
    assert _static_asserts(cfg) == []


def test_full_compile_matches_for_the_reviewed_tile():
    with pytest.raises(dl.NvrtcError, match="row loaders assume whole threads per row"):
        defines = compile_defines("sm_90", _unchecked(rows=64, csplit=1, keys=48, stages=2))
        compile_file("verify_attention.cu", "sm_90", defines, use_cache=False)


def test_each_fields_own_value_is_checked_before_the_combinations():
    with pytest.raises(ValueError, match="exchange must be one of"):
        TileConfig(rows=64, csplit=1, keys=16, stages=3, ws=True, exchange="bad")
    with pytest.raises(ValueError, match="pv_rows must be 16 or 32"):
        TileConfig(rows=64, csplit=1, keys=16, stages=3, ws=True, pv_rows=64)
    with pytest.raises(ValueError, match="q_regs must be"):
        TileConfig(rows=64, csplit=1, keys=16, stages=3, ws=True, q_regs=40, bulk=True)
    with pytest.raises(ValueError, match="qk_chains must be"):
        TileConfig(rows=64, csplit=2, keys=16, stages=3, ws=True, qk_chains=7)


def test_too_big_for_shared_memory_states_the_limit_and_the_tiles_bytes():
    tile = TileConfig(rows=64, csplit=2, keys=32, stages=2)
    with pytest.raises(ValueError, match=f"needs {tile.shared_bytes} B per block, more than the 101376 B sm_120 allows"):
        va._check_tile_fits(tile, "sm_120")
    va._check_tile_fits(tile, "sm_90")


# -- a spilling tile warns -----------------------------------------------------------------------------------
def test_a_spilling_tile_warns_and_the_default_does_not():
    tile = TileConfig(rows=32, csplit=1, keys=64, stages=2)  # ~4.9 KB of spills per thread on sm_90 (NVRTC 13.5)
    cub = compile_file("verify_attention.cu", "sm_90", compile_defines("sm_90", tile))
    res = cub.resources["verify_attn_partial"]
    if not res.spills:  # (4,916 B with NVRTC 13.5; another NVRTC may allocate it without spills)
        pytest.skip(f"{tile.label} does not spill on sm_90 with this NVRTC")
    with pytest.warns(RuntimeWarning) as rec:
        assert va._warn_if_spills(cub, tile) == res.spills
    assert len(rec) == 1
    msg = str(rec[0].message)
    assert tile.label in msg and "sm_90" in msg
    assert f"{res.spill_store_bytes} B of spill stores" in msg and f"{res.spill_load_bytes} B of spill loads" in msg
    assert rec[0].filename == __file__  # stacklevel: the caller's line
    default = tile_config("sm_90")
    cub = compile_file("verify_attention.cu", default.nvrtc_target("sm_90"), compile_defines("sm_90", default))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert va._warn_if_spills(cub, default) == 0


class _Loaded(Exception):
    """Raised by a stand-in load_module: the plan compiled its kernels and got no further."""


def _plan_warnings(monkeypatch, **kw):
    """The warnings of building a 9-head sm_90 plan (max_q 16) whose load_module stops it right
    after the compile (no device)."""
    def load_module(device, cubin):
        raise _Loaded(cubin)

    monkeypatch.setattr(va, "load_module", load_module)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        with pytest.raises(_Loaded):
            VerifyAttention(0, 9, max_batch=2, max_q=16, arch="sm_90", **kw)
    return rec


@pytest.mark.parametrize("tile, warns", [(TileConfig(rows=32, csplit=1, keys=64, stages=2), True), (None, False)])
def test_plan_warns_for_a_spilling_tile_given_by_the_caller(monkeypatch, tile, warns):
    # no device: a stand-in device and a load_module that stops the plan right after the compile
    monkeypatch.setattr(va, "_check_device_arg", lambda d: SimpleNamespace(ordinal=0, arch="sm_90"))

    if tile is None and nvrtc_version() < va._NVRTC_SPILL_FREE:
        pytest.skip(f"NVRTC {nvrtc_version()} spills the 48-row default tile (13.4 or newer does not)")
    rec = _plan_warnings(monkeypatch, tile=tile)
    spills = [w for w in rec if issubclass(w.category, RuntimeWarning) and "spills registers" in str(w.message)]
    assert len(spills) == (1 if warns else 0), [str(w.message) for w in rec]
    if warns:
        assert "rows=32 csplit=1 keys=64 stages=2" in str(spills[0].message)
        assert spills[0].filename == __file__  # the first line outside driverlevel: the one that built the plan


@pytest.mark.parametrize("name, arch, stores, loads, text", [
    ("_WS32", "sm_100", 0, 0, "With NVRTC 13.5 the sm_100 3-stage ws tile builds without spills (0 B on sm_100 and "
                              "sm_103) but is not enabled because it was never measured on an sm_100 GPU."),
    ("_WS32_SKEW", "sm_100", 40, 44, "spills on sm_100 and sm_103 (40 B of spill stores + 44 B of spill loads = 84 B "
                                     "per thread with NVRTC 13.5)"),
    ("_WS32 pv_softmax", "sm_90", 64, 40, "also spills on sm_90: 64 B of spill stores and 40 B of spill loads per "
                                          "thread with NVRTC 13.5"),
])
def test_spill_bytes_in_the_comments_are_the_bundled_nvrtcs(name, arch, stores, loads, text):
    src = " ".join((REPO / "driverlevel" / "verify_attention.py").read_text().replace("#", " ").split())
    assert text in src
    # what stays as it was: _WS32 and _WS32_SKEW are left out from sm_100 on
    assert va._SPILLS_FROM == {va._WS32: 100, va._WS32_SKEW: 100}
    if nvrtc_version()[:2] != (13, 5):
        pytest.skip(f"the comments give NVRTC 13.5's numbers; this is NVRTC {nvrtc_version()}")
    cfg = replace(va._WS32, pv_softmax=True) if name == "_WS32 pv_softmax" else getattr(va, name)
    res = compile_file("verify_attention.cu", arch, compile_defines(arch, cfg)).resources["verify_attn_partial"]
    assert (res.spill_store_bytes, res.spill_load_bytes) == (stores, loads)


@pytest.mark.parametrize("nvrtc, advice", [((13, 0), "NVRTC 13.0 is in use; the default tiles do not spill with NVRTC 13.4 "
                                                      "or newer (pip install -U 'nvidia-cuda-nvrtc>=13.4,<14')"),
                                           ((13, 5), "(the default tiles do not)")])
def test_a_spilling_default_tile_warns_and_names_an_old_nvrtc(monkeypatch, nvrtc, advice):
    """NVRTC 13.0-13.3 spill sm_90's 48-row tile (68 B; the H200 machine's 13.0): the plan said nothing
    for a default tile. Now every plan warns for a spilling tile, and names an NVRTC older than 13.4."""
    from driverlevel._compile import KernelResources
    monkeypatch.setattr(va, "_check_device_arg", lambda d: SimpleNamespace(ordinal=0, arch="sm_90"))
    monkeypatch.setattr(va, "nvrtc_version", lambda: nvrtc)
    spilling = KernelResources(registers=168, spill_store_bytes=68, spill_load_bytes=68)
    monkeypatch.setattr(va, "compile_file", lambda *a, **k: SimpleNamespace(
        arch="sm_90", resources={"verify_attn_partial": spilling}))

    rec = _plan_warnings(monkeypatch)  # 9 heads x 16 tokens = 144 rows: the 48-row default tile
    assert [w.filename for w in rec if "spills registers" in str(w.message)] == [__file__]  # the caller's line
    spills = [str(w.message) for w in rec if "spills registers" in str(w.message)]
    assert len(spills) == 1 and tile_config("sm_90", 144).label in spills[0], spills
    assert "68 B of spill stores" in spills[0] and advice in spills[0]
    assert va._NVRTC_SPILL_FREE == (13, 4)
    assert '"nvidia-cuda-nvrtc>=13.4,<14"' in (REPO / "pyproject.toml").read_text()  # the floor pip installs


# -- the published workspace formula; sm_scale's errors ------------------------------------------------------
@pytest.mark.parametrize("num_parts, tile_rows, max_batch", [(132, 64, 8), (188, 48, 1024), (1, 16, 1)])
def test_published_workspace_formula_is_the_real_size(num_parts, tile_rows, max_batch):
    formula = 2 * num_parts * tile_rows * (512 * 2 + 4) + 40 * max_batch + 64 * num_parts + 16
    assert VerifyAttention.workspace_bytes_for(num_parts, tile_rows, max_batch) == formula
    doc = VerifyAttention.workspace_bytes_for.__doc__
    assert "2 * num_parts * tile_rows * (512 * 2 + 4) + 40 * max_batch + 64 * num_parts + 16" in doc
    readme = (REPO / "README.md").read_text()
    assert "plan.workspace_bytes = 2 * num_parts * tile_rows * (512 * 2 + 4) B" in readme
    assert "40 * max_batch + 64 * num_parts + 16 B" in readme
    assert "(512 + 1) * 4" not in readme and "513 * 4" not in doc


def test_sm_scale_type_and_range_errors_before_the_device():
    for bad in ("x", None, True, complex(1, 0), [0.1]):
        with pytest.raises(TypeError, match="sm_scale must be a real number"):
            va._check_sm_scale(bad)
    for bad in (10**400, -10**400):
        with pytest.raises(ValueError, match=r"sm_scale about 8.15e-39 to 2.36e\+38"):
            va._check_sm_scale(bad)
    with pytest.raises(ValueError, match=r"sm_scale \* log2\(e\) must be a normal float32 \(sm_scale about"):
        va._check_sm_scale(10**39)
    assert va._check_sm_scale(2) == 2.0
    # in the plan: before the device (object() would fail only later, as "device must be")
    with pytest.raises(TypeError, match="sm_scale must be a real number"):
        VerifyAttention(object(), 9, max_batch=2, max_q=16, sm_scale="x")
    with pytest.raises(ValueError, match="sm_scale must be a positive finite float"):
        VerifyAttention(object(), 9, max_batch=2, max_q=16, sm_scale=10**400)


@pytest.mark.parametrize("field, make, words", [
    ("q", lambda: dl.DeviceArray(0x10002, (20, 9, 576), dl.bfloat16, FAKE), "q must start on a 16-byte aligned"),
    ("kv_cache", lambda: dl.DeviceArray(0x10008, (50, 576), dl.bfloat16, FAKE), "kv_cache must start on a 16-byte"),
    ("out", lambda: dl.DeviceArray(0x10004, (20, 9, 512), dl.bfloat16, FAKE), "out must start on a 8-byte aligned"),
    ("lse", lambda: dl.DeviceArray(0x10002, (20, 9), np.float32, FAKE), "lse must start on a 4-byte aligned"),
    ("kv_indices", lambda: dl.DeviceArray(0x10004, (100,), np.int64, FAKE), "kv_indices must start on a 8-byte"),
    ("custom_mask", lambda: dl.DeviceArray(0x10002, (20, 1), np.uint32, FAKE), "custom_mask must start on a 4-byte"),
])
def test_misaligned_arrays_are_refused_before_the_launch(field, make, words):
    """A base address the kernels' cp.async / vector stores cannot use would fault on the GPU (a sticky
    misaligned-address error); it is a ValueError naming the argument instead (review finding)."""
    kw = good()
    if field in ("kv_indices", "custom_mask"):
        setattr(kw["metadata"], field, make())
    else:
        kw[field] = make()
    with pytest.raises(ValueError, match=words):
        call(fake_plan(), **kw)
    kw = good()  # the same arrays at the alignment asked for pass
    kw["q"] = dl.DeviceArray(0x10010, (20, 9, 576), dl.bfloat16, FAKE)
    kw["out"] = dl.DeviceArray(0x10008, (20, 9, 512), dl.bfloat16, FAKE)
    call(fake_plan(), **kw)


def test_compile_defines_checks_the_arch_and_the_config_type():
    """With a config given, the arch was not looked at ('garbage' passed) and a config that is no
    TileConfig failed inside with AttributeError ('int' object has no attribute 'defines')."""
    cfg = tile_config("sm_90")
    for arch in ("garbage", "sm_75", "compute_90"):
        with pytest.raises(ValueError, match="unsupported architecture"):
            compile_defines(arch, cfg)
    with pytest.raises(TypeError, match=r"arch must be a str"):
        compile_defines(None, cfg)
    with pytest.raises(TypeError, match=r"config must be a TileConfig or None \(the default: tile_config\(arch\)\), "
                                        r"got int"):
        compile_defines("sm_90", 5)
    assert compile_defines("SM_90", cfg) == compile_defines("sm_90", cfg) == compile_defines("sm_90")


# -- mla_softmax_scale: qk_head_dim ** -0.5, times YaRN's mscale ** 2 -------------------------------------------
def test_mla_softmax_scale_without_and_with_yarn():
    from driverlevel.verify_attention import DEFAULT_SM_SCALE, mla_softmax_scale

    assert mla_softmax_scale() == DEFAULT_SM_SCALE == 1 / math.sqrt(192)
    assert mla_softmax_scale(128) == 1 / math.sqrt(128)
    # DeepSeek-V3's rope_scaling: factor 40, mscale_all_dim 1 -> (0.1 ln 40 + 1)^2 = 1.8739 times the plain scale
    v3 = {"type": "yarn", "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0, "original_max_position_embeddings": 4096}
    want = (0.1 * math.log(40.0) + 1.0) ** 2 / math.sqrt(192)
    assert mla_softmax_scale(192, v3) == pytest.approx(want, rel=1e-15)
    assert mla_softmax_scale(192, v3) / DEFAULT_SM_SCALE == pytest.approx(1.8739, abs=1e-4)
    assert mla_softmax_scale(192, {"rope_type": "YaRN", "factor": 32.0, "mscale_all_dim": 0.707}) == pytest.approx(
        (0.1 * 0.707 * math.log(32.0) + 1.0) ** 2 / math.sqrt(192), rel=1e-15)
    # no temperature correction: another scaling type, no mscale_all_dim (or 0), a factor of at most 1
    for rs in ({"type": "linear", "factor": 4.0}, {"type": "yarn", "factor": 40}, {"type": "yarn", "factor": 40,
               "mscale_all_dim": 0}, {"type": "yarn", "factor": 1.0, "mscale_all_dim": 1.0}, {}):
        assert mla_softmax_scale(192, rs) == DEFAULT_SM_SCALE, rs
    # rope_type decides where the legacy type disagrees (as transformers reads it; fresh-user trial, s65)
    assert mla_softmax_scale(192, {"type": "linear", "rope_type": "yarn", "factor": 40, "mscale_all_dim": 1}) == \
        pytest.approx(want, rel=1e-15)
    assert mla_softmax_scale(192, {"type": "yarn", "rope_type": "linear", "factor": 40, "mscale_all_dim": 1}) == \
        DEFAULT_SM_SCALE


@pytest.mark.parametrize("args, exc, words", [
    ((0,), ValueError, "qk_head_dim must be a positive int"),
    ((192.0,), TypeError, "qk_head_dim"),
    ((192, [("type", "yarn")]), TypeError, "rope_scaling must be a mapping"),
    ((192, {"type": "yarn", "factor": "40", "mscale_all_dim": 1}), TypeError, r"rope_scaling\['factor'\] must be a real"),
    ((192, {"type": "yarn", "factor": 40, "mscale_all_dim": True}), TypeError, r"rope_scaling\['mscale_all_dim'\]"),
    ((192, {"type": "yarn", "factor": -2.0, "mscale_all_dim": 1}), ValueError, "positive finite"),
    ((192, {"type": "yarn", "factor": float("inf"), "mscale_all_dim": 1}), ValueError, "positive finite"),
    ((192, {"type": "yarn", "factor": 40, "mscale_all_dim": float("nan")}), ValueError, r"'mscale_all_dim'\] must be a finite"),
    ((192, {"type": "yarn", "factor": 40, "mscale_all_dim": float("-inf")}), ValueError, r"'mscale_all_dim'\] must be a finite"),
    # (a factor of at most 1 never uses mscale_all_dim, but a non-finite one is still refused)
    ((192, {"type": "yarn", "factor": 1.0, "mscale_all_dim": float("inf")}), ValueError, "mscale_all_dim"),
    ((192, {"type": "yarn", "factor": 40, "mscale_all_dim": 10**400}), ValueError, r"'mscale_all_dim'\] must be a finite"),
    ((192, {"type": "yarn", "factor": 40, "mscale_all_dim": 1e300}), ValueError, "no usable softmax scale"),
    ((192, {"type": "yarn", "factor": 40, "mscale_all_dim": -1e300}), ValueError, "mscale = .* must be positive"),
    # a fresh user's findings (fifty-second session): YaRN without a factor was read as no scaling, and a
    # negative mscale (0.1 * -100 * ln 40 + 1 = -35.9) squared into a scale ~1,290x too large
    ((192, {"type": "yarn", "mscale_all_dim": 1.0}), ValueError, "YaRN but has no 'factor'"),
    ((192, {"type": "yarn", "factor": 40, "mscale_all_dim": -100}), ValueError, r"mscale = .* = -35\.8.*must be positive"),
    # (fifty-fourth session's review: a bare OverflowError from math.sqrt)
    ((2**1100,), ValueError, "qk_head_dim must be a head dimension"),
])
def test_mla_softmax_scale_refuses_what_it_cannot_use(args, exc, words):
    from driverlevel.verify_attention import mla_softmax_scale

    with pytest.raises(exc, match=words):
        mla_softmax_scale(*args)
