"""Loading cubins and launching kernels, with arguments packed once.

Arguments are typed explicitly: device arrays and buffers become 64-bit
pointers, numpy scalars (``np.int32``, ``np.int64``, ``np.uint32``,
``np.uint64``, ``np.float32``) and ctypes scalars keep their type, and a
``ctypes.Structure`` is passed by value (the ``__grid_constant__`` params struct
of our kernels). Plain Python ``int``/``float``/``bool`` are refused: their C
type would be a guess.

:meth:`Kernel.prepare` packs the arguments once into a :class:`PreparedLaunch`
whose :meth:`~PreparedLaunch.launch` is a single ``cuLaunchKernel`` call (the hot
path); :meth:`PreparedLaunch.set_arg` replaces one argument (the launch's argument vector is
updated; graphs captured earlier keep what they recorded).
``prepare(..., programmatic=True)`` makes it a programmatic dependent launch instead
(``cuLaunchKernelEx`` with ``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION``,
sm_90 and newer): see :meth:`Kernel.prepare`.

Lifetime: a prepared launch keeps its arguments alive (arrays and, through them,
the buffers or pools they view) plus whatever :meth:`PreparedLaunch.keep` was
given. When the launch is queued on a stream that a driverlevel capture records
(the capture's own stream, or a side stream joined into it with events), the
launch itself is tied to the graph being captured. Modules load, and launches
run, in the device's primary context whatever the caller has current.
"""

from __future__ import annotations

import ctypes
import numbers
import operator
import threading
import weakref

import numpy as np
from cuda.bindings import driver

from . import _capture_guard
from ._memory import _is_live
from ._array import DeviceArray, as_device_array
from ._checks import bool_arg, is_bool, non_negative_int, positive_int, stream_arg
from ._errors import check

__all__ = ["Module", "Kernel", "PreparedLaunch", "load_module", "struct_layout_defines"]

_module_cache: dict = {}
_module_lock = threading.Lock()

_NP_TO_CTYPES = {
    np.dtype(np.int8): ctypes.c_int8,
    np.dtype(np.uint8): ctypes.c_uint8,
    np.dtype(np.int16): ctypes.c_int16,
    np.dtype(np.uint16): ctypes.c_uint16,
    np.dtype(np.int32): ctypes.c_int32,
    np.dtype(np.uint32): ctypes.c_uint32,
    np.dtype(np.int64): ctypes.c_int64,
    np.dtype(np.uint64): ctypes.c_uint64,
    np.dtype(np.float32): ctypes.c_float,
    np.dtype(np.float64): ctypes.c_double,
}


#: The first architecture with programmatic dependent launch (``griddepcontrol``, PTX ISA 7.8).
PDL_MIN_ARCH = "sm_90"


def programmatic_supported(arch) -> bool:
    """True if code compiled for ``arch`` (``"sm_90"``, a Device, ...) may be launched with
    ``programmatic=True``: sm_90 and newer, where ``griddepcontrol.wait`` exists."""
    from ._compile import arch_number

    return arch_number(arch) >= arch_number(PDL_MIN_ARCH)


def check_pdl_arg(pdl, name: str = "pdl") -> None:
    """Raise ``TypeError`` unless a plan's ``pdl=`` argument (or another such choice, ``name``) is
    None, True or False."""
    if pdl is not None and not is_bool(pdl):
        raise TypeError(f"{name} must be None, True or False, got {type(pdl).__name__}")


def resolve_pdl(pdl, arch) -> bool:
    """A plan's ``pdl=`` argument for code compiled for ``arch``: None -> whether ``arch`` has
    programmatic dependent launch (sm_90+); True below sm_90 raises ``ValueError``; anything
    but None, True or False raises ``TypeError`` (:func:`check_pdl_arg`)."""
    from ._compile import normalize_arch

    check_pdl_arg(pdl)
    supported = programmatic_supported(arch)
    if pdl is None:
        return supported
    if pdl and not supported:
        raise ValueError(f"pdl=True needs sm_90 or newer (griddepcontrol), the code is compiled for "
                         f"{normalize_arch(arch)}: pass pdl=None or pdl=False")
    return bool(pdl)


def check_pool_device(pool, device, what: str) -> None:
    """``ValueError`` unless ``pool`` (a ``WorkspacePool`` or None) lives on ``device``: a plan's
    kernels given another GPU's workspace would fault at their first launch (an illegal address,
    which ends the CUDA context), so a plan says so at construction, before it compiles."""
    if pool is not None and pool.device.ordinal != device.ordinal:
        raise ValueError(f"{what}: pool {pool.label!r} is on device {pool.device.ordinal}, the plan on device "
                         f"{device.ordinal}; carve a plan's workspace from a pool on its own device")
    if pool is not None:
        check_pool_open(pool, what)


