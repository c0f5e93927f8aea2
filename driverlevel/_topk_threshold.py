"""Host-side layout of the threshold top-K (``DDTreePlan(topk="threshold")``), shared by the
launcher (:mod:`driverlevel.ddtree`) and the numpy twin (:mod:`driverlevel.reference.topk_threshold`).

The threshold top-K of one logits row (``cu/ddtree/topk_threshold.cuh``):

1. **sample** (``ddtree_topk_sample_*``, one CTA per row): ``SAMPLE_VALUES`` = 4,096 logits
   read as :func:`sample_items` 32-byte groups (8 fp32 / 16 bf16 tokens each), one group at a
   hashed offset inside each of that many equal strata of the row (stratified: a
   contiguous or a plain strided sample is biased when large logits cluster, e.g. at the
   low, frequent token ids). The threshold ``T`` is a lower bound of the ``m``-th largest
   sampled value (:func:`sample_rank`) that admits at most :func:`sample_slack` more sampled
   values (unless they tie with the ``m``-th): ``kth_largest_bound`` of
   ``cu/ddtree/keys.cuh``, on most rows one histogram level of the exact select's several. At
   least ``m`` sampled values are ``>= T``, so the row holds at least ``K`` with overwhelming
   probability, and at most ``m + sample_slack``, so it holds no more than
   :func:`candidate_capacity`. Rows of at most 4,096 tokens are sampled whole (``m = K``: then
   ``count >= K`` always). The kernel re-arms the row's candidate counter.
2. **stream** (``ddtree_topk_stream_*``, ``segments`` CTAs per row, :func:`stream_segments`):
   one pass over the row through a ring of :func:`stream_config` tiles in shared memory
   (cp.async, several tiles in flight per CTA); each value is compared with ``T``; the few
   ``>= T`` are appended (warp-aggregated, through a per-warp shared staging buffer) to the
   row's candidate list of ``capacity`` entries; the log-softmax normaliser comes from the same
   pass (per segment the sums of ``exp(x - T)`` below and above ``T``; ``ddtree_build`` adds
   them up relative to the row maximum).
3. **fallback**: for a row where the threshold failed (``count < K``, ``count > capacity``,
   or ``T`` not finite) the row's ``ddtree_build`` CTA finds a threshold ``T'`` of the row's
   own that admits between ``K`` and ``capacity`` logits, by reading the row itself (windows
   of keys below ``T`` appended to the list while it holds fewer than ``K``, else a radix
   select on the order keys; the normaliser is the stream's sums rescaled to ``T'``:
   cu/ddtree/build.cuh, ``refine_row``), and merges that list as if ``T'`` had been sampled.
   Where no such ``T'`` exists or the sums are not finite (``T`` not finite, more than
   ``capacity`` logits tied at one value, fewer than ``K`` above ``-inf``, a logit 80 or more
   above ``T``) it runs the chunk top-K of ``topk="chunked"`` over the row's chunks itself (the
   same code on 512 threads; ~15 µs per 7,680-token chunk on an H100). Neither is a launch of
   its own, so the rows that need nothing cost nothing. Either way the result is the exact
   top-K (see the twin).

The scheme is this project's own (no published source): a sampled threshold as in
sampling-based selection (Floyd & Rivest 1975, "Expected time bounds for selection", CACM
18(3)), with an exact fallback: the row's own threshold, or the chunk top-K.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ._checks import non_negative_int, positive_int
from ._constants import (DDTREE_TK_SAMPLE_VALUES, DDTREE_TK_STREAM_CTAS_PER_SM, DDTREE_TK_STREAM_THREADS,
                         DDTREE_TK_STREAM_VECS, DDTREE_TK_WARP_STAGE)

__all__ = [
    "SAMPLE_VALUES", "SAMPLE_FAIL", "SAMPLE_Z", "SAMPLE_THREADS", "STREAM_THREADS", "STREAM_VECS", "STREAM_CTAS_PER_SM",
    "STREAM_MAX_STAGES", "STREAM_STATIC_BYTES", "WARP_STAGE", "stream_tile_bytes", "stream_config",
    "group_tokens", "sample_items", "sample_groups", "sample_tokens", "sample_rank", "hypergeom_tail", "sample_slack", "candidate_capacity",
    "stream_tile_tokens", "stream_segments", "sample_carveout", "hash32",
]

#: Logits the sample kernel reads per row (16 KB of fp32 or bf16; 256 threads x 16).
SAMPLE_VALUES = DDTREE_TK_SAMPLE_VALUES
#: The most probability per row that the sampled threshold admits fewer than K logits, for
#: values sampled at random (:func:`sample_rank`; such a row takes the exact fallback).
SAMPLE_FAIL = 3e-7
#: Standard deviations of safety in :func:`sample_slack` and :func:`candidate_capacity`.
SAMPLE_Z = 5.0
#: Block size of the sample kernel (16 sampled logits per thread).
SAMPLE_THREADS = 256
#: Block size of the stream kernel, 16-byte vectors per thread per tile.
STREAM_THREADS = DDTREE_TK_STREAM_THREADS
STREAM_VECS = DDTREE_TK_STREAM_VECS
#: Stream CTAs per SM the kernels are built for (``__launch_bounds__``: <= 64 registers).
STREAM_CTAS_PER_SM = DDTREE_TK_STREAM_CTAS_PER_SM
#: Most tiles in the stream kernel's shared-memory ring.
STREAM_MAX_STAGES = 8
#: Upper bound of the stream kernel's static shared memory plus the 1 KB the driver reserves
#: per block, bytes (its resource report says about 4.2 KB; a CPU test checks the bound).
STREAM_STATIC_BYTES = 6 * 1024
#: Candidates a warp stages in shared memory before one global atomicAdd flushes them.
WARP_STAGE = DDTREE_TK_WARP_STAGE


def group_tokens(bf16: bool) -> int:
    """Tokens of one 32-byte sample group: 8 fp32 or 16 bf16."""
    return 16 if bf16 else 8


def sample_items(bf16: bool) -> int:
    """Sample groups per row (512 fp32 / 256 bf16: 4,096 values either way)."""
    return SAMPLE_VALUES // group_tokens(bf16)


def hash32(i):
    """The kernel's integer hash of a stratum index (uint32 arithmetic)."""
    h = np.asarray(i, np.uint64) * np.uint64(0x9E3779B1) & np.uint64(0xFFFFFFFF)
    h ^= h >> np.uint64(16)
    h = h * np.uint64(0x85EBCA6B) & np.uint64(0xFFFFFFFF)
    h ^= h >> np.uint64(13)
    return h


