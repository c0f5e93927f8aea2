// ddtree/keys.cuh: order keys of path scores, the logit keys of logit_keys.cuh taken into namespace
// ddt, the exact block-wide select (k-th largest) that the chunk top-K and the row merge share, and
// its cheaper bound (a key with at least k, and not many more, values at or above it) that the
// threshold top-K's sample takes.
//
// Part of the one translation unit cu/ddtree.cu (see its header for the kernels).
#pragma once
#include "params.cuh"
#include "logit_keys.cuh"

namespace ddt {

// ------------------------------------------------------------------------------ keys

// Logit order keys, (key, id) composites and logit loads: logit_keys.cuh (shared with argmax.cu).
using dl::f32_key;
using dl::key_f32;
using dl::KEY_NEG_INF;
using dl::logit_key;
using dl::composite;
using dl::composite_id;
using dl::LogitTraits;

// Order-preserving u64 of a float64 path key (larger key -> larger score); valid scores
// are never 0 (0 marks an empty entry).
DL_DEVICE u64 enc_key(double k) {
  u64 b = static_cast<u64>(__double_as_longlong(k));
  if (b == 0x8000000000000000ull) b = 0ull;
  return (b >> 63) ? ~b : (b | 0x8000000000000000ull);
}
DL_DEVICE double dec_key(u64 s) {
  return __longlong_as_double(static_cast<long long>((s >> 63) ? (s & 0x7fffffffffffffffull) : ~s));
}

// ------------------------------------------------------------------------------ exact select
// The need-th largest (with multiplicity) of a block's values v = get(j) (u32 or u64; 0 =
// none) among those >= cut. Works on d = vmax - v (smallest d first): a histogram of
// log-spaced bins (8 per octave), then 256-bin linear refinements of the bin holding the
// answer, until that bin holds one value or at most 32 elements, which one warp ranks.
// linear: the first level takes 512 linear bins of [0, vmax - cut] instead of the log bins, for
// values known to lie in a narrow range above cut (the row merge's threshold candidates: one
// level then usually leaves the need-th's bin with a few values, where the log bins took two).
// Precondition: count(v >= cut) >= need >= 1 and vmax >= every value.
// get(j, salt) must add `salt` (0, read from shared memory at each level) into its
// result, so that the compiler recomputes values instead of keeping E of them live.
// Only j < ecount (<= E, the same in every thread) is visited: the other slots hold none.

struct SelectSmem {
  u32 hist[512];
  u64 gather[32];
  u64 lo, hi, vmax, cut;
  int need, count, gcount, salt;  // salt: always 0, read volatile (see kth_largest)
#if defined(DL_STAMPS) && DL_STAMPS
  int levels;  // stamped builds only: the last kth_largest's histogram levels + 64 x the values it gathered
#endif
};

DL_DEVICE int log_bin(u64 d) {
  if (d < 16) return static_cast<int>(d);
  const int e = 63 - __clzll(static_cast<long long>(d));
  return 16 + (e - 4) * 8 + static_cast<int>((d >> (e - 3)) & 7);
}
DL_DEVICE u64 log_bin_lo(int b) {
  if (b < 16) return static_cast<u64>(b);
  const int e = 4 + (b - 16) / 8;
  return static_cast<u64>(8 + (b - 16) % 8) << (e - 3);
}
DL_DEVICE u64 log_bin_hi(int b) { return b >= 495 ? ~0ull : log_bin_lo(b + 1) - 1; }

// Warp 0: find the bin where the running count (bins in order) reaches sm.need.
DL_DEVICE void find_bin(SelectSmem& sm, int* bin_out, int* before_out) {
  const int lane = threadIdx.x & 31;
  u32 own = 0;
#pragma unroll
  for (int i = 0; i < 16; ++i) own += sm.hist[lane * 16 + i];
  u32 incl = own;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const u32 y = __shfl_up_sync(FULL, incl, o);
    if (lane >= o) incl += y;
  }
  const u32 need = static_cast<u32>(sm.need);
  const u32 hit = __ballot_sync(FULL, incl >= need && incl - own < need);
  const int src = __ffs(hit) - 1;
  int bin = 0, before = 0;
  if (lane == src) {
    u32 run = incl - own;
    for (int i = 0; i < 16; ++i) {
      const u32 h = sm.hist[lane * 16 + i];
      if (run + h >= need) { bin = lane * 16 + i; break; }
      run += h;
    }
    before = static_cast<int>(run);
  }
  *bin_out = __shfl_sync(FULL, bin, src);
  *before_out = __shfl_sync(FULL, before, src);
}

