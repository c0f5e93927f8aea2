// phase_stamps.cuh: optional phase timing of a kernel, for the tools that ask where a launch spends
// its time (tools/ddtree_stamps.py, tools/verify_stamps.py). Compiled in only with -DDL_STAMPS=1;
// otherwise DL_STAMP is empty and the kernels are unchanged.
//
// DL_STAMP(row, slot, point, arg), called by one thread, writes record `slot` of row `row` of the
// module global dl_stamps: the point's name (its first 8 characters; 0 = no record), an argument,
// the SM clock (clock64, cycles: compare within one SM only) and the global timer (%globaltimer,
// ns: comparable across SMs). The caller picks the row (one per CTA, or per CTA and role) and a
// fixed slot per point, so a record is one global store and no load (a per-row count read back
// from global memory cost a round trip per point; a device printf, the first way tried, ~25 us).
// The tool zeroes dl_stamps before the launch and reads it back (cuModuleGetGlobal).
#pragma once

#if defined(DL_STAMPS) && DL_STAMPS
#define DL_STAMP_ROWS 8192   // rows; stamps of a higher row are dropped
#define DL_STAMP_POINTS 32   // record slots per row; a stamp of a higher slot is dropped

struct DlStamp {
  unsigned long long name;   // the point's first 8 characters, little-endian
  long long clock;           // clock64()
  unsigned long long gtime;  // %globaltimer, ns
  long long arg;
};

extern "C" {
__device__ DlStamp dl_stamps[DL_STAMP_ROWS][DL_STAMP_POINTS];
}

// The first 8 characters of a string literal as a little-endian word, at compile time (read at
// run time, each stamp made up to 8 dependent loads of the literal from global memory).
constexpr unsigned long long dl_stamp_name(const char* s, int i = 0) {
  return i < 8 && s[i] ? (static_cast<unsigned long long>(static_cast<unsigned char>(s[i])) << (8 * i)) | dl_stamp_name(s, i + 1)
                       : 0ull;
}
template <unsigned long long Name>
struct DlStampName {
  static constexpr unsigned long long value = Name;
};

// The global timer, ns (comparable across SMs): the stamps' gtime, and the stamped diagnostics' clock.
__device__ __forceinline__ unsigned long long dl_globaltimer() {
  unsigned long long gt;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(gt));
  return gt;
}

__device__ __forceinline__ void dl_stamp(int row, int slot, unsigned long long name, long long arg) {
  const long long clk = clock64();
  const unsigned long long gt = dl_globaltimer();
  if (row < 0 || row >= DL_STAMP_ROWS || slot < 0 || slot >= DL_STAMP_POINTS) return;
  dl_stamps[row][slot] = DlStamp{name, clk, gt, arg};
}
#define DL_STAMP(row, slot, point, arg) \
  dl_stamp(row, slot, DlStampName<dl_stamp_name(point)>::value, static_cast<long long>(arg))
#else
#define DL_STAMP(row, slot, point, arg) \
  do {                                  \
  } while (0)
#endif
