"""WorkspacePool arithmetic, errors and report, and the pointer registry (CPU only).

``DeviceBuffer.allocate`` is replaced by a fake that hands out a made-up address,
so the pool's own logic (alignment, offsets, sizing, exhaustion, lookup) is tested
without a GPU.
"""

from __future__ import annotations

import itertools
import math
import weakref
from types import SimpleNamespace

import numpy as np
import pytest

import driverlevel as dl
from driverlevel import DeviceBuffer, PinnedHostBuffer, PoolExhaustedError, WorkspacePool, bfloat16
from driverlevel._memory import align_up, lookup_pointer


class FakeDevice:
    ordinal = 0

    def __repr__(self):
        return "Device(0)"


DEV = FakeDevice()
_bases = itertools.count(0x7E00_0000_0000, 1 << 32)


class FakeBuffer:
    def __init__(self, nbytes, label):
        self.ptr = next(_bases)
        self.nbytes = nbytes
        self.device = DEV
        self.label = label
        self._finalizer = weakref.finalize(self, lambda: None)

    def close(self):
        self._finalizer()


@pytest.fixture
def fake_alloc(monkeypatch):
    made = []

    def allocate(device, nbytes, label="buffer"):
        b = FakeBuffer(nbytes, label)
        made.append(b)
        return b

    monkeypatch.setattr(DeviceBuffer, "allocate", staticmethod(allocate))
    return made


def test_align_up():
    assert [align_up(n, 256) for n in (0, 1, 255, 256, 257)] == [0, 256, 256, 256, 512]
    assert align_up(13, 16) == 16 and align_up(13, 1) == 13


@pytest.mark.parametrize("alignment", [0, 3, -8, 24])
def test_align_up_refuses_an_alignment_that_is_not_a_power_of_two(alignment):
    """The bit trick gave 13 for (11, 3), 0 for (10, 0) and 8 for (5, -8): refused now."""
    with pytest.raises(ValueError, match="alignment must be a positive power of two"):
        align_up(11, alignment)


def test_align_up_refuses_bools_and_negative_sizes():
    with pytest.raises(TypeError, match="bool"):
        align_up(True, 8)
    with pytest.raises(TypeError, match="bool"):
        align_up(8, True)
    with pytest.raises(ValueError, match="n must be"):
        align_up(-1, 8)


@pytest.mark.parametrize("specs, match", [
    (((4,), "f4"), r"specs\[0\] must be a \(shape, dtype\) pair, got a 1-tuple \(4,\)"),
    ({"a": ((4,), "f4")}, r"specs must be a list of \(shape, dtype\) pairs, got dict"),
    ([("q", (4,), "f4")], r"got a 3-tuple .*carve\(\) takes the name; required_bytes does not"),
    ([(4,)], r"specs\[0\] must be a \(shape, dtype\) pair"),
    ("f4", r"specs must be a list"),
])
def test_required_bytes_names_a_malformed_spec(specs, match):
    """Was "not enough values to unpack" / "too many values to unpack"."""
    with pytest.raises(TypeError, match=match):
        WorkspacePool.required_bytes(specs)


def test_capacity_rounds_up_to_alignment(fake_alloc):
    assert WorkspacePool.allocate(DEV, 1000).capacity == 1024
    assert WorkspacePool.allocate(DEV, 0).capacity == 256  # never empty
    assert WorkspacePool.allocate(DEV, 1000, alignment=4096).capacity == 4096
    assert fake_alloc[0].nbytes == 1024 and fake_alloc[0].label == "pool:workspace"


@pytest.mark.parametrize("nbytes, exc, words", [
    (-1000, ValueError, "nbytes must be an int >= 0, got -1000"),
    (-1, ValueError, "nbytes must be an int >= 0, got -1"),
    (1000.7, TypeError, "nbytes must be an int >= 0, got float 1000.7"),
    (1024.0, TypeError, "nbytes must be an int >= 0, got float 1024.0"),
    ("4096", TypeError, "nbytes must be an int >= 0, got str"),
    (True, TypeError, "nbytes must be an int >= 0, got bool"),
])
def test_pool_nbytes_must_be_a_non_negative_int(fake_alloc, nbytes, exc, words):
    """Negative sizes were silently a 256 B pool and floats were truncated; now refused before any allocation."""
    with pytest.raises(exc, match=words):
        WorkspacePool.allocate(DEV, nbytes)
    assert fake_alloc == []
    assert WorkspacePool.allocate(DEV, np.int64(1000)).capacity == 1024  # numpy integers are integers


@pytest.mark.parametrize("cls", [DeviceBuffer, PinnedHostBuffer])
@pytest.mark.parametrize("nbytes, exc, words", [
    (-1000, ValueError, "nbytes must be a positive int, got -1000"),
    (0, ValueError, "nbytes must be a positive int, got 0"),
    (1000.7, TypeError, "nbytes must be a positive int, got float 1000.7"),
    (None, TypeError, "nbytes must be a positive int, got NoneType"),
])
def test_buffer_nbytes_checked_before_the_device(monkeypatch, cls, nbytes, exc, words):
    from driverlevel import _device

    monkeypatch.setattr(_device, "_check_device_arg", lambda d: pytest.fail("the device was touched first"))
    with pytest.raises(exc, match=words):
        cls.allocate(0, nbytes)


