"""The verify attention's device-side scheduler on the GPU (issue 9) and its robustness (issue 11).

Every check is against the float64 numpy reference on random data, with the outputs
poisoned before each call and the split workspace poisoned with NaN between replays.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest

import driverlevel as dl
from driverlevel._dtypes import bf16_bits_to_f32, f32_to_bf16_bits
from driverlevel.reference.attention import verify_attention_reference
from driverlevel.reference.trees import build_mask, make_metadata, random_tree
from driverlevel.reference.verify_schedule import schedule
from driverlevel.verify_attention import VerifyAttention, VerifyMetadata

from test_verify_attention_gpu import BF16_NAN_PAIR, F32_NAN, SM_SCALE, TILES, Problem, check, skip_unless_runs, upload

# the main loop's variants that these tests also run (segments of several pairs per part, short
# segments, masked NaN keys): the default tile (sm_90: QK + PV warps, 4 x 32 keys, S and P V by wgmma), sm_100's (64
# rows, reduce-scatter, P V over row pairs), the 64-row all-reduce tile, the 64-row tile with bulk
# copies, the sm_120 tile (QK + PV warps, 3 x 16 keys), its 32-row predecessor (bulk copies) and
# that one with 16 P V rows, the ws tile with 4 stages (tiles loaded two iterations ahead), and sm_90's
# default without wgmma (skew20) and with the QK warps' wgmma only (wgmma_qk)
LOOP_TILES = ["native", "native_pv", "native_ar", "native_bulk", "sm120", "sm120b32", "sm120rs", "ws16", "skew", "ws32", "skew20",
              "wgmma_qk"]

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(dl.device_count() == 0, reason="needs a CUDA GPU"),
]


def plan_for(device, prob, max_batch=None, **kw):
    skip_unless_runs(device, kw.get("tile"))
    return VerifyAttention(device, prob.heads, max_batch=max_batch or prob.meta.batch_size, max_q=prob.max_q,
                           sm_scale=SM_SCALE, mask_format=prob.mask_format, **kw)


def poison_workspace(plan, stream):
    plan.o_part.fill_u32(BF16_NAN_PAIR, stream)
    plan.lse_part.fill_u32(F32_NAN, stream)


def poisoned_replay(plan, bufs, stream, launch, total_q):
    """NaN into the split workspace and the outputs, then ``launch()``; the first ``total_q`` rows of out, lse."""
    poison_workspace(plan, stream)
    bufs["out"].fill_u32(BF16_NAN_PAIR, stream)
    bufs["lse"].fill_u32(F32_NAN, stream)
    launch()
    return bf16_bits_to_f32(bufs["out"].to_numpy(stream)[:total_q]), bufs["lse"].to_numpy(stream)[:total_q]


# ------------------------------------------------------------------ the tables equal the reference

@pytest.mark.parametrize("num_parts", [None, 1, 5, 37, 200])
def test_device_schedule_equals_the_reference(device, stream, num_parts):
    rng = np.random.default_rng(11)
    prefixes = [3000, 0, 17, 700, 64]
    trees = [random_tree(n, rng) for n in (16, 3, 40, 1, 9)]
    prob = Problem(device, rng, 9, prefixes, trees, "bitmask")
    plan = plan_for(device, prob, num_parts=num_parts)
    poison_workspace(plan, stream)
    check(*prob.run(plan, stream), *prob.reference())
    c = plan.config
    ref = schedule([len(t) for t in trees], prefixes, 9, c.rows, c.keys, c.defines()["DL_OVH_TILES"], plan.num_parts)
    cuts = plan.sched_cuts.to_numpy(stream)
    entries = plan.sched_entries.to_numpy(stream)
    assert [tuple(x) for x in cuts.tolist()] == ref.cuts
    # VaEntry as int32 words: nine fields, a pad word, out_row0 as int64 (little-endian words); a
    # row without an entry keeps b = -1 and zeros in every field the combine does not read
    got = [tuple(x[:9]) + ((x[10] & 0xFFFFFFFF) + (x[11] << 32),) for x in entries.tolist()]
    assert got == ref.entries
    plan.check_errors(stream)


# ------------------------------------------------------------------ ragged batches

@pytest.mark.slow
def test_one_long_request_and_seven_short(device, stream):
    rng = np.random.default_rng(200)
    trees = [random_tree(16, rng) for _ in range(8)]
    prob = Problem(device, rng, 9, [200_000] + [4096] * 7, trees, "bitmask", extra_slots=100)
    plan = plan_for(device, prob)
    poison_workspace(plan, stream)
    check(*prob.run(plan, stream), *prob.reference())


def test_all_requests_empty_but_one_and_padded_requests(device, stream):
    heads, max_bs, max_q, num_slots = 16, 5, 12, 2000
    plan, bufs, meta = _graph_setup(device, heads, max_bs, max_q, num_slots, mask_format="full")
    for seed in range(6):
        r = np.random.default_rng(seed)
        m, (ref_out, ref_lse) = _write_step(r, bufs, heads, max_bs, max_q, num_slots, plan.mask_words, "full", 700,
                                            kind=2)  # one active request, the others padded with 0 draft tokens
        assert (np.diff(m["qo"]) > 0).sum() == 1
        out, lse = poisoned_replay(plan, bufs, stream,
                                   lambda: plan.run(stream, bufs["q"], bufs["kv"], meta, bufs["out"], bufs["lse"]), None)
        T = m["total_q"]
        check(out[:T], lse[:T], ref_out, ref_lse)
        assert np.isnan(out[T:]).all(), "rows past the step's tokens must not be written"
        plan.check_errors(stream)


@pytest.mark.parametrize("tile", LOOP_TILES)
def test_a_request_whose_keys_fit_one_tile(device, stream, tile):
    rng = np.random.default_rng(6)
    trees = [random_tree(3, rng), random_tree(2, rng)]
    prob = Problem(device, rng, 9, [4, 0], trees, "bitmask")
    for parts in (None, 1, 2):
        plan = plan_for(device, prob, num_parts=parts, tile=TILES[tile])
        poison_workspace(plan, stream)
        check(*prob.run(plan, stream), *prob.reference())


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_int32_index_arrays_read_in_place(device, stream, dtype):
    rng = np.random.default_rng(8)
    trees = [random_tree(n, rng) for n in (20, 7)]
    prob = Problem(device, rng, 9, [900, 40], trees, "full")
    for k in ("qo_indptr", "kv_indptr", "kv_indices", "out_cache_loc", "mask_indptr"):
        prob.d[k] = upload(device, prob.d[k].to_numpy().astype(dtype))
    plan = plan_for(device, prob)
    check(*prob.run(plan, stream), *prob.reference())


# ------------------------------------------------------------------ one graph, many steps

def _graph_setup(device, heads, max_bs, max_q, num_slots, mask_format="bitmask", num_parts=None, tile=None):
    plan = VerifyAttention(device, heads, max_batch=max_bs, max_q=max_q, sm_scale=SM_SCALE, mask_format=mask_format,
                           num_parts=num_parts, tile=tile)
    words = plan.mask_words
    cap_q = max_bs * max_q
    bufs = dict(
        q=upload(device, np.zeros((cap_q, heads, 576), np.uint16), dl.bfloat16),
        kv=upload(device, np.zeros((num_slots, 576), np.uint16), dl.bfloat16),
        qo=upload(device, np.zeros(max_bs + 1, np.int64)),
        kvp=upload(device, np.zeros(max_bs + 1, np.int32)),
        kvi=upload(device, np.zeros(num_slots, np.int64)),
        loc=upload(device, np.zeros(cap_q, np.int64)),
        out=upload(device, np.zeros((cap_q, heads, 512), np.uint16), dl.bfloat16),
        lse=upload(device, np.zeros((cap_q, heads), np.float32)),
    )
    if mask_format == "bitmask":
        bufs["mask"] = upload(device, np.zeros((cap_q, words), np.uint32))
        bufs["mip"] = None
    else:
        bufs["mask"] = upload(device, np.zeros(cap_q * (num_slots + max_q), np.uint8))
        bufs["mip"] = upload(device, np.zeros(max_bs + 1, np.int64))
    meta = VerifyMetadata(bufs["qo"], bufs["kvp"], bufs["kvi"], bufs["loc"], bufs["mask"], bufs["mip"])
    return plan, bufs, meta


def _pad(arr_act, active, max_bs):
    """Expand an indptr over the active requests to all ``max_bs`` (padded requests: empty ranges)."""
    out = np.zeros(max_bs + 1, arr_act.dtype)
    k = 0
    for b in range(max_bs):
        out[b] = arr_act[k]
        if active[b]:
            k += 1
    out[max_bs] = arr_act[k]
    return out


#: Steps between new random K/V caches in the many-step tests (writing one, 3000 x 576 normals
#: and its bf16 bits, took ~40 of the ~55 ms a step's host side costs; the slots each step reads,
#: its queries, lengths and trees are new every step, so its outputs are too).
KV_EVERY = 50


def _write_step(r, bufs, heads, max_bs, max_q, num_slots, words, mask_format, max_prefix, kind=None, new_kv=True):
    """Random step: some requests padded (0 draft tokens), ragged prefixes; returns (indptrs, reference).

    ``kind`` (random unless given): 0 ragged, 1 no prefixes, 2 one active request, 3 ragged again.
    ``new_kv``: a new random cache (else the one the last step with ``new_kv`` wrote, kept in
    ``bufs["kv_host"]``; the first step always writes one).
    """
    cap_q = max_bs * max_q
    kind = int(r.integers(0, 4)) if kind is None else kind
    active = r.random(max_bs) < 0.7
    if kind == 2:  # one request only
        active[:] = False
    if not active.any():
        active[r.integers(0, max_bs)] = True
    n_act = int(active.sum())
    prefixes = r.integers(0, max_prefix, n_act)
    if kind == 1:
        prefixes[:] = 0
    q_lens = r.integers(1, max_q + 1, n_act)
    trees = [random_tree(int(n), r) for n in q_lens]
    m = make_metadata(prefixes.tolist(), q_lens.tolist(), num_slots, r, mask_format="full")
    T = m.total_q
    qb = np.zeros((cap_q, heads, 576), np.uint16)
    qb[:T] = f32_to_bf16_bits(r.standard_normal((T, heads, 576)).astype(np.float32))
    if new_kv or "kv_host" not in bufs:
        bufs["kv_host"] = f32_to_bf16_bits(r.standard_normal((num_slots, 576)).astype(np.float32))
        bufs["kv"].copy_from_host(bufs["kv_host"])
    kvb = bufs["kv_host"]
    kvi_h = np.zeros(num_slots, np.int64)
    kvi_h[:m.kv_indices.size] = m.kv_indices
    loc_h = np.zeros(cap_q, np.int64)
    loc_h[:T] = m.out_cache_loc
    qo = _pad(m.qo_indptr, active, max_bs)
    kvp = _pad(m.kv_indptr.astype(np.int32), active, max_bs)
    bufs["q"].copy_from_host(qb)
    bufs["qo"].copy_from_host(qo)
    bufs["kvp"].copy_from_host(kvp)
    bufs["kvi"].copy_from_host(kvi_h)
    bufs["loc"].copy_from_host(loc_h)
    if mask_format == "bitmask":
        bm = np.zeros((cap_q, words), np.uint32)
        bm[:T] = build_mask(trees, prefixes.tolist(), "bitmask", words_per_token=words)[0]
        bufs["mask"].copy_from_host(bm)
        mask_h, mip_h, mip = bm[:T], None, None
    else:
        mask_h, mip_h = build_mask(trees, prefixes.tolist(), "full")
        full = np.zeros(bufs["mask"].shape[0], np.uint8)
        full[:mask_h.size] = mask_h
        bufs["mask"].copy_from_host(full)
        mip = _pad(mip_h, active, max_bs)
        bufs["mip"].copy_from_host(mip)
    ref = verify_attention_reference(qb[:T], kvb, m.qo_indptr, m.kv_indptr, m.kv_indices, m.out_cache_loc,
                                     mask_h, mask_format, SM_SCALE, mask_indptr=mip_h)
    step = dict(qo=qo, kvp=kvp, mip=mip, total_q=T, kv_indices=kvi_h, loc=loc_h)
    return step, ref


@pytest.mark.slow
@pytest.mark.parametrize("num_parts", [None, 3])
def test_one_graph_1000_random_steps_with_a_poisoned_workspace(device, stream, num_parts):
    heads, max_bs, max_q, num_slots = 4, 4, 24, 2600
    plan, bufs, meta = _graph_setup(device, heads, max_bs, max_q, num_slots, num_parts=num_parts)
    with dl.capture(stream) as cap:
        plan.run(stream, bufs["q"], bufs["kv"], meta, bufs["out"], bufs["lse"])
    gx = cap.graph.instantiate()
    assert [k.name for k in cap.graph.kernel_nodes()] == ["verify_attn_schedule", "verify_attn_partial",
                                                          "verify_attn_combine"]
    r = np.random.default_rng(1000 + (num_parts or 0))
    for step in range(1000 if num_parts is None else 200):
        m, (ref_out, ref_lse) = _write_step(r, bufs, heads, max_bs, max_q, num_slots, plan.mask_words, "bitmask",
                                            max_prefix=int(r.choice([1, 40, 600])), new_kv=step % KV_EVERY == 0)
        out, lse = poisoned_replay(plan, bufs, stream, lambda: gx.launch(stream), m["total_q"])
        check(out, lse, ref_out, ref_lse)
    plan.check_errors(stream)


# ------------------------------------------------------------------ bad metadata: error word, no harm

@pytest.mark.parametrize("tile", ["native", "sm120", "native_pv", "native_bulk", "sm120b32", "skew"])  # bulk: bad slots zeroed by the row's copier
def test_corrupted_metadata_is_reported_and_harmless(device, stream, tile):
    """One graph; each replay corrupts one field of one request; the others stay right (fuzz)."""
    heads, max_bs, max_q, num_slots = 4, 3, 16, 3000
    skip_unless_runs(device, TILES[tile])
    plan, bufs, meta = _graph_setup(device, heads, max_bs, max_q, num_slots, mask_format="full", tile=TILES[tile])
    with dl.capture(stream) as cap:
        plan.run(stream, bufs["q"], bufs["kv"], meta, bufs["out"], bufs["lse"])
    gx = cap.graph.instantiate()
    r = np.random.default_rng(77)
    kinds = ["q_len_over_max", "qo_not_monotonic", "kv_indptr_past_end", "slot_out_of_range", "loc_out_of_range",
             "mask_indptr_inconsistent", "none"]
    for step in range(1000):
        m, (ref_out, ref_lse) = _write_step(r, bufs, heads, max_bs, max_q, num_slots, plan.mask_words, "full",
                                            max_prefix=500, new_kv=step % KV_EVERY == 0)
        qo, kvp = m["qo"], m["kvp"]
        cands = [b for b in range(max_bs) if qo[b + 1] > qo[b] and kvp[b + 1] > kvp[b]]
        kind = kinds[step % len(kinds)] if cands else "none"
        bad = int(r.choice(cands)) if cands else -1
        field, affected = None, set()
        if kind == "q_len_over_max":
            x = qo.copy()
            x[bad + 1:] += max_q
            bufs["qo"].copy_from_host(x)
            field = "qo_indptr"
        elif kind == "qo_not_monotonic":
            x = qo.copy()
            x[bad + 1] = x[bad] - 1
            bufs["qo"].copy_from_host(x)
            field = "qo_indptr"
        elif kind == "kv_indptr_past_end":
            x = kvp.copy()
            x[bad + 1:] += 10 * num_slots
            bufs["kvp"].copy_from_host(x)
            field = "kv_indptr"
        elif kind == "slot_out_of_range":
            x = m["kv_indices"].copy()
            x[kvp[bad]] = num_slots + 5
            bufs["kvi"].copy_from_host(x)
            field, affected = "kv_indices", {bad}
        elif kind == "loc_out_of_range":
            x = m["loc"].copy()
            x[qo[bad]] = -3
            bufs["loc"].copy_from_host(x)
            field, affected = "out_cache_loc", {bad}
        elif kind == "mask_indptr_inconsistent":
            x = m["mip"].copy()
            x[bad + 1:] -= 1
            bufs["mip"].copy_from_host(x)
            field, affected = "mask_indptr", set(range(bad, max_bs))
        out, lse = poisoned_replay(plan, bufs, stream, lambda: gx.launch(stream), m["total_q"])
        if field is None:
            plan.check_errors(stream)
            check(out, lse, ref_out, ref_lse)
            continue
        with pytest.raises(dl.MetadataError) as ei:
            plan.check_errors(stream)
        assert ei.value.field == field, (kind, str(ei.value))
        if field in ("qo_indptr", "kv_indptr"):
            assert ei.value.request == bad or ei.value.request > bad, (kind, str(ei.value))
            continue  # the ranges of the requests after `bad` moved too: only the report is checked
        assert ei.value.request in affected, (kind, str(ei.value))
        for b in range(max_bs):
            rows = slice(int(qo[b]), int(qo[b + 1]))
            if b in affected or rows.stop == rows.start:
                continue
            check(out[rows], lse[rows], ref_out[rows], ref_lse[rows])
    # the context survived: a clean replay is right and reports nothing
    m, (ref_out, ref_lse) = _write_step(r, bufs, heads, max_bs, max_q, num_slots, plan.mask_words, "full", 500)
    gx.launch(stream)
    T = m["total_q"]
    check(bf16_bits_to_f32(bufs["out"].to_numpy(stream)[:T]), bufs["lse"].to_numpy(stream)[:T], ref_out, ref_lse)
    plan.check_errors(stream)


def test_request_with_more_than_max_q_tokens_is_reported_not_cut(device, stream):
    rng = np.random.default_rng(9)
    trees = [random_tree(20, rng), random_tree(5, rng)]
    prob = Problem(device, rng, 9, [100, 50], trees, "bitmask")
    plan = VerifyAttention(device, 9, max_batch=2, max_q=16, sm_scale=SM_SCALE, mask_format="bitmask")
    prob.d["custom_mask"] = upload(device, np.ascontiguousarray(prob.mask[:, :plan.mask_words]))
    out, lse = prob.run(plan, stream)
    with pytest.raises(dl.MetadataError, match="request 0: qo_indptr is over max"):
        plan.check_errors(stream)
    assert np.isnan(out[:20]).all(), "the oversized request's rows must not be half-computed"
    ref_out, ref_lse = prob.reference()
    check(out[20:], lse[20:], ref_out[20:], ref_lse[20:])
    plan.check_errors(stream)  # cleared


# ------------------------------------------------------------------ non-finite values where they must not matter

@pytest.mark.parametrize("tile", LOOP_TILES)
@pytest.mark.parametrize("num_parts", [None, 1])
def test_nan_in_a_masked_leaf_has_no_influence(device, stream, num_parts, tile):
    rng = np.random.default_rng(12)
    parents = np.array([-1, 0, 0, 1, 1, 2, 3, 3])  # 8-node tree, nodes 4..7 are leaves
    trees = [parents, random_tree(5, rng)]
    prob = Problem(device, rng, 9, [100, 30], trees, "bitmask")
    leaf = 6
    slot = int(prob.meta.out_cache_loc[leaf])
    kvb = prob.kv_bits.copy()
    kvb[slot] = f32_to_bf16_bits(np.full(576, np.nan, np.float32))
    prob.d["kv"].copy_from_host(kvb)
    plan = plan_for(device, prob, num_parts=num_parts, tile=TILES[tile])
    out, lse = prob.run(plan, stream)
    ref_out, ref_lse = prob.reference()  # computed with the leaf's finite row: same for rows that cannot see it
    # out is [token, head, 512]: node i of request 0 is token i; only node 6 itself sees node 6
    for i in range(8):
        if i == leaf:
            assert np.isnan(out[i]).all(), "the row that sees the NaN key must be NaN"
        else:
            check(out[i], lse[i], ref_out[i], ref_lse[i])
    check(out[8:], lse[8:], ref_out[8:], ref_lse[8:])


# ------------------------------------------------------------------ lifetime and streams

def test_graph_replays_after_the_plan_is_dropped(device, stream):
    rng = np.random.default_rng(21)
    trees = [random_tree(16, rng), random_tree(9, rng)]
    prob = Problem(device, rng, 9, [5000, 800], trees, "bitmask")
    plan = plan_for(device, prob, num_parts=4)
    ws = plan.workspace_bytes
    with dl.capture(stream) as cap:
        plan.run(stream, prob.d["q"], prob.d["kv"], prob.metadata(), prob.out, prob.lse)
    gx = cap.graph.instantiate()
    del plan, cap
    gc.collect()
    sentinel = dl.DeviceBuffer.allocate(device, ws, label="sentinel")
    sentinel.as_array((ws // 4,), np.uint32).fill_u32(0x12345678, stream)
    prob.out.fill_u32(BF16_NAN_PAIR, stream)
    prob.lse.fill_u32(F32_NAN, stream)
    gx.launch(stream)
    stream.synchronize()
    check(bf16_bits_to_f32(prob.out.to_numpy()), prob.lse.to_numpy(), *prob.reference())
    assert (sentinel.as_array((ws // 4,), np.uint32).to_numpy() == 0x12345678).all()


def test_a_pool_of_pool_bytes_holds_the_plan_and_the_plan_runs_from_it(device, stream):
    """A caller's pool sized by ``pool_bytes`` takes the workspace; 256 B less is refused before
    any carve-out; the plan carved from the caller's pool computes the reference."""
    rng = np.random.default_rng(23)
    trees = [random_tree(12, rng), random_tree(5, rng)]
    prob = Problem(device, rng, 9, [3000, 400], trees, "bitmask")
    own = plan_for(device, prob, num_parts=6)
    assert own.workspace_bytes <= own.pool_bytes < own.workspace_bytes + 5 * 256
    short = dl.WorkspacePool.allocate(device, own.pool_bytes - 256, label="short")
    with pytest.raises(dl.PoolExhaustedError, match="pool_bytes"):
        plan_for(device, prob, num_parts=6, pool=short)
    assert short.carves() == []
    pool = dl.WorkspacePool.allocate(device, own.pool_bytes, label="exact")
    plan = plan_for(device, prob, num_parts=6, pool=pool)
    assert plan.o_part.ptr == pool.base and pool.used <= pool.capacity
    poison_workspace(plan, stream)
    out, lse = prob.run(plan, stream)
    check(out, lse, *prob.reference())
    stream.synchronize()
    pool.close()  # the caller frees the workspace: the plan refuses to run on it, and says why
    with pytest.raises(ValueError, match="its workspace pool 'exact' was closed"):
        plan.run(stream, prob.d["q"], prob.d["kv"], prob.metadata(), prob.out, prob.lse)


