"""Kernel launches without a GPU: argument packing (explicit C types, structs by value, packed once) and the
launch geometry (grid, block, dynamic shared memory), checked before the driver.

``_pack_one`` turns one argument into the ctypes object whose address goes into the
``void**`` array of ``cuLaunchKernel``; :class:`PreparedLaunch` builds that array
once. Both are checked here through the packed bytes, without a GPU.
"""

from __future__ import annotations

import ctypes
import struct

import numpy as np
import pytest

from driverlevel import DeviceArray, bfloat16
from driverlevel._module import PreparedLaunch, _pack_one, struct_layout_defines
from driverlevel.selftest import SaxpyParams
from driver_stub_util import DEV0, DEV1, stream_on


class FakeDevice:
    ordinal = 0

    def set_current(self):
        pass


DEV = FakeDevice()


def packed_bytes(value) -> bytes:
    obj, _ = _pack_one(value)
    return ctypes.string_at(ctypes.addressof(obj), ctypes.sizeof(obj))


@pytest.mark.parametrize("value, fmt", [
    (np.int32(-7), "<i"),
    (np.int64(-(2**40) - 3), "<q"),
    (np.uint32(0xFFFFFFFE), "<I"),
    (np.uint64(2**63 + 5), "<Q"),
    (np.float32(1.5), "<f"),
    (np.float64(-2.25), "<d"),  # np.float64 subclasses Python float: must still be accepted
    (np.int16(-3), "<h"),
    (np.uint8(200), "<B"),
])
def test_numpy_scalars_keep_their_c_type(value, fmt):
    assert packed_bytes(value) == struct.pack(fmt, value.item())
    assert _pack_one(value)[1] is None  # not a pointer


@pytest.mark.parametrize("value", [ctypes.c_int32(-9), ctypes.c_uint64(12345678901), ctypes.c_float(0.25)])
def test_ctypes_scalars_pass_through(value):
    obj, ptr = _pack_one(value)
    assert obj is value and ptr is None


def test_device_array_is_a_64_bit_pointer():
    a = DeviceArray(0x7F00_1234_5600, (16, 4), np.float32, DEV)
    obj, ptr = _pack_one(a)
    assert ptr == 0x7F00_1234_5600
    assert packed_bytes(a) == struct.pack("<Q", 0x7F00_1234_5600)


def test_slice_and_bfloat16_arrays_pack_their_own_address():
    a = DeviceArray(0x7F00_0000_0000, (8, 576), bfloat16, DEV)
    assert packed_bytes(a[3]) == struct.pack("<Q", 0x7F00_0000_0000 + 3 * 576 * 2)


def test_none_is_a_null_pointer():
    assert packed_bytes(None) == b"\0" * 8


def test_buffer_like_object_is_a_pointer():
    class Buf:
        ptr = 0x7F00_0000_1000
        nbytes = 64

    obj, ptr = _pack_one(Buf())
    assert ptr == Buf.ptr and packed_bytes(Buf()) == struct.pack("<Q", Buf.ptr)


def test_struct_by_value():
    p = SaxpyParams(x=0x1000, y=0x2000, a=2.0, n=77, tag=-1)
    obj, ptr = _pack_one(p)
    assert obj is p and ptr is None
    assert ctypes.sizeof(p) == 32
    assert packed_bytes(p) == struct.pack("<QQfiq", 0x1000, 0x2000, 2.0, 77, -1)


def test_struct_layout_defines_match_the_c_struct():
    d = struct_layout_defines(SaxpyParams)
    assert d == {"DL_OFF_x": 0, "DL_OFF_y": 8, "DL_OFF_a": 16, "DL_OFF_n": 20, "DL_OFF_tag": 24,
                 "DL_SIZEOF_PARAMS": 32}
    assert struct_layout_defines(SaxpyParams, "DL_SIZEOF_SAXPY")["DL_SIZEOF_SAXPY"] == 32


