"""Errors raised by driverlevel, and the one place that checks driver results.

Every call into ``cuda.bindings.driver`` or ``cuda.bindings.nvrtc`` goes through
:func:`check` (driver) or :func:`check_nvrtc` (NVRTC), which raise an exception
naming the failing call and the CUDA error instead of returning a status code.

Every exception class of the package round-trips through :mod:`pickle` with its message and
its attributes (:class:`PicklableError`), so that one raised in a worker process reaches the
parent of a ``concurrent.futures.ProcessPoolExecutor`` or ``multiprocessing.Pool`` as itself
(the default pickling calls ``cls(*exc.args)``, which a custom ``__init__`` refuses: the pool
then breaks).
"""

from __future__ import annotations

from cuda.bindings import driver, nvrtc

__all__ = [
    "CudaError",
    "DriverUnavailableError",
    "NvrtcError",
    "CaptureError",
    "GraphUpdateError",
    "PoolExhaustedError",
    "check",
    "check_nvrtc",
]


def _restore_error(cls, args, state):
    """Unpickle an exception of ``cls`` without calling its ``__init__`` (see :class:`PicklableError`)."""
    exc = cls.__new__(cls, *args)
    exc.args = args
    exc.__dict__.update(state)
    return exc


class PicklableError:
    """Mixin of every driverlevel exception: pickles the message (``args``) and the attributes
    (``__dict__``) and restores them without calling ``__init__``.

    ``BaseException.__reduce__`` rebuilds an exception as ``cls(*self.args)``; for a class whose
    ``__init__`` takes other arguments than its message (:class:`CudaError`'s ``call, code, name``,
    ...) that raises ``TypeError`` in the process that unpickles it, or builds a different message.
    Put it first among the bases: ``class MyError(PicklableError, ValueError)``.
    """

    __slots__ = ()

    def __reduce__(self):
        return _restore_error, (type(self), self.args, dict(self.__dict__))


class CudaError(PicklableError, RuntimeError):
    """A CUDA driver call failed.

    Raised by every driver call the package makes (through ``driverlevel._errors.check``)
    for any result other than ``CUDA_SUCCESS``; the message
    reads ``"<call> failed: <name> (<code>): <description> [<detail>]"``, e.g.
    ``"cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY (2): out of memory [4096 MiB]"``.
    Subclasses: :class:`DriverUnavailableError`, :class:`GraphUpdateError`.

    Attributes
    ----------
    call : str
        The driver function that failed, e.g. ``"cuMemAlloc"``.
    code : int
        The numeric ``CUresult``.
    name : str
        The error's name, e.g. ``"CUDA_ERROR_OUT_OF_MEMORY"``.
    """

    def __init__(self, call: str, code: int, name: str, description: str = "", detail: str = "", *,
                 message: str | None = None):
        self.call = call
        self.code = int(code)
        self.name = name
        self.description = description
        if message is None:  # ``message``: the whole text, for a failure no driver call reported
            message = f"{call} failed: {name} ({self.code})"
            if description:
                message += f": {description}"
        if detail:
            message += f" [{detail}]"
        super().__init__(message)


class DriverUnavailableError(CudaError):
    """No usable CUDA driver or device on this machine.

    Raised (instead of a plain :class:`CudaError`) when the driver library cannot be
    loaded, or a call returns ``CUDA_ERROR_NO_DEVICE``, ``CUDA_ERROR_INSUFFICIENT_DRIVER``,
    ``CUDA_ERROR_STUB_LIBRARY``, ``CUDA_ERROR_SYSTEM_DRIVER_MISMATCH`` or
    ``CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE``. :func:`~driverlevel.device_count`
    returns 0 instead of raising it. Commands and examples that need a GPU print one
    sentence and exit 2 instead (``driverlevel._device.require_gpu``).
    """


class NvrtcError(PicklableError, RuntimeError):
    """NVRTC failed to compile a kernel source; carries the full compile log.

    Raised by :func:`~driverlevel.compile_source` / :func:`~driverlevel.runtime.compile_file`
    (compile errors, a ``static_assert`` of a params layout that drifted from its ctypes
    mirror) and by every other NVRTC call. The message is one line
    ``"<call> failed: <name> while compiling <source> for <arch>"`` followed by the
    options and the log.

    Attributes
    ----------
    call : str
        The NVRTC function that failed.
    name : str
        The ``nvrtcResult`` name.
    log : str
        NVRTC's program log (compiler diagnostics), possibly empty.
    options : list of str
        The options given to NVRTC.
    arch : str or None
        The target architecture, e.g. ``"sm_120"``.
    source_name : str or None
        The file name of the source being compiled.
    """

    def __init__(self, call, name, log="", options=(), arch=None, source_name=None):
        self.call = call
        self.name = name
        self.log = log
        self.options = list(options)
        self.arch = arch
        self.source_name = source_name
        head = f"{call} failed: {name}"
        if source_name:
            head += f" while compiling {source_name}"
        if arch:
            head += f" for {arch}"
        body = f"\noptions: {' '.join(self.options)}" if self.options else ""
        if log:
            body += f"\n--- NVRTC log ---\n{log.rstrip()}"
        super().__init__(head + body)


class CaptureError(PicklableError, RuntimeError):
    """An operation would break (or has broken) a CUDA stream capture.

    Raised *before* the driver is called by everything that allocates, synchronizes
    or reads back while a stream of the calling thread (or of any thread, in
    ``"global"`` mode) is being captured; the message names the operation, the
    stream and the fix, e.g. ``"DeviceBuffer allocation (cuMemAlloc) is not
    capture-safe: stream 0x... is being captured into a CUDA graph by this thread
    (mode thread_local). Do it before capture() begins ..."``. Also raised by
    :func:`~driverlevel.capture` for the legacy default stream, a stream already
    capturing, or a capture that another library's call invalidated.
    """


