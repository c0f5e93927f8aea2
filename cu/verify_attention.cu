// verify_attention.cu: split-KV verify attention for MLA draft trees (absorbed form), with the
// split-KV work scheduled on the GPU inside the graph.
//
// Pairs with driverlevel/verify_attention.py (the plan that sizes, validates and launches).
//
// Problem. Request b has q_len draft tokens (rows qo_indptr[b] .. qo_indptr[b+1]) and a
// committed prefix of kv_len slots (kv_indices[kv_indptr[b] .. kv_indptr[b+1]]). Every
// (draft token i, query head h) pair is one row of 576 bf16 values; the rows of a request are
// contiguous in q ([total_q, H, 576]), row = i*H + h. The single latent KV head is a cache
// row of 576 bf16 (scores use all 576, values are its first 512). Row (i, h) attends to the
// whole prefix and to the draft tokens j of its request that the mask marks visible (their
// K/V rows sit at slots out_cache_loc[qo_indptr[b] + j]). Keys are numbered prefix first
// (0 .. kv_len-1) then draft tokens (kv_len + j).
//
// Three kernels, one captured graph for every step (nothing per step is in the arguments):
//
// verify_attn_schedule   Grid 1, Block 512. Reads qo_indptr / kv_indptr / mask_indptr from
//   device memory, checks them (monotonic, lengths <= max_q, ranges inside the buffers, mask
//   offsets consistent with the lengths; a failure sets the device error word and leaves the
//   request without keys, so its rows get zeros and LSE -inf), and cuts the step's work into
//   num_parts about-equal-cost parts, one per CTA of the persistent grid. The work is the
//   sequence of units (request b, row tile r, key tile t), pairs (b, r) in order; a pair costs
//   key_tiles(b) + OVH units (OVH: the fixed cost of a Q-tile load and an epilogue, charged once
//   per pair, as FlashMLA's metadata kernel charges each split a few blocks). Part p covers
//   [cut(p), cut(p+1)) with cut(p) = min(p * per_part, total); a cut inside a pair's key tiles
//   splits that pair. The scheduler also lists the split pairs for the combine kernel. (Measured
//   and rejected on the H200, BENCHMARKS.md: rounding cuts to pair boundaries when pairs are
//   small, and CTAs taking whole pairs from an atomic counter; both were slower.)
//   (FlashMLA's get_mla_metadata, deepseek-ai/FlashMLA, does the same on the device.)
//
// verify_attn_partial   Grid num_parts (SM count x CTAs per SM), Block THREADS = (M/16)*C warps (DL_WS: M/16 + 8, 4 with M = 32).
//   CTA p walks its part's segments (one pair, a range of its key tiles each). A segment that
//   holds all of its pair's key tiles writes the final bf16 output and LSE; a split one writes
//   bf16 partial output (normalised by its own sum: values of the output's range, rounded once
//   more; FlashInfer's MLA keeps its partials in the output dtype too) + fp32 base-2 LSE to
//   partial slot 2p (the part's first segment) or 2p+1 (its last), so the workspace is
//   2 * num_parts slots of M rows whatever the batch.
//   Tile: the C warps of a row group own the same 16 rows, each computes S = Q K^T on 1/C of
//   the 576-dim contraction, they sum the partial S through shared memory (fixed order, so every
//   warp holds bit-identical S), and each accumulates P V for 512/C of the value columns. K tiles
//   are read once into shared memory by cp.async (STAGES deep); their first 512 columns serve as
//   V. Softmax is online, in base 2, fp32. In tiles holding draft keys, non-finite V values are
//   zeroed after S is computed, so a masked key has no influence even when its row is NaN (a
//   row that sees it still gets NaN through its score). Slot ids outside the cache are read as
//   zero rows and reported.
//   With QREG, each warp keeps its Q fragments (16 rows x 576/C columns) in registers, loaded
//   from global memory at the start of a segment, and Q takes no shared memory: that is what lets
//   the 99 KB sm_120 tile use 32-key tiles (twice the keys per barrier, rescale and S exchange).
//   Shared memory: Q tile M*1168 B (0 with QREG) + K stages STAGES*N*1168 B + S exchange
//   WARPS*N*64 B (one buffer: the __syncthreads at the top of every tile orders its reuse).
//   The S exchange (C > 1) is one of two (DL_EXCHANGE):
//   0 all-reduce: every warp reads all C partials of all N keys and runs the mask and the online
//     softmax on the full 16 x N S, redundantly in the C warps; P stays in registers.
//   1 reduce-scatter: warp cpart sums the C partials of only its N/C keys (the same fixed order,
//     so S is bit-identical to the all-reduce), masks them and takes their row maxima; the C
//     warps exchange the per-row maxima through shared memory (+ M*C*4 B), so the running max m
//     and the O rescale are identical in all of them; each warp writes P of its keys as bf16 to a
//     16 x N buffer per row group (+ M*(2N+16) B) and, after a named barrier, reads the whole P
//     for its P V. Row sums l stay per warp (over its own keys) and are summed, in a fixed order,
//     through the row-max buffer once at the end of the segment.
//
// verify_attn_combine   Grid (SM count x CTAs per SM), Block 256 (8 warps), persistent. For each
//   split pair listed by this replay's scheduler, merges exactly the partial slots this replay
//   wrote (never a stale one) by their LSE. Its work items are (split pair, block of rows), counted
//   by the scheduler: 1, 2, 4 or 8 warps share a row's pieces (by their number: each warp streams
//   at most 8 of a pair split 32 ways, two in flight, 16 value columns per lane) and sum them in a
//   fixed order. A NaN LSE (a visible key with NaN scores) stays NaN.
//
// PV rows (DL_PV_ROWS, reduce-scatter only): 16 (default) -- each warp accumulates P V for its
//   own 16 rows and 512/C value columns; 32 -- the 2C warps of two row groups (a pair) share
//   their 32 rows: each accumulates P V for all 32 rows and 512/(2C) columns (the same number of
//   accumulators), so every V fragment read from shared memory feeds two m16 tiles instead of
//   one (half the V bytes per mma). The pair's warps then sync the row maxima and P with a
//   named barrier over the pair, track the partner group's running max (identical bits: fmaxf of
//   the same buffer), and read its final row sums from a per-row buffer (+ M*4 B) at the end.
//
// K tile loads (DL_BULK): 0 -- every thread copies part of a key row with 16-byte cp.async
//   (THREADS/N threads per row), tile t waited for with cp.async.wait_group + __syncthreads;
//   1 (sm_90+; cp.async below) -- one thread per key row copies its 1,152 B with one
//   cp.async.bulk, completing one mbarrier per stage (N arrivals + the bytes); every thread waits
//   on the stage's phase before the tile's __syncthreads. Rows past the last key or at a bad slot
//   id are zeroed by the row's THREADS/N threads (then fence.proxy.async, as the non-finite scrub
//   of V does, so a later bulk copy into the stage is ordered after those generic writes).
//
// QK warps and PV warps (DL_WS; the default tile on sm_80, sm_86, sm_89, sm_90 and sm_120,
// research/verify_ws.md): instead of C warps per row group, M/16 QK warps and 8 PV warps (4 with M = 32).
//   QK warp g owns rows 16g..16g+15 and the whole 576-dim contraction: DL_WS_QREGS k-steps of
//   Q's latent part in registers (from global memory once per segment), the other columns
//   (latent rest + rope) from a Q tile in shared memory; DL_QK_CHAINS accumulator sets over
//   interleaved k-steps; then the mask (visibility words the PV warps prepared), the online
//   softmax, P as bf16 into P slot t%2 and each row's rescale factor into alpha slot t%2.
//   PV warp w owns rows 32(w/4).. +32 (two m16 tiles) and value columns 128(w%4).. +128 (48
//   rows: all three m16 tiles and value columns 64w.. +64, so each V fragment feeds three): in
//   iteration t it applies tile t-1 (O = alpha O + P V) while the QK warps compute tile t, loads
//   tile t+STAGES-2 with cp.async (one group per tile) and prepares tile t+1's visibility words
//   (with M = 48 the first 192 of its 256 threads).
//   One CTA barrier per iteration; a masked tile's V is scrubbed by the QK warps after a QK-only
//   named barrier. The segment's bookkeeping (request, tile range, output slot, and thread 0's
//   walk over the part) is a shared-memory record (WsSeg) read where it is used: registers are
//   this layout's limit (168 per thread for 384 threads), and no register holds it across the
//   loop. Outputs, partial slots and the combine are the same as for the other tiles.
//   DL_WS_PVSM (sm_80/sm_90's 48-row tile): the QK warps only compute S (fp32, into S slot t%2);
//   in iteration t the PV warps first do tile t-1's mask, online softmax (LPW threads per row,
//   the row's running maximum in each and a partial row sum), P (one slot) and rescale factors
//   (one slot), scrub a masked tile's V, meet at a PV-only named barrier and then apply the tile;
//   they write the LSE and the row sums at the end. The QK warps' critical path loses the
//   softmax; the PV warps must have the time for it (48 rows: yes, 1.04x; 64 rows: no, 0.89x).
//   DL_WS_SKEW (sm_90's 64-row tile): in iteration t a QK warp computes tile t's S and, inside
//   the same k-steps (one block of code, so the scheduler fills the mma chain's ldmatrix waits),
//   tile t-1's mask, softmax, P and rescale factors; the PV warps apply tile t-2 and prepare
//   tile t's visibility words; tiles are loaded STAGES-3 ahead (a V lives one iteration longer).
//   DL_WS_WGMMA (sm_90's 64-row tile since the twenty-seventh session; compiled for sm_90a only):
//   the four QK warps are one warpgroup and issue tile t's 36 k-steps as wgmma m64n32k16 (A = Q:
//   the DL_WS_QREGS register k-steps, then the Q tile by descriptor; B = the K tile by
//   descriptor), run tile t-1's softmax while those execute, then wait. K stages and the Q tile
//   are stored 128-byte swizzled (TMA's SWIZZLE_128B pattern, 64-column slabs, 1024-byte
//   aligned); each loader fences its landed cp.async copies to the async proxy before the
//   iteration's barrier. PTX ISA 8.0, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate".
//   DL_WS_WGMMA_PV (with DL_WS_WGMMA; sm_90's 64-row tile since the twenty-eighth session): the 8
//   PV warps are two warpgroups of 64 rows x 256 value columns and apply a tile with two wgmma
//   m64n256k16 (A = P, ldmatrix'd from the P slot into registers; B = V by descriptor from the
//   swizzled K stage, N-major: imm-trans-b = 1) instead of mma.sync on ldmatrix.trans fragments.
//
// Configuration (compile-time, from the launcher): DL_ROWS (M), DL_CSPLIT (C), DL_KEYS (N),
// DL_STAGES, DL_QREG, DL_EXCHANGE, DL_PV_ROWS, DL_BULK, DL_WS, DL_WS_QREGS, DL_QK_CHAINS,
// DL_WS_PVSM, DL_WS_SKEW (with DL_SKEW_MATH_AT, DL_SKEW_STORE_AT), DL_WS_WGMMA, DL_WS_WGMMA_PV, DL_OVH_TILES.
#include "common.cuh"
#include "phase_stamps.cuh"

// Phase stamps (phase_stamps.cuh; tools/verify_stamps.py compiles with -DDL_STAMPS=1, otherwise
// empty): thread `tid0` stamps slot `slot` of `row`. Rows: 0 the scheduler (start 0, end 1);
// VA_STAMP_PART + 2 * part + role the partial CTAs (role 0, thread 0, a QK warp under DL_WS: start
// 0, cuts 1, seg 2..5, tile0 6, loop 7, done 8, waited 9, lasttile 10 (the segment's last key tile
// begins), qk lse 11 (its row sums and LSEs written), qissued 12 (its Q fragments' loads issued),
// t0done 13 (its first tile's P written, before the draft scrub), and iteration 16 of the key
// loop: bar16 14 (past its barrier), mma16 15 (its last mma issued), P16 16, bar17 17 (past the
// next barrier); role 1, the first PV thread: tile0 0, loop 1, epi 2, bar 3 (past the epilogue's
// barrier, before the stores), kissued 4 (the first tiles' loads issued), bar16 5, mma16 6 -- a
// later segment's overwrite an earlier one's); VA_STAMP_COMBINE + CTA the combine (start 0,
// waited 1, end 2).
#define VA_STAMP_PART 8
#define VA_STAMP_COMBINE 1024
#define VA_STAMP(row, tid0, slot, point, arg)                \
  do {                                                       \
    if (threadIdx.x == (tid0)) DL_STAMP(row, slot, point, arg); \
  } while (0)

#ifndef DL_ROWS
#define DL_ROWS 32
#endif
#ifndef DL_CSPLIT
#define DL_CSPLIT 4
#endif
#ifndef DL_KEYS
#define DL_KEYS 16
#endif
#ifndef DL_STAGES
#define DL_STAGES 2
#endif
#ifndef DL_OVH_TILES
#define DL_OVH_TILES 6
#endif
#ifndef DL_QREG
#define DL_QREG 0
#endif
#ifndef DL_EXCHANGE
#define DL_EXCHANGE 0
#endif
#ifndef DL_PV_ROWS
#define DL_PV_ROWS 16
#endif
#ifndef DL_BULK
#define DL_BULK 0
#endif
// The bulk-copy path is compiled where the architecture has it (its mbarrier wrappers in
// common.cuh exist from sm_90); below, DL_BULK only reserves the mbarriers' bytes.
#if DL_BULK && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define DL_VA_BULK 1
#else
#define DL_VA_BULK 0
#endif
#ifndef DL_WS
#define DL_WS 0
#endif
#ifndef DL_QK_CHAINS
#define DL_QK_CHAINS 1
#endif
#ifndef DL_WS_PVSM
#define DL_WS_PVSM 0
#endif
#ifndef DL_WS_SKEW
#define DL_WS_SKEW 0
#endif
#ifndef DL_WS_QREGS
#define DL_WS_QREGS 32
#endif
#ifndef DL_WS_WGMMA
#define DL_WS_WGMMA 0
#endif
#ifndef DL_WS_WGMMA_PV
#define DL_WS_WGMMA_PV 0
#endif
#if DL_WS_WGMMA && defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "DL_WS_WGMMA needs the sm_90a target (wgmma)"
#endif
// From the launcher (driverlevel/verify_attention.py compile_defines): the device error word's
// numbers (driverlevel/_device_error.py) and the scheduler's table limits (MAX_BATCH, MAX_PARTS).
#if !defined(DL_FIELD_QO_INDPTR) || !defined(DL_ERR_INCONSISTENT) || !defined(DL_VA_MAX_BATCH) || \
    !defined(DL_VA_MAX_PARTS) || !defined(DL_VA_REQUEST_BYTES) || !defined(DL_SMEM_BYTES)
#error "compile with driverlevel.verify_attention.compile_variants()"
#endif

enum MaskMode : int { kMaskFull = 0, kMaskQlenOnly = 1, kMaskBitmask = 2, kMaskCausal = 3 };
// idx64 bits: which index arrays are int64 (the others are int32).
enum IndexBits : int { kQo64 = 1, kKvptr64 = 2, kKvi64 = 4, kLoc64 = 8, kMip64 = 16 };

// One request as the scheduler checked it (what the partial and combine kernels use).
struct VaRequest {
  i64 q_start;     // first draft-token row
  i64 kv_start;    // first prefix entry in kv_indices
  i64 mask_base;   // offset of its mask in custom_mask (FULL, QLEN_ONLY)
  i32 q_len;       // 0 for a padded (or unreadable) request
  i32 kv_len;
  i32 row_tiles;   // ceil(q_len * H / M)
  i32 key_tiles;   // ceil((kv_len + q_len) / N); 0 for a request with bad metadata
};
// A cut in the work sequence: pair (b, r), the global pair index gp, and key tile t (0 = the
// pair's start). cut(num_parts) is the end.
struct VaCut {
  i32 b, r, t, gp;
};
// DL_WS: the segment a CTA works on, in shared memory (thread 0 writes it, every thread reads its
// fields where they are used: the kernel's limit is registers, and no register then holds the
// segment's bookkeeping across the main loop), and thread 0's position in the part's walk.
struct WsSeg {
  VaRequest rq;
  i32 b, r, t_begin, t_end, slot, complete, done;
  i32 walk_b, walk_r, walk_t, walk_gp;
  i32 end_gp, end_t;  // the part's end cut
};
// A split pair for the combine kernel: its pieces are in parts p_first .. p_last. The combine's
// work items are (entry, block of 8 / row_warps rows): item_end is the running count of items
// through this entry (also set, unchanged, where there is no entry), row_warps the warps that share
// one row's pieces (combine_row_warps). What the combine needs is here, so that it reads no other
// table: the pair's rows and first output row, the slot of its first piece (a later piece k is in
// slot 2 * (p_first + k) unless that part is empty), and -- for every q, entry or not -- whether
// part q is empty (its two cuts at the same unit: no segment, no piece).
struct VaEntry {
  i32 b, r, p_first, p_last;  // b < 0: no entry
  i32 item_end, row_warps;
  i32 rows, slot0, empty, pad;
  i64 out_row0;               // the pair's first row of out / lse: q_start * H + r * M
};

