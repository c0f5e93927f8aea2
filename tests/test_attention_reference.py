"""CPU tests of the float64 verify-attention reference, the tree/mask helpers and
the published workspace formula."""

from __future__ import annotations

import math

import numpy as np
import pytest

from driverlevel._mask import MaskFormat, bitmask_words, parse_mask_format
from driverlevel.reference import attention as ref_attention
from driverlevel.reference.attention import (
    bf16_to_f32,
    draft_visibility,
    f32_to_bf16,
    round_to_bf16,
    verify_attention_bruteforce,
    verify_attention_reference,
)
from driverlevel.reference.trees import (
    ancestor_visibility,
    build_bitmask,
    build_full_mask,
    build_mask,
    build_qlen_only_mask,
    chain_tree,
    check_parents,
    make_metadata,
    mask_indptr_for,
    random_tree,
    star_tree,
)

ALL_FORMATS = [f.value for f in MaskFormat]
TREE_FORMATS = ["full", "qlen_only", "bitmask"]


# --------------------------------------------------------------------------- helpers


def _case(rng, prefix_lens, q_lens, num_heads, head_dim, v_dim, trees=None, spare_slots=7):
    """Random inputs (never zero, unused slots NaN) plus metadata and trees."""
    md = make_metadata(prefix_lens, q_lens, sum(prefix_lens) + sum(q_lens) + spare_slots, rng)
    if trees is None:
        trees = [random_tree(n, rng) for n in q_lens]
    q = rng.uniform(0.5, 1.5, (md.total_q, num_heads, head_dim)) * rng.choice([-1.0, 1.0], (md.total_q, num_heads, head_dim))
    kv = np.full((md.num_slots, head_dim), np.nan)
    used = np.concatenate([md.kv_indices, md.out_cache_loc])
    kv[used] = rng.uniform(0.5, 1.5, (used.size, head_dim)) * rng.choice([-1.0, 1.0], (used.size, head_dim))
    return md, trees, q, kv


def _run(fn, md, trees, q, kv, fmt, sm_scale, v_dim, words=None):
    mask, mask_indptr = build_mask(trees, md.prefix_lens, fmt, words)
    return fn(q, kv, md.qo_indptr, md.kv_indptr, md.kv_indices, md.out_cache_loc,
              mask, fmt, sm_scale, v_dim, mask_indptr=mask_indptr)


# --------------------------------------------------------------------------- workspace


# --------------------------------------------------------------------------- bf16


def test_bf16_known_patterns():
    vals = np.array([1.0, -2.0, 0.0, np.inf, -np.inf], dtype=np.float32)
    assert f32_to_bf16(vals).tolist() == [0x3F80, 0xC000, 0x0000, 0x7F80, 0xFF80]
    # 1 + 2^-8 is half way between 1 and 1 + 2^-7: ties to even -> 1.0.
    assert f32_to_bf16(np.float32(1 + 2**-8)) == 0x3F80
    # 1 + 3*2^-8 is half way between 1 + 2^-7 (odd) and 1 + 2^-6 (even) -> up.
    assert f32_to_bf16(np.float32(1 + 3 * 2**-8)) == 0x3F82
    # just above half way rounds up
    assert f32_to_bf16(np.float32(1 + 2**-8 + 2**-20)) == 0x3F81
    # largest float32 rounds past bf16's largest finite value to inf
    assert f32_to_bf16(np.finfo(np.float32).max) == 0x7F80
    nan = f32_to_bf16(np.array([np.nan, -np.nan], dtype=np.float32))
    assert np.isnan(bf16_to_f32(nan)).all()
    assert f32_to_bf16(np.float32(2.5)).dtype == np.uint16


def test_bf16_round_trip_every_pattern():
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    f = bf16_to_f32(bits)
    assert f.dtype == np.float32
    back = f32_to_bf16(f)
    finite_or_inf = ~np.isnan(f)
    np.testing.assert_array_equal(back[finite_or_inf], bits[finite_or_inf])
    assert np.isnan(bf16_to_f32(back[~finite_or_inf])).all()


def test_round_to_bf16_is_nearest():
    rng = np.random.default_rng(1)
    x = rng.standard_normal(10_000).astype(np.float32)
    r = round_to_bf16(x).astype(np.float64)
    bits = f32_to_bf16(x)
    lo = bf16_to_f32(bits - 1).astype(np.float64)
    hi = bf16_to_f32(bits + 1).astype(np.float64)
    err = np.abs(r - x)
    assert (err <= np.abs(lo - x)).all() and (err <= np.abs(hi - x)).all()
    assert (err <= np.abs(x) * 2.0**-8).all()


def test_bf16_inputs_as_uint16_match_float32():
    rng = np.random.default_rng(2)
    md, trees, q, kv = _case(rng, [5, 0], [3, 4], 2, 8, 6)
    qb, kvb = f32_to_bf16(q), f32_to_bf16(np.nan_to_num(kv, nan=0.0))
    a = _run(verify_attention_reference, md, trees, qb, kvb, "full", 0.3, 6)
    b = _run(verify_attention_reference, md, trees, bf16_to_f32(qb), bf16_to_f32(kvb), "full", 0.3, 6)
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])


def test_bf16_to_f32_rejects_float():
    with pytest.raises(TypeError, match="uint16"):
        bf16_to_f32(np.zeros(3, dtype=np.float32))


# --------------------------------------------------------------------------- trees


