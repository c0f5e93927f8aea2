// BASELINE (benchmarks only): the verify-attention kernel as of 2026-11-30 (host-fixed num_splits,
// workspace max_batch x max_q x heads x num_splits), kept to measure the scheduler of issue 9 against
// it side by side in one run. Not shipped, not used by the package.
// verify_attention.cu: split-KV verify attention for MLA draft trees (absorbed form).
//
// Pairs with driverlevel/verify_attention.py (the plan that sizes, validates and launches).
//
// Problem. Request b has q_len draft tokens (rows qo_indptr[b] .. qo_indptr[b+1]) and a
// committed prefix of kv_len slots (kv_indices[kv_indptr[b] .. kv_indptr[b+1]]). Every
// (draft token i, query head h) pair is one row of 576 bf16 values; the rows of a request are
// contiguous in q ([total_q, H, 576]), row = i*H + h. The single latent KV head is a cache
// row of 576 bf16 (scores use all 576, values are its first 512). Row (i, h) attends to the
// whole prefix and to the draft tokens j of its request that the mask marks visible (their
// K/V rows sit at slots out_cache_loc[qo_indptr[b] + j]). Keys are numbered prefix first
// (0 .. kv_len-1) then draft tokens (kv_len + j).
//
// verify_attn_partial
//   Grid  (ceil(max_q*H / M), num_splits, max_batch); Block THREADS = (M/16)*C warps.
//   A CTA takes M consecutive rows of one request and one split of its key tiles (N keys a
//   tile). Warps form M/16 row groups of C warps each; the C warps of a group own the same
//   16 rows, each computes S = Q K^T on 1/C of the 576-dim contraction, they sum the partial
//   S through shared memory (fixed order, so every warp holds bit-identical S), and each
//   accumulates P V for 512/C of the value columns. K tiles are read once into shared memory
//   by cp.async (STAGES deep) and their first 512 columns serve as V. Softmax is online, in
//   base 2, fp32. A split with one active piece writes the bf16 output and the LSE directly;
//   otherwise it writes fp32 partial output + LSE to the workspace for verify_attn_merge.
//   Shared memory: Q tile M*1168 B + K stages STAGES*N*1168 B + S exchange 2*WARPS*N*64 B
//   (rows padded by 16 B so ldmatrix is free of bank conflicts).
//   Early exits: request beyond batch_size, row tile beyond q_len*H, split beyond the
//   request's active splits. Nothing per step is baked into the grid: lengths, indices and
//   masks are read from device memory, so one captured graph serves any step.
//
// verify_attn_merge
//   Grid (ceil(max_q*H / 8), max_batch); Block 256 (one warp per row). Merges the active
//   splits' partials by their LSE; exits at once for requests whose rows were finished by
//   a single split.
//
// Split rule (shared by both kernels): tiles = ceil((kv_len+q_len)/N);
//   per_split = ceil(tiles/num_splits); active = ceil(tiles/per_split).
//
// Configuration (compile-time, from the launcher): DL_ROWS (M), DL_CSPLIT (C), DL_KEYS (N),
// DL_STAGES. The launcher picks the largest tile that fits the architecture's shared memory.
#include "common.cuh"

#ifndef DL_ROWS
#define DL_ROWS 32
#endif
#ifndef DL_CSPLIT
#define DL_CSPLIT 4
#endif
#ifndef DL_KEYS
#define DL_KEYS 16
#endif
#ifndef DL_STAGES
#define DL_STAGES 2
#endif

enum MaskMode : int { kMaskFull = 0, kMaskQlenOnly = 1, kMaskBitmask = 2, kMaskCausal = 3 };