def sample_groups(vocab: int, bf16: bool):
    """First token of every sampled group, or ``None`` when the row is sampled whole
    (``vocab <= SAMPLE_VALUES``)."""
    if vocab <= SAMPLE_VALUES:
        return None
    g = group_tokens(bf16)
    ns = sample_items(bf16)
    ng = vocab // g  # whole groups (>= ns here); the tail of < g tokens is never sampled
    i = np.arange(ns, dtype=np.int64)
    lo = i * ng // ns
    hi = (i + 1) * ng // ns
    off = (hash32(i) % (hi - lo).astype(np.uint64)).astype(np.int64)
    return (lo + off) * g


def sample_tokens(vocab: int, bf16: bool):
    """Every token id the sample reads, group by group (:func:`sample_groups`' groups of
    :func:`group_tokens` ids each, ``int64 [SAMPLE_VALUES]``), or ``None`` when the row is sampled
    whole (``vocab <= SAMPLE_VALUES``)."""
    starts = sample_groups(vocab, bf16)
    if starts is None:
        return None
    return (starts[:, None] + np.arange(group_tokens(bf16))[None, :]).reshape(-1)


def sample_rank(k: int, vocab: int) -> int:
    """``m``: the threshold is at most the ``m``-th largest of the sampled values (at least
    ``m`` of them are ``>= T``).

    The row counts fewer than ``K`` logits ``>= T`` only if ``m`` or more sampled values lie
    among the row's ``K - 1`` largest. For ``n`` values drawn without replacement from ``N``
    that number is hypergeometric, ``X ~ H(N, K - 1, n)``; ``m`` is the smallest with
    ``P(X >= m) <= SAMPLE_FAIL`` (the whole tail, not an approximation: :func:`hypergeom_tail`;
    ``N = 16 floor(vocab / 16)``, the tokens the sample can read in either dtype, which only
    raises the tail). The
    stratified sample spreads its draws over the row, so rows whose large logits are spread out
    fail less often than that; rows whose large logits sit in runs of consecutive ids (a 32-byte
    group holds 8 or 16 of them at once) fail more often. A failed row takes the exact fallback:
    the rate costs time, never exactness. Against the worst such run, ``m`` is at least
    ``min(K, 17)``: one sampled group cannot fail a row alone (the first stratum's group is
    always tokens 0-7 or 0-15, where frequent tokens tend to sit). A row sampled whole
    (``vocab <= SAMPLE_VALUES``) uses ``m = K`` (exact: ``count >= K`` always).

    Vocabulary 163,840: ``m`` = 1 / 16 / 17 / 23 / 35 at K = 1 / 16 / 64 / 256 / 512 (the
    tail alone: 1 / 7 / 12 / 23 / 35). The normal approximation used until the twentieth
    session gave 26 / 26 / 29 / 37 / 48, failing at 1e-14 and below instead of its intended
    3e-7; at K = 256 the new ``m`` keeps ~950 candidates per row on random rows instead of
    ~1,500.

    Raises
    ------
    TypeError
        ``k`` or ``vocab`` is not an int (bools and floats refused).
    ValueError
        ``k`` or ``vocab`` is below 1.
    """
    k, vocab = positive_int("k", k), positive_int("vocab", vocab)
    if vocab <= SAMPLE_VALUES:
        return k
    return _sample_rank(k, vocab, SAMPLE_FAIL)