def check_pool_open(pool, what: str) -> None:
    """``ValueError`` if the plan's workspace ``pool`` was closed (``WorkspacePool.close``): its kernels
    would write memory that may already belong to a newer allocation. A plan checks it at construction
    and before every eager launch (a captured graph keeps its pool alive; closing it is the caller's
    explicit act)."""
    if not _is_live(pool):
        raise ValueError(f"{what}: its workspace pool {pool.label!r} was closed; build the plan again on a live pool")


def check_plan_args(*, pdl, pool, name, arch):
    """The arguments a plan (:class:`~driverlevel.VerifyAttention`, :class:`~driverlevel.DDTreePlan`)
    checks before it touches its device: ``pdl`` (:func:`check_pdl_arg`; with an explicit ``arch``
    also :func:`resolve_pdl`'s sm_90 rule), ``pool`` a ``WorkspacePool`` or None, ``name`` a str.
    Returns the normalised ``arch``, or None when the device will decide it.

    Raises ``TypeError`` / ``ValueError`` naming the argument: ``arch`` of another type than a
    str, int, ``(major, minor)`` tuple or an object with an ``arch`` (a Device) is a TypeError;
    one the NVRTC in use cannot compile for (``sm_999``) is
    :class:`~driverlevel.UnsupportedTargetError`, a ValueError."""
    from ._compile import _check_nvrtc_supports, normalize_arch
    from ._memory import WorkspacePool

    check_pdl_arg(pdl)
    if pool is not None and not isinstance(pool, WorkspacePool):
        raise TypeError(f"pool must be a WorkspacePool or None, got {type(pool).__name__}")
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    if arch is None:
        return None
    if is_bool(arch) or (not isinstance(arch, (str, numbers.Integral, tuple)) and not hasattr(arch, "arch")):
        raise TypeError(f"arch must be a str such as 'sm_90', an int, a (major, minor) tuple or a Device, "
                        f"got {type(arch).__name__}")
    arch = normalize_arch(arch)
    _check_nvrtc_supports(arch)  # (NVRTC answers without a GPU: the plan would fail at its first compile)
    resolve_pdl(pdl, arch)
    return arch


def _launch_attrs(programmatic: bool, carveout):
    """The attributes of a ``cuLaunchKernelEx`` launch. Programmatic (CUDA Programming Guide,
    "Programmatic Dependent Launch and Synchronization"): the launch may begin once every CTA of
    the kernel before it on the stream has run ``griddepcontrol.launch_dependents`` (or exited);
    it must run ``griddepcontrol.wait`` before it reads what that kernel wrote. ``carveout`` (a
    percentage, or None): this launch's preferred shared-memory carveout
    (``CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT``), which overrides the kernel's
    function attribute for this launch only."""
    attrs = []
    if programmatic:
        a = driver.CUlaunchAttribute()
        a.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        a.value.programmaticStreamSerializationAllowed = 1
        attrs.append(a)
    if carveout is not None:
        a = driver.CUlaunchAttribute()
        a.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
        a.value.sharedMemCarveout = int(carveout)
        attrs.append(a)
    return attrs


def _carveout_arg(name: str, carveout):
    """``carveout`` checked: None, or an int percentage in [0, 100] (a bool is refused)."""
    if carveout is None:
        return None
    if isinstance(carveout, bool) or not isinstance(carveout, (int, np.integer)):
        raise TypeError(f"{name}: carveout must be None or an int percentage in [0, 100], "
                        f"got {type(carveout).__name__} {carveout!r}")
    if not 0 <= carveout <= 100:
        raise ValueError(f"{name}: carveout must be a percentage in [0, 100], got {carveout!r}")
    return int(carveout)


def _unload(handle, ctx):
    from ._memory import _release  # deferred during captures, relaxed otherwise

    _release("module", handle, ctx)