@pytest.mark.parametrize("args, exc, words", [
    ((5,), TypeError, "struct_cls must be a ctypes.Structure subclass (the class, not an instance), got int 5"),
    ((int,), TypeError, "struct_cls must be a ctypes.Structure subclass"),
    ((SaxpyParams(),), TypeError, "(the class, not an instance), got SaxpyParams"),
    ((SaxpyParams, 5), TypeError, "sizeof_name must be a str, got int 5"),
    ((SaxpyParams, "DL SIZEOF"), ValueError, "sizeof_name must be a C identifier (it is passed as -DDL SIZEOF=...)"),
])
def test_struct_layout_defines_names_a_bad_argument(args, exc, words):
    """An AttributeError ('int' object has no attribute '_fields_') from inside, and a sizeof_name of
    any type or text taken into the defines, before."""
    with pytest.raises(exc) as info:
        struct_layout_defines(*args)
    assert words in str(info.value)


@pytest.mark.parametrize("value, words", [
    (3, ["plain Python int", "np.int32"]),
    (2**40, ["plain Python int"]),
    (1.5, ["plain Python float", "np.float32"]),
    (True, ["bool", "ambiguous"]),
    (False, ["bool"]),
    (np.bool_(True), ["bool"]),
])
def test_untyped_python_scalars_are_refused(value, words):
    with pytest.raises(TypeError) as ei:
        _pack_one(value)
    for w in words:
        assert w in str(ei.value)


def test_unsupported_numpy_scalar_is_refused():
    with pytest.raises(TypeError, match="unsupported scalar kernel argument dtype complex64"):
        _pack_one(np.complex64(1 + 2j))


def test_host_numpy_array_is_refused():
    with pytest.raises(TypeError, match="host memory"):
        _pack_one(np.zeros(4, np.float32))


def test_arbitrary_object_is_refused():
    with pytest.raises(TypeError, match="neither __cuda_array_interface__ nor __dlpack__"):
        _pack_one(object())


# -- PreparedLaunch: packed once, updated in place -------------------------------------------
class FakeKernel:
    name = "fake"

    def __init__(self):
        self._func = object()
        self.module = type("M", (), {"device": DEV})()
        self.shared_requests = []

    def reserve_shared(self, nbytes):
        self.shared_requests.append(nbytes)


def _argv(p: PreparedLaunch, n: int) -> list:
    return [ctypes.c_void_p.from_address(p._argv_addr + 8 * i).value for i in range(n)]


def test_prepared_launch_packs_once_and_points_at_each_value():
    x = DeviceArray(0x7F00_0000_0000, (1024,), np.float32, DEV)
    k = FakeKernel()
    params = SaxpyParams(x=1, y=2, a=3.0, n=4, tag=5)
    p = PreparedLaunch(k, (4,), 256, 70_000, [x, np.float32(2.0), np.int32(1024), params])
    assert p.grid == (4, 1, 1) and p.block == (256, 1, 1) and p.shared_mem == 70_000
    assert k.shared_requests == [70_000]  # the >48 KB opt-in is asked once, at prepare time
    argv = _argv(p, 4)
    assert ctypes.string_at(argv[0], 8) == struct.pack("<Q", x.ptr)
    assert ctypes.string_at(argv[1], 4) == struct.pack("<f", 2.0)
    assert ctypes.string_at(argv[2], 4) == struct.pack("<i", 1024)
    assert ctypes.string_at(argv[3], 32) == bytes(params)
    assert p._keep[0] is x  # arrays (and their owners) stay alive with the launch


def test_prepared_launch_configuration_is_read_only():
    """The configuration is packed once (cuLaunchKernelEx's config cached per stream): setting
    grid, carveout or programmatic afterwards would be silently ignored, so it is refused."""
    p = PreparedLaunch(FakeKernel(), (4,), 256, 0, [np.int32(1)])
    for name, value in (("grid", (8, 1, 1)), ("block", (128, 1, 1)), ("shared_mem", 1024), ("programmatic", True),
                        ("carveout", 50), ("kernel", None)):
        with pytest.raises(AttributeError):
            setattr(p, name, value)
    assert p.grid == (4, 1, 1) and p.carveout is None and p.programmatic is False