// One select level's narrowing, between the histogram's barrier and the next: warp 0 finds the
// bin where the running count reaches need (= sm.need), thread 0 narrows sm.lo / sm.hi to the bin's d range
// (log bins when shift < 0; log_bin_hi of the last bins is ~0: clamped to hi), sets sm.need to the
// rank inside the bin and sm.count to the bin's population. The __syncwarp orders warp 0's reads of
// sm.need before thread 0 overwrites it: the shuffles between them order registers, not memory
// (compute-sanitizer's racecheck reported the pair as an intra-warp hazard).
template <typename U>
DL_DEVICE void narrow_to_bin(SelectSmem& sm, U lo, U hi, int need, int shift) {
  if (threadIdx.x < 32) {
    int bin, before;
    find_bin(sm, &bin, &before);
    __syncwarp();
    if (threadIdx.x == 0) {
      u64 nlo, nhi;
      if (shift < 0) {
        nlo = log_bin_lo(bin);
        nhi = log_bin_hi(bin);
      } else {
        nlo = lo + (static_cast<u64>(bin) << shift);
        nhi = nlo + ((1ull << shift) - 1);
      }
      sm.lo = nlo > lo ? nlo : static_cast<u64>(lo);
      sm.hi = nhi < hi ? nhi : static_cast<u64>(hi);
      sm.need = need - before;
      sm.count = static_cast<int>(sm.hist[bin]);
    }
  }
}

// One value into the level's histogram of d = vmax - v (log bins when shift < 0, else bins of
// 2^shift from lo); values below cut or outside [lo, hi] are not counted.
template <typename U>
DL_DEVICE void count_in_bin(SelectSmem& sm, U v, U vmax, U cut, U lo, U hi, int shift) {
  const U d = vmax - v;
  if (v >= cut && d >= lo && d <= hi)
    atomicAdd(&sm.hist[shift < 0 ? log_bin(d) : static_cast<int>((d - lo) >> shift)], 1u);
}

// The end of one select level (every thread, after its count_in_bin calls): the histogram is
// complete after the first barrier, narrow_to_bin's results are in sm after the second.
template <typename U>
DL_DEVICE void select_level(SelectSmem& sm, U lo, U hi, int need, int shift) {
  if (threadIdx.x == 0) sm.need = need;
  __syncthreads();
  narrow_to_bin(sm, lo, hi, need, shift);
  __syncthreads();
}

template <int T, int E, typename U, class Get>
DL_DEVICE U kth_largest(const Get& get, U vmax_in, U cut_in, int need, SelectSmem& sm, int ecount = E,
                        bool linear = false) {
  U lo = 0, hi = vmax_in - cut_in;
  int shift = -1;  // -1: log bins
  if (linear) {
    const int bits = 64 - __clzll(static_cast<long long>(hi));
    shift = bits > 9 ? bits - 9 : 0;
  }
  if (threadIdx.x == 0) { sm.vmax = vmax_in; sm.cut = cut_in; sm.salt = 0; }
#if defined(DL_STAMPS) && DL_STAMPS
  int levels = 0;  // (thread 0 records them in sm.levels; its stamps read them)
#endif
  while (true) {
    for (int i = threadIdx.x; i < 512; i += T) sm.hist[i] = 0;
    __syncthreads();
    // Re-read every level: keeps the compiler from hoisting E per-element values into registers.
    const U vmax = static_cast<U>(*reinterpret_cast<volatile u64*>(&sm.vmax));
    const U cut = static_cast<U>(*reinterpret_cast<volatile u64*>(&sm.cut));
    const int salt = *reinterpret_cast<volatile int*>(&sm.salt);
#pragma unroll
    for (int j = 0; j < E; ++j) {
      if (j >= ecount) break;
      count_in_bin(sm, get(j, salt), vmax, cut, lo, hi, shift);
    }
    select_level(sm, lo, hi, need, shift);
    lo = static_cast<U>(sm.lo);
    hi = static_cast<U>(sm.hi);
    need = sm.need;
    const int count = sm.count;
#if defined(DL_STAMPS) && DL_STAMPS
    if (threadIdx.x == 0) sm.levels = ++levels;
#endif
    __syncthreads();
    if (lo == hi) return vmax - lo;
    if (count <= 32) break;
    const int bits = 64 - __clzll(static_cast<long long>(hi - lo));
    shift = bits > 8 ? bits - 8 : 0;
  }
  if (threadIdx.x == 0) sm.gcount = 0;
  __syncthreads();
  const U vmax = static_cast<U>(*reinterpret_cast<volatile u64*>(&sm.vmax));
  const U cut = static_cast<U>(*reinterpret_cast<volatile u64*>(&sm.cut));
  const int salt = *reinterpret_cast<volatile int*>(&sm.salt);
#pragma unroll
  for (int j = 0; j < E; ++j) {
    if (j >= ecount) break;
    const U v = get(j, salt);
    const U d = vmax - v;
    if (v >= cut && d >= lo && d <= hi) sm.gather[atomicAdd(&sm.gcount, 1)] = d;
  }
  __syncthreads();
  if (threadIdx.x < 32) {  // the need-th smallest gathered d (equal d ordered by slot)
    const int lane = threadIdx.x;
    const u64 mine = lane < sm.gcount ? sm.gather[lane] : ~0ull;
    int rank = 0;
    for (int i = 0; i < 32; ++i) {
      const u64 o = __shfl_sync(FULL, mine, i);
      rank += o < mine || (o == mine && i < lane);
    }
    if (lane < sm.gcount && rank == need - 1) sm.lo = mine;
#if defined(DL_STAMPS) && DL_STAMPS
    if (lane == 0) sm.levels = levels + 64 * sm.gcount;
#endif
  }
  __syncthreads();
  const U r = vmax - static_cast<U>(sm.lo);
  __syncthreads();
  return r;
}

