// runner.cu: the decode-step runner's own kernels (autoregressive baseline, host mirror).
//
// Pairs with driverlevel/runner.py (ctypes mirrors, compile_defines()). Everything per step
// is read from device memory, so a captured graph serves every step.
//
// Request state and slot pool (shared with the DDTree kernels, one contract: request_state.cuh,
// driverlevel/request_state.py): active, root_tokens, seq_lens, req_pool_indices, req_to_token,
// stop_tokens, remaining, and the stack free_slots[0 .. *free_count) of free cache slot ids
// (int64), the top at *free_count - 1.
//
// ar_prepare      Grid (bs); Block 256. One token per active request: request b (rank r among
//   the active requests) gets q row r with its root token at position seq_lens[b] and the
//   slot free_slots[*free_count - n_active + r]; its prefix req_to_token[req_pool_indices[b],
//   0:seq_lens[b]] is copied to kv_indices (requests in order, inactive ones empty). Writes qo_indptr,
//   kv_indptr, kv_indices, input_ids, positions, out_cache_loc. The pool count is not changed
//   here (ar_commit does). A pool with too few slots sends every row to scratch_slot and
//   sets STATUS_POOL_EXHAUSTED. Rows n_active .. bs - 1 get token 0, position 0 and scratch_slot.
//
// ar_commit       Grid 1; Block >= bs (<= 1024). After the forward and the argmax: append each
//   active request's slot to req_to_token, advance seq_lens, make the argmax the next root,
//   count it against remaining[b], end the request on a stop token, on remaining == 0 or on
//   a full context; pop the used slots from the pool; publish the step's records. The argmax is
//   argmax.cu's composite per q row (argmax_part, logit_keys.cuh), which ar_commit reads and
//   clears for the next step. A row whose argmax found nothing above -inf (composite 0: every
//   logit NaN / -inf) emits nothing: the root's KV is kept, the request finishes with
//   FINISH_NONFINITE and STATUS_NONFINITE.
//
// limit_records   Grid 1; Block >= bs (<= 1024). After DDTree accept, BEFORE its commit: apply
//   the max-new-tokens limit (remaining[b] -= emitted; past the limit the emitted tokens are
//   dropped, accepted_count[b] is cut to the kept tokens so that commit keeps no KV of dropped
//   ones, and the request becomes inactive).
//
// publish_records Grid 1; Block >= bs (<= 1024). After the DDTree commit: fold the tree's
//   status bits into the runner's and publish.
//
// Every kernel checks the per-step metadata it reads (seq_lens against max_context,
// req_pool_indices against the table's rows, the pool count and slot ids against the pool), never reads or writes out of bounds, and
// reports through the device error word (common.cuh).
//
// Publishing: the mirror is a ring of `ring_slots` entries in mapped pinned host memory, one
// per step (entry = *step_counter % ring_slots): an int32 header [step (low 32 bits), status,
// free slots, active requests] and one record per request [accepted_count, num_emitted,
// bonus, finished, emitted tokens (record_width - RECORD_HEADER, -1 padded)]. The host reads an entry
// after the step's event; nothing is copied and nothing synchronizes inside the step.
//
// ar_commit, limit_records and publish_records start with dl::pdl_enter (common.cuh) and are
// launched programmatically on sm_90+; ar_prepare, a step's first kernel, is an ordinary launch.

// From the launcher (driverlevel/runner.py compile_defines): the StepParams layout and the device error
// word's numbers, so that a partial set stops here, not in a cascade (constants.cuh checks the shared
// constants one by one).
#if !defined(DL_SIZEOF_S) || !defined(DL_FIELD_REQ_POOL_INDICES)
#error "compile with driverlevel.runner.compile_variants()"
#endif

#include "common.cuh"
#include "constants.cuh"
#include "request_state.cuh"
#include "logit_keys.cuh"

// Shared with Python: driverlevel/_constants.py, passed as -DDL_<NAME> (constants.cuh).
constexpr int kHeader = DL_RING_HEADER;     // int32 words before the records in a ring entry
constexpr int kRecHead = DL_RECORD_HEADER;  // int32 words before the emitted tokens in a record

