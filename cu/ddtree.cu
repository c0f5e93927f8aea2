// ddtree.cu: DDTree on the GPU -- tree build, tree compile, greedy accept, KV commit.
//
// Pairs with driverlevel/ddtree.py (DDTreePlan; the ctypes mirror of DDTreeParams) and
// with the numpy reference driverlevel/reference/ddtree.py, which defines every result
// these kernels must reproduce exactly (Ringel & Romano 2026, arXiv 2604.12989).
// Every kernel takes the one DDTreeParams struct by value (__grid_constant__); all
// per-step values (active flags, lengths, the tree, the pool's count) are read from
// device memory, and every grid is fixed by the plan's maxima, so one captured graph
// serves every step.
//
// Kernels (block size, grid, dynamic shared memory, early exits):
//   ddtree_topk_chunks_{f32,bf16}  320 threads (four CTAs per SM on sm_90 for fp32, three for
//        bf16: <= 48 / 64 registers, 41.6 KB static smem); grid (num_chunks, depth_limit,
//        max_batch). One CTA holds one 7,680-token chunk of one depth row as order keys in
//        shared memory (24 per thread); one block reduction gives the chunk max, sum of exp
//        (for the row's log-sum-exp) and the moments of a normal cutoff that keeps about 4K
//        candidates; those go to a list (one block scan), and the exact top-K of the chunk by
//        (logit desc, id asc) is a histogram select over the list (over every logit when
//        fewer than K pass or more than LIST_CAP do), equal keys at the threshold ranked by
//        id with block scans. Written unsorted as 64-bit composites (order key << 32 | ~id)
//        with one block scan. Exits after its loads for inactive requests. NaN counts as -inf
//        (one compare per logit), so ids stay in range and distinct whatever the row holds.
//        CTA (0, 0, b) re-arms the build's per-request counter (and b = 0 the build status
//        word): no state survives a launch, so an aborted replay cannot break later builds.
//   ddtree_build                 512 threads; grid (depth_limit, max_batch); dynamic smem
//        from the plan (ddtree.build_shared_bytes) + 26 KB static. Each CTA merges one row's
//        chunk candidates (at most 12,288) into the sorted top-K -- the K-th largest key by a
//        histogram select, the K-th composite among equal keys only when needed, then a
//        bitonic sort with warp shuffles for strides below 32 -- with log-probs (fp32: logit
//        - lse, lse summed in fp64 from the chunks). The last CTA of a request to finish (a
//        per-request counter, reset by that CTA) selects the tree with the whole CTA
//        (parallel_search: depth by depth, a key histogram bounds the candidates, the nodes
//        ranked by (key, ranks tuple) at the end -- the reference's heapq order, exactly;
//        in the rare cases it cannot prove exactness (an inexact float64 sum, more than
//        SEARCH_CAP candidates) it runs the one-warp heap instead), then writes nodes and
//        ancestor bitmasks. Inactive requests: node_counts = 0, nothing else. Log-probs that
//        are -inf or NaN become -FLT_MAX (a row whose maximum is not finite: all of them, and
//        STATUS_NONFINITE in state[3]); a root token outside the vocabulary: no tree, an error.
//   ddtree_compile               256 threads; grid (max_batch, COMPILE_CTAS); no dynamic
//        smem. Verify input ids, positions, slots from the free-slot pool, qo/kv/mask
//        indptrs, kv_indices from req_to_token, packed bitmask and the optional SGLang
//        FULL / QLEN_ONLY masks. Every CTA recomputes the small per-request prefix sums.
//        Checks node counts, committed lengths (<= max_context: with the plan's
//        max_batch * max_context < 2^31 the int32 kv_indptr cannot wrap), req_pool_indices,
//        the pool count and every slot id it copies; a bad request gets no rows.
//   ddtree_argmax_{f32,bf16}     256 threads; grid (argmax_grid), fixed by the plan. One warp
//        per (row, split) work item, grid-strided, 16-byte loads (4 in flight per lane), a
//        float compare per logit; the warp's (key, ~id) composite goes into the row's
//        maximum with a 64-bit atomicMax (first index on ties). Stops at the first row at or
//        past qo_indptr[max_batch].
//   ddtree_accept                256 threads; grid (max_batch). Posterior per node (the
//        row maxima, which it clears for the next argmax, or the given tokens), the walk
//        (tokens and stop tokens staged in shared memory), the context room, next roots;
//        records mirrored to a mapped host buffer with volatile stores and
//        __threadfence_system(). A target row with nothing above -inf (or a target token
//        outside the vocabulary) gives posterior 0, matches no child, and a walk that ends
//        there finishes the request (finished = FINISH_NONFINITE, STATUS_NONFINITE).
//   ddtree_commit                256 threads; grid (max_batch). Paged: append accepted
//        slots to req_to_token, push rejected slots back onto the pool, advance lengths;
//        does nothing when compile found the pool exhausted. With paged == 0 it only
//        advances the lengths (after ddtree_commit_dense).
//   ddtree_commit_dense          256 threads; grid (max_batch, dense_layers). Moves the
//        accepted rows of each request's appended window to its front, row by row, bounded by
//        the window: a node whose row lies past it cuts the path there (accepted_count, the
//        request finishes, STATUS_CONTEXT_FULL).
// Bad per-step metadata is reported through the device error word (p.error, common.cuh):
// the kernels never read or write out of bounds and give the bad request a defined result.
#include "common.cuh"
#include "constants.cuh"

namespace ddt {

constexpr u32 FULL = 0xffffffffu;
// Shared with Python: driverlevel/_constants.py, passed as -DDL_<NAME> (constants.cuh).
constexpr int TOPK_THREADS = DL_DDTREE_TOPK_THREADS;
constexpr int TOPK_ELEMS = DL_DDTREE_TOPK_ELEMS;        // logits per thread in a chunk
constexpr int CHUNK = TOPK_THREADS * TOPK_ELEMS;        // 7,680 tokens per chunk CTA
constexpr int BUILD_THREADS = DL_DDTREE_BUILD_THREADS;
constexpr int MERGE_ELEMS = DL_DDTREE_MERGE_ELEMS;      // candidates per thread in a row merge
constexpr int MAX_K = DL_MAX_BUDGET;
constexpr int OVERSAMPLE = 4;                           // chunk cutoff aims at ~4K candidates (kernel-only)
constexpr int SMALL_THREADS = DL_DDTREE_SMALL_THREADS;  // compile, argmax, accept, commit
constexpr int STATUS_POOL_EXHAUSTED = DL_STATUS_POOL_EXHAUSTED;
constexpr int STATUS_CONTEXT_FULL = DL_STATUS_CONTEXT_FULL;
constexpr int STATUS_KV_CAPACITY = DL_STATUS_KV_CAPACITY;
constexpr int STATUS_MASK_CAPACITY = DL_STATUS_MASK_CAPACITY;
constexpr int STATUS_NONFINITE = DL_STATUS_NONFINITE;   // a logits row had no value above -inf (or a bad target token)
constexpr int FINISH_DONE = DL_FINISH_DONE;             // records' `finished`: stop token, context full
constexpr int FINISH_NONFINITE = DL_FINISH_NONFINITE;   //   the walk read a target row with no finite argmax
constexpr int RECORD_HEADER = DL_RECORD_HEADER;
constexpr int FLAG_LEGACY_SEARCH = DL_FLAG_LEGACY_SEARCH;  // the one-warp heap instead of the parallel search
// Kernel-only.
constexpr int SEARCH_CAP = 1536;                        // candidate nodes the parallel search holds
constexpr int SEARCH_BINS = 512;                        // key histogram of the parallel search
constexpr int SEARCH_PER = (SEARCH_CAP + BUILD_THREADS - 1) / BUILD_THREADS;
constexpr unsigned short NO_NODE = 0xffff;

}  // namespace ddt

// Mirrored by driverlevel.ddtree._Params (ctypes). Shapes use the plan's maxima:
// B = max_batch, D = depth_limit, K = min(budget, vocab), N = budget + 1 nodes,
// W = n_words, S = num_chunks, Q = B * N draft rows.
struct DDTreeParams {
  // ---- build
  const void* logits;          // [B, D, vocab] fp32 or bf16, strides below (elements)
  u8* active;                  // [B] 1 = request live; accept clears finished requests
  i32* root_tokens;            // [B] node 0's token; accept writes the next roots
  const i32* budgets;          // [B] nodes besides the root, clamped to [0, budget]; null = budget
  u64* cand;                   // [B, D, S, K] chunk top-K composites (workspace)
  float* chunk_max;            // [B, D, S]
  double* chunk_sum;           // [B, D, S] sum of exp(x - chunk_max)
  u32* counters;               // [B] rows finished per request; zero between launches
  i32* top_ids;                // [B, D, K] by rank
  float* top_lp;               // [B, D, K] log-probs, non-increasing
  i32* tokens;                 // [B, N] -1 past the count
  i32* depths;                 // [B, N]
  i32* parents;                // [B, N] root -1
  i32* node_counts;            // [B] root included; 0 for inactive requests
  u32* anc;                    // [B, N, W] ancestor-and-self bitmask words
  // ---- engine state
  i64* committed_lens;         // [B] tokens whose KV is cached (the root's position)
  const i64* req_pool_indices; // [B] row of req_to_token
  void* req_to_token;          // [rows, r2t_stride] int32 or int64 slot ids by position
  i64* free_slots;             // [capacity] free-slot stack
  i64* free_count;             // [1]
  const i32* stop_tokens;      // [B, n_stop] -1 padded, or null
  // ---- compile
  i32* input_ids;              // [Q]
  i64* positions;              // [Q]
  i64* out_cache_loc;          // [Q]
  i64* qo_indptr;              // [B + 1]
  i32* kv_indptr;              // [B + 1]
  i64* kv_indices;             // [kv_capacity]
  u32* bitmask;                // [Q, W] packed mask by global draft row
  u8* full_mask;               // [full_capacity] SGLang FULL, or null
  i64* full_indptr;            // [B + 1] or null
  u8* qlen_mask;               // [qlen_capacity] SGLang QLEN_ONLY, or null
  i64* qlen_indptr;            // [B + 1] or null
  i64* state;                  // [4] alloc_base, alloc_total, status bits, unused
  // ---- accept
  const void* target_logits;   // [>= Q, vocab] fp32/bf16 rows by qo_indptr, or null
  u64* argmax_part;            // [Q] running argmax composite per row; accept reads and clears it
  const i32* target_tokens;    // [Q] argmax given by the caller, or null
  i32* posterior;              // [Q] argmax per node
  i32* accepted_nodes;         // [B, D + 1]
  i32* accepted_count;         // [B]
  i32* bonus;                  // [B] -1 = none
  i32* records;                // [B, record_width] device copy of the accept records
  i32* mirror;                 // same layout in mapped host memory, or null
  // ---- dense commit
  u8* dense_cache;             // base of the dense cache
  // ---- errors
  dl::DeviceErrorWord* error;  // bad per-step metadata (common.cuh), or null
  // ---- scalars
  i64 logits_batch_stride;
  i64 logits_row_stride;
  i64 target_row_stride;
  i64 kv_capacity;
  i64 full_capacity;
  i64 qlen_capacity;
  i64 max_context;
  i64 r2t_stride;
  i64 dense_layer_stride;      // bytes
  i64 dense_batch_stride;      // bytes
  i64 dense_pos_stride;        // bytes
  i64 dense_row_bytes;         // multiple of 16
  i64 dense_window;            // positions per request window of the dense cache
  i64 r2t_rows;                // rows of req_to_token
  i64 free_capacity;           // entries of free_slots; slot ids must lie in [0, free_capacity)
  i32 max_batch;
  i32 depth_limit;
  i32 vocab;
  i32 budget;
  i32 k;
  i32 num_chunks;
  i32 n_words;
  i32 logits_vec;              // 1: 16-byte loads of the drafter logits
  i32 target_vec;              // 1: 16-byte loads of the target logits
  i32 argmax_splits;
  i32 argmax_split_len;
  i32 n_stop;
  i32 r2t_is64;
  i32 paged;
  i32 dense_layers;
  i32 record_width;            // RECORD_HEADER + D + 1
  i32 lp_bytes;                // union region of ddtree_build's dynamic smem (multiple of 16)
  i32 flags;                   // ddt::FLAG_* (0 = the fast paths; FLAG_LEGACY_SEARCH is for tests)
};

