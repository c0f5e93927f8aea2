// ddtree.cu: DDTree on the GPU -- tree build, tree compile, greedy accept, KV commit.
//
// Pairs with driverlevel/ddtree.py (DDTreePlan; the ctypes mirrors of the stages' params) and
// with the numpy reference driverlevel/reference/ddtree.py, which defines every result
// these kernels must reproduce exactly (Ringel & Romano 2026, arXiv 2604.12989).
// Every kernel takes its stage's params struct by value (__grid_constant__: TopKParams,
// BuildParams, CompileParams, AcceptParams, CommitParams, ddtree/params.cuh); all
// per-step values (active flags, lengths, the tree, the pool's count) are read from
// device memory, and every grid is fixed by the plan's maxima, so one captured graph
// serves every step.
//
// Kernels (block size, grid, dynamic shared memory, early exits):
//   ddtree_topk_chunks_{f32,bf16}  (topk_mode = 0 only) 320 threads (four CTAs per SM on sm_90
//        for fp32, three for bf16: <= 48 / 64 registers, 41.6 KB static smem); grid (num_chunks,
//        depth_limit, max_batch). A CTA holds one 7,680-token chunk of one depth row as order keys in
//        shared memory (24 per thread); one block reduction gives the chunk max, sum of exp
//        (for the row's log-sum-exp) and the moments of a normal cutoff that keeps about 4K
//        candidates; those go to a list (one block scan), and the exact top-K of the chunk by
//        (logit desc, id asc) is a histogram select over the list (over every logit when
//        fewer than K pass or more than LIST_CAP do), equal keys at the threshold ranked by
//        id with block scans. Written unsorted as 64-bit composites (order key << 32 | ~id)
//        with one block scan. Exits after its loads for inactive requests. NaN counts as -inf
//        (one compare per logit), so ids stay in range and distinct whatever the row holds.
//        CTA (0, 0, b) re-arms the build's per-request counter (and b = 0 the build status
//        word): no state survives a launch, so an aborted replay cannot break later builds.
//        (topk_mode = 1: ddtree_build runs the same code, topk_one_chunk, for a row whose
//        threshold failed.)
//   ddtree_topk_sample_{f32,bf16}  (topk_mode = 1 only) 256 threads; grid (depth_limit, max_batch).
//        T per row: a lower bound of the tk_m-th largest of 4,096 sampled logits (one 32-byte
//        group at a hashed offset per stratum; rows of <= 4,096 tokens whole) that admits at most
//        tk_slack more of them (ties aside): kth_largest_bound, usually its first histogram level
//        only; zeroes the row's candidate counter (re-armed every launch); flags rows whose T is
//        not finite. CTA (0, b) re-arms the build's per-request counter (b = 0: and the build
//        status word), as the chunk kernel does in topk_mode = 0. Launched with the largest
//        shared-memory carveout when the stream's CTAs do not fit on the SMs it leaves free
//        (driverlevel._topk_threshold.sample_carveout), so that they may start beside it.
//   ddtree_topk_stream_{f32,bf16}  (topk_mode = 1 only) 256 threads, <= 64 registers, 4.2 KB
//        static smem + a ring of 2-8 tiles (its dynamic smem: driverlevel._topk_threshold.
//        stream_config); grid (tk_nseg, depth_limit, max_batch), about one wave. Reads its
//        segment once through the ring (cp.async, 4,096 tokens per tile, all but one tile in
//        flight; fp32's whole ring before T is known): compare with T, exp2(min(x - T, 0))
//        summed over every logit; logits >= T appended as composites through a per-warp
//        shared staging buffer (one atomicAdd per flush; the count goes on past tk_cap,
//        writes stop there); per segment the sums of exp(x - T) below and above T.
//        A row that failed (flagged, count < K or count > tk_cap) takes the exact fallback in
//        its ddtree_build CTA (below): no launch between the stream and the build.
//   ddtree_build                 512 threads; grid (depth_limit + 1, max_batch); dynamic smem
//        from the plan (ddtree.build_shared_bytes; topk_mode = 1: at least a chunk CTA's 41.6 KB)
//        + 26 KB static. topk_mode = 1, a row whose threshold failed: the CTA first runs the
//        chunk top-K over the row's chunks one by one (topk_one_chunk on 512 threads, threads
//        past 320 idle; ~1-2 µs per chunk, paid by that request only). Each CTA merges one row's
//        chunk candidates (at most 12,288) into the sorted top-K with log-probs (fp32: logit - lse,
//        lse summed in fp64 from the chunks' or the stream segments' sums). A threshold row whose
//        candidates fit 15 warps' registers (DL_DDTREE_HIST_MERGE, the threshold plans' cubin) is
//        ranked by one linear histogram of 512 bins between T and its maximum, each candidate of the
//        bins before the K-th's counting its larger bin-mates, while the last warp sums the
//        log-sum-exp (hist_rank); other rows (chunked, a failed threshold, a bin crowded by ties) by
//        the K-th largest key of a histogram select, the K-th composite among equal keys only when
//        needed, then the K picked sorted by a bitonic network (warp shuffles below stride 32). The last CTA of a request to finish (a
//        per-request counter, reset by that CTA) selects the tree with the whole CTA
//        (parallel_search: depth by depth, a key histogram bounds the candidates, the nodes
//        ranked by (key, ranks tuple) at the end -- the reference's heapq order, exactly;
//        in the rare cases it cannot prove exactness (an inexact float64 sum, more than
//        SEARCH_CAP candidates) it runs the one-warp heap instead; a deep tree of a budget up
//        to 16 takes dev_search, the nodes of one or two deviations from the chain in a few
//        phases, with the heap where it cannot decide), then writes nodes and
//        ancestor bitmasks. Inactive requests: node_counts = 0, nothing else. Log-probs that
//        are -inf or NaN become -FLT_MAX (a row whose maximum is not finite: all of them, and
//        STATUS_NONFINITE in state[3]); a root token outside the vocabulary: no tree, an error.
//        CTA (depth_limit, 0), the code warmer, runs the same search and node code on log-probs
//        of its own (written to warm_scratch, its outputs there too) while the rows merge: any
//        large read between two builds evicts the kernel's code from L2, and the search, one
//        CTA's serial phases, then misses to DRAM region by region (~8 of a batch-1 / 256
//        build's 41.7 µs after the accept stage on the H200, s17 call 2). The warmer takes those
//        misses ~10 µs ahead. CTAs (depth_limit, b > 0) exit at once.
//   ddtree_compile               256 threads; grid (max_batch, COMPILE_CTAS); no dynamic
//        smem. Verify input ids, positions, slots from the free-slot pool, qo/kv/mask
//        indptrs, kv_indices from req_to_token, packed bitmask and the optional SGLang
//        FULL / QLEN_ONLY masks. Every CTA recomputes the small per-request prefix sums.
//        Checks node counts, committed lengths (<= max_context: with the plan's
//        max_batch * max_context < 2^31 the int32 kv_indptr cannot wrap), req_pool_indices,
//        the pool count and every slot id it copies; a bad request gets no rows. Rows
//        qo_indptr[bs] .. max_rows get token 0, position 0 and slot -1 (their mask rows stay stale).
//   ddtree_accept                256 threads; grid (max_batch). Posterior per node (the row
//        composites of argmax.cu's argmax_rows_*, launched before it by the plan, which it clears
//        for the next argmax; or the given tokens), the walk
//        (tokens and stop tokens staged in shared memory), the context room, next roots;
//        records mirrored to a mapped host buffer with volatile stores and
//        __threadfence_system(). A target row with nothing above -inf (or a target token
//        outside the vocabulary) gives posterior 0, matches no child, and a walk that ends
//        there finishes the request (finished = FINISH_NONFINITE, STATUS_NONFINITE).
//   ddtree_commit                256 threads; grid (max_batch). Paged: append accepted
//        slots to req_to_token, push rejected slots back onto the pool, advance lengths;
//        does nothing when compile found the pool exhausted. With paged == 0 it only
//        advances the lengths (after ddtree_commit_dense).
//   ddtree_commit_dense          256 threads; grid (max_batch, dense_layers). Moves the
//        accepted rows of each request's appended window to its front, row by row, bounded by
//        the window: a node whose row lies past it cuts the path there (accepted_count, the
//        request finishes, STATUS_CONTEXT_FULL).
// Bad per-step metadata is reported through the device error word (p.error, common.cuh):
// the kernels never read or write out of bounds and give the bad request a defined result.
// Programmatic dependent launch (DDTreePlan(pdl=...), sm_90+; dl::pdl_wait / pdl_launch_dependents
// in common.cuh): the build's kernels after its first (threshold: stream, build; chunked: build)
// may be launched programmatically. The sample, stream and chunk kernels let their successor
// start at once; each programmatic kernel runs pdl_wait() in every CTA before it reads or writes
// anything an earlier kernel of the build touches: the stream kernel after issuing its first
// tiles, ddtree_build after reading its root token. ddtree_compile, ddtree_accept and ddtree_commit
// start with dl::pdl_enter (the wait before anything else, then their successor may start), and the
// plan launches them programmatically too with pdl: after any kernel, whoever wrote it.
//
// Layout: this one translation unit includes the stages' headers in cu/ddtree/ (params.cuh:
// constants and the stages' params structs; keys.cuh: order keys, the exact select and its bound; topk.cuh, search.cuh,
// build.cuh, compile.cuh, accept.cuh, commit.cuh: the stages) and defines the entry points.

