// ddtree/stamps.cuh: optional phase timing of ddtree_build. Compiled in only with
// -DDL_DDTREE_STAMPS=1 (tools/ddtree_stamps.py sets it); otherwise DDT_STAMP is empty and the
// kernels are unchanged. Thread 0 of a CTA prints the SM clock (clock64, cycles) at a named
// point: "ddt <request> <row> <point> <arg> <clock>"; the tool turns the lines into per-phase
// cycles (differences within one CTA only: clock64 is per SM).
//
// Part of the one translation unit cu/ddtree.cu (see its header for the kernels).
#pragma once

#if defined(DL_DDTREE_STAMPS) && DL_DDTREE_STAMPS
#define DDT_STAMP(point, arg)                                                                          \
  do {                                                                                                 \
    if (threadIdx.x == 0)                                                                              \
      printf("ddt %d %d %s %d %lld\n", static_cast<int>(blockIdx.y), static_cast<int>(blockIdx.x),    \
             point, static_cast<int>(arg), static_cast<long long>(clock64()));                         \
  } while (0)
#else
#define DDT_STAMP(point, arg) \
  do {                        \
  } while (0)
#endif
