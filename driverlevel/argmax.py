"""The package's one greedy argmax over rows of logits (float32 or bfloat16).

Pairs with ``cu/argmax.cu`` (kernels ``argmax_rows_f32`` / ``argmax_rows_bf16``, launched by
:func:`argmax_rows_launch`; ``ArgmaxParams`` mirrored here by :class:`_ArgmaxParams`, its
layout checked at compile time). Its callers: :meth:`driverlevel.ddtree.DDTreePlan.accept`
(the target's argmax per draft node), the :class:`~driverlevel.runner.AutoregressiveRunner`
(the next token of every request, each step) and the demo model's successor table
(:mod:`driverlevel.demo.mla_model`).

One rule for every argmax and top-K of the package (``cu/logit_keys.cuh``): NaN counts as
-inf, equal values go to the lower id, ids are always in ``[0, vocab)``, and a row with
nothing above -inf is "not finite".

Two outputs, either or both:

- ``part`` uint64 ``[>= m_max]``: row ``r``'s largest composite ``(order key << 32) | ~id``,
  folded in with a 64-bit ``atomicMax`` by every warp that reads a piece of the row (the row
  is split so that the read spreads over the whole GPU). ``part`` must hold 0 before the
  launch; the consumer reads it and clears it (``ddtree_accept``, ``ar_commit``). Decoded by
  :func:`decode_part`: 0 means not finite (token 0); otherwise the token is ``~low 32 bits``.
- ``index`` int32 ``[>= m_max]``: the token itself (0 for a row that is not finite); one warp
  then reads a whole row (no split).

Example
-------
>>> import numpy as np, driverlevel as dl                              # doctest: +SKIP
>>> from driverlevel.argmax import argmax_rows_launch  # doctest: +SKIP
>>> dev = dl.Device(0); s = dev.create_stream()  # doctest: +SKIP
>>> x = dl.DeviceBuffer.allocate(dev, 4 * 8 * 1000).as_array((8, 1000), np.float32)  # doctest: +SKIP
>>> idx = dl.DeviceBuffer.allocate(dev, 4 * 8).as_array((8,), np.int32)  # doctest: +SKIP
>>> argmax_rows_launch(dev, x, index=idx, m_max=8).launch(s)  # doctest: +SKIP
"""

from __future__ import annotations

import ctypes

import numpy as np

from ._checks import bool_arg, device_array_arg, need_dtype, positive_int
from ._compile import CompileVariant, compile_file, normalize_arch
from ._device import _check_device_arg
from ._dtypes import bfloat16
from ._module import Module, PreparedLaunch, check_pdl_arg, load_module, programmatic_supported, struct_layout_defines

__all__ = ["SOURCE", "KERNELS", "THREADS", "MAX_ROW_LEN", "argmax_rows_launch", "argmax_layout", "decode_part", "compile_defines",
           "dynamic_shared_bytes", "compile_variants", "load"]

SOURCE = "argmax.cu"
#: The kernels of :data:`SOURCE` by logits dtype name.
KERNELS = {"float32": "argmax_rows_f32", "bfloat16": "argmax_rows_bf16"}
#: Threads per CTA (8 warps; one warp per work item). Passed to the kernel as ``DL_ARGMAX_THREADS``.
THREADS = 256
#: Tokens of one work item are a multiple of this (a warp: 32 lanes x 4 16-byte loads of bf16).
GRAIN = 1024
#: The grid is at most this many CTAs per SM.
CTAS_PER_SM = 4


class _ArgmaxParams(ctypes.Structure):
    """ctypes mirror of ``ArgmaxParams`` in cu/argmax.cu."""

    _fields_ = [
        ("x", ctypes.c_uint64), ("m_ptr", ctypes.c_uint64), ("part", ctypes.c_uint64), ("index", ctypes.c_uint64),
        ("m_max", ctypes.c_int64), ("ld", ctypes.c_int64), ("n", ctypes.c_int32), ("vec", ctypes.c_int32),
        ("splits", ctypes.c_int32), ("split_len", ctypes.c_int32),
    ]


def compile_defines(arch) -> dict:
    """NVRTC defines of ``cu/argmax.cu``: the ``ArgmaxParams`` layout (checked by static_assert)
    and ``DL_ARGMAX_THREADS``."""
    normalize_arch(arch)
    d = struct_layout_defines(_ArgmaxParams)
    d["DL_ARGMAX_THREADS"] = THREADS
    return d


def dynamic_shared_bytes(arch) -> dict:
    """None of the kernels takes dynamic shared memory."""
    normalize_arch(arch)
    return {}


def compile_variants(arch) -> list[CompileVariant]:
    """The one way ``cu/argmax.cu`` is compiled on ``arch`` (no dynamic shared memory)."""
    return [CompileVariant(compile_defines(arch), dynamic_shared_bytes(arch))]


