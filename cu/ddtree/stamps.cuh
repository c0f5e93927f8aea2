// ddtree/stamps.cuh: optional phase timing of ddtree_build. Compiled in only with
// -DDL_DDTREE_STAMPS=1 (tools/ddtree_stamps.py sets it); otherwise DDT_STAMP is empty and the
// kernels are unchanged. Thread 0 of a CTA appends a record at a named point to the CTA's row of
// the module globals ddt_stamps / ddt_stamp_count: the point's name (its first 8 characters), an
// argument, the SM clock (clock64, cycles: compare within one CTA only, it is per SM) and the
// global timer (%globaltimer, ns: comparable across CTAs). The tool zeroes ddt_stamp_count before
// the launch and reads both back. (A device printf here cost ~25 us per point: it measured itself.)
//
// Part of the one translation unit cu/ddtree.cu (see its header for the kernels).
#pragma once

#if defined(DL_DDTREE_STAMPS) && DL_DDTREE_STAMPS
#define DDT_STAMP_CTAS 1024   // CTAs with a row (blockIdx.y * gridDim.x + blockIdx.x); more are not stamped
#define DDT_STAMP_POINTS 32   // records per CTA; later points are dropped

struct DdtStamp {
  unsigned long long name;   // the point's first 8 characters, little-endian
  long long clock;           // clock64()
  unsigned long long gtime;  // %globaltimer, ns
  long long arg;
};

extern "C" {
__device__ DdtStamp ddt_stamps[DDT_STAMP_CTAS][DDT_STAMP_POINTS];
__device__ int ddt_stamp_count[DDT_STAMP_CTAS];
}

__device__ __forceinline__ void ddt_stamp(const char* point, long long arg) {
  if (threadIdx.x != 0) return;
  const long long clk = clock64();
  unsigned long long gt;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(gt));
  const int cta = static_cast<int>(blockIdx.y * gridDim.x + blockIdx.x);
  if (cta >= DDT_STAMP_CTAS) return;
  const int n = ddt_stamp_count[cta];
  if (n >= DDT_STAMP_POINTS) return;
  unsigned long long name = 0;
  for (int i = 0; i < 8 && point[i]; ++i) name |= static_cast<unsigned long long>(static_cast<unsigned char>(point[i])) << (8 * i);
  ddt_stamps[cta][n] = DdtStamp{name, clk, gt, arg};
  ddt_stamp_count[cta] = n + 1;
}
#define DDT_STAMP(point, arg) ddt_stamp(point, static_cast<long long>(arg))
#else
#define DDT_STAMP(point, arg) \
  do {                        \
  } while (0)
#endif
