"""Verify attention for MLA draft trees: the plan that sizes, validates and launches.

Pairs with ``cu/verify_attention.cu`` (kernels ``verify_attn_schedule``,
``verify_attn_partial`` and ``verify_attn_combine``). Built once per shape class,
with no host work per step: a scheduler kernel, the first node of every
:meth:`VerifyAttention.run`, reads the step's lengths from device memory and
cuts the work into equal-cost parts for a fixed persistent grid (the device-side
metadata of FlashMLA's ``get_mla_metadata``), so ragged batches are balanced, the
split-KV workspace is bounded by the grid, and one captured graph serves every
step: prefixes from 0 to the pool size, 1 to ``max_batch`` requests, 0 to
``max_q`` draft tokens per request (0 = a padded request).

MLA, absorbed form (DeepSeek-V2/V3, Kimi K2): one latent KV head shared by all
query heads; a cache row is 576 bf16 (512 ``c_kv`` + 64 ``k_pe``); scores use all
576 columns, values are the first 512. Paged KV with page size 1.

Algorithms: the online softmax (Milakov & Gimelshein 2018, arXiv 1805.02867) over key
tiles as in FlashAttention-2 (Dao 2023, arXiv 2307.08691, Algorithm 1), split over the
keys with a log-sum-exp merge of the parts (Flash-Decoding, Dao, Haziza, Massa &
Sizov 2023; the combine kernel); MLA's absorbed form from DeepSeek-V2 (arXiv 2405.04434,
section 2.1). The tiles' measured throughput against the GPU's ceilings and peers is in
BENCHMARKS.md, "Verify attention".
"""

from __future__ import annotations

import ctypes
import math
import numbers
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from ._checks import bool_arg, is_bool
from ._checks import device_array_arg as _arr
from ._checks import need_dtype as _need_dtype
from ._checks import need_shape as _need_shape
from ._checks import non_negative_int, positive_int
from ._checks import stream_arg as _stream_arg
from ._compile import (CompileVariant, _stacklevel_outside_package, arch_number, compile_file, normalize_arch,
                       nvrtc_version, shared_limit)
from ._device import _check_device_arg
from ._device_error import DeviceErrorWord, error_defines
from ._mask import MaskFormat, bitmask_words, parse_mask_format
from ._memory import WorkspacePool
from ._module import (check_plan_args, check_pool_device, check_pool_open, load_module, resolve_pdl,
                      struct_layout_defines)
from ._workspace_formula import (CUT_RECORD_BYTES, ENTRY_RECORD_BYTES, REQUEST_RECORD_BYTES, partial_workspace_bytes,
                                 scheduler_bytes)

__all__ = ["VerifyAttention", "VerifyMetadata", "TileConfig", "tile_config", "tile_configs", "compile_defines",
           "compile_variants", "DEFAULT_SM_SCALE", "mla_softmax_scale"]

QK_DIM = 576
V_DIM = 512
#: DeepSeek-style models: qk_nope 128 + rope 64 -> 1/sqrt(192), without YaRN (see :func:`mla_softmax_scale`).
DEFAULT_SM_SCALE = 1.0 / math.sqrt(192.0)


def mla_softmax_scale(qk_head_dim: int = 192, rope_scaling: Mapping | None = None) -> float:
    """The softmax scale of a DeepSeek-style MLA checkpoint: ``qk_head_dim ** -0.5``, times
    ``mscale ** 2`` when its ``rope_scaling`` is YaRN with a ``mscale_all_dim``.

    ``mscale = 0.1 * mscale_all_dim * ln(factor) + 1`` for ``factor > 1`` (1 otherwise): YaRN's
    attention-temperature correction (Peng et al. 2023, arXiv 2309.00071: ``sqrt(1/t) = 0.1 ln(s)
    + 1``), as DeepSeek-V2's reference modelling code and SGLang's ``deepseek_v2.py`` apply it
    to the scale. Pass the checkpoint's config values, e.g. ``mla_softmax_scale(128 + 64,
    config["rope_scaling"])``; the result is the ``sm_scale`` of :class:`VerifyAttention`.

    Parameters
    ----------
    qk_head_dim : int
        ``qk_nope_head_dim + qk_rope_head_dim`` (192 for DeepSeek-V2/V3 and Kimi K2).
    rope_scaling : mapping or None
        The config's ``rope_scaling``: ``factor`` and ``mscale_all_dim`` are read when its
        ``rope_type`` (or, without one, the legacy ``type``) is ``"yarn"``; anything else leaves
        the scale alone.

    Raises
    ------
    TypeError
        ``qk_head_dim`` not an int, ``rope_scaling`` not a mapping, or a ``factor`` /
        ``mscale_all_dim`` that is not a real number (a bool is refused).
    ValueError
        ``qk_head_dim`` below 1 or past the float range, a YaRN ``rope_scaling`` without ``factor``, a ``factor`` that
        is not a positive finite number, a ``mscale_all_dim`` that is not finite (an int past the
        float range included), or values whose ``mscale`` or scale is not positive and finite.
    """
    qk_head_dim = positive_int("qk_head_dim", qk_head_dim)
    try:
        scale = 1.0 / math.sqrt(qk_head_dim)
    except OverflowError:  # (an int past the float range: 2**1100)
        raise ValueError(f"qk_head_dim must be a head dimension (a float-range int), got {qk_head_dim!r}") from None
    if rope_scaling is None:
        return scale
    if not isinstance(rope_scaling, Mapping):
        raise TypeError(f"rope_scaling must be a mapping (the config's rope_scaling) or None, "
                        f"got {type(rope_scaling).__name__}")
    # (rope_type first, the legacy type where it is absent: as transformers reads a config whose two disagree)
    if str(rope_scaling.get("rope_type", rope_scaling.get("type", ""))).lower() != "yarn":
        return scale
    if "factor" not in rope_scaling:  # (DeepSeek-V2's modelling code reads it unconditionally)
        raise ValueError("rope_scaling is YaRN but has no 'factor': the scale correction needs it")
    values = {}
    for key, default in (("factor", 1.0), ("mscale_all_dim", 0.0)):
        v = rope_scaling.get(key, default)
        if is_bool(v) or not isinstance(v, numbers.Real):
            raise TypeError(f"rope_scaling[{key!r}] must be a real number, got {type(v).__name__} {v!r}")
        try:
            values[key] = float(v)
        except OverflowError:  # (an int past the float range: 10**400)
            raise ValueError(f"rope_scaling[{key!r}] must be a finite number, got {v!r}") from None
    factor, mscale_all_dim = values["factor"], values["mscale_all_dim"]
    if not math.isfinite(factor) or factor <= 0:
        raise ValueError(f"rope_scaling['factor'] must be a positive finite number, got {factor!r}")
    if not math.isfinite(mscale_all_dim):
        raise ValueError(f"rope_scaling['mscale_all_dim'] must be a finite number, got {mscale_all_dim!r}")
    if not mscale_all_dim or factor <= 1:
        return scale
    mscale = 0.1 * mscale_all_dim * math.log(factor) + 1.0
    if mscale <= 0:  # (its square would hide the sign: a negative temperature read as a large scale)
        raise ValueError(f"rope_scaling gives mscale = 0.1 * mscale_all_dim * ln(factor) + 1 = {mscale!r} from "
                         f"factor {factor!r} and mscale_all_dim {mscale_all_dim!r}: it must be positive")
    out = scale * mscale * mscale
    if not math.isfinite(out) or out <= 0:
        raise ValueError(f"rope_scaling gives no usable softmax scale ({out!r}) from factor {factor!r} and "
                         f"mscale_all_dim {mscale_all_dim!r}: the scale must be positive and finite")
    return out


_ROW_BYTES = QK_DIM * 2 + 16
_MASK_MODE = {MaskFormat.FULL: 0, MaskFormat.QLEN_ONLY: 1, MaskFormat.BITMASK: 2, MaskFormat.CAUSAL: 3}
#: Largest ``num_splits`` (the optional cap on the pieces of one pair).
MAX_SPLITS = 1024
#: Largest ``max_batch`` and ``num_parts`` (the scheduler's per-request and per-part tables are static
#: shared arrays of this size: 33 KB, under the 48 KB static limit; ``DL_VA_MAX_BATCH`` in the kernel).
MAX_BATCH = 1024
MAX_PARTS = 1024
#: Fixed cost of a (request, row tile) pair in keys (a Q-tile load and an epilogue); the kernel gets it in
#: key tiles, ``DL_OVH_TILES = max(1, 192 // keys)``.
_OVH_KEYS = 192
_SCHED_THREADS = 512
#: The combine's block (8 warps, cu/verify_attention.cu COMBINE_WARPS) and its CTAs per SM (its
#: ``__launch_bounds__``): a persistent grid of one wave.
_COMBINE_THREADS = 256
_COMBINE_CTAS_PER_SM = 2
#: ``TileConfig.exchange`` -> ``DL_EXCHANGE`` of the kernel.
_EXCHANGES = {"allreduce": 0, "reduce_scatter": 1}
_INDEX_BITS = {"qo_indptr": 1, "kv_indptr": 2, "kv_indices": 4, "out_cache_loc": 8, "mask_indptr": 16}
#: Shared memory the partial kernel's schedule pass needs below the tile's records
#: (cu/verify_attention.cu ``run_part_ws``: ``WS_KEEP_OFFSET + DL_VA_MAX_BATCH * sizeof(VaRequest)``;
#: ``SchedPrefix`` is 32 int64 + 96 int32 per-warp words, ``MAX_BATCH + 1`` int64 and int32
#: prefix sums and ``MAX_BATCH`` int32 pair costs, then two cuts, rounded up to 16 B).
_SCHED_PREFIX_BYTES = (8 * 32 + 4 * 3 * 32 + 8 * (MAX_BATCH + 1) + 4 * (MAX_BATCH + 1) + 4 * MAX_BATCH + 7) // 8 * 8
_SCHED_SCRATCH_BYTES = ((_SCHED_PREFIX_BYTES + 2 * CUT_RECORD_BYTES + 15) // 16 * 16
                        + MAX_BATCH * REQUEST_RECORD_BYTES)