class Module:
    """A loaded cubin (``CUmodule``) on one device; hands out its kernels.

    Create with :func:`load_module` (there is no public constructor). Every
    :class:`Kernel` taken from it holds the module alive, so the code stays loaded as
    long as any kernel, prepared launch or captured graph uses it; the module is
    unloaded when the last reference goes (deferred while a capture is in progress).

    Attributes
    ----------
    device : Device
        The device the module is loaded on (in its primary context).
    cubin : Cubin
        The image it was loaded from (``cubin.resources`` holds ptxas's report).

    Example
    -------
    >>> cub = dl.runtime.compile_file("selftest.cu", dev.arch)        # doctest: +SKIP
    >>> mod = dl.load_module(dev, cub)                                # doctest: +SKIP
    >>> mod.kernel("noop")                                            # doctest: +SKIP
    <Kernel noop from selftest.cu (sm_90)>
    """

    def __init__(self, *a, **k):
        raise RuntimeError("Module has no public constructor: use driverlevel.load_module(device, cubin)")

    @classmethod
    def _load(cls, device, cubin):
        self = object.__new__(cls)
        data = cubin.data
        if not data.startswith(b"\x7fELF"):
            raise ValueError("refusing to load a non-cubin image (driverlevel never hands PTX to the driver)")
        with device.activated():
            self._handle = check("cuModuleLoadData", driver.cuModuleLoadData(data),
                                 f"{cubin.source_name} for {cubin.arch}")
        self.device = device
        self.cubin = cubin
        self._kernels: dict[str, Kernel] = {}
        self._finalizer = weakref.finalize(self, _unload, self._handle, device.context)
        return self

    def kernel(self, name: str) -> "Kernel":
        """The kernel ``name`` (an ``extern "C"`` entry point); the same object on every call.

        Raises
        ------
        TypeError
            ``name`` is not a str (bytes included).
        CudaError
            ``CUDA_ERROR_NOT_FOUND`` if the cubin has no such kernel (also for a name UTF-8 cannot
            encode, which no kernel has).
        """
        if not isinstance(name, str):
            raise TypeError(f"kernel name must be a str, got {type(name).__name__} {name!r}")
        k = self._kernels.get(name)
        if k is None:
            with self.device.activated():
                func = check("cuModuleGetFunction",
                             driver.cuModuleGetFunction(self._handle, name.encode(errors="replace")),
                             f"kernel {name!r} in {self.cubin.source_name}")
            k = Kernel._create(self, name, func)
            self._kernels[name] = k
        return k


def load_module(device, cubin) -> Module:
    """Load ``cubin`` on ``device``; cached per (device, cubin key).

    The module is loaded in ``device``'s primary context whatever context the
    calling thread has current (which is current again on return). Loading the same
    cached cubin (one from :func:`~driverlevel.runtime.compile_file`, whose ``key`` is set)
    on the same device again returns the same :class:`Module`.

    Parameters
    ----------
    device : Device or int
        The device (or its ordinal).
    cubin : Cubin
        An image compiled for ``device.arch`` (e.g. ``"sm_90"``), or for its architecture-specific
        target (``"sm_90a"`` on compute capability 9.0), or for a family-specific target of its family
        (``"sm_100f"`` on 10.0 or 10.3). PTX is refused.

    Returns
    -------
    Module

    Raises
    ------
    TypeError
        If ``cubin`` is not a :class:`~driverlevel.runtime.Cubin` (raw ``bytes`` included), or
        its ``data`` is not ``bytes`` / ``bytearray``, before the device is touched.
    ValueError
        If the cubin was compiled for an architecture that does not run on ``device``
        (the message says why), or is not a cubin (ELF).
    CudaError
        If ``cuModuleLoadData`` fails (e.g. ``CUDA_ERROR_NO_BINARY_FOR_GPU``).

    Example
    -------
    >>> dev = dl.Device(0)                                                 # doctest: +SKIP
    >>> mod = dl.load_module(dev, dl.runtime.compile_file("selftest.cu", dev.arch))  # doctest: +SKIP
    """
    from ._compile import Cubin, check_cubin_arch
    from ._device import _check_device_arg

    if not isinstance(cubin, Cubin):
        hint = (": wrap an image compiled elsewhere as driverlevel.runtime.Cubin(data, arch, source_name, options=())"
                if isinstance(cubin, (bytes, bytearray, memoryview)) else "")
        raise TypeError(f"cubin must be a driverlevel.runtime.Cubin (from compile_source or compile_file), "
                        f"got {type(cubin).__name__}{hint}")
    if not isinstance(cubin.data, (bytes, bytearray)):  # (a Cubin made by hand: checked before the device)
        raise TypeError(f"cubin.data must be bytes (the ELF image), got {type(cubin.data).__name__}"
                        + (": pass bytes(...) of it" if isinstance(cubin.data, memoryview) else ""))
    device = _check_device_arg(device)
    try:
        check_cubin_arch(cubin.arch, device.arch)
    except ValueError as exc:
        raise ValueError(f"{device!r}: {exc}") from None
    key = (device.ordinal, cubin.key or id(cubin))
    with _module_lock:
        mod = _module_cache.get(key)
        if mod is None:
            mod = Module._load(device, cubin)
            if cubin.key:
                _module_cache[key] = mod
    return mod


