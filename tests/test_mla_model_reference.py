"""CPU tests of the demo MLA model's weights, its numpy reference, the drafter reference and
the whole DDTree decode loop on the host (lossless against greedy decoding), plus the
compile of cu/mla_model.cu, cu/runner.cu and cu/argmax.cu for every architecture."""

from __future__ import annotations

import math

import numpy as np
import pytest

import driverlevel as dl
from driverlevel import argmax, runner
from driverlevel.demo import mla_model
from driverlevel._compile import MAX_SHARED_PER_BLOCK, SUPPORTED_ARCHS
from driverlevel.demo._mla_weights import QK_DIM, V_DIM, MLAModelConfig, make_weights
from driverlevel.demo import reference as R
from driverlevel.reference.attention import bf16_to_f32
from driverlevel.reference.trees import build_bitmask, chain_tree

SMALL = dict(vocab_size=2048, num_heads=4, num_classes=64, feature_dim=128, seed=3)


@pytest.fixture(scope="module")
def small():
    return make_weights(MLAModelConfig(**SMALL))


@pytest.fixture(scope="module")
def small_run(small):
    rng = np.random.default_rng(11)
    prompts = [rng.integers(0, small.config.vocab_size, size=n).tolist() for n in (24, 9, 40)]
    out, margins = R.greedy_generate_reference(small, prompts, 96, return_margins=True)
    return prompts, out, margins


# --------------------------------------------------------------------------- config and weights

def test_config_validation_names_the_field():
    with pytest.raises(ValueError, match="vocab_size"):
        MLAModelConfig(vocab_size=1001)
    with pytest.raises(ValueError, match="steer_gain"):
        MLAModelConfig(steer_gain=0.9)
    with pytest.raises(ValueError, match="num_classes"):
        MLAModelConfig(num_classes=300)
    with pytest.raises(ValueError, match="saturates"):
        MLAModelConfig(score_unit=64.0)
    with pytest.raises(TypeError, match="num_heads"):
        MLAModelConfig(num_heads=9.0)
    assert MLAModelConfig().d_model == 512


def test_weights_are_deterministic_and_shaped(small):
    c = small.config
    again = make_weights(c)
    for n in ("embed", "w_q", "w_kv", "w_o", "w_lm"):
        a, b = getattr(small, n), getattr(again, n)
        assert a.dtype == np.uint16 and np.array_equal(a, b), n
    D, H, V = c.d_model, c.num_heads, c.vocab_size
    assert small.embed.shape == (V, D) and small.w_lm.shape == (V, D)
    assert small.w_q.shape == (H * QK_DIM, D) and small.w_kv.shape == (QK_DIM, D) and small.w_o.shape == (D, H * V_DIM)
    other = make_weights(MLAModelConfig(**{**SMALL, "seed": 4}))
    assert not np.array_equal(other.w_lm, small.w_lm)


def test_weights_structure(small):
    c = small.config
    NC = c.num_classes
    e = small.as_float32("embed")
    # class one-hot, exactly one 1.0 per row at the token's class
    assert np.array_equal(np.argmax(e[:, :NC], axis=1), small.token_class)
    assert np.array_equal((e[:, :NC] != 0).sum(axis=1), np.ones(c.vocab_size))
    assert np.allclose(np.linalg.norm(e[:, NC:], axis=1), 1.0, atol=1e-2)
    # score codes: distinct exact integers times the unit, per (head, query class)
    wq = small.as_float32("w_q")
    for h in range(c.num_heads):
        codes = wq[h * QK_DIM:h * QK_DIM + NC, :NC].T  # [query class, key class]
        assert np.array_equal(np.sort(codes, axis=1), np.tile(c.score_unit * np.arange(1, NC + 1), (NC, 1)))
    # the hidden successor is a permutation
    assert np.array_equal(np.sort(small.successor), np.arange(c.vocab_size))


# --------------------------------------------------------------------------- the reference model

def test_embedding_rotates_the_class_by_position(small):
    NC = small.config.num_classes
    t = np.array([5, 5, 7])
    e = R.embed_reference(small, t, [0, 3, NC + 1])
    cls = small.token_class
    assert np.argmax(e[0, :NC]) == cls[5]
    assert np.argmax(e[1, :NC]) == (cls[5] + 3) % NC
    assert np.argmax(e[2, :NC]) == (cls[7] + 1) % NC
    assert np.array_equal(e[0, NC:], e[1, NC:])


