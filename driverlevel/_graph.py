"""CUDA graphs: explicit stream capture, instantiate once, replay every step.

>>> with capture(stream) as cap:                 # doctest: +SKIP
...     plan.run(stream, ...)                     # kernels are recorded, not run
>>> graph_exec = cap.graph.instantiate()          # doctest: +SKIP
>>> graph_exec.launch(stream)                     # doctest: +SKIP

A :class:`Graph` keeps alive every kernel, prepared argument block, buffer and
pool that driverlevel launches recorded into it; a :class:`GraphExec` keeps its
graph alive. Handles are released exec first, then graph, then the memory they
point into. :meth:`Graph.kernel_nodes` lists the captured kernel nodes with the
pool and carve-out each pointer argument lies in: the audit that shows there was
no silent fallback and no stray pointer.
"""

from __future__ import annotations

import contextlib
import ctypes
import weakref
from dataclasses import dataclass, field

from cuda.bindings import driver

from . import _capture_guard
from ._errors import CaptureError, GraphUpdateError, check, raise_cuda
from ._memory import lookup_pointer

__all__ = ["capture", "CaptureSession", "Graph", "GraphExec", "KernelNodeInfo", "PointerArg"]

_MODES = {
    "global": driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL,
    "thread_local": driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
    "relaxed": driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED,
}


def _destroy_graph(handle):
    try:
        driver.cuGraphDestroy(handle)
    except Exception:
        pass


def _destroy_exec(handle):
    try:
        driver.cuGraphExecDestroy(handle)
    except Exception:
        pass


class CaptureSession:
    """State of one stream capture; after the ``with`` block, :attr:`graph` holds the result."""

    def __init__(self, stream, mode):
        self.stream = stream
        self.mode = mode
        self.graph: Graph | None = None
        self._kept: list = []

    def _keep(self, obj) -> None:
        self._kept.append(obj)

    def keep_alive(self, *objs) -> None:
        """Tie ``objs`` (buffers, pools, foreign arrays…) to the lifetime of the captured graph."""
        self._kept.extend(objs)


@contextlib.contextmanager
def capture(stream, mode: str = "thread_local"):
    """Capture the work queued on ``stream`` inside the block into a :class:`Graph`.

    Parameters
    ----------
    stream : Stream
        A non-default stream of driverlevel (or one borrowed with ``Stream.from_handle``).
    mode : {"thread_local", "global", "relaxed"}
        CUDA's capture mode. ``thread_local`` (default) lets other threads keep
        working, and capture on several threads at once.

    Yields
    ------
    CaptureSession
        Its ``graph`` attribute is set when the block exits normally.

    Raises
    ------
    CaptureError
        If the capture was invalidated (e.g. by a prohibited call made through
        another library), or the stream is already capturing.
    """
    if mode not in _MODES:
        raise ValueError(f"capture mode must be one of {sorted(_MODES)}, got {mode!r}")
    if int(stream.handle) == 0:
        raise CaptureError("the legacy default stream cannot be captured: use Device.create_stream()")
    if getattr(stream, "_capture", None) is not None:
        raise CaptureError("this stream is already being captured")
    session = CaptureSession(stream, mode)
    stream.device.set_current()
    check("cuStreamBeginCapture", driver.cuStreamBeginCapture(stream.handle, _MODES[mode]))
    stream._capture = session
    _capture_guard.register(id(session), int(stream.handle), mode)
    try:
        yield session
    except BaseException:
        _capture_guard.unregister(id(session))
        stream._capture = None
        err, g = driver.cuStreamEndCapture(stream.handle)
        if err == driver.CUresult.CUDA_SUCCESS and g is not None and int(g):
            _destroy_graph(g)
        raise
    _capture_guard.unregister(id(session))
    stream._capture = None
    err, g = driver.cuStreamEndCapture(stream.handle)
    if err != driver.CUresult.CUDA_SUCCESS:
        if g is not None and int(g):
            _destroy_graph(g)
        if err == driver.CUresult.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED:
            raise CaptureError("the stream capture was invalidated by a prohibited call during capture "
                               "(an allocation, synchronization or host copy through another library?)")
        raise_cuda("cuStreamEndCapture", err)
    session.graph = Graph._from_handle(g, stream.device, session._kept)