struct StepParams {
  // request state and slot pool (request_state.cuh)
  i32* root_tokens;         // [bs] token processed next (the root)
  u8* active;               // [bs]
  i64* seq_lens;            // [bs] tokens whose KV is cached
  i32* remaining;           // [bs] tokens still allowed (max new tokens)
  i32* req_to_token;        // [r2t_rows, max_context] slot ids by position
  const i64* req_pool_indices;  // [bs] row of req_to_token
  const i32* stop_tokens;   // [bs, n_stop], -1 padded
  i64* free_slots;          // [free_capacity] free-slot stack
  i64* free_count;          // [1]
  // verify inputs (ar_prepare writes them)
  i64* qo_indptr;           // [bs + 1]
  i32* kv_indptr;           // [bs + 1]
  i64* kv_indices;          // [kv_capacity]
  i32* input_ids;           // [bs]
  i64* positions;           // [bs]
  i64* out_cache_loc;       // [bs]
  u64* argmax_part;         // [bs] argmax.cu's composite of each q row (ar_commit reads and clears it)
  // DDTree records (limit_records edits, publish_records reads): [bs, record_width]
  i32* records;
  // mirror
  i32* ring;                // mapped pinned host memory [ring_slots, kHeader + bs * record_width]
  u64* step_counter;        // [1] steps published so far
  i32* status;              // [1] sticky status bits (device)
  dl::DeviceErrorWord* error;  // bad per-step metadata, or null
  i32* accepted_count;      // [bs] DDTree accepted nodes (limit_records cuts it), or null
  const i64* tree_state;    // [4] DDTree step state (status bits at [2]), or null
  i64 scratch_slot;         // slot for rows that found the pool empty
  i64 free_capacity;        // entries of free_slots; slot ids lie in [0, free_capacity)
  i64 r2t_rows;             // rows of req_to_token
  i32 bs, max_context, n_stop, record_width, ring_slots, kv_capacity;
};

#ifdef DL_OFF_S_root_tokens
DL_CHECK_OFFSET(StepParams, root_tokens, S);
DL_CHECK_OFFSET(StepParams, active, S);
DL_CHECK_OFFSET(StepParams, seq_lens, S);
DL_CHECK_OFFSET(StepParams, remaining, S);
DL_CHECK_OFFSET(StepParams, req_to_token, S);
DL_CHECK_OFFSET(StepParams, req_pool_indices, S);
DL_CHECK_OFFSET(StepParams, stop_tokens, S);
DL_CHECK_OFFSET(StepParams, free_slots, S);
DL_CHECK_OFFSET(StepParams, free_count, S);
DL_CHECK_OFFSET(StepParams, qo_indptr, S);
DL_CHECK_OFFSET(StepParams, kv_indptr, S);
DL_CHECK_OFFSET(StepParams, kv_indices, S);
DL_CHECK_OFFSET(StepParams, input_ids, S);
DL_CHECK_OFFSET(StepParams, positions, S);
DL_CHECK_OFFSET(StepParams, out_cache_loc, S);
DL_CHECK_OFFSET(StepParams, argmax_part, S);
DL_CHECK_OFFSET(StepParams, records, S);
DL_CHECK_OFFSET(StepParams, ring, S);
DL_CHECK_OFFSET(StepParams, step_counter, S);
DL_CHECK_OFFSET(StepParams, status, S);
DL_CHECK_OFFSET(StepParams, error, S);
DL_CHECK_OFFSET(StepParams, accepted_count, S);
DL_CHECK_OFFSET(StepParams, tree_state, S);
DL_CHECK_OFFSET(StepParams, scratch_slot, S);
DL_CHECK_OFFSET(StepParams, free_capacity, S);
DL_CHECK_OFFSET(StepParams, r2t_rows, S);
DL_CHECK_OFFSET(StepParams, bs, S);
DL_CHECK_OFFSET(StepParams, max_context, S);
DL_CHECK_OFFSET(StepParams, n_stop, S);
DL_CHECK_OFFSET(StepParams, record_width, S);
DL_CHECK_OFFSET(StepParams, ring_slots, S);
DL_CHECK_OFFSET(StepParams, kv_capacity, S);
static_assert(sizeof(StepParams) == DL_SIZEOF_S, "StepParams size differs from its ctypes mirror");
#endif

constexpr int kStatusPoolExhausted = DL_STATUS_POOL_EXHAUSTED;
constexpr int kStatusKvCapacity = DL_STATUS_KV_CAPACITY;
constexpr int kStatusNonfinite = DL_STATUS_NONFINITE;
constexpr int kFinishNonfinite = DL_FINISH_NONFINITE;

// A cached length as the kernels use it: 0 when outside [0, max_context] or when the request's
// req_to_token row is bad (both reported once by ar_prepare), identically in every CTA and thread.
DL_DEVICE i64 checked_len(const StepParams& p, int b) {
  const i64 c = p.seq_lens[b];
  if (dl::req_row(p.req_pool_indices, b, p.r2t_rows) < 0) return 0;
  return dl::valid_seq_len(c, p.max_context) ? c : 0;
}

DL_DEVICE bool is_stop(const StepParams& p, int b, int tok) {
  for (int i = 0; i < p.n_stop; ++i)
    if (p.stop_tokens[b * p.n_stop + i] == tok) return true;
  return false;
}