// The host-device contract; mirrored by driverlevel.verify_attention._Params (ctypes).
struct VerifyAttnParams {
  const bf16* q;              // [total_q, H, 576]
  const bf16* kv_cache;       // [num_slots, 576]; V = first 512 columns
  const i64* qo_indptr;       // [bs+1] draft-token offsets
  const i32* kv_indptr;       // [bs+1] prefix offsets into kv_indices
  const i64* kv_indices;      // prefix slot ids
  const i64* out_cache_loc;   // [total_q] slots of the draft tokens' K/V
  const void* mask;           // u8 (FULL, QLEN_ONLY) or u32 words (BITMASK); null for causal
  const i64* mask_indptr;     // [bs+1] offsets into mask (FULL, QLEN_ONLY)
  bf16* out;                  // [total_q, H, 512]
  float* lse;                 // [total_q, H] natural-log LSE, or null
  float* o_part;              // [rows_cap, num_splits, 512] fp32 partial outputs
  float* lse_part;            // [rows_cap, num_splits] fp32 partial LSE (base 2, scaled)
  float scale_log2;           // sm_scale * log2(e)
  i32 num_heads;
  i32 batch_size;
  i32 num_splits;
  i32 mask_mode;
  i32 mask_words;             // uint32 words per draft token (BITMASK)
};

#ifdef DL_OFF_q
DL_CHECK_OFFSET(VerifyAttnParams, q);
DL_CHECK_OFFSET(VerifyAttnParams, kv_cache);
DL_CHECK_OFFSET(VerifyAttnParams, qo_indptr);
DL_CHECK_OFFSET(VerifyAttnParams, kv_indptr);
DL_CHECK_OFFSET(VerifyAttnParams, kv_indices);
DL_CHECK_OFFSET(VerifyAttnParams, out_cache_loc);
DL_CHECK_OFFSET(VerifyAttnParams, mask);
DL_CHECK_OFFSET(VerifyAttnParams, mask_indptr);
DL_CHECK_OFFSET(VerifyAttnParams, out);
DL_CHECK_OFFSET(VerifyAttnParams, lse);
DL_CHECK_OFFSET(VerifyAttnParams, o_part);
DL_CHECK_OFFSET(VerifyAttnParams, lse_part);
DL_CHECK_OFFSET(VerifyAttnParams, scale_log2);
DL_CHECK_OFFSET(VerifyAttnParams, num_heads);
DL_CHECK_OFFSET(VerifyAttnParams, batch_size);
DL_CHECK_OFFSET(VerifyAttnParams, num_splits);
DL_CHECK_OFFSET(VerifyAttnParams, mask_mode);
DL_CHECK_OFFSET(VerifyAttnParams, mask_words);
static_assert(sizeof(VerifyAttnParams) == DL_SIZEOF_PARAMS, "VerifyAttnParams size differs from its ctypes mirror");
#endif

namespace va {
constexpr int kQK = 576;                       // q/k head dim (512 latent + 64 rope)
constexpr int kV = 512;                        // value dim
constexpr int M = DL_ROWS;                     // rows per CTA
constexpr int C = DL_CSPLIT;                   // warps sharing 16 rows
constexpr int N = DL_KEYS;                     // keys per tile
constexpr int STAGES = DL_STAGES;              // K tiles in flight
constexpr int ROW_GROUPS = M / 16;
constexpr int WARPS = ROW_GROUPS * C;
constexpr int THREADS = WARPS * 32;
constexpr int ROW_BYTES = kQK * 2 + 16;        // 1168: padded so 8 consecutive rows hit 8 different 16-B bank groups
constexpr int CHUNKS = kQK * 2 / 16;           // 72 16-byte chunks per row
constexpr int KSTEPS = kQK / 16 / C;           // k-steps of the QK^T contraction per warp
constexpr int VCOLS = kV / C;                  // value columns per warp
constexpr int NT_S = N / 8;                    // 8-wide n-tiles of S
constexpr int NT_O = VCOLS / 8;                // 8-wide n-tiles of O per warp
constexpr int XWORDS = NT_S * 4 * 32;          // one warp's S fragment, in floats
constexpr int Q_BYTES = M * ROW_BYTES;
constexpr int K_BYTES = STAGES * N * ROW_BYTES;
constexpr int X_BYTES = (C > 1) ? 2 * WARPS * XWORDS * 4 : 0;
constexpr int SMEM_BYTES = Q_BYTES + K_BYTES + X_BYTES;
constexpr float kLn2 = 0.6931471805599453f;

static_assert(M % 16 == 0 && N % 16 == 0, "tiles are made of 16x16 mma steps");
static_assert((kQK / 16) % C == 0 && VCOLS % 16 == 0, "C must split 36 k-steps and 512 columns evenly");
static_assert(THREADS % M == 0 && THREADS % N == 0, "row loaders assume whole threads per row");
static_assert(ROW_GROUPS <= 15, "one named barrier per row group");
static_assert(SMEM_BYTES <= DL_SMEM_LIMIT, "tile configuration exceeds the architecture's shared memory per block");

// Copy ROWS rows of 576 bf16 into shared memory (padded rows). Thread t copies part of row
// t / (THREADS/ROWS); its source row is `src` (16-byte aligned), or it zero-fills when `valid`
// is false (`src` must still be a mapped address: cp.async reads 0 bytes of it).
template <int ROWS>
DL_DEVICE void load_row_part(u32 smem_base, const bf16* src, bool valid) {
  constexpr int TPR = THREADS / ROWS;  // threads per row
  const int r = threadIdx.x / TPR;
  const u32 dst = smem_base + r * ROW_BYTES;
  const char* s = reinterpret_cast<const char*>(src);
  const int nbytes = valid ? 16 : 0;
#pragma unroll
  for (int c = threadIdx.x % TPR; c < CHUNKS; c += TPR) dl::cp_async_16(dst + c * 16, s + (valid ? c * 16 : 0), nbytes);
}
}  // namespace va