def test_tree_shapes():
    rng = np.random.default_rng(3)
    for n in (1, 2, 5, 64, 256):
        p = random_tree(n, rng)
        assert p.dtype == np.int64 and p.shape == (n,) and p[0] == -1
        assert (p[1:] >= 0).all() and (p[1:] < np.arange(1, n)).all()
        check_parents(p)
    assert chain_tree(4).tolist() == [-1, 0, 1, 2]
    assert star_tree(4).tolist() == [-1, 0, 0, 0]
    assert chain_tree(1).tolist() == star_tree(1).tolist() == [-1]


def test_ancestor_visibility_hand_tree():
    #      0
    #     / \
    #    1   2
    #    |
    #    3
    vis = ancestor_visibility([-1, 0, 0, 1])
    assert vis.astype(int).tolist() == [
        [1, 0, 0, 0],
        [1, 1, 0, 0],
        [1, 0, 1, 0],
        [1, 1, 0, 1],
    ]
    np.testing.assert_array_equal(ancestor_visibility(chain_tree(5)), np.tril(np.ones((5, 5), bool)))
    star = ancestor_visibility(star_tree(5))
    np.testing.assert_array_equal(star, np.eye(5, dtype=bool) | (np.arange(5)[None, :] == 0))


@pytest.mark.parametrize("bad, msg", [
    ([0, 0], r"parents\[0\] must be -1"),
    ([-1, 1], r"parents\[1\] must be in \[0, 1\)"),
    ([-1, 0, -1], r"parents\[2\] must be in \[0, 2\)"),
    ([], "at least one node"),
])
def test_check_parents_rejects(bad, msg):
    with pytest.raises(ValueError, match=msg):
        check_parents(np.array(bad, dtype=np.int64))


def test_check_parents_rejects_float():
    with pytest.raises(TypeError, match="integer"):
        check_parents(np.array([-1.0, 0.0]))


# --------------------------------------------------------------------------- masks


def test_mask_builders_round_trip():
    rng = np.random.default_rng(4)
    q_lens = [1, 2, 31, 32, 33, 70]
    prefix_lens = [0, 3, 1, 0, 9, 2]
    trees = [random_tree(n, rng) for n in q_lens]
    trees[2] = star_tree(31)
    trees[3] = chain_tree(32)
    md = make_metadata(prefix_lens, q_lens, 500, rng)
    expect = [ancestor_visibility(t) for t in trees]

    full, full_ptr = build_full_mask(trees, prefix_lens)
    qlen, qlen_ptr = build_qlen_only_mask(trees)
    words = bitmask_words(max(q_lens))
    bits = build_bitmask(trees, words)
    assert full.dtype == qlen.dtype == np.uint8 and bits.dtype == np.uint32
    assert full_ptr.dtype == qlen_ptr.dtype == np.int64
    assert bits.shape == (sum(q_lens), 3)
    assert full.shape == (sum(q * (p + q) for p, q in zip(prefix_lens, q_lens)),)
    assert qlen.shape == (sum(q * q for q in q_lens),)
    np.testing.assert_array_equal(full_ptr, mask_indptr_for(prefix_lens, q_lens, "full"))
    np.testing.assert_array_equal(full_ptr, md.mask_indptr)

    decoded = {
        "full": draft_visibility(full, "full", md.qo_indptr, md.kv_indptr, mask_indptr=full_ptr),
        "qlen_only": draft_visibility(qlen, "qlen_only", md.qo_indptr, md.kv_indptr, mask_indptr=qlen_ptr),
        "bitmask": draft_visibility(bits, "bitmask", md.qo_indptr, md.kv_indptr),
        "full_packed": draft_visibility(full, "full", md.qo_indptr, md.kv_indptr),
    }
    for name, vis in decoded.items():
        assert len(vis) == len(trees), name
        for b in range(len(trees)):
            np.testing.assert_array_equal(vis[b], expect[b], err_msg=f"{name} request {b}")
    # bool is the same byte as uint8 for the SGLang layouts
    vis_bool = draft_visibility(full.astype(bool), "full", md.qo_indptr, md.kv_indptr)
    for b in range(len(trees)):
        np.testing.assert_array_equal(vis_bool[b], expect[b])
    # chain trees: causal decodes to the same visibility as the tree masks
    chains = [chain_tree(n) for n in q_lens]
    causal = draft_visibility(None, "causal", md.qo_indptr, md.kv_indptr)
    assert build_mask(chains, prefix_lens, "causal") == (None, None)
    for b, c in enumerate(chains):
        np.testing.assert_array_equal(causal[b], ancestor_visibility(c))


def test_bitmask_bit_order():
    # request 0: chain of 3; request 1: star of 2. Row t, bit j = draft token j.
    bits = build_bitmask([chain_tree(3), star_tree(2)], 1)
    assert bits[:, 0].tolist() == [0b001, 0b011, 0b111, 0b01, 0b11]
    wide = build_bitmask([chain_tree(40)], 2)
    assert wide[39].tolist() == [0xFFFFFFFF, 0xFF]
    with pytest.raises(ValueError, match="more than words_per_token"):
        build_bitmask([chain_tree(33)], 1)


def test_build_mask_causal_needs_chain():
    with pytest.raises(ValueError, match="not a chain"):
        build_mask([star_tree(3)], [0], "causal")