#ifdef DL_OFF_logits
DL_CHECK_OFFSET(DDTreeParams, logits);
DL_CHECK_OFFSET(DDTreeParams, active);
DL_CHECK_OFFSET(DDTreeParams, root_tokens);
DL_CHECK_OFFSET(DDTreeParams, budgets);
DL_CHECK_OFFSET(DDTreeParams, cand);
DL_CHECK_OFFSET(DDTreeParams, chunk_max);
DL_CHECK_OFFSET(DDTreeParams, chunk_sum);
DL_CHECK_OFFSET(DDTreeParams, counters);
DL_CHECK_OFFSET(DDTreeParams, top_ids);
DL_CHECK_OFFSET(DDTreeParams, top_lp);
DL_CHECK_OFFSET(DDTreeParams, tokens);
DL_CHECK_OFFSET(DDTreeParams, depths);
DL_CHECK_OFFSET(DDTreeParams, parents);
DL_CHECK_OFFSET(DDTreeParams, node_counts);
DL_CHECK_OFFSET(DDTreeParams, anc);
DL_CHECK_OFFSET(DDTreeParams, committed_lens);
DL_CHECK_OFFSET(DDTreeParams, req_pool_indices);
DL_CHECK_OFFSET(DDTreeParams, req_to_token);
DL_CHECK_OFFSET(DDTreeParams, free_slots);
DL_CHECK_OFFSET(DDTreeParams, free_count);
DL_CHECK_OFFSET(DDTreeParams, stop_tokens);
DL_CHECK_OFFSET(DDTreeParams, input_ids);
DL_CHECK_OFFSET(DDTreeParams, positions);
DL_CHECK_OFFSET(DDTreeParams, out_cache_loc);
DL_CHECK_OFFSET(DDTreeParams, qo_indptr);
DL_CHECK_OFFSET(DDTreeParams, kv_indptr);
DL_CHECK_OFFSET(DDTreeParams, kv_indices);
DL_CHECK_OFFSET(DDTreeParams, bitmask);
DL_CHECK_OFFSET(DDTreeParams, full_mask);
DL_CHECK_OFFSET(DDTreeParams, full_indptr);
DL_CHECK_OFFSET(DDTreeParams, qlen_mask);
DL_CHECK_OFFSET(DDTreeParams, qlen_indptr);
DL_CHECK_OFFSET(DDTreeParams, state);
DL_CHECK_OFFSET(DDTreeParams, target_logits);
DL_CHECK_OFFSET(DDTreeParams, argmax_part);
DL_CHECK_OFFSET(DDTreeParams, target_tokens);
DL_CHECK_OFFSET(DDTreeParams, posterior);
DL_CHECK_OFFSET(DDTreeParams, accepted_nodes);
DL_CHECK_OFFSET(DDTreeParams, accepted_count);
DL_CHECK_OFFSET(DDTreeParams, bonus);
DL_CHECK_OFFSET(DDTreeParams, records);
DL_CHECK_OFFSET(DDTreeParams, mirror);
DL_CHECK_OFFSET(DDTreeParams, dense_cache);
DL_CHECK_OFFSET(DDTreeParams, error);
DL_CHECK_OFFSET(DDTreeParams, logits_batch_stride);
DL_CHECK_OFFSET(DDTreeParams, logits_row_stride);
DL_CHECK_OFFSET(DDTreeParams, target_row_stride);
DL_CHECK_OFFSET(DDTreeParams, kv_capacity);
DL_CHECK_OFFSET(DDTreeParams, full_capacity);
DL_CHECK_OFFSET(DDTreeParams, qlen_capacity);
DL_CHECK_OFFSET(DDTreeParams, max_context);
DL_CHECK_OFFSET(DDTreeParams, r2t_stride);
DL_CHECK_OFFSET(DDTreeParams, dense_layer_stride);
DL_CHECK_OFFSET(DDTreeParams, dense_batch_stride);
DL_CHECK_OFFSET(DDTreeParams, dense_pos_stride);
DL_CHECK_OFFSET(DDTreeParams, dense_row_bytes);
DL_CHECK_OFFSET(DDTreeParams, dense_window);
DL_CHECK_OFFSET(DDTreeParams, r2t_rows);
DL_CHECK_OFFSET(DDTreeParams, free_capacity);
DL_CHECK_OFFSET(DDTreeParams, max_batch);
DL_CHECK_OFFSET(DDTreeParams, depth_limit);
DL_CHECK_OFFSET(DDTreeParams, vocab);
DL_CHECK_OFFSET(DDTreeParams, budget);
DL_CHECK_OFFSET(DDTreeParams, k);
DL_CHECK_OFFSET(DDTreeParams, num_chunks);
DL_CHECK_OFFSET(DDTreeParams, n_words);
DL_CHECK_OFFSET(DDTreeParams, logits_vec);
DL_CHECK_OFFSET(DDTreeParams, target_vec);
DL_CHECK_OFFSET(DDTreeParams, argmax_splits);
DL_CHECK_OFFSET(DDTreeParams, argmax_split_len);
DL_CHECK_OFFSET(DDTreeParams, n_stop);
DL_CHECK_OFFSET(DDTreeParams, r2t_is64);
DL_CHECK_OFFSET(DDTreeParams, paged);
DL_CHECK_OFFSET(DDTreeParams, dense_layers);
DL_CHECK_OFFSET(DDTreeParams, record_width);
DL_CHECK_OFFSET(DDTreeParams, lp_bytes);
DL_CHECK_OFFSET(DDTreeParams, flags);
static_assert(sizeof(DDTreeParams) == DL_SIZEOF_PARAMS, "DDTreeParams size differs from its ctypes mirror");
#endif

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

// ------------------------------------------------------------------------------ block helpers
// Every helper ends with __syncthreads() so that its scratch may be reused at once.

template <int T>
DL_DEVICE u64 block_max_u64(u64 v, u64* scratch) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const u64 w = __shfl_xor_sync(FULL, v, o);
    v = w > v ? w : v;
  }
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  u64 r = scratch[0];
#pragma unroll
  for (int i = 1; i < T / 32; ++i) r = scratch[i] > r ? scratch[i] : r;
  __syncthreads();
  return r;
}

template <int T>
DL_DEVICE double block_sum_f64(double v, double* scratch) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  double r = 0.0;
#pragma unroll
  for (int i = 0; i < T / 32; ++i) r += scratch[i];
  __syncthreads();
  return r;
}

template <int T>
DL_DEVICE int block_sum_int(int v, int* scratch) {
  v = static_cast<int>(__reduce_add_sync(FULL, static_cast<u32>(v)));
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  int r = 0;
#pragma unroll
  for (int i = 0; i < T / 32; ++i) r += scratch[i];
  __syncthreads();
  return r;
}

// Exclusive prefix sum over the block in thread order; *total gets the sum.
template <int T>
DL_DEVICE int block_excl_scan(int v, int* scratch, int* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int x = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(FULL, x, o);
    if (lane >= o) x += y;
  }
  if (lane == 31) scratch[warp] = x;
  __syncthreads();
  int before = 0, all = 0;