def test_set_arg_updates_the_argument_vector():
    x = DeviceArray(0x7F00_0000_0000, (8,), np.float32, DEV)
    y = DeviceArray(0x7F00_0000_8000, (8,), np.float32, DEV)
    p = PreparedLaunch(FakeKernel(), 1, 32, 0, [x, np.int32(8)])
    argv_addr = p._argv_addr
    p.set_arg(0, y)
    p.set_arg(-1, np.int32(5))  # (a negative index counts from the last argument)
    after = _argv(p, 2)
    assert p._argv_addr == argv_addr  # the vector the launch passes stays where it was
    assert ctypes.string_at(after[0], 8) == struct.pack("<Q", y.ptr)
    assert ctypes.string_at(after[1], 4) == struct.pack("<i", 5)
    assert p._keep[0] is y and p._keep[1] == 5
    with pytest.raises(IndexError, match="argument index 2 outside the launch's 2 arguments"):
        p.set_arg(2, np.int32(1))


def test_set_arg_never_writes_a_callers_ctypes_value_and_keeps_keep_extras():
    """A ctypes value given to two launches was overwritten in both by one set_arg; a negative index replaced
    the last keep() extra instead of the last argument."""
    shared = ctypes.c_int32(5)
    a = PreparedLaunch(FakeKernel(), 1, 32, 0, [shared])
    b = PreparedLaunch(FakeKernel(), 1, 32, 0, [shared])
    pool = object()
    a.keep(pool)
    new = ctypes.c_int32(7)
    a.set_arg(-1, new)
    assert shared.value == 5 and ctypes.string_at(_argv(b, 1)[0], 4) == struct.pack("<i", 5)
    assert ctypes.string_at(_argv(a, 1)[0], 4) == struct.pack("<i", 7)
    new.value = 9  # (nor aliases the new one)
    assert ctypes.string_at(_argv(a, 1)[0], 4) == struct.pack("<i", 7)
    assert a._keep == [new, pool]


def test_set_arg_refuses_a_type_change():
    p = PreparedLaunch(FakeKernel(), 1, 32, 0, [np.int32(1)])
    with pytest.raises(TypeError, match="argument 0 was c_int, cannot become c_long"):
        p.set_arg(0, np.int64(1))


def test_no_arguments():
    p = PreparedLaunch(FakeKernel(), 1, 1, 0, [])
    assert p._argv_addr  # a valid (empty) array for cuLaunchKernel


@pytest.mark.parametrize("grid", [0, (1, 0), (-1,), (1, 1, 1, 1)])
def test_bad_grid_is_refused(grid):
    with pytest.raises(ValueError, match="grid must be 1 to 3 positive ints"):
        PreparedLaunch(FakeKernel(), grid, 32, 0, [])


# -- programmatic dependent launch: cuLaunchKernelEx with one attribute -------------------------
class FakeStream:
    def __init__(self, handle):
        from cuda.bindings import driver

        self.handle = driver.CUstream(handle)


def _fake_kernel(arch):
    k = FakeKernel()
    k.module.cubin = type("C", (), {"arch": arch})()
    return k


@pytest.mark.parametrize("arch", ["sm_80", "sm_86", "sm_89"])
def test_programmatic_launch_is_refused_below_sm_90(arch):
    with pytest.raises(ValueError, match=f"needs code for sm_90 or newer.*compiled for {arch}"):
        PreparedLaunch(_fake_kernel(arch), 1, 32, 0, [], programmatic=True)
    assert not PreparedLaunch(_fake_kernel(arch), 1, 32, 0, []).programmatic  # the default: ordinary