def test_one_plan_refuses_a_second_stream(device, stream):
    rng = np.random.default_rng(22)
    prob = Problem(device, rng, 9, [10], [random_tree(4, rng)], "bitmask")
    plan = plan_for(device, prob)
    prob.run(plan, stream)
    other = device.create_stream()
    with pytest.raises(ValueError, match="one stream"):
        plan.run(other, prob.d["q"], prob.d["kv"], prob.metadata(), prob.out, prob.lse)


@pytest.mark.parametrize("tile", LOOP_TILES)
@pytest.mark.parametrize("num_parts", [3, 5])
def test_many_pairs_per_part_graph_equals_eager(device, stream, num_parts, tile):
    """Several whole pairs per part, pieces at both ends; graph replays equal the eager launch."""
    rng = np.random.default_rng(30 + num_parts)
    trees = [random_tree(n, rng) for n in (64, 40, 64)]
    prob = Problem(device, rng, 9, [2000, 90, 700], trees, "bitmask")
    plan = plan_for(device, prob, num_parts=num_parts, tile=TILES[tile])
    poison_workspace(plan, stream)
    out, lse = prob.run(plan, stream)
    check(out, lse, *prob.reference())
    with dl.capture(stream) as cap:
        plan.run(stream, prob.d["q"], prob.d["kv"], prob.metadata(), prob.out, prob.lse)
    gx = cap.graph.instantiate()
    for _ in range(3):
        poison_workspace(plan, stream)
        prob.out.fill_u32(BF16_NAN_PAIR, stream)
        prob.lse.fill_u32(F32_NAN, stream)
        gx.launch(stream)
        assert np.array_equal(bf16_bits_to_f32(prob.out.to_numpy(stream)), out), "graph replay differs from eager"
        assert np.array_equal(prob.lse.to_numpy(stream), lse), "graph replay's lse differs from eager"
    plan.check_errors(stream)