// The tables' record sizes are the ones driverlevel/_workspace_formula.py sizes the workspace with.
static_assert(sizeof(VaRequest) == DL_VA_REQUEST_BYTES, "VaRequest differs from REQUEST_RECORD_BYTES");
static_assert(sizeof(VaCut) == DL_VA_CUT_BYTES, "VaCut differs from CUT_RECORD_BYTES");
static_assert(sizeof(VaEntry) == DL_VA_ENTRY_BYTES, "VaEntry differs from ENTRY_RECORD_BYTES");

// The latent cache's element type, named in this one place: the K rows and V columns of the
// main loop, their shared-memory layout and the non-finite scrub are written in terms of it.
// bf16 today; an fp8 (e4m3) cache with a per-tensor scale changes kv_elem, the K and V fragment
// loads and their mma (sm_89+ has an e4m3 mma.sync), not the schedule, the softmax or the combine.
using kv_elem = bf16;

// The host-device contract; mirrored by driverlevel.verify_attention._Params (ctypes).
struct VerifyAttnParams {
  const bf16* q;              // [q_rows, H, 576]
  const kv_elem* kv_cache;    // [num_slots, 576]; V = first 512 columns
  const void* qo_indptr;      // [bs+1] draft-token offsets (int32 or int64)
  const void* kv_indptr;      // [bs+1] prefix offsets into kv_indices (int32 or int64)
  const void* kv_indices;     // prefix slot ids (int32 or int64)
  const void* out_cache_loc;  // [q_rows] slots of the draft tokens' K/V (int32 or int64)
  const void* mask;           // u8 (FULL, QLEN_ONLY) or u32 words (BITMASK); null for causal
  const void* mask_indptr;    // [bs+1] offsets into mask (FULL, QLEN_ONLY; int32 or int64)
  bf16* out;                  // [q_rows, H, 512]
  float* lse;                 // [q_rows, H] natural-log LSE, or null
  bf16* o_part;               // [2 * num_parts, M, 512] bf16 partial outputs (each normalised by its own sum)
  float* lse_part;            // [2 * num_parts, M] fp32 partial LSE (base 2, scaled)
  VaRequest* reqs;            // [max_batch] written by the scheduler
  VaCut* cuts;                // [num_parts + 1]
  VaEntry* entries;           // [num_parts]
  dl::DeviceErrorWord* err;   // mapped pinned error word, or null
  i64 q_rows;                 // rows of q, out and out_cache_loc (the buffers' size)
  i64 kv_indices_len;         // entries of kv_indices
  i64 num_slots;              // rows of kv_cache
  i64 mask_len;               // bytes of the u8 mask (FULL, QLEN_ONLY)
  float scale_log2;           // sm_scale * log2(e)
  i32 num_heads;
  i32 batch_size;
  i32 num_parts;              // CTAs of the persistent grid
  i32 max_q;
  i32 split_cap;              // 0, or the most pieces one pair may be cut into (about)
  i32 mask_mode;
  i32 mask_words;             // uint32 words per draft token (BITMASK)
  i32 idx64;                  // IndexBits
};

#ifdef DL_OFF_q
DL_CHECK_OFFSET(VerifyAttnParams, q);
DL_CHECK_OFFSET(VerifyAttnParams, kv_cache);
DL_CHECK_OFFSET(VerifyAttnParams, qo_indptr);
DL_CHECK_OFFSET(VerifyAttnParams, kv_indptr);
DL_CHECK_OFFSET(VerifyAttnParams, kv_indices);
DL_CHECK_OFFSET(VerifyAttnParams, out_cache_loc);
DL_CHECK_OFFSET(VerifyAttnParams, mask);
DL_CHECK_OFFSET(VerifyAttnParams, mask_indptr);
DL_CHECK_OFFSET(VerifyAttnParams, out);
DL_CHECK_OFFSET(VerifyAttnParams, lse);
DL_CHECK_OFFSET(VerifyAttnParams, o_part);
DL_CHECK_OFFSET(VerifyAttnParams, lse_part);
DL_CHECK_OFFSET(VerifyAttnParams, reqs);
DL_CHECK_OFFSET(VerifyAttnParams, cuts);
DL_CHECK_OFFSET(VerifyAttnParams, entries);
DL_CHECK_OFFSET(VerifyAttnParams, err);
DL_CHECK_OFFSET(VerifyAttnParams, q_rows);
DL_CHECK_OFFSET(VerifyAttnParams, kv_indices_len);
DL_CHECK_OFFSET(VerifyAttnParams, num_slots);
DL_CHECK_OFFSET(VerifyAttnParams, mask_len);
DL_CHECK_OFFSET(VerifyAttnParams, scale_log2);
DL_CHECK_OFFSET(VerifyAttnParams, num_heads);
DL_CHECK_OFFSET(VerifyAttnParams, batch_size);
DL_CHECK_OFFSET(VerifyAttnParams, num_parts);
DL_CHECK_OFFSET(VerifyAttnParams, max_q);
DL_CHECK_OFFSET(VerifyAttnParams, split_cap);
DL_CHECK_OFFSET(VerifyAttnParams, mask_mode);
DL_CHECK_OFFSET(VerifyAttnParams, mask_words);
DL_CHECK_OFFSET(VerifyAttnParams, idx64);
static_assert(sizeof(VerifyAttnParams) == DL_SIZEOF_PARAMS, "VerifyAttnParams size differs from its ctypes mirror");
#endif

namespace va {
constexpr int kQK = 576;                       // q/k head dim (512 latent + 64 rope)
constexpr int kV = 512;                        // value dim
constexpr int M = DL_ROWS;                     // rows per CTA
constexpr int C = DL_CSPLIT;                   // warps sharing 16 rows
constexpr int N = DL_KEYS;                     // keys per tile
constexpr int STAGES = DL_STAGES;              // K tiles in flight
constexpr int OVH = DL_OVH_TILES;              // cost of a pair's Q load + epilogue, in key tiles
constexpr bool QREG = DL_QREG != 0;            // Q fragments in registers (loaded from global per segment)
constexpr int ROW_GROUPS = M / 16;
// DL_WS: QK warps and PV warps (research/verify_ws.md): M/16 QK warps (16 rows each, DL_WS_QREGS
// k-steps of Q's latent columns in registers, the whole contraction, no S exchange) and 8 PV warps
// (M = 64: 2 row pairs x 4 quarters of the value columns, 32 x 128 accumulators each; M = 48: all
// 48 rows x 8 eighths of the columns, 48 x 64 each; M = 32: 4 warps, 32 x 128); DL_CSPLIT is 1.
constexpr bool WS = DL_WS != 0;
// DL_WS_WGMMA_PV (with DL_WS_WGMMA, M = 64): the 8 PV warps are two warpgroups, each all 64 rows x
// 256 value columns (warp w of group g: rows 16w .. 16w+15, columns 256g ..), and apply a tile with
// two wgmma m64n256k16 (A: P from the P slot by ldmatrix into registers; B: V from the K stage by
// descriptor, N-major, 128-byte swizzled)
constexpr bool WGPV = DL_WS_WGMMA_PV != 0;
constexpr int WS_QK_WARPS = M / 16;
constexpr int WS_PV_MT = WGPV ? 1 : M % 32 == 0 ? 2 : 3;  // m16 tiles (16-row blocks) of a PV warp
constexpr int WS_PV_RB = M / (16 * WS_PV_MT);          // PV warp row blocks
constexpr int WS_PV_CB_LOG2 = WGPV ? 1 : M % 32 == 0 ? 2 : 3;
constexpr int WS_PV_CB = 1 << WS_PV_CB_LOG2;           // PV warp column blocks
constexpr int WS_PV_WARPS = WS_PV_RB * WS_PV_CB;
// PV warp pw's row block and column block (WGPV: a warpgroup shares a column block)
DL_DEVICE constexpr int pv_row_block(int pw) { return WGPV ? pw % WS_PV_RB : pw >> WS_PV_CB_LOG2; }
DL_DEVICE constexpr int pv_col_block(int pw) { return WGPV ? pw / WS_PV_RB : pw & (WS_PV_CB - 1); }
constexpr int WS_PV_COLS = kV / WS_PV_CB;              // value columns of a PV warp
constexpr int WS_PV_NT = WS_PV_COLS / 8;               // its 8-wide n-tiles of O per m16 tile
constexpr int WARPS = WS ? WS_QK_WARPS + WS_PV_WARPS : ROW_GROUPS * C;
constexpr int QK_CHAINS = DL_QK_CHAINS;        // WS: accumulator sets of a QK warp (interleaved k-steps)
// DL_WS_PVSM: the PV warps do the mask and the online softmax too; the QK warps only compute S
// (fp32, through two S slots in shared memory), which shortens the QK warps' critical path.
constexpr bool PVSM = DL_WS_PVSM != 0;
static_assert(!PVSM || DL_WS, "DL_WS_PVSM needs DL_WS");
// DL_WS_SKEW: a QK warp runs tile t-1's mask and softmax in one block with tile t's mma (the
// softmax fills the mma chain's ldmatrix waits); the PV warps apply tile t-2, so a tile's V lives
// one iteration longer and tiles are loaded STAGES - 3 ahead.
constexpr bool SKEW = DL_WS_SKEW != 0;
// DL_WS_WGMMA (sm_90a): the four QK warps are one warpgroup and compute S of a 64 x 32 tile with
// wgmma m64n32k16 (A: Q, from registers for the first DL_WS_QREGS k-steps, then from shared
// memory; B: the K tile from shared memory, read once per warpgroup instead of once per warp). K
// tiles and the shared-memory part of Q are then stored in wgmma's 128-byte-swizzled K-major layout
// (sw_off), which the loaders write and the PV warps' ldmatrix of V reads free of bank conflicts.
constexpr bool WG = DL_WS_WGMMA != 0;
// Where the previous tile's softmax goes among the 36 k-steps (SKEW): its math at k-step
// DL_SKEW_MATH_AT, its shared-memory stores at DL_SKEW_STORE_AT. ptxas keeps the stores in order
// with the k-steps' ldmatrix and sinks the math to just before the stores, so the stores' place
// decides the overlap. On the H200 (32-key tile, 20 Q k-steps in registers, bench_tiles against
// the 3-stage tile without SKEW, 64-row shapes, the noisy 16 h x 8 x 32k x 256 left out): stores
// at k-step 27-35 1.04-1.06x (9 h x 200k x 256: 1.06-1.10x), at 18 0.97-1.00x, at 9 1.00-1.01x,
// after the last k-step (no overlap) 1.03-1.05x; the math's place (2-8) matters little. With
// DL_WS_WGMMA the two have no effect: the whole softmax runs after the 36 wgmma are issued.
#ifndef DL_SKEW_MATH_AT
#define DL_SKEW_MATH_AT 4
#endif
#ifndef DL_SKEW_STORE_AT
#define DL_SKEW_STORE_AT 31
#endif
constexpr int SKEW_MATH_AT = DL_SKEW_MATH_AT, SKEW_STORE_AT = DL_SKEW_STORE_AT;  // k-steps (SKEW)
static_assert(SKEW_MATH_AT <= SKEW_STORE_AT && SKEW_STORE_AT < kQK / 16, "SKEW: the softmax's math, then its stores, inside the 36 k-steps");
static_assert(!SKEW || (DL_WS && !PVSM && DL_STAGES >= 4), "DL_WS_SKEW needs DL_WS, no DL_WS_PVSM and DL_STAGES >= 4");
static_assert(QK_CHAINS >= 1 && QK_CHAINS <= 4 && (kQK / 16) % QK_CHAINS == 0, "DL_QK_CHAINS: 1 to 4, dividing the 36 k-steps");
static_assert(DL_WS_QREGS >= 1 && DL_WS_QREGS <= 32, "DL_WS_QREGS: 1..32 k-steps of Q's latent columns");
constexpr int THREADS = WARPS * 32;
constexpr int kQElem = sizeof(bf16);           // bytes per q element
constexpr int kKvElem = sizeof(kv_elem);       // bytes per cache element
static_assert(kQElem == kKvElem, "Q and K tiles share ROW_BYTES: a narrower cache needs its own K row layout");
constexpr int ROW_BYTES = kQK * kKvElem + 16;  // 1168: padded so 8 consecutive rows hit 8 different 16-B bank groups
constexpr int CHUNKS = kQK * kKvElem / 16;     // 72 16-byte chunks per row
// WG: chunk c of row r of a tile of `rows` rows, 128-byte swizzled: 64-column slabs of rows x 128 B
// (slab c / 8; row r at r * 128; its chunk c % 8 at (c % 8) ^ (r % 8)): the tile must start
// 1024-byte aligned
DL_DEVICE constexpr u32 sw_off(int r, int c, int rows) { return (c >> 3) * (rows * 128) + r * 128 + (((c & 7) ^ (r & 7)) << 4); }
// WG: orders this thread's landed cp.async copies (generic proxy) before the QK warps' wgmma
// reads of them (async proxy), ahead of the CTA barrier that publishes them; nothing otherwise
DL_DEVICE void wg_fence_landed() {
#if DL_WS_WGMMA
  dl::fence_proxy_async();
#endif
}
// byte offset of chunk c of key row `key` in a K stage (padded rows, or WG's swizzled slabs)
DL_DEVICE constexpr u32 k_off(int key, int c) { return WG ? sw_off(key, c, N) : key * ROW_BYTES + c * 16; }
// bytes between K stages (WG: 1024-byte multiples, for the swizzle)
constexpr int KT_STRIDE = WG ? N * CHUNKS * 16 : N * ROW_BYTES;
constexpr int V_CHUNKS = kV * kKvElem / 16;    // 64 16-byte chunks of V per row
constexpr int KSTEPS = kQK / 16 / C;           // k-steps of the QK^T contraction per warp
constexpr int VCOLS = kV / C;                  // value columns per warp
constexpr int NT_S = N / 8;                    // 8-wide n-tiles of S
constexpr int XWORDS = NT_S * 4 * 32;          // one warp's S fragment, in floats
constexpr int WS_QREGS = DL_WS_QREGS;          // WS: k-steps of Q's latent columns in a QK warp's registers
constexpr int WS_QS_COLS = kQK - 16 * WS_QREGS;  // WS: Q columns read from shared memory (the rest + rope)
constexpr int WS_QS_ROW = WS_QS_COLS * 2 + 16;   // WS: bytes per row of that Q tile (padded)
constexpr int Q_BYTES = WS ? M * WS_QS_ROW : (QREG ? 0 : M * ROW_BYTES);
constexpr int K_BYTES = STAGES * N * ROW_BYTES;
constexpr int X_BYTES = (C > 1) ? WARPS * XWORDS * 4 : 0;  // one buffer: the per-tile __syncthreads orders reuse
// Reduce-scatter exchange (DL_EXCHANGE 1): each warp finishes S, the mask and P of OWN_NT of
// the NT_S n-tiles; P goes through a 16 x N bf16 buffer per row group (rows padded to P_ROW
// bytes so the u32 stores and the ldmatrix reads are free of bank conflicts), the per-row
// maxima (and at the end the row sums) through C x 16 floats per row group.
constexpr bool RS = DL_EXCHANGE != 0;
constexpr int OWN_NT = RS ? NT_S / C : NT_S;   // n-tiles of S this warp finishes
constexpr int P_ROW = N * 2 + 16;              // bytes per row of the P buffer
constexpr int S_ROW = (N + 8) * 4;             // PVSM: bytes per row of an S slot (padded: float2 stores of 8 rows, 2 wavefronts)
constexpr int S_BYTES = PVSM ? 2 * M * S_ROW : 0;  // PVSM: two S slots (fp32)
// PVSM with 32 keys: the 16-byte chunks of odd S rows are swapped in pairs (chunk c at c ^ 1), so
// that the softmax's 16-byte reads (two rows x four threads per quarter warp) hit eight
// different bank groups; the QK warps' float2 stores stay conflict-free (rows stride 10 chunks).
constexpr bool S_SWZ = PVSM && N == 32;
DL_DEVICE int s_chunk(int row, int c) { return S_SWZ ? c ^ (row & 1) : c; }
constexpr int WS_SLOTS = PVSM ? 1 : 2;         // WS: P and rescale-factor slots (PVSM: written and read by the PV warps in one iteration)
constexpr int P_BYTES = WS ? WS_SLOTS * M * P_ROW : (RS ? M * P_ROW : 0);  // WS: P slots
constexpr int MX_BYTES = WS ? WS_SLOTS * M * 4 : (RS ? M * C * 4 : 0);      // WS: slots of rescale factors
static_assert(!PVSM || ((Q_BYTES + K_BYTES + P_BYTES + MX_BYTES) % 16 == 0 && S_ROW % 16 == 0),
              "PVSM: the softmax reads S rows with 16-byte loads");
// PV over row pairs (DL_PV_ROWS 32): MT m16 tiles per warp, PV_COLS value columns each.
constexpr bool PV2 = DL_PV_ROWS == 32;
constexpr int MT = PV2 ? 2 : 1;
constexpr int PV_COLS = PV2 ? kV / (2 * C) : VCOLS;
constexpr int NT_OP = PV_COLS / 8;             // 8-wide n-tiles of O per warp and m16 tile
// WS: final row sums, two slots of visibility words, and the segment record (WsSeg).
constexpr int WS_SEG_BYTES = 96;
constexpr int L_BYTES = WS ? M * 4 + (PVSM ? 0 : 2 * M * 4) + WS_SEG_BYTES : (PV2 ? M * 4 : 0);  // (PVSM: no visibility words)
// K tiles by bulk copies (DL_BULK; sm_90+, cp.async below): one thread per key row copies the
// row with one cp.async.bulk, completion counted by one mbarrier per stage (8 B each; reserved
// whatever the architecture, so the size the host computes does not depend on it).
constexpr bool BULK = DL_VA_BULK != 0;
constexpr int BAR_BYTES = DL_BULK ? STAGES * 8 : 0;
constexpr int BAR_OFFSET = Q_BYTES + K_BYTES + X_BYTES + P_BYTES + MX_BYTES + S_BYTES + L_BYTES;
constexpr int SMEM_BYTES = BAR_OFFSET + BAR_BYTES;
constexpr int SCHED_THREADS = 512;
constexpr float kLn2 = 0.6931471805599453f;
// The combine: 8 warps per CTA; a row's pieces are shared by row_warps of them (1, 2, 4 or 8), so
// that no warp streams more than 8 pieces for a pair split into up to 32 (each warp keeps two
// pieces' loads in flight), and a CTA takes 8 / row_warps rows per work item. (At most 4 pieces
// per warp was slower at batch 8: twice the items, two per CTA.)
constexpr int COMBINE_WARPS = 8;
constexpr int COMBINE_CTAS_PER_SM = 2;  // __launch_bounds__ (<= 128 registers: two pieces in flight, 0 spills)
DL_DEVICE int combine_row_warps(int pieces) { return pieces <= 8 ? 1 : pieces <= 16 ? 2 : pieces <= 32 ? 4 : 8; }

static_assert(M % 16 == 0 && N % 16 == 0, "tiles are made of 16x16 mma steps");
static_assert((kQK / 16) % C == 0 && VCOLS % 16 == 0, "C must split 36 k-steps and 512 columns evenly");
static_assert((WS || THREADS % M == 0) && THREADS % N == 0, "row loaders assume whole threads per row");
static_assert(ROW_GROUPS <= 15, "one named barrier per row group");
static_assert(DL_PV_ROWS == 16 || DL_PV_ROWS == 32, "DL_PV_ROWS: 16 or 32");
static_assert(!PV2 || (RS && ROW_GROUPS % 2 == 0 && PV_COLS % 16 == 0), "32 PV rows need the reduce-scatter exchange and whole row pairs");
static_assert(1 + ROW_GROUPS + (PV2 ? ROW_GROUPS / 2 : 0) <= 16, "named barriers: 0, one per row group, one per pair");
static_assert(!RS || (C > 1 && NT_S % C == 0), "the reduce-scatter exchange needs C > 1 and whole n-tiles per warp");
static_assert(DL_EXCHANGE == 0 || DL_EXCHANGE == 1, "DL_EXCHANGE: 0 all-reduce, 1 reduce-scatter");
static_assert(!WS || (C == 1 && !QREG && !RS && !PV2 && !DL_BULK && (M == 32 || M == 48 || M == 64) && STAGES >= 3),
              "DL_WS: C = 1, no QREG / exchange / PV rows / bulk, 32, 48 or 64 rows, >= 3 stages");
static_assert(!WS || N <= 32, "DL_WS: a row's visibility word holds one tile's keys (u32)");
static_assert(!WG || (WS && M == 64 && N == 32 && !PVSM), "DL_WS_WGMMA: ws, 64 rows (one warpgroup of QK warps), 32 keys, no PVSM");
static_assert(!WGPV || (WG && WS_PV_COLS == 256 && WS_PV_RB == 4), "DL_WS_WGMMA_PV: with DL_WS_WGMMA, two warpgroups of 64 x 256");
static_assert(!WG || (kQK - 16 * DL_WS_QREGS) % 64 == 0, "DL_WS_WGMMA: the Q tile in whole 64-column slabs (DL_WS_QREGS a multiple of 4)");
static_assert(SMEM_BYTES <= DL_SMEM_LIMIT, "tile configuration exceeds the architecture's shared memory per block");
static_assert(SMEM_BYTES == DL_SMEM_BYTES, "shared-memory layout differs from TileConfig.shared_bytes (what the host launches with)");
static_assert(BAR_OFFSET % 8 == 0, "mbarriers need 8-byte alignment");
static_assert(!WS || sizeof(WsSeg) <= WS_SEG_BYTES, "WsSeg outgrew its shared-memory record");
static_assert(!DL_BULK || (32 % (THREADS / N) == 0), "BULK: a key row's threads are lanes of one warp");

// The maximum / sum of v over the quad of lanes that owns one row of an m16n8 fragment.
DL_DEVICE float quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
DL_DEVICE float quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}
// mxA, mxB (a row's running maxima) raised to the maxima of the first NT n-tiles of an m16n8
// S fragment s: row A in elements 0, 1, row B in 2, 3, a row's owners one quad of lanes.
template <int NT, int NA>
DL_DEVICE void raise_row_maxima(const float (&s)[NA][4], float& mxA, float& mxB) {
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    mxA = fmaxf(mxA, fmaxf(s[n][0], s[n][1]));
    mxB = fmaxf(mxB, fmaxf(s[n][2], s[n][3]));
  }
  mxA = quad_max(mxA);
  mxB = quad_max(mxB);
}
// The exponent base of a row whose maximum is mx: 0 while it has no visible key (mx = -inf), so
// that exp2(-inf - base) is 0 and not NaN.
DL_DEVICE float softmax_base(float mx) { return mx == DL_NEG_INF ? 0.f : mx; }