// Is draft token j visible from draft token i (same request)? Only called for keys past the prefix.
DL_DEVICE bool draft_visible(const VerifyAttnParams& p, i64 mask_base, i64 qo_start, int q_len, int kv_len, int i, int j) {
  switch (p.mask_mode) {
    case kMaskCausal:
      return j <= i;
    case kMaskBitmask: {
      const u32* w = static_cast<const u32*>(p.mask);
      return (__ldg(w + (qo_start + i) * p.mask_words + (j >> 5)) >> (j & 31)) & 1u;
    }
    case kMaskQlenOnly: {
      const u8* m = static_cast<const u8*>(p.mask);
      return __ldg(m + mask_base + (i64)i * q_len + j) != 0;
    }
    default: {  // kMaskFull: q_len x (kv_len + q_len) per request, prefix columns first
      const u8* m = static_cast<const u8*>(p.mask);
      return __ldg(m + mask_base + (i64)i * (kv_len + q_len) + kv_len + j) != 0;
    }
  }
}

// Split rule shared by the partial and merge kernels.
DL_DEVICE void split_range(int total_keys, int num_splits, int split, int& active, int& t_begin, int& t_end) {
  const int tiles = (total_keys + va::N - 1) / va::N;
  const int per_split = (tiles + num_splits - 1) / num_splits;
  active = (tiles + per_split - 1) / per_split;
  t_begin = split * per_split;
  t_end = min(t_begin + per_split, tiles);
}