// ------------------------------------------------------------------------------ bounded select
// A lower bound of the need-th largest (with multiplicity) of a block's values v = get(j) >= cut
// that admits at most `slack` more: with n(t) = count(v >= t), the result t has
//   need <= n(t) <= max(need + slack, n(the need-th largest)),
// so only values tied with the need-th largest can take n(t) past need + slack. kth_largest's
// levels without its gather: the log bins of d = vmax - v, then 256-bin linear refinements of
// the bin holding the need-th, stopping at the first level whose bin, taken whole, holds at most
// `slack` values past the need-th (or one d): t = vmax - (the bin's largest d), the lowest value
// the bin can hold, so every value of the bin and above counts. With a slack of a few standard
// deviations of the sample (the threshold top-K: driverlevel._topk_threshold.sample_slack)
// the first level stops on most rows (its bins are 1/16 to 1/8 of d wide); rows where such a
// bin is far wider in value refine like kth_largest: the need-th below 0 while vmax is above 0
// (d then spans the keys of every float magnitude in between: a bin covers octaves of values),
// or vmax a sampled outlier or +inf far above the rest.
// Preconditions: those of kth_largest, slack >= 0, and sm.hist all zero (the caller zeroes it
// before a barrier, e.g. under its block max: this saves the first level's). The values stay in
// the caller's registers: get(j) takes no salt. Every thread gets t; sm.hist is left dirty, and
// sm may be reused only after a barrier.
template <int T, int E, typename U, class Get>
DL_DEVICE U kth_largest_bound(const Get& get, U vmax, U cut, int need, int slack, SelectSmem& sm) {
  U lo = 0, hi = vmax - cut;
  int shift = -1;  // -1: log bins
  while (true) {
#pragma unroll
    for (int j = 0; j < E; ++j) {
      const U v = get(j);
      count_in_bin(sm, v, vmax, cut, lo, hi, shift);
    }
    // select_level written out: through the helper ptxas schedules the sample kernels differently
    // (code_sections) from the build measured on the H200
    if (threadIdx.x == 0) sm.need = need;
    __syncthreads();
    narrow_to_bin(sm, lo, hi, need, shift);
    __syncthreads();
    lo = static_cast<U>(sm.lo);
    hi = static_cast<U>(sm.hi);
    need = sm.need;  // the need-th's rank inside the bin: count - need values of the bin are past it
    if (lo == hi || sm.count - need <= slack) return vmax - hi;  // hi <= vmax - cut: no wrap
    // (uniform) refine: warp 0 has read the histogram; the next level's writes of sm follow
    // this barrier and the next, so every thread has read lo, hi, need and count by then
    for (int i = threadIdx.x; i < 512; i += T) sm.hist[i] = 0;
    __syncthreads();
    const int bits = 64 - __clzll(static_cast<long long>(hi - lo));
    shift = bits > 8 ? bits - 8 : 0;
  }
}

}  // namespace ddt