@pytest.mark.parametrize("alignment", [0, -256, 100, 3])
def test_alignment_must_be_a_power_of_two(fake_alloc, alignment):
    with pytest.raises(ValueError, match=f"alignment must be a positive power of two, got {alignment}$"):
        WorkspacePool.allocate(DEV, 1024, alignment=alignment)
    assert fake_alloc == []


@pytest.mark.parametrize("alignment, words", [
    ("256", "alignment must be a positive power of two, got str '256'"),
    (256.0, "alignment must be a positive power of two, got float 256.0"),
    (True, "alignment must be a positive power of two, got bool True"),
    (None, "alignment must be a positive power of two, got NoneType None"),
])
def test_alignment_must_be_an_int(fake_alloc, alignment, words):
    """review15 #6: alignment='256' was a raw "'<=' not supported" TypeError, True was alignment 1."""
    with pytest.raises(TypeError) as ei:
        WorkspacePool.allocate(DEV, 1024, alignment=alignment)
    assert str(ei.value) == words and fake_alloc == []


def test_carve_offsets_are_aligned_and_stable(fake_alloc):
    pool = WorkspacePool.allocate(DEV, 1 << 20, label="attn")
    a = pool.carve("lse", (64, 9), np.float32)          # 2,304 B at 0
    b = pool.carve("flags", (3,), np.uint8)              # 3 B at 2,304
    c = pool.carve("out", (5, 512), bfloat16)            # 5,120 B at 2,560
    d = pool.carve("big", (7,), np.int64, alignment=4096)
    assert [x.offset for x in pool.carves()] == [0, 2304, 2560, 8192]
    assert a.ptr == pool.base and b.ptr == pool.base + 2304 and c.ptr == pool.base + 2560
    assert d.ptr == pool.base + 8192
    assert all(x.ptr % 256 == 0 for x in (a, b, c)) and d.ptr % 4096 == 0
    assert (a.shape, a.dtype) == ((64, 9), np.dtype(np.float32))
    assert c.dtype is bfloat16 and c.nbytes == 5120
    assert a.owner is pool and a.device is DEV
    assert pool.used == 8192 + 56 and pool.free == pool.capacity - pool.used


def test_scalar_and_empty_carves(fake_alloc):
    pool = WorkspacePool.allocate(DEV, 4096)
    s = pool.carve("step", (), np.int32)
    e = pool.carve("nothing", (0, 4), np.float32)
    n = pool.carve("int_shape", 5, np.float32)
    assert s.shape == () and s.nbytes == 4
    assert e.nbytes == 0 and e.ptr == pool.base + 256
    assert n.shape == (5,) and n.ptr == pool.base + 256


@pytest.mark.parametrize("seed", range(5))
def test_required_bytes_is_exactly_what_carving_uses(fake_alloc, seed):
    rng = np.random.default_rng(seed)
    dtypes = [np.float32, np.uint8, np.int64, bfloat16, np.int32]
    specs = [(tuple(int(x) for x in rng.integers(1, 300, size=rng.integers(1, 4))), dtypes[rng.integers(0, 5)])
             for _ in range(12)]
    need = WorkspacePool.required_bytes(specs)
    pool = WorkspacePool.allocate(DEV, need)
    assert pool.capacity == need
    for i, (shape, dt) in enumerate(specs):
        pool.carve(f"c{i}", shape, dt)
    assert align_up(pool.used, 256) == need
    # the sizing is tight: the same specs in a pool one alignment unit smaller do not fit
    if need > 256:
        small = WorkspacePool.allocate(DEV, need - 256)
        with pytest.raises(PoolExhaustedError):
            for i, (shape, dt) in enumerate(specs):
                small.carve(f"c{i}", shape, dt)


def test_required_bytes_examples():
    assert WorkspacePool.required_bytes([]) == 0
    assert WorkspacePool.required_bytes([((10,), np.float32)]) == 256
    assert WorkspacePool.required_bytes([((10,), np.float32), ((64,), np.float32)]) == 512
    assert WorkspacePool.required_bytes([((10,), np.float32)], alignment=16) == 48


def test_exhaustion_error_names_the_sizes(fake_alloc):
    pool = WorkspacePool.allocate(DEV, 1024, label="tiny")
    pool.carve("a", (100,), np.float32)  # 400 B
    with pytest.raises(PoolExhaustedError) as ei:
        pool.carve("o_part", (1000,), np.float32)
    msg = str(ei.value)
    assert msg == ("pool 'tiny' is exhausted: carve-out 'o_part' needs 4,000 bytes (3.9 KiB) at offset 512, so the "
                   "pool would need 4,512 bytes (4.4 KiB), but it holds 1,024 bytes (1.0 KiB), of which 624 bytes are "
                   "free. Size the pool with WorkspacePool.required_bytes() or the plan's pool_bytes.")
    assert isinstance(ei.value, MemoryError)
    assert [c.name for c in pool.carves()] == ["a"]  # a failed carve changes nothing
    pool.carve("fits", (128,), np.float32)
    assert pool.used == 1024


def test_duplicate_name_is_refused(fake_alloc):
    pool = WorkspacePool.allocate(DEV, 4096, label="p")
    pool.carve("x", (4,), np.float32)
    with pytest.raises(ValueError, match="pool 'p' already has a carve-out named 'x'"):
        pool.carve("x", (4,), np.float32)


