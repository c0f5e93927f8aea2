// ddtree/params.cuh: the constants of the DDTree kernels and their params structs, one per stage
// (TopKParams, BuildParams, CompileParams, AcceptParams, CommitParams) over the shared
// DDTreeShared, mirrored by driverlevel.ddtree's ctypes classes (layouts checked at compile time).
//
// Part of the one translation unit cu/ddtree.cu (see its header for the kernels).
#pragma once
#include "common.cuh"
#include "constants.cuh"
#include "request_state.cuh"

namespace ddt {

constexpr u32 FULL = 0xffffffffu;                       // every lane of a warp
// Shared with Python: driverlevel/_constants.py, passed as -DDL_<NAME> (constants.cuh).
constexpr int TOPK_THREADS = DL_DDTREE_TOPK_THREADS;
constexpr int TOPK_ELEMS = DL_DDTREE_TOPK_ELEMS;        // logits per thread in a chunk
constexpr int CHUNK = TOPK_THREADS * TOPK_ELEMS;        // 7,680 tokens per chunk CTA
constexpr int BUILD_THREADS = DL_DDTREE_BUILD_THREADS;
constexpr int MERGE_ELEMS = DL_DDTREE_MERGE_ELEMS;      // candidates per thread in a row merge
constexpr int MAX_K = DL_MAX_BUDGET;
constexpr int OVERSAMPLE = 4;                           // chunk cutoff aims at ~4K candidates (kernel-only)
constexpr int SMALL_THREADS = DL_DDTREE_SMALL_THREADS;  // compile, accept, commit
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
// Threshold top-K (topk_threshold.cuh; driverlevel._topk_threshold).
constexpr int TK_SAMPLE_VALUES = DL_DDTREE_TK_SAMPLE_VALUES;
constexpr int TK_STREAM_THREADS = DL_DDTREE_TK_STREAM_THREADS;
constexpr int TK_STREAM_VECS = DL_DDTREE_TK_STREAM_VECS;
constexpr int TK_STREAM_CTAS_PER_SM = DL_DDTREE_TK_STREAM_CTAS_PER_SM;  // its __launch_bounds__
constexpr int TK_WARP_STAGE = DL_DDTREE_TK_WARP_STAGE;
constexpr int TOPK_MODE_THRESHOLD = 1;                  // TopKParams::topk_mode (0: the chunk top-K alone)

// ddtree_build's column of this CTA (grid (depth_limit + 1, max_batch)): 0 .. depth_limit - 1 a
// request's rows, depth_limit the code warmer (request 0) or the heap's warmer (request 1; the
// other requests' CTA of that column exits). In request 0's grid row the warmer is blockIdx.x 0, so
// that it is dispatched first: the CTAs enter as SMs free up, and at batch 1 the sample's SMs free
// ~15 of them at ~6 µs (H100, depth 15), the stream's the rest at ~10-12 µs, so the warmer as the
// sixteenth CTA entered at ~11 µs and led the request's search by ~1-2 µs (sixty-third session). Its
// rows' CTAs only wait for the stream there (their PDL wait), so one of them entering last costs
// little. Stamps (stamps.cuh) use the column too, so that their rows stay (request, column).
DL_DEVICE int build_column() {
  const int x = static_cast<int>(blockIdx.x);
  if (blockIdx.y != 0) return x;
  return x == 0 ? static_cast<int>(gridDim.x) - 1 : x - 1;
}

}  // namespace ddt

// The params structs of the stages, mirrored by driverlevel.ddtree (_Shared, _TopKParams,
// _BuildParams, _CompileParams, _AcceptParams, _CommitParams; ctypes subclasses in the same
// order). Each stage derives from DDTreeShared (BuildParams from TopKParams), so that the stage
// code reads p.vocab, p.state, ... whatever its struct. Every struct's size is a multiple of 8 (the
// explicit *_pad fields), so a derived struct's own fields start right after its base, as in ctypes.
// The same names as RequestState (request_state.cuh) for the request state and the slot pool.
// Shapes use the plan's maxima: B = max_batch, D = depth_limit, K = min(budget, vocab),
// N = budget + 1 nodes, W = n_words, S = num_chunks, Q = B * N draft rows.

// Shared by every stage: the plan's shape, the step's state words, the error word, flags.
struct DDTreeShared {
  i64* state;                    // [4] alloc_base, alloc_total, status bits, the build's status bits
  dl::DeviceErrorWord* error;    // bad per-step metadata (common.cuh), or null
  i32 max_batch;
  i32 depth_limit;
  i32 vocab;
  i32 budget;
  i32 k;
  i32 n_words;
  i32 flags;                     // ddt::FLAG_* (0 = the fast paths; FLAG_LEGACY_SEARCH is for tests)
  i32 shared_pad;
};

