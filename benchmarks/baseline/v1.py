"""Launcher of the baseline verify-attention kernel (``verify_attention_v1.cu``), benchmarks only.

The plan as it was before the device-side scheduler: ``num_splits`` fixed on the
host, grid ``(row tiles, num_splits, max_batch)``, workspace
``max_batch * max_q * heads * num_splits * 513 * 4`` bytes, and its own tiles of that day
(:data:`V1_CONFIGS`, chosen by :func:`v1_tile_config`): the package's tiles have since become
warp-specialized ones with one warp per 16 rows (``csplit=1``), which this kernel cannot run (one
warp would hold all 512 output columns, and its block size is ``(rows / 16) * csplit`` warps).
"""

from __future__ import annotations

import ctypes
import math
from dataclasses import dataclass
from pathlib import Path


import driverlevel as dl
from driverlevel._compile import compile_source, shared_limit
from driverlevel._mask import bitmask_words, parse_mask_format
from driverlevel._module import load_module, struct_layout_defines
from driverlevel.verify_attention import _MASK_MODE, DEFAULT_SM_SCALE

_ROW_BYTES = 576 * 2 + 16  # a Q or K row in shared memory, padded against bank conflicts


@dataclass(frozen=True)
class V1Tile:
    """The 2026-11-30 kernel's tile: ``rows`` per CTA, ``csplit`` warps per 16 rows (each takes
    1/csplit of the contraction and of the 512 value columns), ``keys`` per K tile, ``stages`` K
    tiles in flight."""

    rows: int
    csplit: int
    keys: int
    stages: int

    @property
    def threads(self) -> int:
        return (self.rows // 16) * self.csplit * 32

    @property
    def shared_bytes(self) -> int:
        """Q tile + K stages + the double-buffered S exchange, bytes (the kernel's SMEM_BYTES)."""
        warps = self.threads // 32
        x = 2 * warps * (self.keys // 8) * 4 * 32 * 4 if self.csplit > 1 else 0
        return (self.rows + self.stages * self.keys) * _ROW_BYTES + x


def compile_v1(arch, tile: V1Tile):
    """``verify_attention_v1.cu`` compiled for ``arch`` with ``tile`` (a :class:`Cubin`)."""
    src = (Path(__file__).parent / "verify_attention_v1.cu").read_text()
    defines = {"DL_ROWS": tile.rows, "DL_CSPLIT": tile.csplit, "DL_KEYS": tile.keys, "DL_STAGES": tile.stages,
               **struct_layout_defines(_ParamsV1)}
    return compile_source(src, "verify_attention_v1.cu", arch, defines)


#: The tiles of 2026-11-30, in that day's order of preference (its verify_attention.py).
V1_CONFIGS = (
    V1Tile(rows=64, csplit=2, keys=32, stages=2),  # 182,272 B: sm_90, sm_100
    V1Tile(rows=48, csplit=2, keys=32, stages=2),  # 155,392 B: sm_90, sm_100 (9 heads x 16 tokens), sm_80
    V1Tile(rows=64, csplit=2, keys=16, stages=2),  # 128,512 B: (labelled sm_80 that day; taken by no architecture: sm_80 gets 48 x 32)
    V1Tile(rows=32, csplit=4, keys=16, stages=2),  #  91,136 B: sm_86, sm_89, sm_120
)


def v1_tile_config(arch, rows_per_request: int) -> V1Tile:
    """That day's rule: among the tiles that fit ``arch``'s shared memory per block and share the
    first one's key tile and contraction split, the one that pads ``rows_per_request`` the least
    (ties to the larger row tile)."""
    fits = [c for c in V1_CONFIGS if c.shared_bytes <= shared_limit(arch)]
    if not fits:
        raise ValueError(f"no 2026-11-30 tile fits {arch}")
    fits = [c for c in fits if c.keys == fits[0].keys and c.csplit == fits[0].csplit]
    return min(fits, key=lambda c: (math.ceil(rows_per_request / c.rows) * c.rows, -c.rows))


class _ParamsV1(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint64) for n in ("q", "kv_cache", "qo_indptr", "kv_indptr", "kv_indices", "out_cache_loc",
                                               "mask", "mask_indptr", "out", "lse", "o_part", "lse_part")] + [
        ("scale_log2", ctypes.c_float), ("num_heads", ctypes.c_int32), ("batch_size", ctypes.c_int32),
        ("num_splits", ctypes.c_int32), ("mask_mode", ctypes.c_int32), ("mask_words", ctypes.c_int32)]


def suggest_num_splits(device, max_batch: int, max_q: int, num_heads: int, kv_len: int, max_splits: int = 64,
                       arch=None) -> int:
    """The split count the 2026-11-30 plan was run with: the smallest that minimises (waves of
    CTAs) x (key tiles per split) for requests of about ``kv_len`` prefix tokens, with the tile
    :func:`v1_tile_config` gives ``arch`` (default: the device's)."""
    cfg = v1_tile_config(arch or device.arch, max_q * num_heads)
    row_tiles = math.ceil(max_q * num_heads / cfg.rows) * max_batch
    key_tiles = max(1, math.ceil((kv_len + max_q) / cfg.keys))
    best, best_cost = 1, None
    for s in range(1, max_splits + 1):
        per = math.ceil(key_tiles / s)
        active = math.ceil(key_tiles / per)
        cost = math.ceil(row_tiles * active / device.sm_count) * per
        if best_cost is None or cost < best_cost * 0.97:
            best, best_cost = s, cost
    return best


class V1Plan:
    """The 2026-11-30 plan on ``dev``, with the tile :func:`v1_tile_config` gives ``arch`` (default:
    the device's; ``"sm_120"`` for the tile that day's sm_120 build ran, on any GPU that fits it)."""

    def __init__(self, dev, heads, *, max_batch, max_q, num_splits, mask_format="bitmask", sm_scale=DEFAULT_SM_SCALE,
                 arch=None):
        self.dev, self.heads, self.max_batch, self.max_q, self.num_splits = dev, heads, max_batch, max_q, num_splits
        self.cfg = v1_tile_config(arch or dev.arch, max_q * heads)
        self.mask_format = parse_mask_format(mask_format)
        self.mask_words = bitmask_words(max_q)
        self.sm_scale = sm_scale
        mod = load_module(dev, compile_v1(dev.arch, self.cfg))
        self._partial, self._merge = mod.kernel("verify_attn_partial"), mod.kernel("verify_attn_merge")
        self.shared_bytes = self.cfg.shared_bytes
        self._partial.reserve_shared(self.shared_bytes)
        rows = max_batch * max_q * heads
        self.workspace_bytes = rows * num_splits * 513 * 4
        self.buf = dl.DeviceBuffer.allocate(dev, self.workspace_bytes + 1024, label="v1-workspace")
        self.o_part = self.buf.ptr
        self.lse_part = self.buf.ptr + rows * num_splits * 512 * 4
        self.grid_partial = (math.ceil(max_q * heads / self.cfg.rows), num_splits, max_batch)
        self.grid_merge = (math.ceil(max_q * heads / 8), max_batch, 1)

    def run(self, stream, q, kv, meta, out, lse):
        a = lambda x: dl.runtime.as_device_array(x, self.dev)  # noqa: E731
        p = _ParamsV1()
        p.q, p.kv_cache = a(q).ptr, a(kv).ptr
        p.qo_indptr, p.kv_indptr = a(meta.qo_indptr).ptr, a(meta.kv_indptr).ptr
        p.kv_indices, p.out_cache_loc = a(meta.kv_indices).ptr, a(meta.out_cache_loc).ptr
        p.mask = a(meta.custom_mask).ptr if meta.custom_mask is not None else 0
        p.mask_indptr = 0
        p.out, p.lse = a(out).ptr, a(lse).ptr
        p.o_part, p.lse_part = self.o_part, self.lse_part
        p.scale_log2 = self.sm_scale * math.log2(math.e)
        p.num_heads, p.batch_size, p.num_splits = self.heads, int(a(meta.qo_indptr).shape[0]) - 1, self.num_splits
        p.mask_mode, p.mask_words = _MASK_MODE[self.mask_format], self.mask_words
        self._launches = [self._partial.prepare(self.grid_partial, self.cfg.threads, [p], self.shared_bytes)]
        if self.num_splits > 1:
            self._launches.append(self._merge.prepare(self.grid_merge, 256, [p]))
        for ln in self._launches:
            ln.keep(q, kv, meta, out, lse, self.buf)
            ln.launch(stream)
