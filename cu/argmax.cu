// argmax.cu: the package's one argmax kernel: the greedy token of every row of a logits matrix.
//
// Pairs with driverlevel/argmax.py (argmax_rows_launch, argmax_layout; the ctypes mirror of
// ArgmaxParams and compile_defines()). Capture-safe: the row count may be read from device
// memory, the grid is fixed by the launcher. Its callers: DDTreePlan.accept (the target's argmax
// per draft node; ddtree_accept reads part and clears it), the AutoregressiveRunner (the next
// token per request; ar_commit reads part and clears it) and the demo model's successor table
// (index). The rule (logit_keys.cuh): NaN counts as -inf, equal values go to the lower id, a row
// with nothing above -inf has composite 0, which decodes to token 0 and "not finite".
//
// argmax_rows_{f32,bf16}  DL_ARGMAX_THREADS (256) threads; grid fixed by the launcher
//   (argmax_layout: up to 4 CTAs per SM). Rows r < M, M = m_max, or min(m_max, max(*m_ptr, 0))
//   when m_ptr is set. Work item i = (row i / splits, split i % splits), rows in order; one warp
//   per item (no block barriers), the warps of the grid stride over the items. A lane keeps
//   UNROLL 16-byte loads in flight (vec = 1) and compares plain floats (its tokens come in
//   increasing order, so `>` keeps the first of equal maxima; -0 and +0 compare equal, as their
//   order keys do). The warp's (key, ~id) composite is folded into part[r] with a 64-bit
//   atomicMax (part must hold 0 before the launch: its consumer clears it); with index set
//   (only with splits == 1: the warp holds the whole row) index[r] = argmax_token(composite).
//   Starts with dl::pdl_enter (common.cuh): argmax_rows_launch makes it a programmatic launch on
//   sm_90+ unless told otherwise (programmatic=False, e.g. DDTreePlan(pdl=False)).
#include "common.cuh"
#include "logit_keys.cuh"

// From the launcher (driverlevel/argmax.py compile_defines).
#ifndef DL_ARGMAX_THREADS
#error "compile with driverlevel.argmax.compile_variants()"
#endif

constexpr int kThreads = DL_ARGMAX_THREADS;
constexpr int kUnroll = 4;

struct ArgmaxParams {
  const void* x;          // [>= m_max, ld] float32 or bfloat16 logits
  const i64* m_ptr;       // optional: M = min(m_max, max(*m_ptr, 0))
  u64* part;              // [m_max] running (key, ~id) composite per row, or null
  i32* index;             // [m_max] argmax per row (splits == 1 only), or null
  i64 m_max;
  i64 ld;                 // elements between rows
  i32 n;                  // tokens per row (the vocabulary)
  i32 vec;                // 1: 16-byte loads (x 16-byte aligned; n, ld and split_len multiples of the vector)
  i32 splits;             // work items per row
  i32 split_len;          // tokens per work item (a multiple of 1,024)
};

#ifdef DL_OFF_x
DL_CHECK_OFFSET(ArgmaxParams, x);
DL_CHECK_OFFSET(ArgmaxParams, m_ptr);
DL_CHECK_OFFSET(ArgmaxParams, part);
DL_CHECK_OFFSET(ArgmaxParams, index);
DL_CHECK_OFFSET(ArgmaxParams, m_max);
DL_CHECK_OFFSET(ArgmaxParams, ld);
DL_CHECK_OFFSET(ArgmaxParams, n);
DL_CHECK_OFFSET(ArgmaxParams, vec);
DL_CHECK_OFFSET(ArgmaxParams, splits);
DL_CHECK_OFFSET(ArgmaxParams, split_len);
static_assert(sizeof(ArgmaxParams) == DL_SIZEOF_PARAMS, "ArgmaxParams size differs from its ctypes mirror");
#endif

template <typename T>
DL_DEVICE void argmax_rows(const ArgmaxParams& p) {
  using Tr = dl::LogitTraits<T>;
  constexpr int V = Tr::VEC;
  constexpr int STEP = 32 * V;                   // tokens of one warp-wide vector round
  const int lane = threadIdx.x & 31;
  const i64 nwarps = static_cast<i64>(gridDim.x) * (kThreads / 32);
  const i64 rows = p.m_ptr ? min(max(*p.m_ptr, 0ll), p.m_max) : p.m_max;
  const i64 items = rows * p.splits;
  for (i64 item = static_cast<i64>(blockIdx.x) * (kThreads / 32) + (threadIdx.x >> 5); item < items; item += nwarps) {
    const i64 r = item / p.splits;
    const int s = static_cast<int>(item - r * p.splits);
    const int start = s * p.split_len;
    const int end = min(p.n, start + p.split_len);
    const T* row = static_cast<const T*>(p.x) + r * p.ld;
    float bv = DL_NEG_INF;
    int bi = -1;
    if (p.vec) {  // start and end are multiples of V
      int i = start + lane * V;
      for (; i + (kUnroll - 1) * STEP < end; i += kUnroll * STEP) {
        float x[kUnroll][V];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) Tr::load_vec(row + i + u * STEP, x[u]);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
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
    u64 best = bi >= 0 ? dl::composite(dl::f32_key(bv), bi) : 0ull;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const u64 w = __shfl_xor_sync(0xffffffffu, best, o);
      best = w > best ? w : best;
    }
    if (lane == 0) {
      if (p.part && best) atomicMax(reinterpret_cast<unsigned long long*>(p.part + r), static_cast<unsigned long long>(best));
      if (p.index) p.index[r] = dl::argmax_token(best);
    }
  }
}

extern "C" __global__ void __launch_bounds__(kThreads, 1) argmax_rows_f32(const __grid_constant__ ArgmaxParams p) {
  dl::pdl_enter();  // (common.cuh: before anything else, so a programmatic launch of it is safe)
  argmax_rows<float>(p);
}
extern "C" __global__ void __launch_bounds__(kThreads, 1) argmax_rows_bf16(const __grid_constant__ ArgmaxParams p) {
  dl::pdl_enter();  // (common.cuh: before anything else, so a programmatic launch of it is safe)
  argmax_rows<bf16>(p);
}