#pragma unroll
  for (int i = 0; i < T / 32; ++i) {
    const int s = scratch[i];
    before += i < warp ? s : 0;
    all += s;
  }
  __syncthreads();
  *total = all;
  return before + x - v;
}

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
// id order (a group = the V slots of one vector), one block scan per group.
template <int V>
DL_DEVICE u32 keep_lowest_ids(const u32* key, u32 t, int need, int* scratch) {
  u32 ties = 0;  // bit j: slot j holds the threshold key
#pragma unroll
  for (int j = 0; j < TOPK_ELEMS; ++j) ties |= (key[j * TOPK_THREADS] == t ? 1u : 0u) << j;
  u32 keep = 0;
  int before = 0;
#pragma unroll 1
  for (int g = 0; g < TOPK_ELEMS / V; ++g) {
    const u32 mine = (ties >> (g * V)) & ((1u << V) - 1);
    int total;
    int quota = need - before - block_excl_scan<TOPK_THREADS>(__popc(mine), scratch, &total);
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

// One CTA: one CHUNK-token chunk of one depth row. The order keys live in shared memory (few
// registers, so several CTAs share an SM); the chunk's max, sum of exp and the moments of the
// normal cutoff come from one block reduction; then the exact top-kc by (logit desc, id asc)
// (kth_largest on the keys, ties at the threshold by id) is written with one block scan.
template <typename T>
DL_DEVICE void topk_chunk(const DDTreeParams& p) {
  using Tr = LogitTraits<T>;
  constexpr int V = Tr::VEC;
  __shared__ ChunkSmem sm;
  const int s = blockIdx.x, d = blockIdx.y, b = blockIdx.z, tid = threadIdx.x;
  // Re-arm the state ddtree_build relies on inside every launch (so a launch left unfinished,
  // e.g. an aborted replay, or a poisoned counter cannot break later builds): the request's
  // row counter and the build's status word. ddtree_build runs after this kernel completes.
  if (s == 0 && d == 0 && tid == 0) {
    p.counters[b] = 0u;
    if (b == 0) p.state[3] = 0;
  }
  const bool live = p.active[b] != 0;  // checked after the logits loads are in flight
  const int start = s * CHUNK;
  const int n = min(CHUNK, p.vocab - start);
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
        if (li < n) Tr::load_vec(row + li, x);
#pragma unroll
        for (int e = 0; e < V; ++e) key[v * V + e] = li < n ? logit_key(x[e]) : 0u;
      }
    } else {
#pragma unroll
      for (int j = 0; j < TOPK_ELEMS; ++j) {
        const int li = token(j) - start;
        key[j] = li < n ? logit_key(Tr::load(row + li)) : 0u;
      }
    }
    if (!live) return;  // (uniform)
#pragma unroll
    for (int j = 0; j < TOPK_ELEMS; ++j) {
      skey[j * TOPK_THREADS] = key[j];
      kloc = key[j] > kloc ? key[j] : kloc;
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
      const u32 k = skey[j * TOPK_THREADS];
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
    if ((tid & 31) == 0) {
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
      const u32 k = skey[j * TOPK_THREADS];
      mine |= ((k >= kcut && k != 0) ? 1u : 0u) << j;
    }
    int total;
    int pos = block_excl_scan<TOPK_THREADS>(__popc(mine), sm.ri, &total);
    // Usually the candidates go to a list and the select visits ~total/TOPK_THREADS of them per
    // thread and level; when fewer than kc pass (kcut = 1: every logit) or more than the list
    // holds, it visits every slot.
    const bool listed = total >= kc && total <= LIST_CAP;
    if (total < kc) kcut = 1;
    if (listed) {
      for (u32 m = mine; m; m &= m - 1) sm.list[pos++] = static_cast<unsigned short>((__ffs(m) - 1) * TOPK_THREADS + tid);
    }
    const int ecount = listed ? (total + TOPK_THREADS - 1) / TOPK_THREADS : TOPK_ELEMS;
    t = kth_largest<TOPK_THREADS, TOPK_ELEMS, u32>(
        [&](int j, int z) -> u32 {
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
      const u32 k = skey[j * TOPK_THREADS];
      above += k > t;
      ties += k == t;
    }
    // above and ties in one reduction: ties in the low 16 bits (at most CHUNK each)
    const int packed = block_sum_int<TOPK_THREADS>((above << 16) | ties, sm.ri);
    const int need = kc - (packed >> 16);
    if ((packed & 0xffff) > need) tie_keep = keep_lowest_ids<V>(skey, t, need, sm.ri);
  }
  // Write the kc picked logits (in no particular order: the row merge sorts).
  u32 picked = 0;
#pragma unroll
  for (int j = 0; j < TOPK_ELEMS; ++j) {
    const u32 k = skey[j * TOPK_THREADS];
    picked |= ((k > t || (k == t && k != 0 && ((tie_keep >> j) & 1u))) ? 1u : 0u) << j;
  }
  int total_picked;
  int pos = block_excl_scan<TOPK_THREADS>(__popc(picked), sm.ri, &total_picked);
  u64* out = p.cand + row_id * p.k;
#pragma unroll
  for (int j = 0; j < TOPK_ELEMS; ++j)
    if ((picked >> j) & 1u) out[pos++] = composite(skey[j * TOPK_THREADS], token(j));
}

// ------------------------------------------------------------------------------ heap (one warp)
// Frontier entry = candidate child (parent node p, rank c) at depth dd, packed in 32 bits.

DL_DEVICE u32 pack_meta(int p, int c, int dd) {
  return static_cast<u32>(p) | (static_cast<u32>(c) << 16) | (static_cast<u32>(dd) << 26);
}
DL_DEVICE int meta_p(u32 m) { return static_cast<int>(m & 0xffffu); }
DL_DEVICE int meta_c(u32 m) { return static_cast<int>((m >> 16) & 0x3ffu); }
DL_DEVICE int meta_d(u32 m) { return static_cast<int>(m >> 26); }

struct NodeSmem {
  short* par;
  short* rank;
  u8* dep;
};

// True if candidate a's ranks tuple sorts before b's (a prefix before its extensions).
DL_DEVICE bool ranks_less(u32 a, u32 b, const NodeSmem& ns) {
  int pa = meta_p(a), ra = meta_c(a), da = meta_d(a);
  int pb = meta_p(b), rb = meta_c(b), db = meta_d(b);
  const int la = da, lb = db;
  while (da > db) { ra = ns.rank[pa]; pa = ns.par[pa]; --da; }
  while (db > da) { rb = ns.rank[pb]; pb = ns.par[pb]; --db; }
  if (pa == pb && ra == rb) return la < lb;
  while (pa != pb) {
    ra = ns.rank[pa]; pa = ns.par[pa];
    rb = ns.rank[pb]; pb = ns.par[pb];
  }
  return ra < rb;
}

// Heap order of the reference: larger key first, then the smaller ranks tuple.
DL_DEVICE bool better(u64 sa, u32 ma, u64 sb, u32 mb, const NodeSmem& ns) {
  return sa > sb || (sa == sb && sa != 0 && ranks_less(ma, mb, ns));
}

// Best entry of the overflow (all lanes; result uniform). Returns its index or -1.
DL_DEVICE int overflow_max(const u64* ovs, const u32* ovm, int ovn, const NodeSmem& ns, u64* os, u32* om) {
  const int lane = threadIdx.x & 31;
  u64 bs = 0;
  u32 bm = 0;
  int bi = -1;
  for (int i = lane; i < ovn; i += 32) {
    const u64 s = ovs[i];
    const u32 m = ovm[i];
    if (bi < 0 || better(s, m, bs, bm, ns)) { bs = s; bm = m; bi = i; }
  }
  const u32 hi = static_cast<u32>(bs >> 32);
  const u32 mh = __reduce_max_sync(FULL, hi);
  const u32 ml = __reduce_max_sync(FULL, hi == mh ? static_cast<u32>(bs) : 0u);
  const u32 tied = __ballot_sync(FULL, bi >= 0 && hi == mh && static_cast<u32>(bs) == ml);
  if (!tied) return -1;
  int w = __ffs(tied) - 1;
  u32 wm = __shfl_sync(FULL, bm, w);
  for (u32 t = tied & (tied - 1); t; t &= t - 1) {
    const int l = __ffs(t) - 1;
    const u32 lm = __shfl_sync(FULL, bm, l);
    if (ranks_less(lm, wm, ns)) { w = l; wm = lm; }
  }
  *os = __shfl_sync(FULL, bs, w);
  *om = wm;
  return __shfl_sync(FULL, bi, w);
}

// Best-first search of one request on warp 0. lp: [D][ks] log-probs in shared memory.
// Records nodes 1..count in ns; returns count (nodes besides the root).
DL_DEVICE int heap_select(const float* lp, int ks, int kb, int D, int budget, u64* ovs, u32* ovm,
                          const NodeSmem& ns) {
  const int lane = threadIdx.x & 31;
  u64 es = 0;  // this lane's frontier entry (lane 0 = best), 0 = empty
  u32 em = 0;
  int size = 0, ovn = 0, oi = -1;
  u64 os = 0;  // the overflow's best entry (valid when ovn > 0)
  u32 om = 0;
  if (budget > 0 && kb > 0 && D > 0) {
    if (lane == 0) { es = enc_key(static_cast<double>(lp[0])); em = pack_meta(0, 0, 1); }
    size = 1;
  }
  int count = 0;
  while (count < budget && size > 0) {
    const u64 s0 = __shfl_sync(FULL, es, 0);
    const u32 m0 = __shfl_sync(FULL, em, 0);
    const int pp = meta_p(m0), c = meta_c(m0), dd = meta_d(m0);
    const int n = count + 1;
    if (lane == 0) { ns.par[n] = static_cast<short>(pp); ns.rank[n] = static_cast<short>(c); ns.dep[n] = static_cast<u8>(dd); }
    const double key = dec_key(s0);
    const float* row = lp + (dd - 1) * ks;
    u64 xs = 0, ys = 0;
    if (n < budget) {
      if (c + 1 < kb) xs = enc_key(__dadd_rn(__dsub_rn(key, static_cast<double>(row[c])), static_cast<double>(row[c + 1])));
      if (dd < D) ys = enc_key(__dadd_rn(key, static_cast<double>(lp[dd * ks])));
    }
    u32 xm = pack_meta(pp, c + 1, dd), ym = pack_meta(n, 0, dd + 1);
    __syncwarp();
    // Entries worse than the overflow's best go to the overflow.
    if (xs && ovn > 0 && better(os, om, xs, xm, ns)) {
      if (lane == 0) { ovs[ovn] = xs; ovm[ovn] = xm; }
      ++ovn;
      xs = 0;
    }
    if (ys && ovn > 0 && better(os, om, ys, ym, ns)) {
      if (lane == 0) { ovs[ovn] = ys; ovm[ovn] = ym; }
      ++ovn;
      ys = 0;
    }
    if (!xs || (ys && better(ys, ym, xs, xm, ns))) {  // X = the better of the two inserted
      const u64 ts = xs; xs = ys; ys = ts;
      const u32 tm = xm; xm = ym; ym = tm;
    }
    const int ins = (xs != 0) + (ys != 0);
    const bool rem = lane >= 1 && lane < size;
    const int qx = __popc(__ballot_sync(FULL, rem && xs && better(es, em, xs, xm, ns)));
    const int qy = __popc(__ballot_sync(FULL, rem && ys && better(es, em, ys, ym, ns))) + 1;
    const int nsize = size - 1 + ins;
    if (nsize > 32) {  // list full and two inserted: the 33rd entry moves to the overflow
      if (qy == 32) {
        if (lane == 0) { ovs[ovn] = ys; ovm[ovn] = ym; }
        os = ys; om = ym;
        ys = 0;
      } else {
        if (lane == 31) { ovs[ovn] = es; ovm[ovn] = em; }
        os = __shfl_sync(FULL, es, 31);
        om = __shfl_sync(FULL, em, 31);
      }
      oi = ovn++;
    }
    const int src = lane + 1 - ((xs && qx < lane) ? 1 : 0) - ((ys && qy < lane) ? 1 : 0);
    u64 s_new = __shfl_sync(FULL, es, src < 32 ? src : 31);
    u32 m_new = __shfl_sync(FULL, em, src < 32 ? src : 31);
    if (src >= size) { s_new = 0; m_new = 0; }
    if (xs && lane == qx) { s_new = xs; m_new = xm; }
    if (ys && lane == qy) { s_new = ys; m_new = ym; }
    es = s_new;
    em = m_new;
    size = nsize < 32 ? nsize : 32;
    __syncwarp();
    if (size < 32 && ovn > 0) {  // refill the list's end from the overflow
      if (lane == size) { es = os; em = om; }
      ++size;
      if (lane == 0) { ovs[oi] = ovs[ovn - 1]; ovm[oi] = ovm[ovn - 1]; }
      --ovn;
      __syncwarp();
      oi = ovn > 0 ? overflow_max(ovs, ovm, ovn, ns, &os, &om) : -1;
    }
    ++count;
  }
  return count;
}

// ------------------------------------------------------------------------------ parallel search
// The best-first search of the reference pops nodes in the order of the heap key. When every
// node's key is at most its generator's (its previous sibling's or its parent's), the pop
// order is simply the order of all candidate nodes by (key desc, ranks tuple asc), so the
// tree is the `budget` best nodes, sorted. The whole CTA finds them depth by depth:
//  * keys: a child's key is parent + lp[0] and a sibling's is key - lp[r-1] + lp[r] (float64,
//    as the reference). While every parent + lp[r] is exact in float64 (checked with TwoSum,
//    nearly always: they are sums of at most 33 float32 values) these equal parent + lp[r],
//    which is monotone in r -- so the keys are exactly the reference's and monotone.
//  * a histogram of -key over SEARCH_BINS linear bins on [-lp[0][0], an upper bound of the
//    budget-th best] gives a bin b* with at least `budget` generated nodes in bins <= b*, so
//    every node of the answer lies in a bin <= b*: only children in bins <= b* are generated
//    (a binary search per parent over its sorted lp row), b* shrinks as nodes are added, and
//    parents past b* have no candidate children. A boundary check (the exact sibling chain
//    past the last child, with a margin for rounding) keeps later siblings out for certain.
//  * at the end the candidates in bins <= b* are bucketed by bin and ranked inside their bin
//    by (key, ranks tuple); rank < budget gives the node index.
// Inexact sums, a sibling past the boundary inside b*, or more than SEARCH_CAP candidates
// after tightening set `fail`, and the caller runs the one-warp heap instead.

struct SearchSmem {
  double key[SEARCH_CAP];
  unsigned short par[SEARCH_CAP];  // candidate index of the parent, NO_NODE = the root
  unsigned short rd[SEARCH_CAP];   // rank | depth << 9
  unsigned short aux[SEARCH_CAP];  // per-parent counts / offsets, compaction map, buckets, node index
  u32 hist[SEARCH_BINS];
  u32 cur[SEARCH_BINS];            // bucket cursors; during generation the list of big parents
  double x_lo, x_hi, inv_w;
  int bstar, fail, cn, seg_lo, seg_hi, nbig, nlo, nhi;
};

struct SearchBins {
  double lo, hi, inv;
  // Monotone (non-decreasing) in x = -key; SEARCH_BINS = past the upper bound.
  DL_DEVICE int operator()(double x) const {
    if (!(x > lo)) return 0;
    if (x > hi) return SEARCH_BINS;
    const double t = __dmul_rn(__dsub_rn(x, lo), inv);
    return t < static_cast<double>(SEARCH_BINS - 1) ? static_cast<int>(t) : SEARCH_BINS - 1;
  }
};

DL_DEVICE bool sum_exact(double a, double b, double s) {  // s = fl(a + b): is it exact? (TwoSum)
  const double bb = __dsub_rn(s, a);
  const double err = __dadd_rn(__dsub_rn(a, __dsub_rn(s, bb)), __dsub_rn(b, bb));
  return err == 0.0;
}

// Warp-uniform: the smallest b with hist[0..b] >= need (SEARCH_BINS - 1 when the total is less).
DL_DEVICE int search_find_bin(const u32* hist, int need) {
  const int lane = threadIdx.x & 31;
  constexpr int PER = SEARCH_BINS / 32;
  u32 own = 0;
#pragma unroll
  for (int i = 0; i < PER; ++i) own += hist[lane * PER + i];
  u32 incl = own;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const u32 y = __shfl_up_sync(FULL, incl, o);
    if (lane >= o) incl += y;
  }
  const u32 hit = __ballot_sync(FULL, incl >= static_cast<u32>(need));
  if (!hit) return SEARCH_BINS - 1;
  const int src = __ffs(hit) - 1;
  int bin = 0;
  if (lane == src) {
    u32 run = incl - own;
    for (int i = 0; i < PER; ++i) {
      run += hist[lane * PER + i];
      if (run >= static_cast<u32>(need)) { bin = lane * PER + i; break; }
    }
  }
  return __shfl_sync(FULL, bin, src);
}

