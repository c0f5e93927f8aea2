// mla_model.cu: the demo MLA target model's kernels and its drafter.
//
// Pairs with driverlevel/demo/mla_model.py (model, forward plan; the ctypes mirrors of the
// params structs below and compile_defines()) and driverlevel/demo/drafter.py (the drafter).
//
// mla_gemm        C[m, :] = out_scale * A[a_row(m), :] . B^T (+ noise) (+ residual[m, :])
//   A bf16 rows of k (lda), optionally gathered by a_index (int32); B bf16 [n, k] row-major
//   (the nn.Linear weight layout); C bf16 or fp32 rows of n (ldc), optionally scattered to
//   rows c_index[m] (int64, e.g. out_cache_loc: the latent KV written into the paged cache).
//   A gathered row index is clamped to [0, a_rows); a scattered row outside [0, c_rows) (an
//   exhausted pool's -1, or bad metadata) is not stored: in bounds whatever the indices say.
//   M is m_max, or min(m_max, *m_ptr) when m_ptr is set (the row count of this step, read on
//   the device: qo_indptr[bs]). Optional epilogue noise: noise_std * z(seed, *counter, m, col)
//   with z a counter-based standard normal (the drafter's noise): one hash, one logarithm and one
//   sincos per column pair (col, col + 1), col even (Box-Muller's two outputs). The epilogue
//   scales and noises the whole accumulator tile first (no branches: the pairs interleave), stages
//   it as fp32 in the pipeline's shared memory, then each warp adds the residual to whole rows and
//   stores the rows < M and columns < n (a row's bound and scatter slot checked once).
//   Grid (ceil(n / 128), ceil(m_max / BM), k_splits); Block 256 (8 warps, 2 x 4, warp tile
//   BM/2 x 32; mla_gemm_m144: 1 x 8, warp tile 144 x 16). mma.sync m16n8k16 bf16 -> fp32,
//   ldmatrix, cp.async STAGES-deep (BK = 64: each k-step reads 128 B of every row, a whole L2
//   line; a k % 64 == 32 tail is zero-filled).
//   Shared memory (dynamic): STAGES * (BM + 128) * 72 * 2 B (rows padded to 144 B: ldmatrix is
//   free of bank conflicts): 110,592 B for BM = 128 (mla_gemm) and 69,120 B for BM = 32
//   (mla_gemm_m32, few rows) at the 3 stages of sm_90 / sm_100; 2 stages elsewhere; 78,336 B for
//   BM = 144 (mla_gemm_m144: 129 .. 144 rows of a wide n, where it saves a wave of CTAs, e.g. the
//   LM head at a tree step's 136 rows) at its 2 stages everywhere
//   (driverlevel.demo.mla_model.gemm_stages, gemm_schedule). Early exit: row tile >= M.
//   Split-K (k_splits > 1, for few output tiles over a long k): split z sums its k range into
//   the fp32 workspace partial[z]; mla_gemm_reduce adds the splits in order and applies the
//   epilogue (deterministic: no atomics).
//   Requires k % 32 == 0, n % 8 == 0, lda/ldc/ldr % 8 == 0, 16-byte aligned pointers.
//
// mla_gemm_pair, mla_gemm_pair_m32   two unsplit GEMMs (two GemmParams) in one launch: grid
//   (ceil(n0 / 128) + ceil(n1 / 128), ceil(max(m_max) / BM), 1), the first GEMM's column tiles
//   first; the 128- and 32-row tiles' code and shared memory, k_splits == 1 for both.
//
// mla_embed       out[m, :] = embed[token[m], :] with the class one-hot rotated by position:
//   out[m, (c + pos[m]) % num_classes] = embed[token, c] for c < num_classes; features copied.
//   Grid (m_max); Block 128. Early exit: m >= M. Out-of-range tokens are clamped.
//
// draft_chain     guesses[b, i] = table[root[b], i], where row t of the table is t's chain
//   (t, successor[t], successor[successor[t]], ...), tabulated once by the drafter: one load per
//   guess instead of depth - 1 dependent ones. Block 0 thread 0 also increments *step_counter (the
//   drafter's noise counter). Grid ceil(bs * depth / 256); Block 256. Out-of-range roots are clamped.
//
// Every kernel but draft_chain (a drafter's first launch) starts with dl::pdl_enter (common.cuh):
// MLAModel launches them programmatically on sm_90+.
#include "common.cuh"