// Stage 1a, ddtree_topk_{chunks,sample,stream}_*: the drafter logits to the per-chunk (or threshold)
// top-K candidates and statistics.
struct TopKParams : DDTreeShared {
  const void* logits;            // [B, D, vocab] fp32 or bf16, strides below (elements)
  const u8* active;              // [B] 1 = request live
  u64* cand;                     // [B, D, S, K] chunk top-K composites (workspace)
  float* chunk_max;              // [B, D, S]
  double* chunk_sum;             // [B, D, S] sum of exp(x - chunk_max)
  u32* counters;                 // [B] rows finished per request (the build's); zero between launches
  float* tk_thresh;              // [R] T: <= the sample's m-th largest logit (R = B * D rows; threshold top-K only)
  u32* tk_count;                 // [R] logits >= T (the sample kernel zeroes it every launch)
  u32* tk_flag;                  // [R] 1: T not finite (the stream skips the row; the chunk top-K takes it)
  u64* tk_cand;                  // [R, tk_cap] composites of the logits >= T (unordered)
  double* tk_sum;                // [R, tk_nseg, 2] sums of exp(x - T) over the segment's logits < T, >= T (NaN: see the stream)
  i64 logits_batch_stride;
  i64 logits_row_stride;
  i32 num_chunks;
  i32 logits_vec;                // 1: 16-byte loads of the drafter logits
  i32 topk_mode;                 // 0: chunk top-K; 1: threshold top-K with the chunk top-K as fallback
  i32 tk_m;                      // sampled logits >= T: at least tk_m (1 .. TK_SAMPLE_VALUES)
  i32 tk_cap;                    // candidate capacity per row (<= BUILD_THREADS * MERGE_ELEMS)
  i32 tk_nseg;                   // stream CTAs per row
  i32 tk_seg_len;                // tokens per stream CTA (a multiple of its tile)
  i32 tk_slack;                  // sampled values T may admit past the tk_m-th (kth_largest_bound)
};

// Stage 1b, ddtree_build: the top-K stage's buffers (it merges them: hence derived from TopKParams),
// the request's root and budget, and the tree it writes.
struct BuildParams : TopKParams {
  const i32* root_tokens;        // [B] node 0's token
  const i32* budgets;            // [B] nodes besides the root, clamped to [0, budget]; null = budget
  i32* top_ids;                  // [B, D, K] by rank
  float* top_lp;                 // [B, D, K] log-probs, non-increasing
  i32* tokens;                   // [B, N] -1 past the count
  i32* depths;                   // [B, N]
  i32* parents;                  // [B, N] root -1
  i32* node_counts;              // [B] root included; 0 for inactive requests
  u32* anc;                      // [B, N, W] ancestor-and-self bitmask words
  i32* warm_scratch;             // [D * K + 3 * N + N * W + 1] the code warmer's own log-probs and nodes (build.cuh)
  i32 lp_bytes;                  // union region of ddtree_build's dynamic smem (multiple of 16)
  i32 logits_bf16;               // 1: the logits are bf16 (the build's chunk fallback reads them), 0: fp32
};

// Stage 2, ddtree_compile: the tree, the request state and slot pool (read only), the verify inputs.
struct CompileParams : DDTreeShared {
  const i64* seq_lens;           // [B] tokens whose KV is cached (the root's position)
  const i64* req_pool_indices;   // [B] row of req_to_token
  const void* req_to_token;      // [r2t_rows, r2t_stride] int32 or int64 slot ids by position
  const i64* free_slots;         // [free_capacity] free-slot stack
  const i64* free_count;         // [1]
  const i32* tokens;             // [B, N] the build's
  const i32* depths;             // [B, N]
  const i32* node_counts;        // [B]
  const u32* anc;                // [B, N, W]
  i32* input_ids;                // [Q]
  i64* positions;                // [Q]
  i64* out_cache_loc;            // [Q]
  i64* qo_indptr;                // [B + 1]
  i32* kv_indptr;                // [B + 1]
  i64* kv_indices;               // [kv_capacity]
  u32* bitmask;                  // [Q, W] packed mask by global draft row
  u8* full_mask;                 // [full_capacity] SGLang FULL, or null
  i64* full_indptr;              // [B + 1] or null
  u8* qlen_mask;                 // [qlen_capacity] SGLang QLEN_ONLY, or null
  i64* qlen_indptr;              // [B + 1] or null
  i64 kv_capacity;
  i64 full_capacity;
  i64 qlen_capacity;
  i64 max_context;
  i64 r2t_stride;
  i64 r2t_rows;                  // rows of req_to_token
  i64 free_capacity;             // entries of free_slots; slot ids must lie in [0, free_capacity)
  i32 r2t_is64;
  i32 compile_pad;
};