def _pack_one(value):
    """Return ``(ctypes object, pointer-or-None)`` for one kernel argument."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError("bool kernel arguments are ambiguous: pass np.int32(0/1) or np.uint8")
    # numpy scalars first: np.float64 is a subclass of Python float.
    if isinstance(value, np.generic):
        ct = _NP_TO_CTYPES.get(value.dtype)
        if ct is None:
            raise TypeError(f"unsupported scalar kernel argument dtype {value.dtype}")
        return ct(value.item()), None
    if isinstance(value, (int, float)):
        raise TypeError(f"plain Python {type(value).__name__} {value!r} has no C type: "
                        f"wrap it as np.int32 / np.int64 / np.float32, or pass a DeviceArray for a pointer")
    if isinstance(value, ctypes.Structure):
        return value, None
    if isinstance(value, ctypes._SimpleCData):
        return value, None
    if value is None:
        return ctypes.c_uint64(0), 0
    if isinstance(value, DeviceArray):
        value._require_live("kernel argument")  # (a view of a closed buffer or pool: freed memory)
        return ctypes.c_uint64(value.ptr), value.ptr
    ptr = getattr(value, "ptr", None)
    if isinstance(ptr, int) and hasattr(value, "nbytes"):
        if not _is_live(value):  # a closed DeviceBuffer / WorkspacePool: its address may be another's now
            raise ValueError(f"kernel argument: {value!r} was closed; its memory is freed")
        return ctypes.c_uint64(ptr), ptr
    arr = as_device_array(value)
    return ctypes.c_uint64(arr.ptr), arr.ptr


class PreparedLaunch:
    """A kernel launch whose configuration and arguments are packed once.

    Attributes
    ----------
    kernel : Kernel
    grid, block : tuple of 3 int
    shared_mem : int
        Dynamic shared memory per block, bytes.
    programmatic : bool
        A programmatic dependent launch (see :meth:`Kernel.prepare`).
    carveout : int or None
        This launch's preferred shared-memory carveout, percent (see :meth:`Kernel.prepare`).

    All six are read-only: the launch is packed with them once (a new configuration is a new
    :meth:`Kernel.prepare`); only the arguments change, by :meth:`set_arg`.
    """

    __slots__ = ("_kernel", "_grid", "_block", "_shared_mem", "_programmatic", "_carveout", "_values", "_argv",
                 "_argv_addr", "_keep", "_func", "_ctx_dev", "_configs", "__weakref__")

    kernel = property(lambda self: self._kernel)
    grid = property(lambda self: self._grid)
    block = property(lambda self: self._block)
    shared_mem = property(lambda self: self._shared_mem)
    programmatic = property(lambda self: self._programmatic)
    carveout = property(lambda self: self._carveout)

    def __init__(self, kernel, grid, block, shared_mem, args, programmatic=False, carveout=None):
        self._kernel = kernel
        self._grid, self._block, self._shared_mem = _launch_geometry(grid, block, shared_mem)
        self._programmatic = bool_arg("programmatic", programmatic)
        self._carveout = _carveout_arg(kernel.name, carveout)
        if self.programmatic and not programmatic_supported(kernel.module.cubin.arch):
            # Below sm_90 the code has no griddepcontrol.wait, so nothing would hold the kernel's
            # reads back until the previous kernel's writes are visible (NVIDIA/cccl#9134).
            raise ValueError(f"{kernel.name}: a programmatic launch needs code for {PDL_MIN_ARCH} or newer "
                             f"(compute capability 9.0), this kernel is compiled for {kernel.module.cubin.arch}")
        kernel.reserve_shared(self.shared_mem)
        packed = [_pack_one(a) for a in args]
        self._values = [p[0] for p in packed]
        self._keep = list(args)  # keep arrays (and their owners) alive with the launch
        self._argv = (ctypes.c_void_p * max(len(args), 1))(*[ctypes.addressof(v) for v in self._values])
        self._argv_addr = ctypes.addressof(self._argv)
        self._func = kernel._func
        self._ctx_dev = kernel.module.device
        # programmatic or a carveout: one CUlaunchConfig per stream (int handle -> config), made on
        # the first launch there; none are shared between streams, so launches stay reentrant
        self._configs = {} if self.programmatic or self.carveout is not None else None

    def set_arg(self, index: int, value) -> None:
        """Replace argument ``index`` (same C type as before; a negative index counts from the last
        argument). Graphs captured earlier keep the argument they recorded, and what it owns.

        Raises
        ------
        IndexError
            ``index`` outside the arguments.
        TypeError
            ``index`` is not an int (a bool is refused); ``value`` is not a kernel argument
            (a plain Python int or float, a bool, a str) or packs to another C type than the
            argument had.
        ValueError
            ``value``'s memory was freed (a closed DeviceBuffer or WorkspacePool, or a view of one).
        """
        n = len(self._values)
        if isinstance(index, bool):
            raise TypeError(f"argument index must be an int, got bool {index}")
        i = operator.index(index)
        if not -n <= i < n:
            raise IndexError(f"argument index {index} outside the launch's {n} arguments")
        i %= n  # (the same slot in _values and in _keep, whose extras from keep() follow the arguments)
        new, _ = _pack_one(value)
        old = self._values[i]
        if type(new) is not type(old):
            raise TypeError(f"argument {index} was {type(old).__name__}, cannot become {type(new).__name__}")
        # Point the argument vector at a copy: neither the old object (a caller's ctypes value, maybe
        # shared by other launches) nor the new one (the caller's) is written or aliased.
        copy = type(new).from_buffer_copy(new)
        self._values[i] = copy
        self._argv[i] = ctypes.addressof(copy)
        self._keep[i] = value

    def keep(self, *objs) -> "PreparedLaunch":
        """Keep ``objs`` alive as long as this launch, and as long as any graph it is captured into.

        For memory the kernel reaches through a params struct or a raw address
        (a plan's workspace pool, state buffers): ``launch.keep(plan.pool)``.
        Returns the launch, so ``kernel.prepare(...).keep(pool)`` chains.
        """
        self._keep.extend(objs)
        return self

    def _config(self, stream):
        """The ``CUlaunchConfig`` of a ``cuLaunchKernelEx`` launch on ``stream`` (made once per stream)."""
        h = stream.handle
        key = int(h)
        cfg = self._configs.get(key)
        if cfg is None:
            cfg = driver.CUlaunchConfig()
            cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = self._grid
            cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = self._block
            cfg.sharedMemBytes = self._shared_mem
            cfg.hStream = h
            attrs = _launch_attrs(self._programmatic, self._carveout)
            cfg.attrs = attrs  # copied into the config
            cfg.numAttrs = len(attrs)
            self._configs[key] = cfg
        return cfg

    def _submit(self, stream):
        """One launch attempt; returns the driver's ``(CUresult,)``."""
        if self._configs is not None:
            return driver.cuLaunchKernelEx(self._config(stream), self._func, self._argv_addr, 0)
        g, b = self._grid, self._block  # (the slots, not the properties: this is every eager launch)
        return driver.cuLaunchKernel(self._func, g[0], g[1], g[2], b[0], b[1], b[2], self._shared_mem,
                                     stream.handle, self._argv_addr, 0)

    def launch(self, stream) -> None:
        """Queue the kernel on ``stream`` (capture-safe).

        Runs in the device's primary context: one ``cuLaunchKernel`` (``cuLaunchKernelEx``
        for a programmatic launch or one with a carveout), and only if the driver refuses it (no
        context, or another one, current) is the primary context pushed for a second try and
        popped again. Inside a driverlevel capture (on its stream or on a side stream joined into
        it by events) the launch, and with it everything it keeps, is tied to the captured graph.

        Raises
        ------
        CudaError
            If the launch fails; the message names the kernel and configuration.
        """
        # Optimistic: one launch call on the hot path; only if the driver refuses it (no
        # context current, or another one) is the primary context pushed for a second try.
        (err,) = self._submit(stream)
        if err:
            dev = self._ctx_dev
            pushed = dev._push()
            try:
                (err,) = self._submit(stream)
                if err:
                    check("cuLaunchKernelEx" if self._configs is not None else "cuLaunchKernel", (err,),
                          f"{self.kernel.name} grid={self.grid} block={self.block} smem={self.shared_mem}"
                          + (" programmatic" if self.programmatic else "")
                          + (f" carveout={self.carveout}%" if self.carveout is not None else ""))
            finally:
                if pushed:
                    dev._pop()
        if _capture_guard._keep_by_id:  # a driverlevel capture is in progress somewhere
            # the launch and what it keeps now: the graph node holds these arguments even if a later
            # set_arg replaces one in this launch
            _capture_guard.note_use(stream, self, tuple(self._keep))


#: CUDA's launch limits, the same on every architecture driverlevel compiles for (CUDA C Programming
#: Guide, "Features and Technical Specifications"): grid x, y, z; block x, y, z; threads per block.
MAX_GRID_DIM = (2**31 - 1, 65_535, 65_535)
MAX_BLOCK_DIM = (1024, 1024, 64)
MAX_THREADS_PER_BLOCK = 1024


def _dim3(d, what, limits):
    """``d`` (an int, or a sequence of 1 to 3 ints; missing dimensions are 1) as a tuple of 3 Python ints,
    each checked to be >= 1 and <= its entry of ``limits``. Numpy integers are ints; bools and floats are not.

    Raises ``TypeError`` (not ints) or ``ValueError`` (a count other than 1 to 3, a dimension below 1 or
    above the limit), naming ``what`` (``"grid"``, ``"block"``)."""
    items = (d,) if isinstance(d, (int, np.integer)) else d
    if isinstance(items, (str, bytes)) or not hasattr(items, "__len__"):
        raise TypeError(f"{what} must be an int or a sequence of 1 to 3 ints, got {type(d).__name__} {d!r}")
    n = len(items)
    if not 1 <= n <= 3:
        raise ValueError(f"{what} must be 1 to 3 positive ints, got {n} dimensions: {d!r}")
    out = [1, 1, 1]
    for i in range(n):
        x = items[i]
        if type(x) is not int:  # the common case is a plain int: one test
            if is_bool(x) or not isinstance(x, (int, np.integer)):
                raise TypeError(f"{what} must be 1 to 3 positive ints, got {type(x).__name__} {x!r} in {d!r}")
            x = int(x)
        if x < 1 or x > limits[i]:
            if x < 1:
                raise ValueError(f"{what} must be 1 to 3 positive ints, got {d!r}")
            raise ValueError(f"{what} dimension {'xyz'[i]} is {x}, above CUDA's limit of {limits[i]:,} (the {what}'s "
                             f"x, y and z are at most {limits[0]:,}, {limits[1]:,} and {limits[2]:,})")
        out[i] = x
    return tuple(out)


def _launch_geometry(grid, block, shared_mem) -> tuple:
    """``(grid, block, shared_mem)`` checked against CUDA's limits before anything reaches the driver
    (which would answer ``CUDA_ERROR_INVALID_VALUE`` naming nothing): see :meth:`Kernel.prepare`."""
    grid = _dim3(grid, "grid", MAX_GRID_DIM)
    block = _dim3(block, "block", MAX_BLOCK_DIM)
    threads = block[0] * block[1] * block[2]
    if threads > MAX_THREADS_PER_BLOCK:
        raise ValueError(f"block {block} has {threads:,} threads, above CUDA's limit of {MAX_THREADS_PER_BLOCK:,} "
                         f"per block")
    if type(shared_mem) is not int:
        if is_bool(shared_mem) or not isinstance(shared_mem, (int, np.integer)):
            raise TypeError(f"shared_mem must be an int (bytes of dynamic shared memory per block), got "
                            f"{type(shared_mem).__name__} {shared_mem!r}")
        shared_mem = int(shared_mem)
    if shared_mem < 0:
        raise ValueError(f"shared_mem must be >= 0 bytes of dynamic shared memory per block, got {shared_mem}")
    return grid, block, shared_mem


class Kernel:
    """One kernel (``CUfunction``) of a loaded :class:`Module`; holds its module alive.

    Get one with :meth:`Module.kernel` (there is no public constructor). Launch it once
    with :meth:`launch`, or pack the arguments once with :meth:`prepare` and replay the
    :class:`PreparedLaunch` (the hot path, and what graphs capture).

    Arguments are typed explicitly (see the module docstring): device arrays and buffers
    become 64-bit pointers, numpy and ctypes scalars keep their C type, a
    ``ctypes.Structure`` is passed by value, ``None`` is a null pointer; a plain Python
    ``int``/``float``/``bool`` raises ``TypeError``.

    Attributes
    ----------
    module : Module
    name : str
        The entry point's name.

    Example
    -------
    >>> x = dl.DeviceBuffer.allocate(dev, 4 * 1024).as_array((1024,), np.float32)   # doctest: +SKIP
    >>> k = mod.kernel("fill_iota_f32")                                             # doctest: +SKIP
    >>> k.launch(stream, grid=4, block=256, args=[x, np.float32(1), np.int32(1024)])  # doctest: +SKIP
    """

    def __init__(self, *a, **k):
        raise RuntimeError("Kernel has no public constructor: use Module.kernel(name)")

    @classmethod
    def _create(cls, module, name, func):
        self = object.__new__(cls)
        self.module = module
        self.name = name
        self._func = func
        self._max_dynamic_shared = None  # read from the function on first use (48 KB - static)
        return self

    @property
    def resources(self):
        """ptxas's :class:`~driverlevel.runtime.KernelResources` for this kernel (or None)."""
        return self.module.cubin.resources.get(self.name)

    def attribute(self, attr) -> int:
        """A ``CUfunction_attribute`` value, e.g. ``NUM_REGS``."""
        with self.module.device.activated():
            return int(check("cuFuncGetAttribute", driver.cuFuncGetAttribute(attr, self._func)))

    def _set_attribute(self, attr, value: int) -> None:
        """Set a ``CUfunction_attribute`` in the device's primary context."""
        with self.module.device.activated():
            check("cuFuncSetAttribute", driver.cuFuncSetAttribute(self._func, attr, int(value)))

    def max_active_blocks_per_sm(self, threads: int, dynamic_shared: int = 0) -> int:
        """CTAs of this kernel that fit one SM with ``threads`` per block and ``dynamic_shared``
        bytes of dynamic shared memory (``cuOccupancyMaxActiveBlocksPerMultiprocessor``).

        Raises
        ------
        TypeError, ValueError
            ``threads`` not an int in [1, 1024] or ``dynamic_shared`` not an int >= 0 (bool and
            floats refused), before the driver is asked.
        CudaError
            If the driver refuses the query.
        """
        threads = positive_int("threads", threads)
        if threads > MAX_THREADS_PER_BLOCK:
            raise ValueError(f"threads must be at most {MAX_THREADS_PER_BLOCK} per block, got {threads}")
        dynamic_shared = non_negative_int("dynamic_shared", dynamic_shared)
        with self.module.device.activated():
            return int(check("cuOccupancyMaxActiveBlocksPerMultiprocessor",
                             driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(self._func, threads, dynamic_shared)))

    def reserve_shared(self, nbytes: int) -> None:
        """Allow launches with ``nbytes`` of dynamic shared memory (raises the opt-in limit once).

        Launches do this themselves when prepared; plans call it at construction so that
        the attribute is never set while a stream is being captured.

        Raises
        ------
        TypeError
            ``nbytes`` is not an int (bool and floats refused).
        ValueError
            If ``nbytes`` is negative, or it plus the kernel's static shared memory exceeds the
            device's limit.
        """
        nbytes = non_negative_int("nbytes", nbytes)
        if nbytes <= 0:  # nothing to allow (no driver call: prepare may run inside a capture)
            return
        if self._max_dynamic_shared is None:  # the default: 48 KB less the static shared memory
            self._max_dynamic_shared = self.attribute(
                driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)
        if nbytes > self._max_dynamic_shared:
            dev = self.module.device
            limit = dev.properties.max_shared_memory_per_block_optin
            static = self.attribute(driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)
            if nbytes + static > limit:
                raise ValueError(f"{self.name}: {nbytes} B dynamic + {static} B static shared memory exceeds "
                                 f"the device's {limit} B per block")
            self._set_attribute(driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, nbytes)
            self._max_dynamic_shared = nbytes

    def prefer_shared_memory(self, percent: int = 100) -> None:
        """Hint that this kernel's CTAs want ``percent`` % of the unified L1 / shared-memory
        storage as shared memory (``CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT``; 100
        = the largest carveout), so that more of them fit on an SM. A hint: the driver may pick
        another configuration. Call it at plan construction, not during a capture.

        Raises
        ------
        TypeError
            If ``percent`` is not an int (a bool, a float; as :meth:`prepare`'s ``carveout``).
        ValueError
            If ``percent`` is not in [0, 100].
        CudaError
            If the driver refuses the attribute.
        """
        if percent is None:
            raise TypeError(f"{self.name}: the shared-memory carveout must be an int percentage in [0, 100], got None")
        percent = _carveout_arg(self.name, percent)
        self._set_attribute(driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, percent)

    def prepare(self, grid, block, args, shared_mem: int = 0, programmatic: bool = False,
                carveout=None) -> PreparedLaunch:
        """Pack a launch once; replay it with :meth:`PreparedLaunch.launch`.

        Parameters
        ----------
        grid, block : int or tuple of 1 to 3 int
            CTAs per grid and threads per CTA (missing dimensions are 1); within CUDA's limits
            (:data:`MAX_GRID_DIM`, :data:`MAX_BLOCK_DIM`, :data:`MAX_THREADS_PER_BLOCK`).
        args : sequence
            The kernel's arguments, in order, typed as the class docstring says.
        shared_mem : int
            Dynamic shared memory per CTA, bytes (the opt-in limit is raised here,
            never during a capture, when it exceeds 48 KiB).
        programmatic : bool
            False (default): an ordinary launch (``cuLaunchKernel``), which starts after the
            work before it on the stream has completed. True: a programmatic dependent
            launch (``cuLaunchKernelEx`` with the attribute
            ``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION``; CUDA Programming
            Guide, "Programmatic Dependent Launch and Synchronization"): the kernel may start
            as soon as every CTA of the kernel before it has run
            ``griddepcontrol.launch_dependents`` (or exited), so its prologue overlaps that
            kernel's tail. The kernel must then run ``griddepcontrol.wait``
            (``dl::pdl_wait()`` of cu/common.cuh), which waits for the kernel before it to
            complete and its writes to be visible, before it touches anything that kernel
            reads or writes; every CTA should run it before exiting, so that the kernel's
            completion still implies that of those before it. Stream capture records the
            dependency as a programmatic graph edge (``CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC``
            edge data, CUDA 12.3 and newer). A kernel whose code has no wait must never be
            launched this way.
        carveout : int or None
            None (default): the kernel's own preference (:meth:`prefer_shared_memory`). An int
            in [0, 100]: this launch's preferred share of the SM's unified L1 / shared-memory
            storage as shared memory (``cuLaunchKernelEx`` with
            ``CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT``), for this launch only, so
            that plans sharing a loaded kernel may ask differently. A hint. A CTA cannot join an
            SM whose shared-memory configuration differs from its launch's until that SM has
            drained, so consecutive kernels whose CTAs should share SMs (a programmatic launch
            beside the kernel before it) need the same configuration.

        Raises
        ------
        TypeError
            For an argument with no explicit C type (plain ``int``/``float``/``bool``), a grid or
            block dimension or a ``shared_mem`` that is not an int (a float, a bool, a str), a
            ``programmatic`` that is not a bool, or a ``carveout`` that is neither None nor an int.
        ValueError
            Before the driver is called: for a grid or block of more than 3 dimensions or a
            dimension below 1, one above CUDA's limits (grid x <= 2**31 - 1, y and z <= 65,535;
            block x and y <= 1,024, z <= 64; at most 1,024 threads per block), a negative
            ``shared_mem``, more shared memory than the device allows, ``programmatic=True``
            for code compiled below sm_90 (no ``griddepcontrol``), a ``carveout`` outside
            [0, 100], or an argument whose memory was freed (a closed DeviceBuffer or
            WorkspacePool, or a DeviceArray that views one).
        """
        return PreparedLaunch(self, grid, block, shared_mem, args, programmatic, carveout)

    def launch(self, stream, grid, block, args, shared_mem: int = 0) -> PreparedLaunch:
        """Pack and queue one launch on ``stream``; returns the prepared launch for reuse.

        Parameters as :meth:`prepare`; raises as :meth:`prepare` and
        :meth:`PreparedLaunch.launch` (``CudaError`` naming the kernel and configuration), and
        before either, ``TypeError`` for a ``stream`` that is not a driverlevel
        :class:`~driverlevel.Stream` and ``ValueError`` for a closed one or one of another
        device (:meth:`PreparedLaunch.launch`, the capture-safe replay, checks nothing).
        """
        stream_arg("stream", stream, self.module.device, f"kernel {self.name}")
        p = PreparedLaunch(self, grid, block, shared_mem, args)
        p.launch(stream)
        return p

    def __repr__(self):
        return f"<Kernel {self.name} from {self.module.cubin.source_name} ({self.module.cubin.arch})>"


def struct_layout_defines(struct_cls, sizeof_name: str = "DL_SIZEOF_PARAMS") -> dict:
    """Defines ``DL_OFF_<field>`` and ``sizeof_name`` describing a ctypes params struct.

    Passed to NVRTC so that ``DL_CHECK_OFFSET`` static_asserts in the kernel source
    fail the compile when the C struct and its ctypes mirror drift apart.

    Raises
    ------
    TypeError
        ``struct_cls`` is not a ``ctypes.Structure`` subclass (an instance, an int...), or
        ``sizeof_name`` is not a str.
    ValueError
        ``sizeof_name`` is not a C identifier (it becomes ``-D<sizeof_name>=...``).
    """
    if not (isinstance(struct_cls, type) and issubclass(struct_cls, ctypes.Structure)):
        raise TypeError(f"struct_cls must be a ctypes.Structure subclass (the class, not an instance), "
                        f"got {type(struct_cls).__name__} {struct_cls!r}")
    if not isinstance(sizeof_name, str):
        raise TypeError(f"sizeof_name must be a str, got {type(sizeof_name).__name__} {sizeof_name!r}")
    if not sizeof_name.isidentifier() or not sizeof_name.isascii():
        raise ValueError(f"sizeof_name must be a C identifier (it is passed as -D{sizeof_name}=...), "
                         f"got {sizeof_name!r}")
    d = {f"DL_OFF_{name}": getattr(struct_cls, name).offset for name, *_ in struct_cls._fields_}
    d[sizeof_name] = ctypes.sizeof(struct_cls)
    return d