struct GemmParams {
  const bf16* a;          // A rows (lda elements apart)
  const i32* a_index;     // [M] optional row gather of A (token ids)
  const bf16* b;          // [n, k] row-major
  void* c;                // C rows (ldc elements apart), bf16 or fp32
  const i64* c_index;     // [M] optional row scatter of C (slot ids)
  const bf16* residual;   // [M, ldr] optional, added in fp32 before rounding
  const i64* m_ptr;       // optional: M = min(m_max, *m_ptr)
  const u64* noise_counter;  // optional: adds noise_std * z(noise_seed, *noise_counter, m, col)
  float* partial;         // [k_splits, m_max, n] fp32 split-K workspace (k_splits > 1)
  u64 noise_seed;
  i64 m_max;
  i32 n, k, lda, ldc, ldr;
  i32 out_f32;            // 1: C is fp32, 0: bf16
  float out_scale;
  float noise_std;
  i32 k_splits;           // 1, or the number of k ranges (then mla_gemm_reduce finishes)
  i32 a_rows;             // rows of A: a gathered row index is clamped to [0, a_rows)
  i64 c_rows;             // rows of C: a scattered row outside [0, c_rows) is not stored
};

struct EmbedParams {
  const bf16* table;      // [vocab, d]
  const void* tokens;     // [M] int32 or int64
  const void* positions;  // [M] int32 or int64, or null (position 0)
  bf16* out;              // [m_max, d]
  const i64* m_ptr;       // optional: M = min(m_max, *m_ptr)
  i64 m_max;
  i32 d, num_classes, vocab;
  i32 tokens_i64, positions_i64;
};

struct DraftChainParams {
  const i32* table;       // [vocab, depth] row t: t's no-context chain of depth tokens
  const i32* roots;       // [bs] root tokens
  i32* guesses;           // [bs, depth]
  u64* step_counter;      // incremented once per launch
  i32 bs, depth, vocab;
};

// offsetof checks against the ctypes mirrors (the launcher passes -DDL_OFF_<P>_<field>, P = G, E, D).
#ifdef DL_OFF_G_a
DL_CHECK_OFFSET(GemmParams, a, G);
DL_CHECK_OFFSET(GemmParams, a_index, G);
DL_CHECK_OFFSET(GemmParams, b, G);
DL_CHECK_OFFSET(GemmParams, c, G);
DL_CHECK_OFFSET(GemmParams, c_index, G);
DL_CHECK_OFFSET(GemmParams, residual, G);
DL_CHECK_OFFSET(GemmParams, m_ptr, G);
DL_CHECK_OFFSET(GemmParams, noise_counter, G);
DL_CHECK_OFFSET(GemmParams, partial, G);
DL_CHECK_OFFSET(GemmParams, noise_seed, G);
DL_CHECK_OFFSET(GemmParams, m_max, G);
DL_CHECK_OFFSET(GemmParams, n, G);
DL_CHECK_OFFSET(GemmParams, k, G);
DL_CHECK_OFFSET(GemmParams, lda, G);
DL_CHECK_OFFSET(GemmParams, ldc, G);
DL_CHECK_OFFSET(GemmParams, ldr, G);
DL_CHECK_OFFSET(GemmParams, out_f32, G);
DL_CHECK_OFFSET(GemmParams, out_scale, G);
DL_CHECK_OFFSET(GemmParams, noise_std, G);
DL_CHECK_OFFSET(GemmParams, k_splits, G);
DL_CHECK_OFFSET(GemmParams, a_rows, G);
DL_CHECK_OFFSET(GemmParams, c_rows, G);
static_assert(sizeof(GemmParams) == DL_SIZEOF_G, "GemmParams size differs from its ctypes mirror");
DL_CHECK_OFFSET(EmbedParams, table, E);
DL_CHECK_OFFSET(EmbedParams, tokens, E);
DL_CHECK_OFFSET(EmbedParams, positions, E);
DL_CHECK_OFFSET(EmbedParams, out, E);
DL_CHECK_OFFSET(EmbedParams, m_ptr, E);
DL_CHECK_OFFSET(EmbedParams, m_max, E);
DL_CHECK_OFFSET(EmbedParams, d, E);
DL_CHECK_OFFSET(EmbedParams, num_classes, E);
DL_CHECK_OFFSET(EmbedParams, vocab, E);
DL_CHECK_OFFSET(EmbedParams, tokens_i64, E);
DL_CHECK_OFFSET(EmbedParams, positions_i64, E);
static_assert(sizeof(EmbedParams) == DL_SIZEOF_E, "EmbedParams size differs from its ctypes mirror");
DL_CHECK_OFFSET(DraftChainParams, table, D);
DL_CHECK_OFFSET(DraftChainParams, roots, D);
DL_CHECK_OFFSET(DraftChainParams, guesses, D);
DL_CHECK_OFFSET(DraftChainParams, step_counter, D);
DL_CHECK_OFFSET(DraftChainParams, bs, D);
DL_CHECK_OFFSET(DraftChainParams, depth, D);
DL_CHECK_OFFSET(DraftChainParams, vocab, D);
static_assert(sizeof(DraftChainParams) == DL_SIZEOF_D, "DraftChainParams size differs from its ctypes mirror");
#endif

