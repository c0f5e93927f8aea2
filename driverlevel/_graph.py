"""CUDA graphs: explicit stream capture, instantiate once, replay every step.

>>> with capture(stream) as cap:                 # doctest: +SKIP
...     plan.run(stream, ...)                     # kernels are recorded, not run
>>> graph_exec = cap.graph.instantiate()          # doctest: +SKIP
>>> graph_exec.launch(stream)                     # doctest: +SKIP

:meth:`Graph.kernel_nodes` lists the captured kernel nodes with the pool and
carve-out each pointer argument lies in: the audit that shows there was no silent
fallback and no stray pointer.

The lifetime rules (what a graph keeps alive, what stays the caller's) are in
:class:`Graph`'s docstring.
"""

from __future__ import annotations

import contextlib
import ctypes
import weakref
from dataclasses import dataclass, field

from cuda.bindings import driver

from . import _capture_guard, _memory
from ._checks import foreign_stream_hint, stream_arg
from ._errors import CaptureError, GraphUpdateError, check, raise_cuda
from ._memory import lookup_pointer
from ._stream import Stream

__all__ = ["capture", "CaptureSession", "Graph", "GraphExec", "KernelNodeInfo", "PointerArg"]

_MODES = {
    "global": driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL,
    "thread_local": driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
    "relaxed": driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED,
}


def _destroy_graph(handle, ctx=None):
    if ctx is None:  # a graph that never became a Graph (a failed capture): destroy now
        try:
            driver.cuGraphDestroy(handle)
        except Exception:
            pass
        return
    _memory._release("graph", handle, ctx)  # deferred during captures, relaxed otherwise


def _destroy_exec(handle, ctx):
    _memory._release("exec", handle, ctx)