// Children of a parent with key kp at the row `row` (ranks < kb) whose bins are <= bstar: a
// prefix of the ranks (binary search). Sets *fail when a later sibling might still qualify.
DL_DEVICE int count_children(double kp, const float* row, int kb, int bstar, const SearchBins& bins, int* fail) {
  int lo = 0, hi = kb;
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (bins(-__dadd_rn(kp, static_cast<double>(row[mid]))) <= bstar) lo = mid + 1;
    else hi = mid;
  }
  if (lo < kb) {  // walk the exact sibling chain while rounding could still bring a key back in
    const double margin = (fabs(kp) + fabs(static_cast<double>(row[kb - 1]))) * 0x1p-40;
    double k = __dadd_rn(kp, static_cast<double>(row[lo]));
    int r = lo;
    while (bins(-__dadd_rn(k, margin)) <= bstar) {
      if (++r >= kb) break;
      k = __dadd_rn(__dsub_rn(k, static_cast<double>(row[r - 1])), static_cast<double>(row[r]));
      if (bins(-k) <= bstar) { *fail = 1; break; }
    }
  }
  return lo;
}

// True if candidate a's ranks tuple sorts before b's (a prefix before its extensions); a != b.
DL_DEVICE bool cand_ranks_less(int a, int b, const SearchSmem& s) {
  int x = a, y = b;
  int dx = s.rd[a] >> 9, dy = s.rd[b] >> 9;
  while (dx > dy) { x = s.par[x]; --dx; }
  while (dy > dx) { y = s.par[y]; --dy; }
  if (x == y) return (s.rd[a] >> 9) < (s.rd[b] >> 9);
  while (s.par[x] != s.par[y]) { x = s.par[x]; y = s.par[y]; }
  return (s.rd[x] & 511) < (s.rd[y] & 511);
}

DL_DEVICE bool cand_better(int y, int x, const SearchSmem& s) {
  const double ky = s.key[y], kx = s.key[x];
  return ky > kx || (ky == kx && cand_ranks_less(y, x, s));
}

// Counts of the children of the parents [seg_lo, seg_lo + P) (d == 1: the root alone) under
// bstar; thread t owns parents t*E .. t*E+E-1 (E = ceil(P / T)). Returns this thread's sum.
DL_DEVICE int search_counts(const SearchSmem& s, const float* row, int d, int P, int seg_lo, int kb, int bstar,
                            const SearchBins& bins, int (&cnt)[SEARCH_PER], int* fail) {
  const int E = (P + BUILD_THREADS - 1) / BUILD_THREADS;
  int own = 0;
#pragma unroll
  for (int e = 0; e < SEARCH_PER; ++e) {
    const int i = threadIdx.x * E + e;
    int c = 0;
    if (e < E && i < P) {
      const double kp = d == 1 ? 0.0 : s.key[seg_lo + i];
      if (d == 1 || bins(-kp) <= bstar) c = count_children(kp, row, kb, bstar, bins, fail);
    }
    cnt[e] = c;
    own += c;
  }
  return own;
}