@functools.lru_cache(maxsize=256)
def _sample_rank(k: int, vocab: int, p_fail: float) -> int:
    population = 16 * (vocab // 16)
    # K - 1 above a population that small: every sampled value is among them, X = n always
    tail = hypergeom_tail(population, min(k - 1, population), SAMPLE_VALUES)
    m = 1
    while m < len(tail) and tail[m] > p_fail:
        m += 1
    # one sampled group (up to 16 consecutive bf16 tokens) never fails a row alone
    return max(1, min(SAMPLE_VALUES, max(m, min(k, 17))))


def hypergeom_tail(population: int, successes: int, draws: int) -> list[float]:
    """``[P(X >= x) for x in 0 .. min(successes, draws) + 1]`` for ``X`` hypergeometric: the
    successes among ``draws`` drawn without replacement from ``population`` of which
    ``successes`` are successes (the last entry is 0).

    Float64 from log-gamma terms: within ~1e-8 relative of the exact tail for populations up
    to a few million (every vocabulary), ~1e-6 at 1e9; the terms cancel, so much larger
    populations lose accuracy fast.

    Raises
    ------
    TypeError
        An argument is not an int (bools and floats refused).
    ValueError
        ``population < 0``, or ``successes`` or ``draws`` outside ``0 .. population``.
    """
    population = non_negative_int("population", population)
    successes = non_negative_int("successes", successes)
    draws = non_negative_int("draws", draws)
    if not 0 <= successes <= population or not 0 <= draws <= population:
        raise ValueError(f"hypergeom_tail({population}, {successes}, {draws}): need 0 <= successes, draws "
                         f"<= population")

    def lcomb(a: int, b: int) -> float:
        return math.lgamma(a + 1) - math.lgamma(b + 1) - math.lgamma(a - b + 1)

    top = min(successes, draws)
    lo = max(0, draws - (population - successes))
    whole = lcomb(population, draws)
    pmf = [0.0 if x < lo else math.exp(lcomb(successes, x) + lcomb(population - successes, draws - x) - whole)
           for x in range(top + 1)]
    tail = [0.0] * (top + 2)
    for x in range(top, -1, -1):
        tail[x] = tail[x + 1] + pmf[x]
    return tail


def sample_slack(k: int, vocab: int) -> int:
    """``S = floor(z sqrt(m))``: the sampled values ``T`` may admit past the ``m``-th largest
    (``m``: :func:`sample_rank`, z = :data:`SAMPLE_Z`); more only when values tie with the
    ``m``-th largest (the exact ``m``-th largest admits those too).

    ``kth_largest_bound`` stops at the first histogram level whose bin holding the ``m``-th
    admits at most ``S`` more, and takes the bin's lowest value. ``z sqrt(m)`` is the sample's
    own spread at ``z`` standard deviations, and :func:`candidate_capacity` has room for it.
    The first level's log bins (1/16 to 1/8 of ``vmax - value`` wide in key space) hold fewer
    than that past the ``m``-th on most rows, so one level usually decides; rows whose ``m``-th
    sampled value is below 0 while the sample's maximum is above 0 (there a bin spans octaves
    of values) or whose maximum is a far outlier take a second (a larger slack: fewer levels,
    more candidates).
    """
    return int(SAMPLE_Z * math.sqrt(sample_rank(k, vocab)))


def candidate_capacity(k: int, vocab: int, merge_capacity: int) -> int:
    """Candidates kept per row (a multiple of 256, at most the row merge's ``merge_capacity``).

    Room for ``m + 2 z sqrt(m) + 16`` sampled-value equivalents (``vocab / n`` each), at
    least ``4 K``. ``T`` admits ``N <= m + S`` sampled values (``S = floor(z sqrt(m))``:
    :func:`sample_slack`), and the row count above it is at most ``(N + z sqrt(N)) vocab / n``
    unless the sample is ``z`` standard deviations off; as ``sqrt(m + z sqrt(m)) <= sqrt(m) +
    z / 2``, ``N + z sqrt(N) <= m + 2 z sqrt(m) + z^2 / 2`` (``z^2 / 2 = 12.5 < 16``): the room
    holds at the slack's end, by ``z`` standard deviations of the count instead of the ``2 z``
    it has at ``N = m`` (the exact ``m``-th largest; most rows admit a few to a few tens past
    it, so the capacity is unchanged). A row sampled whole counts exactly ``N <= K + S < 4 K + 1024``. A row with more candidates
    (e.g. a constant row: every value ties with ``T``) takes the exact fallback.
    """
    if vocab <= SAMPLE_VALUES:
        want = 4 * k + 1024
    else:
        m = sample_rank(k, vocab)
        want = max(4 * k, (m + 2 * SAMPLE_Z * math.sqrt(m) + 16) * vocab / SAMPLE_VALUES)
    cap = -(-int(math.ceil(want)) // 256) * 256
    return int(min(merge_capacity, max(256, cap)))


def stream_tile_tokens(bf16: bool) -> int:
    """Tokens one stream CTA reads per tile: 256 threads x 16 (four 16-byte vectors of fp32,
    two of bf16): 4,096 tokens, 16 KB of fp32 or 8 KB of bf16."""
    return STREAM_THREADS * STREAM_VECS * 4


def stream_tile_bytes(bf16: bool) -> int:
    """Bytes of one stream tile (16 KB of fp32, 8 KB of bf16): one slot of the ring."""
    return stream_tile_tokens(bf16) * (2 if bf16 else 4)


def stream_config(bf16: bool, smem_per_sm: int, smem_per_block: int) -> tuple[int, int]:
    """``(ctas_per_sm, stages)`` of the stream kernel on a GPU with ``smem_per_sm`` bytes of
    shared memory per SM and ``smem_per_block`` per block (opt-in).

    The ring's ``stages`` tiles (dynamic shared memory, ``stages * stream_tile_bytes``) keep
    ``stages - 1`` tiles per CTA in flight (fp32 issues all ``stages`` before its PDL wait on the
    sample kernel); the most CTAs per SM (up to
    :data:`STREAM_CTAS_PER_SM`) that still fit 3 stages each, else 2 CTAs of 2 or more.
    H200 (228 KB per SM): 4 CTAs x 3 fp32 tiles (48 KB), 4 x 6 bf16 tiles; sm_120 (100 KB):
    2 x 2 fp32 tiles, 3 x 3 bf16 tiles.
    """
    tile = stream_tile_bytes(bf16)
    for ctas in range(STREAM_CTAS_PER_SM, 0, -1):
        room = min(smem_per_sm // ctas, smem_per_block) - STREAM_STATIC_BYTES
        stages = min(STREAM_MAX_STAGES, room // tile)
        if stages >= 3 or (ctas <= 2 and stages >= 2):
            return ctas, int(stages)
    raise ValueError(f"the stream kernel needs two {tile} B tiles of shared memory per block, the GPU has "
                     f"{smem_per_block} B")


def sample_carveout(rows: int, stream_ctas: int, sm_count: int, ctas_per_sm: int) -> int | None:
    """The sample kernel's launch carveout (percent of the SM's L1 / shared storage as shared
    memory), or None for the driver's default.

    With programmatic launch the stream's CTAs may start while the sample's (one per row, ``rows``
    of them, one per SM while ``rows <= sm_count``) still run; but a CTA cannot join an SM whose
    shared-memory configuration differs from its launch's until that SM drains, and the stream
    asks for the largest carveout while the sample (2.6 KB of shared memory) gets a small one. With
    the sample at the largest carveout too (100), the stream's CTAs start beside it and put their
    first tiles in flight during the sample, but those tiles queue in front of the sample's loads
    and slow it. That trade pays only when most of the stream would otherwise wait: the rule asks
    for 100 when fewer than a quarter of the ``stream_ctas`` fit on the ``ctas_per_sm`` slots of
    the SMs without a sample CTA.

    Measured on an H100 (132 SMs, 4 stream CTAs per SM), vocabulary 163,840, depth 15, the carveout
    against the default side by side (fifty-first and fifty-second sessions, BENCHMARKS.md, DDTree
    stages), by the fraction of the stream's CTAs that fit beside the sample: batch 8 (10%: 48 of
    480) the build ran 0.2-1.0 µs faster in fp32 and 1.3-2.2 µs in bf16; batch 6 (37%) mixed (the
    carveout's build: fp32 -1.3 / +0.2 µs at budgets 16 / 256, bf16 +0.3 / +0.5); batches 4, 3
    and 2 (60%, 77%, 97%) 0.4-2.3 µs slower in fp32 and up to 1.0 in bf16; batch 1 (all fit) +0.7.
    On an H200 (fifty-third session, rule on against off): batch 7 (21%, the rule asks) 0.3-1.2 µs
    faster with the carveout, batch 5 (43%, it does not ask) within the noise (-0.4 to +0.3). On
    sm_100 / sm_120 the rule applies by the same mechanism, unmeasured.

    Parameters are counts: ``rows`` sample CTAs, ``stream_ctas`` stream CTAs, the GPU's
    ``sm_count`` and the stream's ``ctas_per_sm`` (:func:`stream_config`).
    """
    free = max(int(sm_count) - int(rows), 0) * max(int(ctas_per_sm), 1)
    return 100 if 4 * free < int(stream_ctas) else None


def stream_segments(rows: int, vocab: int, bf16: bool, sm_count: int,
                    ctas_per_sm: int = STREAM_CTAS_PER_SM) -> tuple[int, int]:
    """``(segments, segment_tokens)`` of the stream kernel: each row is cut into ``segments``
    segments of ``per`` whole tiles.

    A CTA puts its first tiles in flight, then streams its tiles with more in flight, so a
    wave of CTAs takes about ``per + 2`` tile times (the ring's start and drain counted as
    two); ``per`` minimises ``waves * (per + 2)`` with
    ``waves = ceil(rows * segments / (ctas_per_sm * sm_count))``, the larger ``per`` on a tie
    (fewer CTAs). Batch 8 (120 rows of 40 fp32 tiles, 132 SMs, 4 CTAs per SM): 4 segments of
    10 tiles, one wave; batch 1 (15 rows): 20 segments of 2 tiles.
    """
    tile = stream_tile_tokens(bf16)
    tiles = -(-vocab // tile)
    slots = max(1, ctas_per_sm) * max(1, sm_count)
    best = None
    for per in range(1, tiles + 1):
        segs = -(-tiles // per)
        cost = -(-(rows * segs) // slots) * (per + 2)
        if best is None or cost <= best[0]:
            best = (cost, per)
    seg = best[1] * tile
    return -(-vocab // seg), seg


