// ddtree/topk_threshold.cuh: stage 1a of topk_mode = 1 (DDTreePlan(topk="threshold")): the
// threshold top-K. ddtree_topk_sample_* picks a per-row threshold T from a stratified sample (at
// least tk_m, at most tk_m + tk_slack sampled logits >= T, ties aside), ddtree_topk_stream_*
// reads every row once through a shared-memory ring and keeps the logits >= T (plus each
// segment's sums of exp(x - T) below and above T); ddtree_build merges the row's list. For a row
// where T failed (fewer than K or more than tk_cap logits >= T, or T not finite) ddtree_build
// first finds a threshold of the row's own and lists it (build.cuh, refine_row), or, where that
// cannot hold (T not finite, ties), runs the chunk top-K (topk.cuh) over the row itself
// (build.cuh, chunk_fallback_row).
// Host-side layout and the numpy twin: driverlevel/_topk_threshold.py,
// driverlevel/reference/topk_threshold.py.
//
// Part of the one translation unit cu/ddtree.cu (see its header for the kernels).
#pragma once
#include "keys.cuh"
#include "stamps.cuh"

namespace ddt {

// ------------------------------------------------------------------------------ shared rule

// The row falls back (in its ddtree_build CTA: refine_row, else the chunk top-K): T not finite
// (flag), or the stream's count n says that the logits >= T do not hold the top K, or that they
// did not fit the candidate list.
DL_DEVICE bool tk_fallback_of(const TopKParams& p, u32 flag, u32 n) {
  return flag != 0u || n < static_cast<u32>(p.k) || n > static_cast<u32>(p.tk_cap);
}

// Re-arms the state ddtree_build relies on, inside every launch, so that a launch left unfinished
// (e.g. an aborted replay) or a poisoned counter cannot break later builds: request b's row
// counter and (b = 0) the build's status word. One thread of the build's first kernel calls it
// (topk_sample, or topk_chunk with topk_mode = 0): an ordinary launch, so every reader from an
// earlier step (ddtree_build, ddtree_compile) has completed, and this build's ddtree_build waits
// for a grid whose completion implies this one's.
DL_DEVICE void rearm_build_state(const TopKParams& p, int b) {
  p.counters[b] = 0u;
  if (b == 0) p.state[3] = 0;
}

DL_DEVICE float ex2_approx(float y) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(y));
  return r;
}
constexpr float LOG2E = 1.4426950408889634f;

DL_DEVICE u32 hash32(u32 i) {  // driverlevel._topk_threshold.hash32
  u32 h = i * 0x9E3779B1u;
  h ^= h >> 16;
  h *= 0x85EBCA6Bu;
  h ^= h >> 13;
  return h;
}

// ------------------------------------------------------------------------------ sample

constexpr int TK_SAMPLE_THREADS = 256;
constexpr int TK_SAMPLE_PER = TK_SAMPLE_VALUES / TK_SAMPLE_THREADS;  // 16 keys per thread
static_assert(TK_SAMPLE_PER == 16, "one 32-byte group of bf16 (two of fp32) per sample thread");

struct SampleSmem {
  SelectSmem sel;
  u64 r64[32];
};

