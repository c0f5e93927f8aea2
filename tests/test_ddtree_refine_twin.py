"""``refine_row`` (cu/ddtree/build.cuh) through its numpy twin (CPU only).

A threshold row whose sampled ``T`` failed gets a threshold ``T'`` of its own in its
``ddtree_build`` CTA: windows of keys below ``T`` appended to the stream's list while it holds
fewer than ``K``, else a radix select on the order keys. The twin
(:func:`driverlevel.reference.topk_threshold.refine_threshold`) follows it window by window and
level by level; here it is checked against brute force on small rows of every kind (ties,
negative values, zeros of both signs, NaN, infinities): whenever it finds ``T'``, exactly the
count it reports lies >= ``T'``, between ``K`` and the capacity, so the list holds the top ``K``;
and it hands the row to the chunk top-K exactly for the documented reasons. The GPU fallback
test's rows take the paths that test expects, and a clustered drafter row takes one read.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from bench_util import load_bench
from driverlevel._dtypes import bf16_bits_to_f32, f32_to_bf16_bits
from driverlevel._topk_threshold import sample_tokens
from driverlevel.reference import topk_threshold as twin

REPO = Path(__file__).resolve().parents[1]


def test_the_twins_constants_are_the_kernels():
    src = (REPO / "cu" / "ddtree" / "build.cuh").read_text()
    for name in ("REFINE_BINS", "REFINE_BIN_BITS", "REFINE_WIDTH", "REFINE_APPEND_WIDTH", "REFINE_APPEND_WINDOWS",
                 "REFINE_LEVELS"):
        m = re.search(rf"constexpr (?:int|u32) {name} = ([^;]+);", src)
        assert m, name
        value = eval(m.group(1).replace("1u <<", "1 <<"), {})  # e.g. "1u << 24"
        assert value == getattr(twin, name), name


def oracle(x, k, t, cap):
    """None (and why) where no T' can serve or the kernel refuses the row, else the K-th key."""
    if not np.isfinite(t):
        return "T not finite"
    with np.errstate(invalid="ignore", over="ignore"):
        if ((x - np.float32(t)) >= np.float32(80.0)).any():
            return "the stream's sums are not finite"
    keys = np.sort(twin.order_keys(x).astype(np.int64))[::-1]
    if (keys > twin.KEY_NEG_INF).sum() < k:
        return "fewer than K logits above -inf"
    kth = keys[k - 1]
    if (keys >= kth).sum() > cap:
        return "more than capacity logits tie with the K-th largest"
    return int(kth)