def test_negative_dimension_is_refused(fake_alloc):
    pool = WorkspacePool.allocate(DEV, 4096)
    with pytest.raises(ValueError, match=r"carve 'bad': negative dimension in shape \(4, -1\)"):
        pool.carve("bad", (4, -1), np.float32)


def test_report_lists_every_carve(fake_alloc):
    pool = WorkspacePool.allocate(DEV, 4 << 20, label="attn")
    pool.carve("attn.o_part", (72, 16, 512), np.float32)
    pool.carve("attn.lse_part", (72, 16), np.float32)
    lines = pool.report().splitlines()
    assert lines[0] == f"pool 'attn' on Device(0): base 0x{pool.base:x}, 2,363,904 of 4,194,304 bytes used"
    assert lines[1].split() == ["name", "offset", "bytes", "shape", "/", "dtype"]
    assert lines[2].split() == ["attn.o_part", "0", "2,359,296", "(72,", "16,", "512)", "float32"]
    assert lines[3].split() == ["attn.lse_part", "2,359,296", "4,608", "(72,", "16)", "float32"]


def test_report_header_counts_bytes(fake_alloc):
    pool = WorkspacePool.allocate(DEV, 8192, label="w")
    pool.carve("a", (300,), np.uint8)
    assert pool.report().splitlines()[0] == f"pool 'w' on Device(0): base 0x{pool.base:x}, 300 of 8,192 bytes used"


def test_lookup_pointer_resolves_pool_and_carve(fake_alloc):
    pool = WorkspacePool.allocate(DEV, 8192, label="audit")
    a = pool.carve("a", (10,), np.float32)
    b = pool.carve("b", (10,), np.float32)
    assert lookup_pointer(a.ptr)[:3] == ("audit", "a", 0)
    assert lookup_pointer(a.ptr + 39)[:3] == ("audit", "a", 39)
    assert lookup_pointer(a.ptr + 100)[:3] == ("audit", None, 100)  # alignment padding
    assert lookup_pointer(b.ptr + 4)[:3] == ("audit", "b", 260)
    assert lookup_pointer(pool.base + pool.capacity) is None
    assert lookup_pointer(0x10) is None
    pool.close()
    assert lookup_pointer(a.ptr) is None  # a closed pool's range may belong to a newer allocation


def test_lookup_pointer_takes_addresses_and_refuses_the_rest(fake_alloc):
    """lookup_pointer(1.9) looked up address 1 (int() truncates); "x" and None raised int()'s own errors."""
    from cuda.bindings import driver

    pool = WorkspacePool.allocate(DEV, 8192, label="audit")
    a = pool.carve("a", (10,), np.float32)
    for addr in (a.ptr, np.uint64(a.ptr), driver.CUdeviceptr(a.ptr), a):
        assert lookup_pointer(addr)[:3] == ("audit", "a", 0)
    for bad in (float(a.ptr), 1.9, True, "x", None, b"1"):
        with pytest.raises(TypeError, match=r"lookup_pointer: ptr must be an int device address \(or a CUdeviceptr "
                                            r"or a DeviceArray\), got " + type(bad).__name__):
            lookup_pointer(bad)


@pytest.mark.parametrize("cls, factory", [
    (DeviceBuffer, "DeviceBuffer.allocate"), (PinnedHostBuffer, "PinnedHostBuffer.allocate"),
    (WorkspacePool, "WorkspacePool.allocate"), (dl.Stream, "Device.create_stream"), (dl.Event, "Device.create_event"),
    (dl.runtime.Graph, "driverlevel.capture"), (dl.runtime.GraphExec, "Graph.instantiate"),
    (dl.runtime.Module, "driverlevel.load_module"), (dl.runtime.Kernel, "Module.kernel"),
])
def test_handles_have_no_public_constructor(cls, factory):
    with pytest.raises(RuntimeError, match=f"has no public constructor: use {factory.replace('.', '[.]')}"):
        cls()


def test_required_bytes_refuses_what_allocate_and_carve_refuse():
    assert WorkspacePool.required_bytes([((3,), np.float32), ((2, 2), np.int64)], alignment=256) == 512  # 12 B, 32 B at 256
    with pytest.raises(ValueError, match="alignment must be a positive power of two"):
        WorkspacePool.required_bytes([((3,), np.float32)], alignment=0)
    with pytest.raises(ValueError, match="alignment must be a positive power of two"):
        WorkspacePool.required_bytes([((3,), np.float32)], alignment=3)
    with pytest.raises(ValueError, match="shape extents must be >= 0"):
        WorkspacePool.required_bytes([((-100,), np.int64)])


# -- review15 #1: sizes are Python ints, never wrapped -------------------------------------------
def _fresh_pool(fake_alloc, capacity=1 << 20):
    return WorkspacePool.allocate(DEV, capacity, label="x")


