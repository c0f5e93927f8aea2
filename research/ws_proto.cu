// Feasibility prototype (not shipped): 64-row tile, 4 QK warps (Q latent in registers, rope from
// shared memory, S for 16 rows x N keys, P to shared memory) + 8 PV warps (32 rows x 128 columns
// of O each), one K/V tile per iteration, named barriers between the two warp sets.
#include "common.cuh"
#ifndef NK
#define NK 32
#endif
#ifndef QKREGS
#define QKREGS 176
#endif
#ifndef PVREGS
#define PVREGS 168
#endif
constexpr int ROWB = 1168;
extern "C" __global__ void __launch_bounds__(384, 1)
ws_proto(const bf16* __restrict__ q, float* __restrict__ out, int tiles) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const u32 kbase = dl::smem_u32(smem);                 // 2 stages x NK rows x 1168 B
  const u32 qrope = kbase + 2 * NK * ROWB;              // 64 rows x (64 + 8) bf16
  const u32 pbase = qrope + 64 * 144;                   // 2 x 64 rows x (2 NK + 16) B
  float* scale = reinterpret_cast<float*>(smem + 2 * NK * ROWB + 64 * 144 + 2 * 64 * (2 * NK + 16));
  if (warp < 4) {
#if defined(USE_SETMAXNREG)
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(QKREGS));
#endif
    const int rg = warp;
    u32 qf[32][4];
    const u32* qa = reinterpret_cast<const u32*>(q + (rg * 16 + (lane >> 2)) * 576);
    const u32* qb = reinterpret_cast<const u32*>(q + (rg * 16 + 8 + (lane >> 2)) * 576);
#pragma unroll
    for (int kk = 0; kk < 32; ++kk) {
      const int w = (kk * 16 + 2 * (lane & 3)) / 2;
      qf[kk][0] = __ldg(qa + w); qf[kk][1] = __ldg(qb + w); qf[kk][2] = __ldg(qa + w + 4); qf[kk][3] = __ldg(qb + w + 4);
    }
    float m = -1e30f;
    for (int t = 0; t < tiles; ++t) {
      const u32 kt = kbase + (t & 1) * NK * ROWB;
      float s[NK / 8][4];
#pragma unroll
      for (int n = 0; n < NK / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < 36; ++kk) {
        u32 a[4];
        if (kk < 32) { a[0] = qf[kk][0]; a[1] = qf[kk][1]; a[2] = qf[kk][2]; a[3] = qf[kk][3]; }
        else dl::ldmatrix_x4(a, qrope + (rg * 16 + (lane & 15)) * 144 + ((kk - 32) * 16 + (lane >> 4) * 8) * 2);
#pragma unroll
        for (int np = 0; np < NK / 16; ++np) {
          u32 bk[4];
          dl::ldmatrix_x4(bk, kt + (np * 16 + (lane >> 4) * 8 + (lane & 7)) * ROWB + (kk * 16 + ((lane >> 3) & 1) * 8) * 2);
          dl::mma_bf16_16816(s[2 * np], a, bk[0], bk[1]);
          dl::mma_bf16_16816(s[2 * np + 1], a, bk[2], bk[3]);
        }
      }
      float mx = m;
#pragma unroll
      for (int n = 0; n < NK / 8; ++n) mx = fmaxf(mx, fmaxf(s[n][0], s[n][1]));
      mx = fmaxf(mx, __shfl_xor_sync(~0u, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(~0u, mx, 2));
      unsigned char* pr = smem + (pbase - kbase) + (t & 1) * 64 * (2 * NK + 16) + (rg * 16 + (lane >> 2)) * (2 * NK + 16);
#pragma unroll
      for (int n = 0; n < NK / 8; ++n)
        *reinterpret_cast<u32*>(pr + (n * 8 + 2 * (lane & 3)) * 2) = dl::pack_bf16x2(exp2f(s[n][0] - mx), exp2f(s[n][1] - mx));
      if ((lane & 3) == 0) scale[(t & 1) * 64 + rg * 16 + (lane >> 2)] = exp2f(m - mx);
      m = mx;
      dl::named_barrier(1 + (t & 1), 384);  // P(t) ready (arrive+wait for the prototype)
    }
  } else {
#if defined(USE_SETMAXNREG)
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(PVREGS));
#endif
    const int pw = warp - 4, pair = pw / 4, cq = pw % 4;
    float o[2][16][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int n = 0; n < 16; ++n) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.f;
    for (int t = 0; t < tiles; ++t) {
      dl::named_barrier(1 + (t & 1), 384);
      const u32 kt = kbase + (t & 1) * NK * ROWB;
      u32 pa[2][NK / 16][4];
#pragma unroll
      for (int mt = 0; mt < 2; ++mt) {
        const float sc = scale[(t & 1) * 64 + pair * 32 + mt * 16 + (lane >> 2)];
        const float sc8 = scale[(t & 1) * 64 + pair * 32 + mt * 16 + 8 + (lane >> 2)];
#pragma unroll
        for (int n = 0; n < 16; ++n) { o[mt][n][0] *= sc; o[mt][n][1] *= sc; o[mt][n][2] *= sc8; o[mt][n][3] *= sc8; }
        const u32 pb = pbase + (t & 1) * 64 * (2 * NK + 16) + (pair * 32 + mt * 16 + (lane & 15)) * (2 * NK + 16) + (lane >> 4) * 16;
#pragma unroll
        for (int j = 0; j < NK / 16; ++j) dl::ldmatrix_x4(pa[mt][j], pb + j * 32);
      }
#pragma unroll
      for (int j = 0; j < NK / 16; ++j)
#pragma unroll
        for (int np = 0; np < 8; ++np) {
          u32 v[4];
          dl::ldmatrix_x4_trans(v, kt + (j * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * ROWB + (cq * 128 + np * 16 + (lane >> 4) * 8) * 2);
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            dl::mma_bf16_16816(o[mt][2 * np], pa[mt][j], v[0], v[1]);
            dl::mma_bf16_16816(o[mt][2 * np + 1], pa[mt][j], v[2], v[3]);
          }
        }
    }
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int n = 0; n < 16; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) out[((pw * 2 + mt) * 16 + n) * 128 + e * 32 + lane] = o[mt][n][e];
  }
}