@pytest.mark.parametrize("fmt", ["full", "qlen_only", "bitmask", "causal"])
def test_build_mask_checks_prefix_lens_in_every_format(fmt):
    """Only "full" reads prefix_lens, but a wrong one is refused in every format, not ignored."""
    trees = [chain_tree(3), chain_tree(2)]
    with pytest.raises(ValueError, match="one entry per request"):
        build_mask(trees, [4], fmt)
    with pytest.raises(ValueError, match=">= 0"):
        build_mask(trees, [4, -1], fmt)
    mask, _ = build_mask(trees, [4, 0], fmt)
    assert (mask is None) == (fmt == "causal")


def test_mask_format_parsing():
    assert parse_mask_format("FULL") is MaskFormat.FULL
    assert parse_mask_format(MaskFormat.BITMASK) is MaskFormat.BITMASK
    assert MaskFormat.QLEN_ONLY == "qlen_only" and str(MaskFormat.CAUSAL) == "causal"
    assert bitmask_words(1) == 1 and bitmask_words(32) == 1 and bitmask_words(33) == 2 and bitmask_words(256) == 8
    with pytest.raises(ValueError, match="mask_format must be one of"):
        parse_mask_format("tree")
    with pytest.raises(TypeError, match="mask_format"):
        parse_mask_format(3)


# --------------------------------------------------------------------------- metadata


def test_make_metadata_dtypes_and_slots():
    rng = np.random.default_rng(5)
    md = make_metadata([4, 0, 7], [3, 1, 5], 64, rng)
    assert md.qo_indptr.dtype == np.int64 and md.qo_indptr.tolist() == [0, 3, 4, 9]
    assert md.kv_indptr.dtype == np.int32 and md.kv_indptr.tolist() == [0, 4, 4, 11]
    assert md.kv_indices.dtype == np.int64 and md.kv_indices.shape == (11,)
    assert md.out_cache_loc.dtype == np.int64 and md.out_cache_loc.shape == (9,)
    assert md.mask_indptr.dtype == np.int64
    assert md.mask_indptr.tolist() == [0, 3 * 7, 3 * 7 + 1, 3 * 7 + 1 + 5 * 12]
    slots = np.concatenate([md.kv_indices, md.out_cache_loc])
    assert len(set(slots.tolist())) == slots.size and slots.min() >= 0 and slots.max() < 64
    assert md.batch_size == 3 and md.total_q == 9 and md.max_q == 5
    qlen = make_metadata([4, 0, 7], [3, 1, 5], 64, rng, mask_format="qlen_only")
    assert qlen.mask_indptr.tolist() == [0, 9, 10, 35]
    for arr in (md.qo_indptr, md.kv_indptr, md.kv_indices, md.out_cache_loc, md.mask_indptr):
        assert arr.flags.c_contiguous


def test_make_metadata_rejects():
    rng = np.random.default_rng(6)
    with pytest.raises(ValueError, match="num_slots must be >= "):
        make_metadata([4], [3], 6, rng)
    with pytest.raises(ValueError, match="q_lens must be >= 1"):
        make_metadata([4], [0], 60, rng)
    with pytest.raises(ValueError, match="same length"):
        make_metadata([4, 1], [3], 60, rng)
    with pytest.raises(TypeError, match="prefix_lens"):
        make_metadata([4.0], [3], 60, rng)


# --------------------------------------------------------------------------- reference vs brute force


