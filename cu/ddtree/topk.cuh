// ddtree/topk.cuh: stage 1a, the chunk top-K (ddtree_topk_chunks_*): one CTA per 7,680-token chunk
// of one depth row.
//
// Part of the one translation unit cu/ddtree.cu (see its header for the kernels).
#pragma once
#include "keys.cuh"
#include "topk_threshold.cuh"

namespace ddt {

// ------------------------------------------------------------------------------ chunk top-K

constexpr int TOPK_WARPS = TOPK_THREADS / 32;

constexpr int LIST_CAP = 4096;  // chunk candidates above the cutoff that the select visits as a list

struct ChunkSmem {
  SelectSmem sel;
  unsigned short list[LIST_CAP];  // slots (j * TOPK_THREADS + t) of the candidates
  int ri[32];
  u32 wmax[TOPK_WARPS];
  double wse[TOPK_WARPS];
  float wsum[TOPK_WARPS], wsq[TOPK_WARPS];
  u32 key[TOPK_ELEMS * TOPK_THREADS];  // slot j of thread t at [j * TOPK_THREADS + t]
};

// Of the logits equal to the threshold key t, keep the `need` with the lowest token ids:
// returns a mask over this thread's TOPK_ELEMS slots. Tokens are ranked group by group in
// id order (a group = the V slots of one vector), one block scan per group. `lane` false: a
// thread past the chunk's TOPK_THREADS (topk_one_chunk's NT > TOPK_THREADS) holds no slot.
template <int V, int NT = TOPK_THREADS>
DL_DEVICE u32 keep_lowest_ids(const u32* key, u32 t, int need, int* scratch, bool lane = true) {
  u32 ties = 0;  // bit j: slot j holds the threshold key
#pragma unroll
  for (int j = 0; j < TOPK_ELEMS; ++j) ties |= (lane && key[j * TOPK_THREADS] == t ? 1u : 0u) << j;
  u32 keep = 0;
  int before = 0;
#pragma unroll 1
  for (int g = 0; g < TOPK_ELEMS / V; ++g) {
    const u32 mine = (ties >> (g * V)) & ((1u << V) - 1);
    int total;
    int quota = need - before - dl::block_excl_scan<NT>(__popc(mine), scratch, &total);
#pragma unroll
    for (int e = 0; e < V; ++e) {
      if ((mine >> e) & 1u) {
        keep |= (quota > 0 ? 1u : 0u) << (g * V + e);
        --quota;
      }
    }
    before += total;
  }
  return keep;
}

// One CTA, one CHUNK-token chunk s of depth row d of request b. The order keys live in shared
// memory (few registers, so several CTAs share an SM); the chunk's max, sum of exp and the
// moments of the normal cutoff come from one block reduction; then the exact top-kc by (logit
// desc, id asc) (kth_largest on the keys, ties at the threshold by id) is written with one
// block scan.
// NT: the CTA's threads. The chunk kernel has NT = TOPK_THREADS; ddtree_build (NT =
// BUILD_THREADS, the threshold top-K's fallback for a row it failed: build.cuh) runs the same
// code, its threads past TOPK_THREADS (whole warps) holding no slot: they pass every barrier and
// add nothing (no load, no shared slot, key 0 below every cut, no warp statistics).
template <typename T, int NT = TOPK_THREADS>
DL_DEVICE void topk_one_chunk(const TopKParams& p, ChunkSmem& sm, int s, int d, int b) {
  static_assert(NT >= TOPK_THREADS && NT % 32 == 0 && TOPK_THREADS % 32 == 0, "whole warps past the chunk's threads");
  static_assert(NT / 32 <= 32, "block_excl_scan and block_sum_int: one scratch slot (sm.ri) per warp");
  using Tr = LogitTraits<T>;
  constexpr int V = Tr::VEC;
  const int tid = threadIdx.x;
  const bool lane = NT == TOPK_THREADS || tid < TOPK_THREADS;  // (warp-uniform; always true in the chunk kernel)
  const bool live = p.active[b] != 0;  // checked after the logits loads are in flight
  const int start = s * CHUNK;
  const int n = min(CHUNK, p.vocab - start);
  const int nl = lane ? n : 0;  // the tokens this thread may load: none past TOPK_THREADS
  const bool vec = p.logits_vec != 0;
  const T* row = static_cast<const T*>(p.logits) + static_cast<i64>(b) * p.logits_batch_stride +
                 static_cast<i64>(d) * p.logits_row_stride + start;
  // Slot j of this thread is token start + ((j / V) * TOPK_THREADS + tid) * V + j % V: one
  // 16-byte vector per group of V slots (element loads when the rows are not aligned).
  const int tok0 = start + tid * V;
  auto token = [&](int j) { return tok0 + (j / V) * (TOPK_THREADS * V) + (j % V); };
  u32* skey = sm.key + tid;  // slot j at skey[j * TOPK_THREADS]

  u32 kloc = 0;  // keys order like the logits: the thread's max without decoding
  float sum = 0.f, sumsq = 0.f;
  {
    u32 key[TOPK_ELEMS];  // 0 past the row's end
    if (vec) {
#pragma unroll
      for (int v = 0; v < TOPK_ELEMS / V; ++v) {
        const int li = (v * TOPK_THREADS + tid) * V;
        float x[V];
        if (li < nl) Tr::load_vec(row + li, x);
#pragma unroll
        for (int e = 0; e < V; ++e) key[v * V + e] = li < nl ? logit_key(x[e]) : 0u;
      }
    } else {
#pragma unroll
      for (int j = 0; j < TOPK_ELEMS; ++j) {
        const int li = token(j) - start;
        key[j] = li < nl ? logit_key(Tr::load(row + li)) : 0u;
      }
    }
    if (!live) return;  // (uniform)
    if (lane) {
#pragma unroll
      for (int j = 0; j < TOPK_ELEMS; ++j) {
        skey[j * TOPK_THREADS] = key[j];
        kloc = key[j] > kloc ? key[j] : kloc;
      }
    }
  }
  {
    // -inf (and NaN) logits add nothing to the sums: exp(-inf) = 0, and a thread (warp, chunk)
    // holding nothing above -inf contributes 0 (not exp(-inf - -inf) = NaN).
    const bool fin = kloc > KEY_NEG_INF;
    const float mloc = fin ? key_f32(kloc) : 0.f;
    float se = 0.f;
#pragma unroll
    for (int j = 0; j < TOPK_ELEMS; ++j) {  // from shared memory: the loaded values are dead
      const u32 k = lane ? skey[j * TOPK_THREADS] : 0u;
      if (k > KEY_NEG_INF) {
        const float x = key_f32(k);
        sum += x;
        sumsq += x * x;
        se += __expf(x - mloc);
      }
    }
    // one reduction round: warp max, sums rescaled to it, then the warps' values in shared memory
    const u32 wk = __reduce_max_sync(FULL, kloc);
    double wse = fin ? static_cast<double>(se * expf(mloc - key_f32(wk))) : 0.0;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      wse += __shfl_xor_sync(FULL, wse, o);
      sum += __shfl_xor_sync(FULL, sum, o);
      sumsq += __shfl_xor_sync(FULL, sumsq, o);
    }
    if (lane && (tid & 31) == 0) {
      sm.wmax[tid >> 5] = wk;
      sm.wse[tid >> 5] = wse;
      sm.wsum[tid >> 5] = sum;
      sm.wsq[tid >> 5] = sumsq;
    }
  }
  __syncthreads();
  u32 kmax = 0;
  double dsum = 0.0, dsq = 0.0;
#pragma unroll
  for (int w = 0; w < TOPK_WARPS; ++w) {
    kmax = sm.wmax[w] > kmax ? sm.wmax[w] : kmax;
    dsum += sm.wsum[w];
    dsq += sm.wsq[w];
  }
  const size_t row_id = (static_cast<size_t>(b) * p.depth_limit + d) * p.num_chunks + s;
  if (tid == 0) {
    const float m = key_f32(kmax);
    double total = 0.0;
    for (int w = 0; w < TOPK_WARPS; ++w)
      if (sm.wmax[w] > KEY_NEG_INF) total += sm.wse[w] * static_cast<double>(expf(key_f32(sm.wmax[w]) - m));
    p.chunk_max[row_id] = m;
    p.chunk_sum[row_id] = total;
  }
  const int kc = min(p.k, n);
  u32 t = 1;          // picked: key > t, or key == t and bit j of `tie_keep`
  u32 tie_keep = ~0u;  // (kc == n: every logit of the chunk)
  if (kc < n) {
    // Cutoff: treat the chunk as roughly normal and keep about OVERSAMPLE * kc candidates;
    // fall back to every logit when fewer than kc pass.
    const double mean = dsum / n, sq = dsq / n;
    const float frac = static_cast<float>(OVERSAMPLE) * kc / n;
    u32 kcut = 1;
    if (frac < 0.5f) {
      const float z = 1.41421356f * erfinvf(1.f - 2.f * frac);
      kcut = max(f32_key(static_cast<float>(mean + z * sqrt(fmax(sq - mean * mean, 0.0)))), 1u);
    }
    u32 mine = 0;  // bit j: slot j passes the cutoff
#pragma unroll
    for (int j = 0; j < TOPK_ELEMS; ++j) {
      const u32 k = lane ? skey[j * TOPK_THREADS] : 0u;
      mine |= ((k >= kcut && k != 0) ? 1u : 0u) << j;
    }
    int total;
    int pos = dl::block_excl_scan<NT>(__popc(mine), sm.ri, &total);
    // Usually the candidates go to a list and the select visits ~total/TOPK_THREADS of them per
    // thread and level; when fewer than kc pass (kcut = 1: every logit) or more than the list
    // holds, it visits every slot.
    const bool listed = total >= kc && total <= LIST_CAP;
    if (total < kc) kcut = 1;
    if (listed) {
      for (u32 m = mine; m; m &= m - 1) sm.list[pos++] = static_cast<unsigned short>((__ffs(m) - 1) * TOPK_THREADS + tid);
    }
    const int ecount = listed ? (total + TOPK_THREADS - 1) / TOPK_THREADS : TOPK_ELEMS;
    t = kth_largest<NT, TOPK_ELEMS, u32>(
        [&](int j, int z) -> u32 {
          if (!lane) return 0u;  // (below every cut)
          if (listed) {
            const int q = j * TOPK_THREADS + tid;
            return q < total ? sm.key[sm.list[q]] + static_cast<u32>(z) : 0u;
          }
          return skey[j * TOPK_THREADS] + static_cast<u32>(z);
        },
        kmax, kcut, kc, sm.sel, ecount);
    int above = 0, ties = 0;
#pragma unroll
    for (int j = 0; j < TOPK_ELEMS; ++j) {
      const u32 k = lane ? skey[j * TOPK_THREADS] : 0u;
      above += k > t;
      ties += k == t;
    }
    // above and ties in one reduction: ties in the low 16 bits (at most CHUNK each)
    const int packed = dl::block_sum_int<NT>((above << 16) | ties, sm.ri);
    const int need = kc - (packed >> 16);
    if ((packed & 0xffff) > need) tie_keep = keep_lowest_ids<V, NT>(skey, t, need, sm.ri, lane);
  }
  // Write the kc picked logits (in no particular order: the row merge sorts).
  u32 picked = 0;
#pragma unroll
  for (int j = 0; j < TOPK_ELEMS; ++j) {
    const u32 k = lane ? skey[j * TOPK_THREADS] : 0u;
    picked |= ((k > t || (k == t && k != 0 && ((tie_keep >> j) & 1u))) ? 1u : 0u) << j;
  }
  int total_picked;
  int pos = dl::block_excl_scan<NT>(__popc(picked), sm.ri, &total_picked);
  u64* out = p.cand + row_id * p.k;
#pragma unroll
  for (int j = 0; j < TOPK_ELEMS; ++j)
    if ((picked >> j) & 1u) out[pos++] = composite(skey[j * TOPK_THREADS], token(j));
}

// Grid (num_chunks, depth_limit, max_batch): one CTA per chunk. topk_mode = 0 only: the build's
// first kernel, an ordinary launch (the threshold top-K's fallback for the rows it fails runs in
// ddtree_build itself: build.cuh, chunk_fallback_row).
template <typename T>
DL_DEVICE void topk_chunk(const TopKParams& p) {
  __shared__ ChunkSmem sm;
  const int d = blockIdx.y, b = blockIdx.z;
  // The build's state (ddtree_build waits for this grid first).
  if (blockIdx.x == 0 && d == 0 && threadIdx.x == 0) rearm_build_state(p, b);
  // PDL (common.cuh): ddtree_build may start now (its pdl_wait() waits for this whole grid).
  DDT_TK_STAMP(DDT_TK_ROW_CHUNKS, 0, "entry");
  dl::pdl_launch_dependents();
  topk_one_chunk<T>(p, sm, blockIdx.x, d, b);
  DDT_TK_STAMP(DDT_TK_ROW_CHUNKS, 2, "exit");
}

}  // namespace ddt