class GraphUpdateError(CudaError):
    """``cuGraphExecUpdate`` refused the new graph (:meth:`~driverlevel.runtime.GraphExec.update`).

    The new graph must have the instantiated one's topology (same nodes, edges and
    node types); the message names the reason (e.g. ``TOPOLOGY_CHANGED: the new graph
    has 5 nodes, the instantiated one 4``) and the fix: capture again and instantiate
    a new :class:`~driverlevel.runtime.GraphExec`. The old exec stays valid and unchanged.
    """


class PoolExhaustedError(PicklableError, MemoryError):
    """A :class:`~driverlevel.WorkspacePool` has no room for a requested carve-out.

    Raised by ``WorkspacePool.carve`` before anything is written; the message names
    the pool, the carve-out, the bytes needed and free, and how to size the pool
    (``WorkspacePool.required_bytes()`` or the plan's ``pool_bytes``).
    """


_SUCCESS = driver.CUresult.CUDA_SUCCESS
_NVRTC_SUCCESS = nvrtc.nvrtcResult.NVRTC_SUCCESS


def _error_strings(code) -> tuple[str, str]:
    try:
        name = driver.CUresult(code).name
    except ValueError:
        name = f"CUresult({int(code)})"
    desc = ""
    try:
        err, text = driver.cuGetErrorString(code)
        if err == _SUCCESS and text:
            desc = text.decode() if isinstance(text, bytes) else str(text)
    except Exception:  # the driver library itself may be missing
        desc = ""
    return name, desc


# Results that mean "no usable driver or device here" (names missing from older bindings are skipped).
_UNAVAILABLE_CODES = frozenset(
    int(getattr(driver.CUresult, n)) for n in (
        "CUDA_ERROR_NO_DEVICE", "CUDA_ERROR_INSUFFICIENT_DRIVER",
        "CUDA_ERROR_STUB_LIBRARY",  # libcuda.so stub of a toolkit, no real driver
        "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
    ) if hasattr(driver.CUresult, n)
)


def raise_cuda(call: str, code, detail: str = "", cls=CudaError):
    """Raise ``cls`` for a failed driver call ``call`` with result ``code``."""
    name, desc = _error_strings(code)
    if cls is CudaError and int(code) in _UNAVAILABLE_CODES:
        cls = DriverUnavailableError
    raise cls(call, int(code), name, desc, detail)


def check(call: str, ret, detail: str = ""):
    """Check the tuple a ``cuda.bindings.driver`` function returned.

    Parameters
    ----------
    call : str
        Name of the driver function, used in the error message.
    ret : tuple
        ``(CUresult, *values)`` as returned by cuda.bindings.
    detail : str, optional
        Extra context for the message (sizes, names).

    Returns
    -------
    None, the single value, or a tuple of the values after the status.

    Raises
    ------
    CudaError
        If the status is not ``CUDA_SUCCESS``.
    """
    if isinstance(ret, tuple):
        status = ret[0]
        values = ret[1:]
    else:
        status, values = ret, ()
    if status != _SUCCESS:
        raise_cuda(call, status, detail)
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return values


def check_nvrtc(call: str, ret, prog=None, options=(), arch=None, source_name=None):
    """Check the tuple an NVRTC function returned; attach the program log on failure."""
    if isinstance(ret, tuple):
        status, values = ret[0], ret[1:]
    else:
        status, values = ret, ()
    if status != _NVRTC_SUCCESS:
        log = program_log(prog) if prog is not None else ""
        raise NvrtcError(call, nvrtc.nvrtcResult(status).name, log, options, arch, source_name)
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return values


def program_log(prog) -> str:
    """Return NVRTC's log for ``prog`` as text (empty if unavailable)."""
    err, size = nvrtc.nvrtcGetProgramLogSize(prog)
    if err != _NVRTC_SUCCESS or size <= 1:
        return ""
    buf = b" " * size
    (err,) = nvrtc.nvrtcGetProgramLog(prog, buf)
    if err != _NVRTC_SUCCESS:
        return ""
    return buf.rstrip(b"\x00").decode(errors="replace")


class MetadataError(PicklableError, ValueError):
    """Per-step metadata that a kernel found inconsistent (reported through a device error word).

    Inside a captured graph no host check runs, so the kernels check what they read
    and record the first fault in the plan's device error word (its ``error_word``
    attribute, in mapped host memory); the plan's ``check_errors()`` raises this error
    naming the first bad request and field.

    Attributes
    ----------
    request : int
        Index of the first request found bad (-1 when the fault is not per request).
    field : str
        The metadata field, e.g. ``"qo_indptr"``, ``"kv_indices"``, ``"mask_indptr"``.
    code : str
        What was wrong, e.g. ``"not_monotonic"``, ``"over_max"``, ``"out_of_range"``.
    count : int
        How many checks failed since the word was last cleared.
    """

    def __init__(self, where: str, request: int, field: str, code: str, count: int):
        self.request, self.field, self.code, self.count = request, field, code, count
        who = f"request {request}" if request >= 0 else "the batch"
        super().__init__(f"{where}: {who}: {field} is {code.replace('_', ' ')} "
                         f"({count} failed check{'s' if count != 1 else ''} since the last check_errors())")