// The row's threshold key (every thread): of the TK_SAMPLE_VALUES sampled logits (a whole row of
// <= TK_SAMPLE_VALUES tokens; else one 32-byte group at a hashed offset in each of
// TK_SAMPLE_VALUES / G strata; the tokens: driverlevel._topk_threshold.sample_groups), a key t
// with at least tk_m and at most tk_m + tk_slack sampled keys >= t (more only when keys tie with
// the tk_m-th largest): kth_largest_bound, t <= the tk_m-th largest. The stream keeps every
// logit >= t and the fallback catches any count outside [K, tk_cap], so the build stays exact
// whatever t is; the host sizes tk_m (count >= K) and tk_cap (count <= tk_cap) for the slack.
template <typename T>
DL_DEVICE u32 sample_threshold(const TopKParams& p, const T* x, SampleSmem& sm) {
  using Tr = LogitTraits<T>;
  constexpr int V = Tr::VEC;
  constexpr int G = 2 * V;                      // tokens of a 32-byte group: 8 fp32, 16 bf16
  constexpr int NS = TK_SAMPLE_VALUES / G;      // strata (groups sampled)
  constexpr int IPT = TK_SAMPLE_PER / G;        // groups per thread: 2 fp32, 1 bf16
  const int tid = threadIdx.x;
  const int vocab = p.vocab;
  u32 key[TK_SAMPLE_PER];  // 0 = no value
  // fp32 (V == 4) triggers PDL here, after its loads are issued (topk_sample); bf16 at its entry:
  // the late trigger cost bf16 0.2-1.1 µs, as its stream is issue-bound (sixty-sixth session).
  constexpr bool LATE = V == 4;
  uint4 raw[IPT][2];       // the common case's 32-byte groups as loaded, keyed after the PDL trigger
  const bool deferred = LATE && vocab > TK_SAMPLE_VALUES && p.logits_vec;
  if (vocab <= TK_SAMPLE_VALUES) {  // the whole row (coalesced)
#pragma unroll
    for (int j = 0; j < TK_SAMPLE_PER; ++j) {
      const int tok = j * TK_SAMPLE_THREADS + tid;
      key[j] = tok < vocab ? logit_key(Tr::load(x + tok)) : 0u;
    }
  } else {
    const i64 ng = vocab / G;  // >= NS here
#pragma unroll
    for (int it = 0; it < IPT; ++it) {
      const int i = tid * IPT + it;
      const i64 lo = i * ng / NS, hi = (i + 1) * ng / NS;
      const i64 tok0 = (lo + static_cast<i64>(hash32(static_cast<u32>(i)) % static_cast<u32>(hi - lo))) * G;
      if (deferred) {
#pragma unroll
        for (int h = 0; h < 2; ++h) raw[it][h] = *reinterpret_cast<const uint4*>(x + tok0 + h * V);
      } else if (!LATE && p.logits_vec) {  // bf16: keyed as loaded
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float v[V];
          Tr::load_vec(x + tok0 + h * V, v);
#pragma unroll
          for (int e = 0; e < V; ++e) key[it * G + h * V + e] = logit_key(v[e]);
        }
      } else {
#pragma unroll
        for (int e = 0; e < G; ++e) key[it * G + e] = logit_key(Tr::load(x + tok0 + e));
      }
    }
  }
  // PDL (common.cuh): the stream kernel may start now, its first tiles queued behind this CTA's
  // loads above (the "memory" clobber keeps them before the trigger, and their values are first
  // used below it) rather than in front of them.
  // Safe: the stream reads nothing this kernel writes before its pdl_wait(), which waits for this
  // whole grid. Every CTA gets here (the loads do not wait for `active`).
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if constexpr (LATE) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  if (deferred) {  // (uniform) the keys of the loads above: the first use of their registers
#pragma unroll
    for (int it = 0; it < IPT; ++it)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float v[V];
        Tr::load_vec(reinterpret_cast<const T*>(&raw[it][h]), v);
#pragma unroll
        for (int e = 0; e < V; ++e) key[it * G + h * V + e] = logit_key(v[e]);
      }
  }
  for (int i = tid; i < 512; i += TK_SAMPLE_THREADS) sm.sel.hist[i] = 0u;  // ordered by the block max's barrier
  u32 kloc = 0;
#pragma unroll
  for (int j = 0; j < TK_SAMPLE_PER; ++j) kloc = key[j] > kloc ? key[j] : kloc;
  const u32 kmax = static_cast<u32>(dl::block_max_u64<TK_SAMPLE_THREADS>(kloc, sm.r64));
  DDT_TK_STAMP(DDT_TK_ROW_SAMPLE, 1, "keys");  // (the keys loaded and their maximum known)
  // tk_m <= the sampled values (host: driverlevel._topk_threshold.sample_rank); every sampled
  // key is >= KEY_NEG_INF (a slot past a short row holds 0: not counted), so t is a logit's key
#if DDT_TWICE_REPS > 1
  // (tools/ddtree_stamps.py --twice, a diagnostic: the select runs twice at one call site, the
  // second time with its code in the SM's instruction caches; "keys" to "exit" then spans both
  // runs, and its excess over the plain stamped build's is the warm select's time)
  u32 t = 0u;
#pragma unroll 1
  for (int rep = 0; rep < DDT_TWICE_REPS; ++rep) {
    if (rep) {  // kth_largest_bound leaves sm.hist dirty and sm in use until a barrier
      __syncthreads();
      for (int i = tid; i < 512; i += TK_SAMPLE_THREADS) sm.sel.hist[i] = 0u;
      __syncthreads();
    }
    t = kth_largest_bound<TK_SAMPLE_THREADS, TK_SAMPLE_PER, u32>(
        [&](int j) -> u32 { return key[j]; }, kmax, KEY_NEG_INF, p.tk_m, p.tk_slack, sm.sel);
  }
  return t;
