"""The driver and NVRTC layer, public: devices, streams, memory, arrays, compilation, modules, graphs.

Everything the private modules ``_device``, ``_stream``, ``_memory``, ``_array``, ``_dtypes``,
``_compile``, ``_module`` and ``_graph`` list in their ``__all__`` is re-exported here, so that code
beyond the product API (its own kernels, launch argument packing, graph audits, the cubin
cache, the deferred-release bookkeeping) has one supported import path:

>>> from driverlevel.runtime import Graph, GraphExec, compile_file, kernel_sources  # doctest: +SKIP
>>> import driverlevel.runtime as rt                                                 # doctest: +SKIP
>>> rt.nvrtc_version(), rt.driver_version()                                          # doctest: +SKIP

The handful of these names a user of the verify and decode-step plans passes around
(``Device``, ``Stream``, ``Event``, ``DeviceArray``, ``DeviceBuffer``, ``PinnedHostBuffer``,
``WorkspacePool``, ``capture``, ``compile_source``, ``load_module``, ``device_count``) are
also at the root of :mod:`driverlevel`; they are the same objects. The error classes are at
the root only (``driverlevel.CudaError``, ...), ``bfloat16`` too.

What lives where
----------------
devices (``_device``)
    :class:`Device`, :class:`DeviceProperties`, :func:`device_count`, :func:`driver_version`,
    :func:`init_driver`, :func:`gpu_usable`, :func:`require_gpu`, :data:`NO_GPU_MESSAGE`,
    :data:`NO_GPU_EXIT_STATUS`.
streams (``_stream``)
    :class:`Stream`, :class:`Event`.
memory (``_memory``)
    :class:`DeviceBuffer`, :class:`PinnedHostBuffer`, :class:`WorkspacePool`, :class:`Carve`,
    :class:`PointerOwner`, :func:`lookup_pointer`, :func:`align_up`, :func:`release_deferred`,
    :func:`deferred_count`.
arrays (``_array``)
    :class:`DeviceArray`, :func:`as_device_array` (any ``__cuda_array_interface__`` or
    DLPack array, without a copy).
element types (``_dtypes``)
    :data:`bfloat16` (also at the root), :func:`as_dtype`, :func:`dtype_name`,
    :func:`storage_dtype`, and the host-side bf16 conversions :func:`f32_to_bf16_bits`
    (float32 to bf16 bit patterns, round to nearest even) and :func:`bf16_bits_to_f32`.
compilation (``_compile``)
    :class:`Cubin`, :class:`KernelResources`, :class:`CompileVariant`, :func:`compile_source`,
    :func:`compile_file` (a file of the package's ``cu/``), :func:`kernel_sources`,
    :func:`kernel_source_dir`, :func:`nvrtc_version`, :func:`normalize_arch`,
    :func:`check_arch`, :func:`cache_dir`, :func:`lineinfo_requested`, :data:`SUPPORTED_ARCHS`,
    :data:`MAX_SHARED_PER_BLOCK`.
modules and launches (``_module``)
    :class:`Module`, :class:`Kernel`, :class:`PreparedLaunch`, :func:`load_module`,
    :func:`struct_layout_defines`.
graphs (``_graph``)
    :func:`capture`, :class:`CaptureSession`, :class:`Graph`, :class:`GraphExec`,
    :class:`KernelNodeInfo`, :class:`PointerArg`.
"""

from __future__ import annotations

from ._array import DeviceArray, as_device_array
from ._dtypes import as_dtype, bf16_bits_to_f32, bfloat16, dtype_name, f32_to_bf16_bits, storage_dtype
from ._compile import (MAX_SHARED_PER_BLOCK, SUPPORTED_ARCHS, CompileVariant, Cubin, KernelResources, cache_dir,
                       check_arch, compile_file, compile_source, kernel_source_dir, kernel_sources,
                       lineinfo_requested, normalize_arch, nvrtc_version)
from ._device import (NO_GPU_EXIT_STATUS, NO_GPU_MESSAGE, Device, DeviceProperties, device_count, driver_version,
                      gpu_usable, init_driver, require_gpu)
from ._graph import CaptureSession, Graph, GraphExec, KernelNodeInfo, PointerArg, capture
from ._memory import (Carve, DeviceBuffer, PinnedHostBuffer, PointerOwner, WorkspacePool, align_up, deferred_count,
                      lookup_pointer, release_deferred)
from ._module import Kernel, Module, PreparedLaunch, load_module, struct_layout_defines
from ._stream import Event, Stream

__all__ = [
    # devices
    "Device", "DeviceProperties", "device_count", "driver_version", "init_driver", "gpu_usable", "require_gpu",
    "NO_GPU_MESSAGE", "NO_GPU_EXIT_STATUS",
    # streams
    "Stream", "Event",
    # memory
    "DeviceBuffer", "PinnedHostBuffer", "WorkspacePool", "Carve", "PointerOwner", "lookup_pointer", "align_up",
    "release_deferred", "deferred_count",
    # arrays
    "DeviceArray", "as_device_array",
    # element types
    "bfloat16", "as_dtype", "dtype_name", "storage_dtype", "f32_to_bf16_bits", "bf16_bits_to_f32",
    # compilation
    "Cubin", "KernelResources", "CompileVariant", "compile_source", "compile_file", "kernel_sources",
    "kernel_source_dir", "nvrtc_version", "normalize_arch", "check_arch", "cache_dir", "lineinfo_requested",
    "SUPPORTED_ARCHS", "MAX_SHARED_PER_BLOCK",
    # modules and launches
    "Module", "Kernel", "PreparedLaunch", "load_module", "struct_layout_defines",
    # graphs
    "capture", "CaptureSession", "Graph", "GraphExec", "KernelNodeInfo", "PointerArg",
]
