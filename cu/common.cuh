// common.cuh: shared device helpers for driverlevel's kernels.
//
// Only <cuda_bf16.h> is included (NVRTC ships no C++ standard headers here), so
// the fixed-width types are spelled out below. Inline PTX wrappers cover the
// sm_80+ instructions the kernels use: cp.async (16-byte global->shared copies,
// zero-filling), ldmatrix, mma.sync m16n8k16 bf16 with fp32 accumulation, and
// named barriers. All of them exist on sm_80 ... sm_120. The programmatic dependent
// launch controls (griddepcontrol, sm_90+) compile to nothing below sm_90.
#pragma once
#include <cuda_bf16.h>

typedef signed char i8;
typedef unsigned char u8;
typedef int i32;
typedef unsigned int u32;
typedef long long i64;
typedef unsigned long long u64;
typedef __nv_bfloat16 bf16;

#define DL_DEVICE __device__ __forceinline__

#ifndef DL_SMEM_LIMIT
#define DL_SMEM_LIMIT 101376
#endif

// Compile-time check that a params struct matches its ctypes mirror, the one checked-layout
// macro of every kernel file: the launcher passes -DDL_OFF_<field>=<offset> for every field
// (-DDL_OFF_<P>_<field> where one file holds several structs, P naming the struct) and
// -DDL_SIZEOF_<T>.
//   DL_CHECK_OFFSET(T, f)     T.f sits at DL_OFF_<f>
//   DL_CHECK_OFFSET(T, f, P)  T.f sits at DL_OFF_<P>_<f>
// (NVRTC before 13.5 has no usable __builtin_offsetof; there only the struct's size is checked,
// and the CPU tests, which compile with a current NVRTC, check every offset.)
#if (__CUDACC_VER_MAJOR__ * 100 + __CUDACC_VER_MINOR__) >= 1305
#define DL_CHECK_OFFSET_AT_(T, f, off) static_assert(__builtin_offsetof(T, f) == off, #T "." #f " offset differs from its ctypes mirror")
#else
#define DL_CHECK_OFFSET_AT_(T, f, off) static_assert(true, "")
#endif
#define DL_CHECK_OFFSET_2_(T, f) DL_CHECK_OFFSET_AT_(T, f, DL_OFF_##f)
#define DL_CHECK_OFFSET_3_(T, f, P) DL_CHECK_OFFSET_AT_(T, f, DL_OFF_##P##_##f)
#define DL_CHECK_OFFSET_PICK_(a1, a2, a3, M, ...) M
#define DL_CHECK_OFFSET(...) DL_CHECK_OFFSET_PICK_(__VA_ARGS__, DL_CHECK_OFFSET_3_, DL_CHECK_OFFSET_2_, unused)(__VA_ARGS__)