// Stage 3, ddtree_accept: the target's argmax, the walk, the records and the next roots.
struct AcceptParams : DDTreeShared {
  u8* active;                    // [B] accept clears finished requests
  i32* root_tokens;              // [B] accept writes the next roots
  const i64* seq_lens;           // [B]
  const i32* stop_tokens;        // [B, n_stop] -1 padded, or null
  const i64* qo_indptr;          // [B + 1] compile's
  const i32* tokens;             // [B, N] the build's
  const i32* parents;            // [B, N]
  u64* argmax_part;              // [Q] argmax.cu's composite per row (target logits); accept reads and clears it
  const i32* target_tokens;      // [Q] argmax given by the caller, or null
  i32* posterior;                // [Q] argmax per node
  i32* accepted_nodes;           // [B, D + 1]
  i32* accepted_count;           // [B]
  i32* bonus;                    // [B] -1 = none
  i32* records;                  // [B, record_width] device copy of the accept records
  i32* mirror;                   // same layout in mapped host memory, or null
  i64 max_context;
  i32 n_stop;
  i32 record_width;              // RECORD_HEADER + D + 1
};

// Stage 4, ddtree_commit and ddtree_commit_dense: the accepted path into req_to_token and the pool.
struct CommitParams : DDTreeShared {
  u8* active;                    // [B] the dense commit ends requests it cuts
  i64* seq_lens;                 // [B] advanced by the accepted nodes
  const i64* req_pool_indices;   // [B]
  void* req_to_token;            // [r2t_rows, r2t_stride] int32 or int64
  i64* free_slots;               // [free_capacity] rejected slots go back here
  i64* free_count;               // [1]
  const i64* qo_indptr;          // [B + 1] compile's
  const i64* out_cache_loc;      // [Q] compile's
  const i32* accepted_nodes;     // [B, D + 1] accept's
  i32* accepted_count;           // [B] accept's (the dense commit cuts it)
  u8* dense_cache;               // base of the dense cache
  i64 r2t_stride;
  i64 r2t_rows;
  i64 free_capacity;
  i64 dense_layer_stride;        // bytes
  i64 dense_batch_stride;        // bytes
  i64 dense_pos_stride;          // bytes
  i64 dense_row_bytes;           // multiple of 16
  i64 dense_window;              // positions per request window of the dense cache
  i32 r2t_is64;
  i32 paged;                     // 1: paged commit; 0: only advance seq_lens (after ddtree_commit_dense)
  i32 dense_layers;
  i32 commit_pad;
};

#ifdef DL_FIELDS_SH
// Every field of every ctypes mirror at the mirror's offset, and the sizes equal: the field lists
// come from Python (-DDL_FIELDS_<prefix>="DL_F(state) DL_F(error) ...", bases' fields first).
// offsetof of a derived struct's field: not a standard-layout class, which NVRTC warns about;
// the layout is the Itanium ABI's (bases first, no tail padding to reuse) and checked here.
#pragma nv_diag_suppress 1427
#define DL_F(f) DL_CHECK_OFFSET(DDTreeShared, f, SH);
DL_FIELDS_SH
#undef DL_F
#define DL_F(f) DL_CHECK_OFFSET(TopKParams, f, TK);
DL_FIELDS_TK
#undef DL_F
#define DL_F(f) DL_CHECK_OFFSET(BuildParams, f, BD);
DL_FIELDS_BD
#undef DL_F
#define DL_F(f) DL_CHECK_OFFSET(CompileParams, f, CP);
DL_FIELDS_CP
#undef DL_F
#define DL_F(f) DL_CHECK_OFFSET(AcceptParams, f, AC);
DL_FIELDS_AC
#undef DL_F
#define DL_F(f) DL_CHECK_OFFSET(CommitParams, f, CM);
DL_FIELDS_CM
#undef DL_F
static_assert(sizeof(DDTreeShared) == DL_SIZEOF_SH, "DDTreeShared size differs from its ctypes mirror");
static_assert(sizeof(TopKParams) == DL_SIZEOF_TK, "TopKParams size differs from its ctypes mirror");
static_assert(sizeof(BuildParams) == DL_SIZEOF_BD, "BuildParams size differs from its ctypes mirror");
static_assert(sizeof(CompileParams) == DL_SIZEOF_CP, "CompileParams size differs from its ctypes mirror");
static_assert(sizeof(AcceptParams) == DL_SIZEOF_AC, "AcceptParams size differs from its ctypes mirror");
static_assert(sizeof(CommitParams) == DL_SIZEOF_CM, "CommitParams size differs from its ctypes mirror");
#pragma nv_diag_default 1427
#endif