#ifndef DL_GEMM_STAGES
#define DL_GEMM_STAGES 2  // (the launcher passes gemm_stages(arch); 2 fits every architecture)
#endif
#ifndef DL_GEMM_STAGES_144
#define DL_GEMM_STAGES_144 2  // (the launcher passes gemm_stages(arch, 144))
#endif
#ifndef DL_GEMM_CTAS
#define DL_GEMM_CTAS 1  // CTAs of the 128-row tile an SM's shared memory holds (the launcher's)
#endif
#ifndef DL_GEMM_CTAS_144
#define DL_GEMM_CTAS_144 1  // CTAs of the 144-row tile an SM's shared memory holds (the launcher's)
#endif

namespace gm {
constexpr int BN = 128, BK = 64;
constexpr int THREADS = 256;
constexpr int ROW = BK + 8;               // padded row, bf16 elements (144 B)
constexpr int ROW_BYTES = ROW * 2;
constexpr int CHUNKS = BK * 2 / 16;       // 16-byte chunks per tile row (8)
constexpr int CT_LD = BN + 8;             // the epilogue's fp32 tile: row stride in floats (544 B)
constexpr int B_STAGE = BN * ROW_BYTES;
constexpr int B_LOADS = BN * CHUNKS / THREADS;  // 4 per thread
static_assert(B_LOADS * THREADS == BN * CHUNKS, "loader layout");
static_assert(THREADS % CHUNKS == 0, "a thread loads the same chunk column of every row it loads");
// The 8 warps as WARPS_M x WARPS_N: 2 x 4 (warp tile BM/2 x 32) for the 128- and 32-row tiles; 1 x 8
// (warp tile 144 x 16) for the 144-row tile, which covers a tree step's 136 rows (batch 8 x 17 nodes)
// in one row tile: its warps stream A's fragments one m16 tile at a time (A_STREAM), so that nine
// m16 tiles' accumulators (72 registers) leave room for two CTAs an SM.
template <int BM, int ST>
struct Tile {
  static constexpr int STAGES = ST;
  static constexpr int WARPS_M = BM == 144 ? 1 : 2, WARPS_N = 8 / WARPS_M;
  static constexpr int WN = BN / WARPS_N;   // columns per warp (32 or 16)
  static constexpr int NT = WN / 8;         // n8 tiles per warp (4 or 2)
  static constexpr bool A_STREAM = WARPS_M == 1;
  static constexpr int WM = BM / WARPS_M;   // rows per warp (64, 16 or 144)
  static constexpr int MT = WM / 16;        // m16 tiles per warp
  static constexpr int A_STAGE = BM * ROW_BYTES;
  static constexpr int A_LOADS = (BM * CHUNKS + THREADS - 1) / THREADS;
  static constexpr int SMEM_BYTES = STAGES * (A_STAGE + B_STAGE);
  static_assert(BM * CT_LD * 4 <= SMEM_BYTES, "the epilogue's fp32 tile fits the pipeline's shared memory");
  static_assert(WARPS_M * WARPS_N * 32 == THREADS, "warp layout");
  static_assert(WM % 16 == 0 && NT % 2 == 0, "warp rows are whole m16 tiles, columns whole n16 pairs");
  static_assert(SMEM_BYTES <= DL_SMEM_LIMIT, "GEMM tile exceeds the architecture's shared memory per block");
};
}  // namespace gm