def test_programmatic_must_be_a_bool():
    with pytest.raises(TypeError, match="programmatic must be a bool"):
        PreparedLaunch(_fake_kernel("sm_90"), 1, 32, 0, [], programmatic=1)


@pytest.mark.parametrize("arch", ["sm_90", "sm_100", "sm_120"])
def test_programmatic_launch_config(arch):
    """One CUlaunchConfig per stream: the grid, block, shared memory and stream of the launch,
    and one attribute, PROGRAMMATIC_STREAM_SERIALIZATION = 1."""
    from cuda.bindings import driver

    p = PreparedLaunch(_fake_kernel(arch), (3, 2), (128, 2), 4096, [np.int32(1)], programmatic=True)
    assert p.programmatic
    s1, s2 = FakeStream(0x1000), FakeStream(0x2000)
    cfg = p._config(s1)
    assert p._config(s1) is cfg and p._config(s2) is not cfg  # made once per stream
    assert (cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ) == (3, 2, 1)
    assert (cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ) == (128, 2, 1)
    assert cfg.sharedMemBytes == 4096 and int(cfg.hStream) == 0x1000 and int(p._config(s2).hStream) == 0x2000
    assert cfg.numAttrs == 1 and len(cfg.attrs) == 1
    attr = cfg.attrs[0]
    assert attr.id == driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    assert attr.value.programmaticStreamSerializationAllowed == 1


@pytest.mark.parametrize("bad, exc", [(True, TypeError), (50.0, TypeError), ("100", TypeError), (-1, ValueError),
                                      (101, ValueError)])
def test_carveout_is_checked_before_the_driver(bad, exc):
    with pytest.raises(exc, match="carveout must be"):
        PreparedLaunch(_fake_kernel("sm_90"), 1, 32, 0, [], carveout=bad)


@pytest.mark.parametrize("programmatic", [False, True])
def test_carveout_launch_config(programmatic):
    """A launch with a carveout goes through cuLaunchKernelEx with the attribute
    PREFERRED_SHARED_MEMORY_CARVEOUT (after PROGRAMMATIC_STREAM_SERIALIZATION when both); without
    one (None, the default) an ordinary launch stays a plain cuLaunchKernel."""
    from cuda.bindings import driver

    ids = driver.CUlaunchAttributeID
    assert PreparedLaunch(_fake_kernel("sm_90"), 1, 32, 0, []).carveout is None
    assert PreparedLaunch(_fake_kernel("sm_90"), 1, 32, 0, [])._configs is None
    for pct in (0, 37, np.int32(100)):
        p = PreparedLaunch(_fake_kernel("sm_80" if not programmatic else "sm_90"), 4, 64, 0, [],
                           programmatic=programmatic, carveout=pct)
        assert p.carveout == int(pct) and type(p.carveout) is int
        cfg = p._config(FakeStream(0x4000))
        want = ([ids.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION] if programmatic else []) + [
            ids.CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT]
        assert cfg.numAttrs == len(want) and [a.id for a in cfg.attrs] == want
        assert cfg.attrs[-1].value.sharedMemCarveout == int(pct)
        if programmatic:
            assert cfg.attrs[0].value.programmaticStreamSerializationAllowed == 1


def test_carveout_launch_calls_the_extended_launch(monkeypatch):
    from cuda.bindings import driver

    from driverlevel import _module

    calls = []
    ok = (driver.CUresult.CUDA_SUCCESS,)
    monkeypatch.setattr(_module.driver, "cuLaunchKernel", lambda *a: calls.append(("plain", a)) or ok)
    monkeypatch.setattr(_module.driver, "cuLaunchKernelEx", lambda *a: calls.append(("ex", a)) or ok)
    s = FakeStream(0x5000)
    p = PreparedLaunch(_fake_kernel("sm_90"), 2, 64, 0, [np.int32(5)], carveout=100)
    p.launch(s)
    assert calls == [("ex", (p._config(s), p._func, p._argv_addr, 0))]