class _Params(ctypes.Structure):
    """ctypes mirror of ``VerifyAttnParams`` in cu/verify_attention.cu (checked at compile time)."""

    _fields_ = [
        ("q", ctypes.c_uint64),
        ("kv_cache", ctypes.c_uint64),
        ("qo_indptr", ctypes.c_uint64),
        ("kv_indptr", ctypes.c_uint64),
        ("kv_indices", ctypes.c_uint64),
        ("out_cache_loc", ctypes.c_uint64),
        ("mask", ctypes.c_uint64),
        ("mask_indptr", ctypes.c_uint64),
        ("out", ctypes.c_uint64),
        ("lse", ctypes.c_uint64),
        ("o_part", ctypes.c_uint64),
        ("lse_part", ctypes.c_uint64),
        ("reqs", ctypes.c_uint64),
        ("cuts", ctypes.c_uint64),
        ("entries", ctypes.c_uint64),
        ("err", ctypes.c_uint64),
        ("q_rows", ctypes.c_int64),
        ("kv_indices_len", ctypes.c_int64),
        ("num_slots", ctypes.c_int64),
        ("mask_len", ctypes.c_int64),
        ("scale_log2", ctypes.c_float),
        ("num_heads", ctypes.c_int32),
        ("batch_size", ctypes.c_int32),
        ("num_parts", ctypes.c_int32),
        ("max_q", ctypes.c_int32),
        ("split_cap", ctypes.c_int32),
        ("mask_mode", ctypes.c_int32),
        ("mask_words", ctypes.c_int32),
        ("idx64", ctypes.c_int32),
    ]


