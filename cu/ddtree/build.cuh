// ddtree/build.cuh: stage 1, ddtree_build's body: merge one row's chunk candidates into its sorted
// top-K with log-probs; the last CTA of a request selects the tree (search.cuh) and writes nodes
// and ancestor bitmasks.
//
// Part of the one translation unit cu/ddtree.cu (see its header for the kernels).
#pragma once
#include "topk.cuh"
#include "search.cuh"
#include "stamps.cuh"

namespace ddt {

// ------------------------------------------------------------------------------ build

struct BuildSmem {
  union {
    SelectSmem sel;       // the row merge
    SearchSmem search;    // then the parallel search
  };
  u64 r64[32];
  int ri[32];
  float lse;
  int last;
  double rsum;  // refine_row's outcome (a refined row): the row's sum of exp(x - rt),
  float rt;     // its threshold,
  int rn;       // and its candidate count
};
// ddtree_build's static shared memory, at namespace scope so that an out-of-line function
// (select_row_cold) addresses it as shared.
__shared__ BuildSmem build_smem;

DL_DEVICE int build_k_of_chunk(const BuildParams& p, int s) { return min(p.k, min(CHUNK, p.vocab - s * CHUNK)); }

// One compare-exchange step of the bitonic network (merge size k, stride j) with the partner's value.
DL_DEVICE u64 bitonic_step(u64 v, u64 other, int tid, int k, int j) {
  const bool keep_max = ((tid & k) == 0) == ((tid & j) == 0);  // descending at the last k = P
  return keep_max ? (v > other ? v : other) : (v < other ? v : other);
}

// Sorts P values (a power of two, 1 <= P <= BUILD_THREADS, the same in every calling thread), one
// per thread tid < max(P, 32), descending, by a bitonic network: first each warp's 32 values
// (merge sizes 2 .. 32 by shuffles, written out: a warp of P < 32 sorts its padding 0 last), then
// for each merge size k = 64 .. P the strides >= 32 through buf (P u64) between two barriers over
// the P threads (named barrier 1; the warps past P pass as many on barrier 2: sort_barriers) and the strides 16 .. 1 by
// shuffles, written out once. The code stays compact: a network unrolled for each P (~830
// instructions at P = 256) ran 2.8 µs at batch 1 but 5.8 µs at batch 8 on the H200, where 120
// CTAs run the same cold instructions at once; this form built batch 8 / 256 in 56.4 µs instead
// of 59.0 and batch 1 / 256 in 37.8 instead of 39.6 (fifteenth session). The first form, both
// loops at run time, spent ~20 instructions of control per step (3.5 µs).
DL_DEVICE u64 bitonic_desc(int P, u64 v, u64* buf, int tid) {
  if (P < 2) return v;
#pragma unroll
  for (int k = 2; k <= 32; k <<= 1)
#pragma unroll
    for (int j = k >> 1; j > 0; j >>= 1) v = bitonic_step(v, __shfl_xor_sync(FULL, v, j), tid, k, j);
  bool first_smem = true;
  for (int k = 64; k <= P; k <<= 1) {  // (uniform)
    for (int j = k >> 1; j >= 32; j >>= 1) {
      // every thread has read its partner of the previous such step (none before the first: each
      // thread last read its own slot)
      if (!first_smem) dl::named_barrier(1, P);
      first_smem = false;
      buf[tid] = v;
      dl::named_barrier(1, P);
      v = bitonic_step(v, buf[tid ^ j], tid, k, j);
    }
#pragma unroll
    for (int j = 16; j > 0; j >>= 1) v = bitonic_step(v, __shfl_xor_sync(FULL, v, j), tid, k, j);
  }
  return v;
}

// The barriers bitonic_desc(P, ...) passes after its shuffles (none for P <= 32), passed on named
// barrier `id` over `count` threads by the warps that do not sort. Without them the warps at or past
// max(P, 32) pass fewer barriers than the sorting warps, which is correct (barrier 1 is the P
// threads' own) but which compute-sanitizer's racecheck reads as hazards across every later CTA
// barrier: 11-20 errors per build test at K = 40, 64 and 100, none at K <= 16 or K >= 481 (every warp
// sorts), none with these barriers (H200, compute-sanitizer 2025.3.1, forty-fourth session). They
// cost nothing measurable (bench_ddtree, -0.23 .. +0.34 µs); every warp on barrier 1 instead made
// the sort wait for the log-sum-exp warp (-0.26 .. +0.81 µs, +0.4 / +0.8 at batch 8, budget 256). Racecheck is the check that would show
// a real shared-memory race in this kernel, so its report is kept clean.
DL_DEVICE void sort_barriers(int P, int id, int count) {
  bool first = true;
  for (int k = 64; k <= P; k <<= 1)  // (uniform)
    for (int j = k >> 1; j >= 32; j >>= 1) {
      if (!first) dl::named_barrier(id, count);
      first = false;
      dl::named_barrier(id, count);
    }
}

// The threshold top-K's exact fallback for a row it failed (rare: T not finite, fewer than K or
// more than tk_cap logits >= T: tk_fallback_of): the chunk top-K (topk.cuh) of each of the row's
// num_chunks chunks in turn, by this CTA (topk_one_chunk with NT = BUILD_THREADS, its ChunkSmem
// at the start of the dynamic shared memory, which a threshold plan sizes for it:
// driverlevel._constants.DDTREE_FALLBACK_SHARED_BYTES), written to the row's cand, chunk_max and chunk_sum
// as the chunk kernel writes them in topk_mode = 0; the merge then takes the row as in that
// mode. Only the rows refine_row cannot take come here (T not finite, more than tk_cap logits tied
// at one key, a segment sum not finite, fewer than K logits above -inf): it costs the row's
// request ~15 µs per chunk, ~360 µs for a 163,840-token row (H100, seventy-second session; the
// estimate had been 1-2 µs per chunk). A fallback kernel between the stream and the build cost
// every build its launch (~1.1-1.5 µs on the H200) and kept the build from starting before the
// stream had drained. Not inlined: its
// two instantiations (~6,000 instructions each) sit apart from the merge's code, and the
// kernel's registers stay those of the merge and the search (sm_90: 112, inlined 123).
__device__ __noinline__ void chunk_fallback_row(const BuildParams& p, int b, int d, u8* dyn) {
  static_assert(sizeof(ChunkSmem) <= DL_DDTREE_FALLBACK_SHARED_BYTES, "the plan's dynamic shared memory holds ChunkSmem");
  ChunkSmem& cs = *reinterpret_cast<ChunkSmem*>(dyn);
#pragma unroll 1
  for (int s = 0; s < p.num_chunks; ++s) {
    if (s) __syncthreads();  // the previous chunk's shared memory is read
    if (p.logits_bf16) topk_one_chunk<bf16, BUILD_THREADS>(p, cs, s, d, b);
    else topk_one_chunk<float, BUILD_THREADS>(p, cs, s, d, b);
  }
  // The row's candidates and statistics (this CTA's global stores) are visible to its threads
  // past the barrier, and its shared memory is free for the merge's sort buffer.
  __syncthreads();
}

// ---- the refined threshold: a failed row's exact threshold, by its own CTA
// A threshold row fails when T, picked from a sample, lets fewer than K or more than tk_cap logits
// through. Rows whose large logits sit in runs of neighbouring ids fail far more often than random
// ones: a sample group catches a whole run or none of it (research/probes/sample_clustering.py).
// The chunk top-K over the row in one CTA (chunk_fallback_row) took ~15 µs per 7,680-token chunk,
// ~360 µs for a 163,840-token row (H100, bench_ddtree --drafter clustered, seventy-second
// session): one failed row of 120 made the batch-8 build 8x slower (budget 256: fp32 49 -> 408 µs
// with one such row, bf16 39 -> 387 µs with three).
// refine_row instead finds a threshold T' whose count of logits >= T' lies in [K, tk_cap], lists
// those logits in the row's candidate list as the stream lists those >= T, and the merge takes
// the row as one whose threshold held:
// * fewer than K passed (the clustered rows' case: the sample saw a run and T came out too high):
//   the list already holds those tk_n, every key >= T. Each read of the row appends the keys of a
//   window just below the last (REFINE_APPEND_WIDTH keys: 1/4 of an octave, then 8x as wide)
//   until the list holds K or more: every key >= the last window's bottom, which is T'. The
//   clustered rows' K-th largest lay in the first window: one read of the row.
// * more than tk_cap passed, or a window overflowed the list: a radix select on the order keys,
//   each level one read of the row (the keys of a window [lo, hi] counted in REFINE_BINS linear
//   bins, the K-th largest's bin the next window; the first window: the keys above T, the window
//   that overflowed, or, the appends' windows spent, the next below them, widened 16x while the
//   K-th largest lies below), then one read to list the keys >= T'.
// The row's log-sum-exp needs no read: the stream's segment sums relative to T cover every logit,
// and relative to T' they are their total times exp(T - T'), kept in build_smem.rsum (the merge's
// S = 0: "refined"). tk_thresh and tk_count keep the stream's T and count (the threshold state's
// record of the sample and the stream); tk_cand holds the T' list. Returns false when the exact
// chunk top-K must take the row after all (it
// reads nothing refine_row wrote): T not finite (the stream skipped the row), a segment sum not
// finite (a logit 80 or more above T, or +inf), fewer than K logits above -inf, more than tk_cap
// logits tied at one key (only the lowest ids may pass: the chunk top-K's keep_lowest_ids), or a
// list that disagrees with the histogram's count. Every index stays in bounds whatever the row
// holds: the list's writes stop at tk_cap.
// Measured (H100, batch 8, budget 256, ddtree_stamps --drafter clustered): the failed row's merge
// has its candidates ("loaded") 22.1 µs (fp32) / 18.7 µs (bf16) after it starts, the median row
// 1.7 µs, where the chunk top-K took 332.9 µs (bf16).
constexpr int REFINE_BINS = 2048;
constexpr int REFINE_BIN_BITS = 11;
constexpr int REFINE_ELEMS = 32;  // logits in flight per thread and read: 8 vectors of fp32, 4 of bf16
constexpr u32 REFINE_WIDTH = 1u << 24;  // the radix select's first window below T, in keys: two octaves
constexpr u32 REFINE_APPEND_WIDTH = 1u << 21;  // the appends' first window below T: 1/4 of an octave
constexpr int REFINE_APPEND_WINDOWS = 4;  // 1/4, 2, 16 and 128 octaves
constexpr int REFINE_LEVELS = 12;
struct RefineSmem {  // at the start of the dynamic shared memory (the sort buffer's place)
  u32 bin[REFINE_BINS];
  int ri[32];
  u32 listed;
  int found, above, count;  // the K-th's bin (-1: below the window), the keys above it in the window, its own
};
static_assert(sizeof(RefineSmem) <= DL_DDTREE_FALLBACK_SHARED_BYTES,
              "a threshold plan's dynamic shared memory holds RefineSmem");
static_assert(REFINE_BINS == 4 * BUILD_THREADS, "four bins a thread");

// The window of `width` keys whose top is hi, cut at the smallest key above -inf's.
DL_DEVICE u32 refine_window_below(u32 hi, u32 width) {
  constexpr u32 KMIN = KEY_NEG_INF + 1u;
  return hi - KMIN >= width ? hi - width + 1u : KMIN;
}

// The window [lo, hi] of order keys as a float test: x passes for every logit whose key lies in
// it (and for a few more: hi = 0x7fffffff, whose float is -0, admits +0 and -0, whose key is
// 0x80000000; NaN never passes), so refine_each compares floats per logit and forms the key only
// for those that pass.
struct RefineWindow {
  float flo, fhi;
  u32 lo, hi;
  DL_DEVICE RefineWindow(u32 l, u32 h) : lo(l), hi(h) {
    flo = key_f32(l);
    fhi = key_f32(min(h, f32_key(__int_as_float(0x7f800000))));  // keys above +inf's are NaN's
  }
  DL_DEVICE bool maybe(float x) const { return x >= flo && x <= fhi; }
};

// hit(key, token) for every logit of the row whose key lies in the window, by the CTA: 16-byte
// vectors, REFINE_ELEMS logits of them in flight per thread, where the rows are aligned
// (logits_vec), then the tokens past the last whole vector (or, unaligned, every token) one by
// one. Each logit costs two float compares; the few that pass are keyed in a rare branch. One SM
// reads the row alone here, so each round of loads is a round trip: ~2 µs per round of 32 logits
// a thread, fp32 or bf16 alike, ~21 / ~18 µs per read of a 163,840-token fp32 / bf16 row (H100,
// ddtree_stamps --drafter clustered, batch 8). Measured beside it (seventy-second session): 64
// logits a thread, the passing ones loaded again from L2 by a loop after the round (so that the
// round's registers stay few), 30.7 / 23.2 µs; the same with the next round's loads issued before
// that loop, 25.3 / 23.6 µs. Keyed inside the unrolled loop at 64 logits, sm_120 spilled.
template <typename T, typename F>
DL_DEVICE void refine_each(const BuildParams& p, const T* row, const RefineWindow& win, F&& hit) {
  constexpr int V = LogitTraits<T>::VEC, U = REFINE_ELEMS / V;
  static_assert(REFINE_ELEMS <= 64, "one mask bit per logit of a thread's vectors");
  const int tid = threadIdx.x, vocab = p.vocab;
  const int nv = p.logits_vec ? vocab / V : 0;
  const uint4* rv = reinterpret_cast<const uint4*>(row);
  // A vector past the row: -inf in every element (bf16: both halves of each word; a bf16 word of
  // 0xff800000 would be -inf and +0, a logit of +0 at a token past the vocabulary).
  constexpr u32 NEG_WORD = V == 4 ? 0xff800000u : 0xff80ff80u;
  auto one = [&](float x, int tok) {
    if (!win.maybe(x)) return;
    const u32 k = logit_key(x);
    if (k >= win.lo && k <= win.hi) hit(k, tok);
  };
#pragma unroll 1
  for (int base = 0; base < nv; base += U * BUILD_THREADS) {
    uint4 q[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int i = base + u * BUILD_THREADS + tid;
      q[u] = i < nv ? __ldcg(rv + i) : make_uint4(NEG_WORD, NEG_WORD, NEG_WORD, NEG_WORD);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float v[V];
      tk_unpack(q[u], v);  // (past the row: -inf, which no window holds)
      u32 m = 0;  // bit e: element e may lie in the window
#pragma unroll
      for (int e = 0; e < V; ++e) m |= static_cast<u32>(win.maybe(v[e])) << e;
      if (m) {  // (rare)
        const int tok0 = (base + u * BUILD_THREADS + tid) * V;
#pragma unroll
        for (int e = 0; e < V; ++e)
          if ((m >> e) & 1u) one(v[e], tok0 + e);
      }
    }
  }
#pragma unroll 4
  for (int t = nv * V + tid; t < vocab; t += BUILD_THREADS) one(LogitTraits<T>::load(row + t), t);
}

template <typename T>
__device__ __noinline__ bool refine_row(const BuildParams& p, int b, int d, u32 tk_flag, u32 tk_n, float tk_t,
                                        u8* dyn) {
  RefineSmem& rs = *reinterpret_cast<RefineSmem*>(dyn);
  BuildSmem& sm = build_smem;
  const int tid = threadIdx.x, K = p.k, S = p.tk_nseg;
  const u32 cap = static_cast<u32>(p.tk_cap);
  const size_t row_id = static_cast<size_t>(b) * p.depth_limit + d;
  if (tk_flag != 0u || !isfinite(tk_t)) return false;  // (uniform) the stream skipped the row
  if (tid < 32) {  // the row's sum of exp(x - T) over every logit: its segments' (below, above)
    const double2* sums = reinterpret_cast<const double2*>(p.tk_sum) + row_id * S;
    double s = 0.0;
    for (int i = tid; i < S; i += 32) s += sums[i].x + sums[i].y;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(FULL, s, o);
    if (tid == 0) sm.rsum = s;
  }
  __syncthreads();
  if (!isfinite(sm.rsum)) return false;  // (uniform) a logit 80 or more above T, or +inf
  const T* row = static_cast<const T*>(p.logits) + static_cast<i64>(b) * p.logits_batch_stride +
                 static_cast<i64>(d) * p.logits_row_stride;
  u64* out = p.tk_cand + row_id * static_cast<size_t>(p.tk_cap);
  const u32 tkey = f32_key(tk_t);
  constexpr u32 KMIN = KEY_NEG_INF + 1u;  // the smallest key of a logit above -inf
  u32 tcut = 0u;  // T' as a key (0: not found)
  int n_want = 0;
  bool listed = false;  // the list already holds every key >= tcut
  // The radix select's first window [lo, hi] and the keys `above` it: more than tk_cap passed, so
  // the K-th largest is >= T; the appends below may hand it a window further down.
  u32 lo = tkey, hi = 0xffffffffu, width = REFINE_WIDTH;
  int above = 0;
  // Fewer than K passed: the list holds those tk_n (every key >= T). Each read appends the keys of
  // a window just below the last, REFINE_APPEND_WIDTH keys wide (1/4 of an octave), then 8x as
  // wide, until the list holds K or more: every key >= the window's bottom, which is T'. A
  // clustered row's K-th largest usually lies in the first window: one read of the row. A window
  // that overflows the list holds the K-th largest: the radix select starts on it. Windows run
  // out: it starts on the next one below.
  if (tk_n < static_cast<u32>(K)) {
    if (tkey <= KMIN) return false;  // (uniform) nothing above -inf below T
    hi = tkey - 1u;
    width = REFINE_APPEND_WIDTH;
    u32 have = tk_n;
    bool overflowed = false;
#pragma unroll 1
    for (int w = 0; w < REFINE_APPEND_WINDOWS; ++w) {
      lo = refine_window_below(hi, width);
      if (w) __syncthreads();  // every thread has read rs.listed
      if (tid == 0) rs.listed = have;
      __syncthreads();
      refine_each<T>(p, row, RefineWindow(lo, hi), [&](u32 k, int tok) {
        const u32 at = atomicAdd(&rs.listed, 1u);
        if (at < cap) out[at] = composite(k, tok);
      });
      __syncthreads();
      const u32 before = have;
      have = rs.listed;  // (uniform)
      if (have > cap) {  // (the K-th largest lies in [lo, hi]: before < K <= cap < have)
        above = static_cast<int>(before);
        overflowed = true;
        break;
      }
      if (have >= static_cast<u32>(K)) {
        tcut = lo;
        n_want = static_cast<int>(have);
        listed = true;
        break;
      }
      if (lo == KMIN) return false;  // (uniform) fewer than K logits above -inf
      hi = lo - 1u;
      width = width >= (1u << 29) ? 0xffffffffu : width << 3;
    }
    if (!listed && !overflowed) {  // every window read: the next one below, as wide as the appends' next
      above = static_cast<int>(have);
      lo = refine_window_below(hi, width);
    }
  }
  if (!listed) {
    // The radix select: the window [lo, hi] of keys holds the K-th largest or lies above it,
    // `above` keys lie above the window.
#pragma unroll 1
    for (int level = 0; level < REFINE_LEVELS; ++level) {
      const u32 range = hi - lo;
      const int bits = 32 - __clz(static_cast<int>(range));
      const int shift = bits > REFINE_BIN_BITS ? bits - REFINE_BIN_BITS : 0;  // (range >> shift) < REFINE_BINS
      __syncthreads();  // the previous level's bins and outcome (or the appends' count) are read
#pragma unroll
      for (int i = 0; i < 4; ++i) rs.bin[i * BUILD_THREADS + tid] = 0u;
      if (tid == 0) rs.found = -1;
      __syncthreads();
      refine_each<T>(p, row, RefineWindow(lo, hi), [&](u32 k, int) { atomicAdd(&rs.bin[(k - lo) >> shift], 1u); });
      __syncthreads();
      // From the top: thread t holds bins REFINE_BINS - 1 - 4t down to REFINE_BINS - 4 - 4t.
      const int top = REFINE_BINS - 1 - 4 * tid;
      u32 c4[4];
      int own = 0;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        c4[i] = rs.bin[top - i];
        own += static_cast<int>(c4[i]);
      }
      int total;
      int before = dl::block_excl_scan<BUILD_THREADS>(own, rs.ri, &total);
      const int need = K - above;  // >= 1
      if (before < need && before + own >= need) {  // the K-th largest's bin is one of this thread's
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          if (before + static_cast<int>(c4[i]) >= need) {
            rs.found = top - i;
            rs.above = before;
            rs.count = static_cast<int>(c4[i]);
            break;
          }
          before += static_cast<int>(c4[i]);
        }
      }
      __syncthreads();
      const int found = rs.found;  // (uniform)
      if (found < 0) {  // fewer than `need` keys in the window: the next one below, 16x as wide
        above += total;
        if (lo <= KMIN) return false;  // (uniform) fewer than K logits above -inf
        hi = lo - 1u;
        width = width >= (1u << 28) ? 0xffffffffu : width << 4;
        lo = refine_window_below(hi, width);
        continue;
      }
      const u32 blo = lo + (static_cast<u32>(found) << shift);
      const u32 bhi = static_cast<u32>(min(static_cast<u64>(hi), static_cast<u64>(blo) + ((1ull << shift) - 1ull)));
      const int n_ge = above + rs.above + rs.count;  // keys >= blo: >= K
      if (n_ge <= static_cast<int>(cap)) {
        tcut = blo;
        n_want = n_ge;
        break;
      }
      if (shift == 0) return false;  // (uniform) more than tk_cap ties at one key
      above += rs.above;
      lo = blo;
      hi = bhi;
    }
    if (tcut == 0u) return false;  // (uniform) levels exhausted (not expected: 32 bits in 11-bit levels)
    // The list: every logit whose key is >= T', as the stream lists those >= T (in no order: the
    // merge ranks them). The barrier first: every thread has read the last level's outcome, which
    // the compiler loads with rs.listed in one 16-byte load (racecheck's hazard without it).
    __syncthreads();
    if (tid == 0) rs.listed = 0u;
    __syncthreads();
    refine_each<T>(p, row, RefineWindow(tcut, 0xffffffffu), [&](u32 k, int tok) {
      const u32 at = atomicAdd(&rs.listed, 1u);
      if (at < cap) out[at] = composite(k, tok);
    });
    __syncthreads();
  }
  // (the list, this CTA's global stores, is visible to its threads past the barriers above)
  const bool agree = rs.listed == static_cast<u32>(n_want);  // (uniform)
  __syncthreads();  // every thread has read rs.listed: the merge may take the dynamic shared memory
  if (tid == 0 && agree) {
    const float t2 = key_f32(tcut);
    sm.rt = t2;
    sm.rn = n_want;
    sm.rsum = sm.rsum * exp(static_cast<double>(tk_t) - static_cast<double>(t2));
  }
  __syncthreads();  // sm.rt, sm.rn, sm.rsum
  return agree && isfinite(sm.rsum);
}

