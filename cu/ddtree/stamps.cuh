// ddtree/stamps.cuh: DDT_STAMP(slot, point, arg), the phase stamps of ddtree_build (phase_stamps.cuh;
// tools/ddtree_stamps.py compiles with -DDL_STAMPS=1): thread 0 of a CTA stamps slot `slot` of row
// blockIdx.y * gridDim.x + build_column() (params.cuh: request 0's warmer is its blockIdx.x 0).
// Slots: merge 0, loaded 1, selected 2, lse 3, sorted 4,
// last 5, lp 6, depth d 6 + d (d <= 15; the one-warp heap stamps `pop` there, every fourth pop up
// to 60, slot 6 + pops / 4), generate 22, searched 23, nodes 24, srchpro 25 (the
// search's prologue), d1count 26 and d1gen 27 (its first depth's count and generation), lsedone 28
// (the row merge's log-sum-exp warp done: DDT_STAMP_BY, its lane 0) and sortdone 29 (thread 0's
// part of the sort done, before the merge's last barrier), entry 30 (ddtree_build's first
// instruction, before its PDL wait: the phase `merge` is then the wait), counted 31 (the row's
// flag, count and threshold returned from L2: the merge's first round trip; its argument the
// count). A row the merge ranks by its histogram (build.cuh, hist_rank) stamps selected past the
// bins' scan (argument -1), lse past the bucket scatter and sortdone past the ranking; a crowded
// row, the select's. The tool orders a CTA's records by their clock. Empty, and the kernels
// unchanged, without the define.
//
// DDT_TK_STAMP(base, slot, point): the top-K kernels' stamps (tools/ddtree_stamps.py --chain):
// thread 0 of a CTA stamps row base + its linear block index, above ddtree_build's rows: the
// sample kernel's CTAs from row DDT_TK_ROW_SAMPLE, the stream's from DDT_TK_ROW_STREAM, the
// chunk kernel's (topk_mode = 0 only) from DDT_TK_ROW_CHUNKS; slots: entry 0, waited 1 (past the
// PDL wait; in the sample kernel, which has no wait: keys, its sampled keys loaded and their
// maximum known; the chunk kernel, an ordinary launch, has none), exit 2;
// the stream's CTAs also tile0 3 (its first tile processed), looped 4 (its last), flushed 5 (the
// warps' staged candidates appended), reduced 6 (past the barrier of the segment's sums) and, with
// -DDL_STAMPS_ROWSEEN (ddtree_stamps.py --rowseen), rowseen 7 (its row's sample exit record seen
// by a poll before the PDL wait); the argument is the CTA's SM (%smid).
//
// Part of the one translation unit cu/ddtree.cu (see its header for the kernels).
#pragma once
#include "../phase_stamps.cuh"

#if defined(DL_STAMPS) && DL_STAMPS
#define DDT_STAMP_BY(tid0, slot, point, arg)                                                        \
  do {                                                                                              \
    if (threadIdx.x == (tid0))                                                                      \
      DL_STAMP(static_cast<int>(blockIdx.y * gridDim.x) + ddt::build_column(), slot, point, arg);  \
  } while (0)
#define DDT_STAMP(slot, point, arg) DDT_STAMP_BY(0, slot, point, arg)
// (the top-K stamps' argument is the SM the CTA runs on: tools/ddtree_stamps.py groups the stream's
// CTAs by how many of them shared an SM)
__device__ __forceinline__ int ddt_smid() {
  unsigned r;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(r));
  return static_cast<int>(r);
}
#define DDT_TK_STAMP(base, slot, point)                                                                  \
  do {                                                                                                   \
    if (threadIdx.x == 0)                                                                                \
      DL_STAMP(static_cast<int>((base) + blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z)), \
               slot, point, ddt_smid());                                                                 \
  } while (0)
#endif
// DDT_TWICE_REPS: how many times ddtree_build runs its merge and its search (and the top-K's sample
// kernel its select), one call site each:
// 2 under tools/ddtree_stamps.py --twice (-DDL_STAMPS=1 -DDL_STAMPS_TWICE=1; the second run's
// stamps are those of warm instruction caches), 1 otherwise.
#if defined(DL_STAMPS_TWICE) && defined(DL_STAMPS) && DL_STAMPS
#define DDT_TWICE_REPS 2
#else
#define DDT_TWICE_REPS 1
#endif
#define DDT_TK_ROW_SAMPLE 256
#define DDT_TK_ROW_STREAM 512
#define DDT_TK_ROW_CHUNKS 4608

// DDT_DETAIL(d, slot, point): with -DDL_STAMPS=1 -DDL_STAMPS_DETAIL=N, the steps inside depth N
// of the parallel search (slots 17-21: count, scan, offs, gen, bstar; the `depth` stamps then stop
// at depth 10). Empty otherwise.
#if defined(DL_STAMPS) && DL_STAMPS && defined(DL_STAMPS_DETAIL)
#define DDT_DETAIL(d, slot, point)                          \
  do {                                                      \
    if ((d) == DL_STAMPS_DETAIL) DDT_STAMP(slot, point, d); \
  } while (0)
#define DDT_DEPTH_STAMPS 10
#else
#define DDT_DETAIL(d, slot, point) \
  do {                             \
  } while (0)
#define DDT_DEPTH_STAMPS DL_MAX_DEPTH  // every depth (those past 15 share slot 21)
#endif

#if !(defined(DL_STAMPS) && DL_STAMPS)
#define DDT_STAMP_BY(tid0, slot, point, arg) \
  do {                                       \
  } while (0)
#define DDT_STAMP(slot, point, arg) \
  do {                              \
  } while (0)
#define DDT_TK_STAMP(base, slot, point) \
  do {                                  \
  } while (0)
#endif