def test_forward_reference_on_a_chain_reproduces_greedy_decoding(small, small_run):
    """One tree forward over the true continuation (a chain, bitmask mask) predicts every next token."""
    prompts, out, _ = small_run
    prompt, gen = prompts[0], out[0]
    n = 17
    k = len(prompt) - 1
    tokens = [prompt[-1]] + gen[:n - 1]
    kv = np.full((k + n + 8, QK_DIM), np.nan)
    _, _, kvp = R._project(small, np.asarray(prompt[:-1]), np.arange(k))
    kv[:k] = kvp
    mask = build_bitmask([chain_tree(n)], 1)
    logits = R.forward_reference(small, tokens, k + np.arange(n), kv, [0, n], [0, k], np.arange(k),
                                 k + 3 + np.arange(n), mask, "bitmask")
    assert logits.shape == (n, small.config.vocab_size)
    assert np.array_equal(np.argmax(logits, axis=1), gen[:n])


def test_margins_are_far_above_bf16_noise(small, small_run):
    """Top-1 margins along greedy generations, against the logit change of 1-ulp noise in the
    attention output and the residual stream (the numerical difference of two attention splits)."""
    prompts, out, margins = small_run
    rep = R.margin_report(margins)
    c = small.config
    assert rep["count"] == sum(len(o) for o in out)
    assert rep["min"] > 0.15 * c.logit_scale, rep
    # logit noise: perturb the bf16 attention output and h by +-1 ulp at random, many times
    rng = np.random.default_rng(0)
    f = R._Cache.get(small)
    prompt = prompts[2]
    k = len(prompt) - 1
    toks = np.asarray([prompt[-1]] + out[2][:31])
    pos = k + np.arange(len(toks))
    e, q, kv = R._project(small, toks, pos)
    _, _, kvp = R._project(small, np.asarray(prompt[:-1]), np.arange(k))
    keys = np.concatenate([kvp, kv])
    worst = 0.0
    for i in range(len(toks)):
        attn = R._bf16(R._attend(small, q[i], keys[:k + i + 1]))
        h = R._bf16(e[i] + attn.reshape(-1) @ f["w_o"].T)
        base = h @ f["w_lm"].T
        for _ in range(8):
            a2 = attn * (1 + rng.choice([-1, 0, 1], attn.shape) * 2.0 ** -8)
            h2 = R._bf16(e[i] + a2.reshape(-1) @ f["w_o"].T)
            h2 = h2 * (1 + rng.choice([-1, 0, 1], h2.shape) * 2.0 ** -8)
            worst = max(worst, float(np.abs(h2 @ f["w_lm"].T - base).max()))
    assert worst * 5 < rep["min"], (worst, rep)


def test_default_config_margins_and_acceptance():
    """The demo's default shapes (smaller vocabulary): margins and the drafter's chain acceptance."""
    w = make_weights(MLAModelConfig(vocab_size=8192, seed=1))
    rng = np.random.default_rng(5)
    prompts = [rng.integers(0, 8192, size=n).tolist() for n in (64, 96)]
    out, margins = R.greedy_generate_reference(w, prompts, 128, return_margins=True)
    rep = R.margin_report(margins)
    assert rep["min"] > 1.0, rep                  # logit units; bf16 noise is ~1e-2 (see above)
    succ = R.no_context_successor(w)
    assert np.array_equal(succ, w.successor)
    tps = R.chain_acceptance(succ, prompts, out, 15)
    assert 1.8 < tps < 8.0, tps                   # the context matters, and the drafter mostly agrees
    assert len(set(out[0])) > 64                  # no short cycle


# --------------------------------------------------------------------------- drafter