namespace dlx {
DL_DEVICE u64 mix64(u64 x) {
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
// The noise of one launch: a base hashed from (seed, step), computed once per thread.
DL_DEVICE u64 noise_base(u64 seed, u64 step) { return mix64(seed ^ mix64(step + 1ull)); }

// Standard normals of columns (col, col + 1) of row `row`, col even: Box-Muller's r cos and r sin
// of the two 32-bit halves of one hash; driverlevel.demo.reference.draft_noise_reference.
DL_DEVICE float2 gauss_pair(u64 base, u64 row, u64 col) {
  const u64 x = mix64(base + (row << 32) + col);
  const float u1 = ((float)(u32)(x >> 32) + 1.0f) * 2.3283064365386963e-10f;  // (0, 1]
  const float u2 = ((float)(u32)(x & 0xFFFFFFFFull) + 0.5f) * 2.3283064365386963e-10f;
  // The special-function unit's forms (MUFU): -2 ln u1 as -2 ln 2 * lg2.approx(u1) (its argument
  // lies in (0, 1], the result in [0, 44.4]); sqrt.approx (~1 ulp; sqrtf's IEEE rounding puts a
  // branch to a slow path around each call, which keeps the compiler from interleaving the pairs);
  // sin.approx / cos.approx of the angle 2 pi u2 - pi, in (-pi, pi] where their absolute error is
  // at most 2^-21.4 (PTX ISA), so cos(2 pi u2) = -cos(angle) and sin(2 pi u2) = -sin(angle).
  // The pair's error against the float64 reference stays below ~3e-6 (r <= 6.7). (logf and
  // sincospif, the accurate forms, took ~40% of the noised GEMM's SASS: fifty-eighth session.)
  float r;
  asm("sqrt.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(-1.3862943611198906f * __log2f(u1)));
  float sn, cs;
  __sincosf(6.283185307179586f * (u2 - 0.5f), &sn, &cs);
  return make_float2(-r * cs, -r * sn);
}

// Scale and noise of the pair (col, col + 1) of row m (col even): v * out_scale (+ noise_std * z).
template <bool kNoise>
DL_DEVICE float2 scale_pair(const GemmParams& p, float v0, float v1, u64 base, i64 m, int col) {
  v0 *= p.out_scale;
  v1 *= p.out_scale;
  if (kNoise) {
    const float2 z = gauss_pair(base, (u64)m, (u64)col);
    v0 += p.noise_std * z.x;
    v1 += p.noise_std * z.y;
  }
  return make_float2(v0, v1);
}

// scale_pair over a warp's accumulator tile (mma.sync m16n8 layout: pair (i, half, j) is row
// row0 + 16 i + 8 half, columns col0 + 8 j and + 1), without branches: rows past M and columns
// past n get values that are never stored.
template <bool kNoise, int MT, int NT>
DL_DEVICE void scale_tile(const GemmParams& p, float (&acc)[MT][NT][4], u64 base, i64 row0, int col0) {
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        float* v = acc[i][j] + half * 2;
        const float2 w = scale_pair<kNoise>(p, v[0], v[1], base, row0 + i * 16 + half * 8, col0 + j * 8);
        v[0] = w.x;
        v[1] = w.y;
      }
}

// The rest of the epilogue of two adjacent columns (col, col + 1) of row m, already scaled and
// noised: the residual, then the store (scattered through c_index).
DL_DEVICE void store_pair(const GemmParams& p, i64 m, int col, float v0, float v1) {
  const i64 crow = p.c_index != nullptr ? p.c_index[m] : m;
  // a row without a slot (an exhausted pool hands out -1), or past C's rows (bad metadata inside a
  // captured graph, where no host check runs)
  if (crow < 0 || crow >= p.c_rows) return;
  if (p.residual != nullptr) {
    const __nv_bfloat162 r = *reinterpret_cast<const __nv_bfloat162*>(p.residual + m * p.ldr + col);
    v0 += __bfloat162float(r.x);
    v1 += __bfloat162float(r.y);
  }
  if (p.out_f32) {
    *reinterpret_cast<float2*>(static_cast<float*>(p.c) + crow * p.ldc + col) = make_float2(v0, v1);
  } else {
    *reinterpret_cast<u32*>(static_cast<bf16*>(p.c) + crow * p.ldc + col) = dl::pack_bf16x2(v0, v1);
  }
}
}  // namespace dlx

// One (BM x 128) output tile, column tile bx, over the k-tiles of split blockIdx.z.
template <int BM, int ST>
DL_DEVICE void gemm_tile(const GemmParams& p, unsigned char* smem, unsigned bx) {
  using namespace gm;
  using T = Tile<BM, ST>;
  constexpr int WM = T::WM, MT = T::MT, A_STAGE = T::A_STAGE, A_LOADS = T::A_LOADS, STAGES = T::STAGES;
  constexpr int WARPS_N = T::WARPS_N, WN = T::WN, NT = T::NT;
  i64 M = p.m_max;
  if (p.m_ptr != nullptr) M = min(M, *p.m_ptr);
  const i64 m0 = (i64)blockIdx.y * BM;
  const int n0 = bx * BN;
  if (m0 >= M) return;
  const int KT_all = (p.k + BK - 1) / BK;  // k % 64 == 32: the last k-tile's upper half is zero-filled
  const int per = (KT_all + p.k_splits - 1) / p.k_splits;
  const int kt0 = blockIdx.z * per;
  const int KT = min(KT_all, kt0 + per) - kt0;  // may be <= 0: the partial is then zero

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / WARPS_N, wn = warp % WARPS_N;
  const u32 a_smem = dl::smem_u32(smem);
  const u32 b_smem = a_smem + STAGES * A_STAGE;
  // This thread's chunk column (the same in every row it loads: THREADS % CHUNKS == 0), as a k
  // offset in elements: its chunks of k-tile kt exist while (kt0 + kt) * BK + kch < k.
  const int kch = (tid % CHUNKS) * 8;

  // Per-thread source rows of the tile loaders (fixed over k). A thread loads tile rows
  // r0 + i * ROW_STEP, chunk ch0 (THREADS % CHUNKS == 0), of A and of B, at the same shared-memory
  // offsets dst0 + i * ROW_STEP * ROW_BYTES of a stage. B's rows are one pointer and a stride, with
  // a bit per row that exists. A's rows come in one of two forms:
  // - the 128- and 32-row tiles: a source pointer per load (a_src, the row gathered through a_index
  //   and clamped), with bits for the loads that have a chunk and whose row exists;
  // - the 144-row tile (LEAN_LOADS): 32-bit row numbers, so that its five A loads fit the 128
  //   registers of two CTAs an SM with its 72 accumulators (pointers took 128 + spills). (A's lean
  //   form on the 128- and 32-row tiles too cost them 0.5-0.8 µs each on an H100: fifty-fifth
  //   session.) The pointer form's flags as bits and B as a pointer and a stride keep the 128-row
  //   tile at 128 registers, spill-free, pinned to two CTAs an SM (fifty-eighth session).
  constexpr bool LEAN_LOADS = T::A_STREAM;
  constexpr int ROW_STEP = THREADS / CHUNKS;  // 32 rows between a thread's loads
  const int r0 = tid / CHUNKS, ch0 = tid % CHUNKS;
  const u32 dst0 = r0 * ROW_BYTES + ch0 * 16;  // (A and B alike: row r0, chunk ch0 of a stage)
  const char* const b_src0 = reinterpret_cast<const char*>(p.b + (i64)(n0 + r0) * p.k) + ch0 * 16 +
                             (i64)kt0 * BK * 2;
  const int b_step = ROW_STEP * p.k * 2;  // bytes (k < 2^25: the host checks; an i64 here spilled on sm_80)
  u32 b_bits = 0;  // a bit per B row that exists
#pragma unroll
  for (int i = 0; i < B_LOADS; ++i) b_bits |= (n0 + r0 + i * ROW_STEP < p.n ? 1u : 0u) << i;
  const char* a_src[A_LOADS];  // pointer form
  u32 a_has = 0, a_bits = 0;   // pointer form: a bit per load that has a chunk / whose row exists
  int a_row[A_LOADS];  // lean form: the row of A (gathered through a_index and clamped); -1: past M,
                       // zero-filled; -2: past the tile, no chunk
  const char* const a_base = reinterpret_cast<const char*>(p.a) + ch0 * 16 + (i64)kt0 * BK * 2;
#pragma unroll
  for (int i = 0; i < A_LOADS; ++i) {
    const int r = r0 + i * ROW_STEP;
    const i64 m = m0 + r;
    if constexpr (LEAN_LOADS) {
      a_row[i] = r >= BM ? -2 : m >= M ? -1 : (int)m;
      if (a_row[i] >= 0 && p.a_index != nullptr) a_row[i] = min(max(p.a_index[m], 0), p.a_rows - 1);  // clamped
    } else {
      const bool has = r < BM, ok = has && m < M;
      a_has |= (has ? 1u : 0u) << i;
      a_bits |= (ok ? 1u : 0u) << i;
      i64 row = m;
      if (ok && p.a_index != nullptr) row = min(max(p.a_index[m], 0), p.a_rows - 1);  // clamped
      a_src[i] = a_base + (ok ? row * p.lda * 2 : 0);
    }
  }
  auto load = [&](int kt, int stage) {
    const int koff = kt * BK * 2;  // bytes past the split's first k-tile
    const bool kin = (kt0 + kt) * BK + kch < p.k;  // (false only in a k % 64 == 32 tail)
    // (a chunk not read, past M, past n or in the k tail, is zero-filled from A's or B's first row)
#pragma unroll
    for (int i = 0; i < A_LOADS; ++i) {
      const u32 dst = a_smem + stage * A_STAGE + dst0 + i * ROW_STEP * ROW_BYTES;
      if constexpr (LEAN_LOADS) {
        if (a_row[i] >= -1) {
          const bool ok = a_row[i] >= 0 && kin;
          dl::cp_async_16(dst, ok ? a_base + (i64)a_row[i] * p.lda * 2 + koff : a_base, ok ? 16 : 0);
        }
      } else if ((a_has >> i) & 1u) {
        const bool ok = ((a_bits >> i) & 1u) && kin;
        dl::cp_async_16(dst, a_src[i] + (ok ? koff : 0), ok ? 16 : 0);
      }
    }
#pragma unroll
    for (int i = 0; i < B_LOADS; ++i) {
      const bool ok = ((b_bits >> i) & 1u) && kin;
      dl::cp_async_16(b_smem + stage * B_STAGE + dst0 + i * ROW_STEP * ROW_BYTES,
                      ok ? b_src0 + i * b_step + koff : reinterpret_cast<const char*>(p.b), ok ? 16 : 0);
    }
  };

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < KT) load(s, s);
    dl::cp_async_commit();
  }

  float acc[MT][NT][4];
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int j = 0; j < NT; ++j) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;

  for (int kt = 0; kt < KT; ++kt) {
    dl::cp_async_wait<STAGES - 2>();
    __syncthreads();  // tile kt is in shared memory; every warp is done with tile kt-1
    {
      const int kn = kt + STAGES - 1;
      if (kn < KT) load(kn, kn % STAGES);
      dl::cp_async_commit();
    }
    const int stage = kt % STAGES;
    const u32 at = a_smem + stage * A_STAGE, bt = b_smem + stage * B_STAGE;
#pragma unroll
    for (int kk = 0; kk < BK / 16; ++kk) {
      if constexpr (T::A_STREAM) {  // B's fragments first, then A's one m16 tile at a time
        u32 bf[NT / 2][4];
#pragma unroll
        for (int np = 0; np < NT / 2; ++np)
          dl::ldmatrix_x4(bf[np], bt + (wn * WN + np * 16 + (lane >> 4) * 8 + (lane & 7)) * ROW_BYTES +
                                      (kk * 16 + ((lane >> 3) & 1) * 8) * 2);
#pragma unroll
        for (int i = 0; i < MT; ++i) {
          u32 af[4];
          dl::ldmatrix_x4(af, at + (wm * WM + i * 16 + (lane & 15)) * ROW_BYTES + (kk * 16 + (lane >> 4) * 8) * 2);
#pragma unroll
          for (int np = 0; np < NT / 2; ++np) {
            dl::mma_bf16_16816(acc[i][2 * np], af, bf[np][0], bf[np][1]);
            dl::mma_bf16_16816(acc[i][2 * np + 1], af, bf[np][2], bf[np][3]);
          }
        }
      } else {
        u32 af[MT][4];
#pragma unroll
        for (int i = 0; i < MT; ++i)
          dl::ldmatrix_x4(af[i], at + (wm * WM + i * 16 + (lane & 15)) * ROW_BYTES + (kk * 16 + (lane >> 4) * 8) * 2);
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
          u32 bf[4];
          dl::ldmatrix_x4(bf, bt + (wn * WN + np * 16 + (lane >> 4) * 8 + (lane & 7)) * ROW_BYTES +
                                  (kk * 16 + ((lane >> 3) & 1) * 8) * 2);
#pragma unroll
          for (int i = 0; i < MT; ++i) {
            dl::mma_bf16_16816(acc[i][2 * np], af[i], bf[0], bf[1]);
            dl::mma_bf16_16816(acc[i][2 * np + 1], af[i], bf[2], bf[3]);
          }
        }
      }
    }
  }
  dl::cp_async_wait<0>();
  __syncthreads();  // every warp's last reads of the pipeline's shared memory, before the tile reuses it

  // Epilogue, through shared memory: every pair is scaled and noised in registers first (without
  // split-K), in a pass without branches (rows past M and columns past n get values that are never
  // stored), so that the compiler interleaves the pairs' hash, logarithm and sincos; the warps then
  // write their fp32 fragments into the pipeline's shared memory as one BM x 128 tile (rows CT_LD
  // floats apart: a half-warp's float2 stores hit 32 distinct banks), and each warp stores whole
  // rows of it: a lane's four adjacent columns, 512 contiguous bytes of fp32 (256 of bf16) a warp
  // instruction, the row's bound, scatter slot and residual checked once per row by the whole warp.
  // (The store loop straight from the fragments ran ~45 instructions and four branches per column
  // pair of 8 bytes: a third of the LM head's warp samples, fifty-seventh session. Through shared
  // memory, with the lean loaders above: a fifth, and the DDTree decode step ~16 µs faster on an
  // H100, fifty-eighth session.) With split-K the raw fp32 sums go to the workspace the same way and
  // mla_gemm_reduce finishes them.
  if (p.k_splits == 1) {
    const i64 row0 = m0 + wm * WM + (lane >> 2);
    const int col0 = n0 + wn * WN + 2 * (lane & 3);
    if (p.noise_counter != nullptr)
      dlx::scale_tile<true>(p, acc, dlx::noise_base(p.noise_seed, *p.noise_counter), row0, col0);
    else
      dlx::scale_tile<false>(p, acc, 0ull, row0, col0);
  }
  float* const ct = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int i = 0; i < MT; ++i)
