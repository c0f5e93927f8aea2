// ddtree/search.cuh: stage 1b, the tree search: the one-warp best-first heap (the reference's heapq
// order) and the block-wide parallel search that reproduces it.
//
// Part of the one translation unit cu/ddtree.cu (see its header for the kernels).
#pragma once
#include "keys.cuh"
#include "stamps.cuh"

namespace ddt {

// ------------------------------------------------------------------------------ heap (one warp)
// Frontier entry = candidate child (parent node p, rank c) at depth dd, packed in 32 bits.

DL_DEVICE u32 pack_meta(int p, int c, int dd) {
  return static_cast<u32>(p) | (static_cast<u32>(c) << 16) | (static_cast<u32>(dd) << 26);
}
DL_DEVICE int meta_p(u32 m) { return static_cast<int>(m & 0xffffu); }
DL_DEVICE int meta_c(u32 m) { return static_cast<int>((m >> 16) & 0x3ffu); }
DL_DEVICE int meta_d(u32 m) { return static_cast<int>(m >> 26); }

struct NodeSmem {
  short* par;
  short* rank;
  u8* dep;
};

// True if candidate a's ranks tuple sorts before b's (a prefix before its extensions). Out of line:
// only equal keys call it, and inlined at each of better()'s call sites its walks made the heap's
// loop ~2,500 SASS instructions; 25 of the heap's 60 stall samples were instruction fetches (no_inst;
// Nsight, twenty-second session). Out of line, the first four pops took 5,910 cycles, not 8,228.
__device__ __noinline__ bool ranks_less(u32 a, u32 b, const NodeSmem& ns) {
  int pa = meta_p(a), ra = meta_c(a), da = meta_d(a);
  int pb = meta_p(b), rb = meta_c(b), db = meta_d(b);
  const int la = da, lb = db;
  while (da > db) { ra = ns.rank[pa]; pa = ns.par[pa]; --da; }
  while (db > da) { rb = ns.rank[pb]; pb = ns.par[pb]; --db; }
  if (pa == pb && ra == rb) return la < lb;
  while (pa != pb) {
    ra = ns.rank[pa]; pa = ns.par[pa];
    rb = ns.rank[pb]; pb = ns.par[pb];
  }
  return ra < rb;
}

// Heap order of the reference: larger key first, then the smaller ranks tuple.
DL_DEVICE bool better(u64 sa, u32 ma, u64 sb, u32 mb, const NodeSmem& ns) {
  return sa > sb || (sa == sb && sa != 0 && ranks_less(ma, mb, ns));
}

// Best entry of the overflow (all lanes; result uniform). Returns its index or -1.
DL_DEVICE int overflow_max(const u64* ovs, const u32* ovm, int ovn, const NodeSmem& ns, u64* os, u32* om) {
  const int lane = threadIdx.x & 31;
  u64 bs = 0;
  u32 bm = 0;
  int bi = -1;
  for (int i = lane; i < ovn; i += 32) {
    const u64 s = ovs[i];
    const u32 m = ovm[i];
    if (bi < 0 || better(s, m, bs, bm, ns)) { bs = s; bm = m; bi = i; }
  }
  const u32 hi = static_cast<u32>(bs >> 32);
  const u32 mh = __reduce_max_sync(FULL, hi);
  const u32 ml = __reduce_max_sync(FULL, hi == mh ? static_cast<u32>(bs) : 0u);
  const u32 tied = __ballot_sync(FULL, bi >= 0 && hi == mh && static_cast<u32>(bs) == ml);
  if (!tied) return -1;
  int w = __ffs(tied) - 1;
  u32 wm = __shfl_sync(FULL, bm, w);
  for (u32 t = tied & (tied - 1); t; t &= t - 1) {
    const int l = __ffs(t) - 1;
    const u32 lm = __shfl_sync(FULL, bm, l);
    if (ranks_less(lm, wm, ns)) { w = l; wm = lm; }
  }
  *os = __shfl_sync(FULL, bs, w);
  *om = wm;
  return __shfl_sync(FULL, bi, w);
}

// Best-first search of one request on warp 0. lp: [D][ks] log-probs in shared memory.
// Records nodes 1..count in ns; returns count (nodes besides the root).
DL_DEVICE int heap_select(const float* lp, int ks, int kb, int D, int budget, u64* ovs, u32* ovm,
                          const NodeSmem& ns) {
  const int lane = threadIdx.x & 31;
  u64 es = 0;  // this lane's frontier entry (lane 0 = best), 0 = empty
  u32 em = 0;
  int size = 0, ovn = 0, oi = -1;
  u64 os = 0;  // the overflow's best entry (valid when ovn > 0)
  u32 om = 0;
  if (budget > 0 && kb > 0 && D > 0) {
    if (lane == 0) { es = enc_key(static_cast<double>(lp[0])); em = pack_meta(0, 0, 1); }
    size = 1;
  }
  int count = 0;
  while (count < budget && size > 0) {
    const u64 s0 = __shfl_sync(FULL, es, 0);
    const u32 m0 = __shfl_sync(FULL, em, 0);
    const int pp = meta_p(m0), c = meta_c(m0), dd = meta_d(m0);
    const int n = count + 1;
    if (lane == 0) { ns.par[n] = static_cast<short>(pp); ns.rank[n] = static_cast<short>(c); ns.dep[n] = static_cast<u8>(dd); }
    const double key = dec_key(s0);
    const float* row = lp + (dd - 1) * ks;
    // Both successors' keys at once, from clamped (in-bounds) ranks and depths, then dropped where
    // they do not exist: two independent chains instead of two branches one after the other.
    const float r0 = row[c], r1 = row[min(c + 1, kb - 1)], rd = lp[min(dd, D - 1) * ks];
    const u64 xk = enc_key(__dadd_rn(__dsub_rn(key, static_cast<double>(r0)), static_cast<double>(r1)));
    const u64 yk = enc_key(__dadd_rn(key, static_cast<double>(rd)));
    u64 xs = n < budget && c + 1 < kb ? xk : 0ull;
    u64 ys = n < budget && dd < D ? yk : 0ull;
    u32 xm = pack_meta(pp, c + 1, dd), ym = pack_meta(n, 0, dd + 1);
    __syncwarp();
    // Entries worse than the overflow's best go to the overflow.
    if (xs && ovn > 0 && better(os, om, xs, xm, ns)) {
      if (lane == 0) { ovs[ovn] = xs; ovm[ovn] = xm; }
      ++ovn;
      xs = 0;
    }
    if (ys && ovn > 0 && better(os, om, ys, ym, ns)) {
      if (lane == 0) { ovs[ovn] = ys; ovm[ovn] = ym; }
      ++ovn;
      ys = 0;
    }
    if (!xs || (ys && better(ys, ym, xs, xm, ns))) {  // X = the better of the two inserted
      const u64 ts = xs; xs = ys; ys = ts;
      const u32 tm = xm; xm = ym; ym = tm;
    }
    const int ins = (xs != 0) + (ys != 0);
    const bool rem = lane >= 1 && lane < size;
    const int qx = __popc(__ballot_sync(FULL, rem && xs && better(es, em, xs, xm, ns)));
    const int qy = __popc(__ballot_sync(FULL, rem && ys && better(es, em, ys, ym, ns))) + 1;
    const int nsize = size - 1 + ins;
    if (nsize > 32) {  // list full and two inserted: the 33rd entry moves to the overflow
      if (qy == 32) {
        if (lane == 0) { ovs[ovn] = ys; ovm[ovn] = ym; }
        os = ys; om = ym;
        ys = 0;
      } else {
        if (lane == 31) { ovs[ovn] = es; ovm[ovn] = em; }
        os = __shfl_sync(FULL, es, 31);
        om = __shfl_sync(FULL, em, 31);
      }
      oi = ovn++;
    }
    const int src = lane + 1 - ((xs && qx < lane) ? 1 : 0) - ((ys && qy < lane) ? 1 : 0);
    u64 s_new = __shfl_sync(FULL, es, src < 32 ? src : 31);
    u32 m_new = __shfl_sync(FULL, em, src < 32 ? src : 31);
    if (src >= size) { s_new = 0; m_new = 0; }
    if (xs && lane == qx) { s_new = xs; m_new = xm; }
    if (ys && lane == qy) { s_new = ys; m_new = ym; }
    es = s_new;
    em = m_new;
    size = nsize < 32 ? nsize : 32;
    __syncwarp();
    if (size < 32 && ovn > 0) {  // refill the list's end from the overflow
      if (lane == size) { es = os; em = om; }
      ++size;
      if (lane == 0) { ovs[oi] = ovs[ovn - 1]; ovm[oi] = ovm[ovn - 1]; }
      --ovn;
      __syncwarp();
      oi = ovn > 0 ? overflow_max(ovs, ovm, ovn, ns, &os, &om) : -1;
    }
    ++count;
    // (phase stamps only: every fourth pop up to 60, in the parallel search's depth slots)
    if ((count & 3) == 0 && count <= 60) DDT_STAMP(6 + count / 4, "pop", count);
  }
  return count;
}

// ------------------------------------------------------------------------------ parallel search
// The best-first search of the reference pops nodes in the order of the heap key. When every
// node's key is at most its generator's (its previous sibling's or its parent's), the pop
// order is simply the order of all candidate nodes by (key desc, ranks tuple asc), so the
// tree is the `budget` best nodes, sorted. The whole CTA finds them depth by depth:
//  * keys: a child's key is parent + lp[0] and a sibling's is key - lp[r-1] + lp[r] (float64,
//    as the reference). While every parent + lp[r] is exact in float64 (checked with TwoSum,
//    nearly always: they are sums of at most 33 float32 values) these equal parent + lp[r],
//    which is monotone in r -- so the keys are exactly the reference's and monotone.
//  * a histogram of -key over SEARCH_BINS linear bins on [-lp[0][0], an upper bound of the
//    budget-th best] gives a bin b* with at least `budget` generated nodes in bins <= b*, so
//    every node of the answer lies in a bin <= b*: only children in bins <= b* are generated
//    (a binary search per parent over its sorted lp row), b* shrinks as nodes are added, and
//    parents past b* have no candidate children. A boundary check (the exact sibling chain
//    past the last child, with a margin for rounding) keeps later siblings out for certain.
//  * at the end the candidates in bins <= b* are bucketed by bin and ranked inside their bin
//    by (key, ranks tuple); rank < budget gives the node index.
// Inexact sums, a sibling past the boundary inside b*, or more than SEARCH_CAP candidates
// after tightening set `fail`, and the caller runs the one-warp heap instead.

struct SearchSmem {
  double key[SEARCH_CAP];
  unsigned short par[SEARCH_CAP];  // candidate index of the parent, NO_NODE = the root
  unsigned short rd[SEARCH_CAP];   // rank | depth << 9
  unsigned short aux[SEARCH_CAP];  // per-parent counts / offsets, compaction map, buckets, node index
  u32 hist[SEARCH_BINS];
  u32 cur[SEARCH_BINS];            // bucket cursors; during generation the list of big parents
  u32 rowtot[SEARCH_BINS / 32];    // search_find_bin's row totals
  double x_lo, x_hi, inv_w;
  int fail, nbig, nlo, nhi;
  int dev;                         // search_bounds: take dev_search (a deep tree of a small budget)
  int dev_emin;                    // dev_search's exactness: the least lowest set bit allowed
  double dev_t0;                   // dev_search's bound: every node of the tree has a key >= it
  double dev_p[DL_MAX_DEPTH + 1];  // dev_search: the chain's prefixes P_0 .. P_D
};

struct SearchBins {
  // The bounds rounded to float32 once: the bin of a key costs one conversion and three float32
  // operations instead of six float64 ones. Float64 runs at 1/64 of float32 on GB202 (sm_120),
  // where the search's bins were ~60% of its float64 work (ncu, sixteenth session).
  float lo, hi, inv;
  DL_DEVICE SearchBins(double x_lo, double x_hi, double inv_w)
      : lo(__double2float_rn(x_lo)), hi(__double2float_rn(x_hi)), inv(__double2float_rn(inv_w)) {}
  // About the largest x that operator() puts at or below bin b: a guess for count_children's
  // float32 probe, which checks its answer exactly (any value, even NaN, gives the same result).
  DL_DEVICE float edge(int b) const {
    return b >= SEARCH_BINS - 1 ? hi : fminf(__fmaf_rn(static_cast<float>(b + 1), __frcp_rn(inv), lo), hi);
  }
  // Monotone (non-decreasing) in x = -key, the one property the search relies on (the bins only
  // ever meet b* and each other, and the exact keys rank inside a bin); SEARCH_BINS = past the
  // upper bound. Every step is monotone: the rounding of x to float32 (so x <= x_hi keeps it at or
  // below hi: no node inside the bound is dropped; one just past it can land in the last bin,
  // which costs a candidate, never a node), the subtraction of a constant, the product with a
  // constant >= 0 (+inf when hi - lo is below float32's range: every x in (lo, hi] in the last
  // bin) and the truncation. x_hi past FLT_MAX (a row floored to -FLT_MAX at rank kb - 1, e.g. a
  // drafter row with fewer than K finite logits) rounds hi to +inf: nothing is past the bound,
  // every key at most the last bin, still monotone. Float32 resolves x to ~6e-8 of its size: where
  // a bin is narrower than that (hi - lo below ~3e-5 of hi) neighbouring bins merge, which costs
  // candidates (at worst SEARCH_CAP's fallback to the heap), never a wrong node.
  // Branch-free. It gives the bin of the three cases it replaced (xf <= lo or NaN: 0; xf > hi:
  // SEARCH_BINS; else min(trunc((xf - lo) * inv), SEARCH_BINS - 1)) wherever inv is the bounds' own
  // (SEARCH_BINS / (hi - lo) rounded, or 0 when hi <= lo): t <= 0 or NaN (xf at or below lo, also
  // with inv = +inf) clamps to 0, fmaxf returning the number, and t past SEARCH_BINS - 1 clamps to
  // it (a model of both on 300,000 such bounds and keys: no difference; twenty-second session).
  // For any bounds it stays monotone and within 0..SEARCH_BINS. With its branches, inlined at ~40
  // call sites, it was ~1,290 SASS instructions.
  DL_DEVICE int operator()(double x) const {
    const float xf = __double2float_rn(x);
    const float t = fminf(fmaxf(__fmul_rn(__fsub_rn(xf, lo), inv), 0.f), static_cast<float>(SEARCH_BINS - 1));
    return xf > hi ? SEARCH_BINS : static_cast<int>(t);
  }
};

// The bounds of the keys and the sign check, found by warp 0 while the CTA loads the log-probs
// (build_tree) instead of by thread 0 alone after it: lane d loads row d's first and kb-th
// log-probs from global memory with the rows (search_ends; nothing waits on them until the
// load's own barrier), and shuffles reduce them (search_bounds), so the load's barrier publishes
// the bounds and the search starts with no serial loop over the rows and no barrier of its own.
static_assert(DL_MAX_DEPTH <= 32, "search_ends: one row per lane of a warp");

// search_bounds' switch to the one-warp heap: requests of budget <= DL_SEARCH_HEAP_BUDGET whose
// tree may be deeper than DL_SEARCH_HEAP_DEPTH (measured on the H200, twenty-first session).
#ifndef DL_SEARCH_HEAP_DEPTH
#define DL_SEARCH_HEAP_DEPTH 3
#endif
#ifndef DL_SEARCH_HEAP_BUDGET
#define DL_SEARCH_HEAP_BUDGET 16
#endif
// 1: those requests take dev_search (the deviation search, fortieth session), the heap only where
// it cannot decide; 0: the heap, as before it (A/B and tests).
#ifndef DL_DEV_SEARCH
#define DL_DEV_SEARCH 1
#endif

struct SearchEnds {
  float first = 0.f, last = 0.f;  // lane d < D: lp[d][0], lp[d][kb - 1]
  float row0 = 0.f;               // lane r < kb: lp[0][r] (dev_search's bound)
};

// Warp 0, before the log-probs' load: issues the loads of the rows' ends (__ldcg: other CTAs
// wrote them). glp: the request's [D][ks] log-probs in global memory.
DL_DEVICE SearchEnds search_ends(const float* glp, int ks, int kb, int D) {
  const int d = threadIdx.x & 31;
  SearchEnds e;
  if (kb > 0 && d < D) {
    e.first = __ldcg(glp + d * ks);
    e.last = __ldcg(glp + d * ks + kb - 1);
  }
  if (kb <= DL_SEARCH_HEAP_BUDGET && d < kb) e.row0 = __ldcg(glp + d);  // (dev_search's requests only)
  return e;
}

// Warp 0, after the load (kb, n >= 1): s.x_lo, x_hi, inv_w and fail for parallel_search, which
// reads them after the load's barrier. The values are those of the serial loops they replace,
// except the order of the sum in x_hi (see below).
DL_DEVICE void search_bounds(const SearchEnds& e, int kb, int D, int n, SearchSmem& s) {
  const int lane = threadIdx.x & 31;
  const double lo = -static_cast<double>(__shfl_sync(FULL, e.first, 0));  // lp[0][0]
  double hi;
  if (kb == n) {
    hi = -static_cast<double>(__shfl_sync(FULL, e.last, 0));  // lp[0][n - 1]: n depth-1 nodes are at least this good
  } else {
    // every node: the sum of the worst log-probs, with room for rounding. Summed as a tree
    // over the lanes, not row by row: a sum of D <= 32 terms of one sign (every log-prob <= 0
    // unless fail is set below) is within D * 2^-53 relative of the exact sum in any order, far
    // inside the 2^-30 margin.
    hi = lane < D ? -static_cast<double>(e.last) : 0.0;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) hi += __shfl_xor_sync(FULL, hi, o);
    hi = hi * (1.0 + 0x1p-30) + 0x1p-60;
  }
  // Keys are monotone (the precondition of parallel_search) only where no log-prob is positive;
  // the rows are sorted, so their first entries decide. A positive one (a log-sum-exp that
  // rounded below its row maximum) sends the request to the exact heap instead.
  const u32 pos = __ballot_sync(FULL, lane < D && e.first > 0.f);
  // A bound on the tree's depth (kb == n): the n depth-1 nodes of ranks 0 .. n - 1 have keys
  // >= lp[0][n - 1] = -hi, so no node with a smaller key is in the tree, and the chain (rank 0
  // at every depth) is the best node of its depth: the tree is at most as deep as the chain
  // stays >= -hi. Deeper than DL_SEARCH_HEAP_DEPTH, a request of a small budget takes the
  // one-warp heap: its cost grows with the pops, not with the depth, and the parallel search's
  // depths cost ~2 µs each on the H200 whatever their size (mostly latency). On bench_ddtree's
  // deep trees (peaked / jittered rows, 10 depths) the build with the heap took 38.0 / 36.7 µs at
  // batch 1, budget 16, against 52.0 / 52.3 with the parallel search; at budget 256 the heap's
  // overflow list makes it 3.6-7x slower (251-593 µs against 70-84), so larger budgets keep the
  // parallel search. Stars (bound 1-2) keep it too: one depth. Rounding in the prefix sums can
  // move the bound by one: a choice of path, never of result (both searches are exact).
  // With DL_DEV_SEARCH these requests take dev_search first (s.dev), the heap only where it
  // hands them on.
  bool deep = false;
  if (kb == n && n <= DL_SEARCH_HEAP_BUDGET) {
    double c = lane < D ? static_cast<double>(e.first) : 0.0;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const double y = __shfl_up_sync(FULL, c, o);
      if (lane >= o) c += y;
    }
    deep = __popc(__ballot_sync(FULL, lane < D && -c <= hi)) > DL_SEARCH_HEAP_DEPTH;
    if (DL_DEV_SEARCH) {  // (uniform) dev_search's prefixes, exactness bound and bins
      if (lane < D) s.dev_p[lane + 1] = c;
      // max |lp| of the rows (sorted, every entry <= 0 unless pos): their ends; (D + 4) * max < 2^E
      const u32 mb = __reduce_max_sync(FULL, lane < D ? max(__float_as_uint(e.first), __float_as_uint(e.last)) & 0x7fffffffu : 0u);
      // T0 = the n-th best key of the chain's first m nodes (P_m) and the depth-1 nodes of ranks
      // 1 .. n - m (lp[0][n - m]), the best m: n nodes, so the tree's n-th key is >= T0 (lane m - 1)
      const float r0 = __shfl_sync(FULL, e.row0, min(max(n - 1 - lane, 0), 31));  // lp[0][n - m]
      double t0 = lane < min(D, n) ? (lane + 1 == n ? c : fmin(c, static_cast<double>(r0))) : __longlong_as_double(static_cast<long long>(0xfff0000000000000ull));  // (-inf)
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) t0 = fmax(t0, __shfl_xor_sync(FULL, t0, o));
      if (lane == 0) {
        int E = 0;
        frexp(static_cast<double>(D + 4) * static_cast<double>(__uint_as_float(mb)), &E);
        s.dev_p[0] = 0.0;
        s.dev_emin = E - 53;
        s.dev_t0 = t0;
        s.nbig = 0;  // (dev_search's count of gathered nodes)
      }
    }
  }
  if (lane == 0) {
    s.x_lo = lo;
    s.x_hi = hi;
    s.inv_w = hi > lo ? static_cast<double>(SEARCH_BINS) / (hi - lo) : 0.0;
    s.fail = pos != 0u || (deep && !DL_DEV_SEARCH);
    s.dev = DL_DEV_SEARCH && deep && pos == 0u;
  }
}

