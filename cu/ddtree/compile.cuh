// ddtree/compile.cuh: stage 2, ddtree_compile: verify inputs, slots, indptrs, kv_indices and masks.
//
// Part of the one translation unit cu/ddtree.cu (see its header for the kernels).
#pragma once
#include "params.cuh"

namespace ddt {

// ------------------------------------------------------------------------------ compile

struct CompileSmem {
  i64 qo[DL_MAX_BATCH + 1], kv[DL_MAX_BATCH + 1], full[DL_MAX_BATCH + 1], qlen[DL_MAX_BATCH + 1];
  i64 alloc_base;
  int status;
};

// Prefix sums of the per-request sizes over the batch (warp 0), identical in every CTA.
DL_DEVICE void compile_prefix(const CompileParams& p, CompileSmem& sm) {
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
        const i64 c = p.seq_lens[b];
        if (!dl::valid_seq_len(c, p.max_context)) { field = DL_FIELD_SEQ_LENS; code = c < 0 ? DL_ERR_OUT_OF_RANGE : DL_ERR_OVER_MAX; }
        else if (dl::req_row(p.req_pool_indices, b, p.r2t_rows) < 0) { field = DL_FIELD_REQ_POOL_INDICES; code = DL_ERR_OUT_OF_RANGE; }
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
    if (!dl::valid_pool_count(avail, p.free_capacity)) {  // a bad pool count: hand out no slot
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

DL_DEVICE void compile_step(const CompileParams& p, CompileSmem& sm) {
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
  if (x == 0) {
    // Rows past the step's (qo[B] .. B * N) belong to no request: a forward that computes every
    // row finds slot -1 there (write nothing), never a stale slot that a committed token owns now.
    const i64 rows = static_cast<i64>(B) * N;
    for (i64 r = sm.qo[B] + static_cast<i64>(b) * SMALL_THREADS + tid; r < rows;
         r += static_cast<i64>(B) * SMALL_THREADS) {
      p.input_ids[r] = 0;
      p.positions[r] = 0;
      p.out_cache_loc[r] = -1;
    }
  }
  const i64 q = sm.qo[b + 1] - sm.qo[b];
  if (q == 0) return;
  const i64 qo = sm.qo[b], pre = sm.kv[b + 1] - sm.kv[b];
  const i64 committed = p.seq_lens[b];
  const size_t tb = static_cast<size_t>(b) * N;
  if (x == 0) {
    const bool pool_ok = !(status & STATUS_POOL_EXHAUSTED);
    for (int i = tid; i < q; i += SMALL_THREADS) {
      p.input_ids[qo + i] = p.tokens[tb + i];
      p.positions[qo + i] = committed + p.depths[tb + i];
      i64 slot = pool_ok ? p.free_slots[sm.alloc_base + qo + i] : -1;
      if (pool_ok && !dl::valid_slot(slot, p.free_capacity)) {
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
      i64 slot = dl::r2t_load(p.req_to_token, p.r2t_is64, rowb + i);
      if (!dl::valid_slot(slot, p.free_capacity)) {
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

}  // namespace ddt
