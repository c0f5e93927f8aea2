"""driverlevel: verify attention for MLA draft trees and the DDTree decode loop as CUDA graphs.

Kernels in ``cu/`` are compiled by NVRTC to cubin for the GPU's exact
architecture, launched through the CUDA driver API (``cuda.bindings``), and
captured into CUDA graphs over preallocated workspace pools. No PyTorch at run
time.

The core API is re-exported here. The submodules without a leading underscore
(``verify_attention``, ``ddtree``, ``runner``, ``interfaces``, ``argmax``, ``reference``,
...) are public too, through their ``__all__`` (the README and ``examples/`` use them);
modules named ``_*`` are private. The demo (a small MLA model, its drafter,
``driverlevel capture-demo``, one graph per GPU) lives apart in :mod:`driverlevel.demo`:
nothing in the core imports it; it plugs into the runner through the protocols of
:mod:`driverlevel.interfaces` (:class:`TargetForward` over :class:`TargetBuffers`,
:class:`TargetModel`, :class:`DraftModel`), as any other runtime does.
"""

from ._array import DeviceArray, as_device_array
from ._compile import Cubin, KernelResources, compile_file, compile_source, kernel_sources, nvrtc_version
from ._device import Device, DeviceProperties, device_count, driver_version
from ._dtypes import bfloat16
from ._errors import (CaptureError, CudaError, DriverUnavailableError, GraphUpdateError, MetadataError, NvrtcError,
                      PoolExhaustedError)
from ._graph import Graph, GraphExec, KernelNodeInfo, capture
from ._memory import DeviceBuffer, PinnedHostBuffer, WorkspacePool, deferred_count, release_deferred
from ._module import Kernel, Module, PreparedLaunch, load_module
from ._stream import Event, Stream
from .ddtree import DDTreePlan, DDTreeState
from .interfaces import DraftModel, TargetBuffers, TargetForward, TargetModel
from .request_state import RequestState
from .runner import AutoregressiveRunner, DecodeStepRunner
from .verify_attention import VerifyAttention, VerifyMetadata

__version__ = "0.1.0"

__all__ = [
    "Device", "DeviceProperties", "device_count", "driver_version",
    "Stream", "Event",
    "DeviceArray", "as_device_array", "bfloat16",
    "DeviceBuffer", "PinnedHostBuffer", "WorkspacePool", "release_deferred", "deferred_count",
    "Cubin", "KernelResources", "compile_file", "compile_source", "kernel_sources", "nvrtc_version",
    "Module", "Kernel", "PreparedLaunch", "load_module",
    "capture", "Graph", "GraphExec", "KernelNodeInfo",
    "VerifyAttention", "VerifyMetadata",
    "DDTreePlan", "DDTreeState", "RequestState",
    "DecodeStepRunner", "AutoregressiveRunner", "TargetBuffers", "TargetForward", "TargetModel", "DraftModel",
    "CudaError", "DriverUnavailableError", "NvrtcError", "CaptureError", "GraphUpdateError", "PoolExhaustedError",
    "MetadataError",
]