@dataclass(frozen=True)
class PointerArg:
    """A pointer found among a kernel node's arguments.

    Attributes
    ----------
    param : int
        Index of the kernel parameter.
    offset : int
        Byte offset within that parameter (non-zero inside a params struct).
    address : int
    owner : str or None
        Label of the driverlevel allocation that contains it (``"pool:attn"``…),
        ``None`` if the address lies in device memory driverlevel did not allocate.
    carve : str or None
        Carve-out name within a pool.
    device : int or None
        Ordinal of the device whose allocation holds it (None when unregistered).
    """

    param: int
    offset: int
    address: int
    owner: str | None
    carve: str | None
    device: int | None = None


@dataclass(frozen=True)
class KernelNodeInfo:
    """One kernel node of a captured graph (the audit's row)."""

    name: str
    grid: tuple
    block: tuple
    shared_mem: int
    pointers: list = field(default_factory=list)

    @property
    def unregistered(self) -> list:
        """Pointer arguments that lie in no registered driverlevel allocation."""
        return [p for p in self.pointers if p.owner is None]

    def foreign(self, ordinal: int) -> list:
        """Pointer arguments registered to a device other than ``ordinal`` (must be empty)."""
        return [p for p in self.pointers if p.device is not None and p.device != ordinal]


def _is_device_pointer(value: int) -> bool:
    if value < 0x10000:
        return False
    attr = driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE
    err, _ = driver.cuPointerGetAttribute(attr, value)
    return err == driver.CUresult.CUDA_SUCCESS


def _param_layout(func):
    """``[(offset, size)]`` of a kernel's parameters (cuFuncGetParamInfo)."""
    out = []
    i = 0
    while True:
        err, off, size = driver.cuFuncGetParamInfo(func, i)
        if err != driver.CUresult.CUDA_SUCCESS:
            break
        out.append((int(off), int(size)))
        i += 1
    return out


class Graph:
    """A captured CUDA graph (``CUgraph``). Obtain one from :func:`capture`."""

    def __init__(self, *a, **k):
        raise RuntimeError("Graph has no public constructor: use driverlevel.capture(stream)")

    @classmethod
    def _from_handle(cls, handle, device, kept):
        self = object.__new__(cls)
        self._handle = handle
        self.device = device
        self._kept = list(kept)
        self._finalizer = weakref.finalize(self, _destroy_graph, handle)
        return self

    @property
    def handle(self):
        return self._handle

    def _nodes(self):
        _, n = check("cuGraphGetNodes", driver.cuGraphGetNodes(self._handle, 0))
        if not n:
            return []
        nodes, _ = check("cuGraphGetNodes", driver.cuGraphGetNodes(self._handle, n))
        return list(nodes)[:n]

    def node_count(self) -> int:
        """Number of nodes of any kind (kernel, memset, memcpy, event…)."""
        return len(self._nodes())

    def kernel_nodes(self) -> list[KernelNodeInfo]:
        """The kernel nodes with name, grid, block, dynamic shared memory and pointer arguments.

        Each pointer argument is resolved to the registered pool and carve-out it
        lies in (``owner``/``carve``); device pointers into memory driverlevel did
        not allocate are reported with ``owner=None``.
        """
        self.device.set_current()
        out = []
        for node in self._nodes():
            t = check("cuGraphNodeGetType", driver.cuGraphNodeGetType(node))
            if t != driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL:
                continue
            p = check("cuGraphKernelNodeGetParams", driver.cuGraphKernelNodeGetParams(node))
            func = p.func
            try:
                name = check("cuFuncGetName", driver.cuFuncGetName(func))
                name = name.decode() if isinstance(name, bytes) else str(name)
            except Exception:
                name = "<unknown>"
            pointers = []
            argv = int(p.kernelParams) if p.kernelParams else 0
            if argv:
                for i, (_, size) in enumerate(_param_layout(func)):
                    addr = ctypes.c_void_p.from_address(argv + 8 * i).value
                    if not addr:
                        continue
                    raw = ctypes.string_at(addr, size)
                    for off in range(0, size - 7, 8):
                        v = int.from_bytes(raw[off:off + 8], "little")
                        hit = lookup_pointer(v)
                        if hit is not None:
                            pointers.append(PointerArg(i, off, v, hit.label, hit.carve, hit.device))
                        elif _is_device_pointer(v):
                            pointers.append(PointerArg(i, off, v, None, None))
            out.append(KernelNodeInfo(name, (p.gridDimX, p.gridDimY, p.gridDimZ),
                                      (p.blockDimX, p.blockDimY, p.blockDimZ), int(p.sharedMemBytes), pointers))
        return out

    def audit(self) -> str:
        """A printable table of :meth:`kernel_nodes` (kernel, grid, block, smem, where each pointer lies)."""
        rows = self.kernel_nodes()
        lines = [f"{len(rows)} kernel node(s) of {self.node_count()} node(s):"]
        for k in rows:
            where = ", ".join(f"{(p.owner or 'UNREGISTERED')}" + (f"/{p.carve}" if p.carve else "") for p in k.pointers)
            lines.append(f"  {k.name:<34} grid={k.grid} block={k.block} smem={k.shared_mem:>6}  -> {where or '(no pointers)'}")
        return "\n".join(lines)

    def instantiate(self, upload_stream=None) -> "GraphExec":
        """Instantiate an executable graph (and upload it to ``upload_stream`` if given)."""
        self.device.set_current()
        h = check("cuGraphInstantiate", driver.cuGraphInstantiate(self._handle, 0))
        ex = GraphExec._create(h, self)
        if upload_stream is not None:
            ex.upload(upload_stream)
        return ex

    def close(self) -> None:
        """Destroy the graph now (idempotent). Instantiated execs stay valid."""
        self._finalizer()