// ---- the hist path: a threshold row's candidates ranked by one linear histogram
// Every candidate of a row whose threshold held lies in [cut, cmax] (cut = key(T) - 1 << 32, cmax
// the largest composite), so HIST_BINS linear bins of d = cmax - v (bin 0 the largest) put each in
// a bin whose exclusive start (the candidates in the bins before it) is its rank but for the
// candidates of its own bin above it. The bins that start below K are scattered into buckets in
// bin order, and each candidate there counts its larger bin-mates: its rank, written to out[rank]
// when < K. That replaces the select (a histogram level or two, a gather and a one-warp ranking),
// the scan and scatter of the picked, and the bitonic network over them (~25 barriers) with three
// barriers of the 15 worker warps (named barrier 3; the log-sum-exp warp computes the row's
// log-sum-exp meanwhile, holding no candidate). A bin before the K-th's (or the K-th's own) with
// more than HIST_CROWD candidates (ties: bf16 rows, constant runs) would make its ranking
// quadratic: the row then takes the select and the sort after all (h.crowded).
// Compiled in only where DL_DDTREE_HIST_MERGE is 1 (driverlevel.ddtree.compile_defines: the
// threshold plans' cubin); a chunked plan's merge keeps main's code in one straight run.
constexpr bool HIST_MERGE = DL_DDTREE_HIST_MERGE != 0;
constexpr int HIST_WORKERS = BUILD_THREADS - 32;  // the warps below the log-sum-exp warp
constexpr int HIST_BINS = 512;
constexpr int HIST_CROWD = 128;
constexpr int HIST_BARRIERS = 3;  // named barrier 3, passed by every worker on every path
// Bin b's slot in count / start / cursor: one padding word after every 16 bins, so that warp 0's
// lanes, 16 consecutive bins each, read and write 32 distinct banks (unpadded: 16-way conflicts on
// each of the scan's 48 accesses).
DL_DEVICE constexpr int hist_slot(int b) { return b + (b >> 4); }
struct HistSmem {  // at the start of the dynamic shared memory (the sort buffer's place)
  u32 count[hist_slot(HIST_BINS - 1) + 1];
  u32 start[hist_slot(HIST_BINS) + 1];  // the bins' exclusive starts, then (slot of bin 512) the total
  u32 cursor[hist_slot(HIST_BINS - 1) + 1];
  u64 bucket[MAX_K + HIST_CROWD];
  u64 out[MAX_K];
  u64 r64[BUILD_THREADS / 32];  // the block maximum's
  int crowded, end;             // hist_rank's outcome
  float lse;                    // the row's log-sum-exp (the log-sum-exp warp's)
};
static_assert(sizeof(HistSmem) <= DL_DDTREE_FALLBACK_SHARED_BYTES,
              "a threshold plan's dynamic shared memory holds HistSmem");