#pragma unroll
    for (int half = 0; half < 2; ++half)
#pragma unroll
      for (int j = 0; j < NT; ++j)
        *reinterpret_cast<float2*>(ct + (wm * WM + i * 16 + (lane >> 2) + half * 8) * CT_LD + wn * WN + j * 8 +
                                   2 * (lane & 3)) = make_float2(acc[i][j][half * 2], acc[i][j][half * 2 + 1]);
  __syncthreads();
  const int col = n0 + lane * 4;  // this lane's four columns of every row (n % 8 == 0: all or none exist)
  const bool split = p.k_splits > 1, f32 = split || p.out_f32 != 0;
  for (int r = warp; r < BM; r += THREADS / 32) {
    const i64 m = m0 + r;
    if (m >= M) break;  // (rows ascend)
    i64 crow = m;
    if (!split) {
      if (p.c_index != nullptr) crow = p.c_index[m];
      // a row without a slot (an exhausted pool hands out -1), or past C's rows (bad metadata
      // inside a captured graph, where no host check runs)
      if (crow < 0 || crow >= p.c_rows) continue;
    }
    if (col >= p.n) continue;
    float4 v = *reinterpret_cast<const float4*>(ct + r * CT_LD + lane * 4);
    if (split) {
      *reinterpret_cast<float4*>(p.partial + ((i64)blockIdx.z * p.m_max + m) * p.n + col) = v;
      continue;
    }
    if (p.residual != nullptr) {
      const uint2 rr = *reinterpret_cast<const uint2*>(p.residual + m * p.ldr + col);
      v.x += __uint_as_float(rr.x << 16);
      v.y += __uint_as_float(rr.x & 0xFFFF0000u);
      v.z += __uint_as_float(rr.y << 16);
      v.w += __uint_as_float(rr.y & 0xFFFF0000u);
    }
    if (f32)
      *reinterpret_cast<float4*>(static_cast<float*>(p.c) + crow * p.ldc + col) = v;
    else
      *reinterpret_cast<uint2*>(static_cast<bf16*>(p.c) + crow * p.ldc + col) =
          make_uint2(dl::pack_bf16x2(v.x, v.y), dl::pack_bf16x2(v.z, v.w));
  }
}

