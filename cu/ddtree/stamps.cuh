// ddtree/stamps.cuh: DDT_STAMP(point, arg), the phase stamps of ddtree_build (phase_stamps.cuh;
// tools/ddtree_stamps.py compiles with -DDL_STAMPS=1): thread 0 of a CTA stamps row
// blockIdx.y * gridDim.x + blockIdx.x. Empty, and the kernels unchanged, without the define.
//
// Part of the one translation unit cu/ddtree.cu (see its header for the kernels).
#pragma once
#include "../phase_stamps.cuh"

#if defined(DL_STAMPS) && DL_STAMPS
#define DDT_STAMP(point, arg)                                                                        \
  do {                                                                                               \
    if (threadIdx.x == 0) DL_STAMP(static_cast<int>(blockIdx.y * gridDim.x + blockIdx.x), point, arg); \
  } while (0)
#else
#define DDT_STAMP(point, arg) \
  do {                        \
  } while (0)
#endif