// The parallel search (every thread of the CTA). lp: [D][ks] in shared memory, kb ranks per
// depth, n nodes wanted (n, kb, D >= 1). Fills ns for nodes 1..count and returns count, or -1
// when the caller must run heap_select instead.
DL_DEVICE int parallel_search(const float* lp, int ks, int kb, int D, int n, SearchSmem& s, int* scratch,
                              const NodeSmem& ns) {
  constexpr int T = BUILD_THREADS;
  static_assert(T == SEARCH_BINS, "the bucket scan gives one bin to each thread");
  const int tid = threadIdx.x;
  if (tid == 0) {
    const double lo = -static_cast<double>(lp[0]);
    double hi;
    if (kb == n) {
      hi = -static_cast<double>(lp[n - 1]);  // n depth-1 nodes are at least this good
    } else {  // every node: the sum of the worst log-probs, with room for rounding
      hi = 0.0;
      for (int d = 0; d < D; ++d) hi -= static_cast<double>(lp[d * ks + kb - 1]);
      hi = hi * (1.0 + 0x1p-30) + 0x1p-60;
    }
    s.x_lo = lo;
    s.x_hi = hi;
    s.inv_w = hi > lo ? static_cast<double>(SEARCH_BINS) / (hi - lo) : 0.0;
    s.bstar = SEARCH_BINS - 1;
    s.fail = 0;
    s.cn = 0;
    s.seg_lo = 0;
    s.seg_hi = 0;
  }
  for (int i = tid; i < SEARCH_BINS; i += T) s.hist[i] = 0u;
  __syncthreads();
  const SearchBins bins{s.x_lo, s.x_hi, s.inv_w};
  for (int d = 1; d <= D; ++d) {
    int seg_lo = s.seg_lo, cn = s.cn, bstar = s.bstar;
    int P = d == 1 ? 1 : s.seg_hi - seg_lo;
    if (P == 0) break;
    const float* row = lp + (d - 1) * ks;
    int fail = 0;
    int cnt[SEARCH_PER];
    int own = search_counts(s, row, d, P, seg_lo, kb, bstar, bins, cnt, &fail);
    if (tid == 0) { s.nbig = 0; s.nlo = 0; s.nhi = 0; }
    int M;
    int base = block_excl_scan<T>(own, scratch, &M);
    bool add_hist = true;
    if (cn + M > SEARCH_CAP) {
      // Too many: count them all into the histogram first (tightening b*), drop the stored
      // candidates past the new b*, and count again.
      const int E = (P + T - 1) / T;
#pragma unroll
      for (int e = 0; e < SEARCH_PER; ++e) {
        const int i = tid * E + e;
        if (e < E && i < P && cnt[e] > 0) {
          const double kp = d == 1 ? 0.0 : s.key[seg_lo + i];
          if (cnt[e] > 32) {  // a warp adds the big ones below
            const int q = atomicAdd(&s.nbig, 1);
            if (q < SEARCH_BINS) { s.cur[q] = static_cast<u32>(i); s.aux[i] = static_cast<unsigned short>(cnt[e]); }
            else fail = 1;
          } else {
            for (int r = 0; r < cnt[e]; ++r) {
              const double a = row[r], k = __dadd_rn(kp, a);
              if (!sum_exact(kp, a, k)) fail = 1;
              atomicAdd(&s.hist[min(bins(-k), SEARCH_BINS - 1)], 1u);
            }
          }
        }
      }
      __syncthreads();
      const int nbig = min(s.nbig, SEARCH_BINS);
      for (int q = tid >> 5; q < nbig; q += T / 32) {
        const int i = static_cast<int>(s.cur[q]);
        const int c = s.aux[i];
        const double kp = d == 1 ? 0.0 : s.key[seg_lo + i];
        for (int r = tid & 31; r < c; r += 32) {
          const double a = row[r], k = __dadd_rn(kp, a);
          if (!sum_exact(kp, a, k)) fail = 1;
          atomicAdd(&s.hist[min(bins(-k), SEARCH_BINS - 1)], 1u);
        }
      }
      if (fail) s.fail = 1;
      __syncthreads();
      if (tid < 32) {
        const int b = search_find_bin(s.hist, n);
        if (tid == 0) s.bstar = b;
      }
      __syncthreads();
      bstar = s.bstar;
      // compaction of the stored candidates (order kept; parents are never dropped before a child)
      const int E2 = (cn + T - 1) / T;
      double kk[SEARCH_PER];
      int pr[SEARCH_PER], rr[SEARCH_PER];
      int kept = 0, below_lo = 0, below_hi = 0;
#pragma unroll
      for (int e = 0; e < SEARCH_PER; ++e) {
        const int i = tid * E2 + e;
        pr[e] = -1;
        if (e < E2 && i < cn) {
          kk[e] = s.key[i];
          if (bins(-kk[e]) <= bstar) {
            pr[e] = s.par[i];
            rr[e] = s.rd[i];
            ++kept;
            below_lo += i < seg_lo;
            below_hi += i < s.seg_hi;
          }
        }
      }
      if (below_lo) atomicAdd(&s.nlo, below_lo);
      if (below_hi) atomicAdd(&s.nhi, below_hi);
      int total_kept;
      int nb = block_excl_scan<T>(kept, scratch, &total_kept);
#pragma unroll
      for (int e = 0; e < SEARCH_PER; ++e) {
        const int i = tid * E2 + e;
        if (e < E2 && i < cn) s.aux[i] = pr[e] >= 0 ? static_cast<unsigned short>(nb++) : NO_NODE;
      }
      __syncthreads();
#pragma unroll
      for (int e = 0; e < SEARCH_PER; ++e)
        if (pr[e] >= 0 && pr[e] != NO_NODE) pr[e] = s.aux[pr[e]];
      __syncthreads();
#pragma unroll
      for (int e = 0; e < SEARCH_PER; ++e) {
        const int i = tid * E2 + e;
        if (e < E2 && i < cn && pr[e] >= 0) {
          const int j = s.aux[i];
          s.key[j] = kk[e];
          s.par[j] = static_cast<unsigned short>(pr[e]);
          s.rd[j] = static_cast<unsigned short>(rr[e]);
        }
      }
      cn = total_kept;
      seg_lo = s.nlo;
      P = d == 1 ? 1 : s.nhi - seg_lo;
      __syncthreads();
      own = search_counts(s, row, d, P, seg_lo, kb, bstar, bins, cnt, &fail);
      base = block_excl_scan<T>(own, scratch, &M);
      if (cn + M > SEARCH_CAP) fail = 1;
      add_hist = false;
    }
    if (fail) s.fail = 1;
    {  // exclusive offsets of the parents' children
      const int E = (P + T - 1) / T;
      int off = base;
#pragma unroll
      for (int e = 0; e < SEARCH_PER; ++e) {
        const int i = tid * E + e;
        if (e < E && i < P) {
          s.aux[i] = static_cast<unsigned short>(min(off, 0xffff));
          off += cnt[e];
        }
      }
    }
    __syncthreads();
    if (s.fail) break;
    fail = 0;
    for (int j = tid; j < M; j += T) {
      int lo = 0, hi = P;  // the last parent whose offset is <= j
      while (hi - lo > 1) {
        const int mid = (lo + hi) >> 1;
        if (s.aux[mid] <= j) lo = mid;
        else hi = mid;
      }
      const int r = j - s.aux[lo];
      const int pc = d == 1 ? NO_NODE : seg_lo + lo;
      const double kp = d == 1 ? 0.0 : s.key[pc];
      const double a = row[r], k = __dadd_rn(kp, a);
      if (!sum_exact(kp, a, k)) fail = 1;
      const int dst = cn + j;
      s.key[dst] = k;
      s.par[dst] = static_cast<unsigned short>(pc);
      s.rd[dst] = static_cast<unsigned short>(r | (d << 9));
      if (add_hist) atomicAdd(&s.hist[bins(-k)], 1u);
    }
    if (fail) s.fail = 1;
    __syncthreads();
    if (tid < 32) {
      const int b = search_find_bin(s.hist, n);
      if (tid == 0) {
        s.bstar = b;
        s.seg_lo = cn;
        s.seg_hi = cn + M;
        s.cn = cn + M;
      }
    }
    __syncthreads();
    if (s.fail || M == 0) break;
  }
  if (s.fail) return -1;
  // ---- rank the candidates in bins <= b*: bucket by bin, then count the better ones in the bin
  const int cn = s.cn, bstar = s.bstar;
  const u32 h = tid <= bstar ? s.hist[tid] : 0u;
  int total;
  const int start = block_excl_scan<T>(static_cast<int>(h), scratch, &total);
  s.cur[tid] = static_cast<u32>(start);
  __syncthreads();
  for (int i = tid; i < cn; i += T) {
    const int b = bins(-s.key[i]);
    if (b <= bstar) s.aux[atomicAdd(&s.cur[b], 1u)] = static_cast<unsigned short>(i);
  }
  __syncthreads();
  int xs[SEARCH_PER], rk[SEARCH_PER];
#pragma unroll
  for (int e = 0; e < SEARCH_PER; ++e) {
    const int slot = tid + e * T;
    xs[e] = -1;
    rk[e] = n;
    if (slot < total) {
      const int x = s.aux[slot];
      const int b = bins(-s.key[x]);
      const int en = static_cast<int>(s.cur[b]);
      int rank = en - static_cast<int>(s.hist[b]);
      for (int q = en - static_cast<int>(s.hist[b]); q < en; ++q) {
        const int y = s.aux[q];
        if (y != x && cand_better(y, x, s)) ++rank;
      }
      xs[e] = x;
      rk[e] = rank;
    }
  }
  __syncthreads();
#pragma unroll
  for (int e = 0; e < SEARCH_PER; ++e)
    if (xs[e] >= 0 && rk[e] < n) s.aux[xs[e]] = static_cast<unsigned short>(rk[e] + 1);
  __syncthreads();
#pragma unroll
  for (int e = 0; e < SEARCH_PER; ++e) {
    if (xs[e] >= 0 && rk[e] < n) {
      const int i = rk[e] + 1, x = xs[e];
      const int pp = s.par[x];
      ns.par[i] = static_cast<short>(pp == NO_NODE ? 0 : s.aux[pp]);
      ns.rank[i] = static_cast<short>(s.rd[x] & 511);
      ns.dep[i] = static_cast<u8>(s.rd[x] >> 9);
    }
  }
  __syncthreads();
  return min(n, total);
}

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
};

DL_DEVICE int build_k_of_chunk(const DDTreeParams& p, int s) { return min(p.k, min(CHUNK, p.vocab - s * CHUNK)); }

// Merge one row's chunk candidates into its sorted top-K with log-probs.
DL_DEVICE void merge_row(const DDTreeParams& p, int b, int d, BuildSmem& sm, u64* sortbuf) {
  const int tid = threadIdx.x, K = p.k, S = p.num_chunks;
  const size_t row_id = static_cast<size_t>(b) * p.depth_limit + d;
  const u64* cand = p.cand + row_id * S * K;
  u64 c[MERGE_ELEMS];
#pragma unroll
  for (int j = 0; j < MERGE_ELEMS; ++j) {
    const int i = j * BUILD_THREADS + tid;
    const int s = i / K, r = i - s * K;
    c[j] = (s < S && r < build_k_of_chunk(p, s)) ? cand[i] : 0ull;
  }
  if (tid < 32) {  // log-sum-exp of the row from the chunk statistics
    float m = DL_NEG_INF;
    for (int s = tid; s < S; s += 32) m = fmaxf(m, p.chunk_max[row_id * S + s]);
    m = dl::warp_max(m);
    double t = 0.0;
    for (int s = tid; s < S; s += 32) {
      const float cm = p.chunk_max[row_id * S + s];
      if (cm > DL_NEG_INF) t += p.chunk_sum[row_id * S + s] * exp(static_cast<double>(cm) - static_cast<double>(m));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) t += __shfl_xor_sync(FULL, t, o);
    if (tid == 0) {
      // A row whose maximum is not finite (every logit NaN / -inf, or a +inf) has no
      // distribution: its log-probs are all the floor below, and the build status says so.
      const bool finite = isfinite(m);
      sm.lse = finite ? static_cast<float>(static_cast<double>(m) + log(t)) : __int_as_float(0x7fffffff);
      if (!finite) atomicOr(reinterpret_cast<unsigned long long*>(p.state + 3), static_cast<unsigned long long>(STATUS_NONFINITE));
    }
  }
  u64 mine = 0;
#pragma unroll
  for (int j = 0; j < MERGE_ELEMS; ++j) mine = c[j] > mine ? c[j] : mine;
  const u64 cmax = block_max_u64<BUILD_THREADS>(mine, sm.r64);
  // The K-th largest key first (32-bit: few levels), then -- only when more logits share that
  // key than still fit -- the need-th largest low word (~id: equal logits, lower id first) of
  // the composites with that key. One kth_largest instance serves both passes.
  u32 tk = 0, vmax = static_cast<u32>(cmax >> 32);
  int need = K;
  u64 cstar;  // picked: composite >= cstar
  const int ecount = min(MERGE_ELEMS, (S * K + BUILD_THREADS - 1) / BUILD_THREADS);  // slots that may hold one
  for (int pass = 0;; ++pass) {
    const u32 r = kth_largest<BUILD_THREADS, MERGE_ELEMS, u32>(
        [&](int j, int z) {
          const u32 hi = static_cast<u32>(c[j] >> 32);
          return (pass ? (hi == tk ? static_cast<u32>(c[j]) : 0u) : hi) + static_cast<u32>(z);
        },
        vmax, 1u, need, sm.sel, ecount);
    if (pass) {
      cstar = (static_cast<u64>(tk) << 32) | r;
      break;
    }
    tk = r;
    int above = 0, ties = 0;
#pragma unroll
    for (int j = 0; j < MERGE_ELEMS; ++j) {
      const u32 k = static_cast<u32>(c[j] >> 32);
      above += k > tk;
      ties += k == tk;
    }
    const int packed = block_sum_int<BUILD_THREADS>((above << 16) | ties, sm.ri);  // each < 2^15
    need = K - (packed >> 16);
    cstar = static_cast<u64>(tk) << 32;
    if ((packed & 0xffff) <= need) break;
    vmax = 0xffffffffu;  // an upper bound of the low words is enough for kth_largest
  }
  int own = 0;
#pragma unroll
  for (int j = 0; j < MERGE_ELEMS; ++j) own += c[j] >= cstar;
  int all;
  int pos = block_excl_scan<BUILD_THREADS>(own, sm.ri, &all);
#pragma unroll
  for (int j = 0; j < MERGE_ELEMS; ++j)
    if (c[j] >= cstar) sortbuf[pos++] = c[j];
  int P = 1;
  while (P < K) P <<= 1;
  __syncthreads();
  // Bitonic sort, descending, one element per thread (P <= MAX_K = BUILD_THREADS): strides
  // below 32 through warp shuffles, the others through shared memory.
  u64 v = tid < K ? sortbuf[tid] : 0ull;
  for (int kk = 2; kk <= P; kk <<= 1) {
    for (int j = kk >> 1; j > 0; j >>= 1) {
      u64 o;
      if (j >= 32) {
        __syncthreads();
        if (tid < P) sortbuf[tid] = v;
        __syncthreads();
        o = tid < P ? sortbuf[tid ^ j] : 0ull;
      } else {
        o = __shfl_xor_sync(FULL, v, j);
      }
      const bool keep_max = ((tid & j) == 0) == ((tid & kk) == 0);
      v = keep_max ? (o > v ? o : v) : (o < v ? o : v);
    }
  }
  const float lse = sm.lse;
  if (tid < K) {
    p.top_ids[row_id * K + tid] = composite_id(v);
    // -inf (NaN, overflow) log-probs become the most negative float: the search stays finite
    p.top_lp[row_id * K + tid] = fmaxf(__fsub_rn(key_f32(static_cast<u32>(v >> 32)), lse), -3.402823466e38f);
  }
}