def test_required_bytes_is_exact_for_shapes_past_int64():
    """np.prod(..., dtype=int64) wrapped 2**64 elements to 0 (required_bytes returned 0)."""
    assert WorkspacePool.required_bytes([((2**32, 2**32), "float32")]) == 2**66
    assert WorkspacePool.required_bytes([((4096, 2**52 - 1), np.uint8)]) == align_up(4096 * (2**52 - 1), 256)
    from driverlevel.request_state import RequestState

    specs = RequestState.specs(max_batch=2**32, max_context=2**32, num_slots=1, r2t_dtype=np.int64)
    total = 0
    for _, shape, dt in specs:  # the same sum, by hand
        total = align_up(total, 256) + math.prod(shape) * np.dtype(dt).itemsize
    assert WorkspacePool.required_bytes([(s, d) for _, s, d in specs]) == align_up(total, 256)
    assert total > 2**67  # req_to_token alone: 2**64 int64 entries


@pytest.mark.parametrize("shape, nbytes", [
    ((4096, 2**52 - 1), 4096 * (2**52 - 1)),        # the int64 product wrapped to -4096
    ((3, 2**62), 3 * 2**62),                          # wrapped to -2**62
    ((2**32, 2**32), 2**64),                          # wrapped to 0
])
def test_an_oversized_carve_is_refused_and_changes_nothing(fake_alloc, shape, nbytes):
    pool = _fresh_pool(fake_alloc)
    a = pool.carve("a", (4096,), np.uint8)
    with pytest.raises(PoolExhaustedError) as ei:
        pool.carve("bad", shape, np.uint8)
    assert str(ei.value).startswith(f"pool 'x' is exhausted: carve-out 'bad' needs {nbytes:,} bytes (")
    assert f" at offset 4,096, so the pool would need {nbytes + 4096:,} bytes (" in str(ei.value)
    assert f"but it holds {1 << 20:,} bytes (1.0 MiB)" in str(ei.value)
    assert pool.used == 4096 and [c.name for c in pool.carves()] == ["a"]
    c = pool.carve("c", (4096,), np.uint8)  # was carved at a's address (pool.used had gone down)
    assert c.ptr == a.ptr + 4096 and pool.used == 8192


def test_a_carve_and_its_array_agree_on_the_size(fake_alloc):
    pool = _fresh_pool(fake_alloc)
    arr = pool.carve("big", (1 << 10, 1 << 8), np.float32)
    assert arr.nbytes == pool.carves()[0].nbytes == 1 << 20 and pool.used == 1 << 20


@pytest.mark.parametrize("call", [
    lambda: DeviceBuffer.allocate(0, 1 << 63), lambda: PinnedHostBuffer.allocate(0, 1 << 64),
    lambda: WorkspacePool.allocate(0, 1 << 66),
])
def test_allocations_past_int64_are_refused_before_the_device(monkeypatch, call):
    from driverlevel import _device

    monkeypatch.setattr(_device, "_check_device_arg", lambda d: pytest.fail("the device was touched first"))
    with pytest.raises(ValueError, match=r"^nbytes must be at most 2\*\*63 - 1, got \d+$"):
        call()


def test_a_pool_whose_rounded_size_passes_int64_says_so(monkeypatch):
    """2**63 - 1 bytes is allowed, but rounded up to the alignment it is not: the message said
    'got 9223372036854775808', a number the caller never passed."""
    from driverlevel import _device

    monkeypatch.setattr(_device, "_check_device_arg", lambda d: pytest.fail("the device was touched first"))
    with pytest.raises(ValueError, match=r"^nbytes 9223372036854775807 rounded up to the alignment \(256\) is "
                                         r"9223372036854775808, over 2\*\*63 - 1$"):
        WorkspacePool.allocate(0, (1 << 63) - 1, alignment=256)


def test_request_state_refuses_a_pool_past_int64_before_the_device(monkeypatch):
    """RequestState.allocate sized its pool with the wrapped required_bytes (90 GB for a state of over 2**66 B)."""
    from driverlevel import _device, request_state
    from driverlevel.request_state import RequestState

    touched = lambda d: pytest.fail("the device was touched first")  # noqa: E731
    monkeypatch.setattr(request_state, "_check_device_arg", touched)
    monkeypatch.setattr(_device, "_check_device_arg", touched)
    with pytest.raises(ValueError) as ei:
        RequestState.allocate(0, max_batch=2**32, max_context=2**32, num_slots=1, r2t_dtype=np.int64)
    assert str(ei.value).startswith("the request state would need ")
    assert str(ei.value).endswith("bytes (max_batch=4294967296, max_context=4294967296, num_slots=1): more than 2**63 - 1")
    with pytest.raises(TypeError, match=r"^label must be a str, got int 5$"):
        RequestState.allocate(0, max_batch=2, max_context=64, num_slots=4, label=5)


def test_request_state_slot_ids_must_fit_an_int32_table():
    from driverlevel.request_state import RequestState

    assert RequestState.specs(max_batch=1, max_context=8, num_slots=1 << 31)[5][1] == (1 << 31,)
    with pytest.raises(ValueError) as ei:
        RequestState.specs(max_batch=1, max_context=8, num_slots=(1 << 31) + 1)
    assert str(ei.value) == ("num_slots must be at most 2**31 with an int32 req_to_token (slot ids 0 .. num_slots - 1 "
                             "are stored in it), got 2147483649; use r2t_dtype=np.int64")
    assert RequestState.specs(max_batch=1, max_context=8, num_slots=(1 << 31) + 1, r2t_dtype=np.int64)[5][1] == (2**31 + 1,)