extern "C" __global__ void __launch_bounds__(256)
ar_prepare(const __grid_constant__ StepParams p) {
  const int b = blockIdx.x;
  if (b >= p.bs) return;
  __shared__ int s_rank, s_nact;
  __shared__ i64 s_kvoff;
  if (threadIdx.x == 0) {
    int rank = 0, nact = 0;
    i64 kvoff = 0;
    for (int j = 0; j < p.bs; ++j) {
      const int a = p.active[j] ? 1 : 0;
      if (j < b) {
        rank += a;
        if (a) kvoff += checked_len(p, j);
      }
      nact += a;
    }
    s_rank = rank;
    s_nact = nact;
    s_kvoff = kvoff;
  }
  __syncthreads();
  // Rows past the step's (s_nact .. bs) belong to no request: a forward that computes every row
  // finds the scratch slot there, never a stale slot that a committed token owns now.
  for (int r = s_nact + b * static_cast<int>(blockDim.x) + static_cast<int>(threadIdx.x); r < p.bs;
       r += p.bs * static_cast<int>(blockDim.x)) {
    p.input_ids[r] = 0;
    p.positions[r] = 0;
    p.out_cache_loc[r] = p.scratch_slot;
  }
  const int act = p.active[b] ? 1 : 0;
  const i64 len = act ? checked_len(p, b) : 0;
  const i64 kvoff = s_kvoff;
  if (threadIdx.x == 0) {
    if (act && dl::req_row(p.req_pool_indices, b, p.r2t_rows) < 0)
      dl::report_error(p.error, b, DL_FIELD_REQ_POOL_INDICES, DL_ERR_OUT_OF_RANGE);
    else if (act && len != p.seq_lens[b]) dl::report_error(p.error, b, DL_FIELD_SEQ_LENS, DL_ERR_OVER_MAX);
    if (b == 0) {
      p.qo_indptr[0] = 0;
      p.kv_indptr[0] = 0;
    }
    p.qo_indptr[b + 1] = s_rank + act;
    p.kv_indptr[b + 1] = (i32)(kvoff + len);
    if (act) {
      const int r = s_rank;
      const i64 count = *p.free_count;
      i64 slot = p.scratch_slot;
      if (!dl::valid_pool_count(count, p.free_capacity)) {
        dl::report_error(p.error, b, DL_FIELD_OUT_CACHE_LOC, DL_ERR_OUT_OF_RANGE);
        atomicOr(p.status, kStatusPoolExhausted);
      } else if (count >= s_nact) {
        slot = p.free_slots[count - s_nact + r];
        if (!dl::valid_slot(slot, p.free_capacity)) {
          dl::report_error(p.error, b, DL_FIELD_OUT_CACHE_LOC, DL_ERR_OUT_OF_RANGE);
          slot = p.scratch_slot;
        }
      } else {
        atomicOr(p.status, kStatusPoolExhausted);
      }
      p.input_ids[r] = p.root_tokens[b];
      p.positions[r] = len;
      p.out_cache_loc[r] = slot;
    }
  }
  if (act && kvoff + len <= p.kv_capacity) {
    // len > 0 only for a valid row (checked_len)
    const i32* src = p.req_to_token + dl::req_row(p.req_pool_indices, b, p.r2t_rows) * p.max_context;
    for (i64 i = threadIdx.x; i < len; i += blockDim.x) {
      i64 slot = src[i];
      if (!dl::valid_slot(slot, p.free_capacity)) {
        dl::report_error(p.error, b, DL_FIELD_REQ_TO_TOKEN, DL_ERR_OUT_OF_RANGE);
        slot = p.scratch_slot;
      }
      p.kv_indices[kvoff + i] = slot;
    }
  } else if (act && threadIdx.x == 0) {
    atomicOr(p.status, kStatusKvCapacity);
  }
}

// Writes the ring entry of this step: header + the records already in `rec` (shared memory).
DL_DEVICE void publish(const StepParams& p, const i32* rec, int nact) {
  const u64 step = *p.step_counter;
  const int w = p.record_width;
  i32* entry = p.ring + (i64)(step % (u64)p.ring_slots) * (kHeader + p.bs * w);
  for (int i = threadIdx.x; i < p.bs * w; i += blockDim.x) entry[kHeader + i] = rec[i];
  __syncthreads();
  if (threadIdx.x == 0) {
    entry[1] = *p.status;
    entry[2] = (i32)*p.free_count;
    entry[3] = nact;
    __threadfence_system();
    entry[0] = (i32)(step & 0x7fffffffull);  // written last: the entry is complete
    *p.step_counter = step + 1ull;
  }
}

