"""The demo MLA target model, built from driverlevel's own kernels.

Pairs with ``cu/mla_model.cu`` (kernels ``mla_gemm``, ``mla_gemm_m32``, ``mla_gemm_m144``, ``mla_gemm_pair``,
``mla_gemm_pair_m32``, ``mla_gemm_reduce``,
``mla_embed`` and the drafter's ``draft_chain``; the drafter itself is
:class:`driverlevel.demo.drafter.Drafter`). The weights are bf16, generated on the host from
a seed (:func:`driverlevel.demo._mla_weights.make_weights`; the structure that keeps greedy
decoding numerically stable is described there) and uploaded once. No framework, no
downloads.

Target forward (one verify call, every launch capture-safe)::

    e      = embed(tokens, positions)              mla_embed      bf16 [rows, d_model]
    q      = e @ w_q^T                              mla_gemm_pair  bf16 [rows, H, 576]
    kv     = e @ w_kv^T  -> kv_cache[out_cache_loc]  (one launch)   bf16 (scattered rows)
    attn   = VerifyAttention(q, kv_cache, metadata)                bf16 [rows, H, 512]
    h      = e + attn @ w_o^T                       mla_gemm       bf16 [rows, d_model]
    logits = h @ w_lm^T                             mla_gemm       fp32 [rows, vocab]

``rows`` is read on the device (``qo_indptr[bs]``); the grids are sized for the plan's
maximum and idle CTAs exit at once. :class:`MLAModel` is a
:class:`~driverlevel.interfaces.TargetModel` and :class:`ForwardPlan` a
:class:`~driverlevel.interfaces.TargetForward`: the runner takes them through those protocols
only.

Example
-------
>>> import driverlevel as dl                                            # doctest: +SKIP
>>> from driverlevel.demo import MLAModel, MLAModelConfig  # doctest: +SKIP
>>> dev = dl.Device(0); s = dev.create_stream()  # doctest: +SKIP
>>> model = MLAModel(dev, MLAModelConfig(vocab_size=32768, num_heads=9, seed=0))  # doctest: +SKIP
>>> fwd = model.forward_plan(max_batch=8, max_q=33, num_splits=8, mask_format="bitmask")  # doctest: +SKIP
"""

from __future__ import annotations

import collections.abc
import ctypes
import math
import operator
from typing import NamedTuple
import numpy as np

from .._array import DeviceArray
from .._capture_guard import ensure_not_capturing
from .._checks import device_array_arg, positive_int
from .._compile import CompileVariant, compile_file, normalize_arch, shared_limit
from .._device import _check_device_arg
from .._dtypes import bfloat16
from .._memory import DeviceBuffer, WorkspacePool, format_bytes
from .._module import check_pdl_arg, load_module, resolve_pdl
from ..argmax import argmax_rows_launch as _argmax_rows_launch
from ..argmax import load as _load_argmax
from ._mla_weights import QK_DIM, V_DIM, MLAModelConfig, MLAWeights, make_weights

__all__ = [
    "MLAModel",
    "MLAModelConfig",
    "MLAWeights",
    "ForwardPlan",
    "make_weights",
    "compile_defines",
    "dynamic_shared_bytes",
    "compile_variants",
    "gemm_shared_bytes",
    "gemm_ctas_per_sm",
    "gemm_schedule",
    "gemm_workspace_elems",
    "load",
    "SOURCE",
]

SOURCE = "mla_model.cu"
_GEMM_BM = 128
_GEMM_BM_WIDE = 144  # mla_gemm_m144: 129 .. 144 rows in one row tile
_GEMM_BN = 128
_GEMM_BK = 64
_GEMM_K_ALIGN = 32  # k % 32 == 0; a k % 64 == 32 tail is zero-filled in the last k-tile
_GEMM_K_LIMIT = 2**25  # k < 2**25: the B loader's 32-row step (32 * k * 2 bytes) fits a 32-bit int
_GEMM_THREADS = 256


class _GemmParams(ctypes.Structure):
    """ctypes mirror of ``GemmParams`` in cu/mla_model.cu."""

    _fields_ = [
        ("a", ctypes.c_uint64), ("a_index", ctypes.c_uint64), ("b", ctypes.c_uint64), ("c", ctypes.c_uint64),
        ("c_index", ctypes.c_uint64), ("residual", ctypes.c_uint64), ("m_ptr", ctypes.c_uint64),
        ("noise_counter", ctypes.c_uint64), ("partial", ctypes.c_uint64), ("noise_seed", ctypes.c_uint64),
        ("m_max", ctypes.c_int64), ("n", ctypes.c_int32), ("k", ctypes.c_int32), ("lda", ctypes.c_int32),
        ("ldc", ctypes.c_int32), ("ldr", ctypes.c_int32), ("out_f32", ctypes.c_int32), ("out_scale", ctypes.c_float),
        ("noise_std", ctypes.c_float), ("k_splits", ctypes.c_int32), ("a_rows", ctypes.c_int32),
        ("c_rows", ctypes.c_int64),
    ]


class _EmbedParams(ctypes.Structure):
    """ctypes mirror of ``EmbedParams`` in cu/mla_model.cu."""

    _fields_ = [
        ("table", ctypes.c_uint64), ("tokens", ctypes.c_uint64), ("positions", ctypes.c_uint64),
        ("out", ctypes.c_uint64), ("m_ptr", ctypes.c_uint64), ("m_max", ctypes.c_int64),
        ("d", ctypes.c_int32), ("num_classes", ctypes.c_int32), ("vocab", ctypes.c_int32),
        ("tokens_i64", ctypes.c_int32), ("positions_i64", ctypes.c_int32),
    ]


class _DraftChainParams(ctypes.Structure):
    """ctypes mirror of ``DraftChainParams`` in cu/mla_model.cu."""

    _fields_ = [
        ("table", ctypes.c_uint64), ("roots", ctypes.c_uint64), ("guesses", ctypes.c_uint64),
        ("step_counter", ctypes.c_uint64), ("bs", ctypes.c_int32), ("depth", ctypes.c_int32),
        ("vocab", ctypes.c_int32),
    ]


_STRUCTS = (("G", _GemmParams), ("E", _EmbedParams), ("D", _DraftChainParams))