def test_launch_calls_the_driver_once_with_the_packed_argv(monkeypatch):
    """Ordinary: cuLaunchKernel(func, grid, block, smem, stream, argv address, 0), as before;
    programmatic: cuLaunchKernelEx(config, func, the same argv address, 0)."""
    from cuda.bindings import driver

    from driverlevel import _module

    calls = []
    ok = (driver.CUresult.CUDA_SUCCESS,)
    monkeypatch.setattr(_module.driver, "cuLaunchKernel", lambda *a: calls.append(("plain", a)) or ok)
    monkeypatch.setattr(_module.driver, "cuLaunchKernelEx", lambda *a: calls.append(("ex", a)) or ok)
    s = FakeStream(0x3000)
    plain = PreparedLaunch(_fake_kernel("sm_90"), 2, 64, 128, [np.int32(5)])
    plain.launch(s)
    assert calls == [("plain", (plain._func, 2, 1, 1, 64, 1, 1, 128, s.handle, plain._argv_addr, 0))]
    calls.clear()
    pdl = PreparedLaunch(_fake_kernel("sm_90"), 2, 64, 128, [np.int32(5)], programmatic=True)
    pdl.launch(s)
    pdl.launch(s)
    cfg = pdl._config(s)
    assert calls == [("ex", (cfg, pdl._func, pdl._argv_addr, 0))] * 2


# -- Kernel: shared-memory opt-in and carveout hint ------------------------------------------
class _Activation:
    def __init__(self, log):
        self.log = log

    def __enter__(self):
        self.log.append("enter")

    def __exit__(self, *exc):
        self.log.append("exit")


def _bare_kernel(log):
    from driverlevel._module import Kernel

    dev = type("D", (), {"activated": lambda self: _Activation(log)})()
    return Kernel._create(type("M", (), {"device": dev})(), "fake", object())


def test_reserve_shared_of_nothing_calls_no_driver(monkeypatch):
    """reserve_shared(0) returns at once: a kernel's first prepare may run inside a capture."""
    from driverlevel import _module

    log = []
    monkeypatch.setattr(_module.driver, "cuFuncGetAttribute", lambda *a: log.append("get") or (1, 0))
    monkeypatch.setattr(_module.driver, "cuFuncSetAttribute", lambda *a: log.append("set") or (1,))
    _bare_kernel(log).reserve_shared(0)
    assert log == []


def test_prefer_shared_memory_sets_the_carveout_in_the_primary_context(monkeypatch):
    from cuda.bindings import driver

    from driverlevel import _module

    log = []
    ok = (driver.CUresult.CUDA_SUCCESS,)
    monkeypatch.setattr(_module.driver, "cuFuncSetAttribute", lambda *a: log.append(("set",) + a) or ok)
    k = _bare_kernel(log)
    k.prefer_shared_memory(100)
    assert log == ["enter", ("set", k._func, driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                             100), "exit"]
    for bad in (-1, 101):
        with pytest.raises(ValueError, match="percentage in"):
            k.prefer_shared_memory(bad)
    for bad in (50.0, True, None, "100"):  # (the same types as prepare(carveout=) refuses, and None)
        with pytest.raises(TypeError, match="int percentage"):
            k.prefer_shared_memory(bad)


# -- launch geometry, checked before the driver --------------------------------------------------------------
def _fake_launch_kernel(monkeypatch):
    """A kernel whose launches must not reach the driver."""
    from driverlevel import _module

    def no_driver(*a, **k):
        raise AssertionError("the driver was called")

    monkeypatch.setattr(_module.driver, "cuLaunchKernel", no_driver)
    monkeypatch.setattr(_module.driver, "cuLaunchKernelEx", no_driver)
    return FakeKernel()  # its reserve_shared records the requests: none may come from a refused launch