extern "C" __global__ void __launch_bounds__(1024)
ar_commit(const __grid_constant__ StepParams p) {
  dl::pdl_enter();  // (common.cuh: before anything else, so a programmatic launch of it is safe)
  extern __shared__ i32 rec[];  // [bs * record_width]
  __shared__ int s_nact;
  const int b = threadIdx.x;
  const int w = p.record_width;
  int act = 0;
  if (b < p.bs) act = p.active[b] ? 1 : 0;
  // rank among active requests (every thread reads the flags before anyone writes them)
  int rank = 0, nact = 0;
  for (int j = 0; j < p.bs; ++j) {
    const int a = p.active[j] ? 1 : 0;
    if (j < b) rank += a;
    nact += a;
  }
  if (threadIdx.x == 0) s_nact = nact;
  for (int i = threadIdx.x; i < p.bs * w; i += blockDim.x) rec[i] = -1;
  __syncthreads();
  if (b < p.bs) {
    i32* r = rec + b * w;
    r[0] = 0;
    r[1] = 0;
    r[2] = -1;
    r[3] = 0;
    if (act) {
      const u64 am = p.argmax_part[rank];
      p.argmax_part[rank] = 0ull;  // cleared for the next step's argmax
      const int tok = dl::argmax_token(am);
      const i64 slot = p.out_cache_loc[rank];
      const i64 len = checked_len(p, b);
      const i64 row = dl::req_row(p.req_pool_indices, b, p.r2t_rows);
      if (row >= 0 && len < p.max_context) p.req_to_token[row * p.max_context + len] = (i32)slot;
      p.seq_lens[b] = len + 1;
      r[0] = 1;
      if (!dl::argmax_finite(am)) {
        // the row had no value above -inf: no token; the request ends (the root's KV is kept)
        p.active[b] = 0;
        r[3] = kFinishNonfinite;
        atomicOr(p.status, kStatusNonfinite);
      } else {
        p.root_tokens[b] = tok;
        const int left = p.remaining[b] - 1;
        p.remaining[b] = left;
        const bool fin = is_stop(p, b, tok) || left <= 0 || len + 1 >= p.max_context;
        if (fin) p.active[b] = 0;
        r[1] = 1;
        r[2] = tok;
        r[3] = fin ? DL_FINISH_DONE : 0;
        if (w > kRecHead) r[kRecHead] = tok;
      }
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const i64 count = *p.free_count;
    if (count >= s_nact && count <= p.free_capacity) *p.free_count = count - s_nact;
  }
  __syncthreads();
  int still = 0;
  for (int j = 0; j < p.bs; ++j) still += p.active[j] ? 1 : 0;
  publish(p, rec, still);
}

extern "C" __global__ void __launch_bounds__(1024)
limit_records(const __grid_constant__ StepParams p) {
  dl::pdl_enter();  // (common.cuh: before anything else, so a programmatic launch of it is safe)
  const int b = threadIdx.x;
  if (b >= p.bs) return;
  const int w = p.record_width;
  i32* r = p.records + (i64)b * w;
  const int n = r[1];
  if (n <= 0) return;
  const int left = p.remaining[b] - n;
  p.remaining[b] = left;
  if (left > 0) return;
  // max new tokens reached: keep the first n + left tokens, drop the rest, end the request.
  // Committed KV follows the kept tokens: the root and the nodes of the first keep - 1 of them.
  const int keep = n + left < 0 ? 0 : n + left;
  for (int i = keep; i < n && kRecHead + i < w; ++i) r[kRecHead + i] = -1;
  r[1] = keep;
  if (keep < n) r[2] = -1;  // the bonus (the last token) was dropped
  if (r[3] == 0) r[3] = DL_FINISH_DONE;
  p.active[b] = 0;
  if (p.accepted_count != nullptr) {
    const int a = p.accepted_count[b];
    if (a > keep) {
      p.accepted_count[b] = keep;
      r[0] = keep;
    }
  }
}

extern "C" __global__ void __launch_bounds__(1024)
publish_records(const __grid_constant__ StepParams p) {
  dl::pdl_enter();  // (common.cuh: before anything else, so a programmatic launch of it is safe)
  extern __shared__ i32 rec[];  // [bs * record_width]
  const int w = p.record_width;
  for (int i = threadIdx.x; i < p.bs * w; i += blockDim.x) rec[i] = p.records[i];
  if (threadIdx.x == 0 && p.tree_state != nullptr) {
    const int bits = static_cast<int>(p.tree_state[2]);
    if (bits) atomicOr(p.status, bits);
  }
  __syncthreads();
  int still = 0;
  for (int j = 0; j < p.bs; ++j) still += p.active[j] ? 1 : 0;
  publish(p, rec, still);
}