# -- review15 #2: PinnedHostBuffer views stay inside the buffer -------------------------------------
def _pinned(nbytes=1024):
    """A mapped PinnedHostBuffer over a numpy array (allocation needs a GPU; the view methods do not)."""
    b = object.__new__(PinnedHostBuffer)
    b._host = np.zeros(nbytes, np.uint8)  # (host memory the stand-in's views read; kept by the stand-in)
    b.nbytes, b.mapped, b.device, b.device_ptr, b.label = nbytes, True, DEV, 0x7F00_0010_0000, "p"
    b.host_ptr = b._host.ctypes.data
    return b


@pytest.mark.parametrize("method", ["as_array", "numpy"])
@pytest.mark.parametrize("kwargs, exc, words", [
    (dict(offset=-4096), ValueError, "offset must be an int >= 0, got -4096"),
    (dict(shape=(4,), dtype=np.uint8, offset=-8), ValueError, "offset must be an int >= 0, got -8"),
    (dict(shape=(4,), dtype=np.int32, offset=3), ValueError, "offset must be a multiple of int32's item size 4, got 3"),
    (dict(dtype=bfloat16, offset=1), ValueError, "offset must be a multiple of bfloat16's item size 2, got 1"),
    (dict(offset=2048), ValueError, "offset 2048 is past the end of the buffer's 1024 bytes"),
    (dict(shape=(4,), dtype=np.int32, offset=1016), ValueError, "view of 16 bytes at offset 1016 exceeds the buffer's 1024"),
    (dict(offset=8.0), TypeError, "offset must be an int >= 0, got float 8.0"),
    (dict(offset=True), TypeError, "offset must be an int >= 0, got bool True"),
    (dict(shape=(2.5,)), TypeError, "shape must be an int or a sequence of ints, got float 2.5 at index 0 of (2.5,)"),
    (dict(shape=(4, -1)), ValueError, r"shape (4, -1) has a negative extent"),
])
def test_pinned_views_refuse_offsets_outside_the_buffer(method, kwargs, exc, words):
    """A negative offset gave a device view before the buffer, and a host view wrapped to its end."""
    b = _pinned()
    with pytest.raises(exc) as ei:
        getattr(b, method)(**kwargs)
    assert str(ei.value) == words


def test_pinned_views_in_bounds():
    b = _pinned()
    a = b.as_array((4,), np.int32, offset=8)
    assert a.ptr == b.device_ptr + 8 and a.shape == (4,) and a.owner is b
    v = b.numpy((4,), np.int32, offset=8)
    assert v.ctypes.data == b.host_ptr + 8 and v.shape == (4,) and v.dtype == np.int32
    assert b.as_array(offset=1024).shape == (0,) and b.numpy(offset=1024).shape == (0,)  # the end itself is fine
    assert b.as_array(dtype=np.int64, offset=1000).shape == (3,)
    assert b.numpy((2, 3), bfloat16, offset=1012).dtype == np.uint16


# -- review15 #6: carve / required_bytes take ints, names and supported dtypes only ----------------
@pytest.mark.parametrize("name, shape, dtype, kw, exc, words", [
    ("c", (2.9,), "uint8", {}, TypeError, "carve 'c': shape must be an int or a sequence of ints, got float 2.9 at index 0 of (2.9,)"),
    ("c", 4.7, "uint8", {}, TypeError, "carve 'c': shape must be an int or a sequence of ints, got float 4.7"),
    ("c", "4", "uint8", {}, TypeError, "carve 'c': shape must be an int or a sequence of ints, got str '4'"),
    ("c", (True, 3), "uint8", {}, TypeError, "carve 'c': shape must be an int or a sequence of ints, got bool True at index 0 of (True, 3)"),
    ("c", None, "uint8", {}, TypeError, "carve 'c': shape must be an int or a sequence of ints, got NoneType None"),
    (None, (4,), "uint8", {}, TypeError, "carve name must be a str, got NoneType None"),
    (5, (4,), "uint8", {}, TypeError, "carve name must be a str, got int 5"),
    ("", (4,), "uint8", {}, ValueError, "carve name must not be empty"),
    ("c", (4,), object, {}, TypeError, "unsupported dtype |O: a device array holds bool, int8/16/32/64, uint8/16/32/64, "
                                       "float16/32/64 or bfloat16 (driverlevel.bfloat16, \"bfloat16\", \"bf16\" or ml_dtypes.bfloat16)"),
    ("c", (4,), "U8", {}, TypeError, "unsupported dtype <U8: a device array holds bool, int8/16/32/64, uint8/16/32/64, "
                                     "float16/32/64 or bfloat16 (driverlevel.bfloat16, \"bfloat16\", \"bf16\" or ml_dtypes.bfloat16)"),
    ("c", (4,), "float32", dict(alignment=3), ValueError, "alignment must be a positive power of two, got 3"),
    ("c", (4,), "float32", dict(alignment=-256), ValueError, "alignment must be a positive power of two, got -256"),
    ("c", (4,), "float32", dict(alignment=0), ValueError, "alignment must be a positive power of two, got 0"),
    ("c", (4,), "float32", dict(alignment=True), TypeError, "alignment must be a positive power of two, got bool True"),
    ("c", (4,), "float32", dict(alignment=256.0), TypeError, "alignment must be a positive power of two, got float 256.0"),
])
def test_carve_refuses_bad_names_shapes_dtypes_and_alignments(fake_alloc, name, shape, dtype, kw, exc, words):
    """(2.9,) was carved as (2,), "4" as (4,), (True, 3) as (1, 3), alignment=3 put a float32 at base + 1."""
    pool = _fresh_pool(fake_alloc)
    pool.carve("first", (1,), np.uint8)
    with pytest.raises(exc) as ei:
        pool.carve(name, shape, dtype, **kw)
    assert str(ei.value) == words
    assert pool.used == 1 and [c.name for c in pool.carves()] == ["first"]