DL_DEVICE i64 load_index(const void* base, bool is64, i64 i) {
  return is64 ? __ldg(static_cast<const i64*>(base) + i) : static_cast<i64>(__ldg(static_cast<const i32*>(base) + i));
}

// Copy ROWS rows of 576 elements (q or cache rows, CHUNKS x 16 bytes) into shared memory (padded
// rows). Thread t copies part of row t / (THREADS/ROWS); its source row is `src` (16-byte
// aligned), or it zero-fills when `valid` is false (`src` must still be a mapped address:
// cp.async reads 0 bytes of it).
template <int ROWS>
DL_DEVICE void load_row_part(u32 smem_base, const void* src, bool valid) {
  constexpr int TPR = THREADS / ROWS;  // threads per row
  const int r = threadIdx.x / TPR;
  const u32 dst = smem_base + r * ROW_BYTES;
  const char* s = reinterpret_cast<const char*>(src);
  const int nbytes = valid ? 16 : 0;
#pragma unroll
  for (int c = threadIdx.x % TPR; c < CHUNKS; c += TPR) dl::cp_async_16(dst + c * 16, s + (valid ? c * 16 : 0), nbytes);
}

// Zero every non-finite bf16 among the V columns (first 512) of a K tile in shared memory.
static_assert(kKvElem == 2, "zero_nonfinite_v tests bf16 bit patterns: write its test for the cache's element type");
DL_DEVICE void zero_nonfinite_v(unsigned char* tile, int first = threadIdx.x, int stride = THREADS) {
  for (int c = first; c < N * V_CHUNKS; c += stride) {
    uint4* q = reinterpret_cast<uint4*>(tile + k_off(c / V_CHUNKS, c % V_CHUNKS));
    uint4 v = *q;
    u32 w[4] = {v.x, v.y, v.z, v.w};
    bool changed = false;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const u32 lo = (w[k] & 0x7f80u) == 0x7f80u ? 0u : (w[k] & 0xffffu);
      const u32 hi = (w[k] & 0x7f800000u) == 0x7f800000u ? 0u : (w[k] & 0xffff0000u);
      changed |= (lo | hi) != w[k];
      w[k] = lo | hi;
    }
    if (changed) *q = make_uint4(w[0], w[1], w[2], w[3]);
  }
}
}  // namespace va

// Is draft token j visible from draft token i (same request)? Only called for keys past the prefix.
DL_DEVICE bool draft_visible(const VerifyAttnParams& p, const VaRequest& rq, int i, int j) {
  switch (p.mask_mode) {
    case kMaskCausal:
      return j <= i;
    case kMaskBitmask: {
      const u32* w = static_cast<const u32*>(p.mask);
      return (__ldg(w + (rq.q_start + i) * p.mask_words + (j >> 5)) >> (j & 31)) & 1u;
    }
    case kMaskQlenOnly: {
      const u8* m = static_cast<const u8*>(p.mask);
      return __ldg(m + rq.mask_base + (i64)i * rq.q_len + j) != 0;
    }
    default: {  // kMaskFull: q_len x (kv_len + q_len) per request, prefix columns first
      const u8* m = static_cast<const u8*>(p.mask);
      return __ldg(m + rq.mask_base + (i64)i * ((i64)rq.kv_len + rq.q_len) + rq.kv_len + j) != 0;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// The scheduler.
// ---------------------------------------------------------------------------------------------
namespace va {
// Read and check request b's metadata; `report`: raise the device error for bad metadata (the
// scheduler; the partial kernel recomputes the same request silently).
DL_DEVICE VaRequest check_request(const VerifyAttnParams& p, int b, bool report) {
  VaRequest rq;
  rq.q_start = rq.kv_start = rq.mask_base = 0;
  rq.q_len = rq.kv_len = rq.row_tiles = rq.key_tiles = 0;
  // every load first (independent), then the checks
  const bool has_mip = p.mask_mode == kMaskFull || p.mask_mode == kMaskQlenOnly;
  const i64 qs = load_index(p.qo_indptr, p.idx64 & kQo64, b);
  const i64 qe = load_index(p.qo_indptr, p.idx64 & kQo64, b + 1);
  const i64 ks = load_index(p.kv_indptr, p.idx64 & kKvptr64, b);
  const i64 ke = load_index(p.kv_indptr, p.idx64 & kKvptr64, b + 1);
  const i64 ms = has_mip ? load_index(p.mask_indptr, p.idx64 & kMip64, b) : 0;
  const i64 me = has_mip ? load_index(p.mask_indptr, p.idx64 & kMip64, b + 1) : 0;
  if (qs < 0 || qe < qs) {
    if (report) dl::report_error(p.err, b, DL_FIELD_QO_INDPTR, DL_ERR_NOT_MONOTONIC);
    return rq;  // its rows are unknown: nothing is written
  }
  if (qe > p.q_rows) {
    if (report) dl::report_error(p.err, b, DL_FIELD_QO_INDPTR, DL_ERR_OUT_OF_RANGE);
    return rq;
  }
  if (qe - qs > p.max_q) {
    if (report) dl::report_error(p.err, b, DL_FIELD_QO_INDPTR, DL_ERR_OVER_MAX);
    return rq;
  }
  rq.q_start = qs;
  rq.q_len = static_cast<i32>(qe - qs);
  rq.row_tiles = (rq.q_len * p.num_heads + M - 1) / M;
  if (rq.q_len == 0) return rq;

  bool ok = true;
  if (ks < 0 || ke < ks) {
    if (report) dl::report_error(p.err, b, DL_FIELD_KV_INDPTR, DL_ERR_NOT_MONOTONIC);
    ok = false;
  } else if (ke > p.kv_indices_len || ke - ks > 0x7fff0000LL) {
    if (report) dl::report_error(p.err, b, DL_FIELD_KV_INDPTR, DL_ERR_OUT_OF_RANGE);
    ok = false;
  }
  if (ok && has_mip) {
    const i64 kv = ke - ks;
    const i64 want = p.mask_mode == kMaskFull ? (i64)rq.q_len * (kv + rq.q_len) : (i64)rq.q_len * rq.q_len;
    if (ms < 0 || me > p.mask_len) {
      if (report) dl::report_error(p.err, b, DL_FIELD_MASK_INDPTR, DL_ERR_OUT_OF_RANGE);
      ok = false;
    } else if (me - ms != want) {
      if (report) dl::report_error(p.err, b, DL_FIELD_MASK_INDPTR, DL_ERR_INCONSISTENT);
      ok = false;
    } else {
      rq.mask_base = ms;
    }
  }
  if (ok) {
    rq.kv_start = ks;
    rq.kv_len = static_cast<i32>(ke - ks);
    rq.key_tiles = static_cast<i32>(((i64)rq.kv_len + rq.q_len + N - 1) / N);
  }  // else: no keys, so its rows get zeros and LSE -inf (a defined output)
  return rq;
}
}  // namespace va

namespace va {
// The schedule's per-request exclusive prefix sums of cost and of pairs (at most
// DL_VA_MAX_BATCH requests), in the shared memory of the block that computes them.
struct SchedPrefix {
  i64 chunk_cost[32];  // per warp of the block scan
  i32 chunk_pairs[32], chunk_max[32], chunk_min[32];
  i64 cost_excl[DL_VA_MAX_BATCH + 1];
  i32 pair_excl[DL_VA_MAX_BATCH + 1];
  i32 pair_cost[DL_VA_MAX_BATCH];
};
// What the cuts depend on besides the prefix sums (block-uniform).
struct SchedPlan {
  i64 total, per_part;
  i32 B, G, pairs, kt_al, s_al, aligned;
};

// Every thread of a block of T: checks the requests (SCHEDULER: writing them to p.reqs and raising
// device errors), the prefix sums into s, and the cut rule. The scheduler and every CTA of the
// partial kernel run this same code, so their cuts are the same.
template <int T, bool SCHEDULER>
DL_DEVICE SchedPlan schedule_prefix(const VerifyAttnParams& p, SchedPrefix& s, VaRequest* keep = nullptr) {
  static_assert(T % 32 == 0 && T <= 1024, "one chunk entry per warp");
  const int B = min(p.batch_size, DL_VA_MAX_BATCH);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  i64 carry_cost = 0;
  i32 carry_pairs = 0, max_pair = 0, min_pair = 0x7fffffff;  // pair costs, over requests with rows
#pragma unroll 1
  for (int base = 0; base < B; base += T) {
    const int b = base + tid;
    i64 c = 0;
    i32 n = 0, pc = 0, pm = 0x7fffffff;
    if (b < B) {
      const VaRequest rq = check_request(p, b, SCHEDULER);
      if (SCHEDULER) p.reqs[b] = rq;
      if (keep != nullptr) keep[b] = rq;  // (the partial kernel's first segment record reads it)
      pc = rq.key_tiles + OVH;
      s.pair_cost[b] = pc;
      n = rq.row_tiles;
      c = (i64)n * pc;
      if (n == 0) pc = 0;
      else pm = pc;
    }
    // block-wide inclusive scan of (c, n), max and min of pc
    i64 sc = c;
    i32 sn = n, mx = pc, mn = pm;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const i64 vc = __shfl_up_sync(0xffffffffu, sc, o);
      const i32 vn = __shfl_up_sync(0xffffffffu, sn, o);
      if (lane >= o) {
        sc += vc;
        sn += vn;
      }
      mx = max(mx, __shfl_xor_sync(0xffffffffu, mx, o));
      mn = min(mn, __shfl_xor_sync(0xffffffffu, mn, o));
    }
    if (lane == 31) {
      s.chunk_cost[warp] = sc;
      s.chunk_pairs[warp] = sn;
      s.chunk_max[warp] = mx;
      s.chunk_min[warp] = mn;
    }
    __syncthreads();
    i64 wc = carry_cost;
    i32 wn = carry_pairs;
    for (int w = 0; w < warp; ++w) {
      wc += s.chunk_cost[w];
      wn += s.chunk_pairs[w];
    }
    if (b < B) {
      s.cost_excl[b + 1] = wc + sc;
      s.pair_excl[b + 1] = wn + sn;
    }
    for (int w = 0; w < T / 32; ++w) {
      carry_cost += s.chunk_cost[w];
      carry_pairs += s.chunk_pairs[w];
      max_pair = max(max_pair, s.chunk_max[w]);
      min_pair = min(min_pair, s.chunk_min[w]);
    }
    __syncthreads();
  }
  if (tid == 0) {
    s.cost_excl[0] = 0;
    s.pair_excl[0] = 0;
  }
  __syncthreads();
  SchedPlan g;
  g.B = B;
  g.total = carry_cost;
  g.G = min(p.num_parts, DL_VA_MAX_PARTS);
  i64 per_part = (g.total + g.G - 1) / g.G;
  if (p.split_cap > 0) per_part = max(per_part, (i64)((max_pair + p.split_cap - 1) / p.split_cap));
  if (per_part < 1) per_part = 1;
  g.per_part = per_part;
  // Aligned splits: when every pair costs the same (a uniform batch) and no split cap is set, each
  // pair may be cut into s equal pieces, one per part (parts past pairs * s stay empty), so that no
  // part starts a second segment: a segment's start and its split epilogue cost about OVH / 2 key
  // tiles, so the aligned cut is taken when its piece is at most per_part + OVH / 2 tiles.
  // The last part is left out (G_al = G - 1 parts): where the partial kernel's CTA fills an SM's
  // registers, the one on the scheduler's SM starts only when the scheduler exits, and it is the
  // grid's last (9 h x 1 x 32k chain: 3.5 us). (driverlevel.reference.verify_schedule mirrors the rule.)
  g.pairs = carry_pairs;
  g.kt_al = max_pair - OVH;  // key tiles of every pair (when aligned)
  const int G_al = g.G > 1 ? g.G - 1 : g.G;
  g.s_al = g.pairs > 0 && g.pairs <= G_al ? min(G_al / g.pairs, max(g.kt_al, 1)) : 0;
  g.aligned = p.split_cap == 0 && g.s_al >= 1 && max_pair == min_pair && g.kt_al >= 1 &&
              2 * ((g.kt_al + g.s_al - 1) / g.s_al) <= 2 * per_part + OVH;
  return g;
}

// Cut q (0 <= q <= G) of the work sequence: at unit min(q * per_part, total), or (aligned) at
// piece q % s of pair q / s.
DL_DEVICE VaCut schedule_cut(const SchedPrefix& s, const SchedPlan& g, int q) {
  VaCut cut;
  const int B = g.B;
  if (g.aligned) {
    if (q >= g.pairs * g.s_al) {
      cut.b = B;
      cut.r = 0;
      cut.t = 0;
      cut.gp = g.pairs;
    } else {  // the request b with pair_excl[b] <= gp < pair_excl[b+1]
      const int gp = q / g.s_al, j = q % g.s_al;
      int lo = 0, hi = B - 1;
      while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (s.pair_excl[mid] <= gp) lo = mid; else hi = mid - 1;
      }
      cut.b = lo;
      cut.r = gp - s.pair_excl[lo];
      // rounded up: the longer pieces come first, so the pair's last piece -- its partial last tile
      // and the draft keys' masks -- is one of the shorter ones (increasing in j: kt_al >= s_al)
      cut.t = static_cast<i32>(((i64)j * g.kt_al + g.s_al - 1) / g.s_al);
      cut.gp = gp;
    }
    return cut;
  }
  const i64 u = min((i64)q * g.per_part, g.total);
  if (u >= g.total) {
    cut.b = B;
    cut.r = 0;
    cut.t = 0;
    cut.gp = g.pairs;
  } else {  // the request b with cost_excl[b] <= u < cost_excl[b+1]
    int lo = 0, hi = B - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) >> 1;
      if (s.cost_excl[mid] <= u) lo = mid; else hi = mid - 1;
    }
    const int b = lo;
    const i64 x = u - s.cost_excl[b];
    const int pc = s.pair_cost[b];
    cut.b = b;
    cut.r = static_cast<i32>(x / pc);
    cut.t = max(0, static_cast<i32>(x % pc) - OVH);
    cut.gp = s.pair_excl[b] + cut.r;
  }
  return cut;
}
// The scheduler's call of schedule_cut: inlined into its loop, ptxas spilled on sm_100 (the
// 64-bit divisions are subroutine calls; their convention then left the loop short of registers).
__device__ __noinline__ VaCut schedule_cut_call(const SchedPrefix* s, SchedPlan g, int q) {
  return schedule_cut(*s, g, q);
}
}  // namespace va