class CaptureSession:
    """State of one stream capture; after the ``with`` block, :attr:`graph` holds the result.

    Attributes
    ----------
    stream : Stream
        The stream the capture began on.
    mode : str
    capture_id : int or None
        CUDA's id of this capture sequence (``cuStreamGetCaptureInfo``).
    graph : Graph or None
        Set when the block exits normally.
    """

    def __init__(self, stream, mode):
        self.stream = stream
        self.mode = mode
        self.capture_id = None
        self.graph: Graph | None = None
        self._kept: list = []

    def _keep(self, obj) -> None:
        self._kept.append(obj)

    def keep_alive(self, *objs) -> None:
        """Tie ``objs`` (buffers, pools, foreign arrays…) to the lifetime of the captured graph.

        Call it inside the ``with`` block: the graph takes what the session holds when the
        capture ends.

        Raises
        ------
        ValueError
            After the ``with`` block (an object passed then would be held by the session only,
            and could be freed while the graph still replays).
        """
        if self.stream._capture is not self:  # the block was left: the graph took its copy of _kept
            raise ValueError("keep_alive: this capture has ended (the graph took what it keeps when the with "
                             "block was left): call it inside the block, or keep the objects alive yourself")
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
    TypeError
        If ``stream`` is not a driverlevel Stream (an Event, a Graph or a GraphExec included:
        ``"capture needs a driverlevel Stream (...), got Event"``).
    ValueError
        If ``mode`` is not one of the three names, or ``stream`` was closed.
    CaptureError
        If the capture was invalidated (e.g. by a prohibited call made through
        another library), the stream is already capturing (through this object, another
        Stream object of its handle or another library: any status but NONE, an invalidated
        capture not yet ended included), or it is the legacy default
        stream (handle 0 or ``CU_STREAM_LEGACY``, 1; the per-thread default stream, 2, can
        be captured).
    CudaError
        If the driver refuses to begin or end the capture for another reason.

    Notes
    -----
    While the block runs, handles released in any thread free their memory only
    after the capture ends, and every launch, copy, fill and event recorded on the
    stream, or on a side stream joined into it by events, is tied to the graph
    (see the lifetime rules in :class:`Graph`'s docstring).
    """
    if not isinstance(mode, str) or mode not in _MODES:  # (a list was "unhashable type")
        raise ValueError(f"capture mode must be one of {sorted(_MODES)}, got {mode!r}")
    if not isinstance(stream, Stream):  # an Event, a Graph or a GraphExec has a handle and a device too
        raise TypeError(f"capture needs a driverlevel Stream (Device.create_stream() or Stream.from_handle), "
                        f"got {type(stream).__name__}{foreign_stream_hint(stream)}")
    stream._require_open("capture")
    if int(stream.handle) in (0, 1):  # 0 and CU_STREAM_LEGACY both name the legacy default stream
        raise CaptureError("the legacy default stream cannot be captured: use Device.create_stream()")
    if getattr(stream, "_capture", None) is not None:
        raise CaptureError("this stream is already being captured")
    with stream.device.activated():  # (in the stream's context: handle 2 names a per-thread stream of the current one)
        err, status = driver.cuStreamIsCapturing(stream.handle)
    if err == driver.CUresult.CUDA_SUCCESS and status != driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE:
        # a capture begun through another Stream object of the same handle, or by another library; or one that
        # was invalidated and not ended yet
        raise CaptureError(f"this stream is already being captured ({status.name}): end that capture first")
    # Every entry point works in the device's primary context, whatever the caller has current.
    session = CaptureSession(stream, mode)
    dev = stream.device
    ordinal = getattr(dev, "ordinal", None)
    _capture_guard.begin_capture(ordinal)  # from here on, released handles defer their frees
    reg_key = ("session", id(session))
    try:
        with dev.activated():
            check("cuStreamBeginCapture", driver.cuStreamBeginCapture(stream.handle, _MODES[mode]))
            session.capture_id = _capture_guard.capture_id(stream.handle)
    except BaseException:
        _end_bookkeeping(ordinal)
        raise
    if session.capture_id is not None:
        reg_key = session.capture_id
    stream._capture = session
    _capture_guard.register(id(session), int(stream.handle), mode)
    _capture_guard.register_keep(reg_key, session._kept)
    try:
        yield session
    except BaseException:
        _capture_guard.unregister(id(session))
        _capture_guard.unregister_keep(reg_key)
        stream._capture = None
        try:  # (the block's own exception goes on; the bookkeeping ends whatever the driver says here)
            with dev.activated():
                err, g = driver.cuStreamEndCapture(stream.handle)
                if err == driver.CUresult.CUDA_SUCCESS and g is not None and int(g):
                    _destroy_graph(g)
        finally:
            _end_bookkeeping(ordinal)
        raise
    _capture_guard.unregister(id(session))
    _capture_guard.unregister_keep(reg_key)
    stream._capture = None
    try:
        with dev.activated():
            err, g = driver.cuStreamEndCapture(stream.handle)
            if err != driver.CUresult.CUDA_SUCCESS:
                if g is not None and int(g):
                    _destroy_graph(g)
                if err == driver.CUresult.CUDA_ERROR_STREAM_CAPTURE_INVALIDATED:
                    raise CaptureError("the stream capture was invalidated by a prohibited call during capture "
                                       "(an allocation, synchronization or host copy through another library?)")
                raise_cuda("cuStreamEndCapture", err)
            kept = list(session._kept)
            kept.extend(_memory.owners_of(_graph_pointers(g)))
        session.graph = Graph._from_handle(g, dev, kept)
    finally:
        _end_bookkeeping(ordinal)


def _live_handle(obj, remedy: str):
    """``obj``'s handle (a :class:`Graph`'s or a :class:`GraphExec`'s), or ``ValueError`` once its ``close``
    destroyed it: a destroyed handle never reaches the driver."""
    h = obj._handle
    if h is None:
        kind = type(obj).__name__
        raise ValueError(f"this {kind} was closed ({kind}.close): {remedy}")
    return h


def _end_bookkeeping(ordinal) -> None:
    """One capture fewer in progress; when none is left, free what was released meanwhile."""
    if _capture_guard.end_capture(ordinal) == 0:
        _memory.release_deferred()


def _graph_pointers(g) -> list:
    """Every 8-byte value among the graph's kernel arguments, and memset/memcpy addresses.

    Candidates only: :func:`driverlevel._memory.owners_of` keeps those that lie in a
    registered allocation. Call with the graph's context current.
    """
    out = []
    err, _, n = driver.cuGraphGetNodes(g, 0)
    if err != driver.CUresult.CUDA_SUCCESS or not n:
        return out
    err, nodes, n = driver.cuGraphGetNodes(g, n)
    if err != driver.CUresult.CUDA_SUCCESS:
        return out
    T = driver.CUgraphNodeType
    layouts: dict = {}  # per call only: a function's address may be reused by a later module
    for node in list(nodes)[:n]:
        try:
            err, t = driver.cuGraphNodeGetType(node)
            if err != driver.CUresult.CUDA_SUCCESS:
                continue
            if t == T.CU_GRAPH_NODE_TYPE_KERNEL:
                err, p = driver.cuGraphKernelNodeGetParams(node)
                if err != driver.CUresult.CUDA_SUCCESS:
                    continue
                argv = int(p.kernelParams) if p.kernelParams else 0
                if not argv:
                    continue
                key = int(p.func)
                layout = layouts.get(key)
                if layout is None:
                    layout = layouts[key] = _param_layout(p.func)
                for i, (_, size) in enumerate(layout):
                    addr = ctypes.c_void_p.from_address(argv + 8 * i).value
                    if not addr or size < 8:
                        continue
                    raw = ctypes.string_at(addr, size)
                    out.extend(int.from_bytes(raw[o:o + 8], "little") for o in range(0, size - 7, 8))
            elif t == T.CU_GRAPH_NODE_TYPE_MEMSET:
                err, p = driver.cuGraphMemsetNodeGetParams(node)
                if err == driver.CUresult.CUDA_SUCCESS:
                    out.append(int(p.dst))
            elif t == T.CU_GRAPH_NODE_TYPE_MEMCPY:
                err, p = driver.cuGraphMemcpyNodeGetParams(node)
                if err == driver.CUresult.CUDA_SUCCESS:
                    out.extend((int(p.srcDevice), int(p.dstDevice)))
        except Exception:  # an older driver or binding without one of these queries: keep what we have
            continue
    return out


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
    """A captured CUDA graph (``CUgraph``): the recorded kernels, copies, memsets and events.

    Obtain one from :func:`capture` (``cap.graph`` after the ``with`` block; there is
    no public constructor). It holds everything the captured work points into (see
    "Lifetime rules" below). Inspect it with :meth:`kernel_nodes` / :meth:`audit`,
    and turn it into something that runs with :meth:`instantiate`.

    Attributes
    ----------
    device : Device
        The device whose stream was captured.

    Example
    -------
    >>> with dl.capture(stream) as cap:                       # doctest: +SKIP
    ...     plan.run(stream, q, kv_cache, meta, out)
    >>> print(cap.graph.audit())     # one line per kernel: grid, block, smem, pools  # doctest: +SKIP
    >>> exec_ = cap.graph.instantiate(upload_stream=stream)   # doctest: +SKIP

    Lifetime rules
    --------------
    A graph replays raw addresses, so everything it points into must outlive it.
    driverlevel guarantees this for what it can see; the rest is the caller's.

    1. **What a graph keeps alive.** A :class:`Graph` holds strong references to
       (a) every :class:`~driverlevel.runtime.PreparedLaunch` queued while it was captured —
       on the capture's stream *or on any side stream joined into the capture with
       events* (fork/join): each launch asks ``cuStreamGetCaptureInfo`` for its
       stream's capture id while a driverlevel capture is in progress, and the
       capture collects what was registered under its id — and with each launch its
       arguments, their owners, and whatever :meth:`PreparedLaunch.keep` was given;
       (b) the arrays of every :meth:`DeviceArray.copy_from`, ``fill_bytes`` and
       ``fill_u32`` and every :class:`Event` recorded or waited on inside the capture;
       (c) every registered driverlevel allocation (:class:`DeviceBuffer`,
       :class:`WorkspacePool`, mapped :class:`PinnedHostBuffer`) that any kernel
       argument (including pointers inside a params struct passed by value) or any
       memset/memcpy node of the captured graph points into — found by scanning the
       graph's nodes when the capture ends, so a plan's workspace is kept even if the
       plan forgot to say so (the scan sees the allocations still alive then: one whose
       last reference is dropped inside the ``with`` block, and that nothing in (a), (b)
       or (d) holds, is freed when the capture ends); (d) whatever
       :meth:`CaptureSession.keep_alive` was given. A launch recorded into a capture is
       kept with the arguments it held then: a later :meth:`PreparedLaunch.set_arg` does
       not release them while the graph lives.
    2. **A** :class:`GraphExec` **keeps its** :class:`Graph` (and so all of the above);
       :meth:`GraphExec.update` switches it to the new graph. Handles are released
       exec first, then graph, then the memory they point into; a replay works after
       every other Python reference to the plan, pools and launches is gone.
    3. **Foreign memory** (a torch or CuPy tensor passed as a kernel argument) is
       kept alive by the launch that received it; memory reached only through a raw
       address that driverlevel did not allocate is not: pass its owner to
       :meth:`CaptureSession.keep_alive`. Work recorded into a capture driverlevel did
       not begin (``torch.cuda.graph``) is not tracked: keep what it uses alive.
    4. **Releasing a handle during a capture never breaks it.** Frees requested while
       a driverlevel capture is in progress (``del``, ``gc.collect()``, ``close()``;
       any thread, any mode) are deferred until the last capture ends; other frees run
       in relaxed capture mode, so a capture driverlevel cannot see survives too (see
       :mod:`driverlevel._memory`; ``driverlevel.runtime.release_deferred()`` drains by hand).
    5. **Explicit** ``close()`` **wins.** Closing a pool or buffer that a graph still
       points into frees it anyway (after any capture in progress): do not replay
       that graph afterwards (a replay is one ``cuGraphLaunch``: nothing checks it).
       The other entry points refuse a closed object with ``ValueError`` before they
       call the driver: a closed :class:`Graph` or :class:`GraphExec`, a closed stream
       or event given to a plan, an array method, :func:`capture` or a stream's or
       event's own method, an array that views a closed buffer or pool (its copies,
       fills and reads, and every plan's argument checks), and a plan whose workspace
       pool was closed. The two hot paths do not look: :meth:`PreparedLaunch.launch`
       never, :meth:`GraphExec.launch` only after the driver refused the stream (a
       closed stream's handle, reused by a newer stream, would launch there).
    """

    def __init__(self, *a, **k):
        raise RuntimeError("Graph has no public constructor: use driverlevel.capture(stream)")

    @classmethod
    def _from_handle(cls, handle, device, kept):
        self = object.__new__(cls)
        self._handle = handle
        self.device = device
        self._kept = list(kept)
        self._finalizer = weakref.finalize(self, _destroy_graph, handle, device.context)
        return self

    @property
    def handle(self):
        """The ``CUgraph`` (owned by this object; do not destroy it); None once closed."""
        return self._handle

    def _live(self):
        return _live_handle(self, "capture the work again")

    def _nodes(self):
        h = self._live()
        with self.device.activated():
            _, n = check("cuGraphGetNodes", driver.cuGraphGetNodes(h, 0))
            if not n:
                return []
            nodes, _ = check("cuGraphGetNodes", driver.cuGraphGetNodes(h, n))
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
        with self.device.activated():
            return self._kernel_nodes()

    def _kernel_nodes(self) -> list:
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
        """Instantiate an executable graph (and upload it to ``upload_stream`` if given).

        The :class:`GraphExec` keeps this graph, and so everything it keeps, alive.

        Raises
        ------
        TypeError
            ``upload_stream`` is neither None nor a driverlevel :class:`~driverlevel.Stream`.
        ValueError
            ``upload_stream`` belongs to another device than the graph or was closed (both
            checked before anything is instantiated), or this graph was closed.
        CudaError
            If ``cuGraphInstantiate`` fails.
        """
        g = self._live()
        if upload_stream is not None:
            stream_arg("upload_stream", upload_stream, self.device, "the graph")
        nodes = self.node_count()
        with self.device.activated():
            h = check("cuGraphInstantiate", driver.cuGraphInstantiate(g, 0))
        ex = GraphExec._create(h, self, nodes)
        if upload_stream is not None:
            ex.upload(upload_stream)
        return ex

    def close(self) -> None:
        """Destroy the graph now (idempotent). Instantiated execs stay valid; this graph's own
        methods raise ``ValueError`` afterwards."""
        self._finalizer()
        self._handle = None


class GraphExec:
    """An instantiated graph (``CUgraphExec``); :meth:`launch` (alias ``replay``) replays it.

    Obtain one from :meth:`Graph.instantiate` (there is no public constructor). It
    keeps its :class:`Graph`, and with it every buffer, pool, kernel and argument the
    graph points into, so a replay stays valid after the plan objects are dropped.
    A replay is one ``cuGraphLaunch`` (host µs per replay: see BENCHMARKS.md); per-step inputs
    are read from the device buffers the graph was captured over, so refill those
    buffers, not the graph, between replays.

    Attributes
    ----------
    graph : Graph
        The graph instantiated (or last passed to :meth:`update`).
    device : Device

    Example
    -------
    >>> exec_ = cap.graph.instantiate()                        # doctest: +SKIP
    >>> for _ in range(steps):                                 # doctest: +SKIP
    ...     exec_.launch(stream)
    >>> stream.synchronize()                                   # doctest: +SKIP
    """

    def __init__(self, *a, **k):
        raise RuntimeError("GraphExec has no public constructor: use Graph.instantiate()")

    @classmethod
    def _create(cls, handle, graph, node_count):
        self = object.__new__(cls)
        self._handle = handle
        self.graph = graph
        self._node_count = node_count  # (update's topology check, valid after the graph was closed)
        self.device = graph.device
        self._finalizer = weakref.finalize(self, _destroy_exec, handle, graph.device.context)
        return self

    @property
    def handle(self):
        """The ``CUgraphExec``; None once closed."""
        return self._handle

    def _live(self):
        return _live_handle(self, "instantiate the graph again")

    def launch(self, stream) -> None:
        """Replay the graph on ``stream`` (one ``cuGraphLaunch``; the hot path).

        Runs in the device's primary context; a caller's other context (or none) is
        current again on return.

        Raises
        ------
        TypeError
            ``stream`` is not a driverlevel :class:`~driverlevel.Stream` (a raw handle, another
            library's stream: borrow it with ``Stream.from_handle``), before the driver is called.
        ValueError
            The driver refused the launch and ``stream`` belongs to another device than the
            graph (the message names both devices and the driver's error), or ``stream`` was
            closed; or this exec was closed (checked before the driver is called).
        CudaError
            If ``cuGraphLaunch`` fails.
        """
        # The hot path: one type identity test (it also saves the ``handle`` property's call),
        # one cuGraphLaunch; a closed stream is named only when the driver refuses its handle.
        # A Stream subclass, or anything else, takes the full check. Only if
        # the driver refuses the launch (no context current, or another one) is the primary
        # context pushed for a second try, and popped again; that try's error is the one raised.
        ex = self._handle
        if ex is None:
            self._live()  # (raises)
        if type(stream) is Stream:
            h = stream._handle
        else:
            h = stream_arg("stream", stream).handle
        (err,) = driver.cuGraphLaunch(ex, h)
        if err:
            stream._require_open("stream")  # (a closed stream: say so; the hot path does not look)
            dev = self.device
            pushed = dev._push()
            try:
                (err,) = driver.cuGraphLaunch(ex, h)
                if err and stream.device.ordinal != dev.ordinal:
                    raise ValueError(f"stream is on device {stream.device.ordinal}, but the graph is on device "
                                     f"{dev.ordinal}: cuGraphLaunch failed with {err.name}")
                if err:
                    check("cuGraphLaunch", (err,))
            finally:
                if pushed:
                    dev._pop()

    replay = launch

    def upload(self, stream) -> None:
        """Upload the executable graph's resources on ``stream`` ahead of the first launch
        (so the first replay costs what later ones do).

        Raises
        ------
        TypeError
            ``stream`` is not a driverlevel :class:`~driverlevel.Stream`.
        ValueError
            ``stream`` belongs to another device than the graph, or this exec was closed.
        CudaError
            If ``cuGraphUpload`` fails.
        """
        ex = self._live()
        stream_arg("stream", stream, self.device, "the graph")
        with self.device.activated():
            check("cuGraphUpload", driver.cuGraphUpload(ex, stream.handle))

    def update(self, graph: Graph) -> None:
        """Update the kernel parameters in place from a newly captured ``graph`` of the same topology.

        Raises
        ------
        GraphUpdateError
            If the driver refuses (e.g. ``CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED``:
            the new graph has other nodes or edges; capture again and instantiate anew).
        TypeError
            ``graph`` is not a :class:`Graph` (checked before the driver is called).
        ValueError
            This exec or ``graph`` was closed.
        """
        if not isinstance(graph, Graph):
            raise TypeError(f"graph must be a driverlevel Graph (CaptureSession.graph), got {type(graph).__name__}")
        ex = self._live()
        old_n, new_n = self._node_count, graph.node_count()
        if old_n != new_n:
            raise GraphUpdateError(
                "cuGraphExecUpdate", int(driver.CUresult.CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE),
                "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE",
                f"TOPOLOGY_CHANGED: the new graph has {new_n} nodes, the instantiated one {old_n}",
                "capture again and instantiate a new GraphExec")
        with self.device.activated():
            err, info = driver.cuGraphExecUpdate(ex, graph._live())
        if err != driver.CUresult.CUDA_SUCCESS:
            # The bindings return no result info on failure; name what can differ.
            reason = getattr(getattr(info, "result", None), "name", None) or \
                "TOPOLOGY_CHANGED or a node's type, kernel, context or memory changed"
            raise_cuda("cuGraphExecUpdate", err, f"{reason}: the new graph must have the same topology; "
                       f"capture again and instantiate a new GraphExec", cls=GraphUpdateError)
        self.graph = graph
        self._node_count = new_n

    def close(self) -> None:
        """Destroy the executable graph now (idempotent); :meth:`launch`, :meth:`upload` and
        :meth:`update` raise ``ValueError`` afterwards."""
        self._finalizer()
        self._handle = None