DL_DEVICE void build_tree(const DDTreeParams& p, BuildSmem& sm, u8* dyn) {
  const int d = blockIdx.x, b = blockIdx.y, tid = threadIdx.x;
  const int D = p.depth_limit, K = p.k, N = p.budget + 1, W = p.n_words;
  u64* sortbuf = reinterpret_cast<u64*>(dyn);
  merge_row(p, b, d, sm, sortbuf);

  __threadfence();
  __syncthreads();
  if (tid == 0) sm.last = atomicAdd(&p.counters[b], 1u) == static_cast<u32>(D - 1);
  __syncthreads();
  if (!sm.last) return;
  if (tid == 0) p.counters[b] = 0u;  // ready for the next launch
  __threadfence();

  // ---- best-first search of request b (this CTA finished its last row)
  float* lp = reinterpret_cast<float*>(dyn);
  const size_t lp_end = (static_cast<size_t>(D) * K * 4 + 15) & ~static_cast<size_t>(15);
  u64* ovs = reinterpret_cast<u64*>(dyn + lp_end);
  u32* ovm = reinterpret_cast<u32*>(dyn + lp_end + static_cast<size_t>(N) * 8);
  NodeSmem ns;
  ns.par = reinterpret_cast<short*>(dyn + p.lp_bytes);
  ns.rank = ns.par + N;
  ns.dep = reinterpret_cast<u8*>(ns.rank + N);
  const float* glp = p.top_lp + static_cast<size_t>(b) * D * K;
  for (int i = tid; i < D * K; i += BUILD_THREADS) lp[i] = __ldcg(glp + i);
  if (tid == 0) { ns.par[0] = -1; ns.rank[0] = -1; ns.dep[0] = 0; }
  const int budget_b = p.budgets ? min(max(p.budgets[b], 0), p.budget) : p.budget;
  const int kb = min(budget_b, K);
  __syncthreads();
  int popped = 0;
  if (budget_b > 0 && kb > 0 && D > 0) {
    popped = (p.flags & FLAG_LEGACY_SEARCH) ? -1 : parallel_search(lp, K, kb, D, budget_b, sm.search, sm.ri, ns);
    if (popped < 0) {  // the exact heap of the reference, one warp
      if (tid < 32) {
        const int c = heap_select(lp, K, kb, D, budget_b, ovs, ovm, ns);
        if (tid == 0) sm.ri[0] = c;
      }
      __syncthreads();
      popped = sm.ri[0];
    }
  }
  const int count = popped + 1;

  // ---- nodes and ancestor masks
  const i32* gids = p.top_ids + static_cast<size_t>(b) * D * K;
  const size_t base = static_cast<size_t>(b) * N;
  for (int i = tid; i < N; i += BUILD_THREADS) {
    int tok = -1, dep = -1, par = -1;
    if (i == 0) {
      tok = p.root_tokens[b];
      dep = 0;
    } else if (i < count) {
      dep = ns.dep[i];
      par = ns.par[i];
      tok = __ldcg(gids + (dep - 1) * K + ns.rank[i]);
    }
    p.tokens[base + i] = tok;
    p.depths[base + i] = dep;
    p.parents[base + i] = par;
  }
  u32* words = reinterpret_cast<u32*>(dyn);  // the log-probs are no longer needed
  for (int i = tid; i < N * W; i += BUILD_THREADS) words[i] = 0u;
  __syncthreads();
  for (int i = tid; i < count; i += BUILD_THREADS) {
    for (int a = i; a >= 0; a = ns.par[a]) words[i * W + (a >> 5)] |= 1u << (a & 31);
  }
  __syncthreads();
  u32* ganc = p.anc + base * W;
  for (int i = tid; i < N * W; i += BUILD_THREADS) ganc[i] = words[i];
  if (tid == 0) p.node_counts[b] = count;
}

// ------------------------------------------------------------------------------ compile

struct CompileSmem {
  i64 qo[DL_MAX_BATCH + 1], kv[DL_MAX_BATCH + 1], full[DL_MAX_BATCH + 1], qlen[DL_MAX_BATCH + 1];
  i64 alloc_base;
  int status;
};

// Prefix sums of the per-request sizes over the batch (warp 0), identical in every CTA.
DL_DEVICE void compile_prefix(const DDTreeParams& p, CompileSmem& sm) {
  if (threadIdx.x >= 32) return;
  const int lane = threadIdx.x;
  const bool reporter = blockIdx.x == 0 && blockIdx.y == 0;  // one CTA reports (every CTA checks alike)
  i64 run_q = 0, run_kv = 0, run_f = 0, run_l = 0;
  bool ctx_full = false;
  for (int b0 = 0; b0 < p.max_batch; b0 += 32) {
    const int b = b0 + lane;
    i64 q = 0, pre = 0;
    if (b < p.max_batch) {
      // Per-step metadata, checked: a request that fails a check gets no rows (the verify
      // step skips it, accept and commit leave it unchanged) and the error word names it.
      q = p.node_counts[b];
      int field = 0, code = 0;
      if (q < 0 || q > p.budget + 1) {
        field = DL_FIELD_TREE_TOKENS; code = DL_ERR_OVER_MAX;
      } else if (q > 0) {
        const i64 c = p.committed_lens[b], row = p.req_pool_indices[b];
        if (c < 0 || c > p.max_context) { field = DL_FIELD_SEQ_LENS; code = c < 0 ? DL_ERR_OUT_OF_RANGE : DL_ERR_OVER_MAX; }
        else if (row < 0 || row >= p.r2t_rows) { field = DL_FIELD_REQ_POOL_INDICES; code = DL_ERR_OUT_OF_RANGE; }
        else pre = c;
      }
      if (code) {
        q = 0;
        if (reporter) dl::report_error(p.error, b, field, code);
      }
      ctx_full |= q > 0 && pre + q > p.max_context;
    }
    i64 v[4] = {q, pre, q * (pre + q), q * q};
    i64 inc[4] = {v[0], v[1], v[2], v[3]};
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
#pragma unroll
      for (int t = 0; t < 4; ++t) {
        const i64 y = __shfl_up_sync(FULL, inc[t], o);
        if (lane >= o) inc[t] += y;
      }
    }
    if (b < p.max_batch) {
      sm.qo[b] = run_q + inc[0] - v[0];
      sm.kv[b] = run_kv + inc[1] - v[1];
      sm.full[b] = run_f + inc[2] - v[2];
      sm.qlen[b] = run_l + inc[3] - v[3];
    }
    run_q += __shfl_sync(FULL, inc[0], 31);
    run_kv += __shfl_sync(FULL, inc[1], 31);
    run_f += __shfl_sync(FULL, inc[2], 31);
    run_l += __shfl_sync(FULL, inc[3], 31);
  }
  ctx_full = __any_sync(FULL, ctx_full);
  if (lane == 0) {
    const int B = p.max_batch;
    sm.qo[B] = run_q;
    sm.kv[B] = run_kv;
    sm.full[B] = run_f;
    sm.qlen[B] = run_l;
    i64 avail = *p.free_count;
    int status = ctx_full ? STATUS_CONTEXT_FULL : 0;
    if (avail < 0 || avail > p.free_capacity) {  // a bad pool count: hand out no slot
      if (reporter) dl::report_error(p.error, -1, DL_FIELD_OUT_CACHE_LOC, DL_ERR_OUT_OF_RANGE);
      avail = 0;
      status |= STATUS_POOL_EXHAUSTED;
    }
    if (run_q > avail) status |= STATUS_POOL_EXHAUSTED;
    if (run_kv > p.kv_capacity) status |= STATUS_KV_CAPACITY;
    if ((p.full_mask && run_f > p.full_capacity) || (p.qlen_mask && run_l > p.qlen_capacity)) status |= STATUS_MASK_CAPACITY;
    sm.status = status;
    sm.alloc_base = (status & STATUS_POOL_EXHAUSTED) ? avail : avail - run_q;
  }
}

DL_DEVICE i64 r2t_load(const DDTreeParams& p, i64 idx) {
  return p.r2t_is64 ? static_cast<const i64*>(p.req_to_token)[idx] : static_cast<i64>(static_cast<const i32*>(p.req_to_token)[idx]);
}

// Fill n bytes at dst with ones (16-byte stores in the aligned middle).
DL_DEVICE void fill_ones(u8* dst, i64 n, int tid, int nthreads) {
  const i64 head = min(n, static_cast<i64>((16 - (reinterpret_cast<size_t>(dst) & 15)) & 15));
  for (i64 i = tid; i < head; i += nthreads) dst[i] = 1;
  const i64 vecs = (n - head) >> 4;
  uint4* v = reinterpret_cast<uint4*>(dst + head);
  const uint4 ones = make_uint4(0x01010101u, 0x01010101u, 0x01010101u, 0x01010101u);
  for (i64 i = tid; i < vecs; i += nthreads) v[i] = ones;
  for (i64 i = head + (vecs << 4) + tid; i < n; i += nthreads) dst[i] = 1;
}

DL_DEVICE void compile_step(const DDTreeParams& p, CompileSmem& sm) {
  const int b = blockIdx.x, x = blockIdx.y, X = gridDim.y, tid = threadIdx.x;
  const int B = p.max_batch, N = p.budget + 1, W = p.n_words;
  compile_prefix(p, sm);
  __syncthreads();
  const int status = sm.status;
  if (b == 0 && x == 0) {
    for (int i = tid; i <= B; i += SMALL_THREADS) {
      p.qo_indptr[i] = sm.qo[i];
      p.kv_indptr[i] = static_cast<i32>(sm.kv[i]);
      if (p.full_indptr) p.full_indptr[i] = sm.full[i];
      if (p.qlen_indptr) p.qlen_indptr[i] = sm.qlen[i];
    }
    if (tid == 0) {
      p.state[0] = sm.alloc_base;
      p.state[1] = sm.qo[B];
      p.state[2] = status | (static_cast<int>(p.state[3]) & STATUS_NONFINITE);  // state[3]: the build's bits
    }
  }
  const i64 q = sm.qo[b + 1] - sm.qo[b];
  if (q == 0) return;
  const i64 qo = sm.qo[b], pre = sm.kv[b + 1] - sm.kv[b];
  const i64 committed = p.committed_lens[b];
  const size_t tb = static_cast<size_t>(b) * N;
  if (x == 0) {
    const bool pool_ok = !(status & STATUS_POOL_EXHAUSTED);
    for (int i = tid; i < q; i += SMALL_THREADS) {
      p.input_ids[qo + i] = p.tokens[tb + i];
      p.positions[qo + i] = committed + p.depths[tb + i];
      i64 slot = pool_ok ? p.free_slots[sm.alloc_base + qo + i] : -1;
      if (pool_ok && (slot < 0 || slot >= p.free_capacity)) {
        dl::report_error(p.error, b, DL_FIELD_OUT_CACHE_LOC, DL_ERR_OUT_OF_RANGE);
        slot = -1;
      }
      p.out_cache_loc[qo + i] = slot;
    }
    for (int i = tid; i < q * W; i += SMALL_THREADS) p.bitmask[qo * W + i] = p.anc[tb * W + i];
  }
  if (!(status & STATUS_KV_CAPACITY)) {
    const i64 rowb = p.req_pool_indices[b] * p.r2t_stride;
    const i64 kvo = sm.kv[b];
    for (i64 i = static_cast<i64>(x) * SMALL_THREADS + tid; i < pre; i += static_cast<i64>(X) * SMALL_THREADS) {
      i64 slot = r2t_load(p, rowb + i);
      if (slot < 0 || slot >= p.free_capacity) {
        dl::report_error(p.error, b, DL_FIELD_REQ_TO_TOKEN, DL_ERR_OUT_OF_RANGE);
        slot = -1;
      }
      p.kv_indices[kvo + i] = slot;
    }
  }
  if (status & STATUS_MASK_CAPACITY) return;
  const u32* anc = p.anc + tb * W;
  if (p.full_mask) {
    const i64 width = pre + q;
    for (i64 i = x; i < q; i += X) {
      u8* rowp = p.full_mask + sm.full[b] + i * width;
      fill_ones(rowp, pre, tid, SMALL_THREADS);
      for (i64 j = tid; j < q; j += SMALL_THREADS) rowp[pre + j] = (anc[i * W + (j >> 5)] >> (j & 31)) & 1u;
    }
  }
  if (p.qlen_mask) {
    for (i64 i = x; i < q; i += X) {
      u8* rowp = p.qlen_mask + sm.qlen[b] + i * q;
      for (i64 j = tid; j < q; j += SMALL_THREADS) rowp[j] = (anc[i * W + (j >> 5)] >> (j & 31)) & 1u;
    }
  }
}