@pytest.mark.parametrize("grid, block, shared_mem, exc, words", [
    (0, 32, 0, ValueError, "grid must be 1 to 3 positive ints, got 0"),
    ((4, -1), 32, 0, ValueError, "grid must be 1 to 3 positive ints, got (4, -1)"),
    (1, 0, 0, ValueError, "block must be 1 to 3 positive ints, got 0"),
    ((1, 1, 1, 1), 32, 0, ValueError, "grid must be 1 to 3 positive ints, got 4 dimensions"),
    ((), 32, 0, ValueError, "grid must be 1 to 3 positive ints, got 0 dimensions"),
    (2.0, 32, 0, TypeError, "grid must be an int or a sequence of 1 to 3 ints, got float 2.0"),
    ((4, 2.5), 32, 0, TypeError, "grid must be 1 to 3 positive ints, got float 2.5 in (4, 2.5)"),
    (True, 32, 0, TypeError, "grid must be 1 to 3 positive ints, got bool True"),
    ("4", 32, 0, TypeError, "grid must be an int or a sequence of 1 to 3 ints, got str '4'"),
    (None, 32, 0, TypeError, "grid must be an int or a sequence of 1 to 3 ints, got NoneType None"),
    (2**31, 32, 0, ValueError, "grid dimension x is 2147483648, above CUDA's limit of 2,147,483,647"),
    ((1, 65_536), 32, 0, ValueError, "grid dimension y is 65536, above CUDA's limit of 65,535"),
    ((1, 1, 65_536), 32, 0, ValueError, "grid dimension z is 65536, above CUDA's limit of 65,535"),
    (1, 1025, 0, ValueError, "block dimension x is 1025, above CUDA's limit of 1,024"),
    (1, (1, 1025), 0, ValueError, "block dimension y is 1025, above CUDA's limit of 1,024"),
    (1, (1, 1, 65), 0, ValueError, "block dimension z is 65, above CUDA's limit of 64"),
    (1, (64, 32), 0, ValueError, "block (64, 32, 1) has 2,048 threads, above CUDA's limit of 1,024 per block"),
    (1, (16, 16, 8), 0, ValueError, "block (16, 16, 8) has 2,048 threads"),
    (1, 32, -1, ValueError, "shared_mem must be >= 0 bytes of dynamic shared memory per block, got -1"),
    (1, 32, 1.5, TypeError, "shared_mem must be an int (bytes of dynamic shared memory per block), got float 1.5"),
    (1, 32, "4096", TypeError, "shared_mem must be an int"),
    (1, 32, True, TypeError, "shared_mem must be an int"),
])
def test_bad_launch_geometry_is_refused_before_the_driver(monkeypatch, grid, block, shared_mem, exc, words):
    """These reached cuLaunchKernel (CUDA_ERROR_INVALID_VALUE, naming nothing), or were truncated (2.5 -> 2)."""
    import numpy as np

    from driverlevel._module import PreparedLaunch

    k = _fake_launch_kernel(monkeypatch)
    with pytest.raises(exc) as ei:
        PreparedLaunch(k, grid, block, shared_mem, [np.int32(1)])
    assert words in str(ei.value)
    assert k.shared_requests == []  # refused before the shared-memory opt-in too


@pytest.mark.parametrize("grid, block, shared_mem, want", [
    (2**31 - 1, 1024, 0, ((2**31 - 1, 1, 1), (1024, 1, 1), 0)),
    ((1, 65_535, 65_535), (1, 1024), 0, ((1, 65_535, 65_535), (1, 1024, 1), 0)),
    (1, (16, 1, 64), 0, ((1, 1, 1), (16, 1, 64), 0)),
    ((3, 2), [32, 32], 0, ((3, 2, 1), (32, 32, 1), 0)),
])
def test_launch_geometry_at_the_limits_is_accepted(monkeypatch, grid, block, shared_mem, want):
    import numpy as np

    from driverlevel._module import PreparedLaunch

    p = PreparedLaunch(_fake_launch_kernel(monkeypatch), grid, block, shared_mem, [])
    assert (p.grid, p.block, p.shared_mem) == want
    assert all(type(v) is int for v in p.grid + p.block)
    q = PreparedLaunch(_fake_launch_kernel(monkeypatch), np.int64(7), np.array([32, 2]), np.uint32(0), [])
    assert (q.grid, q.block, q.shared_mem) == ((7, 1, 1), (32, 2, 1), 0) and type(q.shared_mem) is int


