"""Greedy argmax over rows of float32 logits: the next token of an autoregressive step.

Pairs with ``cu/argmax.cu`` (kernel ``argmax_rows``; ``ArgmaxParams`` mirrored here by
:class:`_ArgmaxParams`, its layout checked at compile time). The
:class:`~driverlevel.runner.AutoregressiveRunner` launches it on the target's logits every
step; the demo model (:mod:`driverlevel.demo.mla_model`) uses it for its no-context
successor table.

One rule for non-finite values, the package's: NaN counts as -inf, the first index of the
maximum wins, and a row with nothing above -inf gives index 0 with ``top2[m, 0] = -inf``
(which tells the caller the row was not finite).

Example
-------
>>> import numpy as np, driverlevel as dl                              # doctest: +SKIP
>>> from driverlevel.argmax import argmax_launch
>>> dev = dl.Device(0); s = dev.create_stream()
>>> x = dl.DeviceBuffer.allocate(dev, 4 * 8 * 1000).as_array((8, 1000), np.float32)
>>> idx = dl.DeviceBuffer.allocate(dev, 4 * 8).as_array((8,), np.int32)
>>> argmax_launch(dev, x, idx, m_max=8).launch(s)
"""

from __future__ import annotations

import ctypes

from ._checks import device_array_arg, need_dtype, positive_int
from ._compile import CompileVariant, compile_file, normalize_arch
from ._device import _check_device_arg
from ._module import Module, PreparedLaunch, load_module, struct_layout_defines

__all__ = ["SOURCE", "KERNEL", "THREADS", "argmax_launch", "compile_defines", "dynamic_shared_bytes",
           "compile_variants", "load"]

SOURCE = "argmax.cu"
#: The kernel's name in :data:`SOURCE`.
KERNEL = "argmax_rows"
#: Threads per row (one CTA per row).
THREADS = 256


class _ArgmaxParams(ctypes.Structure):
    """ctypes mirror of ``ArgmaxParams`` in cu/argmax.cu."""

    _fields_ = [
        ("x", ctypes.c_uint64), ("m_ptr", ctypes.c_uint64), ("index", ctypes.c_uint64), ("top2", ctypes.c_uint64),
        ("m_max", ctypes.c_int64), ("n", ctypes.c_int32), ("ld", ctypes.c_int32),
    ]


def compile_defines(arch) -> dict:
    """NVRTC defines of ``cu/argmax.cu``: the ``ArgmaxParams`` layout, checked by static_assert."""
    normalize_arch(arch)
    return struct_layout_defines(_ArgmaxParams)


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


def argmax_launch(device, x, index, *, m_max: int, num_rows=None, top2=None, kernel=None) -> PreparedLaunch:
    """A prepared ``argmax_rows`` launch over the rows of ``x`` (capture-safe to launch).

    Parameters
    ----------
    device : Device or int
    x : float32 ``[>= m_max, n]``, C-contiguous, on ``device``
        Logits (any units; only the order matters).
    index : int32 ``[>= m_max]``
        Receives the first index of each row's maximum (NaN counts as -inf; a row with
        nothing above -inf gives 0, and its top2 maximum is -inf).
    m_max : int
        Rows of the grid (one CTA of :data:`THREADS` threads each).
    num_rows : int64 device scalar (``[1]``), optional
        Rows computed = ``min(m_max, num_rows)``, read on the device each launch (e.g.
        ``qo_indptr[bs:]``).
    top2 : float32 ``[>= m_max, 2]``, optional
        Receives each row's largest and second largest value (the top-1 margin).
    kernel : Kernel, optional
        ``argmax_rows`` of an already loaded module (default: :func:`load` it).

    Returns
    -------
    PreparedLaunch
        Holds ``x``, ``index``, ``top2`` and ``num_rows`` alive.

    Raises
    ------
    TypeError, ValueError
        Wrong dtype, device, layout or too few rows, naming the argument.
    """
    device = _check_device_arg(device)
    m_max = positive_int("m_max", m_max)
    x = device_array_arg("x", x, device)
    need_dtype("x", x, "float32")
    if x.ndim != 2:
        raise ValueError(f"x must be 2-D, got shape {x.shape}")
    index = device_array_arg("index", index, device)
    need_dtype("index", index, "int32")
    if index.size < m_max or x.shape[0] < m_max:
        raise ValueError(f"x and index need >= m_max={m_max} rows (x {x.shape}, index {index.shape})")
    if top2 is not None:
        top2 = device_array_arg("top2", top2, device)
        need_dtype("top2", top2, "float32")
        if top2.size < 2 * m_max:
            raise ValueError(f"top2 needs >= 2*m_max={2 * m_max} floats, got {top2.size}")
    if num_rows is not None:
        num_rows = device_array_arg("num_rows", num_rows, device)
        need_dtype("num_rows", num_rows, "int64")
        if num_rows.size != 1:
            raise ValueError(f"num_rows must hold one int64 (e.g. qo_indptr[bs:]), got shape {num_rows.shape}")
    if kernel is None:
        kernel = load(device).kernel(KERNEL)
    p = _ArgmaxParams()
    p.x, p.index = x.ptr, index.ptr
    p.m_ptr = 0 if num_rows is None else num_rows.ptr
    p.top2 = 0 if top2 is None else top2.ptr
    p.m_max, p.n, p.ld = m_max, x.shape[1], x.shape[1]
    ln = kernel.prepare((m_max, 1, 1), THREADS, [p])
    ln.keep(x, index, top2, num_rows)
    return ln