// ------------------------------------------------------------------------------ accept

// Work item i = (row i / splits, split i % splits), rows in order; one warp per item (no block
// barriers), the warps of the grid stride over the items and stop at the first row at or past
// qo_indptr[max_batch]. A lane keeps ARGMAX_UNROLL 16-byte loads in flight and compares plain
// floats (its tokens come in increasing order, so `>` keeps the first of equal maxima; -0 and
// +0 compare equal, as their order keys do); the warp's (key, ~id) composite is folded into
// the row's maximum with a 64-bit atomicMax (accept reads the row and clears it to 0).
constexpr int ARGMAX_UNROLL = 4;

template <typename T>
DL_DEVICE void argmax_split(const DDTreeParams& p) {
  using Tr = LogitTraits<T>;
  constexpr int V = Tr::VEC;
  constexpr int STEP = 32 * V;                   // tokens of one warp-wide vector round
  const int lane = threadIdx.x & 31;
  const i64 nwarps = static_cast<i64>(gridDim.x) * (SMALL_THREADS / 32);
  // rows of this step, never past the plan's (accept reports a bad qo_indptr)
  const i64 rows = min(max(p.qo_indptr[p.max_batch], 0ll), static_cast<i64>(p.max_batch) * (p.budget + 1));
  const i64 items = rows * p.argmax_splits;
  for (i64 item = static_cast<i64>(blockIdx.x) * (SMALL_THREADS / 32) + (threadIdx.x >> 5); item < items; item += nwarps) {
    const i64 r = item / p.argmax_splits;
    const int s = static_cast<int>(item - r * p.argmax_splits);
    const int start = s * p.argmax_split_len;
    const int end = min(p.vocab, start + p.argmax_split_len);
    const T* row = static_cast<const T*>(p.target_logits) + r * p.target_row_stride;
    float bv = DL_NEG_INF;
    int bi = -1;
    if (p.target_vec) {  // start and end are multiples of V
      int i = start + lane * V;
      for (; i + (ARGMAX_UNROLL - 1) * STEP < end; i += ARGMAX_UNROLL * STEP) {
        float x[ARGMAX_UNROLL][V];
#pragma unroll
        for (int u = 0; u < ARGMAX_UNROLL; ++u) Tr::load_vec(row + i + u * STEP, x[u]);
#pragma unroll
        for (int u = 0; u < ARGMAX_UNROLL; ++u) {
#pragma unroll
          for (int e = 0; e < V; ++e) {
            if (x[u][e] > bv) { bv = x[u][e]; bi = i + u * STEP + e; }
          }
        }
      }
      for (; i < end; i += STEP) {
        float x[V];
        Tr::load_vec(row + i, x);
#pragma unroll
        for (int e = 0; e < V; ++e) {
          if (x[e] > bv) { bv = x[e]; bi = i + e; }
        }
      }
    } else {
      for (int i = start + lane; i < end; i += 32) {
        const float x = Tr::load(row + i);
        if (x > bv) { bv = x; bi = i; }
      }
    }
    u64 best = bi >= 0 ? composite(f32_key(bv), bi) : 0ull;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const u64 w = __shfl_xor_sync(FULL, best, o);
      best = w > best ? w : best;
    }
    if (lane == 0 && best) atomicMax(reinterpret_cast<unsigned long long*>(p.argmax_part + r), static_cast<unsigned long long>(best));
  }
}

constexpr int ACCEPT_STOPS = 64;  // stop tokens per request staged in shared memory

static_assert(DL_MAX_DEPTH + 1 <= 64, "AcceptSmem::path holds at most 64 nodes");

struct AcceptSmem {
  int post[ddt::MAX_K + 1];
  int tok[ddt::MAX_K + 1];          // node tokens (the walk reads no global memory)
  short match[ddt::MAX_K + 1];
  int path[64];                     // the walk: at most depth_limit + 1 <= MAX_DEPTH + 1 nodes
  int stop[ACCEPT_STOPS];
};

DL_DEVICE bool is_stop(const DDTreeParams& p, const AcceptSmem& sm, int b, int tok) {
  if (!p.stop_tokens || tok < 0) return false;
  if (p.n_stop <= ACCEPT_STOPS) {
    for (int i = 0; i < p.n_stop; ++i)
      if (sm.stop[i] == tok) return true;
    return false;
  }
  for (int i = 0; i < p.n_stop; ++i)
    if (p.stop_tokens[static_cast<size_t>(b) * p.n_stop + i] == tok) return true;
  return false;
}

DL_DEVICE void store_record(i32* rec, int i, int v, bool host) {
  if (host) reinterpret_cast<volatile i32*>(rec)[i] = v;
  else rec[i] = v;
}

DL_DEVICE void accept_step(const DDTreeParams& p, AcceptSmem& sm) {
  const int b = blockIdx.x, tid = threadIdx.x;
  const int N = p.budget + 1, D = p.depth_limit, RW = p.record_width;
  const i64 qo = p.qo_indptr[b];
  const i64 q64 = p.qo_indptr[b + 1] - qo;
  const i64 max_rows = static_cast<i64>(p.max_batch) * N;
  const bool q_ok = q64 >= 0 && q64 <= N && qo >= 0 && qo + q64 <= max_rows;
  if (!q_ok && tid == 0) dl::report_error(p.error, b, DL_FIELD_QO_INDPTR, q64 > N ? DL_ERR_OVER_MAX : DL_ERR_OUT_OF_RANGE);
  const int q = q_ok ? static_cast<int>(q64) : 0;
  const bool act = p.active[b] != 0 && q > 0;
  const size_t tb = static_cast<size_t>(b) * N;
  // sm.post: the target's token per node, -1 where the row had no finite argmax (the walk
  // stops there); posterior gets 0 for such rows (ids always in [0, vocab)).
  if (act) {
    if (p.target_tokens) {
      for (int i = tid; i < q; i += SMALL_THREADS) {
        int tok = p.target_tokens[qo + i];
        if (tok < 0 || tok >= p.vocab) {
          dl::report_error(p.error, b, DL_FIELD_LOGITS, DL_ERR_OUT_OF_RANGE);
          tok = -1;
        }
        sm.post[i] = tok;
        sm.match[i] = -1;
        p.posterior[qo + i] = tok < 0 ? 0 : tok;
      }
    } else {  // the argmax kernel's per-row maxima (0: nothing above -inf in the row)
      for (int i = tid; i < q; i += SMALL_THREADS) {
        const u64 c = p.argmax_part[qo + i];
        const int tok = c ? composite_id(c) : -1;
        sm.post[i] = tok;
        sm.match[i] = -1;
        p.posterior[qo + i] = tok < 0 ? 0 : tok;
      }
    }
  }
  if (!p.target_tokens && q > 0)  // clear this request's rows for the next argmax (inactive ones too)
    for (int i = tid; i < q; i += SMALL_THREADS) p.argmax_part[qo + i] = 0ull;
  __syncthreads();
  if (act) {
    for (int j = 1 + tid; j < q; j += SMALL_THREADS) {
      const int par = p.parents[tb + j], t = p.tokens[tb + j];
      sm.tok[j] = t;
      if (par < 0 || par >= j) {  // the build writes parents before their children
        dl::report_error(p.error, b, DL_FIELD_PARENTS, DL_ERR_OUT_OF_RANGE);
        continue;
      }
      if (t >= 0 && t == sm.post[par]) sm.match[par] = static_cast<short>(j);
    }
    if (p.stop_tokens && tid < p.n_stop && p.n_stop <= ACCEPT_STOPS)
      sm.stop[tid] = p.stop_tokens[static_cast<size_t>(b) * p.n_stop + tid];
  }
  __syncthreads();
  if (tid != 0) return;
  int a = 0, bonus = -1, finished = 0;
  if (act) {
    int cur = 0;
    sm.path[a++] = 0;
    while (sm.match[cur] >= 0) {
      if (a > D) {  // deeper than the depth limit: the parents are not the build's
        dl::report_error(p.error, b, DL_FIELD_PARENTS, DL_ERR_INCONSISTENT);
        break;
      }
      cur = sm.match[cur];
      sm.path[a++] = cur;
      if (is_stop(p, sm, b, sm.tok[cur])) { finished = FINISH_DONE; break; }
    }
    if (!finished) {
      bonus = sm.post[cur];
      if (bonus < 0) finished = FINISH_NONFINITE;  // no finite target row to take the next token from
    }
    const i64 room = p.max_context - p.committed_lens[b];
    if (a > room) {
      a = room > 0 ? static_cast<int>(room) : 0;
      finished = FINISH_DONE;
      bonus = -1;
      atomicOr(reinterpret_cast<unsigned long long*>(p.state + 2), static_cast<unsigned long long>(STATUS_CONTEXT_FULL));
    }
    if (finished == FINISH_NONFINITE)
      atomicOr(reinterpret_cast<unsigned long long*>(p.state + 2), static_cast<unsigned long long>(STATUS_NONFINITE));
    if (bonus >= 0 && is_stop(p, sm, b, bonus)) finished = FINISH_DONE;
  }
  i32* rec = p.records + static_cast<size_t>(b) * RW;
  i32* mir = p.mirror ? p.mirror + static_cast<size_t>(b) * RW : nullptr;
  int ne = 0;
  for (int i = 0; i <= D; ++i) {
    const int node = i < a ? sm.path[i] : -1;
    p.accepted_nodes[static_cast<size_t>(b) * (D + 1) + i] = node;
  }
  for (int i = 1; i < a; ++i) {
    const int tok = sm.tok[sm.path[i]];
    rec[RECORD_HEADER + ne] = tok;
    if (mir) store_record(mir, RECORD_HEADER + ne, tok, true);
    ++ne;
  }
  if (bonus >= 0) {
    rec[RECORD_HEADER + ne] = bonus;
    if (mir) store_record(mir, RECORD_HEADER + ne, bonus, true);
    ++ne;
  }
  for (int i = ne; i <= D; ++i) {
    rec[RECORD_HEADER + i] = -1;
    if (mir) store_record(mir, RECORD_HEADER + i, -1, true);
  }
  const int head[RECORD_HEADER] = {a, ne, bonus, finished};
  for (int i = 0; i < RECORD_HEADER; ++i) {
    rec[i] = head[i];
    if (mir) store_record(mir, i, head[i], true);
  }
  p.accepted_count[b] = a;
  p.bonus[b] = bonus;
  if (act) {
    if (finished) {
      p.active[b] = 0;
    } else {
      p.root_tokens[b] = bonus;
    }
  }
  if (mir) __threadfence_system();
}

