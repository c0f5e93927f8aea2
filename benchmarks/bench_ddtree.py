"""DDTree benchmark: the GPU tree build, compile, accept and commit against the reference's way.

Shapes of the seed deployment: vocab 163,840 (``--vocab``: another, e.g. the demo step's 32,768),
depth_limit 15, budgets 16/64/256/512, batch 1 and 8. The whole step (build -> compile -> accept ->
commit) is captured into one CUDA graph with an event between stages; every replay starts from
the same saved state (restored by device-to-device copies outside the timed region), so each
stage's median GPU µs comes from the events of 30 replays. Accept reads bf16 target logits for
every tree node (its cost is reading max_batch * (budget + 1) * vocab * 2 bytes); "a+c tok" is
accept + commit when the target's argmax is already known (accept from target tokens: no logits
read).

The peer is the DDTree reference, :mod:`driverlevel.reference.ddtree` (the host definition
the kernels are checked against), with PyTorch (imported only here) for its GPU part on the
same device arrays through DLPack: log-softmax + torch.topk on the GPU, ``.cpu()``, the
Python ``heapq`` best-first search (``build_tree_from_topk``), the ancestor bitmasks
(``ancestor_masks``, padded as the GPU writes them, then copied to the GPU); for accept,
``argmax`` + ``.cpu()`` and ``greedy_accept``. Its times are host wall-clock µs (they
include the synchronizing copies).

``--topk chunked|threshold|both`` picks the build's top-K (``DDTreePlan(topk=...)``); "both"
times the two side by side, one plan of each per row of the table. The top-K column times the
build's launches before the tree (chunked: the chunk top-K; threshold: sample + stream + the
chunk top-K's fallback grid, which exits at once for rows that need nothing).

``--pdl on|off|both`` sets ``DDTreePlan(pdl=...)``, programmatic dependent launch of the build's
kernels after its first (default: the plan's, on from sm_90); "both" times off and on side by
side on the same inputs, one plan each per row (the last column says which).

Each repetition starts behind an L2 flush: in a decode step the verify kernel and the target model
run between two builds, so the build's code and data are cold there. The flush comes before the
build (and before the whole step, the top-K launches, accept from tokens and each prefix of the
build's launches); compile, accept and commit follow the build, as they do in a step. ``--flush read`` (the
default) reads 256 MB (the package's argmax kernel over a zeroed buffer), which evicts L2 and leaves
it clean, as the verify kernel's and the model's reads do. ``--flush write`` writes 256 MB, as
bench_attention.py does (the seventeenth session's tables): its ~50 MB of dirty lines are written
back while the top-K kernels read, ~6-7 µs of their time at batch 8. ``--flush drafted`` reads
256 MB and then writes the drafter logits again (a copy), as the drafter's LM head leaves them just
before the build in a decode step: batch 1's logits are then in L2, the build's code and its other
data are not (the top-K's TB/s then counts L2 hits, not DRAM reads). ``--flush none``: no flush
(the tables before the seventeenth session; at batch 1 / 16 the build then measured ~10 µs faster
than a step sees it). ``--evict-code`` also runs, before each flush, a kernel of ~290 KB of code on
every SM (:class:`CodeEvict`): the flush leaves the SMs' instruction caches as they were, so a build
whose CTAs land on SMs that ran it in the previous replay (batch 8: nearly all) finds its code there,
which a decode step, where the verify kernel and the model run in between, may not. Measured in
the twenty-sixth session (BENCHMARKS.md): the build moved by -0.3 to +0.6 µs at batch 1 and +0.3 to
+1.5 at batch 8, so the row merge's cold cost at batch 1 (11.8 µs flushed against 7.0 warm) is not
the SMs' instruction caches.

``--drafter peaked`` draws confident drafter rows instead of nearly flat ones: the default's trees
are stars (every node at depth 1), the peaked ones run through every depth (:data:`DRAFTER_BOOSTS`);
``--drafter jittered`` moves the peaked boosts per row. ``--drafter clustered`` adds to the random
rows 512 large logits in runs of 16 consecutive ids (:data:`DRAFTER_CLUSTERS`), so that some rows'
threshold fails and the build's exact fallback runs (``research/probes/sample_clustering.py``).
Every threshold row of the table is followed by how many of the build's rows fall back, counted by
the numpy twins (:func:`fallback_rows`): how many of those the build refines (and how many reads
of the row that takes at most), and how many the chunk top-K takes.
``--search heap`` makes every build use the one-warp heap instead of the parallel search.

Usage: python benchmarks/bench_ddtree.py [--quick] [--json out.json] [--logits-dtype float32|bfloat16]
                                         [--topk chunked|threshold|both] [--pdl on|off|both] [--no-reference]
                                         [--drafter random|peaked|jittered|clustered] [--search parallel|heap]
                                         [--flush read|write|drafted|none] [--evict-code]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

if __name__ == "__main__":  # (run as a script: a missing package or dependency is one line, exit 2)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
    import tool_output

    tool_output.require_package("benchmarks/bench_ddtree.py")

import numpy as np  # noqa: E402

import driverlevel as dl  # noqa: E402
from driverlevel._cli_common import dump_json_file, json_path_problem
from driverlevel._device import require_gpu
from driverlevel._dtypes import f32_to_bf16_bits
from driverlevel.ddtree import FLAG_LEGACY_SEARCH, MERGE_CAPACITY, DDTreePlan, DDTreeState, check_merge_capacity
from driverlevel.request_state import ARRAY_FIELDS
from driverlevel.reference import ddtree as ref
from driverlevel.reference import topk_threshold as tk_twin

VOCAB, DEPTH = 163_840, 15
BATCHES = (1, 8)  # the batches of every table
#: The largest --max-context: make_inputs gives the batch-8 rows' state batch x (max_context + budget + 1)
#: KV slots, whose ids the int32 req_to_token must hold (at most 2**31 slots; DDTreePlan's int32
#: kv_indptr, batch x max_context < 2**31, then holds too). The state, its snapshot and the KV indices
#: take ~256 bytes per token of context at batch 8: 69 GB there.
MAX_CONTEXT = (1 << 31) // max(BATCHES) - (512 + 1)
STAGES = ("build", "compile", "accept", "commit")
#: The build's launches, in order, per top-K mode (build_part_times prints their cumulative times).
PART_NAMES = {"chunked": ("chunk top-K", "+tree"), "threshold": ("sample", "+stream", "+tree")}
EXTRA = ("accept_tok", "topk")  # accept from given target tokens (the argmax already known); the build's
# top-K kernel alone (ddtree_topk_*, the first launch of build); each timed on its own


#: Logits of the four strong tokens per (request, depth) over N(0, 4) noise, per --drafter.
#: "random": 9 / 6 / 5 / 4, about as large as the noise's maximum (~9): every row is nearly flat
#: (top-1 probability under 1%), and the best-first tree is a star (every node at depth 1, at
#: budgets 16 and 256). "peaked": 16 / 14 / 12.5 / 11.5 over the noise's mass (~e^14): top-1
#: probability ~0.76, then ~0.10, ~0.02, ~0.01, like a confident drafter; the tree runs through
#: all 15 depths with branches at each (the search's deeper phases run).
#: "jittered": the peaked boosts, each moved per row by N(0, 0.7^2): no two depths alike, so path
#: sums do not tie within rounding as they do with the same boosts at every depth.
PEAKED_BOOSTS = (16.0, 14.0, 12.5, 11.5)
RANDOM_BOOSTS = (9.0, 6.0, 5.0, 4.0)
DRAFTER_BOOSTS = {"random": RANDOM_BOOSTS, "peaked": PEAKED_BOOSTS, "jittered": PEAKED_BOOSTS,
                  "clustered": RANDOM_BOOSTS}
DRAFTER_JITTER = {"jittered": 0.7}
#: "clustered": the random rows plus (runs, run length, low, high): 32 runs of 16 consecutive ids
#: (each starting at a multiple of 16, as a 16-token sample group does) of logits uniform in [6.5,
#: 8.5), above the noise's bulk and below the strong token of 9 (written after them): a row whose
#: K largest logits sit in runs, where the sample's groups catch a whole run at once and the
#: threshold fails more often (``research/probes/sample_clustering.py``).
DRAFTER_CLUSTERS = {"clustered": (32, 16, 6.5, 8.5)}


def drafter_logits(rng, batch, drafter="random", vocab=None):
    """``(x, top)``: fp32 drafter logits ``[batch, DEPTH, vocab]`` (N(0, 4) noise, four strong
    tokens per row from :data:`DRAFTER_BOOSTS`, moved per row by :data:`DRAFTER_JITTER`) and the
    strong tokens' ids ``[batch, DEPTH, 4]``."""
    vocab = VOCAB if vocab is None else vocab
    x = rng.standard_normal((batch, DEPTH, vocab), dtype=np.float32) * 2.0
    top = rng.integers(0, vocab, (batch, DEPTH, 4))
    if drafter in DRAFTER_CLUSTERS:
        runs, run, lo, hi = DRAFTER_CLUSTERS[drafter]
        for b in range(batch):
            for d in range(DEPTH):
                starts = rng.choice(vocab // run, runs, replace=False) * run
                idx = (starts[:, None] + np.arange(run)[None, :]).reshape(-1)
                x[b, d, idx] = rng.uniform(lo, hi, idx.size).astype(np.float32)
    jitter = DRAFTER_JITTER.get(drafter, 0.0)
    for j, boost in enumerate(DRAFTER_BOOSTS[drafter]):
        vals = boost + rng.standard_normal((batch, DEPTH, 1)) * jitter if jitter else np.full((batch, DEPTH, 1), boost)
        np.put_along_axis(x, top[:, :, j:j + 1], vals.astype(np.float32), axis=2)
    return x, top


def fallback_rows(x, plan, bf16: bool, sm_count: int) -> dict:
    """How the rows of the drafter logits ``x`` ``[batch, DEPTH, VOCAB]`` (fp32; bf16 rounded as
    uploaded when ``bf16``) fare in a build of ``plan``, by the numpy twins: ``fallback``, the rows
    whose sampled threshold fails (:func:`driverlevel.reference.topk_threshold.threshold_topk`, the
    kernels' rule: T not finite, or fewer than K or more than ``tk_cap`` logits >= T); of those,
    ``refined``, the rows ``ddtree_build`` gives a threshold of their own
    (:func:`~driverlevel.reference.topk_threshold.refine_threshold`: one SM reads the row
    ``reads`` times, ``max_reads`` the most of any row, 0 for none), and ``chunk``, the rows the
    chunk top-K takes (~15 µs per 7,680-token chunk on an H100)."""
    rows = x.shape[0] * x.shape[1]
    out = {"fallback": 0, "refined": 0, "chunk": 0, "max_reads": 0}
    for r in x.reshape(rows, -1):
        row = f32_to_bf16_bits(r) if bf16 else r
        t = tk_twin.threshold_topk(row, plan.k, bf16, MERGE_CAPACITY, sm_count, rows)
        if not t.fallback:
            continue
        out["fallback"] += 1
        refined = tk_twin.refine_threshold(row, plan.k, t.threshold, t.count, t.capacity)
        if refined.threshold is None:
            out["chunk"] += 1
        else:
            out["refined"] += 1
            out["max_reads"] = max(out["max_reads"], refined.reads)
    return out


def make_inputs(dev, stream, rng, plan, batch, logits_dtype, drafter="random"):
    """Drafter logits (:func:`drafter_logits`), bf16 target logits that follow the drafter's top
    token, and a fresh state; returns them with a snapshot."""
    x, top = drafter_logits(rng, batch, drafter)
    bf16 = logits_dtype == "bfloat16"
    logits = dl.DeviceBuffer.allocate(dev, x.size * (2 if bf16 else 4)).as_array(x.shape, dl.bfloat16 if bf16 else np.float32)
    logits.copy_from_host(f32_to_bf16_bits(x) if bf16 else x)
    rows = plan.max_rows
    target = dl.DeviceBuffer.allocate(dev, rows * VOCAB * 2).as_array((rows, VOCAB), dl.bfloat16)
    block = min(rows, 64)
    t = rng.standard_normal((block, VOCAB), dtype=np.float32)
    t[np.arange(block), top[0, np.arange(block) % DEPTH, 0]] = 12.0
    target[:block].copy_from_host(f32_to_bf16_bits(t))
    for r0 in range(block, rows, block):  # tile the random block over all rows on the device
        n = min(block, rows - r0)
        target[r0:r0 + n].copy_from(target[:n], stream)
    tokens = dl.DeviceBuffer.allocate(dev, rows * 4).as_array((rows,), np.int32)
    tokens.copy_from_host(rng.integers(0, VOCAB, rows).astype(np.int32))
    state = DDTreeState.allocate(dev, max_batch=batch, max_context=plan.max_context,
                                 num_slots=batch * (plan.max_context + plan.n_nodes))
    prefix = min(1000, plan.max_context - plan.n_nodes)
    state.upload(active=np.ones(batch, np.uint8), root_tokens=rng.integers(0, VOCAB, batch).astype(np.int32),
                 seq_lens=np.full(batch, prefix, np.int64), req_pool_indices=np.arange(batch, dtype=np.int64))
    slots = rng.permutation(state.free_slots.shape[0]).astype(np.int64)
    table = np.full((batch, plan.max_context), -1, np.int32)
    table[:, :prefix] = slots[:batch * prefix].reshape(batch, prefix)
    state.req_to_token.copy_from_host(table)
    free = slots[batch * prefix:]
    state.free_slots.copy_from_host(np.concatenate([free, slots[:batch * prefix]]))
    state.free_count.copy_from_host(np.array([free.size], np.int64))
    snapshot = {k: dl.DeviceBuffer.allocate(dev, getattr(state, k).nbytes).as_array(getattr(state, k).shape,
                                                                                    getattr(state, k).dtype)
                for k in ARRAY_FIELDS if getattr(state, k) is not None}
    for k, a in snapshot.items():
        a.copy_from(getattr(state, k), stream)
    stream.synchronize()
    return x, logits, target, tokens, state, snapshot


def gpu_stage_times(dev, stream, plan, logits, target, tokens, state, snapshot, reps, flush=None):
    """Median GPU µs of each stage over graph replays that start from the same state.

    Each stage is captured into a graph of its own; per repetition the state is
    restored, ``flush`` (an :class:`L2Flush`, or None) evicts L2 (as the
    verify step and the target model do between two builds of a decode step: the build's
    code and data are cold there), a spin kernel holds the GPU for 300 µs while the host queues event,
    stage graph, event, ..., so the events see GPU time only (each boundary adds
    the ~1 µs a graph launch costs on the GPU). "step" times the four stages
    captured together in one graph, the way a decode step runs them; "accept_tok" is
    accept from given target tokens (no argmax read), timed after a fresh compile.
    """
    from driverlevel import selftest

    spin = selftest.load(dev).kernel("spin_wait_ns")
    topk_launches = build_launches(plan, stream, logits, state)[:-1]  # packed before any capture
    for k, a in snapshot.items():
        getattr(state, k).copy_from(a, stream)
    stage_calls = {
        "build": lambda: plan.build(stream, logits, state),
        "compile": lambda: plan.compile(stream, state),
        "accept": lambda: plan.accept(stream, state, target_logits=target),
        "commit": lambda: plan.commit(stream, state),
        "accept_tok": lambda: plan.accept(stream, state, target_tokens=tokens),
        "topk": lambda: [ln.launch(stream) for ln in topk_launches],
    }
    graphs = {}
    for s in STAGES + EXTRA:
        with dl.capture(stream) as cap:
            stage_calls[s]()
        graphs[s] = cap.graph.instantiate()
    with dl.capture(stream) as cap:
        for s in STAGES:
            stage_calls[s]()
    whole = cap.graph.instantiate()
    ev = [dev.create_event() for _ in range(len(STAGES) + 7)]
    per = {s: [] for s in STAGES + EXTRA}
    total = []
    for r in range(reps + 3):
        for k, a in snapshot.items():
            getattr(state, k).copy_from(a, stream)
        _evict_l2(flush, stream, r)
        spin.launch(stream, 1, 32, [np.int64(300_000)])
        ev[0].record(stream)
        for i, s in enumerate(STAGES):
            graphs[s].launch(stream)
            ev[i + 1].record(stream)
        for k, a in snapshot.items():
            getattr(state, k).copy_from(a, stream)
        _evict_l2(flush, stream, r)
        spin.launch(stream, 1, 32, [np.int64(300_000)])
        ev[-2].record(stream)
        whole.launch(stream)
        ev[-1].record(stream)
        for k, a in snapshot.items():
            getattr(state, k).copy_from(a, stream)
        graphs["compile"].launch(stream)
        _evict_l2(flush, stream, r)
        spin.launch(stream, 1, 32, [np.int64(100_000)])
        ev[-4].record(stream)
        graphs["accept_tok"].launch(stream)
        ev[-3].record(stream)
        _evict_l2(flush, stream, r)
        spin.launch(stream, 1, 32, [np.int64(100_000)])
        ev[-5].record(stream)
        graphs["topk"].launch(stream)
        ev[-6].record(stream)
        stream.synchronize()
        if r >= 3:  # warm-up replays
            for i, s in enumerate(STAGES):
                per[s].append(ev[i].elapsed_ms(ev[i + 1]) * 1e3)
            per["accept_tok"].append(ev[-4].elapsed_ms(ev[-3]) * 1e3)
            per["topk"].append(ev[-5].elapsed_ms(ev[-6]) * 1e3)
            total.append(ev[-2].elapsed_ms(ev[-1]) * 1e3)
    out = {s: statistics.median(v) for s, v in per.items()}
    out["step"] = statistics.median(total)
    return out


class L2Flush:
    """Evicts L2 on a stream before a timed replay (``--flush``), 256 MB, several times the L2.

    ``"read"``: the argmax kernel (:func:`driverlevel.argmax.argmax_rows_launch`) over a zeroed
    float32 ``[4096, 16384]`` buffer, one warp per row, writing 16 KB of indices: L2 is left clean.
    ``"write"``: the buffer's bytes set to ``r & 0xFF`` (:meth:`DeviceArray.fill_bytes`): L2 is left
    holding ~50 MB of dirty lines, which the next kernels' misses write back.
    ``"drafted"``: "read", then :attr:`refresh` (set per plan: the drafter logits written again from a
    copy, as the drafter's LM head leaves them just before the build), so that the logits are in L2
    as far as it holds them (all of batch 1's 9.8 MB of fp32; of batch 8's 78.6 MB, the last-written
    part that fits: 50 MB on the H100, 60 MiB on the H200) and the build's code and other data are not.
    """

    ROWS, COLS = 4096, 16384  # float32: 256 MB

    def __init__(self, dev, stream, mode: str):
        from driverlevel.argmax import argmax_rows_launch

        if mode not in ("read", "write", "drafted"):
            raise ValueError(f"flush mode must be 'read', 'write' or 'drafted', got {mode!r}")
        self.mode = mode
        self.evict_code = None  # a CodeEvict to run before the flush (--evict-code)
        self.refresh = None  # "drafted": a callable(stream) that writes the drafter logits again
        self.buf = dl.DeviceBuffer.allocate(dev, self.ROWS * self.COLS * 4, label="l2-flush").as_array(
            (self.ROWS, self.COLS), np.float32)
        self.buf.fill_bytes(0, stream)
        self.nbytes = self.buf.nbytes
        if mode in ("read", "drafted"):
            idx = dl.DeviceBuffer.allocate(dev, self.ROWS * 4, label="l2-flush-index").as_array((self.ROWS,), np.int32)
            self._read = argmax_rows_launch(dev, self.buf, index=idx, m_max=self.ROWS)
        stream.synchronize()

    def __call__(self, stream, r: int) -> None:
        if self.mode == "write":
            self.buf.fill_bytes(r & 0xFF, stream)
        else:
            self._read.launch(stream)
        if self.mode == "drafted":
            if self.refresh is None:
                raise RuntimeError("L2Flush('drafted') has no refresh: set it to the plan's logits copy first")
            self.refresh(stream)

    def draft_from(self, dev, stream, logits) -> None:
        """For "drafted": keep a device copy of ``logits`` and write it back into them after each
        flush (:attr:`refresh`), as the drafter's LM head leaves them just before the build."""
        copy = dl.DeviceBuffer.allocate(dev, logits.nbytes, label="drafted-logits").as_array(
            (logits.nbytes,), np.uint8)
        copy.copy_from(logits, stream)
        self.refresh = lambda s: logits.copy_from(copy, s)


#: A kernel whose only purpose is its code's size (``--evict-code``; tools/ddtree_stamps.py too):
#: each CTA runs two loops of EVICT_STEPS distinct steps (two FFMA each), which NVRTC unrolls fully
#: up to 4,096: a ~290 KB cubin on sm_90, over twice the ~128 KB that microbenchmarks report for an
#: SM's instruction caches (not measured here: the build with and without it is the test).
EVICT_SRC = r'''
extern "C" __global__ void evict_code(float* out) {
  float a = static_cast<float>(threadIdx.x), b = 1.0f;
#pragma unroll
  for (int i = 0; i < EVICT_STEPS; ++i) {
    a = fmaf(a, 1.0001f, static_cast<float>(i ^ 0x5a5));
    b = fmaf(b, a, -static_cast<float>(i & 0xff));
  }
#pragma unroll
  for (int i = 0; i < EVICT_STEPS; ++i) {
    b = fmaf(b, 0.9999f, static_cast<float>(i ^ 0x3c3));
    a = fmaf(a, b, static_cast<float>(i & 0x7f));
  }
  if (a == 12345.0f && b == 54321.0f) out[0] = a + b;  // (never true: keeps the steps)
}
'''
EVICT_STEPS = 4096


class CodeEvict:
    """Evicts the build's code from every SM's instruction caches (``--evict-code``), as the verify
    kernel and the model do between two builds of a decode step: :data:`EVICT_SRC` on 8 CTAs per SM
    (~35 µs). Calling it queues the kernel on a stream."""

    def __init__(self, dev):
        from driverlevel._module import load_module

        cub = dl.runtime.compile_source(EVICT_SRC, "evict_code.cu", dev.arch, {"EVICT_STEPS": EVICT_STEPS})
        self._kernel = load_module(dev, cub).kernel("evict_code")
        self._out = dl.DeviceBuffer.allocate(dev, 4, label="evict-code").as_array((1,), np.float32)
        self._grid = 8 * dev.sm_count

    def __call__(self, stream) -> None:
        self._kernel.launch(stream, self._grid, 128, [self._out])


def _evict_l2(flush, stream, r):
    """Run ``flush`` (an :class:`L2Flush`, with its :class:`CodeEvict` first when it has one) on
    ``stream``, unless it is None (``--flush none``)."""
    if flush is not None:
        if flush.evict_code is not None:
            flush.evict_code(stream)
        flush(stream, r)


def build_part_times(dev, stream, plan, logits, state, snapshot, reps, flush=None):
    """Median GPU µs of a one-kernel graph and the build's launches, cumulative.

    Returns ``(floor, [t(first), t(first two), ...])``: ``floor`` is a graph of one empty
    kernel (selftest's ``noop``, one thread) timed the same way, the share of every graph
    time below that is the graph's launch and the events, not the build's work. Each prefix of the build's prepared launches (threshold: sample, stream, tree;
    chunked: chunk top-K, tree) is captured into a graph of its own and timed the way
    :func:`gpu_stage_times` times a stage (state restored, ``flush`` run, a spin kernel ahead,
    events around it), so consecutive differences are each launch's share, boundaries included.
    """
    from driverlevel import selftest

    spin = selftest.load(dev).kernel("spin_wait_ns")
    launches = build_launches(plan, stream, logits, state)
    noop = selftest.load(dev).kernel("noop")
    with dl.capture(stream) as cap:
        noop.launch(stream, 1, 1, [])
    graphs = [cap.graph.instantiate()]
    for i in range(1, len(launches) + 1):
        with dl.capture(stream) as cap:
            for ln in launches[:i]:
                ln.launch(stream)
        graphs.append(cap.graph.instantiate())
    ev = [dev.create_event() for _ in range(2)]
    per = [[] for _ in graphs]
    for r in range(reps + 3):
        for i, g in enumerate(graphs):
            for k, a in snapshot.items():
                getattr(state, k).copy_from(a, stream)
            _evict_l2(flush, stream, r)
            spin.launch(stream, 1, 32, [np.int64(100_000)])
            ev[0].record(stream)
            g.launch(stream)
            ev[1].record(stream)
            stream.synchronize()
            if r >= 3:
                per[i].append(ev[0].elapsed_ms(ev[1]) * 1e3)
    medians = [statistics.median(v) for v in per]
    return medians[0], medians[1:]


def build_launches(plan, stream, logits, state):
    """The prepared launches of ``plan.build`` (top-K, then tree), packed by one eager build.

    Reads the plan's launch cache (a benchmark-only reach-in) so that the top-K kernel can be
    captured and timed alone.
    """
    plan.build(stream, logits, state)
    stream.synchronize()
    found = [v for k, v in plan._cache.items() if k[0] == "build" and k[1] == logits.ptr]
    if len(found) != 1:
        raise RuntimeError(f"expected one packed build for these logits, found {len(found)}")
    return found[0]


def reference_build(ids, lp, budget, roots=None):
    """The DDTree reference's tree build from per-depth top-K lists (:mod:`driverlevel.reference.ddtree`).

    ``ids`` int ``[batch, depth_limit, K]`` and ``lp`` float32 ``[batch, depth_limit, K]`` on the
    host; returns the per-request :class:`~driverlevel.reference.ddtree.Tree` list (the Python
    ``heapq`` best-first search of :func:`~driverlevel.reference.ddtree.build_tree_from_topk`).
    """
    roots = np.zeros(len(ids), np.int64) if roots is None else roots
    return [ref.build_tree_from_topk(int(roots[b]), ids[b], lp[b], budget) for b in range(len(ids))]


def reference_visibility(trees, ids, lp, budget):
    """Ancestor bitmasks of every tree (:func:`~driverlevel.reference.ddtree.ancestor_masks`), padded
    into a :class:`~driverlevel.reference.ddtree.TreeBatch` as the GPU writes it."""
    bs, words = len(trees), ref.mask_words(budget)
    out = ref.TreeBatch(
        tokens=np.full((bs, budget + 1), -1, np.int32), depths=np.full((bs, budget + 1), -1, np.int32),
        parents=np.full((bs, budget + 1), -1, np.int32), node_counts=np.zeros(bs, np.int32),
        masks=np.zeros((bs, budget + 1, words), np.uint32), top_ids=np.asarray(ids, np.int32),
        top_lp=np.asarray(lp, np.float32), budget=budget)
    for b, t in enumerate(trees):
        n = t.num_nodes
        out.tokens[b, :n], out.depths[b, :n], out.parents[b, :n] = t.tokens, t.depths, t.parents
        out.node_counts[b] = n
        out.masks[b, :n] = ref.ancestor_masks(t.parents, words)
    return out


def reference_accept(batch, posterior):
    """The reference's greedy accept (:func:`~driverlevel.reference.ddtree.greedy_accept`) of every
    tree of ``batch`` against the target's tokens ``posterior`` (int ``[total nodes]``, rows in
    request order)."""
    bs = batch.node_counts.shape[0]
    qo = np.concatenate([[0], np.cumsum(batch.node_counts, dtype=np.int64)])
    return ref.greedy_accept(batch, qo, posterior, np.ones(bs, bool), np.zeros(bs, np.int64),
                             max_context=batch.budget + DEPTH + 2, depth_limit=DEPTH)


def reference_times(torch, logits, target, budget, batch, reps):
    """Host µs of the DDTree reference's tree build (copy / heap / visibility) and of its accept.

    The GPU part runs with PyTorch on the same device arrays (log-softmax + ``torch.topk``,
    then ``.cpu()``; the target's ``argmax`` then ``.cpu()``), the rest is
    :mod:`driverlevel.reference.ddtree` on the host; the masks are copied back to the GPU.
    """
    lg = torch.from_dlpack(logits)
    tg = torch.from_dlpack(target)
    dev = lg.device
    k = min(budget, VOCAB)
    rows = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        vals, ids = torch.topk(torch.log_softmax(lg.float(), dim=-1), k, dim=-1)
        vals, ids = vals.cpu().numpy(), ids.cpu().numpy()
        t1 = time.perf_counter()
        trees = reference_build(ids, vals, budget)
        t2 = time.perf_counter()
        tb = reference_visibility(trees, ids, vals, budget)
        torch.from_numpy(tb.masks).to(dev)
        torch.cuda.synchronize()
        t3 = time.perf_counter()
        n_rows = int(tb.node_counts.sum())
        post = tg[:n_rows].argmax(dim=-1).cpu().numpy()
        reference_accept(tb, post)
        t4 = time.perf_counter()
        rows.append(((t1 - t0) * 1e6, (t2 - t1) * 1e6, (t3 - t2) * 1e6, (t4 - t3) * 1e6))
    med = [statistics.median(c) for c in zip(*rows)]
    return {"copy": med[0], "heap": med[1], "visibility": med[2], "build": med[0] + med[1] + med[2], "accept": med[3]}


def tree_shape(plan) -> list[int]:
    """Request 0's nodes by depth (root excluded) in the plan's last tree: ``[n_1, n_2, ...]`` up to
    its deepest node."""
    n = int(plan.node_counts.to_numpy()[0])
    depths = plan.depths.to_numpy()[0, 1:n]
    return np.bincount(depths, minlength=2)[1:].tolist() if depths.size else []


def main(argv=None) -> int:
    global VOCAB  # --vocab: the module's functions read it
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="budgets 16 and 256, fewer repetitions")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--logits-dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--max-context", type=int, default=4096,
                    help="tokens of context per request the state holds (default 4096)")
    ap.add_argument("--topk", default="both", choices=("chunked", "threshold", "both"),
                    help="the build's top-K (DDTreePlan(topk=...)); both: side by side")
    ap.add_argument("--pdl", default=None, choices=("on", "off", "both"),
                    help="programmatic dependent launch of the build's kernels (DDTreePlan(pdl=...)); "
                         "default: the plan's (on from sm_90); both: off and on side by side")
    ap.add_argument("--no-reference", action="store_true", help="skip the reference's (torch + heapq) columns")
    ap.add_argument("--search", default="parallel", choices=("parallel", "heap"),
                    help="the build's tree search: parallel (default: the block-wide search; deep trees of budget "
                         "<= 16 take the deviation search; the rare rows where neither can prove exactness, the heap) "
                         "or heap (DDTreePlan.flags = FLAG_LEGACY_SEARCH: the one-warp best-first heap for every request)")
    ap.add_argument("--drafter", default="random", choices=tuple(DRAFTER_BOOSTS),
                    help="drafter logits: random (default; nearly flat rows, the trees are stars of depth 1), "
                         "peaked (a confident drafter: deep trees; the same boosts at every depth), jittered "
                         "(peaked, the boosts moved per row: no artificial ties) or clustered (random, plus 512 "
                         "large logits per row in runs of 16 consecutive ids: some rows' threshold fails)")
    ap.add_argument("--evict-code", action="store_true",
                    help="before each timed replay's flush, also run a kernel of ~290 KB of code on every SM, so "
                         "that the build's code is in no SM's instruction caches, as in a decode step (needs a "
                         "--flush other than none)")
    ap.add_argument("--vocab", type=int, default=VOCAB,
                    help="the drafter's vocabulary (the seed deployment's, Kimi's, by default; the demo step's is 32768)")
    ap.add_argument("--flush", default="read", choices=("read", "write", "drafted", "none"),
                    help="how L2 is evicted before each timed replay: read 256 MB (default; L2 left clean, like a "
                         "decode step's verify and model reads), write 256 MB (as bench_attention; leaves dirty "
                         "lines the top-K kernels then write back), drafted (read, then the drafter logits written "
                         "again, as a drafter leaves them in L2 just before the build; the top-K's TB/s then "
                         "counts L2 hits), or none (the build's code and data may stay in L2 from the previous "
                         "replay, which a decode step never leaves)")
    args = ap.parse_args(argv)
    budgets = (16, 256) if args.quick else (16, 64, 256, 512)
    if args.vocab < max(budgets) or args.vocab % 8:
        ap.error(f"--vocab must be a multiple of 8, >= {max(budgets)} (the largest budget's top-K"
                 f"{', with --quick' if args.quick else ''}), got {args.vocab}")
    for budget in budgets:  # DDTreePlan's vocabulary x budget rule
        try:
            check_merge_capacity(args.vocab, budget)
        except ValueError as exc:
            ap.error(f"--vocab {args.vocab} with budget {budget}: {exc}")
    VOCAB = args.vocab
    if args.evict_code and args.flush == "none":
        ap.error("--evict-code evicts the code with the flush: give --flush read, write or drafted")
    need = max(budgets) + 2  # the largest budget's nodes and a prefix of at least one token
    if args.max_context < need:
        ap.error(f"--max-context must be >= {need} (budget + 1 nodes and a prefix), got {args.max_context}")
    if args.max_context > MAX_CONTEXT:  # else the batch-8 rows' state refuses it after the batch-1 rows ran
        ap.error(f"--max-context must be <= {MAX_CONTEXT} (batch {max(BATCHES)} x (max_context + 513) KV slots must "
                 f"fit the state's int32 req_to_token; 69 GB of state there), got {args.max_context}")
    problem = json_path_problem(args.json, stdout_ok=False)  # before the GPU check and the minutes of measuring
    if problem:
        ap.error(f"--json: {problem}")
    require_gpu()
    torch = None
    if not args.no_reference:
        try:
            import torch
        except ImportError:
            torch = None
    modes = ("chunked", "threshold") if args.topk == "both" else (args.topk,)
    pdls = {None: (None,), "on": (True,), "off": (False,), "both": (False, True)}[args.pdl]
    dev = dl.Device(0)
    stream = dev.create_stream()
    rng = np.random.default_rng(0)
    reps = 10 if args.quick else 30
    flush = None if args.flush == "none" else L2Flush(dev, stream, args.flush)
    if args.evict_code:
        flush.evict_code = CodeEvict(dev)
    results = []
    print(f"{dev.name}: vocab {VOCAB}, depth_limit {DEPTH}, drafter logits {args.logits_dtype} ({args.drafter}), "
          f"{args.search} search, target bf16; "
          f"median GPU µs per stage (graph replay, events) vs the reference's way (host µs, torch "
          f"{'not installed' if torch is None else torch.__version__}); "
          + ("L2 warm (no flush)" if flush is None else f"build, step and top-K behind a 256 MB L2 flush ({flush.mode})"
             + (" and a code eviction on every SM" if args.evict_code else "")))
    head = (f"{'top-K':>9} {'budget':>6} {'batch':>5} | {'build':>7} {'compile':>7} {'accept':>7} {'commit':>7} {'acc+com':>7} "
            f"{'a+c tok':>7} {'step':>7} {'top-K':>7} {'TB/s':>5} | {'ref build':>9} {'copy':>6} {'heap':>6} {'vis':>6} {'ref acc':>7} | "
            f"{'build x':>7} | {'pdl':>3}")
    print(head)
    print("-" * len(head))
    for batch, budget, mode, pdl in ((b, k, m, p) for b in BATCHES for k in budgets for m in modes for p in pdls):
        plan = DDTreePlan(dev, max_batch=batch, depth_limit=DEPTH, vocab=VOCAB, budget=budget,
                          max_context=args.max_context, logits_dtype=args.logits_dtype, target_dtype="bfloat16",
                          topk=mode, pdl=pdl)
        if args.search == "heap":
            plan.flags = FLAG_LEGACY_SEARCH  # (before the first launch: launches are packed once)
        rng = np.random.default_rng(1000 * batch + budget)  # the same inputs for both top-K paths (and pdl)
        x, logits, target, tokens, state, snap = make_inputs(dev, stream, rng, plan, batch, args.logits_dtype,
                                                             args.drafter)
        nfall = (fallback_rows(x, plan, args.logits_dtype == "bfloat16", dev.sm_count)
                 if mode == "threshold" else None)
        if args.flush == "drafted":  # the logits written again after each flush
            flush.draft_from(dev, stream, logits)
        g = gpu_stage_times(dev, stream, plan, logits, target, tokens, state, snap, reps, flush)
        shape = tree_shape(plan)
        floor, parts = build_part_times(dev, stream, plan, logits, state, snap, reps, flush)
        r = reference_times(torch, logits, target, budget, batch, max(3, reps // 3)) if torch else None
        row = {"topk": mode, "pdl": plan.pdl, "budget": budget, "batch": batch, "gpu_us": g, "reference_us": r,
               "build_speedup": (r["build"] / g["build"]) if r else None,
               "workspace_bytes": plan.workspace_bytes, "build_parts_cumulative_us": parts,
               "graph_floor_us": floor, "tree_nodes_by_depth": shape,
               "threshold_fallback_rows": None if nfall is None else nfall["fallback"],
               "threshold_fallback_paths": nfall}
        results.append(row)
        ref = (f"{r['build']:9.0f} {r['copy']:6.0f} {r['heap']:6.0f} {r['visibility']:6.0f} {r['accept']:7.0f}"
               if r else f"{'-':>9} {'-':>6} {'-':>6} {'-':>6} {'-':>7}")
        sp = f"{row['build_speedup']:7.1f}" if r else f"{'-':>7}"
        row["topk_read_tb_s"] = logits.nbytes / (g["topk"] * 1e-6) / 1e12
        print(f"{mode:>9} {budget:6d} {batch:5d} | {g['build']:7.1f} {g['compile']:7.1f} {g['accept']:7.1f} {g['commit']:7.1f} "
              f"{g['accept'] + g['commit']:7.1f} {g['accept_tok'] + g['commit']:7.1f} {g['step']:7.1f} {g['topk']:7.1f} "
              f"{row['topk_read_tb_s']:5.2f} | {ref} | {sp} | {'on' if plan.pdl else 'off':>3}",
              flush=True)
        names = PART_NAMES[mode]
        print(f"{'':>9} {'':>6} {'':>5} | build's launches, cumulative µs: "
              + ", ".join(f"{n} {t:.1f}" for n, t in zip(names, parts))
              + f" (a one-noop graph: {floor:.1f}); request 0's tree, nodes by depth: {shape}"
              + ("" if nfall is None else f"; rows falling back (numpy twin): {nfall['fallback']} of {batch * DEPTH}"
                                          f" (refined {nfall['refined']}, reading the row at most {nfall['max_reads']}x;"
                                          f" chunk top-K {nfall['chunk']})"), flush=True)
        del plan, x, logits, target, tokens, state, snap
    if args.json:
        return dump_json_file(args.json, {
            "device": dev.name, "vocab": VOCAB, "depth_limit": DEPTH, "logits_dtype": args.logits_dtype,
            "drafter": args.drafter, "search": args.search,
            "l2_flush": args.flush, "l2_flush_bytes": 0 if flush is None else flush.nbytes,
            "evict_code": bool(args.evict_code), "results": results})
    return 0


if __name__ == "__main__":  # (tool_output, imported above: a failed write of stdout is one line, exit 2)
    sys.exit(tool_output.run(main, "benchmarks/bench_ddtree.py"))