def test_draft_noise_reference_is_deterministic_and_normal():
    rows = np.arange(64).reshape(-1, 1)
    cols = np.arange(4096).reshape(1, -1)
    z = R.draft_noise_reference(7, 3, rows, cols)
    assert z.shape == (64, 4096)
    assert np.array_equal(z, R.draft_noise_reference(7, 3, rows, cols))
    assert abs(z.mean()) < 0.01 and abs(z.std() - 1) < 0.01
    assert not np.array_equal(z, R.draft_noise_reference(7, 4, rows, cols))
    assert not np.array_equal(z, R.draft_noise_reference(8, 3, rows, cols))
    # Box-Muller's pairs: an even column and the odd one after it share a hash, not a value. The
    # two are independent normals (uncorrelated, E[z_e^2 z_o^2] = 1 where equal values would give
    # E[z^4] = 3), and no two pairs share a radius z_e^2 + z_o^2 = -2 ln u1 (a hash per pair)
    even, odd = z[:, 0::2].ravel(), z[:, 1::2].ravel()
    assert abs(np.corrcoef(even, odd)[0, 1]) < 0.02
    assert abs(np.mean(even ** 2 * odd ** 2) - 1) < 0.05
    assert abs(even.std() - 1) < 0.02 and abs(odd.std() - 1) < 0.02
    radius = even ** 2 + odd ** 2
    assert len(np.unique(radius)) == radius.size


def test_draft_noise_reference_pairs_one_hash_per_even_column():
    """The definition, from scratch in Python integers (what cu/mla_model.cu's gauss_pair computes):
    column pair (2j, 2j + 1) shares the hash of 2j; the even column is r cos, the odd one r sin."""
    M = (1 << 64) - 1

    def mix(x):
        x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M
        x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M
        return x ^ (x >> 31)

    seed, step = 0x1234_5678_9ABC_DEF0, 41
    base = mix(seed ^ mix(step + 1))
    for row, col in [(0, 0), (0, 1), (3, 2), (3, 3), (17, 4094), (17, 4095), (2**20, 7), (119, 32767)]:
        x = mix((base + (row << 32) + (col & ~1)) & M)
        u1 = ((x >> 32) + 1.0) / 2**32
        u2 = ((x & 0xFFFFFFFF) + 0.5) / 2**32
        trig = math.cos if col % 2 == 0 else math.sin
        want = math.sqrt(-2.0 * math.log(u1)) * trig(2.0 * math.pi * u2)
        got = R.draft_noise_reference(seed, step, np.array([row]), np.array([col]))[0]
        assert got == pytest.approx(want, rel=1e-12, abs=1e-12), (row, col)


def test_chain_table_rows_are_every_tokens_chain(small):
    from driverlevel.demo.drafter import chain_table

    succ = R.no_context_successor(small)
    V = small.config.vocab_size
    t = chain_table(succ, 6)
    assert t.shape == (V, 6) and t.dtype == np.int32
    np.testing.assert_array_equal(t, R.drafter_chain_reference(succ, np.arange(V), 6))
    np.testing.assert_array_equal(chain_table(succ, 1), np.arange(V).reshape(-1, 1))
    with pytest.raises(ValueError, match="successor values"):
        chain_table(np.array([1, 2, 3]), 4)
    with pytest.raises(ValueError, match="successor must be"):
        chain_table(succ.reshape(-1, 2), 4)
    with pytest.raises(ValueError, match="integers"):
        chain_table(succ.astype(np.float32), 4)
    with pytest.raises(ValueError, match="depth"):
        chain_table(succ, 0)


def test_drafter_logits_follow_the_successor_chain(small):
    succ = R.no_context_successor(small)
    roots = [3, 100]
    g = R.drafter_chain_reference(succ, roots, 5)
    assert g[0, 0] == 3 and g[1, 1] == succ[100] and g[1, 2] == succ[succ[100]]
    lg = R.drafter_logits_reference(small, succ, roots, 5, seed=1, step=1, noise_std=0.5)
    assert lg.shape == (2, 5, small.config.vocab_size)
    # with small noise the top token of depth d+1 is successor[g_d]
    assert np.array_equal(np.argmax(lg, axis=2), succ[g])


def test_ddtree_loop_reference_is_lossless_with_acceptance_above_1_5(small, small_run):
    prompts, out, _ = small_run
    dd, tps = R.ddtree_generate_reference(small, prompts, 96, budget=16, depth_limit=8, noise_std=1.0, seed=2)
    assert dd == out
    assert tps > 1.5, tps


