// ddtree/keys.cuh: order keys of logits and path scores, (key, id) composites, logit loads, and the
// exact block-wide select (k-th largest) that the chunk top-K and the row merge share.
//
// Part of the one translation unit cu/ddtree.cu (see its header for the kernels).
#pragma once
#include "params.cuh"

namespace ddt {

// ------------------------------------------------------------------------------ keys

// Order-preserving u32 of a float: larger float -> larger key; -0 and +0 map alike.
DL_DEVICE u32 f32_key(float x) {
  u32 b = __float_as_uint(x);
  if (b == 0x80000000u) b = 0u;
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
DL_DEVICE float key_f32(u32 k) { return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k); }
// The one rule of every top-K and argmax of the package: NaN counts as -inf (ids stay in range
// and distinct; a row with nothing above -inf is "not finite"). The key of a loaded logit:
constexpr u32 KEY_NEG_INF = 0x007fffffu;  // f32_key(-inf): the smallest key a logit can have (never 0)
DL_DEVICE u32 logit_key(float x) {
  const u32 b = __float_as_uint(x);
  return (b & 0x7fffffffu) > 0x7f800000u ? KEY_NEG_INF : f32_key(x);
}

// (key, id) as one 64-bit value: larger logit first, then lower id. 0 = no candidate.
DL_DEVICE u64 composite(u32 key, int id) { return (static_cast<u64>(key) << 32) | static_cast<u32>(~id); }
DL_DEVICE int composite_id(u64 c) { return static_cast<int>(~static_cast<u32>(c)); }

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

template <typename T> struct LogitTraits;
template <> struct LogitTraits<float> {
  static constexpr int VEC = 4;
  DL_DEVICE static void load_vec(const float* p, float (&v)[4]) {
    const float4 q = *reinterpret_cast<const float4*>(p);
    v[0] = q.x; v[1] = q.y; v[2] = q.z; v[3] = q.w;
  }
  DL_DEVICE static float load(const float* p) { return *p; }
};
template <> struct LogitTraits<bf16> {
  static constexpr int VEC = 8;
  DL_DEVICE static void load_vec(const bf16* p, float (&v)[8]) {
    const uint4 q = *reinterpret_cast<const uint4*>(p);
    const u32 w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[2 * i] = __uint_as_float(w[i] << 16);
      v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  }
  DL_DEVICE static float load(const bf16* p) { return __bfloat162float(*p); }
};

// ------------------------------------------------------------------------------ exact select
// The need-th largest (with multiplicity) of a block's values v = get(j) (u32 or u64; 0 =
// none) among those >= cut. Works on d = vmax - v (smallest d first): a histogram of
// log-spaced bins (8 per octave), then 256-bin linear refinements of the bin holding the
// answer, until that bin holds one value or at most 32 elements, which one warp ranks.
// Precondition: count(v >= cut) >= need >= 1 and vmax >= every value.
// get(j, salt) must add `salt` (0, read from shared memory at each level) into its
// result, so that the compiler recomputes values instead of keeping E of them live.
// Only j < ecount (<= E, the same in every thread) is visited: the other slots hold none.

struct SelectSmem {
  u32 hist[512];
  u64 gather[32];
  u64 lo, hi, vmax, cut;
  int need, count, gcount, salt;  // salt: always 0, read volatile (see kth_largest)
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

template <int T, int E, typename U, class Get>
DL_DEVICE U kth_largest(const Get& get, U vmax_in, U cut_in, int need, SelectSmem& sm, int ecount = E) {
  U lo = 0, hi = vmax_in - cut_in;
  int shift = -1;  // -1: log bins
  if (threadIdx.x == 0) { sm.vmax = vmax_in; sm.cut = cut_in; sm.salt = 0; }
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
      const U v = get(j, salt);
      const U d = vmax - v;
      if (v >= cut && d >= lo && d <= hi)
        atomicAdd(&sm.hist[shift < 0 ? log_bin(d) : static_cast<int>((d - lo) >> shift)], 1u);
    }
    if (threadIdx.x == 0) sm.need = need;
    __syncthreads();
    if (threadIdx.x < 32) {
      int bin, before;
      find_bin(sm, &bin, &before);
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
    __syncthreads();
    lo = static_cast<U>(sm.lo);
    hi = static_cast<U>(sm.hi);
    need = sm.need;
    const int count = sm.count;
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
  }
  __syncthreads();
  const U r = vmax - static_cast<U>(sm.lo);
  __syncthreads();
  return r;
}

}  // namespace ddt