class GraphExec:
    """An instantiated graph (``CUgraphExec``); :meth:`launch` replays it."""

    def __init__(self, *a, **k):
        raise RuntimeError("GraphExec has no public constructor: use Graph.instantiate()")

    @classmethod
    def _create(cls, handle, graph):
        self = object.__new__(cls)
        self._handle = handle
        self.graph = graph
        self.device = graph.device
        self._finalizer = weakref.finalize(self, _destroy_exec, handle)
        return self

    @property
    def handle(self):
        """The ``CUgraphExec``."""
        return self._handle

    def launch(self, stream) -> None:
        """Replay the graph on ``stream`` (one ``cuGraphLaunch``; the hot path)."""
        self.device.set_current()
        (err,) = driver.cuGraphLaunch(self._handle, stream.handle)
        if err:
            check("cuGraphLaunch", (err,))

    replay = launch

    def upload(self, stream) -> None:
        """Upload the executable graph's resources ahead of the first launch."""
        self.device.set_current()
        check("cuGraphUpload", driver.cuGraphUpload(self._handle, stream.handle))

    def update(self, graph: Graph) -> None:
        """Update the kernel parameters in place from a newly captured ``graph`` of the same topology.

        Raises
        ------
        GraphUpdateError
            If the driver refuses (e.g. ``CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED``:
            the new graph has other nodes or edges; capture again and instantiate anew).
        """
        self.device.set_current()
        old_n, new_n = self.graph.node_count(), graph.node_count()
        if old_n != new_n:
            raise GraphUpdateError(
                "cuGraphExecUpdate", int(driver.CUresult.CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE),
                "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE",
                f"TOPOLOGY_CHANGED: the new graph has {new_n} nodes, the instantiated one {old_n}",
                "capture again and instantiate a new GraphExec")
        err, info = driver.cuGraphExecUpdate(self._handle, graph.handle)
        if err != driver.CUresult.CUDA_SUCCESS:
            # The bindings return no result info on failure; name what can differ.
            reason = getattr(getattr(info, "result", None), "name", None) or \
                "TOPOLOGY_CHANGED or a node's type, kernel, context or memory changed"
            raise_cuda("cuGraphExecUpdate", err, f"{reason}: the new graph must have the same topology; "
                       f"capture again and instantiate a new GraphExec", cls=GraphUpdateError)
        self.graph = graph

    def close(self) -> None:
        """Destroy the executable graph now (idempotent)."""
        self._finalizer()