def test_kernel_launch_checks_the_geometry_before_the_driver(monkeypatch):
    from driverlevel._module import Kernel

    k = _fake_launch_kernel(monkeypatch)
    k.module.cubin = type("C", (), {"arch": "sm_90"})()
    with pytest.raises(ValueError, match="block dimension z is 65"):
        Kernel.launch(k, stream_on(DEV0), 1, (1, 1, 65), [])


@pytest.mark.parametrize("stream, exc, words", [
    (None, TypeError, r"^stream must be a driverlevel Stream \(Device.create_stream\(\) or Stream.from_handle\), "
                      r"got NoneType"),
    (0, TypeError, r"^stream must be a driverlevel Stream .*got int"),
    ("closed", ValueError, r"^stream: this Stream was closed \(Stream.close\); create a new one$"),
    ("other device", ValueError, r"^stream is on device 1, but kernel fake is on device 0$"),
])
def test_kernel_launch_checks_its_stream_before_the_driver(monkeypatch, stream, exc, words):
    """Kernel.launch (the eager convenience) took a closed stream to the driver and gave AttributeError
    ('handle') for None or an int (fresh-user review, seventy-seventh session); PreparedLaunch.launch, the
    capture-safe replay, still checks nothing."""
    import weakref

    from driverlevel._module import Kernel

    k = _fake_launch_kernel(monkeypatch)
    k.module.cubin = type("C", (), {"arch": "sm_90"})()
    if stream == "closed":
        stream = stream_on(DEV0)
        stream._finalizer = weakref.finalize(FakeKernel(), lambda: None)  # (any weak-referenceable object)
        stream._finalizer()
    elif stream == "other device":
        stream = stream_on(DEV1)
    with pytest.raises(exc, match=words):
        Kernel.launch(k, stream, 1, 32, [np.int32(1)])
    assert k.shared_requests == []  # nothing was prepared either


def test_an_argument_whose_memory_was_freed_is_refused():
    """A view of a closed buffer, or the closed buffer itself, was packed and launched (fresh-user
    review, seventy-seventh session): the kernel would have written freed memory."""
    import weakref

    class Buf:  # a DeviceBuffer-like allocation with a finalizer, closed
        ptr, nbytes = 0x7F00_0000_1000, 4096

        def __init__(self):
            self._finalizer = weakref.finalize(self, lambda: None)

        def __repr__(self):
            return "<Buf closed>"

    buf = Buf()
    view = DeviceArray(buf.ptr, (16,), np.float32, DEV, owner=buf)
    assert _pack_one(view)[1] == buf.ptr and _pack_one(buf)[1] == buf.ptr  # open: packed as before
    buf._finalizer()
    with pytest.raises(ValueError, match=r"^kernel argument: the memory of this array was freed \(<Buf closed> "
                                         r"was closed\); nothing was queued$"):
        _pack_one(view)
    with pytest.raises(ValueError, match=r"^kernel argument: <Buf closed> was closed; its memory is freed$"):
        _pack_one(buf)
    q = PreparedLaunch(FakeKernel(), 1, 32, 0, [np.int32(1)])
    with pytest.raises(ValueError, match="freed"):
        q.set_arg(0, view)


@pytest.mark.parametrize("cubin, hint", [(b"\x7fELF", "wrap an image compiled elsewhere"), (None, ""),
                                         ("k.cubin", "")])