#else
  return kth_largest_bound<TK_SAMPLE_THREADS, TK_SAMPLE_PER, u32>(
      [&](int j) -> u32 { return key[j]; }, kmax, KEY_NEG_INF, p.tk_m, p.tk_slack, sm.sel);
#endif
}

// One CTA per row: T from the sample, the flag, and the row's candidate count re-armed (every
// launch: no state survives an earlier or aborted one); CTA (0, b) also re-arms the request's
// row counter and (b = 0) the build's status word.
template <typename T>
DL_DEVICE void topk_sample(const TopKParams& p) {
  __shared__ SampleSmem sm;
  const int d = blockIdx.x, b = blockIdx.y, tid = threadIdx.x;
  // PDL (common.cuh): the stream kernel may start now (bf16) or once this CTA's sample loads are
  // issued (fp32: the trigger is in sample_threshold), and issue its first logits tiles. Safe at
  // once: it reads nothing this kernel writes before its pdl_wait(), which waits for this whole
  // grid. This kernel is the build's first, an ordinary launch: all it reads (logits, active) is
  // complete and visible before it starts, so it has no wait of its own.
  if constexpr (LogitTraits<T>::VEC != 4) dl::pdl_launch_dependents();
  DDT_TK_STAMP(DDT_TK_ROW_SAMPLE, 0, "entry");
  // The build's state, for every request, active or not (the stream kernel touches neither word;
  // its CTAs wait for this grid before they exit, and ddtree_build waits for the stream's grid).
  if (d == 0 && tid == 0) rearm_build_state(p, b);
  const size_t row = static_cast<size_t>(b) * p.depth_limit + d;
  // The sample's loads do not wait for `active` (one round trip, not two, before the keys arrive):
  // every CTA samples its row (in bounds: the logits hold max_batch requests), and an inactive
  // request's result is discarded below.
  const bool act = p.active[b];
  const T* x = static_cast<const T*>(p.logits) + static_cast<i64>(b) * p.logits_batch_stride +
               static_cast<i64>(d) * p.logits_row_stride;
  const u32 t = sample_threshold<T>(p, x, sm);
  if (!act) {  // (uniform) the build skips the request
    if (tid == 0) { p.tk_count[row] = 0u; p.tk_flag[row] = 1u; }
    return;
  }
  if (tid == 0) {
    const float tf = key_f32(t);
    p.tk_thresh[row] = tf;
    p.tk_count[row] = 0u;  // the stream kernel counts from here
    p.tk_flag[row] = (t <= KEY_NEG_INF || !isfinite(tf)) ? 1u : 0u;
  }
  DDT_TK_STAMP(DDT_TK_ROW_SAMPLE, 2, "exit");
}

// ------------------------------------------------------------------------------ stream

constexpr int TK_STREAM_WARPS = TK_STREAM_THREADS / 32;

struct StreamSmem {
  u64 stage[TK_STREAM_WARPS][TK_WARP_STAGE];      // the warps' candidate staging
  u32 fill[TK_STREAM_WARPS];                      // fp32: each warp's staged count (positions by atomicAdd)
  double2 wsum[TK_STREAM_WARPS];                  // the warps' (below, above) sums
};

// Warp-uniform: append the warp's staged candidates to the row's list (one atomicAdd).
DL_DEVICE void tk_flush(const u64* stage, int fill, u32* count, u64* out, u32 cap, int lane) {
  __syncwarp();
  u32 base = 0;
  if (lane == 0) base = atomicAdd(count, static_cast<u32>(fill));
  base = __shfl_sync(FULL, base, 0);
  for (int i = lane; i < fill; i += 32)
    if (base + static_cast<u32>(i) < cap) out[base + i] = stage[i];
  __syncwarp();
}

// The raw 32-bit words of one 16-byte vector of logits at token `tok` (V = 4 fp32 or 8 bf16
// tokens; a bf16 word holds tokens 2i (low half) and 2i + 1), by element loads: the rows the
// ring cannot take (unaligned, or a ring of fewer than 2 tiles); tokens at or past `end` read
// as -inf.
template <typename T> DL_DEVICE uint4 tk_load_raw(const T* x, int tok, int end);
template <> DL_DEVICE uint4 tk_load_raw<float>(const float* x, int tok, int end) {
  constexpr u32 NI = 0xff800000u;  // -inf
  u32 w[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) w[e] = tok + e < end ? __float_as_uint(x[tok + e]) : NI;
  return make_uint4(w[0], w[1], w[2], w[3]);
}
template <> DL_DEVICE uint4 tk_load_raw<bf16>(const bf16* x, int tok, int end) {
  const unsigned short* h = reinterpret_cast<const unsigned short*>(x);
  u32 w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const u32 lo = tok + 2 * i < end ? h[tok + 2 * i] : 0xff80u;
    const u32 hi = tok + 2 * i + 1 < end ? h[tok + 2 * i + 1] : 0xff80u;
    w[i] = lo | (hi << 16);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}
