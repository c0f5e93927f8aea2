// selftest.cu: small kernels for driverlevel's own tests and the graph-replay benchmark.
//
// Pairs with driverlevel/selftest.py (the ctypes mirror of SaxpyParams, the compile
// defines and a loader). None of these kernels is part of the verify path; they exist
// so that the runtime (launch, argument packing, events, graphs, the capture guard,
// interop, the dynamic shared-memory opt-in) can be tested on its own.
//
// Every elementwise kernel: grid ceil(n / blockDim.x) (any block size), one element per
// thread, threads past n exit first.
//   noop                              no arguments, no work: the replay benchmark's node.
//   add_scalar_f32(x, v, n)           x[i] += v
//   saxpy_f32(a, x, y, n)             y[i] = a * x[i] + y[i]
//   saxpy_params(p)                   the same from one SaxpyParams passed by value
//                                     (__grid_constant__), as the real kernels take theirs.
//   add_i64(x, v, n)                  x[i] += v (64-bit scalar argument)
//   fill_iota_f32(x, base, n)         x[i] = base + i
//   copy_plus_one_from_device_scalar(step, x, n)
//                                     x[i] = (*step + i) + 1, reading a value from device
//                                     memory, so a graph replayed after the value changes
//                                     shows the new value.
//   block_sum_f32(x, out, n)          atomicAdd(out, sum(x)); 256-thread blocks and a static
//                                     __shared__ array of 256 floats (1 KB in ptxas' report).
//   spin_wait_ns(ns)                  one thread busy-waits ns nanoseconds (%globaltimer): the
//                                     benchmark queues work behind it to time the GPU alone.
//   reverse_f32_dynamic_smem(in, out, n)
//                                     one block; stages n floats in dynamic shared memory and
//                                     writes them reversed. Launched with n * 4 bytes > 48 KB
//                                     it needs the opt-in (cuFuncSetAttribute).
#include "common.cuh"

// Mirrored by driverlevel.selftest.SaxpyParams (ctypes).
struct SaxpyParams {
  const float* x;  // [n]
  float* y;        // [n]
  float a;
  i32 n;
  i64 tag;         // unused by the kernel: checks 8-byte alignment after two 4-byte fields
};

#ifdef DL_OFF_x
DL_CHECK_OFFSET(SaxpyParams, x);
DL_CHECK_OFFSET(SaxpyParams, y);
DL_CHECK_OFFSET(SaxpyParams, a);
DL_CHECK_OFFSET(SaxpyParams, n);
DL_CHECK_OFFSET(SaxpyParams, tag);
static_assert(sizeof(SaxpyParams) == DL_SIZEOF_PARAMS, "SaxpyParams size differs from its ctypes mirror");
#endif

DL_DEVICE int global_index() { return static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x); }

extern "C" __global__ void noop() {}

extern "C" __global__ void add_scalar_f32(float* x, float v, int n) {
  const int i = global_index();
  if (i >= n) return;
  x[i] += v;
}

extern "C" __global__ void saxpy_f32(float a, const float* x, float* y, int n) {
  const int i = global_index();
  if (i >= n) return;
  y[i] = a * x[i] + y[i];
}

extern "C" __global__ void saxpy_params(const __grid_constant__ SaxpyParams p) {
  const int i = global_index();
  if (i >= p.n) return;
  p.y[i] = p.a * p.x[i] + p.y[i];
}

extern "C" __global__ void add_i64(i64* x, i64 v, int n) {
  const int i = global_index();
  if (i >= n) return;
  x[i] += v;
}

extern "C" __global__ void fill_iota_f32(float* x, float base, int n) {
  const int i = global_index();
  if (i >= n) return;
  x[i] = base + static_cast<float>(i);
}

extern "C" __global__ void copy_plus_one_from_device_scalar(const int* step, float* x, int n) {
  const int i = global_index();
  if (i >= n) return;
  x[i] = static_cast<float>(*step + i) + 1.0f;
}

extern "C" __global__ void __launch_bounds__(256) block_sum_f32(const float* x, float* out, int n) {
  __shared__ float partial[256];
  const int i = global_index();
  partial[threadIdx.x] = i < n ? x[i] : 0.0f;
  __syncthreads();
  for (int s = 128; s > 0; s >>= 1) {
    if (threadIdx.x < s) partial[threadIdx.x] += partial[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicAdd(out, partial[0]);
}

extern "C" __global__ void spin_wait_ns(i64 ns) {
  if (threadIdx.x != 0) return;
  u64 start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (static_cast<i64>(now - start) < ns);
}

extern "C" __global__ void reverse_f32_dynamic_smem(const float* in, float* out, int n) {
  extern __shared__ float staged[];
  for (int i = threadIdx.x; i < n; i += blockDim.x) staged[i] = in[i];
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) out[i] = staged[n - 1 - i];
}
