// ddtree/params.cuh: the constants of the DDTree kernels and DDTreeParams, the one params
// struct of the nine kernels (mirrored by driverlevel.ddtree._Params; its layout is checked at
// compile time). Still one struct: a struct per stage would change every kernel's argument
// layout, which a refactor that keeps the cubins identical cannot do.
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
constexpr int TK_WARP_STAGE = DL_DDTREE_TK_WARP_STAGE;
constexpr int TOPK_MODE_THRESHOLD = 1;                  // DDTreeParams::topk_mode (0: the chunk top-K alone)

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
  // ---- request state and slot pool (request_state.cuh; driverlevel.request_state.RequestState;
  //      active, root_tokens and budgets sit with the build above)
  i64* seq_lens;               // [B] tokens whose KV is cached (the root's position)
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
  u64* argmax_part;            // [Q] argmax.cu's composite per row (target logits); accept reads and clears it
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
  i32 n_stop;
  i32 r2t_is64;
  i32 paged;
  i32 dense_layers;
  i32 record_width;            // RECORD_HEADER + D + 1
  i32 lp_bytes;                // union region of ddtree_build's dynamic smem (multiple of 16)
  i32 flags;                   // ddt::FLAG_* (0 = the fast paths; FLAG_LEGACY_SEARCH is for tests)
  // ---- threshold top-K (topk_mode = 1; R = B * D rows; unused, null, with topk_mode = 0)
  float* tk_thresh;            // [R] T: the sample's m-th largest logit
  u32* tk_count;               // [R] logits >= T (the sample kernel zeroes it every launch)
  u32* tk_flag;                // [R] 1: T not finite (the stream skips the row; the chunk top-K takes it)
  u64* tk_cand;                // [R, tk_cap] composites of the logits >= T (unordered)
  float* tk_max;               // [R, tk_nseg] segment max (>= T)
  double* tk_sum;              // [R, tk_nseg] sum of exp(x - tk_max) over the segment
  i32 topk_mode;               // 0: chunk top-K; 1: threshold top-K with the chunk top-K as fallback
  i32 tk_m;                    // rank of T in the sample (1 .. TK_SAMPLE_VALUES)
  i32 tk_cap;                  // candidate capacity per row (<= BUILD_THREADS * MERGE_ELEMS)
  i32 tk_nseg;                 // stream CTAs per row
  i32 tk_seg_len;              // tokens per stream CTA (a multiple of its tile)
  i32 tk_pad;
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
DL_CHECK_OFFSET(DDTreeParams, seq_lens);
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
DL_CHECK_OFFSET(DDTreeParams, n_stop);
DL_CHECK_OFFSET(DDTreeParams, r2t_is64);
DL_CHECK_OFFSET(DDTreeParams, paged);
DL_CHECK_OFFSET(DDTreeParams, dense_layers);
DL_CHECK_OFFSET(DDTreeParams, record_width);
DL_CHECK_OFFSET(DDTreeParams, lp_bytes);
DL_CHECK_OFFSET(DDTreeParams, flags);
DL_CHECK_OFFSET(DDTreeParams, tk_thresh);
DL_CHECK_OFFSET(DDTreeParams, tk_count);
DL_CHECK_OFFSET(DDTreeParams, tk_flag);
DL_CHECK_OFFSET(DDTreeParams, tk_cand);
DL_CHECK_OFFSET(DDTreeParams, tk_max);
DL_CHECK_OFFSET(DDTreeParams, tk_sum);
DL_CHECK_OFFSET(DDTreeParams, topk_mode);
DL_CHECK_OFFSET(DDTreeParams, tk_m);
DL_CHECK_OFFSET(DDTreeParams, tk_cap);
DL_CHECK_OFFSET(DDTreeParams, tk_nseg);
DL_CHECK_OFFSET(DDTreeParams, tk_seg_len);
DL_CHECK_OFFSET(DDTreeParams, tk_pad);
static_assert(sizeof(DDTreeParams) == DL_SIZEOF_PARAMS, "DDTreeParams size differs from its ctypes mirror");
#endif
