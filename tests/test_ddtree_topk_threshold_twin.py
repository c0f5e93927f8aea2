"""The threshold top-K (``DDTreePlan(topk="threshold")``) through its numpy twin (CPU only).

:mod:`driverlevel.reference.topk_threshold` models the kernels' decisions value for value
(sample, threshold, candidate count, fallback); here it is checked against the reference
top-K on adversarial rows (exact ids, log-probs within the GPU tests' tolerance), and the
fallback is shown to trigger on the rows it must take and not on realistic ones.
"""

from __future__ import annotations

import numpy as np
import pytest

from driverlevel import _topk_threshold as tk
from driverlevel._dtypes import bf16_bits_to_f32, f32_to_bf16_bits
from driverlevel.reference import ddtree as ref
from driverlevel.reference import topk_threshold as twin

MERGE_CAPACITY = 512 * 24
VOCABS = (129_280, 163_840, 151_936)


def _rows(rng, v):
    ids = np.arange(v)
    out = {
        "normal": rng.standard_normal(v).astype(np.float32) * 2,
        "gumbel": rng.gumbel(size=v).astype(np.float32) * 3,
        "student-t": rng.standard_t(3, v).astype(np.float32),
        "zipf at low ids": (-1.2 * np.log1p(ids * rng.uniform(0.5, 1.5, v)) + rng.standard_normal(v) * 0.5).astype(np.float32),
        "cluster at low ids": (rng.standard_normal(v) + 4 * (ids < 2000)).astype(np.float32),
        "ascending": np.sort(rng.standard_normal(v).astype(np.float32)),
        "descending": np.sort(rng.standard_normal(v).astype(np.float32))[::-1].copy(),
        "integers": np.round(rng.standard_normal(v) * 2).astype(np.float32),
        "periodic spikes": (rng.standard_normal(v) * 0.01 + 30 * (ids % 997 == 0)).astype(np.float32),
    }
    x = rng.standard_normal(v).astype(np.float32)
    x[rng.choice(v, v // 3, replace=False)] = np.nan
    out["a third NaN"] = x
    x = rng.standard_normal(v).astype(np.float32)
    x[5] = np.inf
    out["+inf"] = x
    return out


def _check(x, k, bf16):
    r = twin.threshold_topk(x, k, bf16, MERGE_CAPACITY)
    ids, lp, lse = ref.topk_logprobs(x[None], k)
    np.testing.assert_array_equal(r.ids, ids[0])
    fin = lp[0] != ref.LP_FLOOR
    np.testing.assert_array_equal(r.lp[~fin], lp[0][~fin])
    with np.errstate(over="ignore", invalid="ignore"):
        tol = 4 * np.spacing(np.abs(np.nan_to_num(lse[0]))) + 2 * np.spacing(np.abs(lp[0])) + 1e-7
    assert (np.abs(r.lp - lp[0])[fin] <= tol[fin]).all()
    return r


def test_sample_layout():
    for v in VOCABS + (4097, 5000, 12345):
        for bf16 in (False, True):
            g = tk.group_tokens(bf16)
            s = tk.sample_groups(v, bf16)
            assert s.shape == (tk.sample_items(bf16),) and s.shape[0] * g == tk.SAMPLE_VALUES
            assert (s % g == 0).all() and (s >= 0).all() and (s + g <= v).all()
            ng = v // g
            strata = np.arange(s.shape[0]) * ng // s.shape[0]
            assert (s // g >= strata).all() and (np.diff(s) > 0).all()  # one group per stratum, in order
    assert tk.sample_groups(4096, False) is None and tk.sample_groups(300, True) is None
    # the kernel's hash (uint32 arithmetic), two known values
    assert int(tk.hash32(0)) == 0 and int(tk.hash32(1)) == _hash_py(1)


def _hash_py(i):
    h = (i * 0x9E3779B1) & 0xFFFFFFFF
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    return h ^ (h >> 13)


def test_rank_and_capacity():
    for v in VOCABS:
        prev = 0
        for k in (1, 16, 64, 256, 512):
            m = tk.sample_rank(k, v)
            assert m >= prev and 1 <= m <= tk.SAMPLE_VALUES
            prev = m
            mean = m * v / tk.SAMPLE_VALUES
            # the expected count clears K by z = 5 standard deviations, and the capacity the
            # expected count by 2 z
            assert (m - tk.SAMPLE_Z * np.sqrt(m)) * v / tk.SAMPLE_VALUES >= k * 0.999
            cap = tk.candidate_capacity(k, v, MERGE_CAPACITY)
            assert cap % 256 == 0 and mean < cap <= MERGE_CAPACITY and cap >= 4 * k
    assert tk.sample_rank(300, 4000) == 300  # a row sampled whole: m = K


def test_segments_fill_the_gpu_and_cover_the_row():
    for v in VOCABS:
        for bf16 in (False, True):
            tile = tk.stream_tile_tokens(bf16)
            for rows in (15, 120, 480):
                n, seg = tk.stream_segments(rows, v, bf16, 132)
                assert seg % tile == 0 and (n - 1) * seg < v <= n * seg
                assert rows * n >= min(2 * 132, rows * -(-v // tile))  # batch 1 spreads a row over many CTAs


@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("vocab", VOCABS)
def test_twin_is_exact_on_adversarial_rows(vocab, bf16):
    rng = np.random.default_rng(vocab + bf16)
    for name, x in _rows(rng, vocab).items():
        if bf16:
            x = bf16_bits_to_f32(f32_to_bf16_bits(x))
        for k in (1, 16, 512):
            r = _check(x, k, bf16)
            if name in ("normal", "gumbel", "zipf at low ids", "cluster at low ids", "ascending", "descending",
                        "a third NaN"):
                assert not r.fallback, f"{name}, K={k}: count {r.count}, capacity {r.capacity}"


@pytest.mark.parametrize("bf16", [False, True])
def test_fallback_rows(bf16):
    """Rows the threshold cannot take go to the exact fallback, and the result stays exact."""
    v, k = 163_840, 256
    rng = np.random.default_rng(5)
    g = tk.group_tokens(bf16)
    sampled = (tk.sample_groups(v, bf16)[:, None] + np.arange(g)[None, :]).reshape(-1)
    x = rng.standard_normal(v).astype(np.float32)
    x[sampled] += 50
    few = np.full(v, -np.inf, np.float32)
    few[rng.choice(v, 100, replace=False)] = rng.standard_normal(100)
    flat = np.zeros(v, np.float32)
    flat[rng.choice(v, 100, replace=False)] = 7
    cases = {"sample boosted (count = m < K)": x, "constant": np.full(v, 1.5, np.float32),
             "flat with spikes (count > capacity)": flat, "all NaN": np.full(v, np.nan, np.float32),
             "all -inf": np.full(v, -np.inf, np.float32), "100 finite": few}
    for name, row in cases.items():
        if bf16:
            row = bf16_bits_to_f32(f32_to_bf16_bits(row))
        r = _check(row, k, bf16)
        assert r.fallback, name


@pytest.mark.parametrize("bf16", [False, True])
def test_small_vocab_rows_are_sampled_whole(bf16):
    rng = np.random.default_rng(11)
    for v, k in ((300, 256), (3001, 40), (4096, 512)):
        x = rng.standard_normal(v).astype(np.float32) * 3
        if bf16:
            x = bf16_bits_to_f32(f32_to_bf16_bits(x))
        r = _check(x, k, bf16)
        t_key = twin.order_keys(np.float32(r.threshold))
        assert r.count >= k and (twin.order_keys(x) >= t_key).sum() == r.count  # m = K: never too few


def test_fallback_is_rare_on_random_rows():
    """200 rows per kind at K = 16 and 512: no fallback on normal or Gumbel rows (the z = 5
    margin), and the candidate count within [K, capacity]."""
    rng = np.random.default_rng(2)
    v = 163_840
    for k in (16, 512):
        cap = tk.candidate_capacity(k, v, MERGE_CAPACITY)
        counts = []
        for i in range(200):
            x = (rng.standard_normal(v) * 2 if i % 2 else rng.gumbel(size=v) * 3).astype(np.float32)
            t, early = twin.sample_threshold(x, k, False)
            assert not early
            counts.append(int((x >= t).sum()))
        counts = np.array(counts)
        assert counts.min() >= k and counts.max() <= cap, (k, counts.min(), counts.max(), cap)


def test_stream_ring_per_gpu():
    """The stream kernel's (CTAs per SM, ring tiles) from the shared memory per SM / per block:
    the H200's 228 / 227 KB, sm_120's 100 / 99 KB (as the docstring says), and a GPU too small
    for two tiles refused."""
    h200, sm120 = (233_472, 232_448), (102_400, 101_376)
    assert tk.stream_config(False, *h200) == (4, 3) and tk.stream_config(True, *h200) == (4, 6)
    assert tk.stream_config(False, *sm120) == (2, 2) and tk.stream_config(True, *sm120) == (3, 3)
    for bf16 in (False, True):
        ctas, stages = tk.stream_config(bf16, *h200)
        assert ctas * (stages * tk.stream_tile_bytes(bf16) + tk.STREAM_STATIC_BYTES) <= h200[0]
    with pytest.raises(ValueError, match="two 16384 B tiles"):
        tk.stream_config(False, 30_000, 30_000)
