"""A Python model of the row merge's select (cu/ddtree/keys.cuh kth_largest: its histogram levels,
the gather of <= 32 values and the one-warp ranking), thirty-fourth session, for
research/patches/select-composite.patch: the K-th largest (key << 32 | ~id) composite in one 64-bit
select, against sorting (random fp32 and bf16 rows, heavy ties, with and without the threshold's
linear first level), and its levels against today's two 32-bit passes (the key, then the ids of
the composites tied with it).

    python research/probes/select_composite_model.py      (CPU, ~1 minute)

Printed on 2026-12-03: every one of 6,000 rows equal to sorting (at most 6 levels); at K = 256 with
300-1,500 candidates, fp32 1.00 level in both forms, bf16 1.92 levels today (the second pass in
1,382 of 1,500 rows) against 1.00 in one 64-bit select."""

import numpy as np
M64 = (1 << 64) - 1

def clz64(x):
    return 64 - x.bit_length()

def log_bin(d):
    if d < 16: return d
    e = 63 - clz64(d)
    return 16 + (e - 4) * 8 + ((d >> (e - 3)) & 7)

def log_bin_lo(b):
    if b < 16: return b
    e = 4 + (b - 16) // 8
    return ((8 + (b - 16) % 8) << (e - 3)) & M64

def log_bin_hi(b):
    return M64 if b >= 495 else log_bin_lo(b + 1) - 1

def kth_largest(vals, vmax, cut, need, linear):
    lo, hi = 0, (vmax - cut) & M64
    shift = -1
    if linear:
        bits = 64 - clz64(hi)
        shift = bits - 9 if bits > 9 else 0
    levels = 0
    while True:
        levels += 1
        hist = [0] * 512
        for v in vals:
            d = (vmax - v) & M64
            if v >= cut and lo <= d <= hi:
                b = log_bin(d) if shift < 0 else (d - lo) >> shift
                assert 0 <= b < 512, (b, shift)
                hist[b] += 1
        run = 0
        for b in range(512):
            if run + hist[b] >= need: break
            run += hist[b]
        else:
            raise AssertionError("need not reached")
        if shift < 0:
            nlo, nhi = log_bin_lo(b), log_bin_hi(b)
        else:
            nlo = (lo + (b << shift)) & M64
            nhi = (nlo + ((1 << shift) - 1)) & M64
        lo, hi = max(nlo, lo), min(nhi, hi)
        need -= run
        count = hist[b]
        if lo == hi:
            return (vmax - lo) & M64, levels
        if count <= 32: break
        bits = 64 - clz64(hi - lo)
        shift = bits - 8 if bits > 8 else 0
    g = sorted(((vmax - v) & M64) for v in vals if v >= cut and lo <= ((vmax - v) & M64) <= hi)
    assert len(g) <= 32 and len(g) == count
    return (vmax - g[need - 1]) & M64, levels

def f32_key(x):
    u = int(np.float32(x).view(np.uint32))
    return (u ^ 0xffffffff) if (u >> 31) else (u | 0x80000000)

def run(trials, bf16, rng):
    worst = 0
    for t in range(trials):
        K = int(rng.choice([16, 64, 256, 512]))
        n = int(rng.integers(K, min(2048, 4 * K + 200) + 1))
        ids = rng.choice(163840, n, replace=False)
        x = rng.normal(3.0, 0.4, n).astype(np.float32)
        if rng.random() < 0.3:
            x = np.round(x * 4) / 4  # heavy ties
        if bf16:
            x = (x.view(np.uint32) & np.uint32(0xffff0000)).view(np.float32)
        thr = rng.random() < 0.8
        T = np.float32(x.min()) if thr else None
        comps = [(f32_key(v) << 32) | ((~int(i)) & 0xffffffff) for v, i in zip(x, ids)]
        slots = comps + [0] * int(rng.integers(0, 64))
        rng.shuffle(slots)
        kcut = (f32_key(T) - 1) if thr else 1
        cmax = max(slots)
        got, lv = kth_largest(slots, cmax, kcut << 32, K, thr)
        want = sorted(comps, reverse=True)[K - 1]
        assert got == want, (t, K, n, bf16, thr)
        worst = max(worst, lv)
    return worst

M32 = (1 << 32) - 1
def old(comps, K, T, thr):
    keys = [c >> 32 for c in comps]
    vmax = max(keys); kcut = (f32_key(T) - 1) if thr else 1
    tk, l0 = kth_largest(keys, vmax, kcut, K, thr)
    above = sum(k > tk for k in keys if k); ties = sum(k == tk for k in keys)
    need = K - above
    if ties <= need: return l0, 0
    lows = [(c & M32) if (c >> 32) == tk else 0 for c in comps]
    r, l1 = kth_largest(lows, M32, 1, need, False)
    return l0, l1


if __name__ == "__main__":
    rng = np.random.default_rng(34)
    print("fp32: all equal, max levels", run(3000, False, rng))
    print("bf16: all equal, max levels", run(3000, True, rng))
    rng = np.random.default_rng(7)
    for bf16 in (False, True):
        stats = {"old": [], "new": [], "pass1": 0}
        for t in range(1500):
            K = 256; n = int(rng.integers(300, 1500))
            ids = rng.choice(163840, n, replace=False)
            x = rng.normal(3.0, 0.3, n).astype(np.float32)
            if bf16: x = (x.view(np.uint32) & np.uint32(0xffff0000)).view(np.float32)
            T = np.float32(x.min())
            comps = [(f32_key(v) << 32) | ((~int(i)) & M32) for v, i in zip(x, ids)]
            l0, l1 = old(comps, K, T, True)
            c, ln = kth_largest(comps, max(comps), (f32_key(T) - 1) << 32, K, True)
            stats["old"].append(l0 + l1); stats["new"].append(ln); stats["pass1"] += l1 > 0
        o, nn = np.array(stats["old"]), np.array(stats["new"])
        print("bf16" if bf16 else "fp32", "old levels mean %.2f (pass 1 in %d of 1500 rows)" % (o.mean(), stats["pass1"]),
              "new levels mean %.2f" % nn.mean(), "new hist", np.bincount(nn))