DL_DEVICE bool sum_exact(double a, double b, double s) {  // s = fl(a + b): is it exact? (TwoSum)
  const double bb = __dsub_rn(s, a);
  const double err = __dadd_rn(__dsub_rn(a, __dsub_rn(s, bb)), __dsub_rn(b, bb));
  return err == 0.0;
}

// CTA-wide (every thread, after a barrier that orders the histogram's adds): the smallest b with
// hist[0..b] >= need (SEARCH_BINS - 1 when the total is less), the same in every thread. Warp w
// sums row w of the SEARCH_BINS / 32 rows of 32 bins (lane l reads bin w * 32 + l: no bank
// conflict) into rowtot[w]; past a barrier every warp scans the row totals to find the row and
// scans that row to find the bin. Before, each of the 16 warps reduced all 16 rows itself
// (256 warp reductions on one SM for one b*): ~1,100-1,600 cycles per depth in the stamps
// (twenty-third session), now one reduction per warp and a barrier.
DL_DEVICE int search_find_bin(const u32* hist, int need, u32* rowtot) {
  static_assert(BUILD_THREADS == SEARCH_BINS, "one warp per row of 32 bins");
  constexpr int ROWS = SEARCH_BINS / 32;
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  const u32 want = static_cast<u32>(need);
  const u32 t = __reduce_add_sync(FULL, hist[w * 32 + lane]);
  if (lane == 0) rowtot[w] = t;
  __syncthreads();
  const u32 rt = lane < ROWS ? rowtot[lane] : 0u;
  const u32 run = dl::warp_incl_scan<ROWS>(rt);  // inclusive prefix of the row totals
  const u32 rows = __ballot_sync(FULL, lane < ROWS && run >= want);
  if (rows == 0u) return SEARCH_BINS - 1;  // (uniform)
  const int row = __ffs(rows) - 1;
  const u32 before = __shfl_sync(FULL, run - rt, row);
  const u32 incl = dl::warp_incl_scan(hist[row * 32 + lane]);
  return row * 32 + __ffs(__ballot_sync(FULL, before + incl >= want)) - 1;
}