@pytest.mark.parametrize("fmt", ALL_FORMATS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reference_matches_bruteforce(fmt, seed):
    rng = np.random.default_rng(100 + seed)
    prefix_lens = [0, 3, 5, 1]
    q_lens = [1, 4, 7, 3]
    trees = [chain_tree(n) for n in q_lens] if fmt == "causal" else None
    md, trees, q, kv = _case(rng, prefix_lens, q_lens, 3, 10, 6, trees)
    sm = 1.0 / math.sqrt(10)
    out, lse = _run(verify_attention_reference, md, trees, q, kv, fmt, sm, 6)
    bout, blse = _run(verify_attention_bruteforce, md, trees, q, kv, fmt, sm, 6)
    assert out.shape == (md.total_q, 3, 6) and lse.shape == (md.total_q, 3)
    assert out.dtype == lse.dtype == np.float64
    assert np.isfinite(out).all() and np.isfinite(lse).all()
    np.testing.assert_allclose(out, bout, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, blse, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("where", ["masked_draft_key", "visible_prefix_key", "query", "value_only"])
def test_reference_matches_bruteforce_with_nan(where):
    # The kernel's rule (cu/verify_attention.cu): a key a row cannot see has no influence, even a
    # NaN one; a row that sees a NaN score (or a non-finite value) is NaN, output and LSE.
    rng = np.random.default_rng(31)
    prefix_lens, q_lens = [3, 2], [4, 5]
    trees = [chain_tree(n) for n in q_lens]
    md, trees, q, kv = _case(rng, prefix_lens, q_lens, 2, 10, 6, trees)
    if where == "masked_draft_key":
        kv[md.out_cache_loc[1], 3] = np.nan  # draft token 1 of request 0: token 0 cannot see it
    elif where == "visible_prefix_key":
        kv[md.kv_indices[0], 8] = np.nan     # request 0's first prefix key: all its rows see it
    elif where == "query":
        q[5, 1, 0] = np.nan                  # one (token, head) row of request 1
    else:
        kv[md.out_cache_loc[6], 2] = np.inf  # a value column of request 1's draft token 2
    out, lse = _run(verify_attention_reference, md, trees, q, kv, "causal", 0.3, 6)
    bout, blse = _run(verify_attention_bruteforce, md, trees, q, kv, "causal", 0.3, 6)
    assert np.isnan(out).any()
    np.testing.assert_array_equal(np.isnan(out), np.isnan(bout))
    np.testing.assert_array_equal(np.isnan(lse), np.isnan(blse))
    ok = ~np.isnan(bout)
    np.testing.assert_allclose(out[ok], bout[ok], rtol=1e-12, atol=1e-12)
    okl = ~np.isnan(blse)
    np.testing.assert_allclose(lse[okl], blse[okl], rtol=1e-12, atol=1e-12)
    if where == "masked_draft_key":  # token 0 of request 0 does not see draft token 1
        assert np.isfinite(out[0]).all() and np.isfinite(lse[0]).all()


@pytest.mark.parametrize("fmt", ["full", "qlen_only"])
def test_reference_honours_mask_indptr_with_gaps(fmt):
    # Blocks placed with padding between them, padding poisoned with ones
    # (which would reveal hidden tokens if read) — both versions must use mask_indptr.
    rng = np.random.default_rng(7)
    prefix_lens, q_lens = [2, 4], [5, 6]
    md, trees, q, kv = _case(rng, prefix_lens, q_lens, 2, 6, 4)
    packed, ptr = build_mask(trees, prefix_lens, fmt)
    gap = 5
    sizes = np.diff(ptr)
    gapped = np.ones(packed.size + gap * len(sizes), dtype=np.uint8)
    gptr = np.zeros(len(sizes) + 1, dtype=np.int64)
    for b, s in enumerate(sizes):
        gptr[b] = ptr[b] + gap * (b + 1)
        gapped[gptr[b]:gptr[b] + s] = packed[ptr[b]:ptr[b] + s]
    gptr[-1] = gapped.size
    args = (q, kv, md.qo_indptr, md.kv_indptr, md.kv_indices, md.out_cache_loc)
    want = verify_attention_reference(*args, packed, fmt, 0.4, 4, mask_indptr=ptr)
    for fn in (verify_attention_reference, verify_attention_bruteforce):
        got = fn(*args, gapped, fmt, 0.4, 4, mask_indptr=gptr)
        np.testing.assert_allclose(got[0], want[0], rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(got[1], want[1], rtol=1e-12, atol=1e-12)


def test_reference_mla_dims_9_heads():
    # The real shapes: head_dim 576 (512 latent + 64 rope), v_dim 512, 9 heads.
    rng = np.random.default_rng(8)
    md, trees, q, kv = _case(rng, [6, 2], [4, 3], 9, 576, 512)
    sm = 1.0 / math.sqrt(192)
    for fmt in ("full", "bitmask"):
        out, lse = _run(verify_attention_reference, md, trees, q, kv, fmt, sm, 512)
        bout, blse = _run(verify_attention_bruteforce, md, trees, q, kv, fmt, sm, 512)
        assert out.shape == (7, 9, 512)
        np.testing.assert_allclose(out, bout, rtol=1e-11, atol=1e-12)
        np.testing.assert_allclose(lse, blse, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("trees_kind", ["random", "chain", "star"])
def test_all_formats_equal_on_same_tree(trees_kind):
    rng = np.random.default_rng(9)
    prefix_lens, q_lens = [3, 0, 8], [6, 5, 40]
    make = {"random": lambda n: random_tree(n, rng), "chain": chain_tree, "star": star_tree}[trees_kind]
    trees = [make(n) for n in q_lens]
    md, trees, q, kv = _case(rng, prefix_lens, q_lens, 2, 12, 8, trees)
    formats = ALL_FORMATS if trees_kind == "chain" else TREE_FORMATS
    results = {f: _run(verify_attention_reference, md, trees, q, kv, f, 0.25, 8) for f in formats}
    # a wider bitmask than needed (the plan's max_q may exceed this batch's)
    results["bitmask_wide"] = _run(verify_attention_reference, md, trees, q, kv, "bitmask", 0.25, 8, words=4)
    first = results["full"]
    for f, (o, l) in results.items():
        np.testing.assert_array_equal(o, first[0], err_msg=f)
        np.testing.assert_array_equal(l, first[1], err_msg=f)


def test_hand_worked_tree():
    # One request, prefix of 1 slot, 3 draft tokens: node 0 the root, nodes 1
    # and 2 its children (siblings, so neither sees the other). One head,
    # head_dim 2, v_dim 1, so each cache row is [value, key_extra] and
    # score = sm_scale * (q0 * value + q1 * key_extra). With q = [0, 2] and
    # sm_scale = 0.5 the score of a key is just its key_extra.
    #
    #   slot 5 (prefix)        [10, 0   ]  score 0     weight e^0     = 1
    #   slot 2 (draft token 0) [20, ln 2]  score ln 2  weight e^ln2   = 2
    #   slot 0 (draft token 1) [999, 5  ]  score 5     weight e^5
    #   slot 4 (draft token 2) [40, ln 3]  score ln 3  weight e^ln3   = 3
    #   slots 1, 3: NaN (never read)
    #
    # token 0 sees prefix, token 0:          out = (1*10 + 2*20) / 3 = 50/3,
    #                                        lse = ln 3
    # token 1 sees prefix, tokens 0 and 1:   out = (10 + 40 + 999 e^5) / (3 + e^5),
    #                                        lse = ln(3 + e^5)
    # token 2 sees prefix, tokens 0 and 2 (not its sibling 1, whose 999 would dominate):
    #                                        out = (1*10 + 2*20 + 3*40) / 6 = 170/6 = 85/3 = 28.333...,
    #                                        lse = ln 6
    kv = np.full((6, 2), np.nan)
    kv[5] = [10.0, 0.0]
    kv[2] = [20.0, math.log(2.0)]
    kv[0] = [999.0, 5.0]
    kv[4] = [40.0, math.log(3.0)]
    q = np.tile(np.array([0.0, 2.0]), (3, 1, 1))  # [3 tokens, 1 head, 2]
    qo_indptr = np.array([0, 3], dtype=np.int64)
    kv_indptr = np.array([0, 1], dtype=np.int32)
    kv_indices = np.array([5], dtype=np.int64)
    out_cache_loc = np.array([2, 0, 4], dtype=np.int64)
    # FULL block, 3 x (1 + 3): prefix column, then draft tokens 0..2
    full = np.array([1, 1, 0, 0,
                     1, 1, 1, 0,
                     1, 1, 0, 1], dtype=np.uint8)
    built, ptr = build_full_mask([[-1, 0, 0]], [1])
    np.testing.assert_array_equal(built, full)
    assert ptr.tolist() == [0, 12]

    e5 = math.exp(5.0)
    want_out = np.array([50 / 3, (50 + 999 * e5) / (3 + e5), 85 / 3]).reshape(3, 1, 1)
    want_lse = np.array([math.log(3), math.log(3 + e5), math.log(6)]).reshape(3, 1)
    masks = {
        "full": (full, ptr),
        "qlen_only": build_qlen_only_mask([[-1, 0, 0]]),
        "bitmask": (np.array([[0b001], [0b011], [0b101]], dtype=np.uint32), None),
    }
    for fmt, (mask, mptr) in masks.items():
        for fn in (verify_attention_reference, verify_attention_bruteforce):
            out, lse = fn(q, kv, qo_indptr, kv_indptr, kv_indices, out_cache_loc,
                          mask, fmt, 0.5, v_dim=1, mask_indptr=mptr)
            np.testing.assert_allclose(out, want_out, rtol=1e-13, err_msg=f"{fmt} {fn.__name__}")
            np.testing.assert_allclose(lse, want_lse, rtol=1e-13, err_msg=f"{fmt} {fn.__name__}")
    assert abs(out[2, 0, 0] - 28.333333333333332) < 1e-12


@pytest.mark.parametrize("fmt", ALL_FORMATS)
def test_prefix_length_zero(fmt):
    rng = np.random.default_rng(10)
    q_lens = [5, 1, 9]
    trees = [chain_tree(n) for n in q_lens] if fmt == "causal" else None
    md, trees, q, kv = _case(rng, [0, 0, 0], q_lens, 2, 8, 5, trees)
    assert md.kv_indices.size == 0
    out, lse = _run(verify_attention_reference, md, trees, q, kv, fmt, 0.35, 5)
    bout, blse = _run(verify_attention_bruteforce, md, trees, q, kv, fmt, 0.35, 5)
    np.testing.assert_allclose(out, bout, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, blse, rtol=1e-12, atol=1e-12)
    # the root sees only itself: its output is its own value row, lse its own score
    root = md.out_cache_loc[0]
    np.testing.assert_allclose(out[0], np.broadcast_to(kv[root, :5], (2, 5)), rtol=1e-14)
    np.testing.assert_allclose(lse[0], 0.35 * q[0] @ kv[root], rtol=1e-14)


@pytest.mark.parametrize("fmt", ALL_FORMATS)
def test_q_len_one(fmt):
    rng = np.random.default_rng(11)
    md, trees, q, kv = _case(rng, [17, 0, 3], [1, 1, 1], 4, 8, 8, [chain_tree(1)] * 3)
    out, lse = _run(verify_attention_reference, md, trees, q, kv, fmt, 0.2, 8)
    # plain softmax attention over prefix + self, computed directly
    for b in range(3):
        t = int(md.qo_indptr[b])
        slots = np.concatenate([md.kv_indices[md.kv_indptr[b]:md.kv_indptr[b + 1]], md.out_cache_loc[t:t + 1]])
        s = 0.2 * q[t] @ kv[slots].T                     # [H, keys]
        w = np.exp(s - s.max(axis=1, keepdims=True))
        np.testing.assert_allclose(out[t], (w / w.sum(axis=1, keepdims=True)) @ kv[slots], rtol=1e-12)
        np.testing.assert_allclose(lse[t], np.log(np.exp(s).sum(axis=1)), rtol=1e-12)


def test_large_scores_do_not_overflow():
    rng = np.random.default_rng(12)
    md, trees, q, kv = _case(rng, [4, 2], [3, 5], 2, 16, 8)
    out, lse = _run(verify_attention_reference, md, trees, 100.0 * q, kv, "full", 10.0, 8)
    bout, blse = _run(verify_attention_bruteforce, md, trees, 100.0 * q, kv, "full", 10.0, 8)
    assert np.isfinite(out).all() and np.isfinite(lse).all() and lse.max() > 1000
    np.testing.assert_allclose(out, bout, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(lse, blse, rtol=1e-12)


def test_row_with_no_visible_key():
    # prefix 0 and a QLEN_ONLY mask that hides token 1 from everything
    rng = np.random.default_rng(13)
    md, trees, q, kv = _case(rng, [0], [2], 1, 4, 2, [chain_tree(2)])
    mask = np.array([1, 0,
                     0, 0], dtype=np.uint8)
    for fn in (verify_attention_reference, verify_attention_bruteforce):
        out, lse = fn(q, kv, md.qo_indptr, md.kv_indptr, md.kv_indices, md.out_cache_loc,
                      mask, "qlen_only", 1.0, 2)
        assert np.isfinite(lse[0]).all()
        assert (out[1] == 0).all() and np.isneginf(lse[1]).all()


def test_chunked_equals_unchunked(monkeypatch):
    rng = np.random.default_rng(14)
    md, trees, q, kv = _case(rng, [30, 5], [20, 33], 3, 8, 8)
    want = _run(verify_attention_reference, md, trees, q, kv, "bitmask", 0.3, 8)
    monkeypatch.setattr(ref_attention, "_CHUNK_ELEMENTS", 1)  # one draft token per chunk
    got = _run(verify_attention_reference, md, trees, q, kv, "bitmask", 0.3, 8)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-13)


# --------------------------------------------------------------------------- input errors


def _small():
    rng = np.random.default_rng(15)
    md, trees, q, kv = _case(rng, [3, 2], [3, 2], 2, 4, 4)
    mask, ptr = build_full_mask(trees, md.prefix_lens)
    kw = dict(q=q, kv_cache=kv, qo_indptr=md.qo_indptr, kv_indptr=md.kv_indptr,
              kv_indices=md.kv_indices, out_cache_loc=md.out_cache_loc, mask=mask,
              mask_format="full", sm_scale=0.5, v_dim=4, mask_indptr=ptr)
    return kw, md, trees


def test_errors_name_the_argument():
    kw, md, trees = _small()
    verify_attention_reference(**kw)  # the unmodified case is valid

    def fails(exc, match, **change):
        with pytest.raises(exc, match=match):
            verify_attention_reference(**{**kw, **change})

    fails(ValueError, "mask_format must be one of", mask_format="tree")
    fails(TypeError, "q must be a float array", q=kw["q"].astype(np.int32))
    fails(ValueError, r"q must be \[total_q", q=kw["q"][:, 0])
    fails(ValueError, r"disagree on head_dim: q.shape\[2\] = \d+, kv_cache.shape\[1\] = 3",
          kv_cache=kw["kv_cache"][:, :3])
    fails(ValueError, r"disagree on head_dim: q.shape\[2\] = 3, kv_cache.shape\[1\]", q=kw["q"][:, :, :3])
    fails(ValueError, "v_dim must be in", v_dim=5)
    fails(TypeError, "sm_scale", sm_scale="0.5")
    fails(ValueError, "sm_scale must be finite", sm_scale=float("nan"))
    fails(ValueError, "sm_scale must be finite, got int too large for a float", sm_scale=10**400)  # (OverflowError)
    fails(ValueError, r"qo_indptr\[-1\] must equal q.shape\[0\]", qo_indptr=np.array([0, 3, 4]))
    fails(ValueError, "kv_indptr must have length 3", kv_indptr=md.kv_indptr[:2])
    fails(ValueError, "kv_indptr must be non-decreasing", kv_indptr=np.array([0, 3, 2], dtype=np.int32))
    fails(TypeError, "kv_indices must be an integer array", kv_indices=md.kv_indices.astype(np.float64))
    fails(ValueError, r"exceeds len\(kv_indices\)", kv_indices=md.kv_indices[:4])
    fails(ValueError, "out_cache_loc must have length 5", out_cache_loc=md.out_cache_loc[:4])
    bad_slots = md.out_cache_loc.copy()
    bad_slots[2] = kw["kv_cache"].shape[0]
    fails(ValueError, "out_cache_loc holds slot", out_cache_loc=bad_slots)
    fails(TypeError, "mask must be uint8, bool or int8", mask=kw["mask"].astype(np.int32))
    fails(ValueError, "lies outside the mask", mask=kw["mask"][:-1])
    zero_prefix = kw["mask"].copy()
    zero_prefix[0] = 0  # a prefix column of draft row 0: not read (SGLang may leave it unwritten)
    got = verify_attention_reference(**{**kw, "mask": zero_prefix})
    want = verify_attention_reference(**kw)
    assert all(np.array_equal(g, w) for g, w in zip(got, want))
    fails(TypeError, "needs a mask buffer", mask=None)
    fails(TypeError, "must be None for mask_format 'causal'", mask_format="causal")

    bits = build_bitmask(trees, 1)
    fails(TypeError, "mask must be uint32", mask=bits.astype(np.int64), mask_format="bitmask")
    # int32 words are the same bits (VerifyMetadata takes them; a fresh user's finding, fifty-second session)
    assert bits.any()
    got = verify_attention_reference(**{**kw, "mask": bits.view(np.int32), "mask_format": "bitmask"})
    want = verify_attention_reference(**{**kw, "mask": bits, "mask_format": "bitmask"})
    assert all(np.array_equal(g, w) for g, w in zip(got, want))
    stray = bits.copy()
    stray[0, 0] |= np.uint32(1 << 3)  # request 0 has 3 draft tokens: bit 3 is past the end
    fails(ValueError, "bits set at or past bit 3", mask=stray, mask_format="bitmask")
    fails(ValueError, r"\[total_q = 5, n_words\]", mask=bits[:4], mask_format="bitmask")


def test_check_parents_refuses_unsigned_values_past_int64():
    """Review 16 #10: 2**64 - 1 was taken as -1, the root's parent."""
    with pytest.raises(ValueError, match="parents must fit int64, got 18446744073709551615"):
        check_parents(np.array([2**64 - 1, 0], np.uint64))
    with pytest.raises(ValueError, match=r"parents\[0\] must be -1 \(the root\), got 0"):  # in range: the usual check
        check_parents(np.array([0, 0], np.uint64))
    np.testing.assert_array_equal(check_parents(np.array([-1, 0], np.int8)), [-1, 0])


def test_empty_inputs_get_the_shape_message_not_the_dtype_one():
    """Review 16's leftover: check_parents([]) said 'must be an integer array, got dtype float64'
    ([] is an empty float64 array to numpy); an empty batch of lengths is a batch of 0 requests."""
    with pytest.raises(ValueError, match=r"parents must be 1-D with at least one node, got shape \(0,\)"):
        check_parents([])
    assert mask_indptr_for([], [], "full").tolist() == [0]
    md = make_metadata([], [], 10, np.random.default_rng(0))
    assert md.batch_size == 0 and md.total_q == 0 and md.qo_indptr.tolist() == [0]
    with pytest.raises(TypeError, match="q_lens must be integers, got dtype float64"):
        make_metadata([1], [1.0], 10, np.random.default_rng(0))


# -- empty index lists; every score -inf or NaN --------------------------------------------------------------
@pytest.mark.parametrize("empty", [[], ()])
def test_verify_attention_reference_takes_an_empty_list_of_kv_indices(empty):
    kw = dict(qo_indptr=[0, 2], kv_indptr=[0, 0], kv_indices=empty, out_cache_loc=[0, 1], mask=None,
              mask_format="causal", sm_scale=1.0, v_dim=2)
    for f in (verify_attention_reference, verify_attention_bruteforce):
        out, lse = f(np.ones((2, 1, 4)), np.ones((4, 4)), **kw)
        assert out.shape == (2, 1, 2) and np.isfinite(lse).all()


def test_empty_index_lists_still_refuse_floats_and_wrong_shapes():
    kw = dict(qo_indptr=[0, 2], kv_indptr=[0, 0], out_cache_loc=[0, 1], mask=None,
              mask_format="causal", sm_scale=1.0, v_dim=2)
    with pytest.raises(TypeError, match="kv_indices must be an integer array"):
        verify_attention_reference(np.ones((2, 1, 4)), np.ones((4, 4)), kv_indices=np.array([], np.float64), **kw)
    with pytest.raises(ValueError, match="kv_indices must be 1-D"):
        verify_attention_reference(np.ones((2, 1, 4)), np.ones((4, 4)), kv_indices=[[]], **kw)


def test_bruteforce_agrees_with_the_reference_when_every_score_is_minus_inf():
    q = np.ones((1, 1, 4))
    q[0, 0, 0] = -np.inf
    kw = dict(qo_indptr=[0, 1], kv_indptr=[0, 2], kv_indices=[0, 1], out_cache_loc=[2], mask=None,
              mask_format="causal", sm_scale=1.0, v_dim=2)
    want = verify_attention_reference(q, np.ones((3, 4)), **kw)
    got = verify_attention_bruteforce(q, np.ones((3, 4)), **kw)
    assert want[0].tolist() == [[[0.0, 0.0]]] and want[1].tolist() == [[-np.inf]]
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


def test_bruteforce_keeps_a_nan_score_nan_even_when_the_others_are_minus_inf():
    kv = np.ones((3, 4))
    kv[1, 0] = np.nan
    q = np.ones((1, 1, 4))
    q[0, 0, 1] = -np.inf
    kw = dict(qo_indptr=[0, 1], kv_indptr=[0, 2], kv_indices=[0, 1], out_cache_loc=[2], mask=None,
              mask_format="causal", sm_scale=1.0, v_dim=2)
    want = verify_attention_reference(q, kv, **kw)
    got = verify_attention_bruteforce(q, kv, **kw)
    assert np.isnan(want[1]).all()
    np.testing.assert_array_equal(got[1], want[1])


@pytest.mark.parametrize("bad_rng", [None, 7, np.random.RandomState(0)])
def test_tree_and_metadata_helpers_refuse_an_rng_that_is_not_a_generator(bad_rng):
    """``random_tree(5, None)`` was an AttributeError from inside numpy; like the helpers' other
    argument checks, a wrong ``rng`` is a TypeError that says what to pass."""
    with pytest.raises(TypeError, match="rng must be a numpy.random.Generator"):
        random_tree(5, bad_rng)
    with pytest.raises(TypeError, match="rng must be a numpy.random.Generator"):
        make_metadata([4], [2], 16, bad_rng)


def test_review39_bruteforce_validates_the_mask_and_trees_refuse_past_int64():
    """Review 39: the brute force indexed past a short QLEN_ONLY mask (a bare IndexError) and took
    an int32 one; mask_indptr_for and make_metadata wrapped int64 sums to negative offsets."""
    from driverlevel.reference.trees import make_metadata, mask_indptr_for

    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 1, 8)).astype(np.float32)
    kv = rng.standard_normal((6, 8)).astype(np.float32)
    args = (q, kv, [0, 2], [0, 2], [3, 1], [0, 4])
    with pytest.raises(ValueError, match="lies outside the mask of length 2"):
        verify_attention_bruteforce(*args, np.array([1, 0], np.uint8), "qlen_only", 0.5, 2)
    with pytest.raises(TypeError, match="mask must be uint8, bool or int8"):
        verify_attention_bruteforce(*args, np.ones(4, np.int32), "qlen_only", 0.5, 2)
    out, lse = verify_attention_bruteforce(*args, np.array([1, 0, 1, 1], np.uint8), "qlen_only", 0.5, 2)
    ref_out, ref_lse = verify_attention_reference(*args, np.array([1, 0, 1, 1], np.uint8), "qlen_only", 0.5, 2)
    # an int8 mask, as VerifyAttention.run takes it (its -1 and 1 visible, as the kernel's byte != 0):
    # refused before (helper audit, sixty-fifth session)
    i8_out, i8_lse = verify_attention_reference(*args, np.array([-1, 0, 1, 1], np.int8), "qlen_only", 0.5, 2)
    np.testing.assert_array_equal(i8_out, ref_out)
    np.testing.assert_array_equal(i8_lse, ref_lse)
    np.testing.assert_allclose(out, ref_out, rtol=1e-12)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-12)
    with pytest.raises(ValueError, match="does not fit int64"):
        mask_indptr_for([2**31], [2**32], "full")
    with pytest.raises(ValueError, match="does not fit int64"):
        mask_indptr_for([0], [2**32], "qlen_only")
    with pytest.raises(ValueError, match="num_slots must be >= sum"):
        make_metadata([2**62, 2**62], [1, 1], 10, rng)
    assert mask_indptr_for([3, 4], [2, 1], "full").tolist() == [0, 10, 15]


# -- index values past int64; a string for parents (a tester's findings) ---------------------------------------

@pytest.mark.parametrize("name", ["kv_indices", "out_cache_loc"])
def test_verify_attention_reference_names_index_values_past_int64(name):
    """A uint64 2**63 + 1 wrapped to -2**63 + 1 ("holds slot -9223372036854775807"), and a Python list with
    2**70 (an object array to numpy) said "got dtype object". Both name the value now; uint64 values that
    fit, and integers numpy makes float64 (int64 with uint64), are read exactly."""
    rng = np.random.default_rng(7)
    q, kv = rng.standard_normal((2, 3, 8)), rng.standard_normal((6, 8))
    kw = dict(q=q, kv_cache=kv, qo_indptr=[0, 2], kv_indptr=[0, 2], kv_indices=[3, 1], out_cache_loc=[0, 4],
              mask=None, mask_format="causal", sm_scale=0.5, v_dim=4)
    want = verify_attention_reference(**kw)
    good = np.array(kw[name], np.uint64)
    for big, value in ((2**63 + 1, 2**63 + 1), (2**64 - 1, 2**64 - 1)):
        bad = good.copy()
        bad[1] = big
        with pytest.raises(ValueError, match=rf"{name} must fit int64, got {value}$"):
            verify_attention_reference(**{**kw, name: bad})
    for bad, value in (([kw[name][0], 2**70], 2**70), ([kw[name][0], -2**70], -2**70), ([-1, 2**63], 2**63)):
        with pytest.raises(ValueError, match=rf"{name} must fit int64, got {value}$"):
            verify_attention_reference(**{**kw, name: bad})
    with pytest.raises(TypeError, match=rf"{name} must be an integer array, got dtype float64"):
        verify_attention_reference(**{**kw, name: [float(v) for v in kw[name]]})  # floats stay refused
    mixed = [np.int64(kw[name][0]), np.uint64(kw[name][1])]  # numpy makes these float64: read exactly
    for ok in (good, np.array(kw[name], dtype=object), mixed):
        got = verify_attention_reference(**{**kw, name: ok})
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1])