def test_ddtree_loop_reference_stop_token_mid_tree(small, small_run):
    prompts, out, _ = small_run
    stop = out[1][10]  # a token the second request emits after 10 others
    ar = R.greedy_generate_reference(small, prompts, 96, stop_token=stop)
    dd, _ = R.ddtree_generate_reference(small, prompts, 96, budget=16, depth_limit=8, stop_token=stop)
    assert dd == ar
    assert ar[1][-1] == stop and len(ar[1]) <= 11


# --------------------------------------------------------------------------- compile

@pytest.mark.parametrize("arch", SUPPORTED_ARCHS)
@pytest.mark.parametrize("mod", [mla_model, runner, argmax], ids=["mla_model.cu", "runner.cu", "argmax.cu"])
def test_kernels_compile_without_spills(arch, mod):
    src = mod.SOURCE
    cub = dl.runtime.compile_file(src, arch, mod.compile_defines(arch))
    dyn = mod.dynamic_shared_bytes(arch)
    assert cub.data[:4] == b"\x7fELF"
    assert cub.resources
    for name, r in cub.resources.items():
        assert r.spills == 0, (src, arch, name, r)
        assert r.stack_bytes == 0, (src, arch, name, r)
        assert r.shared_bytes + dyn.get(name, 0) <= MAX_SHARED_PER_BLOCK[arch], (src, arch, name)
    if mod is mla_model:
        assert set(cub.resources) == {"mla_gemm", "mla_gemm_m32", "mla_gemm_m144", "mla_gemm_pair", "mla_gemm_pair_m32",
                                      "mla_gemm_reduce", "mla_embed",
                                      "draft_chain"}
        assert dyn["mla_gemm"] == mla_model.gemm_shared_bytes(mla_model.gemm_stages(arch))
        assert dyn["mla_gemm_m32"] == mla_model.gemm_shared_bytes(mla_model.gemm_stages(arch), 32)
        assert dyn["mla_gemm_m144"] == mla_model.gemm_shared_bytes(mla_model.gemm_stages(arch, 144), 144)
        # two 128- and 144-row CTAs an SM where shared memory holds two (their registers capped at
        # 128 there by __launch_bounds__, so that a compiler update shows up here as spills, not as
        # one CTA an SM on the device)
        two = arch in ("sm_80", "sm_90", "sm_100")
        assert mod.compile_defines(arch)["DL_GEMM_CTAS"] == (2 if two else 1)
        assert mod.compile_defines(arch)["DL_GEMM_CTAS_144"] == (2 if two else 1)
        if two:
            assert cub.resources["mla_gemm"].registers <= 128
            assert cub.resources["mla_gemm_m144"].registers <= 128
        # (the pair kernels are checked above like every kernel: no spills, and their tile's dynamic
        # shared memory within the limit; they are not pinned and their registers may exceed the
        # single tiles': NVRTC 13.0 gave mla_gemm_pair 134 on sm_90 before the lean loaders, 128
        # since (fifty-eighth session), and gemm_pair's one-wave rule allows for one CTA an SM)
    elif mod is argmax:
        assert set(cub.resources) == {"argmax_rows_f32", "argmax_rows_bf16"}
    else:
        assert set(cub.resources) == {"ar_prepare", "ar_commit", "limit_records", "publish_records"}


@pytest.mark.parametrize("mod, key, struct", [
    (mla_model, "DL_OFF_G_n", "GemmParams.n"),
    (mla_model, "DL_OFF_D_roots", "DraftChainParams.roots"),
    (runner, "DL_OFF_S_ring", "StepParams.ring"),
    (argmax, "DL_OFF_part", "ArgmaxParams.part"),
])
def test_params_struct_drift_fails_the_compile(mod, key, struct):
    defines = mod.compile_defines("sm_90")
    defines[key] += 8
    with pytest.raises(dl.NvrtcError) as ei:
        dl.runtime.compile_file(mod.SOURCE, "sm_90", defines, use_cache=False)
    assert f"{struct} offset differs from its ctypes mirror" in ei.value.log