def test_load_module_refuses_what_is_not_a_cubin_before_the_device(monkeypatch, cubin, hint):
    """Raw cubin bytes (from nvcc) or a path were an AttributeError from inside (``cubin.arch``); now
    a TypeError that names the argument, raised before the device is opened (review finding)."""
    import driverlevel as dl
    from driverlevel import _device

    def touched(device):
        raise AssertionError("the device was touched before the cubin was checked")

    monkeypatch.setattr(_device, "_check_device_arg", touched)
    with pytest.raises(TypeError, match=r"cubin must be a driverlevel.runtime.Cubin .*got " + type(cubin).__name__
                       + ".*" + hint):
        dl.load_module(0, cubin)


# -- fresh-user review (seventy-seventh session): the module / kernel API's small arguments --------------
def _arg_kernel(monkeypatch):
    from driverlevel._module import Kernel

    k = object.__new__(Kernel)
    k.name, k.module, k._max_dynamic_shared = "k", type("M", (), {"device": DEV})(), None
    monkeypatch.setattr(Kernel, "attribute", lambda self, a: pytest.fail("the driver was asked"))
    return k


@pytest.mark.parametrize("args, exc, words", [
    ((256, -1), ValueError, r"^dynamic_shared must be an int >= 0, got -1$"),
    ((2**40, 0), ValueError, r"^threads must be at most 1024 per block, got 1099511627776$"),
    ((0, 0), ValueError, r"^threads must be a positive int, got 0$"),
    ((256.0, 0), TypeError, r"^threads must be a positive int, got float 256.0$"),
    ((256, "0"), TypeError, r"^dynamic_shared must be an int >= 0, got str"),
])
def test_max_active_blocks_checks_its_arguments_before_the_driver(monkeypatch, args, exc, words):
    """Were the bindings' OverflowError ("can't convert negative value to size_t")."""
    from driverlevel._module import Kernel

    with pytest.raises(exc, match=words):
        Kernel.max_active_blocks_per_sm(_arg_kernel(monkeypatch), *args)


@pytest.mark.parametrize("nbytes, exc, words", [
    ("64", TypeError, r"^nbytes must be an int >= 0, got str"), (None, TypeError, r"got NoneType"),
    (1.5, TypeError, r"got float 1.5"), (-5, ValueError, r"^nbytes must be an int >= 0, got -5$"),
])
def test_reserve_shared_checks_nbytes_before_the_driver(monkeypatch, nbytes, exc, words):
    """'64' was "'<=' not supported between str and int"; 1.5 was taken and truncated."""
    from driverlevel._module import Kernel

    k = _arg_kernel(monkeypatch)
    with pytest.raises(exc, match=words):
        Kernel.reserve_shared(k, nbytes)
    Kernel.reserve_shared(k, 0)  # nothing to allow: no driver call


@pytest.mark.parametrize("name", [None, b"k", 3])
def test_module_kernel_name_must_be_a_str(name):
    from driverlevel._module import Module

    m = object.__new__(Module)
    m._kernels = {}
    with pytest.raises(TypeError, match=rf"^kernel name must be a str, got {type(name).__name__} "):
        m.kernel(name)


@pytest.mark.parametrize("data", [memoryview(b"\x7fELF...."), None, "\x7fELF"])
def test_load_module_refuses_a_hand_made_cubin_whose_data_is_not_bytes(monkeypatch, data):
    """Was AttributeError ('startswith') from inside Module._load, after the device was opened."""
    from driverlevel import _device
    from driverlevel._compile import Cubin
    from driverlevel._module import load_module

    monkeypatch.setattr(_device, "_check_device_arg", lambda d: pytest.fail("the device was touched first"))
    with pytest.raises(TypeError, match=rf"^cubin.data must be bytes \(the ELF image\), got {type(data).__name__}"):
        load_module(0, Cubin(data, "sm_90", "x.cu", ()))