// ------------------------------------------------------------------------------ commit

struct CommitSmem {
  u8 keep[ddt::MAX_K + 1];
  i64 rejected_before, rejected_total;
  int ri[32];
};

// Accepted nodes of request b, checked: 0 <= a <= min(q, D + 1) (else 0, the same in every CTA).
DL_DEVICE int checked_accepted(const DDTreeParams& p, int r, i64 q) {
  const int a = p.accepted_count[r];
  return (a < 0 || a > q || a > p.depth_limit + 1) ? 0 : a;
}

DL_DEVICE void commit_step(const DDTreeParams& p, CommitSmem& sm) {
  const int b = blockIdx.x, tid = threadIdx.x, B = p.max_batch, D = p.depth_limit;
  if (!p.paged) {
    if (tid == 0) p.committed_lens[b] += p.accepted_count[b];  // bounded by ddtree_commit_dense
    return;
  }
  if (p.state[2] & STATUS_POOL_EXHAUSTED) return;
  const i64 alloc_base = p.state[0];
  const i64 N = p.budget + 1;
  auto rows_of = [&](int r) {  // compile wrote qo_indptr; 0 rows where it is not sane
    const i64 n = p.qo_indptr[r + 1] - p.qo_indptr[r];
    return (n < 0 || n > N) ? 0ll : n;
  };
  if (tid < 32) {  // rejected slots of the requests before b, and in all
    i64 before = 0, all = 0;
    for (int r = tid; r < B; r += 32) {
      const i64 n = rows_of(r);
      const i64 rej = n - checked_accepted(p, r, n);
      all += rej;
      before += r < b ? rej : 0;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      all += __shfl_xor_sync(FULL, all, o);
      before += __shfl_xor_sync(FULL, before, o);
    }
    if (tid == 0) { sm.rejected_before = before; sm.rejected_total = all; }
  }
  const i64 qo = p.qo_indptr[b];
  const int q = static_cast<int>(rows_of(b));
  const int a_raw = p.accepted_count[b];
  const int a = checked_accepted(p, b, q);
  if (tid == 0 && a != a_raw) dl::report_error(p.error, b, DL_FIELD_PARENTS, DL_ERR_OVER_MAX);
  for (int i = tid; i < q; i += SMALL_THREADS) sm.keep[i] = 0;
  __syncthreads();
  const i32* acc = p.accepted_nodes + static_cast<size_t>(b) * (D + 1);
  const i64 c = p.committed_lens[b];
  const i64 row = p.req_pool_indices[b];
  const bool table_ok = a == 0 || (c >= 0 && c + a <= p.r2t_stride && row >= 0 && row < p.r2t_rows);
  if (tid == 0 && !table_ok) dl::report_error(p.error, b, c < 0 || c + a > p.r2t_stride ? DL_FIELD_SEQ_LENS : DL_FIELD_REQ_POOL_INDICES,
                                              DL_ERR_OUT_OF_RANGE);
  const i64 rowb = row * p.r2t_stride;
  for (int i = tid; i < a; i += SMALL_THREADS) {
    const int node = acc[i];
    if (node < 0 || node >= q) {
      dl::report_error(p.error, b, DL_FIELD_PARENTS, DL_ERR_OUT_OF_RANGE);
      continue;
    }
    sm.keep[node] = 1;
    if (!table_ok) continue;
    const i64 slot = p.out_cache_loc[qo + node];
    if (p.r2t_is64) static_cast<i64*>(p.req_to_token)[rowb + c + i] = slot;
    else static_cast<i32*>(p.req_to_token)[rowb + c + i] = static_cast<i32>(slot);
  }
  __syncthreads();
  i64 dst = alloc_base + sm.rejected_before;
  for (int i0 = 0; i0 < q; i0 += SMALL_THREADS) {  // rejected slots in node order
    const int i = i0 + tid;
    const int rej = i < q && !sm.keep[i];
    int total;
    const int rank = block_excl_scan<SMALL_THREADS>(rej, sm.ri, &total);
    if (rej) {
      if (dst + rank >= 0 && dst + rank < p.free_capacity) p.free_slots[dst + rank] = p.out_cache_loc[qo + i];
      else dl::report_error(p.error, b, DL_FIELD_OUT_CACHE_LOC, DL_ERR_OUT_OF_RANGE);
    }
    dst += total;
  }
  if (tid == 0) {
    if (table_ok) p.committed_lens[b] = c + a;
    if (b == 0) *p.free_count = alloc_base + sm.rejected_total;
  }
}

// Dense commit, bounded by the window: node i of the accepted path moves from c + node to
// c + i; a node whose row c + node lies at or past the window has no KV there (the tree did
// not fit: compile set STATUS_CONTEXT_FULL), so acceptance is cut before it -- accepted_count
// becomes the nodes kept, the request finishes (active = 0) and STATUS_CONTEXT_FULL is set.
// Nothing outside the request's window is read or written.
DL_DEVICE void commit_dense_rows(const DDTreeParams& p) {
  const int b = blockIdx.x, layer = blockIdx.y, tid = threadIdx.x, D = p.depth_limit;
  const i64 N = p.budget + 1;
  const i64 q = p.qo_indptr[b + 1] - p.qo_indptr[b];
  const int a_raw = p.accepted_count[b];
  const i64 c = p.committed_lens[b];
  const i32* acc = p.accepted_nodes + static_cast<size_t>(b) * (D + 1);
  int a = a_raw;
  if (a_raw < 0 || a_raw > D + 1 || (a_raw > 0 && (q <= 0 || q > N || a_raw > q || c < 0))) {
    a = 0;
    if (layer == 0 && tid == 0) dl::report_error(p.error, b, c < 0 ? DL_FIELD_SEQ_LENS : DL_FIELD_PARENTS, DL_ERR_OUT_OF_RANGE);
  }
  int keep = 0;  // the accepted prefix whose rows lie in the window (uniform in the CTA)
  for (; keep < a; ++keep) {
    const int node = acc[keep];
    if (node < keep || node >= q) {  // increasing node ids: the in-place moves rely on it
      if (layer == 0 && tid == 0) dl::report_error(p.error, b, DL_FIELD_PARENTS, DL_ERR_INCONSISTENT);
      break;
    }
    if (c + node >= p.dense_window) break;
  }
  if (keep != a_raw && layer == 0 && tid == 0) {
    p.accepted_count[b] = keep;  // the plain commit that follows advances committed_lens by it
    p.active[b] = 0;
    atomicOr(reinterpret_cast<unsigned long long*>(p.state + 2), static_cast<unsigned long long>(STATUS_CONTEXT_FULL));
  }
  if (keep <= 1) return;
  u8* base = p.dense_cache + layer * p.dense_layer_stride + b * p.dense_batch_stride;
  const int vecs = static_cast<int>(p.dense_row_bytes >> 4);
  for (int i = 1; i < keep; ++i) {  // ascending: a source (node >= i) is never overwritten first
    const int node = acc[i];
    if (node != i) {
      const uint4* src = reinterpret_cast<const uint4*>(base + (c + node) * p.dense_pos_stride);
      uint4* dst = reinterpret_cast<uint4*>(base + (c + i) * p.dense_pos_stride);
      for (int v = tid; v < vecs; v += SMALL_THREADS) dst[v] = src[v];
    }
    __syncthreads();
  }
}

}  // namespace ddt

// ------------------------------------------------------------------------------ entry points

extern "C" __global__ void __launch_bounds__(ddt::TOPK_THREADS, 4) ddtree_topk_chunks_f32(const __grid_constant__ DDTreeParams p) {
  ddt::topk_chunk<float>(p);
}
extern "C" __global__ void __launch_bounds__(ddt::TOPK_THREADS, 3) ddtree_topk_chunks_bf16(const __grid_constant__ DDTreeParams p) {
  ddt::topk_chunk<bf16>(p);
}
extern "C" __global__ void __launch_bounds__(ddt::BUILD_THREADS, 1) ddtree_build(const __grid_constant__ DDTreeParams p) {
  __shared__ ddt::BuildSmem sm;
  extern __shared__ __align__(16) u8 dyn[];
  const int b = blockIdx.y;
  const int root = p.root_tokens[b];
  const bool bad_root = root < 0 || root >= p.vocab;
  if (!p.active[b] || bad_root) {  // no tree: compile gives the request no rows
    if (blockIdx.x == 0 && threadIdx.x == 0) {
      p.node_counts[b] = 0;
      if (p.active[b]) dl::report_error(p.error, b, DL_FIELD_TREE_TOKENS, DL_ERR_OUT_OF_RANGE);
    }
    return;
  }
  ddt::build_tree(p, sm, dyn);
}
extern "C" __global__ void __launch_bounds__(ddt::SMALL_THREADS, 1) ddtree_compile(const __grid_constant__ DDTreeParams p) {
  __shared__ ddt::CompileSmem sm;
  ddt::compile_step(p, sm);
}
extern "C" __global__ void __launch_bounds__(ddt::SMALL_THREADS, 1) ddtree_argmax_f32(const __grid_constant__ DDTreeParams p) {
  ddt::argmax_split<float>(p);
}
extern "C" __global__ void __launch_bounds__(ddt::SMALL_THREADS, 1) ddtree_argmax_bf16(const __grid_constant__ DDTreeParams p) {
  ddt::argmax_split<bf16>(p);
}
extern "C" __global__ void __launch_bounds__(ddt::SMALL_THREADS, 1) ddtree_accept(const __grid_constant__ DDTreeParams p) {
  __shared__ ddt::AcceptSmem sm;
  ddt::accept_step(p, sm);
}
extern "C" __global__ void __launch_bounds__(ddt::SMALL_THREADS, 1) ddtree_commit(const __grid_constant__ DDTreeParams p) {
  __shared__ ddt::CommitSmem sm;
  ddt::commit_step(p, sm);
}
extern "C" __global__ void __launch_bounds__(ddt::SMALL_THREADS, 1) ddtree_commit_dense(const __grid_constant__ DDTreeParams p) {
  ddt::commit_dense_rows(p);
}