DL_DEVICE void tk_unpack(const uint4& q, float (&v)[4]) {
  v[0] = __uint_as_float(q.x); v[1] = __uint_as_float(q.y); v[2] = __uint_as_float(q.z); v[3] = __uint_as_float(q.w);
}
DL_DEVICE void tk_unpack(const uint4& q, float (&v)[8]) {
  const u32 w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) dl::unpack_bf16x2(w[i], v[2 * i], v[2 * i + 1]);
}

// The smallest bf16 value >= thr (finite), as its 16 bits: for a bf16 logit x, x >= thr exactly
// when x >= this value (a bf16 compare, no flush of subnormals: the fp32 compare's result).
// Truncating thr's low 16 bits rounds toward zero: up for a negative thr, down for a positive
// one, which then takes the next bf16 value when bits were cut.
DL_DEVICE u32 tk_bf16_ceil(float thr) {
  u32 h = __float_as_uint(thr) >> 16;
  if (__uint_as_float(h << 16) < thr) h += 1u;
  return h;
}

// 0xffff in each half of the result whose bf16 logit in w (low half: the lower token) is >= the
// bf16 value of each half of t2 (tk_bf16_ceil twice), else 0; NaN is never >=. sm_90+: one
// set.ge.u32.bf16x2 for two logits (PTX ISA, set); before, tk_ge_bf16x2_f32's two fp32 compares
// (compiled on every architecture, so that a GPU test runs it too).
DL_DEVICE u32 tk_ge_bf16x2_f32(u32 w, u32 t2) {
  float lo, hi, tlo, thi;
  dl::unpack_bf16x2(w, lo, hi);
  dl::unpack_bf16x2(t2, tlo, thi);
  return (lo >= tlo ? 0x0000ffffu : 0u) | (hi >= thi ? 0xffff0000u : 0u);
}
DL_DEVICE u32 tk_ge_bf16x2(u32 w, u32 t2) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  u32 r;
  asm("set.ge.u32.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(w), "r"(t2));
  return r;
#else
  return tk_ge_bf16x2_f32(w, t2);
#endif
}

// A warp's exclusive prefix sum of c >= 0 over the lanes below this one, and its total, by one
// ballot per level (c > 0, c > 1, ...): most lanes hold 0 or 1 candidates, so one or two ballots
// in place of a warp reduction and a shared atomicAdd (and of dl::warp_incl_scan's five shuffles,
// which would serve here too but was not the measured variant). The bf16 stream's staging: with both
// changes the bf16 build at batch 8 ran ~1 µs faster on an H100 (2026-12-05, BENCHMARKS.md), while
// the fp32 build at batch 1 ran ~0.7 µs slower with this scan, so fp32 keeps the atomicAdd.
DL_DEVICE void tk_warp_scan(int c, int lane, u32& before, u32& total) {
  const u32 lower = (1u << lane) - 1u;
  before = 0u;
  total = 0u;
#pragma unroll 1
  for (int j = 0;; ++j) {
    const u32 bal = __ballot_sync(FULL, c > j);
    if (bal == 0u) break;
    before += static_cast<u32>(__popc(bal & lower));
    total += static_cast<u32>(__popc(bal));
  }
}

// cp.async.wait_group with a run-time count of groups left in flight (an immediate in PTX).
DL_DEVICE void tk_wait_groups(int n) {
  switch (n) {
    case 0: dl::cp_async_wait<0>(); break;
    case 1: dl::cp_async_wait<1>(); break;
    case 2: dl::cp_async_wait<2>(); break;
    case 3: dl::cp_async_wait<3>(); break;
    case 4: dl::cp_async_wait<4>(); break;
    case 5: dl::cp_async_wait<5>(); break;
    case 6: dl::cp_async_wait<6>(); break;
    default: dl::cp_async_wait<7>(); break;
  }
}

// min(y, 0) keeping NaN (PTX min.NaN.f32, sm_80+).
DL_DEVICE float min0_keep_nan(float y) {
  float r;
  asm("min.NaN.f32 %0, %1, 0f00000000;" : "=f"(r) : "f"(y));
  return r;
}