def test_carve_accepts_numpy_ints_and_aligns_to_the_item_size(fake_alloc):
    pool = WorkspacePool.allocate(DEV, 4096, alignment=1)
    pool.carve("byte", (1,), np.uint8)
    f = pool.carve("f", (np.int64(2), np.uint8(3)), np.float32)  # alignment 1 would put it at base + 1
    assert f.shape == (2, 3) and all(type(n) is int for n in f.shape)
    assert f.ptr == pool.base + 4 and pool.used == 28
    g = pool.carve("g", np.int32(2), np.int64, alignment=2)
    assert g.ptr == pool.base + 32
    # required_bytes places them alike
    assert WorkspacePool.required_bytes([((1,), np.uint8), ((2, 3), np.float32), ((2,), np.int64)], alignment=1) == 48


@pytest.mark.parametrize("specs, kw, exc, words", [
    ([((2.5,), "float32")], {}, TypeError, "shape must be an int or a sequence of ints, got float 2.5 at index 0 of (2.5,)"),
    ([((True,), "float32")], {}, TypeError, "shape must be an int or a sequence of ints, got bool True at index 0 of (True,)"),
    ([("4", "float32")], {}, TypeError, "shape must be an int or a sequence of ints, got str '4'"),
    ([((4,), object)], {}, TypeError, "unsupported dtype |O: a device array holds bool, int8/16/32/64, uint8/16/32/64, "
                                      "float16/32/64 or bfloat16 (driverlevel.bfloat16, \"bfloat16\", \"bf16\" or ml_dtypes.bfloat16)"),
    ([((4,), "float32")], dict(alignment="256"), TypeError, "alignment must be a positive power of two, got str '256'"),
    ([((4,), "float32")], dict(alignment=256.0), TypeError, "alignment must be a positive power of two, got float 256.0"),
])
def test_required_bytes_refuses_non_integers(specs, kw, exc, words):
    """required_bytes([((2.5,), 'float32')]) was 256 (the extent truncated to 2)."""
    with pytest.raises(exc) as ei:
        WorkspacePool.required_bytes(specs, **kw)
    assert str(ei.value) == words


def test_buffer_as_array_checks_the_shape():
    b = object.__new__(DeviceBuffer)
    b.ptr, b.nbytes, b.device, b.label = 0x7F00_0020_0000, 64, DEV, "b"
    assert b.as_array((4,), np.float32).shape == (4,) and b.as_array(dtype=np.int64).shape == (8,)
    with pytest.raises(TypeError, match=r"^shape must be an int or a sequence of ints, got float 2.5 at index 0"):
        b.as_array((2.5,), np.float32)
    with pytest.raises(ValueError, match=r"^view of 68 bytes exceeds the buffer's 64$"):
        b.as_array((17,), np.float32)


# -- a pool too small: the bytes needed and held, with units -------------------------------------------------
@pytest.fixture
def pool(monkeypatch):
    buf = SimpleNamespace(ptr=0x7E00_0000_0000, device=DEV, _finalizer=None)
    monkeypatch.setattr(dl.DeviceBuffer, "allocate", staticmethod(lambda d, n, label="": buf))
    return dl.WorkspacePool.allocate(DEV, 1 << 20, label="small")


def test_a_carve_that_does_not_fit_states_the_bytes_needed_and_held_with_units(pool):
    pool.carve("a", (1000,), np.uint8)
    with pytest.raises(dl.PoolExhaustedError) as ei:
        pool.carve("o_part", (4, 64, 1028), np.float32)
    assert str(ei.value).startswith(
        "pool 'small' is exhausted: carve-out 'o_part' needs 1,052,672 bytes (1.0 MiB) at offset 1,024, so the pool "
        "would need 1,053,696 bytes (1.0 MiB), but it holds 1,048,576 bytes (1.0 MiB), of which 1,047,576 bytes "
        "(1023.0 KiB) are free.")


def test_a_plans_pool_too_small_is_refused_before_anything_is_carved(pool):
    pool.carve("a", (1 << 19,), np.uint8)
    specs = [((1 << 18,), np.float32), ((16,), np.int64)]  # 1 MiB + 128 B
    with pytest.raises(dl.PoolExhaustedError) as ei:
        pool._require_room(specs, "DDTreePlan 'ddtree'")
    assert str(ei.value) == ("pool 'small' is too small for DDTreePlan 'ddtree': its carve-outs need 1,048,704 bytes "
                             "(1.0 MiB), but the pool has 524,288 bytes (512.0 KiB) free (it holds 1,048,576 bytes "
                             "(1.0 MiB)). Allocate it with at least the plan's pool_bytes, or let the plan "
                             "allocate its own.")
    assert [c.name for c in pool.carves()] == ["a"] and pool.used == 1 << 19
    pool._require_room([((1 << 17,), np.float32)], "DDTreePlan 'ddtree'")  # 512 KiB: fits exactly