// From the launcher (driverlevel/ddtree.py compile_defines): the params layouts and the device error
// word's numbers, so that a partial set stops here, not in a cascade (constants.cuh checks the shared
// constants one by one).
#if !defined(DL_SIZEOF_SH) || !defined(DL_SIZEOF_CM) || !defined(DL_FIELD_TREE_TOKENS) || !defined(DL_DDTREE_HIST_MERGE)
#error "compile with driverlevel.ddtree.compile_variants()"
#endif

#include "common.cuh"
#include "constants.cuh"
#include "ddtree/params.cuh"
#include "ddtree/keys.cuh"
#include "ddtree/topk_threshold.cuh"
#include "ddtree/topk.cuh"
#include "ddtree/search.cuh"
#include "ddtree/build.cuh"
#include "ddtree/compile.cuh"
#include "ddtree/accept.cuh"
#include "ddtree/commit.cuh"

#ifndef DL_BUILD_WARMER
#define DL_BUILD_WARMER 1  // ddtree_build's code warmer CTA (build.cuh); 0: it exits at once (A/B runs)
#endif

// ------------------------------------------------------------------------------ entry points

extern "C" __global__ void __launch_bounds__(ddt::TOPK_THREADS, 4) ddtree_topk_chunks_f32(const __grid_constant__ TopKParams p) {
  ddt::topk_chunk<float>(p);
}
extern "C" __global__ void __launch_bounds__(ddt::TOPK_THREADS, 3) ddtree_topk_chunks_bf16(const __grid_constant__ TopKParams p) {
  ddt::topk_chunk<bf16>(p);
}
extern "C" __global__ void __launch_bounds__(ddt::TK_SAMPLE_THREADS, 1) ddtree_topk_sample_f32(const __grid_constant__ TopKParams p) {
  ddt::topk_sample<float>(p);
}
extern "C" __global__ void __launch_bounds__(ddt::TK_SAMPLE_THREADS, 1) ddtree_topk_sample_bf16(const __grid_constant__ TopKParams p) {
  ddt::topk_sample<bf16>(p);
}
extern "C" __global__ void __launch_bounds__(ddt::TK_STREAM_THREADS, ddt::TK_STREAM_CTAS_PER_SM) ddtree_topk_stream_f32(const __grid_constant__ TopKParams p) {
  ddt::topk_stream<float>(p);
}
extern "C" __global__ void __launch_bounds__(ddt::TK_STREAM_THREADS, ddt::TK_STREAM_CTAS_PER_SM) ddtree_topk_stream_bf16(const __grid_constant__ TopKParams p) {
  ddt::topk_stream<bf16>(p);
}
extern "C" __global__ void __launch_bounds__(ddt::BUILD_THREADS, 1) ddtree_build(const __grid_constant__ BuildParams p) {
  ddt::BuildSmem& sm = ddt::build_smem;
  extern __shared__ __align__(16) u8 dyn[];
  // CTA (depth_limit, 0) is the code warmer (build.cuh): the search's code on its own data, so
  // that the request's search finds that code in L2. The other CTAs of column depth_limit exit.
  const int col = ddt::build_column();  // (params.cuh: in request 0's grid row the warmer comes first)
  const bool warmer = col == p.depth_limit;
  // CTA (depth_limit, 1) warms the heap's code where a request may take the heap: budgets up to
  // DL_SEARCH_HEAP_BUDGET (search_bounds' switch) or the heap for every request (build.cuh).
  const bool heap_warmer = blockIdx.y == 1 && (p.budget <= DL_SEARCH_HEAP_BUDGET || (p.flags & ddt::FLAG_LEGACY_SEARCH));
  if (warmer && (!DL_BUILD_WARMER || (blockIdx.y != 0 && !heap_warmer))) return;
  DDT_STAMP(30, "entry", 0);  // (before the PDL wait: how long the CTA waits for the top-K kernels)
  if (!warmer) {  // (the warmer reads nothing the top-K kernels write)
    const int b = blockIdx.y;
    const int root = p.root_tokens[b];  // request state, final before the build's first launch
    const bool act = p.active[b];       // (the same: read before the wait, so that past it the
                                        // row merge's loads are the only round trip)
    const bool bad_root = root < 0 || root >= p.vocab;
    // PDL (common.cuh): all that follows reads what the top-K kernels wrote (candidates,
    // statistics, tk_*), the counter the sample (threshold) or chunk kernel re-armed, or writes
    // the tree; the stream kernel's completion implies the sample's. Inactive CTAs wait too.
    dl::pdl_wait();
    if (!act || bad_root) {  // no tree: compile gives the request no rows
      if (col == 0 && threadIdx.x == 0) {
        p.node_counts[b] = 0;
        if (act) dl::report_error(p.error, b, DL_FIELD_TREE_TOKENS, DL_ERR_OUT_OF_RANGE);
      }
      return;
    }
  }
  ddt::build_tree(p, sm, dyn);  // (the one call: the warmer must run the very instructions of the search)
}
extern "C" __global__ void __launch_bounds__(ddt::SMALL_THREADS, 1) ddtree_compile(const __grid_constant__ CompileParams p) {
  dl::pdl_enter();  // (common.cuh: before anything else, so a programmatic launch of it is safe)
  __shared__ ddt::CompileSmem sm;
  ddt::compile_step(p, sm);
}
extern "C" __global__ void __launch_bounds__(ddt::SMALL_THREADS, 1) ddtree_accept(const __grid_constant__ AcceptParams p) {
  dl::pdl_enter();  // (common.cuh: before anything else, so a programmatic launch of it is safe)
  __shared__ ddt::AcceptSmem sm;
  ddt::accept_step(p, sm);
}
extern "C" __global__ void __launch_bounds__(ddt::SMALL_THREADS, 1) ddtree_commit(const __grid_constant__ CommitParams p) {
  dl::pdl_enter();  // (common.cuh: before anything else, so a programmatic launch of it is safe)
  __shared__ ddt::CommitSmem sm;
  ddt::commit_step(p, sm);
}
extern "C" __global__ void __launch_bounds__(ddt::SMALL_THREADS, 1) ddtree_commit_dense(const __grid_constant__ CommitParams p) {
  ddt::commit_dense_rows(p);
}