// Mask bit `bit` of a thread's tile (topk_stream's candidate mask): its 16-byte vector u and the
// element e in it. fp32: bit u * 4 + e. bf16: word w = bit % 16 (two tokens of vector w / 4), its
// upper token if bit >= 16.
template <int V>
DL_DEVICE void tk_bit_place(u32 bit, u32& u, u32& e) {
  u = V == 4 ? bit / 4u : (bit & 15u) / 4u;
  e = V == 4 ? bit % 4u : 2u * (bit & 3u) + (bit >> 4);
}

// A candidate's term of the segment's sum above T: exp(x - T), NaN once x is 80 or more above T.
DL_DEVICE float tk_above_term(float xv, float thr) {
  const float dx = xv - thr;
  return dx < 80.f ? ex2_approx(dx * LOG2E) : __int_as_float(0x7fffffff);
}

// The exact sum of exp(x - T) over this thread's logits < T of the segment (NaN as -inf),
// token by token from global memory: the stream's rare path (a NaN in the row, or T * log2(e)
// not finite). Out of line: it costs the hot loop no registers.
template <typename T>
__noinline__ __device__ float tk_recount(const T* x, float thr, int start, int end, int ntiles) {
  constexpr int V = LogitTraits<T>::VEC;
  constexpr int VSTEP = TK_STREAM_THREADS * V, TILE = TK_STREAM_THREADS * 16;
  float st = 0.f;
  for (int i = 0; i < ntiles; ++i)
    for (int j = 0; j < 16; ++j) {
      const int tok = start + i * TILE + (j / V) * VSTEP + threadIdx.x * V + j % V;
      if (tok >= end) continue;
      const float xv = LogitTraits<T>::load(x + tok);
      if (xv < thr) st += ex2_approx(fmaxf((xv - thr) * LOG2E, -200.f));
    }
  return st;
}