def gemm_stages(arch, bm: int = _GEMM_BM) -> int:
    """cp.async pipeline depth of the ``bm``-row GEMM tile on ``arch`` (k-tiles of 64): the most
    stages (at most 4) with which two of its CTAs still share an SM (1 KB reserved a CTA), else the
    most one CTA fits, at least 2. The 128-row tile (``mla_gemm``; ``mla_gemm_m32``, ``bm`` = 32, runs
    at the same depth): 3 on sm_90 / sm_100 (110,592 B a CTA), 2 on sm_80 (two CTAs an SM) and on the
    100 KB parts (sm_86 / 89 / 120: 73,728 B, one CTA an SM). The 144-row tile (``mla_gemm_m144``): 2
    everywhere (78,336 B: two CTAs an SM on sm_80 / sm_90 / sm_100).

    k-tiles of 64 against 32 (fifty-fourth session, H100): the target forward's 128-row GEMMs 2-4 µs
    faster each (LM head 35.3 -> 31.1 µs), the decode step 248.9 -> 231.3 GPU µs (BENCHMARKS.md).

    Raises
    ------
    ValueError
        For an architecture whose shared memory per block holds not even 2 stages (none of the
        supported ones). TypeError or ValueError as :func:`driverlevel.runtime.normalize_arch` for an
        ``arch`` that is not an architecture name."""
    arch = normalize_arch(arch)
    bm = _row_tile_arg("bm", bm)
    if bm == 32:  # (mla_gemm_m32 runs at the 128-row tile's depth: one DL_GEMM_STAGES)
        bm = _GEMM_BM
    limit = shared_limit(arch)  # the opt-in per-block limit; an SM holds it plus 1 KB reserved
    fits = [s for s in range(2, 5) if gemm_shared_bytes(s, bm) <= limit]
    if not fits:
        raise ValueError(f"mla_gemm's {bm}-row tile does not fit {arch}'s {limit:,} B of shared memory per block")
    two = [s for s in fits if _two_ctas_fit(gemm_shared_bytes(s, bm), limit)]
    return max(two or fits)


def _two_ctas_fit(cta_bytes: int, limit: int) -> bool:
    """Whether two CTAs of ``cta_bytes`` dynamic shared memory share an SM whose opt-in per-block
    limit is ``limit`` (the SM holds that plus 1 KB, and reserves 1 KB a CTA)."""
    return 2 * (cta_bytes + 1024) <= limit + 1024