# -- a plan's pool_bytes: the published formula plus the carve-outs' alignment -------------------------------
@pytest.mark.parametrize("num_parts, tile_rows, max_batch", [(132, 64, 8), (188, 48, 1024), (1, 16, 1), (133, 32, 7)])
def test_verify_attention_pool_bytes_hold_its_carve_outs(fake_alloc, num_parts, tile_rows, max_batch):
    from driverlevel.verify_attention import VerifyAttention

    specs = VerifyAttention._carve_specs(num_parts, tile_rows, max_batch)
    payload = sum(int(np.prod(shape)) * np.dtype(dt).itemsize for _, shape, dt in specs)
    formula = VerifyAttention.workspace_bytes_for(num_parts, tile_rows, max_batch)
    assert payload == formula  # the carve-outs are what the published formula counts
    need = WorkspacePool.required_bytes([(shape, dt) for _, shape, dt in specs])
    assert formula <= need < formula + len(specs) * WorkspacePool.DEFAULT_ALIGNMENT and need % 256 == 0
    # a pool of exactly pool_bytes takes every carve-out; 256 B less refuses before carving
    fits = WorkspacePool.allocate(DEV, need, label="fits")
    fits._require_room([(shape, dt) for _, shape, dt in specs], "VerifyAttention 'v'")
    for name, shape, dt in specs:
        fits.carve(name, shape, dt)
    short = WorkspacePool.allocate(DEV, need - 256, label="short")
    with pytest.raises(PoolExhaustedError, match="pool_bytes"):
        short._require_room([(shape, dt) for _, shape, dt in specs], "VerifyAttention 'v'")
    assert short.carves() == []


def test_a_pool_on_another_device_is_refused_by_name():
    from driverlevel._module import check_pool_device

    pool = SimpleNamespace(device=SimpleNamespace(ordinal=1), label="ws1")
    with pytest.raises(ValueError, match=r"^DDTreePlan 'ddtree': pool 'ws1' is on device 1, the plan on device 0; "):
        check_pool_device(pool, SimpleNamespace(ordinal=0), "DDTreePlan 'ddtree'")
    check_pool_device(pool, SimpleNamespace(ordinal=1), "DDTreePlan 'ddtree'")
    check_pool_device(None, SimpleNamespace(ordinal=0), "DDTreePlan 'ddtree'")


@pytest.mark.parametrize("mapped", ["no", 0, 1, None])
def test_pinned_mapped_must_be_a_bool_before_the_device(monkeypatch, mapped):
    from driverlevel import _device

    monkeypatch.setattr(_device, "_check_device_arg", lambda d: pytest.fail("the device was touched first"))
    with pytest.raises(TypeError, match=r"^mapped must be a bool, got "):
        PinnedHostBuffer.allocate(0, 4096, mapped=mapped)


def test_arrays_of_a_closed_pool_or_buffer_are_refused_before_anything_is_queued(fake_alloc):
    """After close() the address range may belong to a newer allocation: a copy, a fill, a read or a plan's
    launch through an array that views it raises instead of writing someone else's memory."""
    from driverlevel._checks import device_array_arg

    pool = WorkspacePool.allocate(DEV, 1 << 16, label="closing")
    a = pool.carve("x", (64, 9), np.float32)
    views = [a, a.reshape(576), a.reshape(576)[:8], a.view(np.uint32)]
    for v in views:
        assert device_array_arg("out", v, DEV, writable=True) is v and v._freed_owner() is None
    pool.close()
    for v in views:
        assert v._freed_owner() is pool
        for what, call in (("fill_u32", lambda: v.fill_u32(0, None)), ("fill_bytes", lambda: v.fill_bytes(0, None)),
                           ("to_numpy", lambda: v.to_numpy()),
                           ("copy_from_host", lambda: v.copy_from_host(np.zeros(v.shape, np.float32))),
                           ("copy_from", lambda: v.copy_from(v, None)), ("out", lambda: device_array_arg("out", v, DEV))):
            with pytest.raises(ValueError, match=rf"^{what}: the memory of this array was freed \(<WorkspacePool "
                                                 rf"'closing' .* was closed\); nothing was queued$"):
                call()
    # a live array copying from a freed one: the source is named
    live = WorkspacePool.allocate(DEV, 1 << 16, label="live").carve("y", (64, 9), np.float32)
    with pytest.raises(ValueError, match=r"^copy_from: src: the memory of this array was freed"):
        live.copy_from(a, None)
    buf = FakeBuffer(1024, "plain")
    arr = dl.DeviceArray(buf.ptr, (256,), np.float32, DEV, owner=buf)
    buf.close()
    with pytest.raises(ValueError, match="the memory of this array was freed"):
        arr.to_numpy()
    deep = dl.DeviceArray(buf.ptr, (256,), np.float32, DEV, owner=buf)
    for _ in range(100):  # a long chain of views still finds the closed buffer
        deep = deep[1:] if deep.shape[0] > 1 else deep.reshape(1)
    with pytest.raises(ValueError, match="the memory of this array was freed"):
        deep.fill_u32(0, None)
    foreign = dl.DeviceArray(0x1000, (4,), np.float32, DEV, owner=object())  # memory driverlevel does not own
    assert foreign._freed_owner() is None