extern "C" __global__ void __launch_bounds__(gm::THREADS, DL_GEMM_CTAS)
mla_gemm(const __grid_constant__ GemmParams p) {
  dl::pdl_enter();  // (common.cuh: before anything else, so a programmatic launch of it is safe)
  extern __shared__ __align__(128) unsigned char smem[];
  gemm_tile<128, DL_GEMM_STAGES>(p, smem, blockIdx.x);
}

// The same with 32-row tiles, for few rows (a decode step of one token per request).
extern "C" __global__ void __launch_bounds__(gm::THREADS)
mla_gemm_m32(const __grid_constant__ GemmParams p) {
  dl::pdl_enter();  // (common.cuh: before anything else, so a programmatic launch of it is safe)
  extern __shared__ __align__(128) unsigned char smem[];
  gemm_tile<32, DL_GEMM_STAGES>(p, smem, blockIdx.x);
}

// The same with 144-row tiles, for 129 .. 144 rows (a tree step of batch 8 and budget 16: 136 rows):
// one row tile where the 128-row tile takes two, the second almost empty (for the LM head 512 CTAs,
// two waves at two CTAs an SM, against 256). Registers capped for two CTAs an SM where its shared
// memory holds two (sm_80 / sm_90 / sm_100), not on the 100 KB parts, where one CTA fits anyway.
extern "C" __global__ void __launch_bounds__(gm::THREADS, DL_GEMM_CTAS_144)
mla_gemm_m144(const __grid_constant__ GemmParams p) {
  dl::pdl_enter();  // (common.cuh: before anything else, so a programmatic launch of it is safe)
  extern __shared__ __align__(128) unsigned char smem[];
  gemm_tile<144, DL_GEMM_STAGES_144>(p, smem, blockIdx.x);
}

