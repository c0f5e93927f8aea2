// request_state.cuh: the request state and the slot pool, as every kernel file sees them.
//
// One contract, mirrored by driverlevel/request_state.py (RequestState) and carried under the
// same names (SGLang's where SGLang has the array) by the runner's StepParams (runner.cu) and
// the DDTree stages' params structs (ddtree/params.cuh). B = max_batch.
//
//   active            u8  [B]                  1 = live; cleared when a request finishes
//   root_tokens       i32 [B]                  last committed token (KV not cached yet)
//   seq_lens          i64 [B]                  tokens whose KV is cached; the root's position
//   req_pool_indices  i64 [B]                  row of req_to_token of each request
//   req_to_token      i32|i64 [r2t_rows, max_context]  cache slot of every cached position
//   free_slots        i64 [free_capacity]      stack of free cache slots, top at free_count - 1
//   free_count        i64 [1]
//   stop_tokens       i32 [B, n_stop]          -1 padded, optional
//   budgets           i32 [B]                  DDTree node budgets, optional
//   remaining         i32 [B]                  tokens a request may still emit, optional
//
// Every kernel checks what it reads (seq_lens in [0, max_context], req_pool_indices in
// [0, r2t_rows), free_count in [0, free_capacity], slot ids in [0, free_capacity)), never
// reads or writes out of bounds, and reports a bad value through the device error word.
#pragma once
#include "common.cuh"

namespace dl {

// The checks and accesses of the request state, written once: the runner's kernels (runner.cu)
// and the DDTree stages (ddtree/compile.cuh, ddtree/commit.cuh) go through these.

// A slot id the pool can hold: [0, free_capacity).
DL_DEVICE bool valid_slot(i64 slot, i64 free_capacity) { return slot >= 0 && slot < free_capacity; }

// A pool count the stack can hold: [0, free_capacity].
DL_DEVICE bool valid_pool_count(i64 count, i64 free_capacity) { return count >= 0 && count <= free_capacity; }

// A cached length a request may have: [0, max_context].
DL_DEVICE bool valid_seq_len(i64 len, i64 max_context) { return len >= 0 && len <= max_context; }

// The req_to_token row of request b, or -1 when req_pool_indices[b] lies outside [0, r2t_rows).
DL_DEVICE i64 req_row(const i64* req_pool_indices, int b, i64 r2t_rows) {
  const i64 row = req_pool_indices[b];
  return (row < 0 || row >= r2t_rows) ? -1 : row;
}

// Entry idx of req_to_token, int32 or int64 (is64), as a slot id; and its store.
DL_DEVICE i64 r2t_load(const void* req_to_token, bool is64, i64 idx) {
  return is64 ? static_cast<const i64*>(req_to_token)[idx] : static_cast<i64>(static_cast<const i32*>(req_to_token)[idx]);
}
DL_DEVICE void r2t_store(void* req_to_token, bool is64, i64 idx, i64 slot) {
  if (is64) static_cast<i64*>(req_to_token)[idx] = slot;
  else static_cast<i32*>(req_to_token)[idx] = static_cast<i32>(slot);
}

}  // namespace dl