static_assert(HIST_BINS == 32 * 16 && HIST_BINS == BUILD_THREADS,
              "warp 0 scans 16 bins a lane; every thread zeroes one bin");

// The workers' part (threads < HIST_WORKERS; h.count zeroed and ordered before the call): the row's
// top K composites, descending, in h.out[0 .. K) (0 past the candidates when fewer than K are
// >= cut), unless h.crowded. Every index stays in bounds whatever the candidates hold, and
// h.out[0 .. K) is written in full even if they repeat a composite (corrupted data: equal ones are
// ranked by their bucket slot). Every worker passes named barrier 3 HIST_BARRIERS times, crowded
// or not, as the log-sum-exp warp passes barrier 4 (hist_lse_barriers): compute-sanitizer's
// racecheck orders two warps' accesses across a later CTA barrier only when both have passed as
// many barriers (sort_barriers).
DL_DEVICE void hist_rank(const u64 (&c)[MERGE_ELEMS], int ecount, u64 cmax, u64 cut, int K, HistSmem& h) {
  const int tid = threadIdx.x;
  const u64 range = cmax > cut ? cmax - cut : 0ull;
  const int bits = 64 - __clzll(static_cast<long long>(range));
  const int shift = bits > 9 ? bits - 9 : 0;  // (cmax - v) >> shift <= range >> shift < HIST_BINS
  // The scatter below tests the very elements, predicate and shift of this count: each bin's
  // cursor then stays below its start plus its count (and bucket's index is checked anyway).
#pragma unroll
  for (int j = 0; j < MERGE_ELEMS; ++j) {
    if (j >= ecount) break;
    const u64 v = c[j];
    if (v >= cut && v <= cmax) atomicAdd(&h.count[hist_slot(static_cast<int>((cmax - v) >> shift))], 1u);
  }
  dl::named_barrier(3, HIST_WORKERS);  // 1 of HIST_BARRIERS
  if (tid < 32) {  // the starts, the K-th's bin's end and the crowding, 16 bins a lane
    const int s0 = hist_slot(tid * 16);  // (= tid * 17: the lane's 16 slots are consecutive)
    u32 cnt[16], own = 0;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      cnt[i] = h.count[s0 + i];
      own += cnt[i];
    }
    u32 run = dl::warp_incl_scan(own) - own;
    u32 crowd = 0, end = 0;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      h.start[s0 + i] = run;
      h.cursor[s0 + i] = run;
      if (run < static_cast<u32>(K)) {
        crowd = max(crowd, cnt[i]);
        if (run + cnt[i] >= static_cast<u32>(K)) end = run + cnt[i];  // the K-th's bin (one)
      }
      run += cnt[i];
    }
    if (tid == 31) h.start[hist_slot(HIST_BINS)] = run;
    crowd = __reduce_max_sync(FULL, crowd);
    end = __reduce_max_sync(FULL, end);
    const u32 total = __shfl_sync(FULL, run, 31);
    if (tid == 0) {
      h.crowded = crowd > static_cast<u32>(HIST_CROWD);
      h.end = static_cast<int>(end != 0u ? end : total);  // fewer than K: all of them
    }
  }
  dl::named_barrier(3, HIST_WORKERS);  // 2 of HIST_BARRIERS
  const bool crowded = h.crowded;  // (uniform)
  if (!crowded) {
    DDT_STAMP(2, "selected", -1);  // (a crowded row: the select stamps it)
#pragma unroll
    for (int j = 0; j < MERGE_ELEMS; ++j) {
      if (j >= ecount) break;
      const u64 v = c[j];
      if (v >= cut && v <= cmax) {
        const int bin = static_cast<int>((cmax - v) >> shift);
        if (h.start[hist_slot(bin)] < static_cast<u32>(K)) {
          const u32 at = atomicAdd(&h.cursor[hist_slot(bin)], 1u);
          if (at < static_cast<u32>(MAX_K + HIST_CROWD)) h.bucket[at] = v;
        }
      }
    }
  }
  dl::named_barrier(3, HIST_WORKERS);  // 3 of HIST_BARRIERS
  if (crowded) return;  // (uniform)
  DDT_STAMP(3, "lse", 0);
  const int end = h.end;  // <= K - 1 + HIST_CROWD: not crowded
  const int lim = max(end, K);
  for (int q = tid; q < lim; q += HIST_WORKERS) {
    if (q < end) {
      const u64 v = h.bucket[q];
      const int bin = static_cast<int>((cmax - v) >> shift);
      const int lo = static_cast<int>(h.start[hist_slot(bin)]);
      const int hi = min(static_cast<int>(h.start[hist_slot(bin + 1)]), end);
      int r = lo;
      for (int j = lo; j < hi; ++j) {
        const u64 o = h.bucket[j];
        r += (o > v) | ((o == v) & (j < q));  // (equal composites only in corrupted data: by slot)
      }
      if (r < K) h.out[r] = v;
    } else {
      h.out[q] = 0ull;
    }
  }
  DDT_STAMP(29, "sortdone", 0);
}