extern "C" __global__ void __launch_bounds__(va::SCHED_THREADS)
verify_attn_schedule(const __grid_constant__ VerifyAttnParams p) {
  using namespace va;
  constexpr int kMaxParts = DL_VA_MAX_PARTS;
  __shared__ SchedPrefix sp;
  __shared__ VaCut s_cuts[kMaxParts + 1];
  __shared__ i32 scan_scratch[SCHED_THREADS / 32];
  // PDL: the partial kernel may be launched now. Its CTAs compute their own two cuts with the
  // same functions (schedule_prefix, schedule_cut) and never read this kernel's tables; they wait
  // for this grid before they exit, so that the combine (which waits for the partial grid) reads
  // complete entries. (This launch itself is ordinary: everything before it has completed.)
  dl::pdl_launch_dependents();
  VA_STAMP(0, 0, 0, "start", 0);
  const int tid = threadIdx.x;
  const SchedPlan g = schedule_prefix<SCHED_THREADS, true>(p, sp);
  const int G = g.G;
  for (int q = tid; q <= G; q += SCHED_THREADS) {
    const VaCut cut = schedule_cut_call(&sp, g, q);
    p.cuts[q] = cut;
    s_cuts[q] = cut;
  }
  __syncthreads();

  // Combine entries: the lowest cut inside a split pair X lists X's pieces. Then the combine's
  // work items: a running count over the entries (block scan, SCHED_THREADS entries at a time).
  i32 item_carry = 0;
  for (int base = 0; base < G; base += SCHED_THREADS) {
    const int q = base + tid;
    VaEntry e;
    e.b = -1;
    e.r = e.p_first = e.p_last = e.row_warps = e.rows = e.slot0 = e.empty = e.pad = 0;
    e.out_row0 = 0;
    const int c = q + 1;  // entry q belongs to cut c = q + 1 (its first piece is in part q)
    if (q < G) e.empty = s_cuts[q].gp == s_cuts[q + 1].gp && s_cuts[q].t == s_cuts[q + 1].t;
    if (c < G) {
      const VaCut cc = s_cuts[c];
      const VaCut cp = s_cuts[c - 1];
      if (cc.t > 0 && !(cp.gp == cc.gp && cp.t > 0)) {
        int last = c;
        while (last + 1 <= G) {
          const VaCut cn = s_cuts[last + 1];
          if (cn.gp == cc.gp && cn.t > 0) ++last; else break;
        }
        e.b = cc.b;
        e.r = cc.r;
        e.p_first = c - 1;
        e.p_last = last;
        // the first piece is part q's last segment (slot 2q + 1) unless the part starts at the pair
        e.slot0 = (cp.gp == cc.gp && cp.t == 0) ? 2 * q : 2 * q + 1;
      }
    }
    i32 items = 0;
    if (e.b >= 0) {  // the pair's rows (reqs[e.b] was written by this block before the barriers above)
      const VaRequest rq = p.reqs[e.b];
      e.rows = min(M, rq.q_len * p.num_heads - e.r * M);
      e.out_row0 = rq.q_start * p.num_heads + (i64)e.r * M;
      e.row_warps = combine_row_warps(e.p_last - e.p_first + 1);
      items = (e.rows * e.row_warps + COMBINE_WARPS - 1) / COMBINE_WARPS;
    }
    i32 all;  // this round's items (block-wide)
    e.item_end = item_carry + dl::block_excl_scan<SCHED_THREADS>(items, scan_scratch, &all) + items;
    if (q < G) p.entries[q] = e;
    item_carry += all;
  }
  VA_STAMP(0, 0, 1, "end", G);
}

// ---------------------------------------------------------------------------------------------
// The partial kernel: one persistent CTA per part.
// ---------------------------------------------------------------------------------------------
namespace va {
// Attention of rows r*M .. r*M+M-1 of request rq over its key tiles [t_begin, t_end). Writes the
// final output if `complete`, else partial slot `slot`. `loaded`: K tiles this CTA has loaded
// before the segment (BULK: tile g goes to stage g % STAGES, the (g / STAGES)-th phase of its
// mbarrier); advanced by the segment's tiles.
DL_DEVICE void attend_segment(const VerifyAttnParams& p, unsigned char* smem, int b, const VaRequest& rq, int r,
                              int t_begin, int t_end, bool complete, int slot, u32& loaded) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int rg = warp / C, cpart = warp % C;
  const int H = p.num_heads;
  const int rows = rq.q_len * H;
  const int row0 = r * M;
  const int kv_len = rq.kv_len, q_len = rq.q_len;
  const i64 total = (i64)kv_len + q_len;
  const u32 q_smem = dl::smem_u32(smem);
  const u32 k_smem = q_smem + Q_BYTES;
  float* xbuf = reinterpret_cast<float*>(smem + Q_BYTES + K_BYTES);
  // RS: this row group's P buffer (16 rows x N keys, bf16) and its C x 16 row maxima / row sums.
  unsigned char* pbuf = smem + Q_BYTES + K_BYTES + X_BYTES + (warp / C) * 16 * P_ROW;
  float* mxbuf = reinterpret_cast<float*>(smem + Q_BYTES + K_BYTES + X_BYTES + P_BYTES) + (warp / C) * C * 16;
  // PV over the row pair (PV2): its first row group, this warp's block of PV_COLS columns among
  // the pair's 2C warps, the pair's named barrier, the partner group's row maxima, the row sums.
  const int pv_rg0 = PV2 ? (rg & ~1) : rg;
  const int pv_k = PV2 ? (rg & 1) * C + cpart : cpart;
  const int pair_bar = 1 + ROW_GROUPS + rg / 2;
  const float* mxpartner = mxbuf + ((rg ^ 1) - rg) * C * 16;
  float* lbuf = reinterpret_cast<float*>(smem + Q_BYTES + K_BYTES + X_BYTES + P_BYTES + MX_BYTES);

  if constexpr (!QREG) {  // Q tile: rows row0 .. row0+M-1 of this request (zero past the last row)
    const int rr = tid / (THREADS / M);
    const bool valid = row0 + rr < rows;
    load_row_part<M>(q_smem, valid ? p.q + (rq.q_start * H + row0 + rr) * kQK : p.q, valid);
  }
  // K tile t holds keys t*N .. t*N+N-1; this thread copies part of key row t*N + krow. The slot
  // id of the next tile to load is fetched one tile ahead (fetch_slot), so its latency is hidden
  // behind a tile of math instead of stalling the cp.async issue.
  const int krow = tid / (THREADS / N);
  const bool leader = BULK && tid % (THREADS / N) == 0;  // BULK: the one thread that copies row krow
  [[maybe_unused]] const u32 bars = q_smem + BAR_OFFSET;  // (BULK only)
  const u32 g0 = loaded;
  auto fetch_slot = [&](int t) -> i64 {  // -1 past the last key (load_k checks the key again)
    const i64 key = (i64)t * N + krow;
    if constexpr (BULK) {
      if (!leader) return -1;  // (not used)
    }
    if (key >= total) return -1;
    return key < kv_len ? load_index(p.kv_indices, p.idx64 & kKvi64, rq.kv_start + key)
                        : load_index(p.out_cache_loc, p.idx64 & kLoc64, rq.q_start + (key - kv_len));
  };
  auto load_k = [&](int t, i64 slot_id, int stage) {  // zero rows past the last key or at a bad slot id
    const i64 key = (i64)t * N + krow;
    bool valid = key < total;
    const kv_elem* src = p.kv_cache;
    if (valid) {
      if (slot_id < 0 || slot_id >= p.num_slots) {
        if (tid % (THREADS / N) == 0)
          dl::report_error(p.err, b, key < kv_len ? DL_FIELD_KV_INDICES : DL_FIELD_OUT_CACHE_LOC, DL_ERR_OUT_OF_RANGE);
        valid = false;
      } else {
        src = p.kv_cache + slot_id * kQK;
      }
    }
#if DL_VA_BULK
    // The row's THREADS/N threads (consecutive lanes of one warp) learn from its leader whether
    // the row is copied; a missing row (past the last key, or a bad slot id) is zeroed by all of
    // them (each fences its own generic writes before a later bulk copy into the row). The
    // consumers read it after the __syncthreads at the top of its tile, so the leader's arrival
    // only has to count.
    const bool row_valid = __shfl_sync(0xffffffffu, valid, (threadIdx.x & 31) & ~(THREADS / N - 1));
    const u32 bar = bars + stage * 8;
    const u32 dst = k_smem + stage * (N * ROW_BYTES) + krow * ROW_BYTES;
    if (!row_valid) {
      uint4* z = reinterpret_cast<uint4*>(smem + (dst - q_smem));
      for (int c = tid % (THREADS / N); c < CHUNKS; c += THREADS / N) z[c] = make_uint4(0u, 0u, 0u, 0u);
      dl::fence_proxy_async();
    }
    if (leader) {  // one arrival per key row and tile: the row's bytes, or none
      if (row_valid) {
        dl::mbar_arrive_expect_tx(bar, kQK * kKvElem);
        dl::bulk_copy_g2s(dst, src, kQK * kKvElem, bar);
      } else {
        dl::mbar_arrive(bar);
      }
    }
#else
    load_row_part<N>(k_smem + stage * (N * ROW_BYTES), src, valid);
#endif
  };
  // the shared-memory stage of the segment's it-th tile
  auto stage_of = [&](int it) -> int { return BULK ? static_cast<int>((g0 + it) % STAGES) : it % STAGES; };
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (t_begin + s < t_end) load_k(t_begin + s, fetch_slot(t_begin + s), stage_of(s));
    dl::cp_async_commit();
  }
  i64 next_slot = t_begin + STAGES - 1 < t_end ? fetch_slot(t_begin + STAGES - 1) : -1;

  // This thread's two rows in its warp's 16-row block: A (fragment elements 0,1) and B (2,3).
  const int tA = rg * 16 + (lane >> 2), tB = tA + 8;  // rows within the tile
  const int rA = row0 + tA, rB = row0 + tB;
  const int iA = rA / H, iB = rB / H;
  const bool validA = rA < rows, validB = rB < rows;

  // QREG: this warp's Q fragments (rows tA, tB; its KSTEPS k-steps of the contraction) straight
  // from global memory into registers, zero past the last row; the m16n8k16 A layout is
  // a0 = (row g, cols 2c..2c+1), a1 = (row g+8, same), a2 = (row g, cols 8+2c..), a3 = (row g+8, 8+2c..).
  u32 qf[QREG ? KSTEPS : 1][4];
  if constexpr (QREG) {
    const u32* qa = reinterpret_cast<const u32*>(p.q + (rq.q_start * H + (validA ? rA : 0)) * kQK);
    const u32* qb = reinterpret_cast<const u32*>(p.q + (rq.q_start * H + (validB ? rB : 0)) * kQK);
#pragma unroll
    for (int kk = 0; kk < KSTEPS; ++kk) {
      const int w = ((cpart * KSTEPS + kk) * 16 + 2 * (lane & 3)) / 2;  // u32 index of the column pair
      qf[kk][0] = validA ? __ldg(qa + w) : 0u;
      qf[kk][1] = validB ? __ldg(qb + w) : 0u;
      qf[kk][2] = validA ? __ldg(qa + w + 4) : 0u;
      qf[kk][3] = validB ? __ldg(qb + w + 4) : 0u;
    }
  }

  float o[MT][NT_OP][4];  // m16 tile mt: rows of row group pv_rg0 + mt
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int n = 0; n < NT_OP; ++n) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.f;
  float mA = DL_NEG_INF, mB = DL_NEG_INF, lA = 0.f, lB = 0.f;
  float mpA = DL_NEG_INF, mpB = DL_NEG_INF;  // PV2: the partner group's running maxima (its rows A, B)

  for (int t = t_begin; t < t_end; ++t) {
    const int it = t - t_begin;
#if DL_VA_BULK
    dl::mbar_wait(bars + stage_of(it) * 8, ((g0 + it) / STAGES) & 1u);  // tile t's rows have landed
#endif
    dl::cp_async_wait<STAGES - 2>();  // (BULK: only the Q tile's copies are cp.async)
    __syncthreads();  // tile t is in shared memory; every warp is done with tile t-1
    {
      const int tn = t + STAGES - 1;
      if (tn < t_end) {
        load_k(tn, next_slot, stage_of(it + STAGES - 1));
        if (tn + 1 < t_end) next_slot = fetch_slot(tn + 1);
      }
      dl::cp_async_commit();
    }
    const u32 kt = k_smem + stage_of(it) * (N * ROW_BYTES);

    // S (partial over this warp's slice of the 576-dim contraction)
    float s[NT_S][4];
#pragma unroll
    for (int n = 0; n < NT_S; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < KSTEPS; ++kk) {
      const int kcol = (cpart * KSTEPS + kk) * 16;
      u32 a[4];
      if constexpr (QREG) {
        a[0] = qf[kk][0], a[1] = qf[kk][1], a[2] = qf[kk][2], a[3] = qf[kk][3];
      } else {
        dl::ldmatrix_x4(a, q_smem + (rg * 16 + (lane & 15)) * ROW_BYTES + (kcol + (lane >> 4) * 8) * kQElem);
      }
#pragma unroll
      for (int np = 0; np < NT_S / 2; ++np) {
        u32 bk[4];
        dl::ldmatrix_x4(bk, kt + (np * 16 + (lane >> 4) * 8 + (lane & 7)) * ROW_BYTES + (kcol + ((lane >> 3) & 1) * 8) * kKvElem);
        dl::mma_bf16_16816(s[2 * np], a, bk[0], bk[1]);
        dl::mma_bf16_16816(s[2 * np + 1], a, bk[2], bk[3]);
      }
    }
    if constexpr (RS) {  // sum the C partials of this warp's OWN_NT n-tiles only, same fixed order
      float4* mine = reinterpret_cast<float4*>(xbuf + warp * XWORDS);
#pragma unroll
      for (int n = 0; n < NT_S; ++n) mine[n * 32 + lane] = make_float4(s[n][0], s[n][1], s[n][2], s[n][3]);
      dl::named_barrier(1 + rg, C * 32);
      const float4* grp = reinterpret_cast<const float4*>(xbuf + rg * C * XWORDS);
#pragma unroll
      for (int n = 0; n < OWN_NT; ++n) {
        const int ng = cpart * OWN_NT + n;
        float4 acc = grp[ng * 32 + lane];
#pragma unroll
        for (int c = 1; c < C; ++c) {
          const float4 v = grp[c * (XWORDS / 4) + ng * 32 + lane];
          acc.x += v.x;
          acc.y += v.y;
          acc.z += v.z;
          acc.w += v.w;
        }
        s[n][0] = acc.x, s[n][1] = acc.y, s[n][2] = acc.z, s[n][3] = acc.w;
      }
    } else if constexpr (C > 1) {  // sum the C partial S of this row group, in a fixed order
      float* mine = xbuf + warp * XWORDS;
#pragma unroll
      for (int n = 0; n < NT_S; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) mine[(n * 4 + e) * 32 + lane] = s[n][e];
      dl::named_barrier(1 + rg, C * 32);
      const float* grp = xbuf + rg * C * XWORDS;
#pragma unroll
      for (int n = 0; n < NT_S; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float acc = grp[(n * 4 + e) * 32 + lane];
#pragma unroll
          for (int c = 1; c < C; ++c) acc += grp[c * XWORDS + (n * 4 + e) * 32 + lane];
          s[n][e] = acc;
        }
    }

    // scale to base 2, mask draft keys (and keys past the end)
    const bool need_mask = (i64)(t + 1) * N > kv_len;  // uniform across the CTA
    if (need_mask) {  // masked keys must have no influence, finite or not: zero non-finite V
      __syncthreads();  // every warp has read this tile's K for S
      zero_nonfinite_v(smem + Q_BYTES + stage_of(it) * (N * ROW_BYTES));
#if DL_VA_BULK
      dl::fence_proxy_async();  // these generic writes before the bulk copy that refills the stage
#endif
      __syncthreads();
    }
    // s[n] (n < OWN_NT) is n-tile n0 + n of the tile: all of them (all-reduce) or this warp's (RS)
    const int n0 = RS ? cpart * OWN_NT : 0;
#pragma unroll
    for (int n = 0; n < OWN_NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float v = s[n][e] * p.scale_log2;
        if (need_mask) {
          const i64 key = (i64)t * N + (n0 + n) * 8 + 2 * (lane & 3) + (e & 1);
          bool vis = true;
          if (key >= total) {
            vis = false;
          } else if (key >= kv_len) {
            const bool rowB = e >= 2;
            if (rowB ? validB : validA) vis = draft_visible(p, rq, rowB ? iB : iA, static_cast<int>(key - kv_len));
          }
          if (!vis) v = DL_NEG_INF;
        }
        s[n][e] = v;
      }

    // online softmax (rows A and B; a row's 4 owners are one quad of lanes)
    float mxA = mA, mxB = mB;
    raise_row_maxima<OWN_NT>(s, mxA, mxB);
    if constexpr (RS) {  // the max over all N keys: every warp's maxima of its keys (fmaxf: order-free)
      if ((lane & 3) == 0) {
        mxbuf[cpart * 16 + (lane >> 2)] = mxA;
        mxbuf[cpart * 16 + (lane >> 2) + 8] = mxB;
      }
      if constexpr (PV2) dl::named_barrier(pair_bar, 2 * C * 32);  // the partner's maxima too
      else dl::named_barrier(1 + rg, C * 32);
#pragma unroll
      for (int c = 0; c < C; ++c) {
        mxA = fmaxf(mxA, mxbuf[c * 16 + (lane >> 2)]);
        mxB = fmaxf(mxB, mxbuf[c * 16 + (lane >> 2) + 8]);
      }
    }
    // PV2: the partner group's new maxima and rescale factors, as its own warps compute them
    // (fmaxf over the same values: the same bits)
    float palphaA = 1.f, palphaB = 1.f;
    if constexpr (PV2) {
      float pxA = mpA, pxB = mpB;
#pragma unroll
      for (int c = 0; c < C; ++c) {
        pxA = fmaxf(pxA, mxpartner[c * 16 + (lane >> 2)]);
        pxB = fmaxf(pxB, mxpartner[c * 16 + (lane >> 2) + 8]);
      }
      palphaA = exp2f(mpA - softmax_base(pxA));
      palphaB = exp2f(mpB - softmax_base(pxB));
      mpA = pxA;
      mpB = pxB;
    }
    const float baseA = softmax_base(mxA);
    const float baseB = softmax_base(mxB);
    const float alphaA = exp2f(mA - baseA), alphaB = exp2f(mB - baseB);
    mA = mxA;
    mB = mxB;
    lA *= alphaA;
    lB *= alphaB;
    u32 pa[MT][N / 16][4];  // P as m16n8k16 A fragments, per m16 tile of this warp's PV rows
#pragma unroll
    for (int n = 0; n < OWN_NT; ++n) {
      const float p0 = exp2f(s[n][0] - baseA), p1 = exp2f(s[n][1] - baseA);
      const float p2 = exp2f(s[n][2] - baseB), p3 = exp2f(s[n][3] - baseB);
      lA += p0 + p1;
      lB += p2 + p3;
      if constexpr (RS) {  // row g = lane/4 (and g+8), keys (n0+n)*8 + 2*(lane%4) + {0,1}
        unsigned char* pr = pbuf + (lane >> 2) * P_ROW + ((n0 + n) * 8 + 2 * (lane & 3)) * 2;
        *reinterpret_cast<u32*>(pr) = dl::pack_bf16x2(p0, p1);
        *reinterpret_cast<u32*>(pr + 8 * P_ROW) = dl::pack_bf16x2(p2, p3);
      } else {
        pa[0][n / 2][(n & 1) * 2 + 0] = dl::pack_bf16x2(p0, p1);
        pa[0][n / 2][(n & 1) * 2 + 1] = dl::pack_bf16x2(p2, p3);
      }
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const bool own = !PV2 || mt == (rg & 1);
      const float aA = own ? alphaA : palphaA, aB = own ? alphaB : palphaB;
#pragma unroll
      for (int n = 0; n < NT_OP; ++n) {
        o[mt][n][0] *= aA;
        o[mt][n][1] *= aA;
        o[mt][n][2] *= aB;
        o[mt][n][3] *= aB;
      }
    }

    if constexpr (RS) {  // the whole 16 x N P of each PV row group (m16n8k16 A fragments, as for Q)
      if constexpr (PV2) dl::named_barrier(pair_bar, 2 * C * 32);
      else dl::named_barrier(1 + rg, C * 32);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const u32 pb = dl::smem_u32(PV2 ? smem + Q_BYTES + K_BYTES + X_BYTES + (pv_rg0 + mt) * 16 * P_ROW : pbuf) +
                       (lane & 15) * P_ROW + (lane >> 4) * 16;
#pragma unroll
        for (int j = 0; j < N / 16; ++j) dl::ldmatrix_x4(pa[mt][j], pb + j * 32);
      }
    }

    // O += P V over this warp's value columns (V = first 512 columns of the K tile); with PV2
    // each V fragment feeds both m16 tiles
