"""Verify attention on the GPU against the float64 numpy reference.

Random (never zero) data, NaN in every unused cache slot, outputs poisoned with
NaN before every call; relative Frobenius error <= 5e-3 on the bf16 output and
LSE within 1e-3 absolute.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import driverlevel as dl
from driverlevel._compile import arch_number, shared_limit
from driverlevel._dtypes import bf16_bits_to_f32, f32_to_bf16_bits
from driverlevel.reference.attention import verify_attention_reference
from driverlevel.reference.trees import build_mask, chain_tree, make_metadata, random_tree, star_tree
from driverlevel.verify_attention import _CONFIGS, TileConfig, VerifyAttention, VerifyMetadata, tile_config
from graph_util import graph_edges

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(dl.device_count() == 0, reason="needs a CUDA GPU"),
]

SM_SCALE = 1.0 / np.sqrt(192.0)
BF16_NAN_PAIR = 0x7FC07FC0
F32_NAN = 0x7FC00000


@pytest.fixture(scope="module")
def dev():
    return dl.Device(0)


@pytest.fixture(scope="module")
def stream(dev):
    return dev.create_stream()


def upload(dev, host, dtype=None):
    host = np.ascontiguousarray(host)
    buf = dl.DeviceBuffer.allocate(dev, max(host.nbytes, 1), label="test")
    arr = buf.as_array(host.shape, dtype or host.dtype)
    arr.copy_from_host(host)
    return arr


class Problem:
    """Host data + device copies of one verify call."""

    def __init__(self, dev, rng, heads, prefix_lens, trees, mask_format, *, extra_slots=37):
        q_lens = [len(t) for t in trees]
        self.heads = heads
        self.trees = trees
        self.mask_format = mask_format
        num_slots = int(sum(prefix_lens) + sum(q_lens) + extra_slots)
        self.meta = make_metadata(prefix_lens, q_lens, num_slots, rng, mask_format=mask_format if mask_format != "bitmask" else "full")
        total_q = self.meta.total_q
        self.q_bits = f32_to_bf16_bits(rng.standard_normal((total_q, heads, 576)).astype(np.float32))
        kv = rng.standard_normal((num_slots, 576)).astype(np.float32)
        used = np.zeros(num_slots, bool)
        used[self.meta.kv_indices] = True
        used[self.meta.out_cache_loc] = True
        kv[~used] = np.nan  # a read of an unused slot poisons the result
        self.kv_bits = f32_to_bf16_bits(kv)
        self.max_q = max(q_lens)
        self.words = (self.max_q + 31) // 32
        self.mask, mip = build_mask(trees, prefix_lens, mask_format, words_per_token=self.words)
        self.mask_indptr = mip if mip is not None else self.meta.mask_indptr
        self.dev = dev
        self.d = dict(
            q=upload(dev, self.q_bits, dl.bfloat16),
            kv=upload(dev, self.kv_bits, dl.bfloat16),
            qo_indptr=upload(dev, self.meta.qo_indptr),
            kv_indptr=upload(dev, self.meta.kv_indptr),
            kv_indices=upload(dev, self.meta.kv_indices if self.meta.kv_indices.size else np.zeros(1, np.int64)),
            out_cache_loc=upload(dev, self.meta.out_cache_loc),
        )
        if self.mask is not None:
            self.d["custom_mask"] = upload(dev, self.mask)
            if mask_format != "bitmask":
                self.d["mask_indptr"] = upload(dev, self.mask_indptr)
        self.out = upload(dev, np.zeros((total_q, heads, 512), np.uint16), dl.bfloat16)
        self.lse = upload(dev, np.zeros((total_q, heads), np.float32))

    def metadata(self):
        return VerifyMetadata(self.d["qo_indptr"], self.d["kv_indptr"], self.d["kv_indices"], self.d["out_cache_loc"],
                              self.d.get("custom_mask"), self.d.get("mask_indptr"))

    def reference(self):
        return verify_attention_reference(
            self.q_bits, self.kv_bits, self.meta.qo_indptr, self.meta.kv_indptr, self.meta.kv_indices,
            self.meta.out_cache_loc, self.mask, self.mask_format, SM_SCALE, mask_indptr=self.mask_indptr)

    def run(self, plan, stream):
        self.out.fill_u32(BF16_NAN_PAIR, stream)
        self.lse.fill_u32(F32_NAN, stream)
        plan.run(stream, self.d["q"], self.d["kv"], self.metadata(), self.out, self.lse)
        stream.synchronize()
        return bf16_bits_to_f32(self.out.to_numpy()), self.lse.to_numpy()


def check(out, lse, ref_out, ref_lse, tol=5e-3):
    assert np.isfinite(out).all(), "output has NaN/inf (unwritten rows or a read of a poisoned slot)"
    assert np.isfinite(lse).all()
    err = np.linalg.norm(out - ref_out) / np.linalg.norm(ref_out)
    assert err <= tol, f"relative Frobenius error {err:.2e} > {tol}"
    lerr = np.abs(lse - ref_lse).max()
    assert lerr <= 1e-3, f"LSE error {lerr:.2e}"
    return err


def skip_unless_runs(dev, tile):
    """Skip where ``tile`` cannot run on ``dev``: more shared memory than it has, or wgmma off sm_90."""
    if tile is not None and tile.shared_bytes > shared_limit(dev.arch):
        pytest.skip(f"tile {tile.label} ({tile.shared_bytes} B) does not fit {dev.arch}'s shared memory per block")
    if tile is not None and tile.wgmma and arch_number(dev.arch) != 90:
        pytest.skip(f"tile {tile.label} uses wgmma (sm_90a), {dev.arch} has none")


def make_plan(dev, prob, num_splits, bs=None, tile=None):
    skip_unless_runs(dev, tile)
    return VerifyAttention(dev, prob.heads, max_batch=bs or prob.meta.batch_size, max_q=prob.max_q,
                           num_splits=num_splits, sm_scale=SM_SCALE, mask_format=prob.mask_format, tile=tile)


SM120 = TileConfig(rows=32, csplit=4, keys=32, stages=2, qreg=True)
WS32 = TileConfig(rows=64, csplit=1, keys=32, stages=3, ws=True, qk_chains=2, q_regs=24)
# every tile of _CONFIGS, by name: "native" is the default path (tile=None: on sm_90 the 32-key
# ws tile with the QK softmax a tile behind, on sm_80 "ws32", QK warps + PV warps, or at row
# counts like 9 heads x 16 tokens and in the small tests "pvsm48"; on sm_100 "native_pv"), "sm120" the tile tile_config("sm_120") returns (the
# 16-key ws tile; "sm120r48" its 48-row twin), the other tiles forced
TILES = {"native": None, "native_ar": TileConfig(rows=64, csplit=2, keys=32, stages=2),
         "native_rs": TileConfig(rows=64, csplit=2, keys=32, stages=2, exchange="reduce_scatter"),
         "rows48": TileConfig(rows=48, csplit=2, keys=32, stages=2), "n16": TileConfig(rows=64, csplit=2, keys=16, stages=2),
         # tile_config("sm_120") (and sm_86/89's) since 2026-12-01: QK warps + PV warps
         "sm120": TileConfig(rows=64, csplit=1, keys=16, stages=3, ws=True, qk_chains=2, q_regs=24),
         # sm_80's tile (sm_90's before the thirteenth session): 3 stages of 32 keys, no skew
         "ws32": WS32,
         "sm120b32": replace(SM120, exchange="reduce_scatter", pv_rows=32, bulk=True),  # its 32-row tile before
         "sm120pv": replace(SM120, exchange="reduce_scatter", pv_rows=32),
         "sm120ar": SM120, "sm120rs": replace(SM120, exchange="reduce_scatter"),
         # sm_100's 144-row tile (9 heads x 16 tokens; bench_tiles 2026-12-01: 1.03-1.04x the 48-row
         # all-reduce tile)
         "rows48rs": TileConfig(rows=48, csplit=2, keys=32, stages=2, exchange="reduce_scatter"),
         # QK warps + PV warps with 4 stages (tiles loaded two iterations ahead), one chain set, Q's
         # latent part all in registers (research/verify_ws.md; not a default)
         "ws16": TileConfig(rows=64, csplit=1, keys=16, stages=4, ws=True),
         # the ws tiles' 48-row twins (tile_config at 144 rows: 9 heads x 16 tokens): 3 QK warps,
         # 8 PV warps of 48 rows x 64 value columns
         # the mask and the online softmax in the PV warps too (pv_softmax: the QK warps only
         # compute S): sm_90's 48-row tile, and the 16-key 64-row tile with it (not a default)
         "pvsm48": replace(WS32, rows=48, pv_softmax=True), "sm120r48": replace(tile_config("sm_120"), rows=48),
         "ws48": replace(WS32, rows=48), "pvsm16": replace(tile_config("sm_120"), pv_softmax=True),
         # the QK warps' softmax a tile behind their mma (qk_skew: 4 stages, the PV warps two tiles
         # behind; sm_90's "native" has one chain set and 20 Q k-steps): with two chain sets and
         # 16 Q k-steps, and the 16-key tile with one (not defaults)
         "skew": TileConfig(rows=64, csplit=1, keys=32, stages=4, ws=True, qk_chains=2, q_regs=16, qk_skew=True),
         "skew16": TileConfig(rows=64, csplit=1, keys=16, stages=4, ws=True, q_regs=28, qk_skew=True),
         # sm_100's tile (sm_90's before 2026-12-01, when "native" became the 32-key ws tile)
         "native_pv": TileConfig(rows=64, csplit=2, keys=32, stages=2, exchange="reduce_scatter", pv_rows=32),
         # K tiles by bulk copies + mbarriers (sm_90+; cp.async below)
         "native_bulk": TileConfig(rows=64, csplit=2, keys=32, stages=2, exchange="reduce_scatter", pv_rows=32,
                                   bulk=True),
         # sm_90's "native": S (twenty-seventh session) and P V (twenty-eighth) by wgmma (sm_90a), by
         # name so that other GPUs run it where they can (they skip it), and with four accumulator
         # sets and 12 Q k-steps in registers (not a default); "skew20" the same without wgmma (sm_90's
         # tile before the twenty-seventh session), "wgmma_qk" with the QK warps' wgmma only (sm_90's
         # in the twenty-seventh)
         "wgmma": tile_config("sm_90"), "wgmma_c4": replace(tile_config("sm_90"), qk_chains=4, q_regs=12),
         "skew20": replace(tile_config("sm_90"), wgmma=False, wgmma_pv=False),
         "wgmma_qk": replace(tile_config("sm_90"), wgmma_pv=False)}
assert TILES["sm120"] == tile_config("sm_120")
assert all(c in TILES.values() or c == tile_config("sm_90") for c in _CONFIGS), "a tile of _CONFIGS is not tested"


@pytest.mark.parametrize("tile", list(TILES))
@pytest.mark.parametrize("heads", [1, 9, 16, 128])
def test_heads(dev, stream, heads, tile):
    rng = np.random.default_rng(heads)
    trees = [random_tree(n, rng) for n in (16, 5, 33)]
    prob = Problem(dev, rng, heads, [65, 0, 700], trees, "bitmask")
    plan = make_plan(dev, prob, num_splits=4, tile=TILES[tile])
    check(*prob.run(plan, stream), *prob.reference())


@pytest.mark.parametrize("num_splits", [1, 7, 64])
def test_prefix_lengths_and_draft_counts(dev, stream, num_splits):
    rng = np.random.default_rng(num_splits)
    prefixes = [0, 1, 63, 64, 65, 4097]
    drafts = [256, 2, 16, 64, 255, 1]
    trees = [random_tree(n, rng) for n in drafts]
    prob = Problem(dev, rng, 9, prefixes, trees, "bitmask")
    plan = make_plan(dev, prob, num_splits)
    check(*prob.run(plan, stream), *prob.reference())


@pytest.mark.parametrize("bs", [1, 3, 8])
def test_batches_ragged(dev, stream, bs):
    rng = np.random.default_rng(100 + bs)
    prefixes = rng.integers(0, 3000, bs).tolist()
    trees = [random_tree(int(n), rng) for n in rng.integers(1, 80, bs)]
    prob = Problem(dev, rng, 9, prefixes, trees, "bitmask")
    plan = make_plan(dev, prob, num_splits=16, bs=8)
    check(*prob.run(plan, stream), *prob.reference())


@pytest.mark.parametrize("shape", ["chain", "star", "random"])
@pytest.mark.parametrize("tile", list(TILES))
def test_tree_shapes_all_mask_formats_identical(dev, stream, shape, tile):
    rng = np.random.default_rng(7)
    make = {"chain": lambda n: chain_tree(n), "star": lambda n: star_tree(n), "random": lambda n: random_tree(n, rng)}[shape]
    trees = [make(n) for n in (40, 17)]
    prefixes = [130, 9]
    outs = {}
    seed_state = rng.bit_generator.state
    for fmt in ("bitmask", "full", "qlen_only") + (("causal",) if shape == "chain" else ()):
        rng.bit_generator.state = seed_state  # identical data for every format
        prob = Problem(dev, rng, 9, prefixes, trees, fmt)
        plan = make_plan(dev, prob, num_splits=3, tile=TILES[tile])
        out, lse = prob.run(plan, stream)
        check(out, lse, *prob.reference())
        outs[fmt] = (out, lse)
    base = outs["bitmask"]
    for fmt, (out, lse) in outs.items():
        assert np.array_equal(out, base[0]) and np.array_equal(lse, base[1]), f"{fmt} differs from bitmask"


def test_more_splits_than_tiles(dev, stream):
    rng = np.random.default_rng(3)
    trees = [random_tree(3, rng), random_tree(1, rng)]
    prob = Problem(dev, rng, 16, [10, 0], trees, "bitmask")
    plan = make_plan(dev, prob, num_splits=128)
    check(*prob.run(plan, stream), *prob.reference())


@pytest.mark.slow
def test_200k_prefix(dev, stream):
    rng = np.random.default_rng(200)
    trees = [random_tree(16, rng)]
    prob = Problem(dev, rng, 9, [200_000], trees, "bitmask", extra_slots=1000)
    plan = make_plan(dev, prob, num_splits=64)
    check(*prob.run(plan, stream), *prob.reference())


@pytest.mark.parametrize("tile", ["native", "sm120", "pvsm48", "native_pv", "wgmma"])
def test_pdl_on_and_off_bitwise_equal_eager_and_replayed(dev, stream, tile):
    """VerifyAttention(pdl=True) (the partial and combine kernels launched programmatically,
    waiting inside) gives bitwise the output and LSE of pdl=False, eagerly and replayed from a
    graph, with split pairs (the combine runs), an empty prefix and a one-token tree; its capture
    records the two launches' dependencies as programmatic edges."""
    from cuda.bindings import driver

    from driverlevel._module import programmatic_supported

    if not programmatic_supported(dev.arch):
        pytest.skip(f"programmatic dependent launch needs sm_90 or newer, {dev.arch} has none")
    rng = np.random.default_rng(17)
    trees = [random_tree(n, rng) for n in (16, 1, 40, 7)]
    prob = Problem(dev, rng, 9, [3000, 0, 12_000, 700], trees, "bitmask")
    cfg = TILES[tile]
    skip_unless_runs(dev, cfg)
    plans = {pdl: VerifyAttention(dev, prob.heads, max_batch=prob.meta.batch_size, max_q=prob.max_q, num_splits=None,
                                  sm_scale=SM_SCALE, mask_format=prob.mask_format, tile=cfg, pdl=pdl)
             for pdl in (False, True)}
    assert plans[True].pdl and not plans[False].pdl and "pdl=True" in repr(plans[True])
    eager = {pdl: prob.run(plan, stream) for pdl, plan in plans.items()}
    check(*eager[True], *prob.reference())
    assert np.array_equal(eager[True][0], eager[False][0]) and np.array_equal(eager[True][1], eager[False][1])
    want = int(driver.CUgraphDependencyType.CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC)
    for pdl, plan in plans.items():
        with dl.capture(stream) as cap:
            plan.run(stream, prob.d["q"], prob.d["kv"], prob.metadata(), prob.out, prob.lse)
        edges = {(a, b): int(d.type) for a, b, d in graph_edges(cap.graph)}
        assert sorted(edges) == [("verify_attn_partial", "verify_attn_combine"),
                                 ("verify_attn_schedule", "verify_attn_partial")], edges
        assert all(t == (want if pdl else 0) for t in edges.values()), f"pdl={pdl}: edge types {edges}"
        gx = cap.graph.instantiate()
        for _ in range(2):  # twice: a replay must not depend on what the one before left
            prob.out.fill_u32(BF16_NAN_PAIR, stream)
            prob.lse.fill_u32(F32_NAN, stream)
            gx.launch(stream)
            stream.synchronize()
            assert np.array_equal(bf16_bits_to_f32(prob.out.to_numpy()), eager[False][0]), f"pdl={pdl}: replay"
            assert np.array_equal(prob.lse.to_numpy(), eager[False][1]), f"pdl={pdl}: replay LSE"


