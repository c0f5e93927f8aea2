"""driverlevel: verify attention for MLA draft trees and the DDTree decode loop as CUDA graphs.

Example (needs a GPU; not run by the tests: ``examples/sglang_metadata.py``, which
``tests/test_demo_gpu.py`` runs on GPUs, is the tested program closest to it). One
request with 100 cached tokens and a draft tree of 4 tokens (token 0 the root, 1 and 2
its children, 3 a child of 1), 16 query heads, verified by a captured graph:

>>> import numpy as np                                                     # doctest: +SKIP
>>> import driverlevel as dl                                               # doctest: +SKIP
>>> dev = dl.Device(0)                                                     # doctest: +SKIP
>>> stream = dev.create_stream()                                           # doctest: +SKIP
>>> H, prefix, n = 16, 100, 4                                              # doctest: +SKIP
>>> plan = dl.VerifyAttention(dev, H, max_batch=1, max_q=n)  # compiles, sizes its workspace  # doctest: +SKIP
>>> pool = dl.WorkspacePool.allocate(dev, 1 << 20, label="inputs")         # doctest: +SKIP
>>> def put(name, host):  # a device copy of a host array, carved from the pool   # doctest: +SKIP
...     return pool.carve(name, host.shape, host.dtype).copy_from_host(host)
>>> meta = dl.VerifyMetadata(                                              # doctest: +SKIP
...     qo_indptr=put("qo_indptr", np.array([0, n], np.int64)),
...     kv_indptr=put("kv_indptr", np.array([0, prefix], np.int32)),
...     kv_indices=put("kv_indices", np.arange(prefix, dtype=np.int64)),  # cache slot of each prefix token
...     out_cache_loc=put("out_cache_loc", np.arange(prefix, prefix + n, dtype=np.int64)),
...     # uint32 [n, 1]: bit j of row i is set iff draft token j is i or an ancestor of i
...     custom_mask=put("custom_mask", np.array([[0b1], [0b11], [0b101], [0b1011]], np.uint32)))
>>> q = pool.carve("q", (n, H, 576), dl.bfloat16)                           # doctest: +SKIP
>>> kv = pool.carve("kv_cache", (prefix + n, 576), dl.bfloat16)             # doctest: +SKIP
>>> out = pool.carve("out", (n, H, 512), dl.bfloat16)                       # doctest: +SKIP
>>> lse = pool.carve("lse", (n, H), np.float32)                             # doctest: +SKIP
>>> _ = q.copy_from_host(np.full(q.shape, 0x3F80, np.uint16))  # bf16 as uint16 bits: 1.0  # doctest: +SKIP
>>> _ = kv.copy_from_host(np.full(kv.shape, 0x3F80, np.uint16))             # doctest: +SKIP
>>> with dl.capture(stream) as cap:  # recorded, not run                    # doctest: +SKIP
...     plan.run(stream, q, kv, meta, out, lse)
>>> step = cap.graph.instantiate(upload_stream=stream)                      # doctest: +SKIP
>>> step.launch(stream)  # one cuGraphLaunch per decode step                # doctest: +SKIP
>>> plan.check_errors(stream)  # raises MetadataError if a kernel found bad metadata  # doctest: +SKIP
>>> out.to_numpy(stream).shape  # uint16 bf16 bits                          # doctest: +SKIP
(4, 16, 512)

Between replays, write the next step's queries, lengths, slots and mask into the same
device arrays and launch again: the kernels read them from device memory, so one graph
serves every step. :class:`DecodeStepRunner` captures the whole DDTree step (draft, tree
build, tree compile, target forward, accept, commit) the same way.

Kernels in ``cu/`` are compiled by NVRTC to cubin for the GPU's exact
architecture, launched through the CUDA driver API (``cuda.bindings``), and
captured into CUDA graphs over preallocated workspace pools. No PyTorch at run
time.

The root holds the product API (``__all__``): the device objects users pass around
(:class:`Device`, :class:`Stream`, :class:`Event`, :class:`DeviceArray`,
:class:`DeviceBuffer`, :class:`PinnedHostBuffer`, :class:`WorkspacePool`, :data:`bfloat16`),
:func:`capture`, :func:`compile_source` and :func:`load_module` for a kernel of one's own,
the plans (:class:`VerifyAttention`, :class:`VerifyMetadata`, :class:`DDTreePlan`,
:class:`RequestState`, :class:`DecodeStepRunner`, :class:`AutoregressiveRunner`) and the
errors to catch. The rest stays public through submodules: :mod:`driverlevel.runtime`
(the whole driver and NVRTC layer: ``Graph``, ``GraphExec``, ``Module``, ``Kernel``,
``PreparedLaunch``, ``compile_file``, ``as_device_array``, ``release_deferred``, ...),
:mod:`driverlevel.interfaces` (the runner's plug-in protocols :class:`TargetForward`,
:class:`TargetBuffers`, :class:`TargetModel`, :class:`DraftModel`), and ``verify_attention``,
``ddtree``, ``runner``, ``request_state``, ``argmax`` and the modules of ``reference``
(``reference.attention``, ``reference.ddtree``, ...) through their ``__all__``; modules named
``_*`` are private. The demo (a small MLA model, its drafter,
``driverlevel capture-demo``, one graph per GPU) lives apart in :mod:`driverlevel.demo`:
nothing in the core imports it; it plugs into the runner through the protocols of
:mod:`driverlevel.interfaces`, as any other runtime does.
"""

from ._compile import UnsupportedTargetError
from ._dtypes import bfloat16
from ._errors import (CaptureError, CudaError, DriverUnavailableError, GraphUpdateError, MetadataError, NvrtcError,
                      PoolExhaustedError)
from .ddtree import DDTreePlan
from .request_state import RequestState
from .runner import AutoregressiveRunner, DecodeStepRunner
from .runtime import (Device, DeviceArray, DeviceBuffer, Event, PinnedHostBuffer, Stream, WorkspacePool, capture,
                      compile_source, device_count, load_module)
from .verify_attention import VerifyAttention, VerifyMetadata

__version__ = "0.1.0"

__all__ = [
    # devices, streams and memory
    "Device", "device_count", "Stream", "Event",
    "DeviceArray", "DeviceBuffer", "PinnedHostBuffer", "WorkspacePool", "bfloat16",
    # graphs and kernels of one's own
    "capture", "compile_source", "load_module",
    # verify attention, DDTree, the decode-step runners
    "VerifyAttention", "VerifyMetadata", "DDTreePlan", "RequestState", "DecodeStepRunner", "AutoregressiveRunner",
    # errors
    "CudaError", "DriverUnavailableError", "NvrtcError", "UnsupportedTargetError", "CaptureError", "GraphUpdateError",
    "PoolExhaustedError", "MetadataError",
]