def _row_kinds(rng, v):
    ids = np.arange(v)
    return {
        "normal": rng.standard_normal(v) * 2,
        "integers": np.round(rng.standard_normal(v) * 2),
        "negative": rng.standard_normal(v) - 30,
        "zeros of both signs": np.where(rng.random(v) < 0.5, -0.0, 0.0) + (rng.random(v) < 0.01) * rng.standard_normal(v),
        "tiny": rng.standard_normal(v) * 1e-30,
        "with NaN and -inf": np.where(rng.random(v) < 0.3, np.nan, np.where(rng.random(v) < 0.3, -np.inf,
                                                                               rng.standard_normal(v))),
        "mostly NaN": np.where(rng.random(v) < 0.995, np.nan, rng.standard_normal(v)),
        "constant": np.full(v, 1.25),
        "a +inf": np.where(ids == v // 3, np.inf, rng.standard_normal(v)),
        "clustered runs": rng.standard_normal(v) + 8 * ((ids // 16) % 37 == 5),
        "bf16 coarse": bf16_bits_to_f32(f32_to_bf16_bits(rng.standard_normal(v).astype(np.float32) * 3)),
        "wide": rng.standard_normal(v) * 1e4,
    }


@pytest.mark.parametrize("seed", range(3))
def test_refine_threshold_against_brute_force(seed):
    rng = np.random.default_rng(seed)
    v = 3000
    seen = set()
    for name, x in _row_kinds(rng, v).items():
        x = np.asarray(x, np.float32)
        finite = np.sort(x[np.isfinite(x)])[::-1]
        for k in (1, 7, 64):
            for cap in (k, 2 * k + 3, 4 * k + 100):
                kth = finite[k - 1] if finite.size >= k else np.float32(0)
                # T from above the K-th (count < K), far below it (count > capacity), and odd ones
                for t in (kth + np.float32(0.01) * (1 + abs(kth)), np.float32(np.nextafter(kth, np.inf)),
                          kth - np.float32(50), np.float32(-1e30), np.float32(finite[0] if finite.size else 1) + 1,
                          np.float32(np.inf), np.float32(np.nan)):
                    t = np.float32(t)
                    with np.errstate(invalid="ignore"):
                        count = int((x >= t).sum())
                    if k <= count <= cap and np.isfinite(t):
                        continue  # the threshold held: the row never reaches refine_row
                    r = twin.refine_threshold(x, k, t, count, cap)
                    want = oracle(x, k, t, cap)
                    where = f"{name}, k={k}, cap={cap}, T={t!r}, count={count}"
                    if isinstance(want, str):
                        assert r.threshold is None and r.reason == want, f"{where}: {r} want {want}"
                        seen.add(want)
                        continue
                    assert r.threshold is not None, f"{where}: {r}"
                    keys = twin.order_keys(x).astype(np.int64)
                    tkey = int(twin.order_keys(np.array([r.threshold], np.float32))[0])
                    n = int((keys >= tkey).sum())
                    assert n == r.count and k <= n <= cap, f"{where}: {r}, {n} keys >= T'"
                    assert tkey <= want, f"{where}: T' above the K-th largest"
                    # at most 4 appends, 3 radix levels widening down and 3 narrowing (32 key
                    # bits, 11 a level), and the listing read
                    assert 1 <= r.reads <= 11, f"{where}: {r}"
                    seen.add("refined")
    assert {"refined", "T not finite", "fewer than K logits above -inf",
            "more than capacity logits tie with the K-th largest", "the stream's sums are not finite"} <= seen


@pytest.mark.parametrize("bf16", [False, True])
def test_the_gpu_fallback_tests_rows_take_their_paths(bf16):
    """tests/test_ddtree_gpu.py::test_threshold_fallback_rows_are_exact's rows (129,280 tokens,
    K = 256): the ones it checks as refined are, the others take the chunk top-K; the row whose
    K-th largest lies far below T widens the appends."""
    v, k = 129_280, 256
    rng = np.random.default_rng(5)
    sampled = sample_tokens(v, bf16)
    base = rng.standard_normal(v).astype(np.float32) * 2.0
    rows = {"sampled +50": base.copy(), "sampled -50": base.copy(), "96 sampled +50": base.copy(),
            "negative, sampled -50": base - 20.0, "constant": np.full(v, 1.25, np.float32),
            "flat with spikes": np.zeros(v, np.float32), "NaN": np.full(v, np.nan, np.float32)}
    rows["sampled +50"][sampled] += 50.0
    rows["sampled -50"][sampled] -= 50.0
    rows["96 sampled +50"][sampled[:96]] += 50.0
    rows["negative, sampled -50"][sampled] -= 50.0
    rows["flat with spikes"][rng.choice(v, 100, replace=False)] = 7.0
    got = {}
    for name, x in rows.items():
        if bf16:
            x = bf16_bits_to_f32(f32_to_bf16_bits(x))
        r = twin.threshold_topk(x, k, bf16, 512 * 24, 132, 12)
        assert r.fallback, name
        got[name] = twin.refine_threshold(x, k, r.threshold, r.count, r.capacity)
    for name in ("sampled +50", "sampled -50", "96 sampled +50", "negative, sampled -50"):
        assert got[name].threshold is not None, (name, got[name])
    # its K-th largest just below T, but the first window holds most of the ~4,000 sampled
    # logits: past the capacity, so one radix level and the listing read follow
    assert got["sampled +50"].reads == 3
    # far below T: three append windows, the third past the capacity, so the radix select starts on
    # that window (one level) and the listing read follows (it had restarted from T: six reads)
    assert got["96 sampled +50"].reads == 5
    assert got["constant"].reason == got["flat with spikes"].reason == \
        "more than capacity logits tie with the K-th largest"
    assert got["NaN"].reason == "T not finite"


@pytest.mark.parametrize("bf16", [False, True])
def test_a_clustered_rows_failed_threshold_takes_one_read(bf16):
    """bench_ddtree --drafter clustered's rows (512 large logits in runs of 16 ids over the random
    rows) whose threshold fails, where the sample caught runs and T came out too high: the first
    window below T holds the K-th largest, one read of the row."""
    bench = load_bench("bench_ddtree")
    k, failed = 256, 0
    x, _ = bench.drafter_logits(np.random.default_rng(0), 8, "clustered")  # (fp32: 1 row fails, bf16: 2)
    for b in range(8):
        for row in x[b]:
            if bf16:
                row = bf16_bits_to_f32(f32_to_bf16_bits(row))
            r = twin.threshold_topk(row, k, bf16, 512 * 24, 132, 120)
            if r.fallback:
                assert r.count < k
                got = twin.refine_threshold(row, k, r.threshold, r.count, r.capacity)
                assert got.threshold is not None and got.reads == 1, (b, r.threshold, r.count, got)
                failed += 1
    assert failed >= 1, "no clustered row failed"


def test_refine_threshold_names_bad_arguments():
    x = np.zeros(10, np.float32)
    with pytest.raises(ValueError, match="capacity"):
        twin.refine_threshold(x, 5, 1.0, 0, 4)
    with pytest.raises(ValueError, match="count"):
        twin.refine_threshold(x, 5, 1.0, -1, 8)
    with pytest.raises(TypeError):
        twin.refine_threshold(x, 5, 1.0, 1.5, 8)


def test_refine_threshold_refuses_a_threshold_or_count_it_would_misread():
    """A fresh user's review (seventy-third session): None became NaN ('T not finite'), a string
    and True were read as numbers, a list leaked numpy's ambiguity error, 1e40 leaked an overflow
    warning; a count that disagreed with the row came back as the refined count, and a row whose
    threshold held was refined all the same."""
    x = np.random.default_rng(0).standard_normal(10_000).astype(np.float32)
    n_ge = int((x >= np.float32(2.5)).sum())
    for bad in (None, "2.5", True, np.bool_(False), [2.5, 3.0], np.array([2.5])):
        with pytest.raises(TypeError, match="^threshold must be a real number"):
            twin.refine_threshold(x, 4, bad, 0, 100)
    with np.errstate(all="raise"):  # no warning leaks: an error is raised first
        with pytest.raises(ValueError, match="beyond float32's range"):
            twin.refine_threshold(x, 4, 1e40, 0, 100)
    assert twin.refine_threshold(x, 4, float("nan"), 0, 100).reason == "T not finite"
    assert twin.refine_threshold(x, 4, np.float32(np.inf), 0, 100).reason == "T not finite"
    with pytest.raises(ValueError, match=f"^count 0 disagrees with the row: {n_ge} logits are >= T = 2.5$"):
        twin.refine_threshold(x, 200, 2.5, 0, 1000)
    with pytest.raises(ValueError, match="threshold held"):
        twin.refine_threshold(x, 10, 2.5, n_ge, 1000)
    r = twin.refine_threshold(x, 200, 2.5, n_ge, 1000)  # the true count: refined, and its count is the row's
    assert r.threshold is not None and r.count == int((x >= r.threshold).sum()) and 200 <= r.count <= 1000
    assert twin.refine_threshold(x, 200, 3, int((x >= 3).sum()), 1000).threshold is not None  # an int T
