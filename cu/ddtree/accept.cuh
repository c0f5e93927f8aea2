// ddtree/accept.cuh: stage 3, ddtree_accept (the greedy walk, stop tokens, bonus, records) over the
// target's argmax per node (argmax.cu's argmax_rows_* composites, or the given tokens).
//
// Part of the one translation unit cu/ddtree.cu (see its header for the kernels).
#pragma once
#include "keys.cuh"

namespace ddt {

// ------------------------------------------------------------------------------ accept

constexpr int ACCEPT_STOPS = 64;  // stop tokens per request staged in shared memory

static_assert(DL_MAX_DEPTH + 1 <= 64, "AcceptSmem::path holds at most 64 nodes");

struct AcceptSmem {
  int post[ddt::MAX_K + 1];
  int tok[ddt::MAX_K + 1];          // node tokens (the walk reads no global memory)
  short match[ddt::MAX_K + 1];
  int path[64];                     // the walk: at most depth_limit + 1 <= MAX_DEPTH + 1 nodes
  int stop[ACCEPT_STOPS];
};

DL_DEVICE bool is_stop(const AcceptParams& p, const AcceptSmem& sm, int b, int tok) {
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

DL_DEVICE void accept_step(const AcceptParams& p, AcceptSmem& sm) {
  const int b = blockIdx.x, tid = threadIdx.x;
  const int N = p.budget + 1, D = p.depth_limit, RW = p.record_width;
  const i64 qo = p.qo_indptr[b];
  const i64 q64 = p.qo_indptr[b + 1] - qo;
  const i64 max_rows = static_cast<i64>(p.max_batch) * N;
  // (qo <= max_rows - q64 once q64 is in range: qo + q64 wraps for qo near 2^63, e.g. INT64_MAX / INT64_MIN)
  const bool q_ok = q64 >= 0 && q64 <= N && qo >= 0 && qo <= max_rows - q64;
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
    } else {  // argmax_rows' per-row composites (logit_keys.cuh: 0 = nothing above -inf in the row)
      for (int i = tid; i < q; i += SMALL_THREADS) {
        const u64 c = p.argmax_part[qo + i];
        const int tok = dl::argmax_finite(c) ? dl::argmax_token(c) : -1;
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
    const i64 room = p.max_context - p.seq_lens[b];
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

}  // namespace ddt