// Two unsplit GEMMs in one launch (a grouped GEMM of two): column tiles 0 .. ceil(p0.n / 128) - 1
// compute p0's, the rest p1's, each with its own A, B, C, gather, scatter, residual, row count and
// epilogue; the row tile and the pipeline are shared (grid.y covers the larger m_max, and each
// GEMM's row tiles past its own M exit at once). The target forward's q and kv projections read the
// same rows: 41 + 5 column tiles in one wave, where two launches ran one after the other. (Two
// inlined copies of the tile, so that each keeps the single tile's main loop; not pinned: NVRTC 13.0
// gave the 128-row pair 134 registers on sm_90 before the lean loaders, 128 since, and a pair of at
// most a wave does not need two CTAs an SM. The pair as one indexed param array took 128 but read
// every param per thread, non-uniformly.)
template <int BM>
DL_DEVICE void gemm_pair(const GemmParams& p0, const GemmParams& p1, unsigned char* smem) {
  const unsigned tiles0 = (p0.n + gm::BN - 1) / gm::BN;  // (n > 0)
  const unsigned bx = blockIdx.x;
  if (bx < tiles0) gemm_tile<BM, DL_GEMM_STAGES>(p0, smem, bx);
  else gemm_tile<BM, DL_GEMM_STAGES>(p1, smem, bx - tiles0);
}