def test_a_closed_pool_is_refused_by_a_plan_at_construction_and_before_each_launch(fake_alloc):
    from driverlevel._module import check_pool_device, check_pool_open

    pool = WorkspacePool.allocate(DEV, 1 << 16, label="ws")
    check_pool_device(pool, SimpleNamespace(ordinal=0), "VerifyAttention 'ws'")
    check_pool_open(pool, "VerifyAttention 'ws'")
    pool.close()
    for check in (lambda: check_pool_device(pool, SimpleNamespace(ordinal=0), "VerifyAttention 'ws'"),
                  lambda: check_pool_open(pool, "VerifyAttention 'ws'")):
        with pytest.raises(ValueError, match=r"^VerifyAttention 'ws': its workspace pool 'ws' was closed; build the plan "
                                             r"again on a live pool$"):
            check()


def test_no_new_view_of_a_closed_buffer_or_pool(fake_alloc):
    """A view taken after close() would point at freed memory (a host view of freed pinned memory crashes
    the process when read): numpy(), as_array() and carve() refuse."""
    b = _pinned()
    b._finalizer = weakref.finalize(b._host, lambda: None)
    b.numpy((4,), np.int32)
    b.close()
    for what, call in (("numpy", lambda: b.numpy((4,), np.int32)), ("as_array", lambda: b.as_array((4,), np.int32))):
        with pytest.raises(ValueError, match=rf"^{what}: <.*PinnedHostBuffer.* was closed; its memory is freed$"):
            call()
    pool = WorkspacePool.allocate(DEV, 1 << 12, label="gone")
    pool.carve("a", (4,), np.float32)
    pool.close()
    with pytest.raises(ValueError, match=r"^carve: <WorkspacePool 'gone' .* was closed; its memory is freed$"):
        pool.carve("b", (4,), np.float32)
    assert [c.name for c in pool.carves()] == ["a"]
    buf = object.__new__(DeviceBuffer)
    buf.ptr, buf.nbytes, buf.device, buf.label = 0x7F00_0020_0000, 64, DEV, "plain"
    buf._finalizer = weakref.finalize(pool, lambda: None)
    buf.close()
    with pytest.raises(ValueError, match=r"^as_array: <DeviceBuffer 'plain' .* was closed"):
        buf.as_array()


def test_a_pinned_view_keeps_its_buffer_alive_and_the_buffer_holds_no_cycle():
    """A numpy view of a temporary buffer read freed pinned memory (the view's base did not hold the buffer)."""
    import gc

    b = _pinned()
    freed = []
    b._finalizer = weakref.finalize(b, freed.append, "freed")
    v = b.numpy((4,), np.int32)
    v[:] = 7
    del b
    assert freed == [] and v.tolist() == [7, 7, 7, 7]  # the view holds the buffer
    del v
    assert freed == ["freed"]  # ... and nothing else does: freed at once, no cycle for the collector
    gc.collect()


@pytest.mark.parametrize("label", [5, None, b"attn"])
@pytest.mark.parametrize("cls", [DeviceBuffer, PinnedHostBuffer])
def test_a_label_must_be_a_str_before_the_device(monkeypatch, cls, label):
    """A buffer's or pool's label names it in reports and errors: a non-str one is refused before the
    device is touched (it was taken as it was, and without a GPU the call failed on the driver instead;
    a fresh-user trial's finding)."""
    from driverlevel import _device

    monkeypatch.setattr(_device, "_check_device_arg", lambda d: pytest.fail("the device was touched first"))
    with pytest.raises(TypeError, match=r"^label must be a str, got "):
        cls.allocate(0, 4096, label=label)


@pytest.mark.parametrize("label", [5, None, b"attn"])
def test_a_pool_label_must_be_a_str_before_the_buffer(fake_alloc, label):
    with pytest.raises(TypeError, match=r"^label must be a str, got "):
        WorkspacePool.allocate(DEV, 4096, label=label)
    assert fake_alloc == []


def test_a_pool_or_buffer_cannot_be_copied_or_pickled(fake_alloc):
    """copy.copy(pool) shared the carve table but not the used count: two carves at one address
    (fresh-user review, seventy-seventh session); a copied buffer shared the allocation."""
    import copy
    import pickle

    pool = WorkspacePool.allocate(DEV, 4096)
    buf = object.__new__(DeviceBuffer)  # (no driver: the refusal needs no field)
    host = object.__new__(PinnedHostBuffer)
    for obj, words in ((pool, "a WorkspacePool owns this process's device memory"),
                       (buf, "a DeviceBuffer owns this process's device memory"),
                       (host, "a PinnedHostBuffer owns this process's pinned host memory")):
        for how in (copy.copy, copy.deepcopy, pickle.dumps):
            with pytest.raises(TypeError, match=f"^{words} and cannot be pickled or copied$"):
                how(obj)
    assert pool.carve("a", (64,), np.float32).ptr != pool.carve("b", (64,), np.float32).ptr