// One CTA: tk_seg_len tokens of one row, tile by tile (TK_STREAM_THREADS x 16 tokens: 16 KB of
// fp32, 8 KB of bf16). Aligned rows (logits_vec) stream through a ring of tiles in the dynamic
// shared memory (as many as it holds, up to 8; the launch sizes it) filled by cp.async (each
// thread copies and reads back only its own 16-byte vectors: no block barrier). Before the row's T
// and flag are read, fp32 issues its whole ring and bf16 all but one tile (PRE_HOLD; those bytes
// arrive while the sample kernel picks T); from then on, stages - 1 tiles stay in flight: at the
// top of iteration i the slot of tile i - 1 takes tile i + stages - 1 (bf16 from i = 0, into the
// slot held back). Unaligned rows, or a ring of fewer than 2 tiles, load each tile directly.
// Per logit x, four instructions besides the candidate test x >= T:
//   sum += exp2(min(x * log2(e) - T * log2(e), 0))
// so every logit >= T adds exactly exp2(0) = 1 (subtracted at the end: the thread counts its
// candidates), every other one exp(x - T) < 1, -inf adds 0, and a NaN makes the sum NaN: a thread
// whose sum is NaN recounts its tokens exactly at the end (NaN counts as -inf: it adds 0).
// The candidate test: fp32, one compare per logit; bf16, one set.ge.bf16x2 per two logits (sm_90+)
// against T rounded up to bf16 (tk_bf16_ceil: the same result). A warp tile where some lane holds
// logits >= T (a few per warp tile; ~1% of them hold none) appends them as composites through the
// warp's shared staging buffer (positions by a shared atomicAdd for fp32, a ballot scan for bf16;
// one global atomicAdd per flush), and adds exp(x - T) of each to the thread's sum above T. At the
// end the CTA's two sums relative to T, (below, above), go to tk_sum of its segment: no maximum is
// needed, below each term is < 1, above each is < e^80; a logit 80 or more above T (or +inf) makes
// the segment's sum above NaN, and ddtree_build then sums the row's candidates itself, relative
// to their maximum.
template <typename T>
DL_DEVICE void topk_stream(const TopKParams& p) {
  using Tr = LogitTraits<T>;
  constexpr int V = Tr::VEC;
  constexpr int U = V == 4 ? TK_STREAM_VECS : TK_STREAM_VECS / 2;  // 16-byte vectors per thread and tile
  constexpr int TILE = TK_STREAM_THREADS * U * V;
  static_assert(U * V == 16, "one candidate bit per logit of a thread's tile");
  constexpr u32 NEG_WORD = V == 4 ? 0xff800000u : 0xff80ff80u;  // a 32-bit word of -inf logits
  // Ring tiles held back until T is known: fp32 issues the whole ring before its PDL wait; bf16
  // all but one (its whole ring, 6 tiles on sm_90, slowed the batch-8 sample by more than it gained)
  constexpr int PRE_HOLD = V == 4 ? 0 : 1;
  __shared__ StreamSmem sm;
  extern __shared__ uint4 tk_ring[];  // [stages][U][TK_STREAM_THREADS]
  const int s = blockIdx.x, d = blockIdx.y, b = blockIdx.z, tid = threadIdx.x;
  const int lane = tid & 31, warp = tid >> 5;
  const size_t row = static_cast<size_t>(b) * p.depth_limit + d;
  // PDL (common.cuh): ddtree_build may start now; its pdl_wait() waits for this whole grid (and
  // so, through this grid's own waits below, for the sample kernel too).
  dl::pdl_launch_dependents();
  DDT_TK_STAMP(DDT_TK_ROW_STREAM, 0, "entry");
  // Before the wait this kernel reads only what was written before the build's first (ordinary)
  // launch, the sample kernel, started: active and the logits; it writes nothing global. The
  // first tiles do not wait for `active` (in bounds whatever the request: an inactive one's are
  // read and dropped), so they leave one round trip earlier.
  const bool act = p.active[b];
  const int start = s * p.tk_seg_len;
  const int end = min(p.vocab, start + p.tk_seg_len);
  const int ntiles = (end - start + TILE - 1) / TILE;
  const int nfull = (end - start) / TILE;  // tiles whose every vector exists
  u32 ring_bytes;  // the launch's dynamic shared memory: the ring's tiles never exceed it
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(ring_bytes));
  const int stages = min(static_cast<int>(ring_bytes / (U * TK_STREAM_THREADS * 16)), 8);
  const bool vec = p.logits_vec != 0 && stages >= 2;
  const T* x = static_cast<const T*>(p.logits) + static_cast<i64>(b) * p.logits_batch_stride +
               static_cast<i64>(d) * p.logits_row_stride;
  // This thread's vector u of tile i: tokens start + i * TILE + u * VSTEP + tid * V .. + V - 1
  // (whole or absent when vec: it exists iff its offset from the thread's first token < rem);
  // in the ring, slot r holds it at col[(r * U + u) * TK_STREAM_THREADS].
  constexpr int VSTEP = TK_STREAM_THREADS * V;
  const T* xt = x + start + tid * V;
  const int rem = end - (start + tid * V);
  uint4* col = tk_ring + tid;
  auto issue = [&](int i, int slot) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int off = i * TILE + u * VSTEP;
      if (off < rem) dl::cp_async_16(dl::smem_u32(col + (slot * U + u) * TK_STREAM_THREADS), xt + off, 16);
    }
  };
  if (vec) {
    for (int i = 0; i < stages - PRE_HOLD; ++i) {  // one commit group per tile, empty past the segment
      if (i < ntiles) issue(i, i);
      dl::cp_async_commit();
    }
  }
  if (!act) {  // (uniform) the build skips the request
    if (vec) dl::cp_async_wait<0>();
    dl::pdl_wait();  // every CTA waits before it exits (common.cuh)
    return;
  }
#if defined(DL_STAMPS) && DL_STAMPS && defined(DL_STAMPS_ROWSEEN)
  // (tools/ddtree_stamps.py --rowseen, a diagnostic: when a per-row handoff would let this CTA go
  // on. Thread 0 polls its row's sample "exit" record, which the tool zeroed before the launch and
  // the sample CTA writes after its T, count and flag, for at most 50 µs, then stamps `rowseen`;
  // nothing is read from the record, and the PDL wait below still orders everything.)
  if (tid == 0) {
    const volatile unsigned long long* seen = &dl_stamps[DDT_TK_ROW_SAMPLE + row][2].name;
    const unsigned long long t0 = dl_globaltimer();
    while (*seen == 0ull && dl_globaltimer() - t0 < 50000ull) __nanosleep(32);
    DDT_TK_STAMP(DDT_TK_ROW_STREAM, 7, "rowseen");
  }
