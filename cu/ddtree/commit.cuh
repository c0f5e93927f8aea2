// ddtree/commit.cuh: stage 4, ddtree_commit (paged: keep accepted slots, free the rest) and
// ddtree_commit_dense.
//
// Part of the one translation unit cu/ddtree.cu (see its header for the kernels).
#pragma once
#include "params.cuh"

namespace ddt {

// ------------------------------------------------------------------------------ commit

struct CommitSmem {
  u8 keep[ddt::MAX_K + 1];
  i64 rejected_before, rejected_total;
  int ri[32];
  int a_ok;
};

// Accepted nodes of request b, checked: 0 <= a <= min(q, D + 1) (else 0, the same in every CTA).
DL_DEVICE int checked_accepted(const CommitParams& p, int r, i64 q) {
  const int a = p.accepted_count[r];
  return (a < 0 || a > q || a > p.depth_limit + 1) ? 0 : a;
}

DL_DEVICE void commit_step(const CommitParams& p, CommitSmem& sm) {
  const int b = blockIdx.x, tid = threadIdx.x, B = p.max_batch, D = p.depth_limit;
  if (!p.paged) {
    if (tid == 0) p.seq_lens[b] += p.accepted_count[b];  // bounded by ddtree_commit_dense
    return;
  }
  if (p.state[2] & STATUS_POOL_EXHAUSTED) return;
  const i64 alloc_base = p.state[0];
  const i64 N = p.budget + 1;
  const i64 max_rows = static_cast<i64>(B) * N;
  auto rows_of = [&](int r) {  // compile wrote qo_indptr; 0 rows where it is not sane (accept's test:
    // its rows must lie in out_cache_loc's max_batch * N, whatever a caller wrote into qo_indptr)
    const i64 lo = p.qo_indptr[r], n = p.qo_indptr[r + 1] - lo;
    return (n < 0 || n > N || lo < 0 || lo > max_rows - n) ? 0ll : n;
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
  const i32* acc = p.accepted_nodes + static_cast<size_t>(b) * (D + 1);
  if (tid < 32) {  // the accepted path as commit takes it: its longest prefix of strictly increasing
    // node ids in [0, q) (accept writes a root-to-leaf path, and a parent's id is below its
    // children's). A corrupted accepted_nodes (a repeated or out-of-range node) is cut there and
    // reported: no slot is then kept twice, or both kept and pushed.
    int ok = a;
    for (int i0 = 0; i0 < a; i0 += 32) {
      const int i = i0 + tid;
      bool bad = false;
      if (i < a) {
        const int node = acc[i], prev = i > 0 ? acc[i - 1] : -1;
        bad = node <= prev || node >= q;
      }
      const unsigned m = __ballot_sync(FULL, bad);
      if (m != 0u) {  // (warp-uniform)
        ok = i0 + __ffs(m) - 1;
        break;
      }
    }
    if (tid == 0) {
      sm.a_ok = ok;
      if (ok != a) dl::report_error(p.error, b, DL_FIELD_PARENTS, DL_ERR_INCONSISTENT);
    }
  }
  for (int i = tid; i < q; i += SMALL_THREADS) sm.keep[i] = 0;
  __syncthreads();
  const int a_ok = sm.a_ok;  // <= a: the rows committed; the request's share of pushes stays q - a
  const i64 c = p.seq_lens[b];
  const i64 row = dl::req_row(p.req_pool_indices, b, p.r2t_rows);
  // (a_ok <= r2t_stride - c, not c + a_ok <= r2t_stride: a seq_lens near 2^63 must not wrap past the test)
  const bool c_ok = c >= 0 && a_ok <= p.r2t_stride - c;
  const bool table_ok = a_ok == 0 || (c_ok && row >= 0);
  if (tid == 0 && !table_ok) dl::report_error(p.error, b, c_ok ? DL_FIELD_REQ_POOL_INDICES : DL_FIELD_SEQ_LENS,
                                              DL_ERR_OUT_OF_RANGE);
  const i64 rowb = row * p.r2t_stride;
  for (int i = tid; i < a_ok; i += SMALL_THREADS) {
    const int node = acc[i];  // (in [0, q): checked above)
    sm.keep[node] = 1;
    if (!table_ok) continue;
    const i64 slot = p.out_cache_loc[qo + node];
    dl::r2t_store(p.req_to_token, p.r2t_is64, rowb + c + i, slot);
  }
  __syncthreads();
  // Rejected slots in node order, at most this request's share q - a: the other CTAs placed their
  // ranges by that count, so a corrupted accepted_nodes (a repeated or out-of-range node keeps
  // fewer than a rows) must not spill into the next request's range -- its surplus slots are
  // reported and leaked (a slot pushed twice would later be handed to two requests).
  const i64 first = alloc_base + sm.rejected_before, share = q - a;
  i64 pushed = 0;
  for (int i0 = 0; i0 < q; i0 += SMALL_THREADS) {
    const int i = i0 + tid;
    const int rej = i < q && !sm.keep[i];
    int total;
    const int rank = dl::block_excl_scan<SMALL_THREADS>(rej, sm.ri, &total);
    if (rej) {
      const i64 dst = first + pushed + rank;
      if (pushed + rank >= share) dl::report_error(p.error, b, DL_FIELD_PARENTS, DL_ERR_INCONSISTENT);
      else if (dst >= 0 && dst < p.free_capacity) p.free_slots[dst] = p.out_cache_loc[qo + i];
      else dl::report_error(p.error, b, DL_FIELD_OUT_CACHE_LOC, DL_ERR_OUT_OF_RANGE);
    }
    pushed += total;
  }
  if (tid == 0) {
    if (table_ok) p.seq_lens[b] = c + a_ok;
    if (b == 0) *p.free_count = alloc_base + sm.rejected_total;
  }
}

// Dense commit, bounded by the window: node i of the accepted path moves from c + node to
// c + i; a node whose row c + node lies at or past the window has no KV there (the tree did
// not fit: compile set STATUS_CONTEXT_FULL), so acceptance is cut before it -- accepted_count
// becomes the nodes kept, the request finishes (active = 0) and STATUS_CONTEXT_FULL is set.
// Nothing outside the request's window is read or written.
DL_DEVICE void commit_dense_rows(const CommitParams& p) {
  const int b = blockIdx.x, layer = blockIdx.y, tid = threadIdx.x, D = p.depth_limit;
  const i64 N = p.budget + 1;
  const i64 q = p.qo_indptr[b + 1] - p.qo_indptr[b];
  const int a_raw = p.accepted_count[b];
  const i64 c = p.seq_lens[b];
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
    if (node >= p.dense_window - c) break;  // (c >= 0 here; c + node could wrap near 2^63)
  }
  if (keep != a_raw && layer == 0 && tid == 0) {
    p.accepted_count[b] = keep;  // the plain commit that follows advances seq_lens by it
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