namespace dl {

#define DL_NEG_INF __int_as_float(0xff800000u)

DL_DEVICE u32 smem_u32(const void* p) { return static_cast<u32>(__cvta_generic_to_shared(p)); }

// 16-byte async copy global -> shared; copies `src_bytes` (0 or 16) and zero-fills the rest.
DL_DEVICE void cp_async_16(u32 dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
DL_DEVICE void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
DL_DEVICE void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// Bulk copies and mbarriers (sm_90+; PTX ISA 8.0: cp.async.bulk, mbarrier.expect_tx). One
// thread copies a whole contiguous block global -> shared without registers or the LSU's 16-byte
// requests; its completion is counted in bytes by an mbarrier in shared memory, on which the
// consumers wait (acquire: the data is then visible to the waiting thread).
//   mbar_init(bar, n)            a phase completes after n arrivals and every expected byte
//   mbar_arrive_expect_tx(b, x)  one arrival, and x more bytes to expect in the current phase
//   mbar_arrive(bar)             one arrival, no bytes
//   bulk_copy_g2s(dst, src, x, bar)  x bytes (multiple of 16; both addresses 16-byte aligned)
//   mbar_wait(bar, parity)       until the phase with that parity has completed
//   fence_proxy_async()          orders this thread's generic-proxy shared-memory accesses
//                                before later async-proxy ones (a bulk copy into memory it wrote)
//   fence_mbarrier_init()        makes mbar_init visible to the async proxy (bulk copies)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
DL_DEVICE void mbar_init(u32 bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
DL_DEVICE void mbar_arrive_expect_tx(u32 bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
DL_DEVICE void mbar_arrive(u32 bar) { asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory"); }
DL_DEVICE void bulk_copy_g2s(u32 dst, const void* src, u32 bytes, u32 bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
               ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}
DL_DEVICE void mbar_wait(u32 bar, u32 parity) {
  asm volatile(
      "{\n .reg .pred done;\n WAIT:\n"
      " mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      " @!done bra WAIT;\n}\n" ::"r"(bar), "r"(parity) : "memory");
}
DL_DEVICE void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
// after mbar_init and before the mbarriers' first use by the async proxy (then a block barrier)
DL_DEVICE void fence_mbarrier_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
#endif

// wgmma (sm_90a only: PTX ISA 8.0, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate"):
// the four warps of a warpgroup issue each instruction together. B (and A where given as a
// descriptor) is read from shared memory in the 128-byte-swizzled K-major layout: atoms of 8 rows
// x 128 B (64 bf16 of K), 1024-byte aligned, row r's 16-byte chunk j stored at chunk j ^ r; SBO =
// bytes between 8-row groups, LBO unused (PTX ISA, "Matrix Descriptor Format"; the swizzle is
// TMA's SWIZZLE_128B). A k-step's 32 bytes inside an atom: the start address + 32 * (k % 4).
//   wgmma_fence()                     before the first wgmma that reads registers written since
//   wgmma_commit(), wgmma_wait<N>()   close a group; wait until at most N groups are pending
//   wgmma_desc_sw128(addr, sbo)       a 128-byte-swizzle shared-memory matrix descriptor
//   wgmma_m64n32k16_rs(d, a, b, acc)  d (+)= A B: A as four m16n8k16-style registers per thread
//                                     (warp w holds rows 16w..16w+15), B by descriptor; acc = 0: d = A B
//   wgmma_m64n32k16_ss(d, a, b, acc)  the same with A by descriptor
//   wgmma_m64n256k16_rs_tb(d, a, b, acc)  d (+)= A B with B N-major (transposed: imm-trans-b = 1),
//                                     d as 32 m16n8-style accumulator quads per thread
//   wgmma_pin(d)                      keeps the compiler from moving d across this point
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
DL_DEVICE void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
DL_DEVICE void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
DL_DEVICE void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
// (N-major / M-major operands: LBO = bytes between 64-element slabs along N / M, SBO = between 8-row groups along K)
DL_DEVICE u64 wgmma_desc_sw128(u32 addr, u32 lbo, u32 sbo) {
  return (u64)((addr & 0x3FFFFu) >> 4) | ((u64)((lbo & 0x3FFFFu) >> 4) << 16) | ((u64)((sbo & 0x3FFFFu) >> 4) << 32) | (1ull << 62);
}
// (K-major operands: LBO is unused with the 128-byte swizzle; 16 B, its conventional value)
DL_DEVICE u64 wgmma_desc_sw128(u32 addr, u32 sbo) { return wgmma_desc_sw128(addr, 16, sbo); }
#define DL_WGMMA_D16_ "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define DL_WGMMA_D16_OUT_(d)                                                                                  \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), \
      "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
DL_DEVICE void wgmma_m64n32k16_rs(float (&d)[16], const u32 (&a)[4], u64 b, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 " DL_WGMMA_D16_ ", {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n"
      : DL_WGMMA_D16_OUT_(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(acc));
}
DL_DEVICE void wgmma_m64n32k16_ss(float (&d)[16], u64 a, u64 b, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 " DL_WGMMA_D16_ ", %16, %17, p, 1, 1, 0, 0;\n}\n"
      : DL_WGMMA_D16_OUT_(d)
      : "l"(a), "l"(b), "r"(acc));
}
// d[32][4] as the 128 operands %0 .. %127 of an m64n256 accumulator
#define DL_WGMMA_D4_(d, i) "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3])
#define DL_WGMMA_D16x_(d, i) DL_WGMMA_D4_(d, i), DL_WGMMA_D4_(d, i + 1), DL_WGMMA_D4_(d, i + 2), DL_WGMMA_D4_(d, i + 3)
#define DL_WGMMA_D128_OUT_(d)                                                                        \
  DL_WGMMA_D16x_(d, 0), DL_WGMMA_D16x_(d, 4), DL_WGMMA_D16x_(d, 8), DL_WGMMA_D16x_(d, 12),           \
      DL_WGMMA_D16x_(d, 16), DL_WGMMA_D16x_(d, 20), DL_WGMMA_D16x_(d, 24), DL_WGMMA_D16x_(d, 28)
#define DL_WGMMA_D128_                                                                               \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "                          \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "                 \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "                 \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "                 \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "                 \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "                 \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "     \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"
DL_DEVICE void wgmma_m64n256k16_rs_tb(float (&d)[32][4], const u32 (&a)[4], u64 b, int acc) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " DL_WGMMA_D128_ ", {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
      : DL_WGMMA_D128_OUT_(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(acc));
}
DL_DEVICE void wgmma_pin(float (&d)[32][4]) {
#pragma unroll
  for (int i = 0; i < 32; ++i)
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[i][e])::"memory");
}
DL_DEVICE void wgmma_pin(float (&d)[16]) {
#pragma unroll
  for (int i = 0; i < 16; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
#endif

DL_DEVICE void ldmatrix_x4(u32 (&r)[4], u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
DL_DEVICE void ldmatrix_x4_trans(u32 (&r)[4], u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// D = A(16x16, row) * B(16x8, col) + D, bf16 inputs, fp32 accumulators.
DL_DEVICE void mma_bf16_16816(float (&d)[4], const u32 (&a)[4], u32 b0, u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

DL_DEVICE u32 pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<u32*>(&v);
}
// The two bf16 values of a 32-bit word (low half first) as floats, exactly.
DL_DEVICE void unpack_bf16x2(u32 w, float& lo, float& hi) {
  lo = __uint_as_float(w << 16);
  hi = __uint_as_float(w & 0xffff0000u);
}

// Barrier among `count` threads (a multiple of 32) using hardware barrier `id` (1..15).
DL_DEVICE void named_barrier(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// Barrier 0 over the whole CTA in its non-aligned form (PTX "barrier.sync"): for code where the
// warps reach it from different branches (warp roles), which the aligned form that
// __syncthreads compiles to ("bar.sync" = "barrier.sync.aligned") does not allow.
DL_DEVICE void cta_barrier_from_roles() { asm volatile("barrier.sync 0;\n" ::: "memory"); }

// Programmatic dependent launch (CUDA Programming Guide, "Programmatic Dependent Launch and
// Synchronization"; PTX ISA, griddepcontrol; sm_90+). A kernel launched with
// programmatic=True (driverlevel/_module.py: cuLaunchKernelEx with
// CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION) may start while the kernel before it
// on the stream is still running:
//   pdl_wait()               waits until the grids this one depends on have completed and their
//                            memory operations are visible to it. Every thread that touches what
//                            they read or write runs it first (it is per thread), and at least
//                            one CTA runs it before it exits, so that this grid's completion still
//                            implies its predecessors' (a chain of programmatic launches stays
//                            ordered like a plain stream). Our kernels run it in every CTA, a CTA
//                            that exits early too, but for ddtree_build's code warmers, which touch
//                            nothing of the kernels before. It returns at once in a kernel launched
//                            without the attribute.
//   pdl_launch_dependents()  lets the next kernel, if launched programmatically, start once every
//                            CTA of this grid has run it (or exited). It orders no memory: the
//                            dependent's pdl_wait() still waits for this whole grid.
// Below sm_90 both are empty, and the host never launches such code programmatically
// (PreparedLaunch refuses it): the stream orders the kernels as always. The "memory" clobber
// keeps the compiler from moving loads or stores across the wait.
DL_DEVICE void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
DL_DEVICE void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}
// The entry of a kernel that touches nothing before it has waited: the wait first (every thread,
// every CTA, so that even an early exit keeps a chain of programmatic launches ordered), then the
// next kernel may start (its own wait still waits for this whole grid). A programmatic launch of
// such a kernel overlaps its launch and its CTAs' start with the tail of the kernel before it, and
// its own tail with the next one's start; an ordinary launch pays neither (both are no-ops then).
// The demo model's kernels, the row argmax, the DDTree compile / accept / commit and the runner's
// record kernels start this way and are launched programmatically on sm_90+ (the decode step's
// chain: -5.7 µs of ~195 on an H100, fifty-ninth session).
DL_DEVICE void pdl_enter() {
  pdl_wait();
  pdl_launch_dependents();
}

// The device error word (driverlevel/_device_error.py): {code, request, field, count}, in mapped
// pinned memory. The first failure since the host last cleared it names the request and field;
// count counts every failed check. `e` may be null (no reporting).
struct DeviceErrorWord {
  int code;
  int request;
  int field;
  int count;
};
DL_DEVICE void report_error(DeviceErrorWord* e, int request, int field, int code) {
  if (e == nullptr) return;
  atomicAdd(&e->count, 1);
  if (atomicCAS(&e->code, 0, code) == 0) {
    e->request = request;
    e->field = field;
    __threadfence_system();
  }
}

DL_DEVICE float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
DL_DEVICE float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Block reductions over T threads (a multiple of 32, <= 1024): `scratch` holds T / 32 values.
// Every one ends with __syncthreads() so that its scratch may be reused at once.

template <int T>
DL_DEVICE u64 block_max_u64(u64 v, u64* scratch) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const u64 w = __shfl_xor_sync(0xffffffffu, v, o);
    v = w > v ? w : v;
  }
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  u64 r = scratch[0];
#pragma unroll
  for (int i = 1; i < T / 32; ++i) r = scratch[i] > r ? scratch[i] : r;
  __syncthreads();
  return r;
}

template <int T>
DL_DEVICE double block_sum_f64(double v, double* scratch) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  double r = 0.0;
#pragma unroll
  for (int i = 0; i < T / 32; ++i) r += scratch[i];
  __syncthreads();
  return r;
}

template <int T>
DL_DEVICE int block_sum_int(int v, int* scratch) {
  v = static_cast<int>(__reduce_add_sync(0xffffffffu, static_cast<u32>(v)));
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  int r = 0;
#pragma unroll
  for (int i = 0; i < T / 32; ++i) r += scratch[i];
  __syncthreads();
  return r;
}

// Inclusive prefix sum over a warp's lanes (every lane calls it): lane l gets x of lanes 0..l, for
// l < WIDTH (a power of two; lanes at or past WIDTH get partial sums nobody should read).
template <int WIDTH = 32, typename V>
DL_DEVICE V warp_incl_scan(V x) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int o = 1; o < WIDTH; o <<= 1) {
    const V y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  return x;
}

// Exclusive prefix sum over the block in thread order; *total gets the sum. TAIL_SYNC = false
// leaves out the closing barrier: the caller must pass a block barrier before any thread writes
// scratch again (the next scan's warp totals).
template <int T, bool TAIL_SYNC = true>
DL_DEVICE int block_excl_scan(int v, int* scratch, int* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int x = warp_incl_scan(v);
  if (lane == 31) scratch[warp] = x;
  __syncthreads();
  int before = 0, all = 0;
#pragma unroll
  for (int i = 0; i < T / 32; ++i) {
    const int s = scratch[i];
    before += i < warp ? s : 0;
    all += s;
  }
  if (TAIL_SYNC) __syncthreads();
  *total = all;
  return before + x - v;
}

}  // namespace dl