@dataclass(frozen=True)
class TileConfig:
    """Compile-time tile shape of ``verify_attn_partial``.

    Attributes
    ----------
    rows : int
        Rows (draft token x head pairs) per CTA, M.
    csplit : int
        Warps sharing 16 rows (each takes 1/csplit of the contraction and of the value columns).
    keys : int
        Keys per shared-memory tile, N.
    stages : int
        K tiles in flight (cp.async pipeline depth).
    qreg : bool
        Each warp keeps its Q fragments (16 rows x 576/csplit columns) in registers instead of
        reading Q from a shared-memory tile; Q then takes no shared memory.
    exchange : str
        How the ``csplit`` warps of 16 rows combine their partial S: ``"allreduce"`` (every warp
        sums all partials of all keys and runs the mask and softmax on the whole tile, P stays in
        registers) or ``"reduce_scatter"`` (each warp sums, masks and exponentiates only its
        ``keys/csplit`` keys; the warps exchange per-row maxima, hand P over in shared memory and
        add their row sums once per segment). ``reduce_scatter`` needs ``csplit > 1`` and
        ``keys/8`` divisible by ``csplit``.
    pv_rows : int
        Rows of each warp's P·V accumulator: 16 (its own row group, ``512/csplit`` value
        columns) or 32 (``reduce_scatter`` only, ``rows/16`` even: the ``2*csplit`` warps of two
        row groups each take all 32 rows and ``512/(2*csplit)`` columns, so every V fragment
        read from shared memory feeds two m16 tiles; + ``rows * 4`` B of shared memory).
    bulk : bool
        K tiles by bulk copies where the architecture has them (sm_90 and later; ``cp.async``
        below): one thread per key row copies its 1,152 B with one ``cp.async.bulk``, each stage's
        completion counted by an mbarrier (+ ``8 * stages`` B of shared memory on every
        architecture). PTX ISA 8.0, "cp.async.bulk" and "mbarrier".
    ws : bool
        QK warps and PV warps (research/verify_ws.md; the default on sm_80, sm_86, sm_87, sm_89,
        sm_90 and sm_120/121): ``rows/16`` QK warps keep ``q_regs`` k-steps of Q's latent
        columns in registers and compute S, the mask, the softmax and P for their 16 rows over
        the whole contraction (no S exchange); 8 PV warps (4 with 32 rows) accumulate 32 rows x
        128 value columns each (48 rows: 48 rows x 64 columns), and with ``pv_softmax`` also do
        the mask and the softmax; tile t's S overlaps tile t-1's P V. The segment's bookkeeping lives in
        shared memory (a 96-byte record), so the shipped ws tiles fit 168 registers per thread
        without spilling (not every ws configuration does: see :func:`tile_configs`).
        Needs ``csplit=1``, ``stages >= 3``, ``rows`` 32, 48 or 64, ``keys`` 16 or 32, and none of
        ``qreg``, ``exchange='reduce_scatter'``, ``pv_rows=32``, ``bulk``.
    qk_chains : int
        ``ws`` only: accumulator sets of a QK warp over interleaved k-steps (1 to 4; each set adds
        keys/8 independent mma chains for the one QK warp per scheduler, and 4*keys/8 registers).
    q_regs : int
        ``ws`` only: k-steps of Q's 512 latent columns a QK warp holds in registers (4 registers
        each, 1..32; default 32). The rest of Q, latent columns ``16*q_regs..511`` and the 64 rope
        columns, is read from shared memory with ``ldmatrix`` in every tile (``rows * ((36 -
        q_regs) * 32 + 16)`` B): fewer registers for Q leave room to load K fragments further
        ahead.
    pv_softmax : bool
        ``ws`` only: the PV warps do the mask, the online softmax, P and the LSE, the QK warps
        only compute S (fp32, two S slots of ``rows x (keys + 8)`` floats in shared memory, one
        P slot and one slot of rescale factors instead of two): a shorter critical path for the
        QK warps where the PV warps have time to spare. On the H200 1.04x with 48 rows x 32
        keys (sm_80/sm_87/sm_90's 144-row tile), 0.89-0.90x with 64 rows (whose 32-key build,
        ``_WS32`` with ``pv_softmax``, also spills on sm_90: 64 B of spill stores and 40 B of
        spill loads per thread with NVRTC 13.5; selectable, not a default).
    qk_skew : bool
        ``ws`` only (not with ``pv_softmax``; ``stages >= 4``): a QK warp runs the mask and the
        softmax of tile t-1 in the same block of instructions as the mma of tile t, so that the
        scheduler fills the mma chain's ``ldmatrix`` waits with the softmax (the QK warps are the
        critical path of every key tile: research/verify_ws.md); the PV warps apply tile t-2.
        A tile's V then lives one iteration longer: tiles are loaded ``stages - 3`` ahead.
    wgmma : bool
        ``ws`` only, 64 rows, 32 keys, ``q_regs`` a multiple of 4, no ``pv_softmax``; sm_90
        only (the kernel is compiled for the architecture-specific target ``sm_90a``:
        :meth:`nvrtc_target`): the four QK warps are one warpgroup and compute S with
        ``wgmma.mma_async`` m64n32k16 (Q's ``q_regs`` k-steps from registers, the rest of Q
        and the K tile read by the tensor cores from shared memory once per warpgroup instead
        of once per warp, by ``ldmatrix``); K stages and the Q tile are stored 128-byte
        swizzled. On the H200 1.05-1.13x the same tile
        without it (BENCHMARKS.md, twenty-seventh session). PTX ISA 8.0, "Asynchronous
        Warpgroup Level Matrix Multiply-Accumulate".
    wgmma_pv : bool
        With ``wgmma`` only: the 8 PV warps are two warpgroups of 64 rows x 256 value columns
        and apply a key tile with two ``wgmma.mma_async`` m64n256k16 (A = P from registers, B =
        V read by the tensor cores from the K stage by descriptor, N-major: ``imm-trans-b = 1``,
        instead of ``ldmatrix.trans`` and 64 mma.sync a warp). On the H200 1.13-1.22x the tile
        with ``wgmma`` alone at 64-row shapes (BENCHMARKS.md, twenty-eighth session); sm_90's
        default tile has both.

    Raises
    ------
    TypeError
        An int field is not an int (a bool included), or a bool field (``qreg``, ``bulk``,
        ``ws``, ``pv_softmax``, ``qk_skew``, ``wgmma``, ``wgmma_pv``) is not a bool (numpy's is
        taken, and stored as a Python bool): ``"TileConfig.ws must be a bool, got str 'yes'"``.
    ValueError
        A field is out of its range, or the fields do not fit together (e.g. ``ws=True`` with
        ``csplit=2``).
    """

    rows: int
    csplit: int
    keys: int
    stages: int
    qreg: bool = False
    exchange: str = "allreduce"
    pv_rows: int = 16
    bulk: bool = False
    ws: bool = False
    qk_chains: int = 1
    q_regs: int = 32
    pv_softmax: bool = False
    qk_skew: bool = False
    wgmma: bool = False
    wgmma_pv: bool = False

    def __post_init__(self):
        for f in ("rows", "csplit", "keys", "stages", "pv_rows", "qk_chains", "q_regs"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise TypeError(f"TileConfig.{f} must be an int, got {v!r}")
        for f in ("qreg", "bulk", "ws", "pv_softmax", "qk_skew", "wgmma", "wgmma_pv"):  # numpy's bool is stored as a Python bool
            object.__setattr__(self, f, bool_arg(f"TileConfig.{f}", getattr(self, f)))
        # each field's own range first, then what the fields need of each other
        if not (16 <= self.rows <= 128 and self.rows % 16 == 0):
            raise ValueError(f"rows must be a multiple of 16 in 16..128 (m16 tiles), got {self.rows}")
        if not (16 <= self.keys <= 64 and self.keys % 16 == 0):
            raise ValueError(f"keys must be a multiple of 16 in 16..64 (k16 steps of P V), got {self.keys}")
        if self.csplit not in (1, 2, 4):
            raise ValueError(f"csplit must be 1, 2 or 4 (it splits 36 k-steps and 512 value columns), got {self.csplit}")
        if not 2 <= self.stages <= 8:
            raise ValueError(f"stages must be in 2..8 (K tiles in flight), got {self.stages}")
        if self.exchange not in _EXCHANGES:
            raise ValueError(f"exchange must be one of {sorted(_EXCHANGES)}, got {self.exchange!r}")
        if self.pv_rows not in (16, 32):
            raise ValueError(f"pv_rows must be 16 or 32, got {self.pv_rows!r}")
        if self.qk_chains not in (1, 2, 3, 4):
            raise ValueError(f"qk_chains must be 1, or 2 to 4 with ws=True (got {self.qk_chains!r}, ws={self.ws})")
        if not 1 <= self.q_regs <= 32:
            raise ValueError(f"q_regs must be 32, or 1..32 with ws=True (got {self.q_regs!r}, ws={self.ws})")
        if self.threads > 1024:
            raise ValueError(f"rows={self.rows} x csplit={self.csplit} needs {self.threads} threads per CTA, more than 1024")
        if self.qk_chains != 1 and not self.ws:
            raise ValueError(f"qk_chains must be 1, or 2 to 4 with ws=True (got {self.qk_chains!r}, ws={self.ws})")
        if self.pv_softmax and not self.ws:
            raise ValueError(f"pv_softmax=True needs ws=True (got {self})")
        if self.qk_skew and (not self.ws or self.pv_softmax or self.stages < 4):
            raise ValueError(f"qk_skew=True needs ws=True, stages >= 4 and no pv_softmax (got {self})")
        if self.q_regs != 32 and not self.ws:
            raise ValueError(f"q_regs must be 32, or 1..32 with ws=True (got {self.q_regs!r}, ws={self.ws})")
        if self.ws and (self.csplit != 1 or self.stages < 3 or self.rows not in (32, 48, 64) or self.keys not in (16, 32)
                        or self.qreg or self.exchange != "allreduce" or self.pv_rows != 16 or self.bulk):
            raise ValueError(f"ws=True needs csplit=1, stages >= 3, rows 32, 48 or 64, keys 16 or 32 and no qreg, "
                             f"reduce-scatter, pv_rows=32 or bulk (got {self})")
        if self.exchange == "reduce_scatter" and (self.csplit < 2 or (self.keys // 8) % self.csplit):
            raise ValueError(f"exchange='reduce_scatter' needs csplit > 1 and keys/8 divisible by csplit "
                             f"(csplit={self.csplit}, keys={self.keys})")
        if self.pv_rows == 32 and (self.exchange != "reduce_scatter" or (self.rows // 16) % 2):
            raise ValueError(f"pv_rows=32 needs exchange='reduce_scatter' and an even number of 16-row groups "
                             f"(rows={self.rows}, exchange={self.exchange!r})")
        if self.wgmma and (not self.ws or self.rows != 64 or self.keys != 32 or self.pv_softmax or self.q_regs % 4):
            raise ValueError(f"wgmma=True needs ws=True, rows=64, keys=32, q_regs a multiple of 4 (whole 64-column "
                             f"slabs of Q in shared memory) and no pv_softmax (got {self.label})")
        if self.wgmma_pv and not self.wgmma:
            raise ValueError(f"wgmma_pv=True needs wgmma=True (got {self.label})")
        self._check_kernel_layout()

    def _check_kernel_layout(self) -> None:
        """The ``static_assert`` s of ``cu/verify_attention.cu`` that depend on the tile alone (not on
        the architecture's shared-memory limit), so that a tile the kernel rejects is a ``ValueError``
        here rather than an ``NvrtcError`` at the first compile. The kernel's ws code
        (``attend_segment_ws``, ``run_part_ws``) is compiled for every tile, so its loader layout,
        which depends on ``rows`` only, constrains the other tiles too."""
        rows, keys, threads = self.rows, self.keys, self.threads
        # THREADS % M == 0 holds for every tile but ws ones (2 * rows * csplit threads); THREADS % N:
        if threads % keys:
            raise ValueError(f"row loaders assume whole threads per row: the CTA's {threads} threads must be a multiple "
                             f"of keys={keys} (got {self.label})")
        # ws loaders: the PV warps (WS_PV_WARPS of rows, whatever the tile), LPW threads per row of mask words
        mt = 2 if rows % 32 == 0 else 3
        loaders = (rows // (16 * mt)) * (4 if rows % 32 == 0 else 8) * 32
        if loaders % keys:
            raise ValueError(f"whole loader threads per key row: the kernel's {loaders} loader threads for {rows} rows "
                             f"must be a multiple of keys={keys} (got {self.label})")
        lpw = next((w for w in (8, 4, 2) if loaders // rows >= w), 1)
        kpt = keys // lpw
        if kpt * lpw != keys or rows * lpw > loaders or (rows * lpw) % 32:
            raise ValueError(f"mask words: whole keys per thread, whole warps: {rows} rows x {lpw} threads a row must "
                             f"be whole warps within the kernel's {loaders} loader threads for {rows} rows, and "
                             f"{lpw} must divide keys={keys} (got {self.label})")
        if self.pv_softmax and kpt % 4:
            raise ValueError(f"pv_softmax: the softmax reads S four floats at a time: keys / {lpw} must be a multiple "
                             f"of 4 (got {self.label})")
        if self.bulk and 32 % (threads // keys):
            raise ValueError(f"bulk: a key row's threads are lanes of one warp: {threads} threads / keys={keys} must "
                             f"divide 32 (got {self.label})")
        # the partial kernel's own schedule pass (part_cuts) runs in the tile's shared memory, below
        # the 96-byte record at its end (and the bulk copies' mbarriers)
        below = self.shared_bytes - (8 * self.stages if self.bulk else 0) - 96
        if below < _SCHED_SCRATCH_BYTES:
            raise ValueError(f"the schedule's prefix sums and the requests of the prefix pass need "
                             f"{_SCHED_SCRATCH_BYTES} B of the tile's shared memory, it has {below} B "
                             f"below its records (got {self.label}: {self.shared_bytes} B)")

    @property
    def _loop_flags(self) -> str:
        """`` rs``, `` pv32``, `` bulk`` where set (part of :attr:`label` and of the plan's repr)."""
        return ((" rs" if self.exchange == "reduce_scatter" else "") + (" pv32" if self.pv_rows == 32 else "")
                + (" bulk" if self.bulk else ""))

    @property
    def _ws_flags(self) -> str:
        """`` ws``, `` chains=2``, `` qregs=N``, `` pvsm``, `` skew``, `` wgmma``, `` pv`` where set
        (part of :attr:`label` and of the plan's repr)."""
        return ((" ws" if self.ws else "") + (f" chains={self.qk_chains}" if self.qk_chains != 1 else "")
                + (f" qregs={self.q_regs}" if self.q_regs != 32 else "") + (" pvsm" if self.pv_softmax else "")
                + (" skew" if self.qk_skew else "") + (" wgmma" if self.wgmma else "") + (" pv" if self.wgmma_pv else ""))

    def nvrtc_target(self, arch) -> str:
        """The NVRTC target this tile's kernel is compiled for on ``arch``: ``"sm_90a"`` for a
        ``wgmma`` tile (which runs on sm_90 only), else ``arch`` normalised.

        Raises
        ------
        ValueError
            A ``wgmma`` tile on an architecture other than sm_90 (wgmma is sm_90a's).
        """
        arch = normalize_arch(arch)
        if not self.wgmma:
            return arch
        if not _has_instructions(self, arch):
            raise ValueError(f"tile {self.label} uses wgmma, which only sm_90 has (sm_90a), not {arch}")
        return "sm_90a"

    @property
    def label(self) -> str:
        """Short description, e.g. ``rows=32 csplit=4 keys=32 stages=2 qreg rs``."""
        return (f"rows={self.rows} csplit={self.csplit} keys={self.keys} stages={self.stages}"
                + (" qreg" if self.qreg else "") + self._loop_flags + self._ws_flags)

    @property
    def threads(self) -> int:
        """Threads per CTA: ``rows / 16`` warp rows x ``csplit`` warps each x 32 (``ws``: ``rows / 16``
        QK warps + 8 PV warps, 4 with 32 rows)."""
        if self.ws:
            return (self.rows // 16 + (4 if self.rows == 32 else 8)) * 32
        return (self.rows // 16) * self.csplit * 32

    @property
    def shared_bytes(self) -> int:
        """Dynamic shared memory per CTA, bytes (Q tile unless ``qreg`` + K stages + one S exchange buffer,
        + with ``reduce_scatter`` a bf16 P buffer of ``rows x (2*keys + 16)`` B and ``rows x csplit`` floats
        of row maxima / row sums, + with ``pv_rows=32`` ``rows`` floats of final row sums, + with ``bulk``
        one 8-byte mbarrier per stage; ``ws``: the Q columns not in registers ``rows x ((36 - q_regs) * 32
        + 16)`` B + K stages + two P slots + two slots of rescale factors + final row sums + two
        slots of visibility words + the 96-byte segment record; ``pv_softmax``: one P slot, one
        slot of rescale factors, two fp32 S slots of ``rows x (keys + 8)`` floats, no visibility
        words)."""
        warps = self.threads // 32
        x = warps * (self.keys // 8) * 4 * 32 * 4 if self.csplit > 1 else 0
        q = 0 if self.qreg else self.rows * _ROW_BYTES
        rs = self.rows * (2 * self.keys + 16) + self.rows * self.csplit * 4 if self.exchange == "reduce_scatter" else 0
        pv = self.rows * 4 if self.pv_rows == 32 else 0
        bars = 8 * self.stages if self.bulk else 0
        if self.ws:  # the kernel's WS layout (cu/verify_attention.cu: Q_BYTES .. L_BYTES)
            slots = 1 if self.pv_softmax else 2  # P and rescale-factor slots
            qs = self.rows * ((36 - self.q_regs) * 32 + 16)  # Q columns not in registers, + 16 B a row
            p_mx = slots * self.rows * (2 * self.keys + 16) + slots * self.rows * 4
            s_slots = 2 * self.rows * (self.keys + 8) * 4 if self.pv_softmax else 0  # fp32 S, rows padded by 8 floats
            words = 0 if self.pv_softmax else 2 * self.rows * 4  # two slots of visibility words
            return qs + self.stages * self.keys * _ROW_BYTES + p_mx + s_slots + self.rows * 4 + words + 96  # + WsSeg
        return q + self.stages * self.keys * _ROW_BYTES + x + rs + pv + bars

    def defines(self) -> dict:
        """The NVRTC defines of this tile (``DL_ROWS``, ``DL_CSPLIT``, ``DL_KEYS``, ``DL_STAGES``, ``DL_QREG``,
        ``DL_EXCHANGE``, ``DL_PV_ROWS``, ``DL_BULK``, ``DL_WS``, ``DL_QK_CHAINS``, ``DL_WS_QREGS``, ``DL_WS_PVSM``,
        ``DL_WS_SKEW``, ``DL_WS_WGMMA``, ``DL_WS_WGMMA_PV``, ``DL_OVH_TILES``)."""
        return {"DL_ROWS": self.rows, "DL_CSPLIT": self.csplit, "DL_KEYS": self.keys, "DL_STAGES": self.stages,
                "DL_QREG": int(self.qreg), "DL_EXCHANGE": _EXCHANGES[self.exchange], "DL_PV_ROWS": self.pv_rows,
                "DL_BULK": int(self.bulk), "DL_WS": int(self.ws), "DL_QK_CHAINS": self.qk_chains,
                "DL_WS_QREGS": self.q_regs, "DL_WS_PVSM": int(self.pv_softmax), "DL_WS_SKEW": int(self.qk_skew),
                "DL_WS_WGMMA": int(self.wgmma), "DL_WS_WGMMA_PV": int(self.wgmma_pv),
                "DL_OVH_TILES": max(1, _OVH_KEYS // self.keys)}


# The sm_90 tile since 2026-12-01: QK warps and PV warps (research/verify_ws.md) over 3 stages of
# 32 keys, two QK accumulator sets, 24 of Q's latent k-steps in registers: 1.15-1.27x (geomean
# 1.205) the 64-row tile below on the H200 (bench_tiles, BENCHMARKS.md seventh session), 0 spills on sm_80 and sm_90.
# On sm_100 an earlier NVRTC 13 build spilled (44/48 B), so sm_100 keeps the tile below
# (_SPILLS_FROM). With NVRTC 13.5 the sm_100 3-stage ws tile builds without spills (0 B on sm_100 and
# sm_103) but is not enabled because it was never measured on an sm_100 GPU.
_WS32 = TileConfig(rows=64, csplit=1, keys=32, stages=3, ws=True, qk_chains=2, q_regs=24)
# sm_90's tile since 2026-12-01 (thirteenth session): the same with the QK warps' softmax a tile
# behind their mma (qk_skew; its math at k-step 4 and its stores at k-step 31 of the next tile's
# 36), 4 stages, one accumulator set, 20 of Q's latent k-steps in registers: 1.05-1.06x _WS32 on
# the H200 at 64-row shapes (1.09x at 9 heads x 200k x 256; 0.96-1.00x at the noisy 16 heads x 8
# x 32k x 256; bench_tiles, BENCHMARKS.md thirteenth session). 194,912 B: not on
# sm_80 (163 KB); spills on sm_100 and sm_103 (40 B of spill stores + 44 B of spill loads = 84 B
# per thread with NVRTC 13.5).
_WS32_SKEW = TileConfig(rows=64, csplit=1, keys=32, stages=4, ws=True, q_regs=20, qk_skew=True)
#: The first architecture number from which tile_configs skips a configuration: where its build
#: spills (_WS32_SKEW), or spilled with an earlier NVRTC and has not been measured since (_WS32).
_SPILLS_FROM = {_WS32: 100, _WS32_SKEW: 100}
# sm_90's tile: the same with the QK warps' S by wgmma (twenty-seventh session; sm_90a; K stages
# and the Q tile 128-byte swizzled: 1.05-1.13x _WS32_SKEW at 64-row shapes on the H200) and, since
# the twenty-eighth session, the PV warps' P V by wgmma too (1.13-1.22x the QK-only tile;
# BENCHMARKS.md). sm_90 only (tile_configs); 194,912 B, 0 spills (168 registers).
_WS32_SKEW_WG = replace(_WS32_SKEW, wgmma=True, wgmma_pv=True)

_CONFIGS = (
    _WS32_SKEW_WG,  # 194,912 B: sm_90 (S and P V by wgmma, sm_90a)
    _WS32_SKEW,  # 194,912 B: sm_90 before the twenty-seventh session (selectable)
    _WS32,  # 149,344 B: sm_80 (and selectable on sm_90)
    # 171,776 B: sm_100, sm_103 (sm_90's before the ws tile): the reduce-scatter S exchange (1.03-1.07x the all-reduce
    # tiles below on the H200) with P V over row pairs (each V fragment feeds two m16 tiles;
    # 1.02-1.05x the same tile without, BENCHMARKS.md 2026-12-01 sixth session)
    TileConfig(rows=64, csplit=2, keys=32, stages=2, exchange="reduce_scatter", pv_rows=32),
    TileConfig(rows=64, csplit=2, keys=32, stages=2, exchange="reduce_scatter"),  # 171,520 B: the same, 16 PV rows
    # 171,792 B: the same with K tiles by bulk copies: 0.92-0.97x (BENCHMARKS.md, sixth session),
    # selectable with tile=
    TileConfig(rows=64, csplit=2, keys=32, stages=2, exchange="reduce_scatter", pv_rows=32, bulk=True),
    TileConfig(rows=64, csplit=2, keys=32, stages=2),   # 165,888 B: selectable (sm_80's before the ws tile)
    TileConfig(rows=48, csplit=2, keys=32, stages=2),   # 143,104 B: the same (row counts like 9 heads x 16 tokens)
    # 147,328 B: sm_100 at row counts like 9 heads x 16 tokens (144 rows: 3 x 48 instead of
    # 3 x 64; 1.03-1.04x the 48-row all-reduce tile in bench_tiles, BENCHMARKS.md 2026-12-01)
    TileConfig(rows=48, csplit=2, keys=32, stages=2, exchange="reduce_scatter"),
    TileConfig(rows=64, csplit=2, keys=16, stages=2),   # 120,320 B: a part with less than 147,328 B (none of ours)
    # 151,008 B: sm_80, sm_87, sm_90 at row counts like 9 heads x 16 tokens (144 rows: 3 x 48
    # instead of 3 x 64): 3 QK warps, 8 PV warps of 48 rows x 64 value columns that also do the
    # mask and the softmax (pv_softmax; the QK warps only compute S). On the H200 at 144 rows: the
    # 48-row tile without pv_softmax 1.03x the 64-row tile, pv_softmax 1.02-1.05x on top of that
    # (1.043x geomean over eight shapes; BENCHMARKS.md, "Main loop, step 7"). After sm_100's tiles:
    # the 48-row ws tiles go with the 64-row ones (tile_configs keeps the first fit's key tile and split).
    replace(_WS32, rows=48, pv_softmax=True),
    # 89,184 B: sm_86, sm_89, sm_120, sm_121: QK warps and PV warps (research/verify_ws.md): 4 QK
    # warps with 24 of Q's 32 latent k-steps in registers and two accumulator sets, 8 PV warps of
    # 32 x 128 accumulators, 3 stages of 16 keys; 0 spills everywhere. On the H200 (its sm_90 build):
    # 1.02-1.29x (geomean 1.204) the 32-row tile below (bench_tiles, BENCHMARKS.md 2026-12-01 seventh session)
    TileConfig(rows=64, csplit=1, keys=16, stages=3, ws=True, qk_chains=2, q_regs=24),
    # 80,928 B: the same at row counts like 9 heads x 16 tokens (3 x 48 rows instead of 3 x 64; on
    # the H200 1.07-1.11x there; pv_softmax made this one 0.88-0.92x)
    TileConfig(rows=48, csplit=1, keys=16, stages=3, ws=True, qk_chains=2, q_regs=24),
    # 94,352 B: sm_120's tile before the ws tile (selectable with tile=): the reduce-scatter S
    # exchange (1.08-1.23x the all-reduce) with P V over the row pair (1.01-1.03x without) and K
    # tiles by bulk copies (0.97-1.11x cp.async, geomean 1.047), measured on the H200
    TileConfig(rows=32, csplit=4, keys=32, stages=2, qreg=True, exchange="reduce_scatter", pv_rows=32, bulk=True),
    # 94,336 B: the same with cp.async (sm_86, sm_89's tile before the ws tile)
    TileConfig(rows=32, csplit=4, keys=32, stages=2, qreg=True, exchange="reduce_scatter", pv_rows=32),
    TileConfig(rows=32, csplit=4, keys=32, stages=2, qreg=True, exchange="reduce_scatter"),  # 94,208 B: 16 PV rows
    TileConfig(rows=32, csplit=4, keys=32, stages=2, qreg=True),  # 91,136 B: the all-reduce sm_120 tile
)


def tile_configs(arch) -> list[TileConfig]:
    """Every tile configuration compiled for ``arch`` (what ``driverlevel compile`` and CI build), the default first.

    Those whose shared memory fits the architecture's per-block limit and that use the key
    tile and contraction split of the first one that fits; ``bulk`` ones only from sm_90 (below,
    such a tile would compile to the same ``cp.async`` kernel as its twin without ``bulk``); none
    from the architecture on where its build spills (``_SPILLS_FROM``: the 32-key ws tiles, with
    and without ``qk_skew``, from sm_100 on; with NVRTC 13.5 only the ``qk_skew`` one still
    spills there, the other is kept out because it was never measured on an sm_100 GPU).
    ``wgmma`` tiles only on sm_90 (they compile for sm_90a). :func:`tile_config` picks among those
    with the default's S exchange; the others stay selectable with ``tile=``.

    Raises
    ------
    ValueError
        If no configuration fits.
    """
    arch = normalize_arch(arch)
    limit = shared_limit(arch)
    has_bulk = arch_number(arch) >= 90  # cp.async.bulk and mbarrier tx counts: sm_90 and later
    fits = [c for c in _CONFIGS if c.shared_bytes <= limit and (has_bulk or not c.bulk)
            and _has_instructions(c, arch) and arch_number(arch) < _SPILLS_FROM.get(c, 1000)]
    if not fits:
        raise ValueError(f"no verify-attention tile fits {limit} B of shared memory ({arch})")
    best = fits[0]
    return [c for c in fits if c.keys == best.keys and c.csplit == best.csplit]


def _has_instructions(tile: TileConfig, arch: str) -> bool:
    """Whether ``arch`` has the instructions ``tile`` compiles to: a ``wgmma`` tile needs sm_90
    (sm_90a; neither sm_100 nor sm_120 has wgmma). The one place of that rule."""
    return not tile.wgmma or arch_number(arch) == 90


def _check_tile_fits(tile: TileConfig, arch: str) -> None:
    """Raise ``ValueError`` if ``tile`` needs more shared memory per block than ``arch`` has, or
    instructions it lacks (a ``wgmma`` tile off sm_90)."""
    tile.nvrtc_target(arch)
    limit = shared_limit(arch)
    if tile.shared_bytes > limit:
        raise ValueError(f"tile {tile.label} is too big for shared memory: it needs {tile.shared_bytes} B per block, "
                         f"more than the {limit} B {arch} allows")


#: The first NVRTC (major, minor) with which every default tile builds without spills on every
#: architecture (13.0-13.3 spill 64-68 B per thread in the 48-row tile of sm_80, sm_87 and sm_90; checked
#: with 13.0.88, 13.2.86, 13.3.33, 13.4.92 and 13.5.37). pyproject.toml requires it.
_NVRTC_SPILL_FREE = (13, 4)


def _old_nvrtc_hint(version: tuple, subject: str) -> str | None:
    """``"NVRTC 13.0 is in use; <subject> with NVRTC 13.4 or newer (pip install -U ...)"`` for an NVRTC
    ``version`` older than :data:`_NVRTC_SPILL_FREE` (the plans' spill warning and ``driverlevel
    compile``'s report), None for a newer one."""
    if tuple(version) >= _NVRTC_SPILL_FREE:
        return None
    a, b = _NVRTC_SPILL_FREE
    return (f"NVRTC {version[0]}.{version[1]} is in use; {subject} with NVRTC {a}.{b} or newer "
            f"(pip install -U 'nvidia-cuda-nvrtc>={a}.{b},<{a + 1}')")


def _warn_if_spills(cubin, tile: TileConfig) -> int:
    """Warn (``RuntimeWarning``) if ``cubin``'s ``verify_attn_partial`` spills registers; return its
    spill bytes per thread (stores + loads, 0 if none).

    :class:`VerifyAttention` calls it for every plan: a spilling tile runs, possibly slower than
    its shared-memory size suggests (the 48-row tile's 68 B cost nothing measurable on the H200
    at 9 heads x 200k x 16 tokens, BENCHMARKS.md, twenty-ninth session). The default tiles are
    checked spill-free on every architecture by the tests, with NVRTC 13.4 or newer; 13.0-13.3
    spill 64-68 B in the 48-row tile of sm_80, sm_87 and sm_90, and the warning then names the
    NVRTC in use. It points at the first line outside driverlevel (the caller's, also when a
    runner builds the plan), as the cubin cache's warning does.
    """
    res = cubin.resources.get("verify_attn_partial")
    if res is None or not res.spills:
        return 0
    why = _old_nvrtc_hint(nvrtc_version(), "the default tiles do not spill") or "the default tiles do not"
    warnings.warn(f"tile {tile.label} spills registers on {cubin.arch}: verify_attn_partial has "
                  f"{res.spill_store_bytes} B of spill stores and {res.spill_load_bytes} B of spill loads per "
                  f"thread ({res.registers} registers); it runs, possibly slower than a tile that does not spill "
                  f"({why})", RuntimeWarning, stacklevel=_stacklevel_outside_package())
    return res.spills


def tile_config(arch, rows_per_request: int | None = None) -> TileConfig:
    """The tile configuration for ``arch``.

    Among :func:`tile_configs` (the configurations whose shared memory fits the
    architecture's per-block limit and that use the key tile and contraction split of the
    first of ``_CONFIGS`` that fits: on sm_120 the 16-key ws tiles, although the older 32-key
    32-row tiles fit too and stay selectable with ``tile=``) with the default's S exchange,
    for ``rows_per_request`` (``max_q * num_heads``):

    - ws tiles (sm_80/86/87/89/90/120/121): the one that cuts it into the fewest row tiles,
      and among those the one that pads it the least, then the first in ``_CONFIGS`` order (on
      sm_90 the ``wgmma`` ``qk_skew`` tile, then the same without wgmma, then the 3-stage one)
      (144 rows: 3 x 48, not 3 x 64; 240 rows: 4 x 64, not 5 x 48: the 48-row ws tiles do 0.71-0.85x the 64-row ones' work per
      second on the H200, BENCHMARKS.md "Main loop, step 7");
    - the others (sm_100/103): the one that pads it the least, ties to the larger row tile
      (less L2 traffic), then the first in ``_CONFIGS`` order (which is how, on sm_100, P V
      over row pairs wins over 16 P V rows).

    Parameters
    ----------
    arch : str, int, tuple or Device
        The architecture (any form :func:`~driverlevel.runtime.normalize_arch` takes). One newer
        than driverlevel's table (:data:`~driverlevel.runtime.MAX_SHARED_PER_BLOCK`) is taken
        with the smallest per-block shared-memory limit, 101,376 B, as the runtime takes a GPU
        it does not know: not refused.
    rows_per_request : int or None
        ``max_q * num_heads``: the query rows of one request; None (or 0) for the architecture's
        first tile.

    Returns
    -------
    TileConfig
        The tile :class:`VerifyAttention` compiles and launches by default.

    Raises
    ------
    ValueError
        If no configuration fits, or ``rows_per_request`` is negative.
    TypeError
        If ``rows_per_request`` is not an int (or None).
    """
    if rows_per_request is not None:
        if is_bool(rows_per_request):  # (non_negative_int refuses bools too; this message names None)
            raise TypeError(f"rows_per_request must be an int or None, got {type(rows_per_request).__name__}")
        rows_per_request = non_negative_int("rows_per_request", rows_per_request)  # a Python int, for the products below
    fits = tile_configs(arch)
    fits = [c for c in fits if c.exchange == fits[0].exchange]  # the others: compiled, selectable with tile=
    if rows_per_request and fits[0].ws:
        return min(fits, key=lambda c: (math.ceil(rows_per_request / c.rows), math.ceil(rows_per_request / c.rows) * c.rows))
    if rows_per_request:
        return min(fits, key=lambda c: (math.ceil(rows_per_request / c.rows) * c.rows, -c.rows))
    return fits[0]


def compile_defines(arch, config: TileConfig | None = None) -> dict:
    """NVRTC defines of ``cu/verify_attention.cu``: the tile shape (``config``, default
    :func:`tile_config` of ``arch``), the device error word's field and code numbers
    (:func:`driverlevel._device_error.error_defines`), the ``VerifyAttnParams`` layout
    (checked by ``static_assert``), the shared-memory bytes the host launches with
    (``DL_SMEM_BYTES``, checked against the kernel's own layout) and the scheduler's limits
    :data:`MAX_BATCH`, :data:`MAX_PARTS`.

    Raises
    ------
    TypeError
        ``config`` is neither None nor a :class:`TileConfig`; ``arch`` is not an architecture
        (:func:`~driverlevel.runtime.normalize_arch`).
    ValueError
        ``arch`` is malformed or older than sm_80 (checked whether or not ``config`` is given).
    """
    if config is not None and not isinstance(config, TileConfig):
        raise TypeError(f"config must be a TileConfig or None (the default: tile_config(arch)), "
                        f"got {type(config).__name__}")
    arch = normalize_arch(arch)
    config = tile_config(arch) if config is None else config
    defines = dict(config.defines())
    defines["DL_SMEM_BYTES"] = config.shared_bytes  # the kernel checks its layout against it
    defines.update(error_defines())
    defines.update(struct_layout_defines(_Params))
    defines.update(DL_VA_MAX_BATCH=MAX_BATCH, DL_VA_MAX_PARTS=MAX_PARTS, DL_VA_REQUEST_BYTES=REQUEST_RECORD_BYTES,
                   DL_VA_CUT_BYTES=CUT_RECORD_BYTES, DL_VA_ENTRY_BYTES=ENTRY_RECORD_BYTES)
    return defines


def compile_variants(arch) -> list[CompileVariant]:
    """Every way :class:`VerifyAttention` compiles ``verify_attention.cu`` on ``arch``: one
    variant per tile configuration of :func:`tile_configs`, with ``verify_attn_partial``'s
    dynamic shared memory (the scheduler and the combine use static shared memory only) and,
    for sm_90's wgmma tile, the target ``"sm_90a"``."""
    return [compile_variant(arch, cfg) for cfg in tile_configs(arch)]


def compile_variant(arch, config: TileConfig) -> CompileVariant:
    """How :class:`VerifyAttention` compiles ``verify_attention.cu`` for ``config`` on ``arch``: its
    defines, ``verify_attn_partial``'s dynamic shared memory and, where it is not ``arch`` itself,
    its NVRTC target (``"sm_90a"`` for a wgmma tile). ``ValueError`` for a wgmma tile off sm_90."""
    target = config.nvrtc_target(arch)
    return CompileVariant(compile_defines(arch, config), {"verify_attn_partial": config.shared_bytes}, config.label,
                          target=target if target != normalize_arch(arch) else "")


@dataclass
class VerifyMetadata:
    """SGLang-style metadata of one verify call, device arrays in their native dtypes.

    Every index array may be int32 or int64 (read in place, no conversion), whatever dtype
    the list below gives: the usual ones in SGLang, whose backends and paths differ (its
    FlashInfer backends and the Triton backend's eager verify path use int32 ``qo_indptr``,
    the Triton backend's CUDA-graph buffers int64 in recent versions, int32 in older ones). A
    bitmask ``custom_mask`` may be int32.

    The prefix convention is SGLang's **Triton backend**'s: ``kv_indptr`` / ``kv_indices`` cover
    the committed prefix only, and the draft tokens' own K/V is found through
    ``out_cache_loc``. SGLang's FlashInfer path (``EagleVerifyInput.generate_attn_arg_prefill``)
    appends the draft slots to each request's ``kv_indices`` range: passed as is, every draft
    token would also be seen as prefix, unmasked: build ``kv_indptr`` from the prefix lengths
    and ``kv_indices`` from each request's first ``prefix_len`` entries (what the Triton
    backend's metadata already is) before calling. Padded requests: driverlevel's
    convention is 0 draft tokens (``qo_indptr[b + 1] == qo_indptr[b]``); SGLang's CUDA-graph
    padding gives them ``num_draft_tokens`` rows on a stale mask, which this plan computes too
    (their outputs are garbage for garbage in, never out of bounds).

    A plain container: nothing is checked when it is built. :meth:`VerifyAttention.run`
    checks each array's device, dtype and shape before any launch (``TypeError`` /
    ``ValueError`` naming the field), and the kernels check the values (lengths, slot ids,
    offsets) on the GPU, reported by :meth:`VerifyAttention.check_errors`.
    (:class:`driverlevel.reference.trees.VerifyMetadata` is the host-side metadata of the
    reference, a different class.)

    Attributes
    ----------
    qo_indptr : int32 or int64 ``[bs + 1]``
        Draft-token offsets; request ``b`` owns q rows ``qo_indptr[b] : qo_indptr[b+1]``.
    kv_indptr : int32 ``[bs + 1]``
        Offsets into ``kv_indices`` of each request's committed prefix.
    kv_indices : int64 ``[>= kv_indptr[bs]]``
        Cache slot of every prefix token.
    out_cache_loc : int64 ``[total_q]``
        Cache slot holding each draft token's own K/V (already written).
    custom_mask : uint8/bool/int8 (FULL, QLEN_ONLY) flat, uint32 ``[total_q, mask_words]`` (BITMASK), or None (CAUSAL)
        (A mapping may name it ``mask`` instead.)
    mask_indptr : int64 ``[bs + 1]`` or None
        Offsets into ``custom_mask`` (FULL, QLEN_ONLY only). With BITMASK and CAUSAL it is ignored,
        neither read nor checked (SGLang's metadata may carry one whatever the mask).
    """

    qo_indptr: object
    kv_indptr: object
    kv_indices: object
    out_cache_loc: object
    custom_mask: object = None
    mask_indptr: object = None


_METADATA_FIELDS = "qo_indptr, kv_indptr, kv_indices, out_cache_loc, custom_mask, mask_indptr"
_REQUIRED_METADATA = ("qo_indptr", "kv_indptr", "kv_indices", "out_cache_loc")


def _need_aligned(name: str, a, alignment: int) -> None:
    """Raise ``ValueError`` unless ``a``'s device address is a multiple of ``alignment`` bytes."""
    if a.ptr % alignment:
        raise ValueError(f"{name} must start on a {alignment}-byte aligned device address (the kernels' "
                         f"loads and stores need it), got 0x{a.ptr:x}: pass a view whose first element is "
                         f"{alignment}-byte aligned (e.g. an unsliced array)")


def _metadata_getter(metadata):
    """The field getter of a verify call's ``metadata``: a mapping's ``get``, or the attributes of a
    :class:`VerifyMetadata` (or of an object with its fields, e.g. ``qo_indptr``).

    Raises
    ------
    TypeError
        ``metadata`` is neither (None, a list...), naming ``metadata`` rather than its first field.
    """
    if isinstance(metadata, Mapping):
        def get(k):  # (a field every call needs, missing: the message lists the keys, e.g. a misspelt one)
            if k in _REQUIRED_METADATA and k not in metadata:
                raise TypeError(f"{k} is required (metadata's keys: {', '.join(map(str, metadata)) or 'none'})")
            return metadata.get(k)
        return get
    if isinstance(metadata, VerifyMetadata) or hasattr(metadata, "qo_indptr"):
        return lambda k: getattr(metadata, k, None)
    raise TypeError(f"metadata must be a VerifyMetadata or a mapping of its fields ({_METADATA_FIELDS}), "
                    f"got {type(metadata).__name__}")


#: The ``sm_scale`` a plan takes: ``sm_scale * log2(e)``, the float32 the kernels get, must be a
#: normal number (0 would turn the qk_skew tile's -inf start into NaN, inf every score into +-inf).
_SM_SCALE_MIN = float(np.finfo(np.float32).tiny) / math.log2(math.e)
_SM_SCALE_MAX = float(np.finfo(np.float32).max) / math.log2(math.e)


def _check_sm_scale(sm_scale) -> float:
    """``sm_scale`` as a float; ``TypeError`` for anything but a real number (a bool is not one),
    ``ValueError`` outside about 8.15e-39 .. 2.36e38 (also for an int too large for a float). No
    device work: :class:`VerifyAttention` checks it before it touches the device."""
    if is_bool(sm_scale) or not isinstance(sm_scale, numbers.Real):
        raise TypeError(f"sm_scale must be a real number (float or int), got {type(sm_scale).__name__}: {sm_scale!r}")
    rng = f"sm_scale about {_SM_SCALE_MIN:.3g} to {_SM_SCALE_MAX:.3g}"
    try:
        value = float(sm_scale)
    except OverflowError:  # an int (or Fraction) beyond the float range
        raise ValueError(f"sm_scale must be a positive finite float ({rng}), got {type(sm_scale).__name__} "
                         f"too large for a float") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"sm_scale must be a positive finite float ({rng}), got {sm_scale!r}")
    # the kernels take sm_scale * log2(e) as a float32: it must be a normal number
    if not float(np.finfo(np.float32).tiny) <= value * math.log2(math.e) <= float(np.finfo(np.float32).max):
        raise ValueError(f"sm_scale * log2(e) must be a normal float32 ({rng}), got {value!r}")
    return value


class VerifyAttention:
    """A verify-attention plan: fixed maxima, persistent grid and workspace; capture-safe :meth:`run`.

    Parameters
    ----------
    device : Device or int
    num_heads : int
        Query heads (any number >= 1; all share the one latent KV head).
    max_batch : int
        Largest number of requests in one call (at most 1024). A graph captured with
        ``bs`` requests serves any step whose idle requests have 0 draft tokens.
    max_q : int
        Largest number of draft tokens of one request (the tree size, root included).
        A request with more is reported through the error word (:meth:`check_errors`)
        and its rows are not computed.
    num_splits : int, optional
        Cap on how many pieces the scheduler may cut one (request, row tile) pair's keys
        into (about). Default None: no cap; the scheduler balances the work over the
        whole grid on every replay.
    sm_scale : float
        Softmax scale (default ``1/sqrt(192)``: DeepSeek's ``qk_head_dim ** -0.5`` without
        YaRN; pass the model's own: :func:`mla_softmax_scale` of its config, or SGLang's
        ``RadixAttention.scaling``, which the YaRN checkpoints (DeepSeek-V3, Kimi K2) multiply
        by ``mscale ** 2``). The kernels take ``sm_scale *
        log2(e)`` as a float32, which must be a normal number: sm_scale about 8.15e-39 to 2.36e38
        (``ValueError`` otherwise, an int too large for a float too; ``TypeError`` for anything
        but a real number, a bool included).
    mask_format : {"bitmask", "full", "qlen_only", "causal"}
        How draft-to-draft visibility is given (a draft token always sees its request's whole
        prefix): ``"full"`` (SGLang's FULL: per request a uint8 ``q_len x (prefix_len + q_len)``
        block of ``custom_mask`` at ``mask_indptr[b]``), ``"qlen_only"`` (SGLang's QLEN_ONLY: the
        same without the prefix columns, ``q_len x q_len``), ``"bitmask"`` (uint32 ``[total_q,
        mask_words]``: bit ``j`` of word ``w`` of row ``t`` says that draft token ``32 w + j`` is
        visible to row ``t``) or ``"causal"`` (a chain: token ``i`` sees ``0 .. i``; no mask).
    qk_dim, v_dim : int
        Must be 576 and 512 (MLA absorbed); other values raise ``ValueError``, non-integers
        (576.0, "576", a bool) ``TypeError``.
    pool : WorkspacePool, optional
        Pool to carve the workspace from (a private one is allocated otherwise), on
        ``device``: a fresh pool of the default 256-byte alignment needs :attr:`pool_bytes`
        (one already carved from, up to 255 B more for the first carve-out's alignment).
    name : str
        Prefix of the carve-out names in ``pool``.
    arch : str, optional
        Compile for this architecture instead of the device's (must match to run).
    tile : TileConfig, optional
        Override the tile configuration chosen by :func:`tile_config` (e.g. to run
        the sm_120 configuration on a GPU with more shared memory). A tile whose
        ``verify_attn_partial`` spills registers on the plan's architecture runs, with a
        ``RuntimeWarning`` naming the tile, the architecture and the spill bytes (also for
        the default tile, which spills only with an NVRTC older than 13.4: the warning then
        names the NVRTC in use).
    num_parts : int, optional
        CTAs of the persistent grid (at most 1024). Default: the device's SM count
        times the CTAs of the partial kernel that fit one SM, capped at 1024.
    pdl : bool, optional
        Programmatic dependent launch of the partial and combine kernels (CUDA Programming
        Guide, "Programmatic Dependent Launch and Synchronization"). None (default): on where
        the plan's architecture is sm_90 or newer; False: off; True: on (``ValueError`` below
        sm_90; ``TypeError`` for anything but None/True/False). On, those two launches are
        queued with ``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION``: each may start
        while the kernel before it runs, instead of paying a full launch gap. The partial
        kernel reads none of the scheduler's tables (every CTA computes its own cuts with the
        scheduler's code), so it runs alongside the scheduler and waits for it
        (``griddepcontrol.wait``) only before it exits; the combine waits for the partial
        kernel first thing in every CTA.
        The scheduler's launch stays ordinary, so :meth:`run` starts after whatever came
        before it on the stream and ends only when all three kernels have. The results do not
        depend on it (GPU tests compare both bitwise, eager and replayed).

    Accuracy
    --------
    S and P V accumulate in fp32 (``mma.sync`` bf16 x bf16 -> fp32), P is rounded to bf16
    for P V, and a split pair's pieces are stored in bf16 (each normalised by its own sum,
    merged by their fp32 LSEs) before the bf16 output. Against a float64 reference on random
    bf16 inputs the output's relative (Frobenius) error is about 1.7e-3 to 2.2e-3 on the
    H200 (BENCHMARKS.md; SGLang's Triton MLA kernels: ~1.8e-3), the LSE within 1e-3.

    Schedule (per replay, on the GPU)
    ---------------------------------
    ``verify_attn_schedule`` (1 CTA) checks the metadata and cuts the step's work,
    the (request, row tile, key tile) units with a fixed cost of ``192`` keys per
    (request, row tile) pair, into ``num_parts`` about-equal parts (a uniform batch:
    each pair into equal pieces, one per part, when that costs at most half a pair's
    fixed cost more), and lists the split pairs for the combine;
    ``verify_attn_partial`` runs one CTA per part, which computes its part's two cuts
    itself with the same code; ``verify_attn_combine`` merges,
    by their LSE, exactly the partial results this replay wrote. Garbage left in the
    workspace by earlier steps is never read.

    Workspace
    ---------
    ``workspace_bytes = 2 * num_parts * tile_rows * (512 * 2 + 4)`` (bf16 partial
    outputs, fp32 LSE) plus the scheduler's tables ``40 * max_batch + 64 * num_parts +
    16``: bounded by the grid, whatever the batch, draft count or head count. On an
    H200 (132 parts, 64-row tile): 16.6 MiB (derived in the docstring of
    ``driverlevel/_workspace_formula.py``).

    One stream
    ----------
    The workspace belongs to one stream of work at a time: :meth:`run` binds the
    plan to the stream of its first call and raises ``ValueError`` on another.
    Graphs captured from one plan must not be replayed concurrently on two
    streams; build one plan per stream.

    Bad metadata
    ------------
    Inside a graph no host check runs. The kernels check what they read (indptr
    monotonic, lengths within ``max_q`` and the buffers, slot ids within the cache,
    mask offsets consistent with the lengths), never read or write out of bounds,
    give a bad request zeros (LSE -inf) or leave its unknown rows alone, and record
    the first failure in a device error word: :meth:`check_errors` raises
    :class:`~driverlevel.MetadataError` naming the request and the field.

    Raises
    ------
    ValueError, TypeError
        For out-of-range or mistyped parameters (checked before the device is touched, so
        this works without a GPU too). Once the device is opened, before any compile or
        carve: a ``pool`` on another device than ``device`` or a closed one, and, when ``arch`` is not
        given, a ``tile`` that does not fit the device's architecture (its shared memory, or a
        wgmma tile off sm_90).
    DriverUnavailableError, CudaError
        If there is no usable device ``device``.
    NvrtcError, CudaError
        If the kernels cannot be compiled or loaded.
    PoolExhaustedError
        ``pool`` has too little room left for the plan's workspace (:attr:`pool_bytes`): the
        message gives the bytes needed and the bytes free, and nothing is carved.

    Example
    -------
    >>> plan = VerifyAttention(dev, 9, max_batch=8, max_q=256)   # doctest: +SKIP
    >>> plan.run(stream, q, kv_cache, meta, out, lse)            # doctest: +SKIP
    >>> plan.check_errors(stream)                                # doctest: +SKIP
    """

    def __init__(self, device, num_heads: int, *, max_batch: int, max_q: int, num_splits: int | None = None,
                 sm_scale: float = DEFAULT_SM_SCALE, mask_format="bitmask", qk_dim: int = QK_DIM,
                 v_dim: int = V_DIM, pool: WorkspacePool | None = None, name: str = "verify_attention",
                 arch=None, tile: TileConfig | None = None, num_parts: int | None = None, pdl: bool | None = None):
        # the arguments first (no driver call), then the device; as Python ints before any product
        # (numpy ints would wrap: np.int32(65536) * np.int32(65536) is 0)
        num_heads = positive_int("num_heads", num_heads)
        max_batch = positive_int("max_batch", max_batch)
        max_q = positive_int("max_q", max_q)
        if num_splits is not None:
            num_splits = positive_int("num_splits", num_splits)
        if num_parts is not None:
            num_parts = positive_int("num_parts", num_parts)
        if num_splits is not None and num_splits > MAX_SPLITS:
            raise ValueError(f"num_splits must be <= {MAX_SPLITS}, got {num_splits}")
        if max_batch > MAX_BATCH:
            raise ValueError(f"max_batch must be <= {MAX_BATCH}, got {max_batch}")
        if num_parts is not None and num_parts > MAX_PARTS:
            raise ValueError(f"num_parts must be <= {MAX_PARTS}, got {num_parts}")
        qk_dim, v_dim = positive_int("qk_dim", qk_dim), positive_int("v_dim", v_dim)  # (576.0, "576": TypeError)
        if qk_dim != QK_DIM or v_dim != V_DIM:
            raise ValueError(f"only MLA absorbed heads are supported: qk_dim=576, v_dim=512 (got {qk_dim}, {v_dim})")
        sm_scale = _check_sm_scale(sm_scale)
        if max_q * num_heads >= 2**31:
            raise ValueError(f"max_q * num_heads must be < 2**31, got {max_q} * {num_heads}")
        if tile is not None and not isinstance(tile, TileConfig):
            raise TypeError(f"tile must be a TileConfig or None, got {type(tile).__name__}")
        mask_format = parse_mask_format(mask_format)
        known_arch = check_plan_args(pdl=pdl, pool=pool, name=name, arch=arch)  # before the device
        if known_arch is not None and tile is not None:
            _check_tile_fits(tile, known_arch)
        self.device = _check_device_arg(device)
        self._what = f"VerifyAttention {name!r}"  # (how errors name this plan)
        check_pool_device(pool, self.device, self._what)
        self.num_heads = int(num_heads)
        self.max_batch = int(max_batch)
        self.max_q = int(max_q)
        self._num_splits = int(num_splits) if num_splits is not None else None
        self._sm_scale = float(sm_scale)
        self.mask_format = mask_format
        self.mask_words = bitmask_words(self.max_q)
        self.arch = normalize_arch(arch or self.device.arch)
        self.pdl = resolve_pdl(pdl, self.arch)
        self.config = tile if tile is not None else tile_config(self.arch, self.max_q * self.num_heads)
        _check_tile_fits(self.config, self.arch)

        variant = compile_variant(self.arch, self.config)  # (the variant the CPU tests compile)
        self.cubin = compile_file("verify_attention.cu", variant.target or self.arch, variant.defines)
        _warn_if_spills(self.cubin, self.config)  # (warning at the caller's line)
        self._module = load_module(self.device, self.cubin)
        self._schedule = self._module.kernel("verify_attn_schedule")
        self._partial = self._module.kernel("verify_attn_partial")
        self._combine = self._module.kernel("verify_attn_combine")
        self._partial.reserve_shared(self.config.shared_bytes)  # now, never during a capture
        if num_parts is None:
            per_sm = self._partial.max_active_blocks_per_sm(self.config.threads, self.config.shared_bytes)
            num_parts = self.device.sm_count * max(1, per_sm)
        self.num_parts = min(int(num_parts), MAX_PARTS)
        self.grid_partial = (self.num_parts, 1, 1)
        # the combine is persistent (its CTAs loop over the scheduler's work items): one wave
        per_sm = self._combine.max_active_blocks_per_sm(_COMBINE_THREADS, 0)
        self.grid_combine = (self.device.sm_count * max(1, min(per_sm, _COMBINE_CTAS_PER_SM)), 1, 1)

        carves = self._carve_specs(self.num_parts, self.config.rows, self.max_batch)
        if pool is None:
            pool = WorkspacePool.allocate(self.device, self.pool_bytes, label=name)
        else:  # the caller's: too small is said before anything is carved, with both sizes
            pool._require_room([(shape, dt) for _, shape, dt in carves], f"VerifyAttention {name!r}")
        self.pool = pool
        for cname, shape, dt in carves:
            setattr(self, cname, pool.carve(f"{name}.{cname}", shape, dt))
        self.error_word = DeviceErrorWord(self.device, label=f"VerifyAttention({name})")
        self._stream_handle = None
        self._cached_key = None
        self._launches = None

    # -- sizes --------------------------------------------------------------------------
    @staticmethod
    def _carve_specs(num_parts: int, tile_rows: int, max_batch: int) -> list:
        """The workspace's carve-outs in carving order: ``(name, shape, dtype)``."""
        slots = 2 * num_parts
        return [("o_part", (slots, tile_rows, V_DIM), np.uint16),  # bf16 bit patterns
                ("lse_part", (slots, tile_rows), np.float32),
                # the scheduler's tables, int32 views of VaRequest / VaCut / VaEntry records
                ("sched_reqs", (max_batch, REQUEST_RECORD_BYTES // 4), np.int32),
                ("sched_cuts", (num_parts + 1, CUT_RECORD_BYTES // 4), np.int32),
                ("sched_entries", (num_parts, ENTRY_RECORD_BYTES // 4), np.int32)]

    @property
    def workspace_bytes(self) -> int:
        """Bytes of split-KV workspace (partials + scheduler tables), by the published formula.

        The payload only: carved from a pool, each of the five carve-outs starts on a 256-byte
        boundary, so a pool needs :attr:`pool_bytes` (at most 5 x 256 B more).
        """
        return self.workspace_bytes_for(self.num_parts, self.config.rows, self.max_batch)

    @property
    def sm_scale(self) -> float:
        """The softmax scale (read-only: the packed launches hold it; build another plan for another)."""
        return self._sm_scale

    @property
    def num_splits(self) -> int | None:
        """The cap on the pieces of one (request, row tile) pair, or None (read-only, as ``sm_scale``)."""
        return self._num_splits

    @property
    def pool_bytes(self) -> int:
        """Bytes a fresh :class:`~driverlevel.WorkspacePool` of the default (256-byte) alignment
        needs for this plan's workspace.

        :attr:`workspace_bytes` with each carve-out aligned as :meth:`WorkspacePool.carve
        <driverlevel.WorkspacePool.carve>` places it (``WorkspacePool.required_bytes`` of the
        carve-outs), rounded up to the pool's 256-byte alignment. Plans sharing one pool need
        the sum of their ``pool_bytes``.
        """
        specs = self._carve_specs(self.num_parts, self.config.rows, self.max_batch)
        return WorkspacePool.required_bytes([(shape, dt) for _, shape, dt in specs])

    @staticmethod
    def workspace_bytes_for(num_parts: int, tile_rows: int, max_batch: int) -> int:
        """:attr:`workspace_bytes` of a plan with this grid and tile, without building one.

        ``2 * num_parts * tile_rows * (512 * 2 + 4) + 40 * max_batch + 64 * num_parts + 16`` bytes: two
        slots per part of ``tile_rows`` rows of 512 bf16 partial outputs and one fp32 LSE each
        (:func:`~driverlevel._workspace_formula.partial_workspace_bytes`), and the scheduler's tables
        (:func:`~driverlevel._workspace_formula.scheduler_bytes`). A pool needs a little more for
        the carve-outs' alignment: :attr:`pool_bytes`.

        Raises ``ValueError`` for sizes no plan has: ``num_parts`` above :data:`MAX_PARTS`,
        ``max_batch`` above :data:`MAX_BATCH`, ``tile_rows`` not a multiple of 16 (and
        ``TypeError`` / ``ValueError`` for non-positive or non-int ones).
        """
        num_parts = positive_int("num_parts", num_parts)
        tile_rows = positive_int("tile_rows", tile_rows)
        max_batch = positive_int("max_batch", max_batch)
        if num_parts > MAX_PARTS or max_batch > MAX_BATCH or tile_rows % 16:
            raise ValueError(f"no plan has num_parts={num_parts} (<= {MAX_PARTS}), max_batch={max_batch} "
                             f"(<= {MAX_BATCH}), tile_rows={tile_rows} (a multiple of 16)")
        return partial_workspace_bytes(num_parts, tile_rows, V_DIM) + scheduler_bytes(max_batch, num_parts)

    # -- errors -------------------------------------------------------------------------
    def check_errors(self, stream=None) -> None:
        """Raise :class:`~driverlevel.MetadataError` if a kernel found bad metadata; clear the word.

        Parameters
        ----------
        stream : Stream, optional
            Synchronised first (call between steps, not during a capture). ``None``: not
            synchronised (the caller has made sure the work queued before is complete).

        Raises
        ------
        TypeError
            ``stream`` is neither None nor a driverlevel :class:`~driverlevel.Stream`
            (an :class:`~driverlevel.Event` is refused, not synchronised in its place).
        ValueError
            ``stream`` belongs to another device than the plan's.
        CaptureError
            ``stream`` given during a capture (the synchronize is not capture-safe).
        MetadataError
            Naming the first bad request, the field (``qo_indptr``, ``kv_indptr``,
            ``kv_indices``, ``out_cache_loc``, ``mask_indptr``) and what was wrong.
        """
        self.error_word.check(stream)

    # -- validation ---------------------------------------------------------------------
    def _validate(self, q, kv_cache, metadata, out, lse):
        dev = self.device
        H = self.num_heads
        q = _arr("q", q, dev)
        _need_dtype("q", q, "bfloat16", "uint16")
        if q.ndim != 3 or q.shape[1:] != (H, QK_DIM):
            raise ValueError(f"q must have shape [total_q, {H}, {QK_DIM}], got {q.shape}")
        total_q = q.shape[0]
        if total_q < 1:
            raise ValueError("q has no rows (total_q = 0)")
        if total_q > self.max_batch * self.max_q:
            raise ValueError(f"q has {total_q} draft tokens, more than max_batch*max_q = {self.max_batch * self.max_q}")
        kv = _arr("kv_cache", kv_cache, dev)
        _need_dtype("kv_cache", kv, "bfloat16", "uint16")
        if kv.ndim == 3 and kv.shape[1] == 1:
            kv = kv.reshape(kv.shape[0], kv.shape[2])
        if kv.ndim != 2 or kv.shape[1] != QK_DIM:
            raise ValueError(f"kv_cache must have shape [num_slots, {QK_DIM}] (or [num_slots, 1, {QK_DIM}]), got {kv.shape}")
        if kv.shape[0] > 2**31 - 1:  # the ws tiles keep slot ids as ints
            raise ValueError(f"kv_cache has {kv.shape[0]} slots; at most 2**31 - 1 are supported")
        get = _metadata_getter(metadata)
        qo = _arr("qo_indptr", get("qo_indptr"), dev)
        _need_dtype("qo_indptr", qo, "int64", "int32")
        if qo.ndim != 1 or not 2 <= qo.shape[0] <= self.max_batch + 1:
            raise ValueError(f"qo_indptr must have shape [bs + 1] with 1 <= bs <= max_batch={self.max_batch}, got {qo.shape}")
        bs = qo.shape[0] - 1
        kvp = _arr("kv_indptr", get("kv_indptr"), dev)
        _need_dtype("kv_indptr", kvp, "int32", "int64")
        if kvp.shape != qo.shape:
            raise ValueError(f"kv_indptr must have the same length as qo_indptr ({bs + 1}), got {kvp.shape}")
        kvi = _arr("kv_indices", get("kv_indices"), dev)
        _need_dtype("kv_indices", kvi, "int64", "int32")
        if kvi.ndim != 1:
            raise ValueError(f"kv_indices must be 1-D, got {kvi.shape}")
        loc = _arr("out_cache_loc", get("out_cache_loc"), dev)
        _need_dtype("out_cache_loc", loc, "int64", "int32")
        _need_shape("out_cache_loc", loc, (total_q,))
        fmt = self.mask_format
        mask = get("custom_mask")
        if mask is None:
            mask = get("mask")
        mask_indptr = get("mask_indptr")
        mask_a = mip = None
        if fmt is MaskFormat.CAUSAL:
            if mask is not None:
                raise ValueError("this plan's mask_format is 'causal': pass no custom_mask")
        elif fmt is MaskFormat.BITMASK:
            mask_a = _arr("custom_mask", mask, dev)
            _need_dtype("custom_mask", mask_a, "uint32", "int32")
            _need_shape("custom_mask", mask_a, (total_q, self.mask_words))
        else:
            mask_a = _arr("custom_mask", mask, dev)
            _need_dtype("custom_mask", mask_a, "uint8", "bool", "int8")
            if mask_a.ndim != 1:
                raise ValueError(f"custom_mask ({fmt.value}) must be 1-D, got {mask_a.shape}")
            mip = _arr("mask_indptr", mask_indptr, dev)
            _need_dtype("mask_indptr", mip, "int64", "int32")
            if mip.shape != qo.shape:
                raise ValueError(f"mask_indptr must have the same length as qo_indptr ({bs + 1}), got {mip.shape}")
        o = _arr("out", out, dev, writable=True)
        _need_dtype("out", o, "bfloat16", "uint16")
        _need_shape("out", o, (total_q, H, V_DIM))
        lse_a = None
        if lse is not None:
            lse_a = _arr("lse", lse, dev, writable=True)
            _need_dtype("lse", lse_a, "float32")
            _need_shape("lse", lse_a, (total_q, H))
        # The kernels copy q and kv_cache rows with 16-byte cp.async and store out in 8-byte words:
        # a base off these alignments would fault on the GPU (a sticky "misaligned address" that
        # ends the process's CUDA context). Every array is aligned to its element size (_arr).
        for name, a, need in (("q", q, 16), ("kv_cache", kv, 16), ("out", o, 8)):
            _need_aligned(name, a, need)
        return q, kv, qo, kvp, kvi, loc, mask_a, mip, o, lse_a, bs

    def _bind_stream(self, stream) -> None:
        handle = int(_stream_arg("stream", stream, self.device).handle)
        if self._stream_handle is None:
            self._stream_handle = handle
        elif handle != self._stream_handle:
            raise ValueError("this VerifyAttention plan runs on one stream (its split workspace is not shared "
                             "between concurrent streams): build one plan per stream")

    # -- run ------------------------------------------------------------------------------
    def run(self, stream, q, kv_cache, metadata, out, lse=None) -> None:
        """Compute the verify attention of one step on ``stream`` (capture-safe).

        Queues three kernels: the scheduler, the partial attention on the persistent
        grid, and the combine of split pairs.

        Parameters
        ----------
        stream : Stream
            The plan's stream (the first call binds it).
        q : bf16 ``[total_q, num_heads, 576]``
            Absorbed queries; row ``(t, h)``. DeviceArray or any CAI/DLPack array
            (bf16, or uint16 holding bf16 bit patterns).
        kv_cache : bf16 ``[num_slots, 576]`` (or SGLang's ``[num_slots, 1, 576]``)
            The paged latent cache (page size 1); V is its first 512 columns.
        metadata : VerifyMetadata or dict (any mapping)
            ``qo_indptr``, ``kv_indptr``, ``kv_indices``, ``out_cache_loc``,
            ``custom_mask``, ``mask_indptr`` (see :class:`VerifyMetadata`); each index
            array int32 or int64, read in place. ``bs = len(qo_indptr) - 1 <= max_batch``.
            Lengths and ids are read on the GPU and checked there (:meth:`check_errors`).
        out : bf16 ``[total_q, num_heads, 512]``
        lse : float32 ``[total_q, num_heads]``, optional
            Natural-log log-sum-exp of each row's scaled scores (``sm_scale * q . k``), row
            ``(t, h)``: the base and layout of SGLang's Triton ``merge_state`` and
            ``sgl_kernel.merge_state_v2``. FlashInfer's LSE is base 2 (multiply ours by
            ``log2(e)``); some kernels take ``[num_heads, total_q]`` (transpose).

        Raises
        ------
        TypeError, ValueError
            Before any launch, naming the offending argument (``TypeError`` for a ``stream``
            that is not a driverlevel Stream, or a ``metadata`` that is neither a
            VerifyMetadata nor a mapping); ``ValueError`` also for a second stream or a stream
            of another device, for an array on another device (a foreign one included), and for a
            read-only ``out`` or ``lse`` (``"out is read-only, but the launch writes it"``); and for
            an array whose base address the kernels cannot use: ``q`` and ``kv_cache`` must be
            16-byte aligned, ``out`` 8-byte aligned, every other array aligned to its element size;
            ``ValueError`` also for a closed ``stream`` or array memory, and, naming the plan,
            when its workspace pool was closed.
        """
        q, kv, qo, kvp, kvi, loc, mask_a, mip, o, lse_a, bs = self._validate(q, kv_cache, metadata, out, lse)
        self._bind_stream(stream)
        check_pool_open(self.pool, self._what)
        idx64 = 0
        for nm, a in (("qo_indptr", qo), ("kv_indptr", kvp), ("kv_indices", kvi), ("out_cache_loc", loc),
                      ("mask_indptr", mip)):
            if a is not None and a.dtype.itemsize == 8:
                idx64 |= _INDEX_BITS[nm]
        key = (q.ptr, q.shape[0], kv.ptr, kv.shape[0], qo.ptr, kvp.ptr, kvi.ptr, kvi.shape[0], loc.ptr,
               mask_a.ptr if mask_a is not None else 0, mask_a.shape[0] if mask_a is not None else 0,
               mip.ptr if mip is not None else 0, o.ptr, lse_a.ptr if lse_a is not None else 0, bs, idx64)
        if key != self._cached_key:
            p = _Params()
            p.q, p.kv_cache, p.qo_indptr, p.kv_indptr = q.ptr, kv.ptr, qo.ptr, kvp.ptr
            p.kv_indices, p.out_cache_loc = kvi.ptr, loc.ptr
            p.mask = mask_a.ptr if mask_a is not None else 0
            p.mask_indptr = mip.ptr if mip is not None else 0
            p.out = o.ptr
            p.lse = lse_a.ptr if lse_a is not None else 0
            p.o_part, p.lse_part = self.o_part.ptr, self.lse_part.ptr
            p.reqs, p.cuts, p.entries = self.sched_reqs.ptr, self.sched_cuts.ptr, self.sched_entries.ptr
            p.err = self.error_word.device_ptr
            p.q_rows = q.shape[0]
            p.kv_indices_len = kvi.shape[0]
            p.num_slots = kv.shape[0]
            p.mask_len = mask_a.shape[0] if (mask_a is not None and mip is not None) else 0
            p.scale_log2 = self.sm_scale * math.log2(math.e)
            p.num_heads, p.batch_size, p.num_parts = self.num_heads, bs, self.num_parts
            p.max_q = self.max_q
            p.split_cap = self.num_splits or 0
            p.mask_mode = _MASK_MODE[self.mask_format]
            p.mask_words = self.mask_words
            p.idx64 = idx64
            # The launches (and so any graph that records them) keep the caller's arrays, this
            # plan's pool and its error word alive.
            keep = (q, kv, qo, kvp, kvi, loc, mask_a, mip, o, lse_a, self.pool, self.error_word)
            launches = [
                self._schedule.prepare((1, 1, 1), _SCHED_THREADS, [p]),
                # pdl: the partial and combine kernels may start while the kernel before them
                # runs; the combine waits first thing in every CTA, the partial (which computes
                # its own cuts) only before it exits; the scheduler's launch stays ordinary, so a
                # call starts after what came before it
                self._partial.prepare(self.grid_partial, self.config.threads, [p], self.config.shared_bytes,
                                      programmatic=self.pdl),
                self._combine.prepare(self.grid_combine, _COMBINE_THREADS, [p], programmatic=self.pdl),
            ]
            for ln in launches:
                ln.keep(*keep)
            self._launches = launches
            self._cached_key = key
        for ln in self._launches:
            ln.launch(stream)

    def __repr__(self):
        c = self.config
        cap = f" split_cap={self.num_splits}" if self.num_splits else ""
        return (f"<VerifyAttention heads={self.num_heads} max_batch={self.max_batch} max_q={self.max_q} "
                f"parts={self.num_parts}{cap} mask={self.mask_format.value} {self.arch} tile M={c.rows} N={c.keys} "
                f"C={c.csplit}{c._loop_flags}{c._ws_flags} smem={c.shared_bytes} B "
                f"workspace={self.workspace_bytes} B pdl={self.pdl}>")
