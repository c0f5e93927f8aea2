"""The threshold top-K (``DDTreePlan(topk="threshold")``) through its numpy twin (CPU only).

:mod:`driverlevel.reference.topk_threshold` models the kernels' decisions value for value
(sample, threshold, candidate count, fallback); here it is checked against the reference
top-K on adversarial rows (exact ids, log-probs within the GPU tests' tolerance), and the
fallback is shown to trigger on the rows it must take and not on realistic ones. The sample's
threshold (``kth_largest_bound``) is checked against a brute-force sort of the sampled keys:
at least ``m`` and, ties with the ``m``-th aside, at most ``m + slack`` of them are ``>= T``.
The layout's arithmetic (sample rank, slack, candidate capacity, the hypergeometric tail) holds for
every K up to the vocabulary.
"""

from __future__ import annotations

from fractions import Fraction
from math import comb

import numpy as np
import pytest

from driverlevel import _topk_threshold as tk
from driverlevel._dtypes import bf16_bits_to_f32, f32_to_bf16_bits
from driverlevel.reference import ddtree as ref
from driverlevel.reference import topk_threshold as twin
from driverlevel.reference.topk_threshold import threshold_topk

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
            # m is the smallest rank whose hypergeometric tail is at most SAMPLE_FAIL, and no less
            # than min(K, 17): one sampled group of up to 16 tokens cannot fail a row alone
            tail = tk.hypergeom_tail(16 * (v // 16), k - 1, tk.SAMPLE_VALUES)
            floor = min(k, 17)
            assert m >= floor and tail[m] <= tk.SAMPLE_FAIL, (v, k, m)
            assert m == floor or tail[m - 1] > tk.SAMPLE_FAIL, (v, k, m)
            cap = tk.candidate_capacity(k, v, MERGE_CAPACITY)
            assert cap % 256 == 0 and mean < cap <= MERGE_CAPACITY and cap >= 4 * k
            # T admits up to S = floor(z sqrt(m)) sampled values past the m-th: the capacity
            # still clears the expected count there by z standard deviations
            s = tk.sample_slack(k, v)
            assert s == int(tk.SAMPLE_Z * np.sqrt(m)) and s >= 5
            n = m + s
            assert (n + tk.SAMPLE_Z * np.sqrt(n)) * v / tk.SAMPLE_VALUES <= cap
    assert tk.sample_rank(300, 4000) == 300  # a row sampled whole: m = K
    for k in (1, 16, 300, 512):  # ... counted exactly: K + S candidates fit
        assert k + tk.sample_slack(k, 4000) <= tk.candidate_capacity(k, 4000, MERGE_CAPACITY)


def _exact_tail(population, successes, draws, x):
    """P(X >= x) for X hypergeometric, in exact integer arithmetic (an independent check)."""
    from fractions import Fraction
    from math import comb

    num = sum(comb(successes, j) * comb(population - successes, draws - j) for j in range(x, min(successes, draws) + 1))
    return Fraction(num, comb(population, draws))


def test_sample_rank_tail_against_exact_arithmetic():
    """hypergeom_tail (log-gamma, float64) agrees with exact integer sums, and the ranks it gives
    at Kimi's vocabulary are the smallest whose failure probability is at most SAMPLE_FAIL; a
    uniform random sample of the row fails at about that rate (Monte Carlo at an inflated
    SAMPLE_FAIL, where the rate is measurable)."""
    for pop, succ, draws in ((163840, 255, 4096), (129280, 15, 4096), (5000, 63, 4096), (300, 40, 100)):
        tail = tk.hypergeom_tail(pop, succ, draws)
        for x in sorted({x for x in (0, 1, 3, 7, 15, 25) if x <= min(succ, draws)} | {min(succ, draws)}):
            want = float(_exact_tail(pop, succ, draws, x))
            assert tail[x] == pytest.approx(want, rel=1e-9, abs=1e-300), (pop, succ, draws, x)
    assert [tk.sample_rank(k, 163840) for k in (1, 16, 64, 256, 512)] == [1, 16, 17, 23, 35]
    for k in (256, 512):
        m = tk.sample_rank(k, 163840)
        assert float(_exact_tail(163840, k - 1, 4096, m)) <= tk.SAMPLE_FAIL
        assert float(_exact_tail(163840, k - 1, 4096, m - 1)) > tk.SAMPLE_FAIL
    with pytest.raises(ValueError):
        tk.hypergeom_tail(10, 11, 5)
    # a random sample of 4,096 of 163,840 ranks: how often do >= m land among the top K - 1
    rng = np.random.default_rng(5)
    k, v, trials = 256, 163840, 20000
    hits = rng.hypergeometric(k - 1, v - (k - 1), tk.SAMPLE_VALUES, size=trials)
    for m in (10, 12, 14):
        rate = float((hits >= m).mean())
        p = tk.hypergeom_tail(v, k - 1, tk.SAMPLE_VALUES)[m]
        assert abs(rate - p) < 5 * np.sqrt(p * (1 - p) / trials) + 1e-4, (m, rate, p)


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
    sampled = tk.sample_tokens(v, bf16)
    x = rng.standard_normal(v).astype(np.float32)
    x[sampled] += 50
    few = np.full(v, -np.inf, np.float32)
    few[rng.choice(v, 100, replace=False)] = rng.standard_normal(100)
    flat = np.zeros(v, np.float32)
    flat[rng.choice(v, 100, replace=False)] = 7
    cases = {"sample boosted (count <= m + slack < K)": x, "constant": np.full(v, 1.5, np.float32),
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


def test_sample_carveout_rule():
    """The sample kernel asks for the largest carveout exactly when fewer than a quarter of the
    stream's CTAs fit on the SMs its CTAs leave free: on the H100 / H200 (132 SMs, 4 stream CTAs
    per SM), vocabulary 163,840, depth 15, for both dtypes, at batches 7 and 8 (21% and 10% fit),
    not at batches 1 to 6 (all, 97%, 77%, 60%, 43%, 37%: the measured batches 2-4 ran faster
    without it); the boundary itself, and more rows than SMs."""
    h200 = (233_472, 232_448)
    for bf16 in (False, True):
        ctas, _ = tk.stream_config(bf16, *h200)
        for batch in range(1, 9):
            rows = batch * 15
            nseg, _ = tk.stream_segments(rows, 163_840, bf16, 132, ctas)
            want = 100 if batch >= 7 else None
            assert tk.sample_carveout(rows, rows * nseg, 132, ctas) == want, (bf16, batch)
    # 32 free SMs x 4 slots = 128 free slots: asks from 513 stream CTAs on
    assert tk.sample_carveout(100, 512, 132, 4) is None and tk.sample_carveout(100, 513, 132, 4) == 100
    assert tk.sample_carveout(200, 1, 132, 4) == 100  # no SM without a sample CTA


def _log_bin_py(d):
    """cu/ddtree/keys.cuh's log_bin by its own bit arithmetic (Python ints)."""
    if d < 16:
        return d
    e = d.bit_length() - 1
    return 16 + (e - 4) * 8 + ((d >> (e - 3)) & 7)


def test_log_bins_are_the_devices():
    """The twin's log bins equal the device's formula at every octave's edges up to 2^52 (the
    sample's d stay below 2^32), and each bin's [lo, hi] is exactly the d it holds."""
    ds = set(range(300))
    for e in range(4, 53):
        ds |= {(1 << e) + o for o in (-2, -1, 0, 1, 2, 3)} | {3 << (e - 1), (1 << (e + 1)) - 1}
    ds = sorted(ds)
    np.testing.assert_array_equal(twin.log_bin(np.array(ds, np.int64)), [_log_bin_py(d) for d in ds])
    for b in range(400):
        lo, hi = twin.log_bin_lo(b), twin.log_bin_hi(b)
        assert _log_bin_py(lo) == _log_bin_py(hi) == b and (b == 0 or _log_bin_py(lo - 1) == b - 1)
    assert twin.log_bin_hi(495) == twin.log_bin_hi(511) == (1 << 64) - 1


def _assert_bound(s, m, slack, t):
    """Brute force on sampled keys ``s``: ``t`` is at most the m-th largest, at least ``m`` keys
    are ``>= t``, and at most ``m + slack`` unless keys tie with the m-th largest."""
    s = np.sort(np.asarray(s, np.int64))[::-1]
    exact = int(s[m - 1])
    n = int((s >= t).sum())
    n_exact = int((s >= exact).sum())  # > m: ties with the m-th
    assert t <= exact, (t, exact)
    assert m <= n <= max(m + slack, n_exact), (m, slack, n, n_exact)
    return n, n_exact


def _random_row(rng, v):
    """A random logits row of one of several shapes: normal at a random mean (its sampled m-th
    largest below 0 while the sample's maximum is above: the log bins span the whole key range
    in between), Gumbel, Student-t (sampled outliers), or a normal bulk with a few large
    logits of which some are sampled (vmax far above the m-th)."""
    kind = rng.integers(4)
    if kind == 0:
        x = rng.normal(rng.uniform(-12, 4), rng.uniform(0.2, 4), v)
    elif kind == 1:
        x = rng.gumbel(rng.uniform(-5, 5), rng.uniform(0.5, 4), v)
    elif kind == 2:
        x = rng.standard_t(rng.uniform(1.5, 5), v) * rng.uniform(0.5, 3)
    else:
        x = rng.normal(rng.uniform(-10, 2), 2.5, v)
        x[rng.choice(v, 1 + rng.integers(40), replace=False)] += rng.uniform(10, 40)
    return x.astype(np.float32)


@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("vocab", VOCABS + (4096, 3001, 600))
def test_sample_threshold_is_a_bounded_lower_bound(vocab, bf16):
    """On random rows (fp32 and bf16 logits, K from 16 to 512; rows of <= 4,096 tokens sampled
    whole, m = K): the twin's T (the device's) admits at least m and, ties aside, at most
    m + slack sampled values, and is at most the exact m-th largest sampled value; a row
    sampled whole then counts at least K logits >= T."""
    rng = np.random.default_rng(vocab * 2 + bf16)
    for i in range(24):
        x = _random_row(rng, vocab)
        if bf16:
            x = bf16_bits_to_f32(f32_to_bf16_bits(x))
        k = int(min(vocab, (16, 512)[i] if i < 2 else rng.integers(16, 513)))
        m, slack = tk.sample_rank(k, vocab), tk.sample_slack(k, vocab)
        t, early = twin.sample_threshold(x, k, bf16)
        assert not early
        s = twin.order_keys(twin.sample_values(x, bf16))
        _assert_bound(s, m, slack, int(twin.order_keys(t)))
        if vocab <= tk.SAMPLE_VALUES:
            assert m == k and (x >= t).sum() >= k


def test_bound_with_ties():
    """Keys tied with the m-th largest: a bin of one d cannot be split, so T is the m-th
    largest itself and every tie counts (as with the exact select); ties that end within the
    slack may stop a coarser bin; a slack of 0 admits exactly what the exact select does."""
    rng = np.random.default_rng(3)
    m, slack = 37, 30
    noise = rng.standard_normal(4096).astype(np.float32) * 0.1
    many = noise.copy()
    many[:20], many[20:320] = 5.0, 1.0  # the m-th is 1.0, tied 300 times: far past the slack
    t = twin.kth_largest_bound(twin.order_keys(many), m, slack)
    assert t == int(twin.order_keys(np.float32(1.0)))
    assert _assert_bound(twin.order_keys(many), m, slack, t) == (320, 320)
    few = noise.copy()
    few[:20], few[20:45] = 5.0, 1.0  # tied 25 times: 45 <= m + slack
    n, n_exact = _assert_bound(twin.order_keys(few), m, slack, twin.kth_largest_bound(twin.order_keys(few), m, slack))
    assert n_exact == 45 and n <= m + slack
    # integer-valued rows: every bin holds many ties
    for scale in (1, 3, 20):
        s = twin.order_keys(np.round(rng.standard_normal(4096) * scale).astype(np.float32))
        for need in (1, 26, 37, 512, 4096):
            _assert_bound(s, need, tk.sample_slack(need, 4096), twin.kth_largest_bound(s, need, tk.sample_slack(need, 4096)))
            n, n_exact = _assert_bound(s, need, 0, twin.kth_largest_bound(s, need, 0))
            assert n == n_exact
    # slack 0 on rows without ties: exactly m keys >= T
    for _ in range(20):
        s = twin.order_keys(_random_row(rng, 4096))
        need = int(rng.integers(1, 4097))
        n, n_exact = _assert_bound(s, need, 0, twin.kth_largest_bound(s, need, 0))
        assert n == n_exact


def test_bound_ignores_keys_below_the_cut():
    """Slots past a short row hold key 0 (no value): below the cut (KEY_NEG_INF), never counted;
    -inf and NaN logits (KEY_NEG_INF) count. A row of nothing but -inf gives T = -inf."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal(3000).astype(np.float32)
    x[:500] = np.nan
    x[500:700] = -np.inf
    keys = np.concatenate([twin.order_keys(x), np.zeros(1096, np.uint32)])
    for need in (1, 100, 2300, 2800, 3000):
        t = twin.kth_largest_bound(keys, need, 20)
        assert t >= twin.KEY_NEG_INF
        _assert_bound(twin.order_keys(x), need, 20, t)
    assert twin.kth_largest_bound(keys, 3000, 20) == twin.KEY_NEG_INF  # the 3000th is -inf
    t, early = twin.sample_threshold(np.full(5000, -np.inf, np.float32), 16, False)
    assert t == -np.inf and early


@pytest.mark.parametrize("k, exc, words", [(0, ValueError, r"k must be in \[1, vocab=64\], got 0"),
                                           (65, ValueError, r"k must be in \[1, vocab=64\], got 65"),
                                           (2.0, TypeError, "k must be an int, got float"),
                                           (True, TypeError, "k must be an int, got bool")])
def test_threshold_topk_checks_k_as_topk_logprobs(k, exc, words):
    """Review 16's leftover: threshold_topk(row, 0) returned an empty top-K instead of refusing k."""
    with pytest.raises(exc, match=words):
        twin.threshold_topk(np.arange(64, dtype=np.float32), k)


_ROW = np.arange(100, dtype=np.float32)


@pytest.mark.parametrize("row, kw, exc, words", [
    (np.zeros((2, 100), np.float32), {}, ValueError,
     r"^row must be one row \[vocab\] with vocab >= 1, got shape \(2, 100\)$"),
    (np.float32(1), {}, ValueError, r"^row must be one row \[vocab\] with vocab >= 1, got shape \(\)$"),
    (np.zeros(0, np.float32), {}, ValueError, r"^row must be one row \[vocab\] with vocab >= 1, got shape \(0,\)$"),
    (_ROW, {"bf16": "no"}, TypeError, "^bf16 must be a bool, got str 'no'$"),
    (_ROW, {"bf16": 1}, TypeError, "^bf16 must be a bool, got int 1$"),
    (_ROW, {"merge_capacity": 0}, ValueError, "^merge_capacity must be a positive int, got 0$"),
    (_ROW, {"sm_count": 0}, ValueError, "^sm_count must be a positive int, got 0$"),
    (_ROW, {"rows": -1}, ValueError, "^rows must be a positive int, got -1$"),
    (_ROW, {"rows": 2.0}, TypeError, "^rows must be a positive int, got float 2.0$"),
])
def test_threshold_topk_names_a_malformed_row_or_argument(row, kw, exc, words):
    """Review 17 L10: a 2-D row, a scalar or an empty row leaked numpy's IndexError; bf16="no" (truthy)
    took the bf16 path; merge_capacity / sm_count / rows of 0 or below were accepted."""
    with pytest.raises(exc, match=words):
        twin.threshold_topk(row, 2, **kw)


def test_threshold_topk_takes_numpy_bools_and_ints():
    want = twin.threshold_topk(_ROW, 2, True, 12288, 132, 1)
    got = twin.threshold_topk(_ROW, np.int64(2), np.bool_(True), np.int32(12288), np.int64(132), np.int8(1))
    assert got.ids.tolist() == want.ids.tolist() == [99, 98]


# -- the layout for every K up to the vocabulary; the hypergeometric tail ------------------------------------
@pytest.mark.parametrize("vocab", [4100, 4111, 8191, 5000])
def test_m1_every_k_up_to_vocab_has_a_layout_and_an_exact_twin(vocab):
    """M1: K within 15 of a vocabulary above 4,096 that is not a multiple of 16 raised a
    ValueError about hypergeom_tail's arguments; now K - 1 is clamped to the sampled population."""
    rng = np.random.default_rng(vocab)
    row = rng.standard_normal(vocab).astype(np.float32)
    for k in (vocab - 15, vocab - 1, vocab):
        m = tk.sample_rank(k, vocab)
        assert 1 <= m <= tk.SAMPLE_VALUES
        assert tk.sample_slack(k, vocab) >= 0 and tk.candidate_capacity(k, vocab, 12288) >= 256
        r = threshold_topk(row, k)
        ids, lp, _ = ref.topk_logprobs(row[None], k)
        np.testing.assert_array_equal(r.ids, ids[0])


def test_l2_layout_arguments_are_ints():
    with pytest.raises(TypeError, match="k must be a positive int"):
        tk.sample_rank(5.7, 10000)
    with pytest.raises(TypeError, match="k must be a positive int"):
        tk.sample_rank(True, 10000)
    with pytest.raises(ValueError, match="k must be a positive int, got 0"):
        tk.sample_rank(0, 10000)
    with pytest.raises(TypeError, match="vocab must be a positive int"):
        tk.sample_rank(16, 163840.0)
    with pytest.raises(TypeError, match="population"):
        tk.hypergeom_tail(100.5, 3, 10)
    with pytest.raises(TypeError, match="successes"):
        tk.hypergeom_tail(100, False, 10)
    with pytest.raises(ValueError, match="draws"):
        tk.hypergeom_tail(100, 3, -1)
    assert tk.sample_rank(np.int64(256), np.int32(163840)) == 23


def test_l1_tail_accuracy_over_the_documented_range():
    """The docstring's claim: ~1e-8 relative up to a few million, ~1e-6 at 1e9."""
    for n, tol in ((163840, 1e-8), (4_000_000, 1e-8), (10**9, 1e-5)):
        t = tk.hypergeom_tail(n, 3, 4096)[1]
        exact = 1 - Fraction(comb(n - 3, 4096), comb(n, 4096))
        assert abs(t / float(exact) - 1) < tol, n


def test_review39_twin_helpers_refuse_what_they_would_misread():
    """Review 39: sample_values(list) raised an AttributeError and took the string "no" as bf16=True;
    kth_largest_bound of no keys raised numpy's zero-size error."""
    row = np.random.default_rng(0).standard_normal(5000).astype(np.float32)
    with pytest.raises(TypeError, match="bf16 must be a bool, got str"):
        twin.sample_values(row, "no")
    with pytest.raises(TypeError, match="row must be a 1-D numpy array, got list"):
        twin.sample_values(row.tolist(), False)
    with pytest.raises(ValueError, match="row must be 1-D"):
        twin.sample_values(row.reshape(50, 100), False)
    assert np.array_equal(twin.sample_values(row, np.bool_(False)), twin.sample_values(row, False))
    with pytest.raises(ValueError, match="kth_largest_bound: no key >= cut"):
        twin.kth_largest_bound([], 1, 0)


# -- the key and bin helpers' domains (a tester's findings) ------------------------------------------------------

def test_key_to_f32_takes_uint32_values_and_refuses_the_rest():
    """key_to_f32([-1]) raised numpy's OverflowError and key_to_f32(np.array([1.5])) returned NaN: keys
    are integers in [0, 2**32 - 1], any integer dtype or a list; the rest is refused by name."""
    rng = np.random.default_rng(9)
    x = (rng.standard_normal(64) * 1e3).astype(np.float32)
    keys = twin.order_keys(x)
    for k in (keys, keys.astype(np.int64), keys.astype(np.uint64), keys.tolist()):
        np.testing.assert_array_equal(twin.key_to_f32(k), x)
    assert twin.key_to_f32(keys.reshape(8, 8)).shape == (8, 8) and twin.key_to_f32([]).shape == (0,)
    assert np.isneginf(twin.key_to_f32(twin.KEY_NEG_INF)) and twin.key_to_f32(0x80000000).item() == 0.0
    assert twin.key_to_f32(0xFF800000).item() == np.inf  # the largest value's key, 2**32 - 1 is in range
    assert np.isnan(twin.key_to_f32(0xFFFFFFFF))
    for bad, value in (([-1], -1), ([2**32], 2**32), (np.array([5, -3], np.int8), -3),
                       (np.array([2**64 - 1], np.uint64), 2**64 - 1), ([2**70], 2**70), ([-1, 2**63], -1)):
        with pytest.raises(ValueError, match=rf"keys must be uint32 values in \[0, 2\*\*32 - 1\], got {value}$"):
            twin.key_to_f32(bad)
    for bad in (np.array([1.5]), [1.0], 1.5, [True], "abc"):
        with pytest.raises(TypeError, match="keys must be integers"):
            twin.key_to_f32(bad)


def test_log_bins_refuse_values_outside_their_domain():
    """log_bin([-1]) and log_bin_lo(-1) returned -1 (no bin): d is a distance in [0, 2**53) (exact in
    float64), a bin of a u64 d is in [0, 495], and log_bin_hi takes the histogram's 512 bins."""
    rng = np.random.default_rng(10)
    ds = np.concatenate([rng.integers(0, 2**53, 200), [0, 15, 16, 2**53 - 1]])
    np.testing.assert_array_equal(twin.log_bin(ds), [_log_bin_py(int(d)) for d in ds])
    np.testing.assert_array_equal(twin.log_bin(ds.astype(np.uint64)), twin.log_bin(ds))
    assert twin.log_bin(2**53 - 1) == 407 and twin.log_bin_lo(495) == 15 << 60
    assert twin.log_bin_hi(494) == (15 << 60) - 1 and twin.log_bin_hi(np.int64(511)) == (1 << 64) - 1
    for bad, value in (([-1], -1), (np.array([3, 2**53]), 2**53), (np.array([2**63], np.uint64), 2**63)):
        with pytest.raises(ValueError, match=rf"{'d must fit int64' if value == 2**63 else 'd must be in'}.* {value}$"):
            twin.log_bin(bad)
    with pytest.raises(TypeError, match="d must be integers, got dtype float64"):
        twin.log_bin(np.array([1.5]))
    for f, hi in ((twin.log_bin_lo, 495), (twin.log_bin_hi, 511)):
        for bad in (-1, hi + 1):
            with pytest.raises(ValueError, match=rf"b must be an int in 0 \.\. {hi}, got {bad}"):
                f(bad)
        for bad in (1.0, True, "3"):
            with pytest.raises(TypeError, match=rf"b must be an int in 0 \.\. {hi}"):
                f(bad)


def test_sample_threshold_and_kth_largest_bound_refuse_what_they_would_misread():
    """A fresh user's review (seventy-third session): sample_threshold read uint16 bf16 bits as
    integers and took int64 rows and k > vocab; kth_largest_bound took need past its keys (a bound
    that breaks its own contract), need < 1, a negative slack, and truncated float keys."""
    row = np.random.default_rng(1).standard_normal(20_000).astype(np.float32)
    bits = f32_to_bf16_bits(row)
    widened = bf16_bits_to_f32(bits)
    assert twin.sample_threshold(bits, 64) == twin.sample_threshold(widened, 64, True)  # bits read as bf16
    assert twin.sample_threshold(np.array([0x3F80, 0x4000], np.uint16), 1)[0] == np.float32(2.0)
    with pytest.raises(TypeError, match="row must be a float array"):
        twin.sample_threshold(np.arange(10), 1, False)
    with pytest.raises(ValueError, match="k"):
        twin.sample_threshold(np.zeros(10, np.float32), 50, False)
    keys = twin.order_keys(np.float32([1, 2, 3, 4]))
    assert int((keys >= twin.kth_largest_bound(keys, 4, 0)).sum()) == 4  # need = every key: allowed
    for need, exc in ((10, ValueError), (0, ValueError), (-3, ValueError), (2.5, TypeError), (True, TypeError)):
        with pytest.raises(exc, match="^need must be an int in 1 .. 4"):
            twin.kth_largest_bound(keys, need, 0)
    with pytest.raises(ValueError, match="^slack must be an int"):
        twin.kth_largest_bound(keys, 1, -1)
    with pytest.raises(TypeError, match="keys must be integers"):
        twin.kth_largest_bound(np.array([1.5, 2.7]), 1, 0)
    with pytest.raises(ValueError, match="uint32"):
        twin.kth_largest_bound(np.array([-1, 5]), 1, 0)


def test_threshold_topk_bf16_flag_agrees_with_the_row():
    """A fresh user's review (seventy-third session): bf16=False on a bf16 row sampled it as fp32,
    and bf16=True on a float row whose values are no bf16 values gave a T the kernels never make;
    a merge capacity below k came back as a result that refine_threshold then refused."""
    row = np.random.default_rng(2).standard_normal(20_000).astype(np.float32)
    bits = f32_to_bf16_bits(row)
    widened = bf16_bits_to_f32(bits)
    a, b = twin.threshold_topk(bits, 64), twin.threshold_topk(widened, 64, True)
    assert a.threshold == b.threshold and a.ids.tolist() == b.ids.tolist()
    assert twin.threshold_topk(widened, 64).threshold == twin.threshold_topk(widened, 64, False).threshold
    with pytest.raises(ValueError, match="bf16=False"):
        twin.threshold_topk(bits, 64, False)
    with pytest.raises(ValueError, match=r"^bf16=True, but row\[0\] = "):
        twin.threshold_topk(row + np.float32(1e-3), 64, True)
    with pytest.raises(ValueError, match="^k = 300 needs a candidate capacity >= k; merge_capacity 256 gives 256$"):
        twin.threshold_topk(row, 300, merge_capacity=256)
    assert twin.ThresholdResult.__doc__ and "Attributes" in twin.ThresholdResult.__doc__