#pragma unroll
    for (int j = 0; j < N / 16; ++j)
#pragma unroll
      for (int np = 0; np < NT_OP / 2; ++np) {
        u32 v[4];
        dl::ldmatrix_x4_trans(v, kt + (j * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * ROW_BYTES +
                                     (pv_k * PV_COLS + np * 16 + (lane >> 4) * 8) * kKvElem);
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          dl::mma_bf16_16816(o[mt][2 * np], pa[mt][j], v[0], v[1]);
          dl::mma_bf16_16816(o[mt][2 * np + 1], pa[mt][j], v[2], v[3]);
        }
      }
  }
  dl::cp_async_wait<0>();
  if constexpr (BULK) loaded = g0 + static_cast<u32>(max(0, t_end - t_begin));  // the tiles loaded above

  lA = quad_sum(lA);
  lB = quad_sum(lB);
  if constexpr (RS) {  // each warp summed its own keys: add the C sums in a fixed order, identical in all C
    // (every warp of the group read the row-max buffer before the last tile's P barrier)
    if ((lane & 3) == 0) {
      mxbuf[cpart * 16 + (lane >> 2)] = lA;
      mxbuf[cpart * 16 + (lane >> 2) + 8] = lB;
    }
    dl::named_barrier(1 + rg, C * 32);
    lA = mxbuf[lane >> 2];
    lB = mxbuf[(lane >> 2) + 8];
#pragma unroll
    for (int c = 1; c < C; ++c) {
      lA += mxbuf[c * 16 + (lane >> 2)];
      lB += mxbuf[c * 16 + (lane >> 2) + 8];
    }
  }
  // PV2: the pair's warps hold O for both row groups: every row's final sum through lbuf
  if constexpr (PV2) {
    if (cpart == 0 && (lane & 3) == 0) {
      lbuf[tA] = lA;
      lbuf[tB] = lB;
    }
    dl::named_barrier(pair_bar, 2 * C * 32);
  }
  // l == 0: no visible key (zeros, LSE -inf). A NaN l (a visible key with NaN scores) stays NaN in
  // both, so the combine cannot mistake such a piece for an empty one. The output rows are this
  // warp's PV rows (m16 tile mt: tAm and tAm + 8); the LSE rows its own (QK) rows tA, tB.
  float invA[MT], invB[MT];
  bool vA[MT], vB[MT];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    const int tAm = PV2 ? (pv_rg0 + mt) * 16 + (lane >> 2) : tA;
    const float lAm = PV2 ? lbuf[tAm] : lA, lBm = PV2 ? lbuf[tAm + 8] : lB;
    invA[mt] = lAm == 0.f ? 0.f : 1.f / lAm;
    invB[mt] = lBm == 0.f ? 0.f : 1.f / lBm;
    vA[mt] = PV2 ? row0 + tAm < rows : validA;
    vB[mt] = PV2 ? row0 + tAm + 8 < rows : validB;
  }
  const float lse2A = lA == 0.f ? DL_NEG_INF : mA + log2f(lA);
  const float lse2B = lB == 0.f ? DL_NEG_INF : mB + log2f(lB);
  const int col0 = pv_k * PV_COLS + 2 * (lane & 3);
  if (complete) {  // all of the pair's keys: final bf16 output and natural-log LSE
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const int rAm = PV2 ? row0 + (pv_rg0 + mt) * 16 + (lane >> 2) : rA, rBm = PV2 ? rAm + 8 : rB;
      const i64 growA = rq.q_start * H + rAm, growB = rq.q_start * H + rBm;
#pragma unroll
      for (int n = 0; n < NT_OP; ++n) {
        if (vA[mt]) *reinterpret_cast<u32*>(p.out + growA * kV + col0 + n * 8) = dl::pack_bf16x2(o[mt][n][0] * invA[mt], o[mt][n][1] * invA[mt]);
        if (vB[mt]) *reinterpret_cast<u32*>(p.out + growB * kV + col0 + n * 8) = dl::pack_bf16x2(o[mt][n][2] * invB[mt], o[mt][n][3] * invB[mt]);
      }
    }
    if (p.lse != nullptr && cpart == 0 && (lane & 3) == 0) {
      if (validA) p.lse[rq.q_start * H + rA] = lse2A * kLn2;
      if (validB) p.lse[rq.q_start * H + rB] = lse2B * kLn2;
    }
  } else {  // one piece of a split pair: bf16 partial (normalised by its own sum) + fp32 base-2 LSE
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      const int tAm = PV2 ? (pv_rg0 + mt) * 16 + (lane >> 2) : tA, tBm = PV2 ? tAm + 8 : tB;
      bf16* dA = p.o_part + ((i64)slot * M + tAm) * kV + col0;
      bf16* dB = p.o_part + ((i64)slot * M + tBm) * kV + col0;
#pragma unroll
      for (int n = 0; n < NT_OP; ++n) {
        if (vA[mt]) *reinterpret_cast<u32*>(dA + n * 8) = dl::pack_bf16x2(o[mt][n][0] * invA[mt], o[mt][n][1] * invA[mt]);
        if (vB[mt]) *reinterpret_cast<u32*>(dB + n * 8) = dl::pack_bf16x2(o[mt][n][2] * invB[mt], o[mt][n][3] * invB[mt]);
      }
    }
    if (cpart == 0 && (lane & 3) == 0) {
      if (validA) p.lse_part[(i64)slot * M + tA] = lse2A;
      if (validB) p.lse_part[(i64)slot * M + tB] = lse2B;
    }
  }
}

// DL_WS: the same contract as attend_segment (rows r*M .. r*M+M-1 of request rq over key tiles
// [t_begin, t_end), final output if `complete`, else partial slot `slot`) with QK warps and PV
// warps (research/verify_ws.md). Iteration it (0 .. nt): the QK warps compute S, the mask, the
// online softmax and P of tile it (into P slot it % 2, with each row's rescale factor), while the
// PV warps apply tile it-1 (O = alpha O + P V from slot (it-1) % 2). The PV warps load tile
// it + STAGES - 2 during iteration it (into the stage PV(it-2) and QK(it-2) used), so STAGES >= 3.
// PVSM: the QK warps compute only S of tile it (into S slot it % 2); the PV warps do tile it-1's
// mask, softmax, P and rescale factors (one slot each), meet at named barrier 2, then apply it.
DL_DEVICE VaRequest ws_request(const volatile WsSeg* sd) {
  VaRequest rq;
  rq.q_start = sd->rq.q_start;
  rq.kv_start = sd->rq.kv_start;
  rq.mask_base = sd->rq.mask_base;
  rq.q_len = sd->rq.q_len;
  rq.kv_len = sd->rq.kv_len;
  rq.row_tiles = sd->rq.row_tiles;
  rq.key_tiles = sd->rq.key_tiles;
  return rq;
}

// threadIdx.x read by a volatile asm: what a segment derives from it is computed in the segment,
// not hoisted to the kernel's start where it would hold registers across the whole part.
DL_DEVICE int thread_index_here() {
  int t;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
  return t;
}