def test_pdl_option_is_checked(dev):
    from driverlevel._module import programmatic_supported

    with pytest.raises(TypeError, match="pdl must be None, True or False"):
        VerifyAttention(dev, 9, max_batch=1, max_q=16, pdl="on")
    if not programmatic_supported(dev.arch):
        with pytest.raises(ValueError, match="pdl=True needs sm_90"):
            VerifyAttention(dev, 9, max_batch=1, max_q=16, pdl=True)
        assert not VerifyAttention(dev, 9, max_batch=1, max_q=16).pdl
    else:
        assert VerifyAttention(dev, 9, max_batch=1, max_q=16).pdl  # the default: on from sm_90


def test_graph_replay_bitwise_equal_and_follows_device_buffers(dev, stream):
    """One captured graph, replayed with new lengths, trees and slots written into its buffers."""
    heads, max_bs, max_q, num_slots = 9, 4, 64, 20_000
    plan = VerifyAttention(dev, heads, max_batch=max_bs, max_q=max_q, num_splits=8, sm_scale=SM_SCALE,
                           mask_format="bitmask")
    words = plan.mask_words
    cap_q = max_bs * max_q
    pool = dl.WorkspacePool.allocate(dev, dl.WorkspacePool.required_bytes([
        ((cap_q, heads, 576), dl.bfloat16), ((num_slots, 576), dl.bfloat16), ((max_bs + 1,), np.int64),
        ((max_bs + 1,), np.int32), ((num_slots,), np.int64), ((cap_q,), np.int64), ((cap_q, words), np.uint32),
        ((cap_q, heads, 512), dl.bfloat16), ((cap_q, heads), np.float32)]), label="graph-test")
    q = pool.carve("q", (cap_q, heads, 576), dl.bfloat16)
    kv = pool.carve("kv", (num_slots, 576), dl.bfloat16)
    qo = pool.carve("qo_indptr", (max_bs + 1,), np.int64)
    kvp = pool.carve("kv_indptr", (max_bs + 1,), np.int32)
    kvi = pool.carve("kv_indices", (num_slots,), np.int64)
    loc = pool.carve("out_cache_loc", (cap_q,), np.int64)
    mask = pool.carve("mask", (cap_q, words), np.uint32)
    out = pool.carve("out", (cap_q, heads, 512), dl.bfloat16)
    lse = pool.carve("lse", (cap_q, heads), np.float32)
    meta = VerifyMetadata(qo, kvp, kvi, loc, mask)

    def write_step(seed):
        r = np.random.default_rng(seed)
        bs = max_bs
        prefixes = r.integers(0, 3000, bs).tolist()
        trees = [random_tree(int(n), r) for n in r.integers(1, max_q + 1, bs)]
        m = make_metadata(prefixes, [len(t) for t in trees], num_slots, r)
        qb = np.zeros((cap_q, heads, 576), np.uint16)
        qb[:m.total_q] = f32_to_bf16_bits(r.standard_normal((m.total_q, heads, 576)).astype(np.float32))
        kvb = f32_to_bf16_bits(r.standard_normal((num_slots, 576)).astype(np.float32))
        bm = np.zeros((cap_q, words), np.uint32)
        bm[:m.total_q] = build_mask(trees, prefixes, "bitmask", words_per_token=words)[0]
        kvi_h = np.zeros(num_slots, np.int64)
        kvi_h[:m.kv_indices.size] = m.kv_indices
        loc_h = np.zeros(cap_q, np.int64)
        loc_h[:m.total_q] = m.out_cache_loc
        q.copy_from_host(qb)
        kv.copy_from_host(kvb)
        qo.copy_from_host(m.qo_indptr)
        kvp.copy_from_host(m.kv_indptr)
        kvi.copy_from_host(kvi_h)
        loc.copy_from_host(loc_h)
        mask.copy_from_host(bm)
        ref = verify_attention_reference(qb[:m.total_q], kvb, m.qo_indptr, m.kv_indptr, m.kv_indices,
                                         m.out_cache_loc, bm[:m.total_q], "bitmask", SM_SCALE)
        return m.total_q, ref

    total, ref = write_step(0)
    out.fill_u32(BF16_NAN_PAIR, stream)
    lse.fill_u32(F32_NAN, stream)
    plan.run(stream, q, kv, meta, out, lse)
    eager_out = out.to_numpy(stream)[:total]
    eager_lse = lse.to_numpy(stream)[:total]
    check(bf16_bits_to_f32(eager_out), eager_lse, *ref)

    with dl.capture(stream) as cap:
        plan.run(stream, q, kv, meta, out, lse)
    graph_exec = cap.graph.instantiate()
    names = [k.name for k in cap.graph.kernel_nodes()]
    assert names == ["verify_attn_schedule", "verify_attn_partial", "verify_attn_combine"]
    assert not any(k.unregistered for k in cap.graph.kernel_nodes())

    out.fill_u32(BF16_NAN_PAIR, stream)
    lse.fill_u32(F32_NAN, stream)  # (both outputs poisoned: a replay that skipped either would be caught)
    graph_exec.launch(stream)
    assert np.array_equal(out.to_numpy(stream)[:total], eager_out), "graph replay differs from eager launch"
    assert np.array_equal(lse.to_numpy(stream)[:total], eager_lse)

    for seed in range(1, 6):
        total, ref = write_step(seed)
        out.fill_u32(BF16_NAN_PAIR, stream)
        lse.fill_u32(F32_NAN, stream)
        graph_exec.launch(stream)
        check(bf16_bits_to_f32(out.to_numpy(stream)[:total]), lse.to_numpy(stream)[:total], *ref)