#endif
  // PDL: the sample kernel's T, flag and zeroed count are read (and the count, candidates and
  // segment sums written) only after it has completed; the tiles above are in flight.
  dl::pdl_wait();
  DDT_TK_STAMP(DDT_TK_ROW_STREAM, 1, "waited");

  // T and the flag in one round trip (T is written whatever the flag: loaded before the test)
  const u32 tkflag = p.tk_flag[row];
  const float thr = p.tk_thresh[row];
  if (tkflag != 0u) {  // (uniform) T is not finite: the build's chunk top-K takes the row
    if (vec) dl::cp_async_wait<0>();
    return;
  }
  const float ythr = thr * LOG2E;  // y = x * log2(e) - ythr ~ (x - T) * log2(e)
  u32* count = p.tk_count + row;   // zeroed by the sample kernel
  u64* out = p.tk_cand + row * static_cast<size_t>(p.tk_cap);
  const u32 cap = static_cast<u32>(p.tk_cap);
  u64* stage = sm.stage[warp];
  u32* wfill = sm.fill + warp;  // (fp32)
  if constexpr (V == 4) {
    if (lane == 0) *wfill = 0u;
    __syncwarp();
  }
  const u32 thr2 = V == 8 ? tk_bf16_ceil(thr) * 0x00010001u : 0u;  // bf16: T rounded up, both halves

  float sum = 0.f;    // sum of exp2(min(y, 0)) over this thread's logits (each candidate adds 1)
  int ncand = 0;      // this thread's logits >= T
  float above = 0.f;  // sum of exp(x - T) over them (NaN once one is 80 or more above T)
  int fill = 0;     // (warp-uniform) staged candidates (fp32: = *wfill)
  int rd = 0, wr = stages - 1;  // ring slots of tile i and of tile i + stages - 1