DL_DEVICE void attend_segment_ws(const VerifyAttnParams& p, unsigned char* smem, const volatile WsSeg* sd) {
  const int tid = thread_index_here(), lane = tid & 31, warp = tid >> 5;
  const int H = p.num_heads;
  // the segment's fields, read from shared memory at each use
  auto rows = [&] { return sd->rq.q_len * H; };
  auto row0 = [&] { return sd->r * M; };
  auto kv_len = [&] { return sd->rq.kv_len; };
  auto total = [&] { return (i64)sd->rq.kv_len + sd->rq.q_len; };
  auto t_begin = [&] { return sd->t_begin; };
  auto nt = [&] { return max(0, sd->t_end - sd->t_begin); };
  const u32 qs_smem = dl::smem_u32(smem);
  const u32 k_smem = qs_smem + Q_BYTES;
  static_assert(!WG || (Q_BYTES % 1024 == 0 && KT_STRIDE % 1024 == 0), "WG: swizzled tiles start 1024-byte aligned");
  if (WG && (qs_smem & 1023u)) __trap();  // (the dynamic shared memory's start: the swizzle needs 1024-byte alignment)
  unsigned char* pslots = smem + Q_BYTES + K_BYTES;                      // WS_SLOTS x M rows x P_ROW
  float* alpha = reinterpret_cast<float*>(smem + Q_BYTES + K_BYTES + P_BYTES);  // WS_SLOTS x M
  unsigned char* sslots = smem + Q_BYTES + K_BYTES + P_BYTES + MX_BYTES;  // PVSM: 2 x M rows x S_ROW (fp32 S)
  float* lm = reinterpret_cast<float*>(smem + Q_BYTES + K_BYTES + P_BYTES + MX_BYTES + S_BYTES);  // M final row sums
  u32* mwords = reinterpret_cast<u32*>(lm + M);  // (not PVSM) 2 slots x M rows: bit k = key k of the tile visible
  const bool qk = warp < WS_QK_WARPS;
  // Barrier counts for compute-sanitizer's racecheck, which (as measured on ddtree_build, not
  // documented) orders two warps' shared-memory accesses across a barrier 0 only if both warps
  // passed the same number of barriers of any id: whenever one role syncs its own warps on a named
  // barrier, the other role passes a barrier of its own at the same iteration (QK: 1 over
  // WS_QK_WARPS * 32 threads; PV: 2 over LOADERS). The hardware needs none of these; they keep the
  // racecheck report free of false hazards (the P slots and lm across barrier 0), which would hide
  // a real one.
  constexpr int QK_THREADS = WS_QK_WARPS * 32;

  // Q's columns 16*WS_QREGS..575 of rows row0.. (the rope part and the latent k-steps not held in
  // registers; zero past the last row) and tile 0: one group.
  constexpr int QS_CHUNKS = WS_QS_COLS / 8;
  for (int c = tid; c < M * QS_CHUNKS; c += THREADS) {
    const int rr = c / QS_CHUNKS, ch = c % QS_CHUNKS;
    const bool valid = row0() + rr < rows();
    const bf16* src = valid ? p.q + (sd->rq.q_start * H + row0() + rr) * kQK + 16 * WS_QREGS + ch * 8 : p.q;
    dl::cp_async_16(qs_smem + (WG ? sw_off(rr, ch, M) : rr * WS_QS_ROW + ch * 16), src, valid ? 16 : 0);
  }
  // K/V tiles are loaded by the PV warps only (LOADERS threads, LPR per key row): the QK warps'
  // registers hold Q. The QK warps wait for them through the per-iteration CTA barrier.
  constexpr int LOADERS = WS_PV_WARPS * 32, LPR = LOADERS / N;
  static_assert(LOADERS % N == 0, "whole loader threads per key row");
  const int ltid = tid - WS_QK_WARPS * 32;  // (PV warps: 0 .. LOADERS-1)
  const int krow = ltid / LPR;
  const int kph = ltid % LPR;  // this thread's first chunk of the row
  static_assert(!WG || LPR == 8, "WG: a loader's chunks kph + 8i are chunk kph of every slab");
  const u32 k_lane = k_off(krow, kph);  // (WG: its place in every slab)
  // The raw slot id of this thread's key row of tile t, fetched an iteration ahead (0 past the
  // segment's keys: load_k tells those apart by the key index, so every id, -1 too, is checked).
  // It is checked only where it is used: a check here would make the warp wait for the index
  // load an iteration early.
  auto fetch_slot = [&](int t) -> i64 {
    const i64 key = (i64)t * N + krow;
    if (key >= total()) return 0;
    return key < kv_len() ? load_index(p.kv_indices, p.idx64 & kKvi64, sd->rq.kv_start + key)
                          : load_index(p.out_cache_loc, p.idx64 & kLoc64, sd->rq.q_start + (key - kv_len()));
  };
  auto load_k = [&](int t, i64 slot_id, int stage) {  // zero rows past the last key or at a bad slot id
    const i64 key = (i64)t * N + krow;
    const bool has_key = key < total();
    const bool valid = has_key && slot_id >= 0 && slot_id < p.num_slots;
    if (has_key && !valid && kph == 0)
      dl::report_error(p.err, sd->b, key < kv_len() ? DL_FIELD_KV_INDICES : DL_FIELD_OUT_CACHE_LOC, DL_ERR_OUT_OF_RANGE);
    const kv_elem* src = valid ? p.kv_cache + slot_id * kQK : p.kv_cache;
    const u32 dst = k_smem + stage * KT_STRIDE + (WG ? 0 : krow * ROW_BYTES);
    const char* sp = reinterpret_cast<const char*>(src);
#pragma unroll
    for (int c = kph; c < CHUNKS; c += LPR)  // (WG: chunk kph of slab c / 8 at this thread's swizzled place in it)
      dl::cp_async_16(dst + (WG ? (c >> 3) * (N * 128) + k_lane : c * 16), sp + (valid ? c * 16 : 0), valid ? 16 : 0);
  };
  // PV warps: the visibility words of the segment's tile `it` (only where it holds draft keys or
  // keys past the end), for the QK warps of the next iteration: KPT keys of one row per thread, the
  // row's LPW = N / KPT threads adjacent lanes (OR-reduced by shuffles).
  // (LPW: the largest power of two with M * LPW <= LOADERS; with 48 rows the last 64 loaders idle)
  constexpr int LPW = LOADERS / M >= 8 ? 8 : LOADERS / M >= 4 ? 4 : LOADERS / M >= 2 ? 2 : 1, KPT = N / LPW;
  static_assert(KPT * LPW == N && M * LPW <= LOADERS && (M * LPW) % 32 == 0, "mask words: whole keys per thread, whole warps");
  static_assert(!PVSM || KPT % 4 == 0, "PVSM: the softmax reads S four floats at a time");
  auto make_mask = [&](int it) {
    if constexpr (PVSM) return;  // (no visibility words: under PVSM mwords would be the segment record)
    const int t = t_begin() + it;
    if ((i64)(t + 1) * N <= kv_len()) return;  // (uniform) no draft key and no key past the end
    if (M * LPW < LOADERS && ltid >= M * LPW) return;  // (warp-uniform)
    const int row = ltid / LPW, g = ltid % LPW;
    const int rr = row0() + row;
    const bool rvalid = rr < rows();
    u32 bits = 0;
#pragma unroll 1
    for (int k = 0; k < KPT; ++k) {
      const int kt = g * KPT + k;
      const i64 key = (i64)t * N + kt;
      bool vis = key < total();
      // (the request is read from the record for every key on purpose: held in registers across
      // this loop it makes the 32-key tile spill on sm_80/sm_87/sm_100, measured with ptxas)
      if (vis && key >= kv_len() && rvalid) vis = draft_visible(p, ws_request(sd), rr / H, static_cast<int>(key - kv_len()));
      bits |= static_cast<u32>(vis) << kt;
    }
#pragma unroll
    for (int o = 1; o < LPW; o <<= 1) bits |= __shfl_xor_sync(0xffffffffu, bits, o);
    if (g == 0) mwords[(it & 1) * M + row] = bits;
  };
  // Tiles are loaded AHEAD = STAGES - 2 iterations ahead: tile it + AHEAD goes to the stage of tile
  // it + AHEAD - STAGES <= it - 2, which QK(it-2) and PV(it-2) (in iteration it-1) are done with
  // (SKEW: STAGES - 3 ahead, to the stage of tile it - 3, whose PV ran in iteration it-1).
  // One cp.async group per tile (empty ones too, in every thread), so wait_group<AHEAD-1> at the
  // top of iteration it means: tile it (and the Q rope tile, in the first group) has landed.
  constexpr int AHEAD = SKEW ? STAGES - 3 : STAGES >= 3 ? STAGES - 2 : 1;  // (DL_WS: STAGES >= 3, SKEW: >= 4, checked above)
  i64 next_slot = 0;
  if (!PVSM && !SKEW && !qk && nt() > 0) make_mask(0);
#pragma unroll
  for (int a = 0; a < AHEAD; ++a) {
    if (!qk && a < nt()) load_k(t_begin() + a, fetch_slot(t_begin() + a), a);
    dl::cp_async_commit();
  }
  if (!qk) next_slot = AHEAD < nt() ? fetch_slot(t_begin() + AHEAD) : 0;
  VA_STAMP(VA_STAMP_PART + 2 * blockIdx.x + 1, WS_QK_WARPS * 32, 4, "kissued", 0);

  // Both roles run nt + 1 iterations with one CTA barrier each and issue the next tile's loads
  // together; each role keeps only its own registers live (Q fragments or O accumulators).
  auto next_tile = [&](int it, int pv_nt) {  // (PV warps)
    if (it + AHEAD < pv_nt) {
      load_k(t_begin() + it + AHEAD, next_slot, (it + AHEAD) % STAGES);
      if (it + AHEAD + 1 < pv_nt) next_slot = fetch_slot(t_begin() + it + AHEAD + 1);
    }
    dl::cp_async_commit();
  };
  if (qk) {
    // QK warp rg: rows tA, tB of its 16; WS_QREGS of Q's latent k-steps as m16n8k16 A fragments.
    const int rg = warp;  // (QK warps only)
    const int tA = rg * 16 + (lane >> 2), tB = tA + 8;
    u32 qf[WS_QREGS][4];
    float mA = DL_NEG_INF, mB = DL_NEG_INF, lA = 0.f, lB = 0.f;
    {  // (the rows' global indices are recomputed in the epilogue: no register holds them in the loop)
      const int rA = row0() + tA, rB = row0() + tB;
      const bool validA = rA < rows(), validB = rB < rows();
      const u32* qa = reinterpret_cast<const u32*>(p.q + (sd->rq.q_start * H + (validA ? rA : 0)) * kQK);
      const u32* qb = reinterpret_cast<const u32*>(p.q + (sd->rq.q_start * H + (validB ? rB : 0)) * kQK);
#pragma unroll
      for (int kk = 0; kk < WS_QREGS; ++kk) {
        const int w = (kk * 16 + 2 * (lane & 3)) / 2;
        qf[kk][0] = validA ? __ldg(qa + w) : 0u;
        qf[kk][1] = validB ? __ldg(qb + w) : 0u;
        qf[kk][2] = validA ? __ldg(qa + w + 4) : 0u;
        qf[kk][3] = validB ? __ldg(qb + w + 4) : 0u;
      }
    }
    VA_STAMP(VA_STAMP_PART + 2 * blockIdx.x, 0, 12, "qissued", 0);
    // (the QK warps are the critical path: their loop keeps these three in registers)
    const int qk_nt = nt(), qk_t_begin = t_begin(), qk_kv_len = kv_len();
    // S of tile it (unscaled, unmasked): the mma over the 36 k-steps
    // (hook(kk) runs at the top of k-step kk: SKEW places the previous tile's softmax there; with
    // WG every hook runs after the 36 wgmma are issued, while they execute)
    auto qk_mma = [&](int it, float (&s)[NT_S][4], auto&& hook) {
      const u32 kt = k_smem + (it % STAGES) * KT_STRIDE;
#if DL_WS_WGMMA
      {
        // the warpgroup's S of tile it: 36 wgmma k-steps issued into QK_CHAINS accumulator sets
        // (interleaved k-steps; one set measured as fast as 2-4 on the H200), then the hooks (the
        // previous tile's softmax) while they execute, then the wait and the sum
        // (the first QK_CHAINS k-steps have scale-d = 0 and ignore d; the zeroing keeps the asm's "+f"
        // inputs defined)
        float d[QK_CHAINS][NT_S * 4];
#pragma unroll
        for (int ch = 0; ch < QK_CHAINS; ++ch)
#pragma unroll
          for (int i = 0; i < NT_S * 4; ++i) d[ch][i] = 0.f;
        dl::wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kQK / 16; ++kk) {
          const u64 bd = dl::wgmma_desc_sw128(kt + (kk >> 2) * (N * 128) + (kk & 3) * 32, 1024);
          if (kk < WS_QREGS) dl::wgmma_m64n32k16_rs(d[kk % QK_CHAINS], qf[kk], bd, kk >= QK_CHAINS);
          else dl::wgmma_m64n32k16_ss(d[kk % QK_CHAINS],
                                      dl::wgmma_desc_sw128(qs_smem + ((kk - WS_QREGS) >> 2) * (M * 128) + ((kk - WS_QREGS) & 3) * 32, 1024),
                                      bd, kk >= QK_CHAINS);
        }
        dl::wgmma_commit();
#pragma unroll
        for (int ch = 0; ch < QK_CHAINS; ++ch) dl::wgmma_pin(d[ch]);
#pragma unroll
        for (int kk = 0; kk < kQK / 16; ++kk) hook(kk);
        dl::wgmma_wait<0>();
#pragma unroll
        for (int ch = 0; ch < QK_CHAINS; ++ch) dl::wgmma_pin(d[ch]);
#pragma unroll
        for (int n = 0; n < NT_S; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            float v = d[0][4 * n + e];
#pragma unroll
            for (int ch = 1; ch < QK_CHAINS; ++ch) v += d[ch][4 * n + e];
            s[n][e] = v;
          }
      }
#else
      // QK_CHAINS accumulator sets over interleaved k-steps (more independent mma chains for a
      // single QK warp per scheduler), added in a fixed order at the end
      float sc[QK_CHAINS][NT_S][4];
#pragma unroll
      for (int ch = 0; ch < QK_CHAINS; ++ch)
#pragma unroll
        for (int n = 0; n < NT_S; ++n) sc[ch][n][0] = sc[ch][n][1] = sc[ch][n][2] = sc[ch][n][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < kQK / 16; ++kk) {
        hook(kk);
        u32 a[4];
        if (kk < WS_QREGS) {
          a[0] = qf[kk][0], a[1] = qf[kk][1], a[2] = qf[kk][2], a[3] = qf[kk][3];
        } else {
          dl::ldmatrix_x4(a, qs_smem + (rg * 16 + (lane & 15)) * WS_QS_ROW + ((kk - WS_QREGS) * 16 + (lane >> 4) * 8) * kQElem);
        }
#pragma unroll
        for (int np = 0; np < NT_S / 2; ++np) {
          u32 bk[4];
          dl::ldmatrix_x4(bk, kt + (np * 16 + (lane >> 4) * 8 + (lane & 7)) * ROW_BYTES + (kk * 16 + ((lane >> 3) & 1) * 8) * kKvElem);
          dl::mma_bf16_16816(sc[kk % QK_CHAINS][2 * np], a, bk[0], bk[1]);
          dl::mma_bf16_16816(sc[kk % QK_CHAINS][2 * np + 1], a, bk[2], bk[3]);
        }
      }
      if (!SKEW && it == 16) VA_STAMP(VA_STAMP_PART + 2 * blockIdx.x, 0, 15, "mma16", 0);  // (its last mma issued: the chains are nearly done)
#pragma unroll
      for (int n = 0; n < NT_S; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float v = sc[0][n][e];
#pragma unroll
          for (int ch = 1; ch < QK_CHAINS; ++ch) v += sc[ch][n][e];
          s[n][e] = v;
        }
#endif
    };
    // The mask and the online softmax of tile it, from its S: P as bf16 pairs (pw) and the rescale
    // factors; qk_store writes them into slot it % 2
    auto qk_math = [&](int it, float (&s)[NT_S][4], u32 (&pw)[NT_S][2], float& alphaA, float& alphaB) {
      const int t = qk_t_begin + it;
      const bool need_mask = (i64)(t + 1) * N > qk_kv_len;  // uniform across the CTA
      const u32 wA = need_mask ? mwords[(it & 1) * M + tA] : 0u, wB = need_mask ? mwords[(it & 1) * M + tB] : 0u;
#pragma unroll
      for (int n = 0; n < NT_S; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float v = s[n][e] * p.scale_log2;
          if (need_mask && !((e >= 2 ? wB : wA) >> (n * 8 + 2 * (lane & 3) + (e & 1)) & 1u)) v = DL_NEG_INF;
          s[n][e] = v;
        }
      float mxA = mA, mxB = mB;
      raise_row_maxima<NT_S>(s, mxA, mxB);
      const float baseA = softmax_base(mxA);
      const float baseB = softmax_base(mxB);
      alphaA = exp2f(mA - baseA), alphaB = exp2f(mB - baseB);
      mA = mxA;
      mB = mxB;
      lA *= alphaA;
      lB *= alphaB;
#pragma unroll
      for (int n = 0; n < NT_S; ++n) {
        const float p0 = exp2f(s[n][0] - baseA), p1 = exp2f(s[n][1] - baseA);
        const float p2 = exp2f(s[n][2] - baseB), p3 = exp2f(s[n][3] - baseB);
        lA += p0 + p1;
        lB += p2 + p3;
        pw[n][0] = dl::pack_bf16x2(p0, p1);
        pw[n][1] = dl::pack_bf16x2(p2, p3);
      }
    };
    auto qk_store = [&](int it, const u32 (&pw)[NT_S][2], float alphaA, float alphaB) {
      unsigned char* ps = pslots + (it & 1) * (M * P_ROW);
#pragma unroll
      for (int n = 0; n < NT_S; ++n) {
        unsigned char* prow = ps + tA * P_ROW + (n * 8 + 2 * (lane & 3)) * 2;
        *reinterpret_cast<u32*>(prow) = pw[n][0];
        *reinterpret_cast<u32*>(prow + 8 * P_ROW) = pw[n][1];
      }
      if ((lane & 3) == 0) {
        alpha[(it & 1) * M + tA] = alphaA;
        alpha[(it & 1) * M + tB] = alphaB;
      }
    };
    auto p_stamps = [&](int it) {  // (tile it's P written)
      if (it == 0) VA_STAMP(VA_STAMP_PART + 2 * blockIdx.x, 0, 13, "t0done", 0);
      if (it == 16) VA_STAMP(VA_STAMP_PART + 2 * blockIdx.x, 0, 16, "P16", 0);
    };
    auto qk_softmax = [&](int it, float (&s)[NT_S][4]) {
      u32 pw[NT_S][2];
      float alphaA, alphaB;
      qk_math(it, s, pw, alphaA, alphaB);
      qk_store(it, pw, alphaA, alphaB);
      p_stamps(it);
    };
    // masked keys must have no influence on P V, finite or not: once every QK warp has read tile
    // it's K, scrub V of its stage
    auto qk_scrub = [&](int it) {
      if ((i64)(qk_t_begin + it + 1) * N > qk_kv_len) {  // uniform across the CTA
        dl::named_barrier(1, QK_THREADS);  // every QK warp has read this tile's K (the PV warps: barrier 2)
        zero_nonfinite_v(smem + Q_BYTES + (it % STAGES) * KT_STRIDE, tid, WS_QK_WARPS * 32);
#if DL_WS_WGMMA_PV
        dl::fence_proxy_async();  // the scrubbed V, before the PV warps' wgmma reads it (after later barriers)
#endif
      }
    };
    auto qk_stamps = [&](int it) {
      if (it == 0) VA_STAMP(VA_STAMP_PART + 2 * blockIdx.x, 0, 6, "tile0", 0);
      if (it == qk_nt - 1) VA_STAMP(VA_STAMP_PART + 2 * blockIdx.x, 0, 10, "lasttile", 0);
      if (it == 16) VA_STAMP(VA_STAMP_PART + 2 * blockIdx.x, 0, 14, "bar16", 0);  // (one steady iteration of both roles, split)
      if (it == 17) VA_STAMP(VA_STAMP_PART + 2 * blockIdx.x, 0, 17, "bar17", 0);
    };
    if constexpr (SKEW) {
      // Iteration it: the mma of tile it and the softmax of tile it-1 (its S kept in sp) in one
      // block, then tile it's scrub; nt + 2 iterations, like the PV warps' (they apply tile it-2).
      // (tile -1's S is -inf: its softmax keeps m = -inf, l = 0 and writes zeros into slot 1,
      // which tile 1 overwrites before any PV warp reads it)
      float sp[NT_S][4];
#pragma unroll
      for (int n = 0; n < NT_S; ++n) sp[n][0] = sp[n][1] = sp[n][2] = sp[n][3] = DL_NEG_INF;
      for (int it = 0; it <= qk_nt + 1; ++it) {
        dl::cp_async_wait<AHEAD - 1>();
        wg_fence_landed();
        dl::cta_barrier_from_roles();  // tile it has landed; QK(it-1) and PV(it-3) are done (their stages and slots)
        qk_stamps(it);
        if (it < qk_nt) {
          // tile it-1's softmax inside tile it's k-steps: its math at k-step SKEW_MATH_AT, its
          // shared-memory stores at SKEW_STORE_AT (ptxas keeps stores and ldmatrix in order)
          float s[NT_S][4];
          u32 pw[NT_S][2];
          float alphaA, alphaB;
          qk_mma(it, s, [&](int kk) {
            if (kk == SKEW_MATH_AT) qk_math(it - 1, sp, pw, alphaA, alphaB);
            if (kk == SKEW_STORE_AT) qk_store(it - 1, pw, alphaA, alphaB);
          });
          p_stamps(it - 1);  // (after the k-steps; SKEW has no "mma16": any stamp there spills 8 B on sm_90)
          qk_scrub(it);
#pragma unroll
          for (int n = 0; n < NT_S; ++n) sp[n][0] = s[n][0], sp[n][1] = s[n][1], sp[n][2] = s[n][2], sp[n][3] = s[n][3];
        } else if (it == qk_nt && it >= 1) {
          qk_softmax(it - 1, sp);
        }
      }
    } else {
      for (int it = 0; it <= qk_nt; ++it) {
        dl::cp_async_wait<AHEAD - 1>();
        wg_fence_landed();
        dl::cta_barrier_from_roles();  // tile it has landed; QK(it-1) and PV(it-2) are done (their stages and slots)
        qk_stamps(it);
        if (PVSM && it >= 1) dl::named_barrier(1, QK_THREADS);  // the PV warps' barrier 2 of tile it-1 (racecheck)
        if (it < qk_nt) {
          float s[NT_S][4];
          qk_mma(it, s, [](int) {});
          if constexpr (PVSM) {  // S (unscaled, unmasked) into S slot it % 2: the PV warps do the rest
            unsigned char* ss = sslots + (it & 1) * (M * S_ROW);
#pragma unroll
            for (int n = 0; n < NT_S; ++n) {
              // float2 of columns n*8 + 2*(lane&3): 16-byte chunk 2n + (lane&3)/2, half (lane&1)
              unsigned char* srow = ss + tA * S_ROW + s_chunk(tA, 2 * n + ((lane & 3) >> 1)) * 16 + (lane & 1) * 8;
              *reinterpret_cast<float2*>(srow) = make_float2(s[n][0], s[n][1]);
              *reinterpret_cast<float2*>(srow + 8 * S_ROW) = make_float2(s[n][2], s[n][3]);  // (row tA + 8: same parity)
            }
            continue;
          }
          qk_softmax(it, s);
          qk_scrub(it);
        }
      }
    }
    VA_STAMP(VA_STAMP_PART + 2 * blockIdx.x, 0, 7, "loop", 0);
    dl::cp_async_wait<0>();
    if constexpr (PVSM) {  // the PV warps own the row statistics and the epilogue (their own barrier)
      dl::named_barrier(1, QK_THREADS);  // the PV warps' barrier 2 of the row sums (racecheck)
      return;
    }
    lA = quad_sum(lA);
    lB = quad_sum(lB);
    if ((lane & 3) == 0) {
      lm[tA] = lA;
      lm[tB] = lB;
    }
    const float lse2A = lA == 0.f ? DL_NEG_INF : mA + log2f(lA);
    const float lse2B = lB == 0.f ? DL_NEG_INF : mB + log2f(lB);
    if ((lane & 3) == 0) {
      const int rA = row0() + tA, rB = row0() + tB;
      const bool validA = rA < rows(), validB = rB < rows();
      if (sd->complete) {
        if (p.lse != nullptr) {
          if (validA) p.lse[sd->rq.q_start * H + rA] = lse2A * kLn2;
          if (validB) p.lse[sd->rq.q_start * H + rB] = lse2B * kLn2;
        }
      } else {
        if (validA) p.lse_part[(i64)sd->slot * M + tA] = lse2A;
        if (validB) p.lse_part[(i64)sd->slot * M + tB] = lse2B;
      }
    }
    VA_STAMP(VA_STAMP_PART + 2 * blockIdx.x, 0, 11, "qk lse", 0);
    dl::cta_barrier_from_roles();  // the row sums are in shared memory; every PV warp has applied the last tile
  } else {
    // PV warp: row block pr (rows pr*16*WS_PV_MT .. +16*WS_PV_MT, WS_PV_MT m16 tiles), value
    // columns cq*WS_PV_COLS .. +WS_PV_COLS.
    const int pw = warp - WS_QK_WARPS, pr = pv_row_block(pw), cq = pv_col_block(pw);
    float o[WS_PV_MT][WS_PV_NT][4];
#pragma unroll
    for (int mt = 0; mt < WS_PV_MT; ++mt)
#pragma unroll
      for (int n = 0; n < WS_PV_NT; ++n) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.f;
    const int pv_nt = nt();  // (one register: the loop bound, not a shared-memory read per use)
    // PVSM: this thread's row of the softmax (the mapping of make_mask: LPW threads per row, KPT
    // keys each) and its running maximum (the same in the row's LPW threads) and partial row sum
    float sm_m = DL_NEG_INF, sm_l = 0.f;
    constexpr int LAG = SKEW ? 2 : 1;  // PV applies tile it - LAG
    // pv_m0(): the first tile (of the segment's) that has draft keys or none. One register, except in
    // a stamped build (tools/verify_stamps.py), where it is read again from the segment record at each
    // tile: the stamps leave no register for it there (sm_120's stamped tile spilled 8 B).
#if defined(DL_STAMPS) && DL_STAMPS
    auto pv_m0 = [&] { return kv_len() / N - t_begin(); };
#else
    const int pv_m0_reg = kv_len() / N - t_begin();
    auto pv_m0 = [&] { return pv_m0_reg; };
#endif
    for (int it = 0; it <= pv_nt + LAG - 1; ++it) {
      dl::cp_async_wait<AHEAD - 1>();
      wg_fence_landed();
      dl::cta_barrier_from_roles();  // tile it has landed; QK(it-1) and PV(it-1-LAG) are done (their stages and slots)
      if (it == 0) VA_STAMP(VA_STAMP_PART + 2 * blockIdx.x + 1, WS_QK_WARPS * 32, 0, "tile0", 0);
      if (it == 16) VA_STAMP(VA_STAMP_PART + 2 * blockIdx.x + 1, WS_QK_WARPS * 32, 5, "bar16", 0);
      // the QK warps' barrier 1 of qk_scrub(it) (racecheck; uniform across the CTA)
      if (!PVSM && it < pv_nt && it >= pv_m0()) dl::named_barrier(2, LOADERS);
      next_tile(it, pv_nt);
      if (it >= LAG) {  // tile it-LAG
        const int j = it - LAG;
        const int slot = PVSM ? 0 : (j & 1);
        if constexpr (PVSM) {  // the mask and the online softmax of tile j (S from slot j % 2), then P V
          const int t = t_begin() + j;
          const bool need_mask = (i64)(t + 1) * N > kv_len();  // uniform across the CTA
          if (M * LPW == LOADERS || ltid < M * LPW) {  // (warp-uniform)
            const int row = ltid / LPW, g = ltid % LPW;
            const unsigned char* srow = sslots + (j & 1) * (M * S_ROW) + row * S_ROW;
            float v[KPT];
#pragma unroll
            for (int k = 0; k < KPT; k += 4) {
              const float4 f = *reinterpret_cast<const float4*>(srow + s_chunk(row, (g * KPT + k) / 4) * 16);
              v[k] = f.x * p.scale_log2, v[k + 1] = f.y * p.scale_log2, v[k + 2] = f.z * p.scale_log2, v[k + 3] = f.w * p.scale_log2;
            }
            if (need_mask) {
              const int rr = row0() + row;
              const bool rvalid = rr < rows();
              u32 bits = 0;
#pragma unroll 1
              for (int k = 0; k < KPT; ++k) {
                const i64 key = (i64)t * N + g * KPT + k;
                bool vis = key < total();
                if (vis && key >= kv_len() && rvalid) vis = draft_visible(p, ws_request(sd), rr / H, static_cast<int>(key - kv_len()));
                bits |= static_cast<u32>(vis) << k;
              }
#pragma unroll
              for (int k = 0; k < KPT; ++k)
                if (!(bits >> k & 1u)) v[k] = DL_NEG_INF;
            }
            float mx = sm_m;
#pragma unroll
            for (int k = 0; k < KPT; ++k) mx = fmaxf(mx, v[k]);
#pragma unroll
            for (int o = 1; o < LPW; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
            const float base = softmax_base(mx);
            const float a = exp2f(sm_m - base);
            sm_m = mx;
            float sum = 0.f;
            unsigned char* prow = pslots + row * P_ROW + g * KPT * 2;
            u32 pk[KPT / 2];  // P of this thread's keys: one 16-byte (8-byte) store
#pragma unroll
            for (int k = 0; k < KPT; k += 2) {
              const float p0 = exp2f(v[k] - base), p1 = exp2f(v[k + 1] - base);
              sum += p0 + p1;
              pk[k / 2] = dl::pack_bf16x2(p0, p1);
            }
            if constexpr (KPT == 8) *reinterpret_cast<uint4*>(prow) = make_uint4(pk[0], pk[1], pk[2], pk[3]);
            else *reinterpret_cast<uint2*>(prow) = make_uint2(pk[0], pk[1]);
            sm_l = sm_l * a + sum;
            if (g == 0) alpha[row] = a;
          }
          // masked keys must have no influence on P V, finite or not: scrub V of tile j's stage
          // (the QK warps are done with it: they read it in iteration j)
          if (need_mask) zero_nonfinite_v(smem + Q_BYTES + (j % STAGES) * KT_STRIDE, ltid, LOADERS);
          // (the aligned bar.sync of named_barrier: only whole PV warps reach it, from one branch)
          dl::named_barrier(2, LOADERS);  // P, the rescale factors and V of tile j are ready
        }
        const u32 vt = k_smem + (j % STAGES) * KT_STRIDE;
        // (WG: key jj*16 + ((lane >> 3) & 1) * 8 + (lane & 7) =: jj*16 + kr, chunk cq*WS_PV_COLS/8 + 2*np + (lane >> 4):
        // slab cq*WS_PV_COLS/64 + np/4, swizzled chunk (2*(np%4) + (lane >> 4)) ^ (kr & 7). Its bits 5-6 are those of
        // v_base XOR (np % 4) << 5, and no other term has them: one register and one XOR per ldmatrix)
#if !DL_WS_WGMMA_PV
        const int v_kr = ((lane >> 3) & 1) * 8 + (lane & 7);
        const u32 v_base = vt + (cq * WS_PV_COLS / 64) * (N * 128) + v_kr * 128 + ((((lane >> 4) ^ v_kr) & 1) << 4) + (((v_kr >> 1) & 3) << 5);  // (WG)
#endif
        const unsigned char* ps = pslots + slot * (M * P_ROW);
#pragma unroll
        for (int mt = 0; mt < WS_PV_MT; ++mt) {
          const int t0 = pr * 16 * WS_PV_MT + mt * 16 + (lane >> 2);
          const float aA = alpha[slot * M + t0], aB = alpha[slot * M + t0 + 8];
#pragma unroll
          for (int n = 0; n < WS_PV_NT; ++n) {
            o[mt][n][0] *= aA;
            o[mt][n][1] *= aA;
            o[mt][n][2] *= aB;
            o[mt][n][3] *= aB;
          }
        }
        const u32 pb = dl::smem_u32(ps) + (pr * (16 * WS_PV_MT) + (lane & 15)) * P_ROW + (lane >> 4) * 16;
#if DL_WS_WGMMA_PV
        {
          // the warpgroup's P V: P of its warps' 16 rows each from the P slot (the mma.sync A
          // fragments are wgmma's), V of its 256 columns by descriptor: 4 slabs of 64 columns
          // (LBO), 8-key groups (SBO), N-major (transposed B)
          u32 pa[N / 16][4];
#pragma unroll
          for (int jj = 0; jj < N / 16; ++jj) dl::ldmatrix_x4(pa[jj], pb + jj * 32);
          dl::wgmma_pin(o[0]);  // (the rescale's multiplies stay before the fence)
          dl::wgmma_fence();
#pragma unroll
          for (int jj = 0; jj < N / 16; ++jj)
            dl::wgmma_m64n256k16_rs_tb(o[0], pa[jj], dl::wgmma_desc_sw128(vt + cq * (4 * N * 128) + jj * (16 * 128), N * 128, 1024), 1);
          dl::wgmma_commit();
          dl::wgmma_pin(o[0]);
          dl::wgmma_wait<0>();
          dl::wgmma_pin(o[0]);
        }
#else
#pragma unroll
        for (int jj = 0; jj < N / 16; ++jj) {
          u32 pa[WS_PV_MT][4];  // P of 16 keys for the m16 tiles (one k-step of P V at a time: fewer registers)
#pragma unroll
          for (int mt = 0; mt < WS_PV_MT; ++mt) dl::ldmatrix_x4(pa[mt], pb + mt * (16 * P_ROW) + jj * 32);
#pragma unroll
          for (int np = 0; np < WS_PV_NT / 2; ++np) {
            u32 v[4];
            dl::ldmatrix_x4_trans(v, WG ? (v_base + jj * (16 * 128) + (np >> 2) * (N * 128)) ^ ((np & 3) << 5)
                                        : vt + (jj * 16 + ((lane >> 3) & 1) * 8 + (lane & 7)) * ROW_BYTES +
                                              (cq * WS_PV_COLS + np * 16 + (lane >> 4) * 8) * kKvElem);
#pragma unroll
            for (int mt = 0; mt < WS_PV_MT; ++mt) {
              dl::mma_bf16_16816(o[mt][2 * np], pa[mt], v[0], v[1]);
              dl::mma_bf16_16816(o[mt][2 * np + 1], pa[mt], v[2], v[3]);
            }
          }
        }
#endif
      }
      if (it == 16) VA_STAMP(VA_STAMP_PART + 2 * blockIdx.x + 1, WS_QK_WARPS * 32, 6, "mma16", 0);  // (tile 15 applied: its mma issued)
      // after this tile's math; read by the QK warps after the next barrier (SKEW: tile it's, read in iteration it+1)
      if (!PVSM && it + (SKEW ? 0 : 1) < pv_nt) make_mask(it + (SKEW ? 0 : 1));
    }
    VA_STAMP(VA_STAMP_PART + 2 * blockIdx.x + 1, WS_QK_WARPS * 32, 1, "loop", 0);
    dl::cp_async_wait<0>();
    if constexpr (PVSM) {  // the row sums and LSE, from the softmax threads
      if (M * LPW == LOADERS || ltid < M * LPW) {
#pragma unroll
        for (int o = 1; o < LPW; o <<= 1) sm_l += __shfl_xor_sync(0xffffffffu, sm_l, o);
        const int row = ltid / LPW;
        if (ltid % LPW == 0) {
          lm[row] = sm_l;
          const float lse2 = sm_l == 0.f ? DL_NEG_INF : sm_m + log2f(sm_l);
          const int rr = row0() + row;
          if (rr < rows()) {
            if (sd->complete) {
              if (p.lse != nullptr) p.lse[sd->rq.q_start * H + rr] = lse2 * kLn2;
            } else {
              p.lse_part[(i64)sd->slot * M + row] = lse2;
            }
          }
        }
      }
      dl::named_barrier(2, LOADERS);  // the row sums are in shared memory
    } else {
      dl::cta_barrier_from_roles();  // the QK warps' row sums
    }
    VA_STAMP(VA_STAMP_PART + 2 * blockIdx.x + 1, WS_QK_WARPS * 32, 3, "bar", 0);
    // (this warp's rows and columns derived anew: nothing of the epilogue is held across the loop)
    const int etid = thread_index_here(), elane = etid & 31, epw = (etid >> 5) - WS_QK_WARPS;
    // Stores of whole 32-byte sectors: in the accumulator layout lane c of a quad holds columns 2c,
    // 2c + 1 of each 8-wide n-tile, so a 4-byte store per n-tile writes half a sector per row (the
    // L2 counts sectors: bf16 that way wrote no faster than fp32). Two shuffles inside the quad give
    // lane c columns 4c .. 4c + 3 of an n-tile pair (a = n-tile 2np, b = 2np + 1, bf16x2 words), so
    // a quad writes 32 contiguous bytes of its row with one 8-byte store per lane.
    static_assert(WS_PV_NT % 2 == 0, "n-tiles in pairs");
    const int qc = elane & 3;
    const int src1 = (elane & ~3) | (2 * (qc & 1) + (qc >> 1)), src2 = (elane & ~3) | (2 * (qc & 1) + 1 - (qc >> 1));
    auto quad_words = [&](u32 a, u32 b) {  // (all lanes) this lane's 4 columns of the pair, low first
      const u32 r1 = __shfl_sync(0xffffffffu, (qc & 1) ? b : a, src1);
      const u32 r2 = __shfl_sync(0xffffffffu, (qc & 1) ? a : b, src2);
      return qc < 2 ? make_uint2(r1, r2) : make_uint2(r2, r1);
    };
    const int colq = pv_col_block(epw) * WS_PV_COLS + 4 * qc;  // + 16 * np: this lane's 4 columns
#pragma unroll
    for (int mt = 0; mt < WS_PV_MT; ++mt) {
      const int tAm = pv_row_block(epw) * 16 * WS_PV_MT + mt * 16 + (elane >> 2), tBm = tAm + 8;
      const float lAm = lm[tAm], lBm = lm[tBm];
      const float invA = lAm == 0.f ? 0.f : 1.f / lAm, invB = lBm == 0.f ? 0.f : 1.f / lBm;
      const bool vA = row0() + tAm < rows(), vB = row0() + tBm < rows();
      // the final output's rows, or the partial slot's (each piece normalised by its own sum)
      bf16* dA = sd->complete ? p.out + (sd->rq.q_start * H + row0() + tAm) * kV : p.o_part + ((i64)sd->slot * M + tAm) * kV;
      bf16* dB = sd->complete ? p.out + (sd->rq.q_start * H + row0() + tBm) * kV : p.o_part + ((i64)sd->slot * M + tBm) * kV;
#pragma unroll
      for (int np = 0; np < WS_PV_NT / 2; ++np) {
        const uint2 wA = quad_words(dl::pack_bf16x2(o[mt][2 * np][0] * invA, o[mt][2 * np][1] * invA),
                                    dl::pack_bf16x2(o[mt][2 * np + 1][0] * invA, o[mt][2 * np + 1][1] * invA));
        const uint2 wB = quad_words(dl::pack_bf16x2(o[mt][2 * np][2] * invB, o[mt][2 * np][3] * invB),
                                    dl::pack_bf16x2(o[mt][2 * np + 1][2] * invB, o[mt][2 * np + 1][3] * invB));
        if (vA) *reinterpret_cast<uint2*>(dA + colq + 16 * np) = wA;
        if (vB) *reinterpret_cast<uint2*>(dB + colq + 16 * np) = wB;
      }
    }
    VA_STAMP(VA_STAMP_PART + 2 * blockIdx.x + 1, WS_QK_WARPS * 32, 2, "epi", 0);
  }
}