// sibling_back_in's margin: a bound on how far rounding can move a key of this parent's children.
DL_DEVICE double sibling_margin(double kp, const float* row, int kb) {
  return (fabs(kp) + fabs(static_cast<double>(row[kb - 1]))) * 0x1p-40;
}

// Past the children [0, lo) of a parent with key kp (lo < kb): walks the exact sibling chain
// while rounding could still bring a key back in; true when a later sibling qualifies after all.
DL_DEVICE bool sibling_back_in(double kp, const float* row, int kb, int lo, int bstar, const SearchBins& bins) {
  const double margin = sibling_margin(kp, row, kb);
  double k = __dadd_rn(kp, static_cast<double>(row[lo]));
  int r = lo;
  while (bins(-__dadd_rn(k, margin)) <= bstar) {
    if (++r >= kb) break;
    k = __dadd_rn(__dsub_rn(k, static_cast<double>(row[r - 1])), static_cast<double>(row[r]));
    if (bins(-k) <= bstar) return true;
  }
  return false;
}

// The exact prefix length: the ranks in [lo, hi) that qualify (bins(-(kp + row[r])) <= bstar)
// are a prefix of it (the row is sorted and bins monotone); binary search.
DL_DEVICE int count_children_exact(double kp, const float* row, int lo, int hi, int bstar, const SearchBins& bins) {
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (bins(-__dadd_rn(kp, static_cast<double>(row[mid]))) <= bstar) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// Children of a parent with key kp at the row `row` (ranks < kb) whose bins are <= bstar: a
// prefix of the ranks. Sets *fail when a later sibling might still qualify. `edge` =
// bins.edge(bstar). The prefix's end is guessed by a float32 binary search for row[r] >= -kp -
// edge (a shared-memory load and one compare per step, instead of a float64 sum and a bin), and
// the guess g is checked exactly at ranks g - 1 and g (two independent sums): nearly always right;
// otherwise the exact binary search runs on the side that holds the end. So the result is the
// exact search's whatever the guess.
DL_DEVICE int count_children(double kp, const float* row, int kb, int bstar, const SearchBins& bins, float edge,
                             int* fail) {
  const float t = __fsub_rn(__double2float_rn(-kp), edge);
  int g = 0;  // ranks with row[r] >= t (row sorted descending): a lower bound in predicated steps
  for (int step = kb > 0 ? 1 << (31 - __clz(kb)) : 0; step > 0; step >>= 1)
    if (g + step <= kb && row[g + step - 1] >= t) g += step;
#ifdef DL_SEARCH_GUESS_SKEW  // (tests only: a guess off by this many ranks must change no result)
  g = min(max(g + (DL_SEARCH_GUESS_SKEW), 0), kb);
#endif
  // The checks at g - 1 and g, and sibling_back_in's first test at g, as independent chains from
  // clamped (in-bounds) ranks, combined without short-circuit branches: before, each waited on
  // the one before it.
  const float rb = row[max(g - 1, 0)], ra = row[min(g, kb - 1)];  // (kb >= 1)
  const double ka = __dadd_rn(kp, static_cast<double>(ra));
  const bool before = (g == 0) | (bins(-__dadd_rn(kp, static_cast<double>(rb))) <= bstar);
  const bool at = (g < kb) & (bins(-ka) <= bstar);
  const bool near = (g < kb) & (bins(-__dadd_rn(ka, sibling_margin(kp, row, kb))) <= bstar);
  int lo = g;
  if (!before) lo = count_children_exact(kp, row, 0, g - 1, bstar, bins);
  else if (at) lo = count_children_exact(kp, row, g + 1, kb, bstar, bins);
  // sibling_back_in(lo) with lo == g starts with exactly the test `near`: where that fails it
  // returns false at once, so the call is skipped (the same result, the common case).
  if (lo < kb && (lo != g || near) && sibling_back_in(kp, row, kb, lo, bstar, bins)) *fail = 1;
  return lo;
}

// count_children by a whole warp (all lanes; the same count and *fail on each): the qualifying
// ranks are a prefix (the row is sorted and bins monotone), so probing 32 evenly spaced ranks of
// the open interval at once and keeping the gap after the last qualifying probe finds the same
// prefix length as the binary search in 2 rounds at kb <= 1024 (one per 32x) instead of
// log2(kb) dependent ones.
DL_DEVICE int count_children_warp(double kp, const float* row, int kb, int bstar, const SearchBins& bins, int* fail) {
  const int lane = threadIdx.x & 31;
  int lo = 0, hi = kb;  // ranks < lo qualify, ranks >= hi do not
  while (lo < hi) {     // (uniform)
    const int step = (hi - lo + 31) >> 5;
    const int r = lo + lane * step;
    const bool in = r < hi && bins(-__dadd_rn(kp, static_cast<double>(row[r]))) <= bstar;
    const int t = __popc(__ballot_sync(FULL, in));  // qualifying probes: lanes 0 .. t - 1
    if (t == 0) {
      hi = lo;
    } else {
      hi = min(hi, lo + t * step);  // lane t's rank does not qualify (or lies past hi)
      lo += (t - 1) * step + 1;     // lane t - 1's does
    }
  }
  if (lo < kb && sibling_back_in(kp, row, kb, lo, bstar, bins)) *fail = 1;
  return lo;
}

// True if candidate a's ranks tuple sorts before b's (a prefix before its extensions); a != b.
// (Inline: out of line, its call sites in the ranking's loop cost 0.35-2.4 µs at budget 256 on
// deep trees, H200, twenty-second session.)
DL_DEVICE bool cand_ranks_less(int a, int b, const SearchSmem& s) {
  int x = a, y = b;
  int dx = s.rd[a] >> 9, dy = s.rd[b] >> 9;
  while (dx > dy) { x = s.par[x]; --dx; }
  while (dy > dx) { y = s.par[y]; --dy; }
  if (x == y) return (s.rd[a] >> 9) < (s.rd[b] >> 9);
  while (s.par[x] != s.par[y]) { x = s.par[x]; y = s.par[y]; }
  return (s.rd[x] & 511) < (s.rd[y] & 511);
}

// The candidates of bucket [st, en) whose key equals kx (x's) and whose ranks tuple sorts before
// x's: the ranking's rare second pass. Out of line: inlined into the ranking's three unrolled copies
// the ranks-tuple walks were ~780 SASS instructions, and the first pass (a compare and an add per
// candidate) stays short.
__device__ __noinline__ int rank_ties(int x, double kx, int st, int en, const SearchSmem& s) {
  int n = 0;
  for (int q = st; q < en; ++q) {
    const int y = s.aux[q];
    if (y != x && s.key[y] == kx && cand_ranks_less(y, x, s)) ++n;
  }
  return n;
}

// Counts of the children of the parents [seg_lo, seg_lo + P) (d == 1: the root alone) under
// bstar; thread t owns parents t*E .. t*E+E-1 (E = ceil(P / T)). Returns this thread's sum.
DL_DEVICE int search_counts(const SearchSmem& s, const float* row, int d, int P, int seg_lo, int kb, int bstar,
                            const SearchBins& bins, int (&cnt)[SEARCH_PER], int* fail) {
  const int E = (P + BUILD_THREADS - 1) / BUILD_THREADS;
  const float edge = bins.edge(bstar);
  int own = 0;
#pragma unroll
  for (int e = 0; e < SEARCH_PER; ++e) {
    const int i = threadIdx.x * E + e;
    int c = 0;
    if (e < E && i < P) {
      const double kp = d == 1 ? 0.0 : s.key[seg_lo + i];
      if (d == 1 || bins(-kp) <= bstar) c = count_children(kp, row, kb, bstar, bins, edge, fail);
    }
    cnt[e] = c;
    own += c;
  }
  return own;
}

// The parallel search (every thread of the CTA). lp: [D][ks] in shared memory, kb ranks per
// depth, n nodes wanted (n, kb, D >= 1); s.x_lo, x_hi, inv_w and fail from search_bounds, before
// a block barrier. Fills ns for nodes 1..count and returns count, or -1 when the caller must run
// heap_select instead.
DL_DEVICE int parallel_search(const float* lp, int ks, int kb, int D, int n, SearchSmem& s, int* scratch,
                              const NodeSmem& ns) {
  constexpr int T = BUILD_THREADS;
  static_assert(T == SEARCH_BINS, "the bucket scan gives one bin to each thread");
  const int tid = threadIdx.x;
  // (ordered before the first histogram add by the first depth's barrier)
  for (int i = tid; i < SEARCH_BINS; i += T) s.hist[i] = 0u;
  DDT_STAMP(25, "srchpro", 0);  // the histogram cleared (the bounds: search_bounds, during "lp")
  if (s.fail) return -1;  // (uniform)
  const SearchBins bins(s.x_lo, s.x_hi, s.inv_w);
  // Block-uniform, in every thread's registers: the candidates stored (cn), the last depth's
  // segment [seg_lo, seg_hi), b*, and whether the search failed. A failure is OR-ed into the
  // barriers (__syncthreads_or), so every thread leaves the loop at the same point; b* is found
  // by every warp from the same histogram.
  int cn = 0, seg_lo = 0, seg_hi = 0, bstar = SEARCH_BINS - 1;
  bool failed = false;
  for (int d = 1; d <= D; ++d) {
    int P = d == 1 ? 1 : seg_hi - seg_lo;
    if (P == 0) break;
    const float* row = lp + (d - 1) * ks;
    int fail = 0;
    int cnt[SEARCH_PER];
    int own, M, base;
    if (tid == 0) { s.nbig = 0; s.nlo = 0; s.nhi = 0; }  // (before the scan's barrier)
    if (d == 1) {
      // The root alone: every warp counts its children (the same count in every thread), so no
      // scan is needed; thread 0 owns them, as search_counts would give it.
      int f = 0;
      M = count_children_warp(0.0, row, kb, bstar, bins, &f);
#pragma unroll
      for (int e = 0; e < SEARCH_PER; ++e) cnt[e] = tid == 0 && e == 0 ? M : 0;
      own = tid == 0 ? M : 0;
      base = tid == 0 ? 0 : M;
      fail = tid == 0 ? f : 0;
    } else {
      own = search_counts(s, row, d, P, seg_lo, kb, bstar, bins, cnt, &fail);
      DDT_DETAIL(d, 17, "count");  // (thread 0's own parents)
      // (no closing barrier: the offsets' barrier below comes before scratch is written again)
      base = dl::block_excl_scan<T, false>(own, scratch, &M);
      DDT_DETAIL(d, 18, "scan");
    }
    if (d == 1) DDT_STAMP(26, "d1count", M);  // the root's children counted
    bool add_hist = true;
    // (never at d == 1, which has no scan's barrier before it: cn = 0, M <= kb <= MAX_K)
    static_assert(MAX_K <= SEARCH_CAP, "the first depth's children fit");
    if (cn + M > SEARCH_CAP) {
      // Too many: count them all into the histogram first (tightening b*), drop the stored
      // candidates past the new b*, and count again.
      const int E = (P + T - 1) / T;
#pragma unroll
      for (int e = 0; e < SEARCH_PER; ++e) {
        const int i = tid * E + e;
        if (e < E && i < P && cnt[e] > 0) {
          const double kp = d == 1 ? 0.0 : s.key[seg_lo + i];
          if (cnt[e] > 32) {  // a warp adds the big ones below
            const int q = atomicAdd(&s.nbig, 1);
            if (q < SEARCH_BINS) { s.cur[q] = static_cast<u32>(i); s.aux[i] = static_cast<unsigned short>(cnt[e]); }
            else fail = 1;
          } else {
            for (int r = 0; r < cnt[e]; ++r) {
              const double a = row[r], k = __dadd_rn(kp, a);
              if (!sum_exact(kp, a, k)) fail = 1;
              atomicAdd(&s.hist[min(bins(-k), SEARCH_BINS - 1)], 1u);
            }
          }
        }
      }
      __syncthreads();
      const int nbig = min(s.nbig, SEARCH_BINS);
      for (int q = tid >> 5; q < nbig; q += T / 32) {
        const int i = static_cast<int>(s.cur[q]);
        const int c = s.aux[i];
        const double kp = d == 1 ? 0.0 : s.key[seg_lo + i];
        for (int r = tid & 31; r < c; r += 32) {
          const double a = row[r], k = __dadd_rn(kp, a);
          if (!sum_exact(kp, a, k)) fail = 1;
          atomicAdd(&s.hist[min(bins(-k), SEARCH_BINS - 1)], 1u);
        }
      }
      __syncthreads();
      bstar = search_find_bin(s.hist, n, s.rowtot);
      // compaction of the stored candidates (order kept; parents are never dropped before a child)
      const int E2 = (cn + T - 1) / T;
      double kk[SEARCH_PER];
      int pr[SEARCH_PER], rr[SEARCH_PER];
      int kept = 0, below_lo = 0, below_hi = 0;
#pragma unroll
      for (int e = 0; e < SEARCH_PER; ++e) {
        const int i = tid * E2 + e;
        pr[e] = -1;
        if (e < E2 && i < cn) {
          kk[e] = s.key[i];
          if (bins(-kk[e]) <= bstar) {
            pr[e] = s.par[i];
            rr[e] = s.rd[i];
            ++kept;
            below_lo += i < seg_lo;
            below_hi += i < seg_hi;
          }
        }
      }
      if (below_lo) atomicAdd(&s.nlo, below_lo);
      if (below_hi) atomicAdd(&s.nhi, below_hi);
      int total_kept;
      int nb = dl::block_excl_scan<T>(kept, scratch, &total_kept);
#pragma unroll
      for (int e = 0; e < SEARCH_PER; ++e) {
        const int i = tid * E2 + e;
        if (e < E2 && i < cn) s.aux[i] = pr[e] >= 0 ? static_cast<unsigned short>(nb++) : NO_NODE;
      }
      __syncthreads();
#pragma unroll
      for (int e = 0; e < SEARCH_PER; ++e)
        if (pr[e] >= 0 && pr[e] != NO_NODE) pr[e] = s.aux[pr[e]];
      __syncthreads();
#pragma unroll
      for (int e = 0; e < SEARCH_PER; ++e) {
        const int i = tid * E2 + e;
        if (e < E2 && i < cn && pr[e] >= 0) {
          const int j = s.aux[i];
          s.key[j] = kk[e];
          s.par[j] = static_cast<unsigned short>(pr[e]);
          s.rd[j] = static_cast<unsigned short>(rr[e]);
        }
      }
      cn = total_kept;
      seg_lo = s.nlo;
      P = d == 1 ? 1 : s.nhi - seg_lo;
      __syncthreads();
      own = search_counts(s, row, d, P, seg_lo, kb, bstar, bins, cnt, &fail);
      base = dl::block_excl_scan<T, false>(own, scratch, &M);
      if (cn + M > SEARCH_CAP) fail = 1;
      add_hist = false;
    }
    {  // exclusive offsets of the parents' children
      const int E = (P + T - 1) / T;
      int off = base;
#pragma unroll
      for (int e = 0; e < SEARCH_PER; ++e) {
        const int i = tid * E + e;
        if (e < E && i < P) {
          s.aux[i] = static_cast<unsigned short>(min(off, 0xffff));
          off += cnt[e];
        }
      }
    }
    if (__syncthreads_or(fail)) {
      failed = true;
      break;
    }
    DDT_DETAIL(d, 19, "offs");
    for (int j = tid; j < M; j += T) {
      int lo = 0, hi = P;  // the last parent whose offset is <= j
      while (hi - lo > 1) {
        const int mid = (lo + hi) >> 1;
        if (s.aux[mid] <= j) lo = mid;
        else hi = mid;
      }
      const int r = j - s.aux[lo];
      const int pc = d == 1 ? NO_NODE : seg_lo + lo;
      const double kp = d == 1 ? 0.0 : s.key[pc];
      const double a = row[r], k = __dadd_rn(kp, a);
      if (!sum_exact(kp, a, k)) fail = 1;
      const int dst = cn + j;
      s.key[dst] = k;
      s.par[dst] = static_cast<unsigned short>(pc);
      s.rd[dst] = static_cast<unsigned short>(r | (d << 9));
      if (add_hist) atomicAdd(&s.hist[bins(-k)], 1u);
    }
    failed = __syncthreads_or(fail);
    DDT_DETAIL(d, 20, "gen");
    if (d == 1) DDT_STAMP(27, "d1gen", M);  // the root's children stored, their histogram built
    // (no barrier after b*: the next depth writes the histogram only after its scan's barrier)
    bstar = search_find_bin(s.hist, n, s.rowtot);
    DDT_DETAIL(d, 21, "bstar");
    seg_lo = cn;
    seg_hi = cn + M;
    cn += M;
    if (d <= DDT_DEPTH_STAMPS) DDT_STAMP(6 + min(d, 15), "depth", d);
    if (failed || M == 0) break;
  }
  if (failed) return -1;
  // ---- rank the candidates in bins <= b*: bucket by bin, then count the better ones in the bin
  DDT_STAMP(22, "generate", cn);  // (names: at most 8 characters)
  const u32 h = tid <= bstar ? s.hist[tid] : 0u;
  int total;
  const int start = dl::block_excl_scan<T>(static_cast<int>(h), scratch, &total);
  s.cur[tid] = static_cast<u32>(start);
  __syncthreads();
  for (int i = tid; i < cn; i += T) {
    const int b = bins(-s.key[i]);
    if (b <= bstar) s.aux[atomicAdd(&s.cur[b], 1u)] = static_cast<unsigned short>(i);
  }
  __syncthreads();
  int xs[SEARCH_PER], rk[SEARCH_PER];
#pragma unroll
  for (int e = 0; e < SEARCH_PER; ++e) {
    const int slot = tid + e * T;
    xs[e] = -1;
    rk[e] = n;
    if (slot < total) {
      const int x = s.aux[slot];
      const double kx = s.key[x];
      const int b = bins(-kx);
      const int en = static_cast<int>(s.cur[b]), st = en - static_cast<int>(s.hist[b]);
      // rank = the bins before b + the candidates of bin b better than x: larger keys counted by a
      // compare and an add; an equal key of a sibling (same parent: cand_ranks_less compares their
      // last ranks only) by its rank, inline and without a branch (bf16 rows tie often, and a
      // star's candidates are all siblings); an equal key of a non-sibling is only noted: it needs
      // the ranks tuples, which rank_ties compares (every tie then, siblings included).
      int rank = st, sib = 0;
      bool tie = false;
      const int px = s.par[x], rx = s.rd[x] & 511;
      for (int q = st; q < en; ++q) {
        const int y = s.aux[q];
        const double ky = s.key[y];
        const int py = s.par[y], ry = s.rd[y] & 511;  // (loaded for every y: no branch in the loop)
        rank += ky > kx;
        const bool eq = (ky == kx) & (y != x), sibling = py == px;
        sib += eq & sibling & (ry < rx);
        tie |= eq & !sibling;
      }
      rank += tie ? rank_ties(x, kx, st, en, s) : sib;
      xs[e] = x;
      rk[e] = rank;
    }
  }
  __syncthreads();
#pragma unroll
  for (int e = 0; e < SEARCH_PER; ++e)
    if (xs[e] >= 0 && rk[e] < n) s.aux[xs[e]] = static_cast<unsigned short>(rk[e] + 1);
  __syncthreads();
#pragma unroll
  for (int e = 0; e < SEARCH_PER; ++e) {
    if (xs[e] >= 0 && rk[e] < n) {
      const int i = rk[e] + 1, x = xs[e];
      const int pp = s.par[x];
      ns.par[i] = static_cast<short>(pp == NO_NODE ? 0 : s.aux[pp]);
      ns.rank[i] = static_cast<short>(s.rd[x] & 511);
      ns.dep[i] = static_cast<u8>(s.rd[x] >> 9);
    }
  }
  __syncthreads();
  return min(n, total);
}

// ------------------------------------------------------------------------------ deviation search
// The search of search_bounds' deep requests of a small budget (s.dev: n = kb <= 16), in a few
// CTA-wide phases instead of the heap's n dependent pops (fortieth session; its numpy twin, step
// for step: research/probes/dev_search_twin.py). DDTree's rows are per depth, so a node (r_1 ..
// r_L) has the key P_L - the sum of its penalties lp[d][0] - lp[d][r_d] at its deviations (the
// depths where r_d > 0), P_L the chain's prefix (rank 0 at every depth). Deep trees of a small
// budget hold nodes of one or two deviations (bench_ddtree's jittered rows: two in ~11% of the
// requests at budget 16):
//  0. Exactness, once for the request: every key and every quantity below is a signed sum of at
//     most D + 4 of the log-probs lp[d][r] (d < D, r < n), all multiples of 2^e_min (the lowest
//     set bit of any of them), so while (D + 4) * max |lp| < 2^(53 + e_min) each is exact in
//     float64 -- and the reference's float64 keys (its sums in its order) are the same exact
//     sums. Else the heap. (The rows' log-probs are differences of float32 numbers of the size of
//     the log-sum-exp: multiples of ~2^-20, so the check holds but for extreme rows.)
//     search_bounds finds max |lp| (the rows' ends) and the chain's prefixes with warp 0 during
//     the log-probs' load; each thread checks the lowest set bit of its own log-prob in step 1.
//  1. The nodes of at most one deviation: the chain nodes c_L (key P_L) and (j, r, L), rank r >= 1
//     at depth j < L, rank 0 at every other depth up to L (key P_L - (lp[j][0] - lp[j][r])), with
//     keys >= T0 are gathered (more than DEV_CAP: the heap). T0 (search_bounds) is the n-th best
//     key of the chain's first m nodes and the depth-1 nodes of ranks 1 .. n - m, for the best m:
//     n nodes, so the tree's n-th key is >= T0 (bench_ddtree's rows at budget 16: 16-117 nodes
//     gathered; a histogram first, dev-search.patch, measured 1.9 µs on its own).
//  2. They are ranked by (key desc, ranks tuple asc), the heap's order (dev_tb). T1 = the key of
//     rank n - 1: the tree's n-th key is >= T1 (these nodes are some of all), and every node of
//     one deviation with a key >= T1 >= T0 was gathered.
//  3. A node of two deviations (j1, r1), (j2, r2) at length L has the key of (j1, r1, L) minus
//     lp[j2][0] - lp[j2][r2]: those with a key >= T1 are found from the gathered (j1, r1, L) with
//     keys >= T1, one thread per (node, j2), r2 = 1, 2, .. while the key stays >= T1. None: the
//     tree is the n best gathered. Else all are ranked again, T2 = the new n-th key, and a node of
//     three deviations with a key >= T2 would extend a gathered one of two by a depth j3 in
//     (j2, L) at least lp[j3][0] - lp[j3][1] lower: if any, the heap.
//  4. Node i + 1 is rank i; its parent (its tuple less the last rank) is among them: its key is at
//     least the node's and its tuple a prefix.
// Every thread of the CTA calls it; lp: [D][ks] in shared memory; s: search_bounds' bounds (before
// a barrier). Fills ns for nodes 1..n and returns n, or -1 when the caller must run heap_select.
constexpr int DEV_CAP = 256;  // gathered nodes (bench_ddtree's and the tests' deep rows: 16-140)
static_assert(3 * DEV_CAP <= SEARCH_CAP && DEV_CAP <= SEARCH_BINS, "dev_search's arrays");
static_assert(DL_SEARCH_HEAP_BUDGET <= 32 && DL_MAX_DEPTH <= 32, "dev_node's fields");

// A node of at most two deviations in 32 bits: length L (bits 0-5), deviations' depth and rank
// j1 (6-10), r1 (11-15), j2 (16-20), r2 (21-25), their count (30-31).
DL_DEVICE u32 dev_node(int nd, int L, int j1 = 0, int r1 = 0, int j2 = 0, int r2 = 0) {
  return static_cast<u32>(L) | (static_cast<u32>(j1) << 6) | (static_cast<u32>(r1) << 11) |
         (static_cast<u32>(j2) << 16) | (static_cast<u32>(r2) << 21) | (static_cast<u32>(nd) << 30);
}
DL_DEVICE int dev_len(u32 t) { return static_cast<int>(t & 63u); }
DL_DEVICE int dev_nd(u32 t) { return static_cast<int>(t >> 30); }
DL_DEVICE int dev_j(u32 t, int i) { return static_cast<int>((t >> (i ? 16 : 6)) & 31u); }
DL_DEVICE int dev_r(u32 t, int i) { return static_cast<int>((t >> (i ? 21 : 11)) & 31u); }
// The ranks tuple order of the nodes of at most two deviations as one integer (smaller first): a
// tuple's events in depth order -- each deviation a digit 1024 + (31 - depth) * 32 + (rank + 1),
// then its length L -- 11 bits each, padded with 0. At the first event of either of two tuples the
// one that deviates (rank >= 1 where the other has 0, or has ended) sorts later, the one that ends
// earlier; at a common event the digits decide. (The numpy twin checks it against the tuples.)
DL_DEVICE u64 dev_tb(u32 t) {
  const int nd = dev_nd(t);
  const auto dig = [&](int i) { return static_cast<u64>(1024 + (31 - dev_j(t, i)) * 32 + dev_r(t, i) + 1); };
  const u64 L = static_cast<u64>(dev_len(t));
  return nd == 0 ? L << 22 : nd == 1 ? (dig(0) << 22) | (L << 11) : (dig(0) << 22) | (dig(1) << 11) | L;
}
// The parent of node t: c_{L-1} (the root: 0), or t at length L - 1, or, at its last deviation's
// depth (L = j + 1), t without it at length j.
DL_DEVICE u32 dev_parent(u32 t) {
  const int nd = dev_nd(t), L = dev_len(t);
  if (nd == 0 || L > dev_j(t, nd - 1) + 1) return t - 1u;
  return nd == 1 ? dev_node(0, L - 1) : dev_node(1, L - 1, dev_j(t, 0), dev_r(t, 0));
}

// Ranks the C gathered nodes (threads < C; keys in s.key, dev_tb in tb); rank i's index goes to
// s.rd[i] (i < n), rank n - 1's key to *kth. Returns this thread's node's key (0 past C).
DL_DEVICE double dev_rank(const SearchSmem& s, const u64* tb, unsigned short* rd, double* kth, int C, int n) {
  const int tid = threadIdx.x;
  if (tid >= C) return 0.0;
  const double kx = s.key[tid];
  const u64 tx = tb[tid];
  int rank = 0;
  for (int q = 0; q < C; ++q) {
    const double ky = s.key[q];
    rank += (ky > kx) | ((ky == kx) & (tb[q] < tx));
  }
  if (rank < n) rd[rank] = static_cast<unsigned short>(tid);
  if (rank == n - 1) *kth = kx;
  return kx;
}

DL_DEVICE int dev_search(const float* lp, int ks, int kb, int D, int n, SearchSmem& s, const NodeSmem& ns) {
  constexpr int T = BUILD_THREADS;
  const int tid = threadIdx.x;
  const double* const P = s.dev_p;
  double* const kth = s.key + DEV_CAP;
  u64* const tb = reinterpret_cast<u64*>(s.key + 2 * DEV_CAP);  // the gathered nodes' dev_tb
  if (kb != n || n < 1 || D < 1) return -1;  // (uniform; search_bounds sets s.dev only with kb == n)
  const auto pen = [&](int j, int r) {  // lp[j][0] - lp[j][r], exact
    return __dsub_rn(static_cast<double>(lp[j * ks]), static_cast<double>(lp[j * ks + r]));
  };
  // ---- 1: gather the nodes of at most one deviation with keys >= T0 (keys in s.key, dev_node in
  // s.cur, dev_tb in tb). Thread t < D * n takes depth j = t / n and rank r = t % n: its log-prob's
  // lowest set bit for the exactness check, and r = 0 the chain node c_{j+1}, else (j, r, L) for
  // L = j + 1 .. while >= T0 (keys fall with L: every log-prob <= 0, search_bounds' sign check).
  const double t0 = s.dev_t0;
  const int emin_ok = s.dev_emin;
  int inexact = 0;
  // (s.nbig is 0: search_bounds sets it before the load's barrier, and every return below past a
  // barrier zeroes it again, for --twice's second run)
  for (int t = tid; t < D * n; t += T) {
    const int j = t / n, r = t - j * n;
    const u32 vb = __float_as_uint(lp[j * ks + r]);
    const int e = static_cast<int>((vb >> 23) & 0xffu);
    const u32 m = (vb & 0x7fffffu) | (e ? 0x800000u : 0u);
    if (m && (e ? e - 150 : -149) + __ffs(static_cast<int>(m)) - 1 < emin_ok) inexact = 1;
    const double pj = r == 0 ? 0.0 : pen(j, r);
    const int last = r == 0 ? j + 1 : D;  // (the chain node: L = j + 1 alone)
    for (int L = j + 1; L <= last; ++L) {
      const double k = __dsub_rn(P[L], pj);
      if (k < t0) break;
      const int q = atomicAdd(&s.nbig, 1);
      if (q < DEV_CAP) {
        const u32 node = r == 0 ? dev_node(0, L) : dev_node(1, L, j, r);
        s.key[q] = k;
        s.cur[q] = node;
        tb[q] = dev_tb(node);
      }
    }
  }
  if (__syncthreads_or(inexact)) {
    if (tid == 0) s.nbig = 0;  // (nobody reads it on this path)
    DDT_STAMP(11, "dvfail", 0);
    return -1;  // (uniform)
  }
  const int C1 = s.nbig;
  DDT_STAMP(8, "dvcand", C1);
  if (C1 > DEV_CAP || C1 < n) {  // (uniform; C1 >= n: the n nodes of T0 have keys >= it)
    __syncthreads();  // (every thread has read s.nbig)
    if (tid == 0) s.nbig = 0;
    DDT_STAMP(11, "dvfail", 1);
    return -1;
  }
  // ---- 2: rank them
  double kx = dev_rank(s, tb, s.rd, kth, C1, n);
  __syncthreads();
  // ---- 3: the nodes of two deviations with keys >= T1, from (gathered node, j2) pairs
  const double t1 = *kth;
  for (int t = tid; t < C1 * 32; t += T) {
    const int x = t >> 5, j2 = t & 31;
    const u32 tx = s.cur[x];
    const double k0 = s.key[x];
    if (dev_nd(tx) != 1 || k0 < t1 || j2 <= dev_j(tx, 0) || j2 >= dev_len(tx)) continue;
    for (int r2 = 1; r2 < n; ++r2) {
      const double k = __dsub_rn(k0, pen(j2, r2));
      if (k < t1) break;
      const int q = atomicAdd(&s.nbig, 1);
      if (q < DEV_CAP) {
        const u32 t2 = dev_node(2, dev_len(tx), dev_j(tx, 0), dev_r(tx, 0), j2, r2);
        s.key[q] = k;
        s.cur[q] = t2;
        tb[q] = dev_tb(t2);
      }
    }
  }
  __syncthreads();
  const int C = s.nbig;
  DDT_STAMP(9, "dvrank", C);
  if (C > DEV_CAP) {  // (uniform)
    __syncthreads();
    if (tid == 0) s.nbig = 0;
    DDT_STAMP(11, "dvfail", 1);
    return -1;
  }
  int fail = 0;
  if (C > C1) {  // (uniform) rank them all again; T2 = the n-th key
    kx = dev_rank(s, tb, s.rd, kth, C, n);
    __syncthreads();
    const double t2 = *kth;
    const u32 tx = tid < C ? s.cur[tid] : 0u;
    if (tid < C && dev_nd(tx) == 2 && kx >= t2) {
      for (int j3 = dev_j(tx, 1) + 1; j3 < dev_len(tx); ++j3)
        if (__dsub_rn(kx, pen(j3, 1)) >= t2) fail = 1;  // (a node of three deviations may be in the tree)
    }
  }
  // ---- 4: the nodes
  if (tid < n) {
    const u32 t = s.cur[s.rd[tid]];
    const int L = dev_len(t), nd = dev_nd(t);
    const u32 pt = dev_parent(t);
    int par = dev_len(pt) == 0 ? 0 : -1;
    for (int q = 0; q < n && par < 0; ++q)
      if (s.cur[s.rd[q]] == pt) par = q + 1;
    if (par < 0 || par > tid) fail = 1;  // (never, by the argument above: a guard)
    ns.par[tid + 1] = static_cast<short>(par);
    ns.rank[tid + 1] = static_cast<short>(nd > 0 && L == dev_j(t, nd - 1) + 1 ? dev_r(t, nd - 1) : 0);
    ns.dep[tid + 1] = static_cast<u8>(L);
  }
  fail = __syncthreads_or(fail);
  if (tid == 0) s.nbig = 0;  // (every thread read it before the barrier)
  if (fail) {
    DDT_STAMP(11, "dvfail", 2);
    return -1;
  }
  DDT_STAMP(10, "dvdone", C);
  return n;
}

}  // namespace ddt