extern "C" __global__ void __launch_bounds__(va::THREADS, 1)
verify_attn_partial(const __grid_constant__ VerifyAttnParams p) {
  using namespace va;
  extern __shared__ __align__(128) unsigned char smem[];

  const int b = blockIdx.z;
  if (b >= p.batch_size) return;
  const i64 qo_start = p.qo_indptr[b];
  const int q_len = (int)(p.qo_indptr[b + 1] - qo_start);
  const int H = p.num_heads;
  const int rows = q_len * H;
  const int row0 = blockIdx.x * M;
  if (row0 >= rows) return;
  const int kv_start = p.kv_indptr[b];
  const int kv_len = p.kv_indptr[b + 1] - kv_start;
  const int total = kv_len + q_len;
  const int split = blockIdx.y;
  int active, t_begin, t_end;
  split_range(total, p.num_splits, split, active, t_begin, t_end);
  if (split >= active) return;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int rg = warp / C, cpart = warp % C;
  const u32 q_smem = dl::smem_u32(smem);
  const u32 k_smem = q_smem + Q_BYTES;
  float* xbuf = reinterpret_cast<float*>(smem + Q_BYTES + K_BYTES);
  const i64 mask_base = (p.mask_mode == kMaskFull || p.mask_mode == kMaskQlenOnly) ? p.mask_indptr[b] : 0;

  {  // Q tile: rows row0 .. row0+M-1 of this request (zero past the last row)
    const int r = tid / (THREADS / M);
    const bool valid = row0 + r < rows;
    load_row_part<M>(q_smem, valid ? p.q + (qo_start * H + row0 + r) * kQK : p.q, valid);
  }
  auto load_k = [&](int t, int stage) {  // K tile t: keys t*N .. t*N+N-1 (zero past the last key)
    const int key = t * N + tid / (THREADS / N);
    const bool valid = key < total;
    const bf16* src = p.kv_cache;
    if (valid) {
      const i64 slot = key < kv_len ? p.kv_indices[kv_start + key] : p.out_cache_loc[qo_start + (key - kv_len)];
      src = p.kv_cache + slot * kQK;
    }
    load_row_part<N>(k_smem + stage * (N * ROW_BYTES), src, valid);
  };
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (t_begin + s < t_end) load_k(t_begin + s, s);
    dl::cp_async_commit();
  }

  // This thread's two rows in its warp's 16-row block: A (fragment elements 0,1) and B (2,3).
  const int rA = row0 + rg * 16 + (lane >> 2), rB = rA + 8;
  const int iA = rA / H, iB = rB / H;
  const bool validA = rA < rows, validB = rB < rows;

  float o[NT_O][4];