def test_gemm_shared_memory_formula_and_schedule():
    assert mla_model.gemm_shared_bytes(3) == 3 * 256 * 72 * 2 == 110_592   # k-tiles of 64, rows of 144 B
    assert mla_model.gemm_shared_bytes(3, 32) == 3 * 160 * 144 == 69_120
    for arch in SUPPORTED_ARCHS:
        assert mla_model.gemm_shared_bytes(mla_model.gemm_stages(arch)) <= MAX_SHARED_PER_BLOCK[arch]
    # the deepest pipeline (<= 4) at which two 128-row CTAs share an SM (1 KB reserved a CTA), else one
    assert {a: mla_model.gemm_stages(a) for a in ("sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120")} == {
        "sm_80": 2, "sm_86": 2, "sm_89": 2, "sm_90": 3, "sm_100": 3, "sm_120": 2}
    for arch in ("sm_80", "sm_90", "sm_100"):
        st = mla_model.gemm_stages(arch)
        assert 2 * (mla_model.gemm_shared_bytes(st) + 1024) <= MAX_SHARED_PER_BLOCK[arch] + 1024
        assert 2 * (mla_model.gemm_shared_bytes(st + 1) + 1024) > MAX_SHARED_PER_BLOCK[arch] + 1024
    # the 144-row tile: 2 stages everywhere (78,336 B), two CTAs an SM on sm_80 / sm_90 / sm_100
    assert mla_model.gemm_shared_bytes(2, 144) == 2 * 272 * 144 == 78_336
    assert {a: mla_model.gemm_stages(a, 144) for a in ("sm_80", "sm_86", "sm_90", "sm_120")} == {
        "sm_80": 2, "sm_86": 2, "sm_90": 2, "sm_120": 2}
    def sched(m, n, k, sms, ctas=2):  # (an H100 / H200: 132 SMs, two CTAs an SM)
        return mla_model.gemm_schedule(m, n, k, sms, ctas)

    assert sched(8, 32768, 512, 132) == (32, 1)          # LM head of a decode step: many tiles
    # a tree step's 136 rows (batch 8 x 17 nodes) in one 144-row tile: the LM head 256 CTAs, not 512
    assert sched(136, 32768, 512, 132) == (144, 1)
    assert [sched(m, 32768, 512, 132)[0] for m in (64, 65, 128, 129, 144, 145, 300)] == [32, 128, 128, 144, 144,
                                                                                          128, 128]
    # only where it saves a wave of ctas_per_sm * sm_count CTAs: the projections (fewer column tiles
    # than CTA slots) keep two 128-row tiles; one CTA an SM on 188 SMs (sm_120's 100 KB): 3 waves -> 2
    assert sched(136, 5184, 512, 132) == (128, 1)        # q: 41 column tiles
    assert sched(136, 512, 4608, 132) == (128, 15)       # the output projection: 8 tiles, split-K
    assert sched(136, 32768, 512, 188, 1) == (144, 1)
    assert sched(136, 32768, 512, 264, 2) == (128, 1)    # 512 CTAs in one wave of 528 either way
    assert sched(136, 32768, 512, 132, 1) == (144, 1)    # 4 waves -> 2
    # not where the 144-row tile would split k (a wide GEMM over a long k on many SMs: 100 column
    # tiles, 188 SMs, one CTA each): the 128-row tile's 200 CTAs, unsplit
    assert sched(136, 12800, 4096, 188, 1) == (128, 1)
    assert mla_model.gemm_workspace_elems(136, 12800, 4096, 188, 1) == 0
    # every argument a positive int, named when it is not
    for bad, exc in ((0, ValueError), (-1, ValueError), (4095.5, TypeError), (True, TypeError), ("1024", TypeError)):
        for i, name in enumerate(("m_max", "n", "k", "sm_count", "ctas_per_sm")):
            args = [136, 1024, 8192, 132, 2]
            args[i] = bad
            with pytest.raises(exc, match=name):
                mla_model.gemm_schedule(*args)
    with pytest.raises(ValueError, match="ctas_per_sm"):
        mla_model.gemm_workspace_elems(136, 1024, 8192, 132, 0)
    for bad, exc in ((0, ValueError), (256, ValueError), (128.7, TypeError), ("128", TypeError)):
        with pytest.raises(exc, match="registers"):
            mla_model.gemm_ctas_per_sm("sm_90", 128, bad)
    for bad, exc in ((200, ValueError), (0, ValueError), (True, TypeError), ("144", TypeError)):
        with pytest.raises(exc, match="bm"):
            mla_model.gemm_stages("sm_90", bad)
        with pytest.raises(exc, match="bm"):
            mla_model.gemm_shared_bytes(2, bad)
    for bad, exc in ((-1, ValueError), ("3", TypeError)):
        with pytest.raises(exc, match="stages"):
            mla_model.gemm_shared_bytes(bad)
    # the 32-row tile runs at the 128-row tile's depth (one DL_GEMM_STAGES)
    assert all(mla_model.gemm_stages(a, 32) == mla_model.gemm_stages(a) for a in SUPPORTED_ARCHS)
    for a in SUPPORTED_ARCHS:  # two CTAs an SM where shared memory holds two, for both tiles
        for bm in (128, 144):
            two = a in ("sm_80", "sm_90", "sm_100")
            assert mla_model.gemm_ctas_per_sm(a, bm) == (2 if two else 1), (a, bm)
            # and by registers: 128 a thread leave two 256-thread CTAs the register file, 129 one
            assert mla_model.gemm_ctas_per_sm(a, bm, 128) == (2 if two else 1), (a, bm)
            assert mla_model.gemm_ctas_per_sm(a, bm, 129) == mla_model.gemm_ctas_per_sm(a, bm, 255) == 1
    assert sched(264, 32768, 512, 132) == (128, 1)
    bm, splits = sched(264, 512, 4608, 132)              # output projection of a tree step: split-K
    assert bm == 128 and splits > 4 and 4608 // splits >= 256
    assert sched(8, 512, 4608, 132)[1] > 4
    assert mla_model.gemm_workspace_elems(264, 512, 4608, 132, 2) == splits * 264 * 512
    # every split has k-tiles (the kernel gives each ceil(kt / splits) of the 72): 17 would leave two empty
    bm, splits = sched(200, 512, 4608, 132)
    assert splits == 15 and (splits - 1) * -(-72 // splits) < 72
    for m_max in (1, 40, 65, 128, 200, 300, 515):
        for n, k in ((512, 4608), (512, 2048), (64, 8192), (136, 2080)):
            kt = -(-k // 64)
            s = sched(m_max, n, k, 132)[1]
            assert 1 <= s <= kt and (s - 1) * -(-kt // s) < kt, (m_max, n, k, s)
    assert mla_model.gemm_workspace_elems(264, 32768, 512, 132, 2) == 0


def test_the_weights_bf16_rounding_is_nearest_even():
    """make_weights' fast rounding (_bf16, uint32 arithmetic) against the package's f32_to_bf16_bits on random
    float32 values of every magnitude, and against hand-worked ties: 1 + 2^-8 lies halfway between 0x3F80 and
    0x3F81 and goes to the even 0x3F80; 1 + 3 * 2^-8 halfway between 0x3F81 and 0x3F82 goes to 0x3F82; a value
    just above a tie goes up. (Truncation, or rounding ties away from zero, fails here.)"""
    from driverlevel._dtypes import f32_to_bf16_bits
    from driverlevel.demo._mla_weights import _bf16

    r = np.random.default_rng(5)
    x = (r.standard_normal(200_000) * np.exp2(r.integers(-60, 60, 200_000))).astype(np.float32)
    assert np.array_equal(_bf16(x), f32_to_bf16_bits(x))
    ties = np.array([1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, 1 + 2.0 ** -8 + 2.0 ** -20, -(1 + 3 * 2.0 ** -8), 1 - 2.0 ** -9],
                    np.float32)
    assert [hex(v) for v in _bf16(ties)] == ["0x3f80", "0x3f82", "0x3f81", "0xbf82", "0x3f80"]


def test_bf16_weights_round_like_the_package(small):
    from driverlevel._dtypes import f32_to_bf16_bits

    x = small.as_float32("w_lm")
    assert np.array_equal(f32_to_bf16_bits(x), small.w_lm)
    assert np.array_equal(bf16_to_f32(small.w_q), small.as_float32("w_q"))
    assert math.isclose(float(small.as_float32("w_lm")[:, small.config.num_classes:].std() *
                              math.sqrt(small.config.feature_dim) / small.config.logit_scale), 1.0, rel_tol=0.05)