@pytest.mark.parametrize("bad", ["abc", [[-1.0, 0.0]], np.array([["-1", "0"]]), 1.5, np.array([], np.float64)])
def test_check_parents_refuses_what_is_no_integer_array_whatever_its_shape(bad):
    """check_parents("abc") said "must be 1-D ..., got shape ()": a string is the wrong type, not shape."""
    with pytest.raises(TypeError, match="parents must be an integer array, got dtype"):
        check_parents(bad)
    with pytest.raises(ValueError, match=r"parents must be 1-D with at least one node, got shape \(1, 2\)"):
        check_parents([[-1, 0]])  # integers of the wrong shape: the shape
    with pytest.raises(ValueError, match=r"got shape \(0,\)"):
        check_parents([])  # (an empty list: numpy's float64, read as integers of no length)
    par = random_tree(9, np.random.default_rng(8))
    np.testing.assert_array_equal(check_parents(par.tolist()), par)


def test_draft_visibility_names_a_block_past_int64_instead_of_reshaping_a_wrapped_size():
    """Fresh-user trial (s66): q_len 2**32 with a prefix of 2**32 wrapped the int64 block size to 0 and
    numpy said "cannot reshape array of size 0"; the sizes are now exact Python ints."""
    with pytest.raises(ValueError, match=r"request 0's mask block \[0, 36893488147419103232\) lies outside the "
                                         r"mask of length 10"):
        draft_visibility(np.zeros(10, np.uint8), "full", [0, 2**32], [0, 2**32])
    vis = draft_visibility(np.array([1, 1, 0, 1, 1, 1], np.uint8), "full", [0, 2], [0, 1])  # still decoded
    np.testing.assert_array_equal(vis[0], [[True, False], [True, True]])