// The part's two cuts (every thread; block-wide): the scheduler's prefix sums and cut rule run
// here on the request metadata, in the tiles' shared memory before any tile uses it, so the CTA
// never waits for the scheduler kernel's tables (only for its completion, before it exits).
static_assert(sizeof(SchedPrefix) + 2 * sizeof(VaCut) <= BAR_OFFSET - WS_SEG_BYTES,
              "the schedule's prefix sums do not fit below the tile's records");
DL_DEVICE void part_cuts(const VerifyAttnParams& p, unsigned char* smem, int part, VaCut& s, VaCut& e,
                         VaRequest* keep = nullptr) {
  SchedPrefix& sp = *reinterpret_cast<SchedPrefix*>(smem);
  VaCut* two = reinterpret_cast<VaCut*>(smem + sizeof(SchedPrefix));
  const SchedPlan g = schedule_prefix<THREADS, false>(p, sp, keep);
  if (threadIdx.x < 2) two[threadIdx.x] = schedule_cut(sp, g, part + threadIdx.x);
  __syncthreads();
  s = two[0];
  e = two[1];
  __syncthreads();  // the region is the tiles' again
}

// The pair after (b, r), global pair index gp + 1 (b = B: none); row_tiles: request b's. Requests
// without rows have no pairs.
DL_DEVICE void next_pair(const VerifyAttnParams& p, int& b, int& r, int& gp, int row_tiles) {
  const int B = p.batch_size;
  ++gp;
  ++r;
  while (b < B && r >= row_tiles) {
    ++b;
    r = 0;
    row_tiles = b < B ? check_request(p, b, false).row_tiles : 0;
  }
}