#pragma unroll
  for (int n = 0; n < NT_O; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float mA = DL_NEG_INF, mB = DL_NEG_INF, lA = 0.f, lB = 0.f;

  for (int t = t_begin; t < t_end; ++t) {
    const int it = t - t_begin;
    dl::cp_async_wait<STAGES - 2>();
    __syncthreads();  // tile t is in shared memory; every warp is done with tile t-1
    {
      const int tn = t + STAGES - 1;
      if (tn < t_end) load_k(tn, (it + STAGES - 1) % STAGES);
      dl::cp_async_commit();
    }
    const u32 kt = k_smem + (it % STAGES) * (N * ROW_BYTES);

    // S (partial over this warp's slice of the 576-dim contraction)
    float s[NT_S][4];
#pragma unroll
    for (int n = 0; n < NT_S; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KSTEPS; ++kk) {
      const int kcol = (cpart * KSTEPS + kk) * 16;
      u32 a[4];
      dl::ldmatrix_x4(a, q_smem + (rg * 16 + (lane & 15)) * ROW_BYTES + (kcol + (lane >> 4) * 8) * 2);
#pragma unroll
      for (int np = 0; np < NT_S / 2; ++np) {
        u32 bk[4];
        dl::ldmatrix_x4(bk, kt + (np * 16 + (lane >> 4) * 8 + (lane & 7)) * ROW_BYTES + (kcol + ((lane >> 3) & 1) * 8) * 2);
        dl::mma_bf16_16816(s[2 * np], a, bk[0], bk[1]);
        dl::mma_bf16_16816(s[2 * np + 1], a, bk[2], bk[3]);
      }
    }
    if constexpr (C > 1) {  // sum the C partial S of this row group, in a fixed order
      float* mine = xbuf + ((it & 1) * WARPS + warp) * XWORDS;
#pragma unroll
      for (int n = 0; n < NT_S; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) mine[(n * 4 + e) * 32 + lane] = s[n][e];
      dl::named_barrier(1 + rg, C * 32);
      const float* grp = xbuf + ((it & 1) * WARPS + rg * C) * XWORDS;
#pragma unroll
      for (int n = 0; n < NT_S; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float acc = grp[(n * 4 + e) * 32 + lane];
#pragma unroll
          for (int c = 1; c < C; ++c) acc += grp[c * XWORDS + (n * 4 + e) * 32 + lane];
          s[n][e] = acc;
        }
    }

    // scale to base 2, mask draft keys (and keys past the end)
    const bool need_mask = (t + 1) * N > kv_len;
#pragma unroll
    for (int n = 0; n < NT_S; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float v = s[n][e] * p.scale_log2;
        if (need_mask) {
          const int key = t * N + n * 8 + 2 * (lane & 3) + (e & 1);
          bool vis = true;
          if (key >= total) {
            vis = false;
          } else if (key >= kv_len) {
            const bool rowB = e >= 2;
            if (rowB ? validB : validA)
              vis = draft_visible(p, mask_base, qo_start, q_len, kv_len, rowB ? iB : iA, key - kv_len);
          }
          if (!vis) v = DL_NEG_INF;
        }
        s[n][e] = v;
      }

    // online softmax (rows A and B; a row's 4 owners are one quad of lanes)
    float mxA = mA, mxB = mB;
#pragma unroll
    for (int n = 0; n < NT_S; ++n) {
      mxA = fmaxf(mxA, fmaxf(s[n][0], s[n][1]));
      mxB = fmaxf(mxB, fmaxf(s[n][2], s[n][3]));
    }
    mxA = fmaxf(mxA, __shfl_xor_sync(0xffffffffu, mxA, 1));
    mxA = fmaxf(mxA, __shfl_xor_sync(0xffffffffu, mxA, 2));
    mxB = fmaxf(mxB, __shfl_xor_sync(0xffffffffu, mxB, 1));
    mxB = fmaxf(mxB, __shfl_xor_sync(0xffffffffu, mxB, 2));
    const float baseA = mxA == DL_NEG_INF ? 0.f : mxA;
    const float baseB = mxB == DL_NEG_INF ? 0.f : mxB;
    const float alphaA = exp2f(mA - baseA), alphaB = exp2f(mB - baseB);
    mA = mxA;
    mB = mxB;
    lA *= alphaA;
    lB *= alphaB;
    u32 pa[N / 16][4];
#pragma unroll
    for (int n = 0; n < NT_S; ++n) {
      const float p0 = exp2f(s[n][0] - baseA), p1 = exp2f(s[n][1] - baseA);
      const float p2 = exp2f(s[n][2] - baseB), p3 = exp2f(s[n][3] - baseB);
      lA += p0 + p1;
      lB += p2 + p3;
      pa[n / 2][(n & 1) * 2 + 0] = dl::pack_bf16x2(p0, p1);
      pa[n / 2][(n & 1) * 2 + 1] = dl::pack_bf16x2(p2, p3);
    }
#pragma unroll
    for (int n = 0; n < NT_O; ++n) {
      o[n][0] *= alphaA;
      o[n][1] *= alphaA;
      o[n][2] *= alphaB;
      o[n][3] *= alphaB;
    }

    // O += P V over this warp's value columns (V = first 512 columns of the K tile)
#pragma unroll
    for (int j = 0; j < N / 16; ++j)
#pragma unroll
      for (int np = 0; np < NT_O / 2; ++np) {
        u32 v[4];
        dl::ldmatrix_x4_trans(v, kt + (j * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * ROW_BYTES +
                                     (cpart * VCOLS + np * 16 + (lane >> 4) * 8) * 2);
        dl::mma_bf16_16816(o[2 * np], pa[j], v[0], v[1]);
        dl::mma_bf16_16816(o[2 * np + 1], pa[j], v[2], v[3]);
      }
  }
  dl::cp_async_wait<0>();

  lA += __shfl_xor_sync(0xffffffffu, lA, 1);
  lA += __shfl_xor_sync(0xffffffffu, lA, 2);
  lB += __shfl_xor_sync(0xffffffffu, lB, 1);
  lB += __shfl_xor_sync(0xffffffffu, lB, 2);
  const float invA = lA > 0.f ? 1.f / lA : 0.f, invB = lB > 0.f ? 1.f / lB : 0.f;
  const float lse2A = lA > 0.f ? mA + log2f(lA) : DL_NEG_INF;
  const float lse2B = lB > 0.f ? mB + log2f(lB) : DL_NEG_INF;
  const i64 growA = qo_start * H + rA, growB = qo_start * H + rB;
  const int col0 = cpart * VCOLS + 2 * (lane & 3);
  if (active == 1) {  // the only split: final bf16 output and natural-log LSE
#pragma unroll
    for (int n = 0; n < NT_O; ++n) {
      if (validA) *reinterpret_cast<u32*>(p.out + growA * kV + col0 + n * 8) = dl::pack_bf16x2(o[n][0] * invA, o[n][1] * invA);
      if (validB) *reinterpret_cast<u32*>(p.out + growB * kV + col0 + n * 8) = dl::pack_bf16x2(o[n][2] * invB, o[n][3] * invB);
    }
    if (p.lse != nullptr && cpart == 0 && (lane & 3) == 0) {
      if (validA) p.lse[growA] = lse2A * kLn2;
      if (validB) p.lse[growB] = lse2B * kLn2;
    }
  } else {  // one of several splits: fp32 partial (normalised by its own sum) + base-2 LSE
    float* dA = p.o_part + (growA * p.num_splits + split) * kV + col0;
    float* dB = p.o_part + (growB * p.num_splits + split) * kV + col0;
#pragma unroll
    for (int n = 0; n < NT_O; ++n) {
      if (validA) *reinterpret_cast<float2*>(dA + n * 8) = make_float2(o[n][0] * invA, o[n][1] * invA);
      if (validB) *reinterpret_cast<float2*>(dB + n * 8) = make_float2(o[n][2] * invB, o[n][3] * invB);
    }
    if (cpart == 0 && (lane & 3) == 0) {
      if (validA) p.lse_part[growA * p.num_splits + split] = lse2A;
      if (validB) p.lse_part[growB * p.num_splits + split] = lse2B;
    }
  }
}

extern "C" __global__ void __launch_bounds__(256)
verify_attn_merge(const __grid_constant__ VerifyAttnParams p) {
  using namespace va;
  const int b = blockIdx.y;
  if (b >= p.batch_size) return;
  const i64 qo_start = p.qo_indptr[b];
  const int q_len = (int)(p.qo_indptr[b + 1] - qo_start);
  const int H = p.num_heads;
  const int rows = q_len * H;
  const int kv_len = p.kv_indptr[b + 1] - p.kv_indptr[b];
  int active, t_begin, t_end;
  split_range(kv_len + q_len, p.num_splits, 0, active, t_begin, t_end);
  if (active <= 1) return;  // finished by verify_attn_partial
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int r = blockIdx.x * 8 + warp;
  if (r >= rows) return;
  const i64 grow = qo_start * H + r;
  const float* lp = p.lse_part + grow * p.num_splits;
  float mx = DL_NEG_INF;
  for (int s = lane; s < active; s += 32) mx = fmaxf(mx, lp[s]);
  mx = dl::warp_max(mx);
  const float base = mx == DL_NEG_INF ? 0.f : mx;
  float sum = 0.f;
  for (int s = lane; s < active; s += 32) sum += exp2f(lp[s] - base);
  sum = dl::warp_sum(sum);
  float4 acc[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) acc[k] = make_float4(0.f, 0.f, 0.f, 0.f);
  const float4* src = reinterpret_cast<const float4*>(p.o_part + grow * p.num_splits * kV);
#pragma unroll 2
  for (int s = 0; s < active; ++s) {
    const float w = exp2f(lp[s] - base);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float4 v = src[s * (kV / 4) + lane + 32 * k];
      acc[k].x += w * v.x;
      acc[k].y += w * v.y;
      acc[k].z += w * v.z;
      acc[k].w += w * v.w;
    }
  }
  const float inv = sum > 0.f ? 1.f / sum : 0.f;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    uint2 packed;
    packed.x = dl::pack_bf16x2(acc[k].x * inv, acc[k].y * inv);
    packed.y = dl::pack_bf16x2(acc[k].z * inv, acc[k].w * inv);
    *reinterpret_cast<uint2*>(p.out + grow * kV + (lane + 32 * k) * 4) = packed;
  }
  if (p.lse != nullptr && lane == 0) p.lse[grow] = sum > 0.f ? (mx + log2f(sum)) * va::kLn2 : DL_NEG_INF;
}