def load(device, arch=None) -> Module:
    """Compile ``cu/argmax.cu`` for ``device`` (or ``arch``) and load it.

    Raises
    ------
    NvrtcError, CudaError
        If it does not compile or load.
    """
    device = _check_device_arg(device)
    arch = normalize_arch(arch or device.arch)
    return load_module(device, compile_file(SOURCE, arch, compile_defines(arch)))


#: Longest row (vocabulary) the argmax kernels take: their per-row offsets are 32-bit ints, and the start,
#: end and unrolled bounds of a split must stay below 2**31.
MAX_ROW_LEN = 2**30


def argmax_layout(vocab: int, max_rows: int, sm_count: int, *, split: bool = True) -> tuple:
    """``(split_len, splits, grid)`` of an ``argmax_rows_*`` launch.

    One warp reduces one (row, split) work item of ``split_len`` tokens (a multiple of
    :data:`GRAIN`) and folds it into the row's maximum with one 64-bit ``atomicMax``; the
    grid's at most ``CTAS_PER_SM * sm_count`` CTAs of 8 warps stride over the items. The split
    gives about four items per warp when all ``max_rows`` rows are computed, so the read of the
    logits is spread over the whole GPU whatever the row count. ``split=False``: one item per
    row (``splits = 1``, as the ``index`` output needs).

    Raises
    ------
    TypeError
        For a ``vocab``, ``max_rows`` or ``sm_count`` that is not an int (bools and floats
        included), or a ``split`` that is not a bool.
    ValueError
        For a ``vocab``, ``max_rows`` or ``sm_count`` below 1, or a ``vocab`` above
        :data:`MAX_ROW_LEN` (2**30: the kernels index a row with 32-bit ints).
    """
    vocab, max_rows = positive_int("vocab", vocab), positive_int("max_rows", max_rows)
    if vocab > MAX_ROW_LEN:  # (start + split_len and the unrolled loop's bound would wrap past 2**31)
        raise ValueError(f"vocab (the row length) must be <= {MAX_ROW_LEN:,} (2**30), got {vocab:,}: the argmax "
                         f"kernels index a row with 32-bit ints")
    sm_count, split = positive_int("sm_count", sm_count), bool_arg("split", split)
    warps_per_cta = THREADS // 32
    warps = CTAS_PER_SM * sm_count * warps_per_cta
    splits = max(1, min(-(-4 * warps // max_rows), -(-vocab // GRAIN))) if split else 1
    split_len = -(-(-(-vocab // splits)) // GRAIN) * GRAIN
    splits = -(-vocab // split_len)
    grid = max(1, min(CTAS_PER_SM * sm_count, -(-max_rows * splits // warps_per_cta)))
    return split_len, splits, grid


def decode_part(part) -> tuple[np.ndarray, np.ndarray]:
    """``(tokens int32, finite bool)`` of host uint64 composites as the kernels write ``part``
    (the host twin of ``argmax_token`` / ``argmax_finite`` in ``cu/logit_keys.cuh``).

    Raises
    ------
    TypeError
        ``part`` is not integers (floats, bools, strings, None; a :class:`~driverlevel.DeviceArray`:
        copy it first, ``part.to_numpy(stream)``): a float would be truncated into a composite.
    ValueError
        A negative value (a composite is a uint64), or a nonzero one whose low word is not the
        complement of a token id >= 0 (no kernel writes it).
    """
    c = np.asarray(part)
    if c.dtype.kind not in "iu" and not (c.size == 0 and c.dtype.kind == "f"):  # ([] is float64)
        raise TypeError(f"decode_part: part must hold the uint64 composites the kernels write (an integer "
                        f"array, e.g. part.to_numpy(stream)), got dtype {c.dtype}")
    if c.dtype.kind == "i" and c.size and int(c.min()) < 0:
        raise ValueError(f"decode_part: part must hold the uint64 composites the kernels write, got a negative "
                         f"value {int(c.min())}")
    c = c.astype(np.uint64)
    finite = c != 0
    ids = (~(c & np.uint64(0xFFFFFFFF))) & np.uint64(0xFFFFFFFF)
    bad = finite & (ids > np.uint64(np.iinfo(np.int32).max))
    if np.any(bad):  # (its low word is ~id of an int32 id: 0x80000000 or more; 1 would be token -2)
        raise ValueError(f"decode_part: part must hold the uint64 composites the kernels write (low word ~id of "
                         f"a token id >= 0), got {int(c[bad].flat[0]):#x}")
    return np.where(finite, ids, 0).astype(np.int32), finite


def _is_bf16(a) -> bool:
    return a.dtype is bfloat16 or a.dtype.name == "uint16"


def argmax_rows_launch(device, x, *, m_max: int, part=None, index=None, num_rows=None,
                       module: Module | None = None, programmatic: bool | None = None) -> PreparedLaunch:
    """A prepared ``argmax_rows_{f32,bf16}`` launch over the rows of ``x`` (capture-safe to launch).

    Parameters
    ----------
    device : Device or int
    x : float32 or bfloat16 ``[>= m_max, n]``, C-contiguous, on ``device``
        Logits (any units; only the order matters). bfloat16 may also be given as uint16 bit
        patterns.
    m_max : int
        Rows the grid is sized for.
    part : uint64 ``[>= m_max]``, optional
        Receives each row's largest ``(order key << 32) | ~id`` composite through ``atomicMax``:
        must hold 0 before the launch (the consumer clears it); 0 after it means the row had
        nothing above -inf. See :func:`decode_part`.
    index : int32 ``[>= m_max]``, optional
        Receives each row's argmax (the first index of the maximum; 0 for a row with nothing
        above -inf). One warp reads a whole row (no split).
    num_rows : int64 device scalar (``[1]``), optional
        Rows computed = ``min(m_max, max(num_rows, 0))``, read on the device each launch (e.g.
        ``qo_indptr[bs:]``); default ``m_max``.
    module : Module, optional
        ``cu/argmax.cu`` already loaded on ``device`` (default: :func:`load` it).
    programmatic : bool, optional
        A programmatic dependent launch (:meth:`~driverlevel.runtime.Kernel.prepare`): the
        kernels wait at their entry before anything else (``dl::pdl_enter``), so its launch may
        overlap the tail of any kernel before it. None (default): where the module's code is
        sm_90 or newer; True below sm_90 raises ``ValueError``, anything but None, True or
        False ``TypeError`` (before the device is opened). (The plans and runners call the same
        choice ``pdl=``.)

    Returns
    -------
    PreparedLaunch
        Holds ``x``, ``part``, ``index`` and ``num_rows`` alive.

    Raises
    ------
    TypeError, ValueError
        Wrong dtype, device, layout, too few rows, or neither ``part`` nor ``index``, naming the
        argument; ``ValueError`` also for a read-only ``part`` or ``index`` (written) and for rows
        longer than :data:`MAX_ROW_LEN`.
    """
    check_pdl_arg(programmatic, "programmatic")  # (before the device is opened)
    device = _check_device_arg(device)
    m_max = positive_int("m_max", m_max)
    x = device_array_arg("x", x, device)
    bf16 = _is_bf16(x)
    if not bf16:
        need_dtype("x", x, "float32")
    if x.ndim != 2:
        raise ValueError(f"x must be 2-D, got shape {x.shape}")
    if x.shape[0] < m_max:
        raise ValueError(f"x needs >= m_max={m_max} rows, got shape {x.shape}")
    if part is None and index is None:
        raise ValueError("pass part, index or both: the launch would write nothing")
    if part is not None:
        part = device_array_arg("part", part, device, writable=True)
        need_dtype("part", part, "uint64")
        if part.ndim != 1 or part.size < m_max:
            raise ValueError(f"part must be 1-D with >= m_max={m_max} entries, got shape {part.shape}")
    if index is not None:
        index = device_array_arg("index", index, device, writable=True)
        need_dtype("index", index, "int32")
        if index.ndim != 1 or index.size < m_max:
            raise ValueError(f"index must be 1-D with >= m_max={m_max} entries, got shape {index.shape}")
    if num_rows is not None:
        num_rows = device_array_arg("num_rows", num_rows, device)
        need_dtype("num_rows", num_rows, "int64")
        if num_rows.size != 1:
            raise ValueError(f"num_rows must hold one int64 (e.g. qo_indptr[bs:]), got shape {num_rows.shape}")
    if module is None:
        module = load(device)
    n = x.shape[1]
    split_len, splits, grid = argmax_layout(n, m_max, device.sm_count, split=index is None)
    vec = 8 if bf16 else 4
    p = _ArgmaxParams()
    p.x, p.m_ptr = x.ptr, 0 if num_rows is None else num_rows.ptr
    p.part, p.index = 0 if part is None else part.ptr, 0 if index is None else index.ptr
    p.m_max, p.ld, p.n = m_max, n, n
    p.vec = int(x.ptr % 16 == 0 and n % vec == 0)
    p.splits, p.split_len = splits, split_len
    kern = module.kernel(KERNELS["bfloat16" if bf16 else "float32"])
    if programmatic is None:
        programmatic = programmatic_supported(kern.module.cubin.arch)
    ln = kern.prepare((grid, 1, 1), THREADS, [p], programmatic=programmatic)
    ln.keep(x, part, index, num_rows)
    return ln
