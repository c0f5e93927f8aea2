// phase_stamps.cuh: optional phase timing of a kernel, for the tools that ask where a launch spends
// its time (tools/ddtree_stamps.py, tools/verify_stamps.py). Compiled in only with -DDL_STAMPS=1;
// otherwise DL_STAMP is empty and the kernels are unchanged.
//
// DL_STAMP(row, point, arg), called by one thread, appends a record to row `row` of the module
// globals dl_stamps / dl_stamp_count: the point's name (its first 8 characters), an argument,
// the SM clock (clock64, cycles: compare within one SM only) and the global timer
// (%globaltimer, ns: comparable across SMs). The caller picks the row (one per CTA, or per CTA and
// role) and makes sure one thread writes a row; the tool zeroes dl_stamp_count before the launch
// and reads both back (cuModuleGetGlobal). A record is one global store (a device printf, the
// first way tried, cost ~25 us per point and measured itself).
#pragma once

#if defined(DL_STAMPS) && DL_STAMPS
#define DL_STAMP_ROWS 2048   // rows; stamps of a higher row are dropped
#define DL_STAMP_POINTS 32   // records per row; later points are dropped

struct DlStamp {
  unsigned long long name;   // the point's first 8 characters, little-endian
  long long clock;           // clock64()
  unsigned long long gtime;  // %globaltimer, ns
  long long arg;
};

extern "C" {
__device__ DlStamp dl_stamps[DL_STAMP_ROWS][DL_STAMP_POINTS];
__device__ int dl_stamp_count[DL_STAMP_ROWS];
}

__device__ __forceinline__ void dl_stamp(int row, const char* point, long long arg) {
  const long long clk = clock64();
  unsigned long long gt;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(gt));
  if (row < 0 || row >= DL_STAMP_ROWS) return;
  const int n = dl_stamp_count[row];
  if (n >= DL_STAMP_POINTS) return;
  unsigned long long name = 0;
  for (int i = 0; i < 8 && point[i]; ++i) name |= static_cast<unsigned long long>(static_cast<unsigned char>(point[i])) << (8 * i);
  dl_stamps[row][n] = DlStamp{name, clk, gt, arg};
  dl_stamp_count[row] = n + 1;
}
#define DL_STAMP(row, point, arg) dl_stamp(row, point, static_cast<long long>(arg))
#else
#define DL_STAMP(row, point, arg) \
  do {                            \
  } while (0)
#endif
