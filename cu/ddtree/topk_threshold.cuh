// ddtree/topk_threshold.cuh: stage 1a of topk_mode = 1 (DDTreePlan(topk="threshold")): the
// threshold top-K. ddtree_topk_sample_* picks a per-row threshold T from a stratified sample,
// ddtree_topk_stream_* reads every row once through a shared-memory ring and keeps the logits
// >= T (plus each segment's max and sum of exp); the chunk top-K (topk.cuh) then runs only for
// rows where T failed (fewer than K or more than tk_cap logits >= T, or T not finite), and
// ddtree_build merges whichever list the row has.
// Host-side layout and the numpy twin: driverlevel/_topk_threshold.py,
// driverlevel/reference/topk_threshold.py.
//
// Part of the one translation unit cu/ddtree.cu (see its header for the kernels).
#pragma once
#include "keys.cuh"

namespace ddt {

// ------------------------------------------------------------------------------ shared rule

// The row takes the chunk top-K (the exact fallback): T not finite, or the stream's count says
// that the logits >= T do not hold the top K, or that they did not fit the candidate list.
DL_DEVICE bool tk_fallback(const TopKParams& p, size_t row) {
  if (p.tk_flag[row] != 0u) return true;
  const u32 n = p.tk_count[row];
  return n < static_cast<u32>(p.k) || n > static_cast<u32>(p.tk_cap);
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
// TK_SAMPLE_VALUES / G strata), the exact tk_m-th largest order key (the tokens:
// driverlevel._topk_threshold.sample_groups).
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
      if (p.logits_vec) {
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
  u32 kloc = 0;
#pragma unroll
  for (int j = 0; j < TK_SAMPLE_PER; ++j) kloc = key[j] > kloc ? key[j] : kloc;
  const u32 kmax = static_cast<u32>(dl::block_max_u64<TK_SAMPLE_THREADS>(kloc, sm.r64));
  // tk_m <= the sampled values (host: driverlevel._topk_threshold.sample_rank), all keys >= 1
  return kth_largest<TK_SAMPLE_THREADS, TK_SAMPLE_PER, u32>(
      [&](int j, int z) -> u32 { return key[j] + static_cast<u32>(z); }, kmax, 1u, p.tk_m, sm.sel);
}

// One CTA per row: T from the sample, the flag, and the row's candidate count re-armed (every
// launch: no state survives an earlier or aborted one).
template <typename T>
DL_DEVICE void topk_sample(const TopKParams& p) {
  __shared__ SampleSmem sm;
  const int d = blockIdx.x, b = blockIdx.y, tid = threadIdx.x;
  // PDL (common.cuh): the stream kernel may start now and issue its first logits tiles. Safe at
  // once: it reads nothing this kernel writes before its pdl_wait(), which waits for this whole
  // grid. This kernel is the build's first, an ordinary launch: all it reads (logits, active) is
  // complete and visible before it starts, so it has no wait of its own.
  dl::pdl_launch_dependents();
  const size_t row = static_cast<size_t>(b) * p.depth_limit + d;
  if (!p.active[b]) {  // (uniform) the build skips the request; the chunk kernel's gate too
    if (tid == 0) { p.tk_count[row] = 0u; p.tk_flag[row] = 1u; }
    return;
  }
  const T* x = static_cast<const T*>(p.logits) + static_cast<i64>(b) * p.logits_batch_stride +
               static_cast<i64>(d) * p.logits_row_stride;
  const u32 t = sample_threshold<T>(p, x, sm);
  if (tid == 0) {
    const float tf = key_f32(t);
    p.tk_thresh[row] = tf;
    p.tk_count[row] = 0u;  // the stream kernel counts from here
    p.tk_flag[row] = (t <= KEY_NEG_INF || !isfinite(tf)) ? 1u : 0u;
  }
}

// ------------------------------------------------------------------------------ stream

constexpr int TK_STREAM_WARPS = TK_STREAM_THREADS / 32;

struct StreamSmem {
  u64 stage[TK_STREAM_WARPS][TK_WARP_STAGE];      // the warps' candidate staging
  float wmax[TK_STREAM_WARPS];
  double wsum[TK_STREAM_WARPS];
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
  for (int i = 0; i < 4; ++i) {
    v[2 * i] = __uint_as_float(w[i] << 16);
    v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
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

// One CTA: tk_seg_len tokens of one row, tile by tile (TK_STREAM_THREADS x 16 tokens: 16 KB of
// fp32, 8 KB of bf16). Aligned rows (logits_vec) stream through a ring of tiles in the dynamic
// shared memory (as many as it holds, up to 8; the launch sizes it) filled by cp.async (each
// thread copies and reads back only its own 16-byte vectors: no block barrier), all but one in
// flight ahead of the tile processed (the first ones issued before the row's T and flag are
// read). Unaligned rows, or a ring of fewer than 2 tiles, load each tile directly. Per logit:
// one compare with T and exp2(x - T) into the thread's sum of the logits below T; a tile where
// some lane holds logits >= T (a few per warp tile) appends them as composites through the
// warp's shared staging buffer and folds them into the thread's (max, sum) above T. At the end
// the CTA's max and sum of exp (relative to that max) go to tk_max / tk_sum of its segment.
template <typename T>
DL_DEVICE void topk_stream(const TopKParams& p) {
  using Tr = LogitTraits<T>;
  constexpr int V = Tr::VEC;
  constexpr int U = V == 4 ? TK_STREAM_VECS : TK_STREAM_VECS / 2;  // 16-byte vectors per thread and tile
  constexpr int TILE = TK_STREAM_THREADS * U * V;
  static_assert(U * V == 16, "one candidate bit per logit of a thread's tile");
  constexpr u32 NEG_WORD = V == 4 ? 0xff800000u : 0xff80ff80u;  // a 32-bit word of -inf logits
  __shared__ StreamSmem sm;
  extern __shared__ uint4 tk_ring[];  // [stages][U][TK_STREAM_THREADS]
  const int s = blockIdx.x, d = blockIdx.y, b = blockIdx.z, tid = threadIdx.x;
  const int lane = tid & 31, warp = tid >> 5;
  const size_t row = static_cast<size_t>(b) * p.depth_limit + d;
  // PDL (common.cuh): the chunk kernel may start now; its pdl_wait() waits for this whole grid
  // (and so, through this grid's own waits below, for the sample kernel too).
  dl::pdl_launch_dependents();
  // Before the wait this kernel reads only what was written before the build's first (ordinary)
  // launch, the sample kernel, started: active and the logits; it writes nothing global.
  if (!p.active[b]) {  // (uniform) the build skips the request
    dl::pdl_wait();    // every CTA waits before it exits (common.cuh)
    return;
  }
  const int start = s * p.tk_seg_len;
  const int end = min(p.vocab, start + p.tk_seg_len);
  const int ntiles = (end - start + TILE - 1) / TILE;
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
    for (int i = 0; i < stages - 1; ++i) {  // one commit group per tile, empty past the segment
      if (i < ntiles) issue(i, i);
      dl::cp_async_commit();
    }
  }
  // PDL: the sample kernel's T, flag and zeroed count are read (and the count, candidates and
  // segment statistics written) only after it has completed; the tiles above are in flight.
  dl::pdl_wait();

  if (p.tk_flag[row] != 0u) {  // (uniform) T is not finite: the chunk top-K takes the row
    if (vec) dl::cp_async_wait<0>();
    return;
  }
  const float thr = p.tk_thresh[row];
  u32* count = p.tk_count + row;  // zeroed by the sample kernel
  u64* out = p.tk_cand + row * static_cast<size_t>(p.tk_cap);
  const u32 cap = static_cast<u32>(p.tk_cap);
  u64* stage = sm.stage[warp];

  float slo = 0.f;           // sum of exp(x - thr) over this thread's logits below thr (NaN, -inf: 0)
  float mhi = DL_NEG_INF;    // max and sum of exp(x - mhi) over its logits >= thr
  float shi = 0.f;
  int fill = 0;              // (warp-uniform) staged candidates
  int rd = 0, wr = stages - 1;  // ring slots of tile i and of tile i + stages - 1
#pragma unroll 1
  for (int i = 0; i < ntiles; ++i) {
    uint4 q[U];
    const uint4* slot = col + rd * U * TK_STREAM_THREADS;
    if (vec) {
      if (i + stages - 1 < ntiles) issue(i + stages - 1, wr);
      dl::cp_async_commit();
      tk_wait_groups(stages - 1);  // tile i has landed (this thread's copies)
#pragma unroll
      for (int u = 0; u < U; ++u)
        q[u] = i * TILE + u * VSTEP < rem ? slot[u * TK_STREAM_THREADS] : make_uint4(NEG_WORD, NEG_WORD, NEG_WORD, NEG_WORD);
      rd = rd + 1 == stages ? 0 : rd + 1;
      wr = wr + 1 == stages ? 0 : wr + 1;
    } else {
#pragma unroll
      for (int u = 0; u < U; ++u) q[u] = tk_load_raw<T>(x, start + i * TILE + u * VSTEP + tid * V, end);
    }
    u32 mask = 0;  // bit u * V + e: token start + i * TILE + u * VSTEP + tid * V + e is >= thr (never NaN)
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float v[V];
      tk_unpack(q[u], v);
#pragma unroll
      for (int e = 0; e < V; ++e) {
        const float xv = v[e];
        const bool ge = xv >= thr;
        mask |= (ge ? 1u : 0u) << (u * V + e);
        // NaN: fmaxf gives -200, exp2 -> 0; -inf -> 0; candidates are summed above thr instead
        const float ev = ex2_approx(fmaxf((xv - thr) * LOG2E, -200.f));
        slo += ge ? 0.f : ev;
      }
    }
    if (__any_sync(FULL, mask != 0u)) {
      const int c = __popc(mask);
      int incl = c;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(FULL, incl, o);
        if (lane >= o) incl += y;
      }
      const int tot = __shfl_sync(FULL, incl, 31);
      if (fill + tot > TK_WARP_STAGE) {
        tk_flush(stage, fill, count, out, cap, lane);
        fill = 0;
      }
      const bool direct = tot > TK_WARP_STAGE;  // (uniform) more than a stage: straight to the list
      u32 pos = static_cast<u32>(fill + incl - c);
      if (direct) {
        u32 base = 0;
        if (lane == 0) base = atomicAdd(count, static_cast<u32>(tot));
        pos += __shfl_sync(FULL, base, 0);
      }
      for (u32 m = mask; m; m &= m - 1) {
        const int bit = __ffs(m) - 1;
        const int u = bit / V, e = bit % V;
        const int tok = start + i * TILE + u * VSTEP + tid * V + e;
        // this thread's own copy in the ring (vec), else the tile's load again (an L1 hit)
        const uint4* w = slot + u * TK_STREAM_THREADS;
        const float xv = vec ? (V == 4 ? reinterpret_cast<const float*>(w)[e]
                                       : __uint_as_float(static_cast<u32>(reinterpret_cast<const unsigned short*>(w)[e]) << 16))
                             : Tr::load(x + tok);
        if (xv > mhi) {
          shi = shi * ex2_approx((mhi - xv) * LOG2E) + 1.f;
          mhi = xv;
        } else {
          shi += ex2_approx((xv - mhi) * LOG2E);
        }
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
  }
  if (vec) dl::cp_async_wait<0>();  // (only empty groups are left)
  if (fill > 0) tk_flush(stage, fill, count, out, cap, lane);

  // The segment's max and sum of exp: thread (m_t, s_t), then warp, then block (fixed order).
  const float mt = fmaxf(thr, mhi);
  const float st = slo * ex2_approx((thr - mt) * LOG2E) + (shi > 0.f ? shi * ex2_approx((mhi - mt) * LOG2E) : 0.f);
  const float wm = dl::warp_max(mt);
  double ws = static_cast<double>(st * ex2_approx((mt - wm) * LOG2E));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) ws += __shfl_xor_sync(FULL, ws, o);
  if (lane == 0) {
    sm.wmax[warp] = wm;
    sm.wsum[warp] = ws;
  }
  __syncthreads();
  if (tid < 32) {  // lane w: warp w's term (one double exp each, not eight in a row)
    const float m = dl::warp_max(lane < TK_STREAM_WARPS ? sm.wmax[lane] : DL_NEG_INF);
    double t = lane < TK_STREAM_WARPS ? sm.wsum[lane] * exp(static_cast<double>(sm.wmax[lane]) - m) : 0.0;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(FULL, t, o);
    if (lane == 0) {
      const size_t at = row * static_cast<size_t>(p.tk_nseg) + s;
      p.tk_max[at] = m;
      p.tk_sum[at] = t;
    }
  }
}

}  // namespace ddt