#pragma unroll 1
  for (int i = 0; i < ntiles; ++i) {
    uint4 q[U];
    const uint4* slot = col + rd * U * TK_STREAM_THREADS;
    const bool full = i < nfull;  // (uniform)
    if (vec) {
      // tile i + stages - 1 into tile i - 1's slot (fp32: tile stages - 1 went before the wait)
      if (i > 0 || PRE_HOLD) {
        if (i + stages - 1 < ntiles) issue(i + stages - 1, wr);
        dl::cp_async_commit();
      }
      tk_wait_groups(stages - 1);  // tile i has landed (this thread's copies)
#pragma unroll
      for (int u = 0; u < U; ++u)
        q[u] = full || i * TILE + u * VSTEP < rem ? slot[u * TK_STREAM_THREADS] : make_uint4(NEG_WORD, NEG_WORD, NEG_WORD, NEG_WORD);
      rd = rd + 1 == stages ? 0 : rd + 1;
      wr = wr + 1 == stages ? 0 : wr + 1;
    } else {
#pragma unroll
      for (int u = 0; u < U; ++u) q[u] = tk_load_raw<T>(x, start + i * TILE + u * VSTEP + tid * V, end);
    }
    // mask: which of the thread's 16 logits are >= thr (never NaN). fp32: bit u * 4 + e for token
    // start + i * TILE + u * VSTEP + tid * 4 + e. bf16: word w = u * 4 + j of the thread's vectors
    // (tokens 2j, 2j + 1 of vector u) sets bit w for the lower token, bit 16 + w for the upper.
    u32 mask = 0;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float v[V];
      tk_unpack(q[u], v);
      if constexpr (V == 8) {
        const u32 w4[4] = {q[u].x, q[u].y, q[u].z, q[u].w};
#pragma unroll
        for (int j = 0; j < 4; ++j) mask |= tk_ge_bf16x2(w4[j], thr2) & (0x00010001u << (u * 4 + j));
      }
#pragma unroll
      for (int e = 0; e < V; ++e) {
        if constexpr (V == 4) mask |= (v[e] >= thr ? 1u : 0u) << (u * V + e);
        sum += ex2_approx(min0_keep_nan(fmaf(v[e], LOG2E, -ythr)));
      }
    }
    if (__any_sync(FULL, mask != 0u)) {
      const int c = __popc(mask);
      ncand += c;
      u32 before = 0u, utot;  // (bf16) this lane's position among the warp's candidates; (both) their total
      if constexpr (V == 4) {
        utot = __reduce_add_sync(FULL, static_cast<u32>(c));
      } else {
        tk_warp_scan(c, lane, before, utot);
      }
      const int tot = static_cast<int>(utot);
      if (fill + tot > TK_WARP_STAGE) {  // (uniform) make room
        tk_flush(stage, fill, count, out, cap, lane);
        fill = 0;
        if constexpr (V == 4) {
          if (lane == 0) *wfill = 0u;
          __syncwarp();
        }
      }
      const bool direct = tot > TK_WARP_STAGE;  // (uniform) more than a stage: straight to the list
      u32 pos = 0;
      if constexpr (V == 4) {
        if (c != 0) pos = direct ? atomicAdd(count, static_cast<u32>(c)) : atomicAdd(wfill, static_cast<u32>(c));
      } else {
        pos = static_cast<u32>(fill) + before;
        if (direct) {
          u32 base = 0u;
          if (lane == 0) base = atomicAdd(count, utot);
          pos = __shfl_sync(FULL, base, 0) + before;
        }
      }
      const int tok0 = start + i * TILE + tid * V;
      if (vec && !direct) {  // (uniform) the common case: each candidate from this thread's ring slot
        // to the warp's stage, the slot's shared address formed once (a 32-bit register), not per
        // candidate from the generic pointer (SR_CgaCtaId and an add chain in sm_90's SASS)
        const T* sv = reinterpret_cast<const T*>(slot);
        for (u32 m = mask; m; m &= m - 1) {
          u32 u, e;
          tk_bit_place<V>(static_cast<u32>(__ffs(m) - 1), u, e);
          const int tok = tok0 + static_cast<int>(u) * VSTEP + static_cast<int>(e);
          const float xv = Tr::load(sv + u * (TK_STREAM_THREADS * V) + e);
          above += tk_above_term(xv, thr);
          stage[pos++] = composite(f32_key(xv), tok);
        }
        fill += tot;
        __syncwarp();
        if (i == 0) DDT_TK_STAMP(DDT_TK_ROW_STREAM, 3, "tile0");
        continue;
      }
      for (u32 m = mask; m; m &= m - 1) {
        u32 u, e;
        tk_bit_place<V>(static_cast<u32>(__ffs(m) - 1), u, e);
        const int tok = tok0 + static_cast<int>(u) * VSTEP + static_cast<int>(e);
        // this thread's own copy in the ring (vec), else the tile's load again (an L1 hit)
        float xv;
        if (vec) {
          const uint4* w = slot + u * TK_STREAM_THREADS;
          xv = V == 4 ? reinterpret_cast<const float*>(w)[e]
                      : __uint_as_float(static_cast<u32>(reinterpret_cast<const unsigned short*>(w)[e]) << 16);
        } else {
          xv = Tr::load(x + tok);
        }
        above += tk_above_term(xv, thr);
        const u64 cv = composite(f32_key(xv), tok);
        if (direct) {
          if (pos < cap) out[pos] = cv;
        } else {
          stage[pos] = cv;
        }
        ++pos;
      }
      if (!direct) fill += tot;
      __syncwarp();
    }
    if (i == 0) DDT_TK_STAMP(DDT_TK_ROW_STREAM, 3, "tile0");
  }
  DDT_TK_STAMP(DDT_TK_ROW_STREAM, 4, "looped");
  if (vec) dl::cp_async_wait<0>();  // (only empty groups are left)
  if (fill > 0) tk_flush(stage, fill, count, out, cap, lane);
  DDT_TK_STAMP(DDT_TK_ROW_STREAM, 5, "flushed");

  // This thread's sum of exp(x - T) over its logits < T: the candidates' exact 1s out, or, if
  // a NaN reached the sum, recounted token by token (NaN as -inf: no term).
  const float one = ex2_approx(0.f);  // exp2(0) as the loop computes it (asm: not folded)
  float st = sum - static_cast<float>(ncand) * one;
  if (isnan(sum) || !isfinite(ythr)) st = tk_recount<T>(x, thr, start, end, ntiles);
  // The segment's sums: thread, then warp, then block (fixed order), in double.
  double2 ws = make_double2(static_cast<double>(st), static_cast<double>(above));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    ws.x += __shfl_xor_sync(FULL, ws.x, o);
    ws.y += __shfl_xor_sync(FULL, ws.y, o);
  }
  if (lane == 0) sm.wsum[warp] = ws;
  __syncthreads();
  DDT_TK_STAMP(DDT_TK_ROW_STREAM, 6, "reduced");
  if (tid == 0) {
    double2 t = make_double2(0.0, 0.0);
#pragma unroll
    for (int w = 0; w < TK_STREAM_WARPS; ++w) {
      t.x += sm.wsum[w].x;
      t.y += sm.wsum[w].y;
    }
    reinterpret_cast<double2*>(p.tk_sum)[row * static_cast<size_t>(p.tk_nseg) + s] = t;
  }
  DDT_TK_STAMP(DDT_TK_ROW_STREAM, 2, "exit");
}

}  // namespace ddt