// A threshold row's first 32 segment sums (below, above) relative to T, lane by lane (0 past the
// S segments), for row_lse; S = 0: a refined row (refine_row), whose one sum relative to its T'
// lane 0 takes from build_smem.rsum.
DL_DEVICE double2 segment_sums_pre(const BuildParams& p, size_t row_id, int S) {
  const int lane = threadIdx.x & 31;
  if (S == 0) return make_double2(lane == 0 ? build_smem.rsum : 0.0, 0.0);
  return lane < S ? reinterpret_cast<const double2*>(p.tk_sum)[row_id * S + lane] : make_double2(0.0, 0.0);
}

// The row's log-sum-exp, computed by the log-sum-exp warp (lane 0 writes lse_out, read past a
// later barrier). thr: relative to T from the stream segments' sums (S of them at tk_sums; the
// first 32 already in t_pre, lane by lane; S = 0: a refined row's one sum, in t_pre); otherwise
// from the chunks' (maximum, sum of exp), S chunks.
DL_DEVICE void row_lse(const BuildParams& p, size_t row_id, bool thr, int S, int n_cand, u64 cmax, float t_thr,
                       double2 t_pre, float& lse_out) {
  const int lane = threadIdx.x & 31;
  const double2* tk_sums = reinterpret_cast<const double2*>(p.tk_sum) + row_id * S;
  float m;
  double t = 0.0;
  if (thr) {  // relative to T: below + above (NaN: a logit 80 or more above T)
    m = key_f32(static_cast<u32>(cmax >> 32));
    double2 ts = t_pre;
    for (int s = lane + 32; s < S; s += 32) {
      const double2 v = tk_sums[s];
      ts.x += v.x;
      ts.y += v.y;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      ts.x += __shfl_xor_sync(FULL, ts.x, o);
      ts.y += __shfl_xor_sync(FULL, ts.y, o);
    }
    if (!isnan(ts.y)) {
      t = (ts.x + ts.y) * exp(static_cast<double>(t_thr) - static_cast<double>(m));  // relative to m
    } else if (isfinite(m)) {
      // The rare row: its candidates' sum relative to their maximum m, from the list, in fixed
      // point (units of 2^-38, terms <= 1 truncated, < 2^52 in all: exact in double) so that
      // the order in which the stream listed them cannot change the sum (the build stays
      // bitwise reproducible).
      const u64* cand = p.tk_cand + row_id * static_cast<size_t>(p.tk_cap);
      u64 fix = 0;
      for (int i = lane; i < n_cand; i += 32) {
        // exp(x - m) = (24-bit mantissa) * 2^(E - 150); times 2^38: a shift by E - 112 (<= 15)
        const u32 w = __float_as_uint(ex2_approx((key_f32(static_cast<u32>(cand[i] >> 32)) - m) * LOG2E));
        const int sh = min(static_cast<int>(w >> 23) - 112, 15);
        const u64 mant = (w & 0x7fffffu) | 0x800000u;
        fix += sh >= 0 ? mant << sh : (sh > -24 ? mant >> -sh : 0ull);
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) fix += __shfl_xor_sync(FULL, fix, o);
      t = static_cast<double>(fix) * 0x1p-38 + ts.x * exp(static_cast<double>(t_thr) - static_cast<double>(m));
    }
    // The maximum's own term is exactly 1 relative to m, so t >= 1 and lse >= m (every
    // log-prob <= 0, as the parallel search needs). Formed relative to T in fp32, exp(m - T)
    // can come out ~1e-6 short when the maximum dominates its row (the demo drafter's rows:
    // lse rounded one ulp below m, a positive log-prob, children ranked before parents).
    t = fmax(t, 1.0);
  } else {
    const float* pm = p.chunk_max + row_id * S;
    const double* ps = p.chunk_sum + row_id * S;
    m = DL_NEG_INF;
    for (int s = lane; s < S; s += 32) m = fmaxf(m, pm[s]);
    m = dl::warp_max(m);
    for (int s = lane; s < S; s += 32) {
      const float cm = pm[s];
      if (cm > DL_NEG_INF) t += ps[s] * exp(static_cast<double>(cm) - static_cast<double>(m));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(FULL, t, o);
  }
  if (lane == 0) {
    // A row whose maximum is not finite (every logit NaN / -inf, or a +inf) has no
    // distribution: its log-probs are all the floor below, and the build status says so.
    const bool finite = isfinite(m);
    lse_out = finite ? static_cast<float>(static_cast<double>(m) + log(t)) : __int_as_float(0x7fffffff);
    if (!finite) atomicOr(reinterpret_cast<unsigned long long*>(p.state + 3), static_cast<unsigned long long>(STATUS_NONFINITE));
  }
}

// The row's output: thread k < K writes rank k's token id and log-prob (v its composite, 0 past
// the candidates: the floor's log-prob).
DL_DEVICE void store_row(const BuildParams& p, size_t row_id, u64 v, float lse) {
  const int tid = threadIdx.x, K = p.k;
  if (tid < K) {
    const size_t at = row_id * K + tid;
    p.top_ids[at] = composite_id(v);
    // -inf (NaN, overflow) log-probs become the most negative float: the search stays finite
    p.top_lp[at] = fmaxf(__fsub_rn(key_f32(static_cast<u32>(v >> 32)), lse), -3.402823466e38f);
  }
}

// The log-sum-exp warp's side of hist_rank's barriers (named barrier 4, this warp alone), passed
// after its log-sum-exp: the same count of barriers as every worker (see hist_rank).
DL_DEVICE void hist_lse_barriers() {
#pragma unroll 1
  for (int i = 0; i < HIST_BARRIERS; ++i) dl::named_barrier(4, 32);
}

// The row merge's log-sum-exp warp: the CTA's last (merge_row_hist, select_row).
constexpr int LSE_WARP = BUILD_THREADS / 32 - 1;

// A threshold row's candidate list (tk_count composites) into c, `stride` threads apart: thread t
// holds entries t, t + stride, ...; 0 past the first n (the row's count, or 0 for a thread that
// holds none).
DL_DEVICE void load_threshold_cand(const BuildParams& p, size_t row_id, int n, int stride, u64 (&c)[MERGE_ELEMS]) {
  const u64* cand = p.tk_cand + row_id * static_cast<size_t>(p.tk_cap);
#pragma unroll
  for (int j = 0; j < MERGE_ELEMS; ++j) {
    const int i = j * stride + static_cast<int>(threadIdx.x);
    c[j] = i < n ? cand[i] : 0ull;
  }
}

// The hist path of merge_row: a threshold row of n_cand <= HIST_WORKERS * MERGE_ELEMS candidates
// (its T t_thr), ranked by hist_rank while the log-sum-exp warp computes the row's log-sum-exp,
// then stored. Returns false, having stored nothing, for a crowded row (h.crowded): merge_row then
// takes the select and the sort (select_row_cold), loading the candidates again (from L2).
DL_DEVICE bool merge_row_hist(const BuildParams& p, size_t row_id, int S, int n_cand, float t_thr) {
  extern __shared__ __align__(16) u8 dyn[];
  HistSmem& h = *reinterpret_cast<HistSmem*>(dyn);
  const int tid = threadIdx.x, K = p.k;
  const bool lse_warp = (tid >> 5) == LSE_WARP;
  h.count[hist_slot(tid)] = 0u;  // (HIST_BINS == BUILD_THREADS; ordered by the block max's barriers)
  // The candidates in the workers' registers only (the log-sum-exp warp holds none).
  u64 c[MERGE_ELEMS];
  load_threshold_cand(p, row_id, tid < HIST_WORKERS ? n_cand : 0, HIST_WORKERS, c);
  double2 t_pre = make_double2(0.0, 0.0);  // the log-sum-exp warp: the first 32 segments' sums now
  if (lse_warp) t_pre = segment_sums_pre(p, row_id, S);
  u64 mine = 0;
#pragma unroll
  for (int j = 0; j < MERGE_ELEMS; ++j) mine = c[j] > mine ? c[j] : mine;
  const u64 cmax = dl::block_max_u64<BUILD_THREADS>(mine, h.r64);
  DDT_STAMP(1, "loaded", n_cand);
  // (the cut as merge_row's select takes it: key(T) - 1, see there)
  const u64 cut = static_cast<u64>(f32_key(t_thr) - 1u) << 32;
  const int ecount = min(MERGE_ELEMS, (n_cand + HIST_WORKERS - 1) / HIST_WORKERS);  // slots that may hold one
  if (lse_warp) {
    row_lse(p, row_id, true, S, n_cand, cmax, t_thr, t_pre, h.lse);
    hist_lse_barriers();
  } else {
    hist_rank(c, ecount, cmax, cut, K, h);
  }
  DDT_STAMP_BY(LSE_WARP * 32, 28, "lsedone", 0);
  __syncthreads();  // h.out, h.lse and h.crowded are visible
  if (h.crowded) return false;  // (uniform)
  store_row(p, row_id, tid < K ? h.out[tid] : 0ull, h.lse);
  DDT_STAMP(4, "sorted", 0);
  return true;
}

// The select and the sort of merge_row for the rows the hist path does not rank: chunk candidates
// (topk_mode = 0, or a threshold row that failed), a crowded threshold row, or any threshold row
// where HIST_MERGE is 0. thr: the row's threshold held (T tk_t); S segments or chunks; n_cand
// candidates.
DL_DEVICE void select_row(const BuildParams& p, size_t row_id, bool thr, int S, int n_cand, float tk_t,
                                BuildSmem& sm, u64* sortbuf) {
  const int tid = threadIdx.x, K = p.k;
  u64 c[MERGE_ELEMS];
  if (thr) {
    load_threshold_cand(p, row_id, n_cand, BUILD_THREADS, c);
  } else {
    const u64* cand = p.cand + row_id * S * K;
#pragma unroll
    for (int j = 0; j < MERGE_ELEMS; ++j) {
      const int i = j * BUILD_THREADS + tid;
      const int s = i / K, r = i - s * K;
      c[j] = (s < S && r < build_k_of_chunk(p, s)) ? cand[i] : 0ull;
    }
  }
  // The row's log-sum-exp is the last warp's (LSE_WARP): it computes it while the warps below
  // P sort, which leaves it idle for P < BUILD_THREADS (K <= 256; from K = 257 on P = 512 and it
  // sorts too, after the log-sum-exp, as warp 0 did before). thr: it loads the row's segment sums
  // only then (a rare path in the threshold plans: loaded before the select, as merge_row_hist
  // does, they held 4 registers over it, and the out-of-line select_row_cold needed an 8-byte
  // stack slot on sm_120); every thread loads T (the select's cut).
  const bool lse_warp = (tid >> 5) == LSE_WARP;
  const float t_thr = thr ? tk_t : 0.f;
  u64 mine = 0;
#pragma unroll
  for (int j = 0; j < MERGE_ELEMS; ++j) mine = c[j] > mine ? c[j] : mine;
  const u64 cmax = dl::block_max_u64<BUILD_THREADS>(mine, sm.r64);
  DDT_STAMP(1, "loaded", n_cand);
  // The K-th largest composite (key << 32 | ~id: equal logits, lower id first) in one select on
  // the 64-bit composites: the level that isolates the K-th key's bin also holds the logits tied
  // with it, and the one-warp ranking of <= 32 gathered composites orders them by id at once (a
  // select on the 32-bit key and then, when more logits share the K-th key than still fit, a
  // second select among their ids took two; bf16 rows tie there nearly always).
  // thr: every candidate x passed the stream's x >= T (T finite, x never NaN), so its key is
  // >= key(T) (f32_key maps -0 and +0 alike; the - 1 is slack), and the select bins
  // [key(T) - 1, the maximum] << 32 linearly: one level usually leaves a few values in the K-th's
  // bin (the log bins over every key took two). This relies on IEEE compares in the stream: built
  // with flush-to-zero (-ftz, --use_fast_math) a denormal T would admit +-0 and negative
  // denormals whose keys lie below the cut. Without thr the cut is key 1: every composite of a
  // candidate (0 marks none).
  const u32 kcut = thr ? f32_key(t_thr) - 1u : 1u;
  const int ecount = min(MERGE_ELEMS, (n_cand + BUILD_THREADS - 1) / BUILD_THREADS);  // slots that may hold one
  const u64 cstar = kth_largest<BUILD_THREADS, MERGE_ELEMS, u64>(  // picked: composite >= cstar
      [&](int j, int z) { return c[j] + static_cast<u64>(z); }, cmax, static_cast<u64>(kcut) << 32, K, sm.sel,
      ecount, thr);
  DDT_STAMP(2, "selected", sm.sel.levels);  // (stamped builds: the select's levels + 64 x gathered)
  int own = 0;
#pragma unroll
  for (int j = 0; j < MERGE_ELEMS; ++j) own += c[j] >= cstar;
  int all;  // = K: the composites are distinct
  int pos = dl::block_excl_scan<BUILD_THREADS>(own, sm.ri, &all);
#pragma unroll
  for (int j = 0; j < MERGE_ELEMS; ++j)
    if (c[j] >= cstar) {  // (more than K only if composites repeat: corrupted data, kept in bounds)
      if (pos < K) sortbuf[pos] = c[j];
      ++pos;
    }
  __syncthreads();
  DDT_STAMP(3, "lse", 0);  // (the picked composites in sortbuf; the log-sum-exp follows)
  // The K picked composites, sorted descending by a bitonic network over the next power of two
  // P <= BUILD_THREADS (bitonic_desc; padding 0 sorts last). The composites are distinct (ids), so
  // the order is total and equals the reference's (logit desc, id asc). (Replaced a count of the
  // picked ones above each: K * K / BUILD_THREADS compares per thread.)
  static_assert(MAX_K <= BUILD_THREADS, "one picked composite per thread");
  const int n_pick = min(all, K);  // = K: the composites are distinct
  int P = 1;
  while (P < K) P <<= 1;
  u64 v = tid < n_pick ? sortbuf[tid] : 0ull;
  const bool sorts = tid < max(P, 32);  // (warp-uniform)
  if (lse_warp) {
    double2 t_pre = make_double2(0.0, 0.0);
    if (thr) t_pre = segment_sums_pre(p, row_id, S);
    row_lse(p, row_id, thr, S, n_cand, cmax, t_thr, t_pre, sm.lse);  // (P == BUILD_THREADS: before this warp's part of the sort)
  }
  DDT_STAMP_BY(LSE_WARP * 32, 28, "lsedone", 0);
  if (sorts) v = bitonic_desc(P, v, sortbuf, tid);
  else sort_barriers(P, 2, BUILD_THREADS - P);  // (P >= 64 here, or no barrier)
  DDT_STAMP(29, "sortdone", 0);
  __syncthreads();  // sm.lse (LSE_WARP, above) is visible
  store_row(p, row_id, v, sm.lse);
  DDT_STAMP(4, "sorted", 0);
}

// select_row out of line, for the threshold plans' cubin (HIST_MERGE), where it is the rare
// path; its shared memory from the declarations themselves (build_smem, the dynamic array) so that
// it addresses it as shared, not through a call's generic pointers.
__device__ __noinline__ void select_row_cold(const BuildParams& p, size_t row_id, bool thr, int S, int n_cand,
                                                   float tk_t) {
  extern __shared__ __align__(16) u8 dyn[];
  select_row(p, row_id, thr, S, n_cand, tk_t, build_smem, reinterpret_cast<u64*>(dyn));
}

// Merge one row's chunk candidates into its sorted top-K with log-probs.
// topk_mode = 1 and the row's threshold held: its candidates are the tk_count logits >= T
// (topk_threshold.cuh), which hold the row's maximum m; its log-sum-exp is
// m + log(exp(T - m) * (sum over its stream segments of their sums below and above T)).
// Otherwise the chunk top-K's candidates and per-chunk (max, sum of exp) statistics: the chunk
// kernel's (topk_mode = 0), or those chunk_fallback_row writes first (topk_mode = 1, T failed).
// A threshold row takes the hist path (merge_row_hist) when its candidates fit, and the select and
// the sort below only when crowded.
DL_DEVICE void merge_row(const BuildParams& p, int b, int d, BuildSmem& sm, u64* sortbuf) {
  const int K = p.k;
  const size_t row_id = static_cast<size_t>(b) * p.depth_limit + d;
  DDT_STAMP(0, "merge", 0);
  // topk_mode = 1: the row's flag, its count and T in one round trip to L2, then its candidate list
  // (the count's entries only), where the fallback test's flag, then the count, then the list took
  // three. (Loading the list's first tk_cap entries with them, whatever the count, moved 4-5x the
  // bytes at batch 8 and lost ~1 µs there: the twenty-fifth session's `one-trip`.)
  const bool tmode = p.topk_mode == TOPK_MODE_THRESHOLD;  // (uniform)
  u32 tk_flag = 0u, tk_n = 0u;
  float tk_t = 0.f;
  if (tmode) {
    tk_flag = p.tk_flag[row_id];
    tk_n = p.tk_count[row_id];
    tk_t = p.tk_thresh[row_id];
  }
  bool thr = tmode && !tk_fallback_of(p, tk_flag, tk_n);  // (uniform)
  DDT_STAMP(31, "counted", tk_n);  // (stamped builds: the first round trip to L2 returned)
  bool refined = false;
  if (tmode && !thr) {  // (uniform; rare) a threshold T' of the row's own, else the chunk top-K
    refined = p.logits_bf16 ? refine_row<bf16>(p, b, d, tk_flag, tk_n, tk_t, reinterpret_cast<u8*>(sortbuf))
                            : refine_row<float>(p, b, d, tk_flag, tk_n, tk_t, reinterpret_cast<u8*>(sortbuf));
    if (refined) {
      thr = true;
      tk_n = static_cast<u32>(build_smem.rn);
      tk_t = build_smem.rt;
    } else {
      __syncthreads();  // every thread has read refine_row's shared memory
      chunk_fallback_row(p, b, d, reinterpret_cast<u8*>(sortbuf));
    }
  }
  // S: the stream's segments (a refined row: 0, its sum relative to T' in build_smem.rsum) or the chunks
  const int S = thr ? (refined ? 0 : p.tk_nseg) : p.num_chunks;
  const int n_cand = thr ? static_cast<int>(tk_n) : S * K;  // thr: <= tk_cap <= the capacity
  // A threshold row whose candidates fit the workers' registers: ranked by one histogram
  // (merge_row_hist), unless crowded; every other row by the select and the sort, which the
  // threshold plans keep out of line (select_row_cold): inlined, the hist path jumped over
  // its ~4,400 instructions to the store and the search, and a jump over ~2,100 (the hist path,
  // inlined into the chunked plans) had cost their merge ~5 µs from cold instruction caches (out of
  // line, the threshold builds ran 0.5-3.8 µs faster on an H100: sixty-second session).
  if (HIST_MERGE && thr && n_cand <= HIST_WORKERS * MERGE_ELEMS && merge_row_hist(p, row_id, S, n_cand, tk_t)) return;  // (uniform)
  // (the stamps' --twice build, DDT_TWICE_REPS 2, inlines it: a call inside its loop of two merges
  // spilled 20 B)
  if (HIST_MERGE && DDT_TWICE_REPS == 1) select_row_cold(p, row_id, thr, S, n_cand, tk_t);
  else select_row(p, row_id, thr, S, n_cand, tk_t, sm, sortbuf);
}

// The synthetic log-probs of the code warmer: row d, rank k. Like a drafter row of random logits
// (-5.4 at rank 0 to ~-9.4 at rank 255: the trees are shallow, and the warmer's search is no
// slower than a request's), strictly decreasing in k (k plus a hashed fraction below 1 inside the
// log), and no two rows alike: a structured pattern (-0.3 d - 1.2 log1p(k)) made path sums tie
// within rounding, and the warmer's search took the one-warp heap, slower than the request's
// (s17 call 4).
DL_DEVICE float warm_lp(int d, int k) {
  const float frac = static_cast<float>(hash32(static_cast<u32>(d * 1024 + k)) >> 8) * 0x1p-24f;
  return -5.4f - 0.5f * log2f(1.f + static_cast<float>(k) + 0.999f * frac);
}

// The code warmer (ddtree_build's CTA (depth_limit, 0)) comes straight here, without a row to
// merge: it writes log-probs of its own to p.warm_scratch and runs the search and node code below
// -- the same instructions, one call site -- on them, with its nodes written to the scratch
// too. A request's search is one CTA's chain of phases, each entering code of its own; when a
// large read since the last build (a verify step, the accept's target logits, the model) has
// evicted the kernel from L2, each of those first misses goes to DRAM. The warmer starts with
// the merge and takes those misses ~10 µs before the request's search.
DL_DEVICE void build_tree(const BuildParams& p, BuildSmem& sm, u8* dyn) {
  const int d = build_column(), tid = threadIdx.x;
  const int D = p.depth_limit, K = p.k, N = p.budget + 1, W = p.n_words;
  const bool warmer = d == D;  // (uniform)
  // CTA (depth_limit, 1), when the kernel lets it in: the heap's code warmer. Its log-probs go
  // straight to its shared memory, and it runs three pops of the heap at the one call site below,
  // then leaves: the heap's code is in L2 before a deep request of a small budget takes the heap.
  const bool heap_warmer = warmer && blockIdx.y != 0;
  const int b = warmer ? 0 : static_cast<int>(blockIdx.y);
  int budget_b = heap_warmer ? min(p.budget, 3) : p.budget;
  float* const wlp = reinterpret_cast<float*>(p.warm_scratch);
  if (warmer) {
    float* const dst = heap_warmer ? reinterpret_cast<float*>(dyn) : wlp;
    for (int i = tid; i < D * K; i += BUILD_THREADS) dst[i] = warm_lp(i / K, i - i / K * K);
    __syncthreads();  // (the CTA's own stores: visible to its threads past the barrier)
  } else {
    u64* sortbuf = reinterpret_cast<u64*>(dyn);
    // (DDT_TWICE_REPS is 2 under tools/ddtree_stamps.py --twice, a diagnostic: the merge runs
    // twice, one copy of its code, and the second run's stamps overwrite the first's, so its
    // phases are those of warm instruction caches; the search below the same way. 1 otherwise.)
#pragma unroll 1
    for (int rep = 0; rep < DDT_TWICE_REPS; ++rep) {
      if (rep) __syncthreads();
      merge_row(p, b, d, sm, sortbuf);
    }

    // Every thread's top_ids / top_lp stores come before this barrier, and thread 0's fence after it
    // makes them visible at GPU scope before its counter increment (the release of cooperative
    // groups' grid sync: one fence per CTA; a fence in each of the 512 threads cost ~0.3 µs).
    __syncthreads();
    // The request's budget, loaded here so that its load travels with the counter's atomic (the
    // search's first loads, search_ends, need it); clamped past the barrier, where it has arrived.
    if (p.budgets) budget_b = p.budgets[b];
    // The last CTA's thread 0 re-arms the counter and fences again (the acquire of the other
    // rows' stores) before the barrier, which hands that order on to the CTA's other threads:
    // one fence per CTA, not one in each of the 512 threads.
    if (tid == 0) {
      __threadfence();
      const bool last = atomicAdd(&p.counters[b], 1u) == static_cast<u32>(D - 1);
      if (last) {
        p.counters[b] = 0u;  // ready for the next launch
        __threadfence();
      }
      sm.last = last;
    }
    __syncthreads();
    if (!sm.last) return;
    budget_b = min(max(budget_b, 0), p.budget);
    DDT_STAMP(5, "last", 0);
  }

  // ---- best-first search of request b (this CTA finished its last row)
  float* lp = reinterpret_cast<float*>(dyn);
  const size_t lp_end = (static_cast<size_t>(D) * K * 4 + 15) & ~static_cast<size_t>(15);
  u64* ovs = reinterpret_cast<u64*>(dyn + lp_end);
  u32* ovm = reinterpret_cast<u32*>(dyn + lp_end + static_cast<size_t>(N) * 8);
  NodeSmem ns;
  ns.par = reinterpret_cast<short*>(dyn + p.lp_bytes);
  ns.rank = ns.par + N;
  ns.dep = reinterpret_cast<u8*>(ns.rank + N);
  const float* glp = warmer ? wlp : p.top_lp + static_cast<size_t>(b) * D * K;
  const int kb = min(budget_b, K);
  // warp 0: the parallel search's bounds from the rows' ends, loaded with the rows (search.cuh)
  SearchEnds ends;
  if (tid < 32 && !heap_warmer) ends = search_ends(glp, K, kb, D);
  {  // the rows' log-probs into shared memory: eight loads in flight per thread, then the stores
    constexpr int LPU = 8;
    const int n = heap_warmer ? 0 : D * K;  // (the heap's warmer wrote its own)
#pragma unroll 1
    for (int base = 0; base < n; base += LPU * BUILD_THREADS) {
      float r[LPU];
#pragma unroll
      for (int u = 0; u < LPU; ++u) {
        const int i = base + u * BUILD_THREADS + tid;
        r[u] = i < n ? __ldcg(glp + i) : 0.f;
      }
#pragma unroll
      for (int u = 0; u < LPU; ++u) {
        const int i = base + u * BUILD_THREADS + tid;
        if (i < n) lp[i] = r[u];
      }
    }
  }
  if (tid == 0) { ns.par[0] = -1; ns.rank[0] = -1; ns.dep[0] = 0; }
  if (tid < 32 && kb > 0) search_bounds(ends, kb, D, budget_b, sm.search);
  __syncthreads();
  DDT_STAMP(6, "lp", 0);
  int popped = 0;
  if (budget_b > 0 && kb > 0 && D > 0) {
#pragma unroll 1
    for (int rep = 0; rep < DDT_TWICE_REPS; ++rep) {  // (--twice: the same call site twice, the first result dropped)
      if (rep) __syncthreads();
      // The deep requests of a small budget (search_bounds' s.dev) take the deviation search. (The
      // code warmer does not run it: on bench_ddtree's star rows at budget 16 its extra search
      // made the warmer the build's last CTA, +4.6 µs at batch 1; fortieth session, call 5.)
      if ((p.flags & FLAG_LEGACY_SEARCH) || heap_warmer) popped = -1;
      else if (DL_DEV_SEARCH && sm.search.dev) popped = dev_search(lp, K, kb, D, budget_b, sm.search, ns);
      else popped = parallel_search(lp, K, kb, D, budget_b, sm.search, sm.ri, ns);
    }
    if (popped < 0) {  // the exact heap of the reference, one warp
      if (tid < 32) {
        const int c = heap_select(lp, K, kb, D, budget_b, ovs, ovm, ns);
        if (tid == 0) sm.ri[0] = c;
      }
      __syncthreads();
      popped = sm.ri[0];
    }
  }
  if (heap_warmer) return;  // (uniform)
  const int count = popped + 1;
  DDT_STAMP(23, "searched", popped);

  // ---- nodes and ancestor masks
  // A node's token id is a global load that waits on the search's nodes: it is issued here and
  // stored last, so that its round trip overlaps the masks' work instead of coming before it.
  // (The ids next to the log-probs in shared memory would take D * K * 4 more bytes: 64 KB at
  // depth 32 and K 512, past the 99 KB per block of sm_86 / sm_89 / sm_120.)
  // (the warmer: its log-probs' bits as token ids, and its nodes after them in the scratch)
  const i32* gids = warmer ? p.warm_scratch : p.top_ids + static_cast<size_t>(b) * D * K;
  const size_t base = static_cast<size_t>(b) * N;
  i32* const wout = p.warm_scratch + D * K;
  i32* const o_depths = warmer ? wout : p.depths + base;
  i32* const o_parents = warmer ? wout + N : p.parents + base;
  i32* const o_tokens = warmer ? wout + 2 * N : p.tokens + base;
  u32* const o_anc = warmer ? reinterpret_cast<u32*>(wout + 3 * N) : p.anc + base * W;
  i32* const o_count = warmer ? wout + 3 * N + N * W : p.node_counts + b;
  constexpr int NODE_PER = (MAX_K + 1 + BUILD_THREADS - 1) / BUILD_THREADS;  // N <= MAX_K + 1
  int tok[NODE_PER];
#pragma unroll
  for (int e = 0; e < NODE_PER; ++e) {
    const int i = tid + e * BUILD_THREADS;
    int dep = -1, par = -1;
    tok[e] = -1;
    if (i == 0) {
      tok[e] = p.root_tokens[b];
      dep = 0;
    } else if (i < count) {
      dep = ns.dep[i];
      par = ns.par[i];
      tok[e] = __ldcg(gids + (dep - 1) * K + ns.rank[i]);
    }
    if (i < N) {
      o_depths[i] = dep;
      o_parents[i] = par;
    }
  }
  u32* words = reinterpret_cast<u32*>(dyn);  // the log-probs are no longer needed
  // (The node phase runs once per build, on code no earlier phase fetched: in Nsight most of its
  // samples wait on instruction fetch, no_inst. Its two loops stay rolled: the compiler's copies
  // unrolled by four, with their remainders, were ~200 SASS instructions to fetch cold.)
#pragma unroll 1
  for (int i = tid; i < N * W; i += BUILD_THREADS) words[i] = 0u;
  __syncthreads();
  for (int i = tid; i < count; i += BUILD_THREADS) {
    for (int a = i; a >= 0; a = ns.par[a]) words[i * W + (a >> 5)] |= 1u << (a & 31);
  }
  __syncthreads();
#pragma unroll 1
  for (int i = tid; i < N * W; i += BUILD_THREADS) o_anc[i] = words[i];
#pragma unroll
  for (int e = 0; e < NODE_PER; ++e) {
    const int i = tid + e * BUILD_THREADS;
    if (i < N) o_tokens[i] = tok[e];
  }
  if (tid == 0) *o_count = count;
  DDT_STAMP(24, "nodes", count);
}

}  // namespace ddt