// DL_WS: CTA `part` walks its part's segments as verify_attn_partial does for the other tiles,
// but only thread 0 walks (its position in the WsSeg record) and every thread reads the current
// segment from shared memory. Two dependent reads of request metadata are kept off the first
// tile's path: the first segment's request comes from the prefix pass (part_cuts keeps every
// request it read in shared memory, still intact when the record is written: no tile is loaded
// before it), and the walk moves to the next pair only once a segment is done and the part
// goes on (its request's metadata: a part with one segment, as aligned splits give, never reads
// it).
constexpr int WS_KEEP_OFFSET = (static_cast<int>(sizeof(SchedPrefix) + 2 * sizeof(VaCut)) + 15) & ~15;
DL_DEVICE void run_part_ws(const VerifyAttnParams& p, unsigned char* smem, int part) {
  static_assert(WS_KEEP_OFFSET + DL_VA_MAX_BATCH * static_cast<int>(sizeof(VaRequest)) <= BAR_OFFSET - WS_SEG_BYTES,
                "the requests of the prefix pass do not fit below the tile's records");
  volatile WsSeg* sd = reinterpret_cast<volatile WsSeg*>(smem + BAR_OFFSET - WS_SEG_BYTES);
  const VaRequest* kept = reinterpret_cast<const VaRequest*>(smem + WS_KEEP_OFFSET);
  VaCut s, e;
  part_cuts(p, smem, part, s, e, reinterpret_cast<VaRequest*>(smem + WS_KEEP_OFFSET));
  VA_STAMP(VA_STAMP_PART + 2 * part, 0, 1, "cuts", 0);
  [[maybe_unused]] int nseg = 0;  // (stamps only: the record slot of the next "seg")
  if (threadIdx.x == 0) {
    sd->walk_b = s.b;
    sd->walk_r = s.r;
    sd->walk_t = s.t;
    sd->walk_gp = s.gp;
    sd->end_gp = e.gp;
    sd->end_t = e.t;
    sd->slot = -1;  // no segment yet
  }
  for (;;) {
    if (threadIdx.x == 0) {
      const int B = p.batch_size;
      int b = sd->walk_b, r = sd->walk_r, gp = sd->walk_gp;
      const int t0 = sd->walk_t, e_gp = sd->end_gp, e_t = sd->end_t;
      const bool first = sd->slot < 0;
      bool more;
      if (first) {
        more = b < B && (gp < e_gp || (gp == e_gp && t0 < e_t));
      } else {  // after a segment the walk goes on at key tile 0 of the next pair, if the part has it
        more = gp + 1 < e_gp || (gp + 1 == e_gp && e_t > 0);
        if (more) next_pair(p, b, r, gp, sd->rq.row_tiles);
        more = more && b < B;
      }
      sd->done = !more;
      if (more) {
        // (the kept request is the one the cuts were made from: B <= DL_VA_MAX_BATCH there)
        const VaRequest rq = first && b < DL_VA_MAX_BATCH ? kept[b] : check_request(p, b, false);
        const int t1 = gp == e_gp ? min(e_t, rq.key_tiles) : rq.key_tiles;
        sd->rq.q_start = rq.q_start;
        sd->rq.kv_start = rq.kv_start;
        sd->rq.mask_base = rq.mask_base;
        sd->rq.q_len = rq.q_len;
        sd->rq.kv_len = rq.kv_len;
        sd->rq.row_tiles = rq.row_tiles;
        sd->rq.key_tiles = rq.key_tiles;
        sd->b = b;
        sd->r = r;
        sd->t_begin = t0;
        sd->t_end = t1;
        sd->complete = t0 == 0 && t1 == rq.key_tiles;
        sd->slot = 2 * part + (first ? 0 : 1);
        sd->walk_b = b;
        sd->walk_r = r;
        sd->walk_t = 0;
        sd->walk_gp = gp;
      }
    }
    __syncthreads();  // the record is written
    VA_STAMP(VA_STAMP_PART + 2 * part, 0, 2 + min(nseg++, 3), "seg", sd->done ? -1 : sd->t_end - sd->t_begin);
    if (sd->done) return;
    attend_segment_ws(p, smem, sd);
    __syncthreads();  // the segment is done with shared memory and its record
  }
}

// CTA `part` of the tiles without DL_WS: its segments in order, every thread walking.
DL_DEVICE void run_part(const VerifyAttnParams& p, unsigned char* smem, int part) {
  const int B = p.batch_size;
  VaCut s, e;
  part_cuts(p, smem, part, s, e);
  int b = s.b, r = s.r, t0 = s.t, gp = s.gp;
  u32 loaded = 0;  // K tiles loaded so far (BULK: which stage and mbarrier phase comes next)
#if DL_VA_BULK
  if (threadIdx.x < STAGES) dl::mbar_init(dl::smem_u32(smem) + BAR_OFFSET + threadIdx.x * 8, N);  // N rows per tile
  dl::fence_mbarrier_init();
  __syncthreads();
#endif
  for (int seg = 0; b < B && (gp < e.gp || (gp == e.gp && t0 < e.t)); ++seg) {
    const VaRequest rq = check_request(p, b, false);
    const int t1 = gp == e.gp ? min(e.t, rq.key_tiles) : rq.key_tiles;
    if (seg > 0) __syncthreads();  // the previous segment is done with shared memory
    attend_segment(p, smem, b, rq, r, t0, t1, t0 == 0 && t1 == rq.key_tiles, 2 * part + (seg == 0 ? 0 : 1), loaded);
    next_pair(p, b, r, gp, check_request(p, b, false).row_tiles);  // (no register kept across the segment)
    t0 = 0;
  }
}
}  // namespace va

extern "C" __global__ void __launch_bounds__(va::THREADS, 1)
verify_attn_partial(const __grid_constant__ VerifyAttnParams p) {
  using namespace va;
  // (128, not 1024: with 1024 the compiler drops the run-time check of the swizzle's alignment below)
  extern __shared__ __align__(128) unsigned char smem[];
  // PDL (common.cuh; VerifyAttention(pdl=...)): the combine may be launched now (its CTAs wait for
  // this whole grid). This grid starts while the scheduler runs: everything before the scheduler
  // has completed (its launch is ordinary), and this kernel reads none of the scheduler's tables
  // (part_cuts recomputes its cuts), so it waits for the scheduler only before it exits -- the
  // combine reads the scheduler's entries after waiting for this grid. Both return at once
  // without PDL.
  dl::pdl_launch_dependents();
  const int part = blockIdx.x;
  VA_STAMP(VA_STAMP_PART + 2 * part, 0, 0, "start", 0);
  if (part < p.num_parts) {
    if constexpr (WS) run_part_ws(p, smem, part);
    else run_part(p, smem, part);
  }
  VA_STAMP(VA_STAMP_PART + 2 * part, 0, 8, "done", 0);
  dl::pdl_wait();
  VA_STAMP(VA_STAMP_PART + 2 * part, 0, 9, "waited", 0);
}


// ---------------------------------------------------------------------------------------------
// The combine kernel: merges the pieces of each split pair this replay's scheduler listed.
// ---------------------------------------------------------------------------------------------
// Persistent: CTA x takes work items x, x + gridDim.x, ... of the scheduler's running count
// (entries' item_end), so every CTA of the fixed grid has work or none at all. Item i of entry q
// covers rows 8 / W * (i - first item of q) .. + 8 / W - 1 of the pair; the W warps of a row each
// stream pieces sub, sub + W, ... (two in flight, 16 value columns per lane) in one pass, with a
// running maximum of the pieces' LSEs (the sums rescaled when it rises), and merge their sums in
// a fixed order through shared memory. Three dependent reads: the entries (item counts and empty
// parts, once per CTA), the item's entry, then the pieces' LSEs and values together.
extern "C" __global__ void __launch_bounds__(va::COMBINE_WARPS * 32, va::COMBINE_CTAS_PER_SM)
verify_attn_combine(const __grid_constant__ VerifyAttnParams p) {
  using namespace va;
  constexpr int kMaxEntries = DL_VA_MAX_PARTS;
  __shared__ int s_end[kMaxEntries];
  __shared__ unsigned char s_empty[kMaxEntries];
  __shared__ float4 s_red[COMBINE_WARPS][kV / 4];
  __shared__ float s_sum[COMBINE_WARPS], s_max[COMBINE_WARPS];
  VA_STAMP(VA_STAMP_COMBINE + blockIdx.x, 0, 0, "start", 0);
  dl::pdl_wait();  // PDL: the partial results (and the scheduler's tables) first, in every CTA
  VA_STAMP(VA_STAMP_COMBINE + blockIdx.x, 0, 1, "waited", 0);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int G = min(p.num_parts, kMaxEntries);
  for (int q = tid; q < G; q += blockDim.x) {
    s_end[q] = p.entries[q].item_end;
    s_empty[q] = static_cast<unsigned char>(p.entries[q].empty != 0);
  }
  __syncthreads();
  const int total = G > 0 ? s_end[G - 1] : 0;
  const uint2* o4 = reinterpret_cast<const uint2*>(p.o_part);  // 4 bf16 values per vector
  auto widen = [](uint2 u) {  // 4 bf16 -> 4 floats (exact)
    float4 f;
    dl::unpack_bf16x2(u.x, f.x, f.y);
    dl::unpack_bf16x2(u.y, f.z, f.w);
    return f;
  };
  for (int item = blockIdx.x; item < total; item += gridDim.x) {
    int lo = 0, hi = G - 1;  // the entry: the first q with item_end > item
    while (lo < hi) {
      const int mid = (lo + hi) >> 1;
      if (s_end[mid] > item) hi = mid; else lo = mid + 1;
    }
    const VaEntry ent = p.entries[lo];
    const int W = ent.row_warps, sub = warp % W;
    const int row_in_tile = (item - (lo > 0 ? s_end[lo - 1] : 0)) * (COMBINE_WARPS / W) + warp / W;
    const int n = ent.p_last - ent.p_first + 1;
    const bool valid = row_in_tile < ent.rows;  // (uniform per warp)
    // piece k: slot0, then slot 2 * (p_first + k) unless part p_first + k is empty (-1: no piece).
    // Every piece listed was written in this replay (a piece with no visible key holds zeros).
    auto slot_of = [&](int k) {
      const int part = ent.p_first + k;
      return k == 0 ? ent.slot0 : (part < G && !s_empty[part] ? 2 * part : -1);
    };
    float m = DL_NEG_INF;  // running maximum of the pieces' LSEs (base 2)
    float4 acc[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[c] = make_float4(0.f, 0.f, 0.f, 0.f);
    float wsum = 0.f;  // 0 for -inf pieces; a NaN LSE (a visible key with NaN scores) stays NaN
    if (valid) {
#pragma unroll 1
      for (int k = sub; k < n; k += 2 * W) {
        const int sl0 = slot_of(k), sl1 = k + W < n ? slot_of(k + W) : -1;
        // offsets fit 32 bits: slots < 2 * DL_VA_MAX_PARTS, M <= 64 rows of kV / 4 vectors
        const int r0 = max(sl0, 0) * M + row_in_tile, r1 = max(sl1, 0) * M + row_in_tile;
        // zeroed: a piece that is absent (slot -1) adds 0 * v, never 0 * an unloaded register
        float4 v0[4] = {}, v1[4] = {};
        float l0 = DL_NEG_INF, l1 = DL_NEG_INF;
        if (sl0 >= 0) {
          l0 = p.lse_part[r0];
#pragma unroll
          for (int c = 0; c < 4; ++c) v0[c] = widen(o4[r0 * (kV / 4) + c * 32 + lane]);
        }
        if (sl1 >= 0) {
          l1 = p.lse_part[r1];
#pragma unroll
          for (int c = 0; c < 4; ++c) v1[c] = widen(o4[r1 * (kV / 4) + c * 32 + lane]);
        }
        const float mn = fmaxf(m, fmaxf(l0, l1));   // NaN-ignoring
        const float base = softmax_base(mn);
        const float scale = m == DL_NEG_INF ? 0.f : exp2f(m - mn);  // m finite: mn finite, <= 1
        const float w0 = sl0 >= 0 ? exp2f(l0 - base) : 0.f, w1 = sl1 >= 0 ? exp2f(l1 - base) : 0.f;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          acc[c].x = acc[c].x * scale + w0 * v0[c].x + w1 * v1[c].x;
          acc[c].y = acc[c].y * scale + w0 * v0[c].y + w1 * v1[c].y;
          acc[c].z = acc[c].z * scale + w0 * v0[c].z + w1 * v1[c].z;
          acc[c].w = acc[c].w * scale + w0 * v0[c].w + w1 * v1[c].w;
        }
        wsum = wsum * scale + w0 + w1;
        m = mn;
      }
    }
    if (W > 1) {  // (uniform) the row's W warps, merged in the order of sub
#pragma unroll
      for (int c = 0; c < 4; ++c) s_red[warp][c * 32 + lane] = acc[c];
      if (lane == 0) {
        s_sum[warp] = wsum;
        s_max[warp] = m;
      }
      __syncthreads();
      if (sub == 0) {
        float mf = m;
        for (int s = 1; s < W; ++s) mf = fmaxf(mf, s_max[warp + s]);
        const float f0 = m == DL_NEG_INF ? 0.f : exp2f(m - mf);
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          acc[c].x *= f0;
          acc[c].y *= f0;
          acc[c].z *= f0;
          acc[c].w *= f0;
        }
        wsum *= f0;
        for (int s = 1; s < W; ++s) {
          const float ms = s_max[warp + s];
          const float f = ms == DL_NEG_INF ? 0.f : exp2f(ms - mf);
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            const float4 v = s_red[warp + s][c * 32 + lane];
            acc[c].x += f * v.x;
            acc[c].y += f * v.y;
            acc[c].z += f * v.z;
            acc[c].w += f * v.w;
          }
          wsum += f * s_sum[warp + s];
        }
        m = mf;
      }
      __syncthreads();  // s_red and s_sum are read before the next item writes them
    }
    if (!valid || sub != 0) continue;
    const float inv = wsum == 0.f ? 0.f : 1.f / wsum;
    const i64 grow = ent.out_row0 + row_in_tile;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      uint2 packed;
      packed.x = dl::pack_bf16x2(acc[c].x * inv, acc[c].y * inv);
      packed.y = dl::pack_bf16x2(acc[c].z * inv, acc[c].w * inv);
      *reinterpret_cast<uint2*>(p.out + grow * kV + (c * 32 + lane) * 4) = packed;
    }
    if (p.lse != nullptr && lane == 0) p.lse[grow] = wsum == 0.f ? DL_NEG_INF : (m + log2f(wsum)) * kLn2;
  }
  VA_STAMP(VA_STAMP_COMBINE + blockIdx.x, 0, 2, "end", 0);
}
