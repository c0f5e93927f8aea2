"""How fast can CTAs read one 655 KB logits row from DRAM (cold L2)? (seventy-fourth session probe)

refine_row reads a failed threshold row with one CTA of 512 threads, 8 uint4 loads in flight per
thread (~20 µs on an H100 for 163,840 fp32 logits). This times the bare read: C CTAs split one row
of `n` uint4, U uint4 loads in flight per thread, the L2 flushed before each launch, CuPy events.
Peer tool only (CuPy on the device machine); prints median µs and GB/s per (load, C, U), the
load being __ldcg (refine_each's: LDG.E.128.STRONG.GPU on sm_90), __ldg (the non-coherent path) or
a plain load. The event pair also times the launch: the 15-CTA floor (~4.9 µs on the H100) is
mostly that, not the read.

Measured (seventy-fourth session, H100 80GB HBM3, __ldcg only): 1 CTA 15.2 µs at 8 uint4 in flight
a thread (refine_each's depth), 13.5 at 16; 2 CTAs 9.4; 4 CTAs 6.7; 8 CTAs 5.6; 15 CTAs 4.9.
Seventy-fifth session (H100, the three loads, __ldcg / __ldg / plain, at 8 in flight): 1 CTA 15.1 /
15.3 / 15.4 µs, 4 CTAs 6.8 each, 15 CTAs 4.9 / 4.9 / 5.0: the load path changes nothing.
"""
import cupy as cp
import numpy as np

SRC = r'''
extern "C" __global__ void rd_LOAD(const uint4* __restrict__ row, int n, int U, unsigned* out) {
  const int per = (n + gridDim.x - 1) / gridDim.x;
  const int lo = blockIdx.x * per, hi = min(n, lo + per);
  unsigned acc = 0;
  for (int base = lo; base < hi; base += 16 * blockDim.x) {
    uint4 q[16];
#pragma unroll
    for (int u = 0; u < 16; ++u) {
      const int i = base + u * blockDim.x + threadIdx.x;
      if (u < U && i < hi) q[u] = LOADFN(row + i); else q[u] = make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < 16; ++u) acc ^= q[u].x ^ q[u].y ^ q[u].z ^ q[u].w;
    base += (U - 16) * blockDim.x;
  }
  if (acc == 0x12345678u) out[0] = acc;
}
'''
LOADS = {"ldcg": "__ldcg", "ldg": "__ldg", "plain": "*"}
kernels = {name: cp.RawKernel(SRC.replace("LOADFN", fn).replace("rd_LOAD", "rd_" + name), "rd_" + name)
           for name, fn in LOADS.items()}
n = 163840 * 4 // 16
row = cp.random.standard_normal(163840, dtype=cp.float32)
flush = cp.zeros(200 << 20, dtype=cp.uint8)
out = cp.zeros(4, dtype=cp.uint32)
print(cp.cuda.runtime.getDeviceProperties(0)["name"].decode())
for name, k in kernels.items():
    for C in (1, 2, 4, 8, 15):
        for U in (2, 4, 8, 16):
            ts = []
            for r in range(12):
                flush += 1  # 200 MB written: the row leaves the L2
                a, b = cp.cuda.Event(), cp.cuda.Event()
                a.record()
                k((C,), (512,), (row, np.int32(n), np.int32(U), out))
                b.record()
                b.synchronize()
                ts.append(cp.cuda.get_elapsed_time(a, b) * 1e3)
            t = float(np.median(ts[2:]))
            print(f"{name:5s}  CTAs {C:2d}  uint4 in flight/thread {U:2d}: {t:7.2f} us  {655360 / t / 1e3:7.1f} GB/s")
