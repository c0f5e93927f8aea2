// argmax.cu: greedy argmax over rows of float32 logits (the autoregressive step's next token).
//
// Pairs with driverlevel/argmax.py (argmax_launch; the ctypes mirror of ArgmaxParams and
// compile_defines()). Capture-safe: the row count may be read from device memory.
//
// argmax_rows     index[m] = argmax_j x[m, j] (first index of the maximum; NaN counts as -inf; 0
//                 for a row with nothing above -inf), optional top-2 values.
//   Grid (m_max); Block 256 (8 warps; static shared memory 96 B). Early exit: m >= M, with M =
//   m_max, or min(m_max, *m_ptr) when m_ptr is set. NaN never wins.
#include "common.cuh"

struct ArgmaxParams {
  const float* x;         // [M, ld]
  const i64* m_ptr;       // optional: M = min(m_max, *m_ptr)
  i32* index;             // [M] argmax
  float* top2;            // [M, 2] optional: largest and second largest value
  i64 m_max;
  i32 n, ld;
};

#ifdef DL_OFF_x
DL_CHECK_OFFSET(ArgmaxParams, x);
DL_CHECK_OFFSET(ArgmaxParams, m_ptr);
DL_CHECK_OFFSET(ArgmaxParams, index);
DL_CHECK_OFFSET(ArgmaxParams, top2);
DL_CHECK_OFFSET(ArgmaxParams, m_max);
DL_CHECK_OFFSET(ArgmaxParams, n);
DL_CHECK_OFFSET(ArgmaxParams, ld);
static_assert(sizeof(ArgmaxParams) == DL_SIZEOF_PARAMS, "ArgmaxParams size differs from its ctypes mirror");
#endif

namespace am {
DL_DEVICE bool better(float v, int i, float bv, int bi) { return v > bv || (v == bv && i < bi); }
// Merge (best, index, second) triples.
DL_DEVICE void merge(float& b, int& bi, float& s, float ob, int obi, float os) {
  if (better(ob, obi, b, bi)) {
    s = fmaxf(fmaxf(s, os), b);
    b = ob;
    bi = obi;
  } else {
    s = fmaxf(fmaxf(s, os), ob);
  }
}
}  // namespace am

extern "C" __global__ void __launch_bounds__(256)
argmax_rows(const __grid_constant__ ArgmaxParams p) {
  i64 M = p.m_max;
  if (p.m_ptr != nullptr) M = min(M, *p.m_ptr);
  const i64 m = blockIdx.x;
  if (m >= M) return;
  const float* x = p.x + m * p.ld;
  float best = DL_NEG_INF, second = DL_NEG_INF;
  int bi = 0x7fffffff;
  for (int j = threadIdx.x; j < p.n; j += blockDim.x) {
    const float v = x[j];
    if (am::better(v, j, best, bi)) {
      second = fmaxf(second, best);
      best = v;
      bi = j;
    } else if (v > second) {
      second = v;
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ob = __shfl_xor_sync(0xffffffffu, best, o);
    const int obi = __shfl_xor_sync(0xffffffffu, bi, o);
    const float os = __shfl_xor_sync(0xffffffffu, second, o);
    am::merge(best, bi, second, ob, obi, os);
  }
  __shared__ float sb[8], ss[8];
  __shared__ int si[8];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) {
    sb[warp] = best;
    si[warp] = bi;
    ss[warp] = second;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    const int nw = blockDim.x >> 5;
    for (int w = 1; w < nw; ++w) am::merge(best, bi, second, sb[w], si[w], ss[w]);
    // The package's rule: NaN counts as -inf (it never wins above); a row with no value above
    // -inf gives id 0 (its top2[0] stays -inf, which says "not finite" to the caller).
    p.index[m] = (bi == 0x7fffffff || !(best > DL_NEG_INF)) ? 0 : bi;
    if (p.top2 != nullptr) {
      p.top2[2 * m] = best;
      p.top2[2 * m + 1] = second;
    }
  }
}