def _even_splits(k: int, splits: int) -> int:
    """``splits`` (at most the k-tiles of 64 in ``k``) cut to the splits that get a k-tile: the kernel
    gives each ``ceil(k_tiles / splits)``, so 17 over 72 k-tiles (5 each, the last two empty) are 15."""
    kt = -(-k // _GEMM_BK)
    return -(-kt // -(-kt // min(splits, kt)))


def gemm_shared_bytes(stages: int, bm: int = _GEMM_BM) -> int:
    """Dynamic shared memory of ``mla_gemm`` (``bm`` = 128), ``mla_gemm_m32`` (32) or ``mla_gemm_m144``
    (144) with ``stages`` k-tiles in flight, bytes.

    Raises
    ------
    TypeError, ValueError
        ``stages`` not a positive int, ``bm`` not 32, 128 or 144."""
    return positive_int("stages", stages) * (_row_tile_arg("bm", bm) + _GEMM_BN) * (_GEMM_BK + 8) * 2


def _row_tile_arg(name: str, value) -> int:
    """``value`` as one of the GEMM's row tiles (32, 128, 144); TypeError for a non-int (bools too),
    ValueError for another int."""
    try:
        if isinstance(value, bool):
            raise TypeError
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int (32, {_GEMM_BM} or {_GEMM_BM_WIDE}), got {type(value).__name__}") from None
    if v not in (32, _GEMM_BM, _GEMM_BM_WIDE):
        raise ValueError(f"{name} must be 32, {_GEMM_BM} or {_GEMM_BM_WIDE}, got {v!r}")
    return v


def gemm_ctas_per_sm(arch, bm: int = _GEMM_BM, registers: int | None = None) -> int:
    """CTAs of the ``bm``-row GEMM tile (256 threads) that one SM holds on ``arch``: by shared memory
    (1 KB reserved a CTA) at its :func:`gemm_stages` -- 2 on sm_80 / sm_90 / sm_100, 1 on the 100 KB
    parts (sm_86 / 89 / 120), for the 128- and the 144-row tile alike -- and, given the kernel's
    ``registers`` per thread (its cubin's resources), by the 65,536-register file too (allocated in
    units of 8 registers a thread): 128 registers leave two CTAs, 129 .. 255 one (NVRTC 13.0 gave
    ``mla_gemm`` 134 on sm_80 before its loaders were slimmed and it was pinned to 128 where two
    fit, and ``mla_gemm_pair``, not pinned, can still exceed 128).

    Raises
    ------
    TypeError
        ``arch`` not a string, ``bm`` or ``registers`` not an int.
    ValueError
        ``arch`` that is not an architecture name, or whose shared memory holds not one CTA of
        the tile (:func:`gemm_stages`); ``bm`` not 32, 128 or 144; ``registers`` outside 1 .. 255."""
    arch = normalize_arch(arch)
    ctas = 2 if _two_ctas_fit(gemm_shared_bytes(gemm_stages(arch, bm), bm), shared_limit(arch)) else 1
    if registers is not None:
        registers = positive_int("registers", registers)
        if registers > 255:
            raise ValueError(f"registers must be at most 255 (a thread's limit), got {registers}")
        ctas = min(ctas, max(1, 65536 // (-(-registers // 8) * 8 * _GEMM_THREADS)))
    return ctas


def gemm_schedule(m_max: int, n: int, k: int, sm_count: int, ctas_per_sm: int) -> tuple[int, int]:
    """``(row_tile, k_splits)`` of a GEMM of ``m_max`` rows, ``n`` columns and depth ``k`` on
    ``sm_count`` SMs that hold ``ctas_per_sm`` CTAs of a tile each (:func:`gemm_ctas_per_sm`).

    Row tiles: 32 rows for at most 64 rows; 144 rows for 129 to 144 when that takes fewer waves of
    ``ctas_per_sm * sm_count`` CTAs than two 128-row tiles and needs no split-K (a tree step's 136
    rows at batch 8 and budget 16: the LM head's 512 CTAs, two waves on an H100 / H200, become 256,
    one wave; the projections, with fewer column tiles than CTA slots, keep the 128-row tile, whose
    warps read less of A from shared memory: 16.5 against 19.8 µs for q at 136 rows, fifty-fifth
    session); 128 rows otherwise. Split-K when the output has too few tiles to fill ``sm_count`` SMs
    over a long ``k`` (>= 2048; each split keeps at least 256 of k: 4 k-tiles of 64). The kernel
    gives each split ``ceil(kt / splits)`` k-tiles, so the count is cut to the splits that get any:
    17 splits over 72 k-tiles (5 each, the last two empty) become 15. In the model only the output
    projection (``k = heads * 512``) splits. The model's own ``ctas_per_sm`` is
    :attr:`MLAModel.gemm_ctas`.

    Raises
    ------
    TypeError, ValueError
        An argument that is not a positive int (bools and floats refused)."""
    m_max, n, k = positive_int("m_max", m_max), positive_int("n", n), positive_int("k", k)
    sm_count, ctas_per_sm = positive_int("sm_count", sm_count), positive_int("ctas_per_sm", ctas_per_sm)
    cols = math.ceil(n / _GEMM_BN)
    bm = 32 if m_max <= 64 else _GEMM_BM
    if _GEMM_BM < m_max <= _GEMM_BM_WIDE and (cols >= sm_count or k < 2048):  # (the 144-row tile unsplit)
        slots = ctas_per_sm * sm_count
        if math.ceil(cols / slots) < math.ceil(2 * cols / slots):
            bm = _GEMM_BM_WIDE
    tiles = cols * math.ceil(m_max / bm)
    if tiles >= sm_count or k < 2048:
        return bm, 1
    return bm, _even_splits(k, max(1, min(math.ceil(sm_count / tiles), k // 256, 32)))


def gemm_workspace_elems(m_max: int, n: int, k: int, sm_count: int, ctas_per_sm: int) -> int:
    """float32 elements of split-K workspace the GEMM needs (0 without split-K; the arguments, and the
    errors, as :func:`gemm_schedule`'s)."""
    _, splits = gemm_schedule(m_max, n, k, sm_count, ctas_per_sm)
    return splits * m_max * n if splits > 1 else 0


class _Launches:
    """Launches queued in order by one :meth:`launch` (a split-K GEMM and its reduce, or a GEMM pair;
    ``fused``: a pair in one launch)."""

    def __init__(self, launches, fused: bool = False):
        self.launches = list(launches)
        self.fused = bool(fused)

    def launch(self, stream) -> None:
        for ln in self.launches:
            ln.launch(stream)


def compile_defines(arch) -> dict:
    """NVRTC defines of ``cu/mla_model.cu`` for ``arch``: params layouts, the GEMM pipeline depths and
    how many 128- and 144-row CTAs an SM holds (their register caps)."""
    d = {"DL_GEMM_STAGES": gemm_stages(arch), "DL_GEMM_STAGES_144": gemm_stages(arch, _GEMM_BM_WIDE),
         "DL_GEMM_CTAS": gemm_ctas_per_sm(arch), "DL_GEMM_CTAS_144": gemm_ctas_per_sm(arch, _GEMM_BM_WIDE)}
    for prefix, cls in _STRUCTS:
        for name, *_ in cls._fields_:
            d[f"DL_OFF_{prefix}_{name}"] = getattr(cls, name).offset
        d[f"DL_SIZEOF_{prefix}"] = ctypes.sizeof(cls)
    return d


def dynamic_shared_bytes(arch) -> dict:
    """Dynamic shared memory per block of the kernels launched with some, bytes."""
    st = gemm_stages(arch)
    return {"mla_gemm": gemm_shared_bytes(st), "mla_gemm_m32": gemm_shared_bytes(st, 32),
            "mla_gemm_m144": gemm_shared_bytes(gemm_stages(arch, _GEMM_BM_WIDE), _GEMM_BM_WIDE),
            "mla_gemm_pair": gemm_shared_bytes(st), "mla_gemm_pair_m32": gemm_shared_bytes(st, 32)}


def compile_variants(arch) -> list[CompileVariant]:
    """The one way ``cu/mla_model.cu`` is compiled on ``arch`` (:func:`compile_defines`), with
    the GEMMs' dynamic shared memory at the pipeline depth :func:`gemm_stages` picks."""
    return [CompileVariant(compile_defines(arch), dynamic_shared_bytes(arch))]


# ---------------------------------------------------------------------------------------- helpers

class _GemmSetup(NamedTuple):
    """One validated GEMM: its params, row tile, split count and the arrays its launches keep alive."""

    p: _GemmParams
    bm: int
    splits: int
    keep: tuple


def _ptr(x) -> int:
    return 0 if x is None else int(x.ptr)


def _dev_array(name, x, device) -> DeviceArray:
    """``x`` as a C-contiguous DeviceArray on ``device`` (:func:`~driverlevel._checks.device_array_arg`)."""
    return device_array_arg(name, x, device, owner="the model")


def _need(name, a, dtypes, ndim=None):
    if a.dtype.name not in dtypes:
        raise TypeError(f"{name} must have dtype {' or '.join(dtypes)}, got {a.dtype.name}")
    if ndim is not None and a.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {a.shape}")


def _row_count(name, x, device):
    """A device int64 scalar (``[1]`` or ``[]``) holding a row count, or None."""
    if x is None:
        return None
    a = _dev_array(name, x, device)
    _need(name, a, ("int64",))
    if a.size != 1:
        raise ValueError(f"{name} must hold one int64 (e.g. qo_indptr[bs:]), got shape {a.shape}")
    return a


def load(device, arch=None):
    """Compile ``cu/mla_model.cu`` for ``device`` (or ``arch``) and load it; returns the Module."""
    device = _check_device_arg(device)
    arch = normalize_arch(arch or device.arch)
    return load_module(device, compile_file(SOURCE, arch, compile_defines(arch)))


class MLAModel:
    """The demo MLA target model on one device: weights, kernels and forward plans.

    Parameters
    ----------
    device : Device or int
    config : MLAModelConfig, optional
        Shapes and seed (defaults: vocab 32768, 9 heads).
    weights : MLAWeights, optional
        Host weights to upload instead of generating them from ``config``.
    arch : str, optional
        Compile for this architecture (must match the device to run).
    pdl : bool, optional
        Programmatic dependent launch of the model's kernels, its row argmax and its forward
        plans' verify attention (``VerifyAttention(pdl=)``). None (default): where ``arch`` is
        sm_90 or newer; False: ordinary launches; True below sm_90: ``ValueError``. Every kernel of
        ``cu/mla_model.cu`` but ``draft_chain`` starts with ``dl::pdl_enter`` (``cu/common.cuh``):
        it waits for the kernel before it on the stream before it reads or writes anything, so a
        programmatic launch of it is safe after any work (a kernel launched programmatically that
        never waits, before it, would break that chain; see
        :class:`~driverlevel.interfaces.TargetForward`); only its launch and its CTAs' start overlap
        the kernel before it (the demo's decode step: ~1 µs a launch, fifty-ninth session).

    Attributes
    ----------
    config : MLAModelConfig
    weights : MLAWeights
        The host copies (bf16 bit patterns).
    cubin : Cubin
        ``cu/mla_model.cu`` compiled for the device; ``cubin.cache_hit`` says whether it
        came from the cache.
    pool : WorkspacePool
        Device weights: ``embed``, ``w_q``, ``w_kv``, ``w_o``, ``w_lm`` (bf16) and the
        drafter's ``successor`` table (int32 ``[vocab]``).
    pdl : bool
        ``pdl`` resolved for ``arch``.
    gemm_ctas : int
        CTAs of the 128- and 144-row GEMM tiles one SM holds, by shared memory and by the compiled
        kernels' registers (:func:`gemm_ctas_per_sm`): the ``ctas_per_sm`` the model passes to
        :func:`gemm_schedule` and :func:`gemm_workspace_elems`.

    Raises
    ------
    TypeError, ValueError
        For a ``pdl`` that is not None, True or False (``TypeError``, before the device is opened)
        or True below sm_90 (``ValueError``; before the device is opened where ``arch`` is given, else
        before the weights are generated).
    NvrtcError, CudaError
        If the kernels do not compile or load, or the upload fails.
    """

    def __init__(self, device, config: MLAModelConfig | None = None, *, weights: MLAWeights | None = None, arch=None,
                 pdl: bool | None = None):
        check_pdl_arg(pdl)  # (before the device is opened; with arch= the sm_90 rule too)
        if arch is not None:
            resolve_pdl(pdl, normalize_arch(arch))
        self.device = _check_device_arg(device)
        self.arch = normalize_arch(arch or self.device.arch)
        self.pdl = resolve_pdl(pdl, self.arch)  # (before the weights are generated)
        if weights is not None:
            config = weights.config
        self.config = config if config is not None else MLAModelConfig()
        if not isinstance(self.config, MLAModelConfig):
            raise TypeError(f"config must be an MLAModelConfig, got {type(self.config).__name__}")
        self.weights = weights if weights is not None else make_weights(self.config)
        self.cubin = compile_file(SOURCE, self.arch, compile_defines(self.arch))
        self._module = load_module(self.device, self.cubin)
        self._k_gemm = self._module.kernel("mla_gemm")
        self._k_gemm32 = self._module.kernel("mla_gemm_m32")
        self._k_gemm144 = self._module.kernel("mla_gemm_m144")
        self._k_pair = {_GEMM_BM: self._module.kernel("mla_gemm_pair"), 32: self._module.kernel("mla_gemm_pair_m32")}
        self._pair_ctas = {bm: gemm_ctas_per_sm(self.arch, _GEMM_BM, self.cubin.resources[name].registers)
                           for bm, name in ((_GEMM_BM, "mla_gemm_pair"), (32, "mla_gemm_pair_m32"))}  # (32: at least)
        self._k_reduce = self._module.kernel("mla_gemm_reduce")
        self._k_embed = self._module.kernel("mla_embed")
        self._argmax_module = _load_argmax(self.device, self.arch)
        self._k_chain = self._module.kernel("draft_chain")
        self._gemm_stages = gemm_stages(self.arch)
        self._gemm_stages_wide = gemm_stages(self.arch, _GEMM_BM_WIDE)
        # CTAs an SM of the 128- and 144-row tiles, by shared memory and by their registers (gemm_schedule)
        self.gemm_ctas = min(gemm_ctas_per_sm(self.arch, bm, self.cubin.resources[name].registers)
                              for bm, name in ((_GEMM_BM, "mla_gemm"), (_GEMM_BM_WIDE, "mla_gemm_m144")))

        c = self.config
        H, D, V = c.num_heads, c.d_model, c.vocab_size
        specs = [((V, D), bfloat16), ((H * QK_DIM, D), bfloat16), ((QK_DIM, D), bfloat16),
                 ((D, H * V_DIM), bfloat16), ((V, D), bfloat16), ((V,), np.int32)]
        ensure_not_capturing("MLAModel() (weight upload)")
        self.pool = WorkspacePool.allocate(self.device, WorkspacePool.required_bytes(specs), label="mla_model.weights")
        self.embed = self.pool.carve("embed", (V, D), bfloat16)
        self.w_q = self.pool.carve("w_q", (H * QK_DIM, D), bfloat16)
        self.w_kv = self.pool.carve("w_kv", (QK_DIM, D), bfloat16)
        self.w_o = self.pool.carve("w_o", (D, H * V_DIM), bfloat16)
        self.w_lm = self.pool.carve("w_lm", (V, D), bfloat16)
        self.successor = self.pool.carve("successor", (V,), np.int32)
        w = self.weights
        for arr, host in ((self.embed, w.embed), (self.w_q, w.w_q), (self.w_kv, w.w_kv), (self.w_o, w.w_o),
                          (self.w_lm, w.w_lm)):
            arr.copy_from_host(host)
        self._successor_ready = False

    # -- properties ----------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def num_heads(self) -> int:
        return self.config.num_heads

    @property
    def d_model(self) -> int:
        return self.config.d_model

    @property
    def weight_bytes(self) -> int:
        """Bytes of device memory holding the weights and the successor table."""
        return self.pool.capacity

    # -- launch builders (validated, packed once) ------------------------------------------
    def gemm(self, a, b, c, *, m_max: int, a_index=None, c_index=None, residual=None, num_rows=None,
             out_scale: float = 1.0, noise_counter=None, noise_seed: int = 0, noise_std: float = 0.0,
             workspace=None, k_splits: int | None = None, row_tile: int | None = None):
        """A prepared GEMM: ``C[row(m)] = out_scale * A[a_row(m)] @ B^T (+ noise) (+ residual[m])``.

        Parameters
        ----------
        a : bf16 ``[>= rows, k]`` (row stride a multiple of 8)
        b : bf16 ``[n, k]`` (nn.Linear layout)
        c : bf16 or float32 ``[>= rows, n]``
        m_max : int
            Rows of the grid (the most rows any call computes).
        a_index : int32 ``[m_max]``, optional
            Gather: row ``m`` of the product reads ``a[a_index[m]]``, the index clamped on the
            device to ``[0, a.shape[0])`` (values are written by kernels inside captured graphs,
            where no host check runs).
        c_index : int64 ``[m_max]``, optional
            Scatter: row ``m`` is written to ``c[c_index[m]]`` (e.g. ``out_cache_loc``); a row whose
            index lies outside ``[0, c.shape[0])`` (an exhausted pool's -1) is not written.
        residual : bf16 ``[m_max, n]``, optional
        num_rows : int64 device scalar, optional
            Rows computed = ``min(m_max, num_rows)``, read on the device.
        out_scale : float
        noise_counter : uint64 device scalar, optional
            Adds ``noise_std * z(noise_seed, *noise_counter, m, col)`` (fp32 output only), after
            the scale and before ``residual``; ``z`` is
            :func:`driverlevel.demo.reference.draft_noise_reference`.
        workspace : float32 device array, optional
            Split-K workspace of at least :func:`gemm_workspace_elems` elements; without it
            the GEMM runs unsplit.
        k_splits : int, optional
            Force a split count (default: :func:`gemm_schedule`'s), cut to the k-tiles of 64 and to
            the splits that get one (the kernel gives each ``ceil(k_tiles / k_splits)``); used only
            with ``workspace``. A test and tuning knob.
        row_tile : {32, 128, 144}, optional
            Force the row tile (default: :func:`gemm_schedule`'s); a test and tuning knob. The grid
            has ``ceil(m_max / row_tile)`` row tiles; the split count stays the schedule's (computed
            for its own tile) or ``k_splits``.

        Returns
        -------
        object with ``launch(stream)``
            One ``mla_gemm`` / ``mla_gemm_m32`` / ``mla_gemm_m144`` launch (the row tile of
            :func:`gemm_schedule`, or ``row_tile``), followed by ``mla_gemm_reduce`` with split-K.

        Raises
        ------
        TypeError, ValueError
            Wrong dtypes, shapes or alignment, naming the argument; a ``row_tile`` that is not an
            int (TypeError) or not 32, 128 or 144 (ValueError); a ``k_splits`` that is not a positive
            int; ``k`` of 2**25 or more.
        """
        g = self._gemm_setup(a, b, c, m_max=m_max, a_index=a_index, c_index=c_index, residual=residual,
                             num_rows=num_rows, out_scale=out_scale, noise_counter=noise_counter,
                             noise_seed=noise_seed, noise_std=noise_std, workspace=workspace, k_splits=k_splits,
                             row_tile=row_tile)
        return self._gemm_launch(g)

    def _gemm_launch(self, g: "_GemmSetup"):
        """The launch of one validated GEMM (:meth:`_gemm_setup`): its row tile's kernel, then
        ``mla_gemm_reduce`` with split-K."""
        kern = {_GEMM_BM: self._k_gemm, 32: self._k_gemm32, _GEMM_BM_WIDE: self._k_gemm144}[g.bm]
        grid = (math.ceil(g.p.n / _GEMM_BN), math.ceil(g.p.m_max / g.bm), g.splits)
        stages = self._gemm_stages_wide if g.bm == _GEMM_BM_WIDE else self._gemm_stages
        ln = kern.prepare(grid, _GEMM_THREADS, [g.p], gemm_shared_bytes(stages, g.bm), programmatic=self.pdl)
        ln.keep(*g.keep)
        if g.splits == 1:
            return ln
        red = self._k_reduce.prepare((g.p.m_max, math.ceil(g.p.n / 512), 1), 256, [g.p], programmatic=self.pdl)
        red.keep(*g.keep)
        return _Launches([ln, red])

    def gemm_pair(self, first: dict, second: dict):
        """Two GEMMs in one launch where they can share it (a grouped GEMM of two: ``mla_gemm_pair``,
        ``mla_gemm_pair_m32``), e.g. the target forward's q and kv projections, which read the same rows.

        Parameters
        ----------
        first, second : dict
            Each the keyword arguments of :meth:`gemm` (``a``, ``b``, ``c``, ``m_max`` and any of its
            options), validated as :meth:`gemm` validates them.

        Returns
        -------
        object with ``launch(stream)`` and ``fused`` (bool)
            One launch (``fused``: the first GEMM's column tiles, then the second's) when both take the
            same 128- or 32-row tile (:func:`gemm_schedule`, or ``row_tile``), neither splits k and
            their CTAs fit one wave of the pair kernel; otherwise the two :meth:`gemm` launches one
            after the other. The results are the same
            either way (each output element is one GEMM's, computed by the same tile code).

        Raises
        ------
        TypeError
            ``first`` or ``second`` is not a mapping, or holds an argument :meth:`gemm` does not take.
        TypeError, ValueError
            What :meth:`gemm` raises for either, the message prefixed by ``first:`` or ``second:``.
        """
        setups = []
        for name, kw in (("first", first), ("second", second)):
            if not isinstance(kw, collections.abc.Mapping):
                raise TypeError(f"{name} must be a dict of gemm()'s keyword arguments, got {type(kw).__name__}")
            try:
                setups.append(self._gemm_setup(**kw))
            except (TypeError, ValueError) as e:  # (the message names the GEMM and gemm(), not the helper)
                raise type(e)(f"{name}: {str(e).replace('_gemm_setup()', 'gemm()')}") from None
        g0, g1 = setups
        grid = (math.ceil(g0.p.n / _GEMM_BN) + math.ceil(g1.p.n / _GEMM_BN),
                math.ceil(max(g0.p.m_max, g1.p.m_max) / g0.bm), 1)
        # one launch only where both share a pair kernel's tile unsplit and its CTAs fit one wave (the
        # pair, not pinned, may hold fewer CTAs an SM than the single tile: NVRTC 13.0 gave it 134
        # registers on sm_90, one CTA an SM, before the lean loaders; past a wave, two launches of the
        # single tile are the better schedule)
        fits = (g0.bm == g1.bm and g0.bm in self._k_pair and g0.splits == 1 and g1.splits == 1
                and grid[0] * grid[1] <= self.device.sm_count * self._pair_ctas[g0.bm])
        if not fits:  # (the setups are validated: packed as gemm() packs them)
            return _Launches([self._gemm_launch(g0), self._gemm_launch(g1)])
        ln = self._k_pair[g0.bm].prepare(grid, _GEMM_THREADS, [g0.p, g1.p], gemm_shared_bytes(self._gemm_stages, g0.bm),
                                          programmatic=self.pdl)
        ln.keep(*g0.keep, *g1.keep)
        return _Launches([ln], fused=True)

    def _gemm_setup(self, a, b, c, *, m_max: int, a_index=None, c_index=None, residual=None, num_rows=None,
                    out_scale: float = 1.0, noise_counter=None, noise_seed: int = 0, noise_std: float = 0.0,
                    workspace=None, k_splits: int | None = None, row_tile: int | None = None) -> "_GemmSetup":
        """:meth:`gemm`'s checks and its params, row tile and split count (no launch is packed)."""
        dev = self.device
        if row_tile is not None:
            row_tile = _row_tile_arg("row_tile", row_tile)
        a = _dev_array("a", a, dev)
        b = _dev_array("b", b, dev)
        c = _dev_array("c", c, dev)
        _need("a", a, ("bfloat16",), 2)
        _need("b", b, ("bfloat16",), 2)
        _need("c", c, ("bfloat16", "float32"), 2)
        n, k = b.shape
        if a.shape[1] != k:
            raise ValueError(f"a must have {k} columns (b is [{n}, {k}]), got {a.shape}")
        if c.shape[1] != n:
            raise ValueError(f"c must have {n} columns, got {c.shape}")
        if k % _GEMM_K_ALIGN or n % 8:
            raise ValueError(f"mla_gemm needs k % {_GEMM_K_ALIGN} == 0 and n % 8 == 0, got k={k}, n={n}")
        if k >= _GEMM_K_LIMIT:  # (the kernel's B loader steps 32 rows of k bf16 in a 32-bit int)
            raise ValueError(f"mla_gemm needs k < {_GEMM_K_LIMIT:,}, got {k:,}")
        m_max = positive_int("m_max", m_max)  # (8.7 or True refused, not truncated)
        if not 0 < a.shape[0] < 2**31:
            raise ValueError(f"a must have 1 to 2**31 - 1 rows, got {a.shape[0]:,}")
        if a_index is None and a.shape[0] < m_max:
            raise ValueError(f"a has {a.shape[0]} rows, fewer than m_max={m_max}")
        if c_index is None and c.shape[0] < m_max:
            raise ValueError(f"c has {c.shape[0]} rows, fewer than m_max={m_max}")
        if a_index is not None:
            a_index = _dev_array("a_index", a_index, dev)
            _need("a_index", a_index, ("int32",), 1)
            if a_index.shape[0] < m_max:
                raise ValueError(f"a_index must have >= m_max={m_max} entries, got {a_index.shape}")
        if c_index is not None:
            c_index = _dev_array("c_index", c_index, dev)
            _need("c_index", c_index, ("int64",), 1)
            if c_index.shape[0] < m_max:
                raise ValueError(f"c_index must have >= m_max={m_max} entries, got {c_index.shape}")
        if residual is not None:
            residual = _dev_array("residual", residual, dev)
            _need("residual", residual, ("bfloat16",), 2)
            if residual.shape[1] != n or residual.shape[0] < m_max:
                raise ValueError(f"residual must be [>= {m_max}, {n}], got {residual.shape}")
        num_rows = _row_count("num_rows", num_rows, dev)
        if noise_counter is not None:
            noise_counter = _dev_array("noise_counter", noise_counter, dev)
            _need("noise_counter", noise_counter, ("uint64",))
            if c.dtype.name != "float32":
                raise ValueError("noise needs a float32 output")
        for name, arr in (("a", a), ("b", b), ("c", c), ("residual", residual)):
            if arr is not None and arr.ptr % 16:
                raise ValueError(f"{name} must be 16-byte aligned, got address 0x{arr.ptr:x}")
        bm, splits = gemm_schedule(m_max, n, k, self.device.sm_count, self.gemm_ctas)
        if row_tile is not None:
            bm = row_tile
        if k_splits is not None:  # at most one split per k-tile, and none without one (as gemm_schedule's)
            splits = _even_splits(k, positive_int("k_splits", k_splits))
        if splits > 1:
            if workspace is None:
                splits = 1
            else:
                workspace = _dev_array("workspace", workspace, dev)
                _need("workspace", workspace, ("float32",))
                if workspace.size < splits * m_max * n:
                    raise ValueError(f"workspace needs {splits * m_max * n:,} float32 "
                                     f"({format_bytes(4 * splits * m_max * n)}) for {splits} splits, got "
                                     f"{workspace.size:,} ({format_bytes(workspace.nbytes)})")
        p = _GemmParams()
        p.a, p.a_index, p.b, p.c = a.ptr, _ptr(a_index), b.ptr, c.ptr
        p.c_index, p.residual, p.m_ptr, p.noise_counter = _ptr(c_index), _ptr(residual), _ptr(num_rows), _ptr(noise_counter)
        p.partial = workspace.ptr if splits > 1 else 0
        p.noise_seed = int(noise_seed) & (2**64 - 1)
        p.m_max = m_max
        p.n, p.k, p.lda, p.ldc, p.ldr = n, k, k, n, n
        p.out_f32 = 1 if c.dtype.name == "float32" else 0
        p.out_scale = float(out_scale)
        p.noise_std = float(noise_std)
        p.k_splits = splits
        p.a_rows, p.c_rows = a.shape[0], c.shape[0]  # the kernel's bounds on a_index and c_index
        return _GemmSetup(p, bm, splits, (a, b, c, a_index, c_index, residual, num_rows, noise_counter, workspace))

    def embed_launch(self, tokens, positions, out, *, m_max: int, num_rows=None):
        """A prepared ``mla_embed`` launch: ``out[m] = embed[tokens[m]]`` rotated by ``positions[m]``.

        Parameters
        ----------
        tokens : int32 or int64 ``[>= m_max]``
        positions : int32 or int64 ``[>= m_max]``, or None (position 0)
        out : bf16 ``[>= m_max, d_model]``
        m_max : int
        num_rows : int64 device scalar, optional
        """
        dev = self.device
        m_max = positive_int("m_max", m_max)
        tokens = _dev_array("tokens", tokens, dev)
        _need("tokens", tokens, ("int32", "int64"), 1)
        if positions is not None:
            positions = _dev_array("positions", positions, dev)
            _need("positions", positions, ("int32", "int64"), 1)
        out = _dev_array("out", out, dev)
        _need("out", out, ("bfloat16",), 2)
        D = self.config.d_model
        if out.shape[1] != D or out.shape[0] < m_max:
            raise ValueError(f"out must be [>= {m_max}, {D}], got {out.shape}")
        if tokens.shape[0] < m_max or (positions is not None and positions.shape[0] < m_max):
            raise ValueError(f"tokens and positions need >= m_max={m_max} entries")
        num_rows = _row_count("num_rows", num_rows, dev)
        p = _EmbedParams()
        p.table, p.tokens, p.positions, p.out, p.m_ptr = self.embed.ptr, tokens.ptr, _ptr(positions), out.ptr, _ptr(num_rows)
        p.m_max = m_max
        p.d, p.num_classes, p.vocab = D, self.config.num_classes, self.config.vocab_size
        p.tokens_i64 = 1 if tokens.dtype.name == "int64" else 0
        p.positions_i64 = 1 if positions is not None and positions.dtype.name == "int64" else 0
        ln = self._k_embed.prepare((m_max, 1, 1), 128, [p], programmatic=self.pdl)
        ln.keep(tokens, positions, out, num_rows)
        return ln

    def argmax_rows_launch(self, x, *, m_max: int, part=None, index=None, num_rows=None):
        """A prepared ``argmax_rows_*`` launch; see :func:`driverlevel.argmax.argmax_rows_launch`."""
        return _argmax_rows_launch(self.device, x, m_max=m_max, part=part, index=index, num_rows=num_rows,
                                   module=self._argmax_module, programmatic=self.pdl)

    # -- the drafter's table ---------------------------------------------------------------
    def compute_successor(self, stream, chunk: int = 1024) -> DeviceArray:
        """Fill :attr:`successor` on the GPU: ``argmax(embed[t] @ w_lm^T)`` for every token ``t``.

        Not capture-safe (allocates a temporary ``[chunk, vocab]`` fp32 buffer and
        synchronizes); done once, before any capture. Returns :attr:`successor`.
        """
        ensure_not_capturing("MLAModel.compute_successor()", stream)
        if self._successor_ready:
            return self.successor
        V = self.config.vocab_size
        chunk = max(1, min(int(chunk), V))
        tmp = DeviceBuffer.allocate(self.device, chunk * V * 4, label="mla_model.successor_tmp")
        logits = tmp.as_array((chunk, V), np.float32)
        for s in range(0, V, chunk):
            rows = min(chunk, V - s)
            self.gemm(self.embed[s:s + rows], self.w_lm, logits, m_max=rows).launch(stream)
            self.argmax_rows_launch(logits, index=self.successor[s:s + rows], m_max=rows).launch(stream)
        stream.synchronize()
        tmp.close()
        self._successor_ready = True
        return self.successor

    # -- plans -------------------------------------------------------------------------------
    def forward_plan(self, *, max_batch: int, max_q: int, num_splits: int | None = None, mask_format="bitmask",
                     name: str = "target", attention=None) -> "ForwardPlan":
        """A :class:`ForwardPlan` for verify calls of up to ``max_batch`` requests of ``max_q`` rows."""
        return ForwardPlan(self, max_batch=max_batch, max_q=max_q, num_splits=num_splits,
                           mask_format=mask_format, name=name, attention=attention)

    def __repr__(self):
        c = self.config
        return (f"<MLAModel vocab={c.vocab_size} heads={c.num_heads} d_model={c.d_model} seed={c.seed} "
                f"{self.arch} pdl={self.pdl} weights={self.weight_bytes / 2**20:.1f} MiB>")


class ForwardPlan:
    """The target forward for one shape class: buffers, attention plan and packed launches.

    Parameters
    ----------
    model : MLAModel
    max_batch, max_q : int
        Most requests and rows (draft tokens) per request of one call; ``max_rows =
        max_batch * max_q``.
    num_splits : int, optional
        Cap on the verify attention's split-KV pieces per (request, row tile) pair; default
        None (its scheduler kernel splits each step's work on the GPU).
    mask_format : {"bitmask", "causal", "full", "qlen_only"}
    name : str
        Prefix of the pool labels.
    attention : VerifyAttention, optional
        Use this plan instead of creating one (it must match ``num_heads`` and the maxima).

    Attributes
    ----------
    attention : VerifyAttention
    pool : WorkspacePool
        ``e`` bf16 ``[max_rows, d_model]``, ``q`` bf16 ``[max_rows, H, 576]``,
        ``attn`` bf16 ``[max_rows, H, 512]``, ``h`` bf16 ``[max_rows, d_model]``, and
        ``splitk`` float32 (the split-K workspace of the GEMMs with few output tiles:
        ``k_splits * max_rows * n`` for the largest, see :func:`gemm_schedule`).
    workspace_bytes : int
        This plan's pool plus the attention's split-KV workspace.

    Notes
    -----
    A plan is a :class:`~driverlevel.interfaces.TargetForward`: ``plan(stream, buffers)``
    with a :class:`~driverlevel.interfaces.TargetBuffers`. Launches are packed on the first call and
    reused while the buffers stay the same.
    """

    def __init__(self, model: MLAModel, *, max_batch: int, max_q: int, num_splits: int | None = None, mask_format="bitmask",
                 name: str = "target", attention=None):
        from ..verify_attention import VerifyAttention

        self.model = model
        self.device = model.device
        for pname, v in (("max_batch", max_batch), ("max_q", max_q), ("num_splits", 1 if num_splits is None else num_splits)):
            positive_int(pname, v)
        self.max_batch, self.max_q = int(max_batch), int(max_q)
        self.max_rows = self.max_batch * self.max_q
        c = model.config
        H, D = c.num_heads, c.d_model
        if attention is None:
            attention = VerifyAttention(self.device, H, max_batch=self.max_batch, max_q=self.max_q,
                                        num_splits=num_splits, sm_scale=c.sm_scale, mask_format=mask_format,
                                        pdl=model.pdl, name=f"{name}.attention")
        elif attention.num_heads != H or attention.max_batch < self.max_batch or attention.max_q < self.max_q:
            raise ValueError(f"attention plan {attention!r} does not cover {H} heads, batch {self.max_batch}, "
                             f"{self.max_q} rows per request")
        self.attention = attention
        R = self.max_rows
        sms = self.device.sm_count
        ws = max([1] + [gemm_workspace_elems(R, n, k, sms, model.gemm_ctas) for n, k in
                        ((H * QK_DIM, D), (QK_DIM, D), (D, H * V_DIM), (c.vocab_size, D))])
        specs = [((R, D), bfloat16), ((R, H, QK_DIM), bfloat16), ((R, H, V_DIM), bfloat16), ((R, D), bfloat16),
                 ((ws,), np.float32)]
        self.pool = WorkspacePool.allocate(self.device, WorkspacePool.required_bytes(specs), label=f"{name}.forward")
        self.e = self.pool.carve("e", (R, D), bfloat16)
        self.q = self.pool.carve("q", (R, H, QK_DIM), bfloat16)
        self.attn = self.pool.carve("attn", (R, H, V_DIM), bfloat16)
        self.h = self.pool.carve("h", (R, D), bfloat16)
        self.splitk = self.pool.carve("splitk", (ws,), np.float32)
        self._key = None
        self._launches = None
        self._attn_args = None

    @property
    def workspace_bytes(self) -> int:
        return self.pool.capacity + self.attention.pool.capacity

    @property
    def pools(self) -> list:
        """This plan's pool and its attention's (the ``pools`` member of
        :class:`~driverlevel.interfaces.TargetForward`)."""
        return [self.pool, self.attention.pool]

    def check_errors(self) -> None:
        """Raise :class:`~driverlevel.MetadataError` if the verify attention found bad per-step
        metadata since the last check (:meth:`VerifyAttention.check_errors`; the ``check_errors``
        member of :class:`~driverlevel.interfaces.TargetForward`)."""
        self.attention.check_errors()

    def prepare(self, input_ids, positions, metadata, kv_cache, logits=None, num_rows=None, *,
                stop_after: str = "logits"):
        """Pack the launches of one forward bound to these buffers (host only, no launch).

        Parameters
        ----------
        input_ids : int32 or int64 ``[max_rows]``
        positions : int32 or int64 ``[max_rows]``
        metadata : VerifyMetadata or dict
            ``qo_indptr`` (int64 ``[bs + 1]``), ``kv_indptr``, ``kv_indices``,
            ``out_cache_loc`` (int64 ``[max_rows]``), ``custom_mask``/``mask_indptr`` per the
            attention plan's mask format.
        kv_cache : bf16 ``[num_slots, 576]``
        logits : float32 ``[max_rows, vocab]`` (needed when ``stop_after="logits"``)
        num_rows : int64 device scalar, optional
            Rows of this call (default: ``qo_indptr[bs]``, read on the device).
        stop_after : {"logits", "hidden", "attention"}
            ``"attention"`` stops once the latent KV is written and attended (a prefill of a
            one-layer model needs no more); ``"hidden"`` leaves the residual stream in
            :attr:`h` (bf16 ``[max_rows, d_model]``) for a caller's own LM head.
        """
        if stop_after not in ("logits", "hidden", "attention"):
            raise ValueError(f"stop_after must be 'logits', 'hidden' or 'attention', got {stop_after!r}")
        m = self.model
        dev = self.device
        R = self.max_rows
        H = m.config.num_heads
        get = (lambda k: metadata.get(k)) if isinstance(metadata, dict) else (lambda k: getattr(metadata, k, None))
        qo = _dev_array("qo_indptr", get("qo_indptr"), dev)
        _need("qo_indptr", qo, ("int64",), 1)
        if num_rows is None:
            num_rows = qo[qo.shape[0] - 1:]
        loc = _dev_array("out_cache_loc", get("out_cache_loc"), dev)
        _need("out_cache_loc", loc, ("int64",), 1)
        if loc.shape[0] != R:
            raise ValueError(f"out_cache_loc must have max_rows={R} entries, got {loc.shape}")
        if stop_after == "logits" and logits is None:
            raise ValueError("logits is required unless stop_after is 'hidden' or 'attention'")
        kv = _dev_array("kv_cache", kv_cache, dev)
        ws = self.splitk
        launches = [
            m.embed_launch(input_ids, positions, self.e, m_max=R, num_rows=num_rows),
            # q and the latent KV (scattered to out_cache_loc) from the same rows, in one launch
            m.gemm_pair(dict(a=self.e, b=m.w_q, c=self.q.reshape(R, H * QK_DIM), m_max=R, num_rows=num_rows, workspace=ws),
                        dict(a=self.e, b=m.w_kv, c=kv, m_max=R, c_index=loc, num_rows=num_rows, workspace=ws)),
        ]
        attn_args = (self.q, kv, metadata, self.attn)
        tail = []
        if stop_after != "attention":
            tail.append(m.gemm(self.attn.reshape(R, H * V_DIM), m.w_o, self.h, m_max=R, residual=self.e, num_rows=num_rows,
                               workspace=ws))
        if stop_after == "logits":
            tail.append(m.gemm(self.h, m.w_lm, logits, m_max=R, num_rows=num_rows, workspace=ws))
        self._launches = (launches, tail)
        self._attn_args = attn_args
        return self

    def run(self, stream) -> None:
        """Launch the prepared forward on ``stream`` (capture-safe)."""
        if self._launches is None:
            raise RuntimeError("ForwardPlan.run() before prepare(): call prepare() (or plan(stream, buffers)) first")
        head, tail = self._launches
        for ln in head:
            ln.launch(stream)
        q, kv, meta, attn = self._attn_args
        self.attention.run(stream, q, kv, meta, attn)
        for ln in tail:
            ln.launch(stream)

    def bind(self, buffers) -> "ForwardPlan":
        """Pack the launches for a :class:`driverlevel.interfaces.TargetBuffers` (no launch; idempotent)."""
        key = buffers.key()
        if key != self._key:
            self.prepare(buffers.input_ids, buffers.positions, buffers.metadata, buffers.kv_cache, buffers.logits,
                         buffers.num_rows, stop_after="logits" if buffers.logits is not None else "attention")
            self._key = key
        return self

    def __call__(self, stream, buffers) -> None:
        """Launch the forward on ``buffers`` (:class:`driverlevel.interfaces.TargetForward`)."""
        self.bind(buffers)
        self.run(stream)