extern "C" __global__ void __launch_bounds__(gm::THREADS)
mla_gemm_pair(const __grid_constant__ GemmParams p0, const __grid_constant__ GemmParams p1) {
  dl::pdl_enter();  // (common.cuh: before anything else, so a programmatic launch of it is safe)
  extern __shared__ __align__(128) unsigned char smem[];
  gemm_pair<128>(p0, p1, smem);
}

extern "C" __global__ void __launch_bounds__(gm::THREADS)
mla_gemm_pair_m32(const __grid_constant__ GemmParams p0, const __grid_constant__ GemmParams p1) {
  dl::pdl_enter();  // (common.cuh: before anything else, so a programmatic launch of it is safe)
  extern __shared__ __align__(128) unsigned char smem[];
  gemm_pair<32>(p0, p1, smem);
}

// Split-K finish: C[m, col] = epilogue(sum over splits z = 0.. of partial[z, m, col]), in split order.
// Grid (m_max, ceil(n / 512)); Block 256 (two columns per thread). Early exit: m >= M.
extern "C" __global__ void __launch_bounds__(256)
mla_gemm_reduce(const __grid_constant__ GemmParams p) {
  dl::pdl_enter();  // (common.cuh: before anything else, so a programmatic launch of it is safe)
  i64 M = p.m_max;
  if (p.m_ptr != nullptr) M = min(M, *p.m_ptr);
  const i64 m = blockIdx.x;
  if (m >= M) return;
  const int col = (blockIdx.y * blockDim.x + threadIdx.x) * 2;
  if (col >= p.n) return;
  float v0 = 0.f, v1 = 0.f;
  for (int z = 0; z < p.k_splits; ++z) {
    const float2 w = *reinterpret_cast<const float2*>(p.partial + ((i64)z * p.m_max + m) * p.n + col);
    v0 += w.x;
    v1 += w.y;
  }
  const float2 w = p.noise_counter != nullptr
                       ? dlx::scale_pair<true>(p, v0, v1, dlx::noise_base(p.noise_seed, *p.noise_counter), m, col)
                       : dlx::scale_pair<false>(p, v0, v1, 0ull, m, col);
  dlx::store_pair(p, m, col, w.x, w.y);
}

extern "C" __global__ void __launch_bounds__(128)
mla_embed(const __grid_constant__ EmbedParams p) {
  dl::pdl_enter();  // (common.cuh: before anything else, so a programmatic launch of it is safe)
  i64 M = p.m_max;
  if (p.m_ptr != nullptr) M = min(M, *p.m_ptr);
  const i64 m = blockIdx.x;
  if (m >= M) return;
  i64 tok = p.tokens_i64 ? static_cast<const i64*>(p.tokens)[m] : (i64) static_cast<const i32*>(p.tokens)[m];
  tok = tok < 0 ? 0 : (tok >= p.vocab ? p.vocab - 1 : tok);
  i64 pos = 0;
  if (p.positions != nullptr)
    pos = p.positions_i64 ? static_cast<const i64*>(p.positions)[m] : (i64) static_cast<const i32*>(p.positions)[m];
  const int shift = (int)(((pos % p.num_classes) + p.num_classes) % p.num_classes);
  const bf16* src = p.table + tok * p.d;
  bf16* dst = p.out + m * p.d;
  for (int c = threadIdx.x; c < p.num_classes; c += blockDim.x) {
    int t = c + shift;
    if (t >= p.num_classes) t -= p.num_classes;
    dst[t] = src[c];
  }
  // Features: 16-byte chunks (num_classes and d are multiples of 8).
  const int nchunks = (p.d - p.num_classes) / 8;
  const uint4* s4 = reinterpret_cast<const uint4*>(src + p.num_classes);
  uint4* d4 = reinterpret_cast<uint4*>(dst + p.num_classes);
  for (int c = threadIdx.x; c < nchunks; c += blockDim.x) d4[c] = s4[c];
}

extern "C" __global__ void __launch_bounds__(256)
draft_chain(const __grid_constant__ DraftChainParams p) {
  if (blockIdx.x == 0 && threadIdx.x == 0) *p.step_counter += 1ull;
  const i64 t = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (p.vocab <= 0 || p.bs <= 0 || p.depth <= 0 || t >= (i64)p.bs * p.depth) return;
  const int b = (int)(t / p.depth), i = (int)(t % p.depth);
  int g = p.roots[b];
  g = g < 0 ? 0 : (g >= p.vocab ? p.vocab - 1 : g);
  p.guesses[t] = p.table[(i64)g * p.depth + i];
}
