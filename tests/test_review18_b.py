"""Review 18 (b): device checks of foreign arrays and streams, bf16 from ml_dtypes, fill values,
``Stream.from_handle``'s handle types, stream and event arguments, numpy-int sizes, ``len()`` of a
0-d array and the pool-too-small message (CPU only).

No GPU is needed: every driver call these checks make is replaced by a stub that answers as the
driver would (``cuPointerGetAttribute``, ``cuStreamGetCtx``, ``cuStreamGetDevice``,
``cuCtxGetDevice``, ``cuMemsetD8Async``, ``cuGraphLaunch``...), and records that it was asked.
Each test fails on the code before the fix.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import numpy as np
import pytest
from cuda.bindings import driver

import driverlevel as dl
from driverlevel import DDTreePlan, DeviceArray, VerifyAttention, VerifyMetadata, bfloat16
from driverlevel import _array, _device, _dtypes, _graph, _stream
from driverlevel._checks import device_array_arg
from driverlevel._graph import Graph, GraphExec
from driverlevel._mask import bitmask_words, parse_mask_format
from driverlevel.runtime import as_device_array

PTR = 0x7F12_3456_7800
OK = driver.CUresult.CUDA_SUCCESS
STREAM_WORDS = r"stream must be a driverlevel Stream \(Device.create_stream\(\) or Stream.from_handle\), got "


class FakeDevice:
    """A stand-in for Device: an ordinal, a primary context, ``activated()``; never touches a driver."""

    def __init__(self, ordinal=0):
        self.ordinal = ordinal
        self.context = driver.CUcontext(0xC000 + ordinal)

    @contextlib.contextmanager
    def activated(self):
        yield self

    def _push(self):
        return False

    def _copy_stream(self):
        return driver.CUstream(0xC0FF)

    def __repr__(self):
        return f"FakeDevice({self.ordinal})"


DEV0, DEV1 = FakeDevice(0), FakeDevice(1)


def stream_on(device, handle=0x5000):
    s = object.__new__(dl.Stream)
    s._handle, s.device, s._capture, s._finalizer = driver.CUstream(handle), device, None, None
    return s


def event_on(device, handle=0x6000):
    e = object.__new__(dl.Event)
    e._handle, e.device, e.timing, e._finalizer = driver.CUevent(handle), device, True, None
    return e


@pytest.fixture
def calls(monkeypatch):
    """Every stubbed driver call, as ``(name, args)``; the stubs answer CUDA_SUCCESS."""
    log = []

    def stub(name, ret=()):
        def f(*args):
            log.append((name, args))
            return (OK,) + tuple(ret)
        monkeypatch.setattr(driver, name, f)

    for name in ("cuMemsetD8Async", "cuMemsetD32Async", "cuMemcpyHtoDAsync", "cuMemcpyDtoDAsync", "cuMemcpyDtoH",
                 "cuStreamSynchronize", "cuEventRecord", "cuStreamWaitEvent", "cuGraphLaunch", "cuGraphUpload"):
        stub(name)
    stub("cuEventElapsedTime", (1.5,))
    stub("cuStreamIsCapturing", (driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE,))
    stub("cuGraphInstantiate", (driver.CUgraphExec(0x7000),))
    return log


def names(log):
    return [n for n, _ in log]


# == M1: foreign arrays and streams on another device ==================================================
class DLPackOnly:
    """A foreign array that exports only DLPack, wrapping one of ours; records whether its capsule was taken."""

    def __init__(self, arr, device_type=2):
        self._arr, self._type, self.taken = arr, device_type, 0

    def __dlpack__(self, stream=None):
        self.taken += 1
        return self._arr.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return (self._type, self._arr.device.ordinal)


class CAIOnly:
    def __init__(self, ptr=PTR, shape=(4,), typestr="<f4"):
        self.__cuda_array_interface__ = dict(version=3, strides=None, shape=shape, typestr=typestr, data=(ptr, False))


def test_a_dlpack_array_of_another_device_is_refused_before_its_capsule_is_taken():
    src = DLPackOnly(DeviceArray(PTR, (4, 3), np.float32, DEV1))
    with pytest.raises(ValueError) as ei:
        as_device_array(src, device=DEV0)
    assert str(ei.value) == "DLPackOnly is on device 1 (its __dlpack_device__()), not on device 0"
    assert src.taken == 0  # the producer's capsule was never asked for
    with pytest.raises(ValueError, match=r"^q: DLPackOnly is on device 1 \(its __dlpack_device__\(\)\), not on device 0$"):
        device_array_arg("q", src, DEV0)
    ok = as_device_array(src, device=DEV1)  # on its own device it imports as before
    assert ok.ptr == PTR and ok.device is DEV1 and src.taken == 1


def test_dlpack_managed_memory_of_another_device_id_is_taken():
    """Managed memory is reachable from every device: its DLPack device id does not bind it."""
    src = DLPackOnly(DeviceArray(PTR, (4,), np.int32, DEV1), device_type=13)
    assert as_device_array(src, device=DEV0).device is DEV0


@pytest.fixture
def pointer_on(monkeypatch):
    """``cuPointerGetAttribute`` answers with the ordinal in ``pointer_on.ordinal`` and, for
    ``CU_POINTER_ATTRIBUTE_IS_MANAGED``, ``pointer_on.managed`` (a plain device allocation: 0);
    the driver is initialised."""
    asked = []
    state = SimpleNamespace(ordinal=1, managed=0, err=OK, asked=asked)
    monkeypatch.setattr(_device, "_initialized", True)

    def get(attr, ptr):
        asked.append((attr, ptr))
        if attr == driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_IS_MANAGED:
            return (state.err, state.managed)
        if attr == driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_CONTEXT:  # FakeDevice(n)'s primary context
            return (state.err, driver.CUcontext(0xC000 + state.ordinal))
        return (state.err, state.ordinal)

    monkeypatch.setattr(driver, "cuPointerGetAttribute", get)
    monkeypatch.setattr(_device, "context_ordinal", lambda ctx: int(ctx) - 0xC000)
    return state


def test_a_cai_array_of_another_device_is_refused_by_asking_the_driver(pointer_on):
    with pytest.raises(ValueError) as ei:
        device_array_arg("kv_cache", CAIOnly(), DEV0)
    assert str(ei.value) == ("kv_cache: CAIOnly is on device 1 (the driver's answer for its pointer "
                             f"0x{PTR:x}), not on device 0")
    # review 19: on another device, whether the pointer is managed memory is asked too
    assert pointer_on.asked == [(driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_CONTEXT, PTR),
                                (driver.CUpointer_attribute.CU_POINTER_ATTRIBUTE_IS_MANAGED, PTR)]
    pointer_on.ordinal = 0
    a = device_array_arg("kv_cache", CAIOnly(), DEV0)
    assert a.ptr == PTR and a.device is DEV0 and len(pointer_on.asked) == 3  # on its own device: one question


def test_a_cai_pointer_the_driver_does_not_know_is_a_cuda_error(pointer_on):
    pointer_on.err = driver.CUresult.CUDA_ERROR_INVALID_VALUE
    with pytest.raises(dl.CudaError, match=r"^cuPointerGetAttribute failed: CUDA_ERROR_INVALID_VALUE .*CONTEXT.*"
                                           r"a __cuda_array_interface__ pointer\]$"):
        as_device_array(CAIOnly(), device=DEV0)


def test_an_empty_cai_array_with_a_null_pointer_asks_nothing(pointer_on):
    a = as_device_array(CAIOnly(ptr=0, shape=(0,)), device=DEV0)
    assert a.size == 0 and a.device is DEV0 and pointer_on.asked == []


@pytest.fixture
def stream_driver(monkeypatch):
    """``cuStreamGetCtx`` / ``cuCtxGetDevice`` stubs: stream 0x5000 is in ``ctx``, on ``dev``. ``cuStreamGetDevice``
    is stubbed too, only to log it if it were asked: the stream's device comes from its context."""
    st = SimpleNamespace(ctx=DEV0.context, dev=0, log=[])
    monkeypatch.setattr(_device, "_check_device_arg", lambda d: {0: DEV0, 1: DEV1}[d] if isinstance(d, int) else d)

    def get_ctx(h):
        st.log.append(("cuStreamGetCtx", int(h)))
        return (OK, st.ctx)

    def get_dev(h):
        st.log.append(("cuStreamGetDevice", int(h)))
        return (OK, driver.CUdevice(st.dev))

    monkeypatch.setattr(driver, "cuStreamGetCtx", get_ctx)
    monkeypatch.setattr(driver, "cuStreamGetDevice", get_dev, raising=False)  # bindings before CUDA 12.8 lack it
    monkeypatch.setattr(driver, "cuCtxPushCurrent", lambda c: st.log.append(("push", int(c))) or (OK,))
    monkeypatch.setattr(driver, "cuCtxGetDevice", lambda: st.log.append(("cuCtxGetDevice",)) or (OK, driver.CUdevice(st.dev)))
    monkeypatch.setattr(driver, "cuCtxPopCurrent", lambda: st.log.append(("pop",)) or (OK, st.ctx))
    return st


def test_from_handle_takes_a_stream_of_the_primary_context_with_one_question(stream_driver):
    s = dl.Stream.from_handle(0x5000, 0)
    assert s.device is DEV0 and int(s) == 0x5000
    assert stream_driver.log == [("cuStreamGetCtx", 0x5000)]


def test_from_handle_refuses_a_stream_of_another_device(stream_driver):
    stream_driver.ctx, stream_driver.dev = DEV1.context, 1
    with pytest.raises(ValueError) as ei:
        dl.Stream.from_handle(0x5000, 0)
    assert str(ei.value) == "stream 0x5000 belongs to device 1, not to device 0: borrow it with Stream.from_handle(handle, 1)"
    # the device of the stream's context: pushed, asked and popped (_device.context_ordinal)
    assert stream_driver.log == [("cuStreamGetCtx", 0x5000), ("push", int(DEV1.context)), ("cuCtxGetDevice",), ("pop",)]


def test_from_handle_refuses_a_stream_of_another_context_of_the_device(stream_driver):
    stream_driver.ctx = driver.CUcontext(0xF00D)  # cuCtxCreate'd on device 0
    with pytest.raises(ValueError, match=r"^stream 0x5000 belongs to a context of device 0 other than its primary "
                                         r"context"):
        dl.Stream.from_handle(0x5000, DEV0)


def test_from_handle_finds_the_stream_device_by_context_ordinal_of_its_context(stream_driver, monkeypatch):
    """The ordinal in the message is _device.context_ordinal's answer for the context cuStreamGetCtx gave;
    cuStreamGetDevice (CUDA 12.8 on, missing from older bindings and drivers) is not asked."""
    asked = []
    monkeypatch.setattr(_device, "context_ordinal", lambda ctx: asked.append(int(ctx)) or 1)
    stream_driver.ctx = DEV1.context
    with pytest.raises(ValueError, match=r"^stream 0x5000 belongs to device 1, not to device 0: "
                                         r"borrow it with Stream.from_handle\(handle, 1\)$"):
        dl.Stream.from_handle(0x5000, 0)
    assert asked == [int(DEV1.context)]
    assert stream_driver.log == [("cuStreamGetCtx", 0x5000)]


@pytest.mark.parametrize("handle", [0, 1, 2])
def test_the_special_default_stream_handles_ask_nothing(stream_driver, handle):
    """0, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD name the current context's default stream."""
    assert int(dl.Stream.from_handle(handle, 0)) == handle and stream_driver.log == []


def test_a_cuda_stream_protocol_object_of_another_device_is_refused(stream_driver):
    class CoreStream:  # cuda.core's: __cuda_stream__() -> (version, address)
        def __cuda_stream__(self):
            return (0, 0x5000)

    stream_driver.ctx, stream_driver.dev = DEV1.context, 1
    with pytest.raises(ValueError, match="^stream 0x5000 belongs to device 1, not to device 0"):
        dl.Stream.from_handle(CoreStream(), 0)
    stream_driver.ctx = DEV0.context
    assert int(dl.Stream.from_handle(CoreStream(), 0)) == 0x5000


# The plans check their stream's device too (a launch on another device's stream fails in the driver).
def _arr(shape, dtype, device=DEV0):
    return DeviceArray(0x10000, shape, dtype, device)


def _ddtree_plan():
    plan = object.__new__(DDTreePlan)
    plan.device, plan.max_batch, plan.max_context = DEV0, 4, 64
    plan.depth_limit, plan.vocab, plan.logits_dtype = 3, 128, np.dtype(np.float32)
    plan.max_rows, plan.record_width = 64, 12
    plan._cache = {}
    return plan


def _state():
    B, C = 4, 64
    f = {"active": ((B,), "uint8"), "root_tokens": ((B,), "int32"), "seq_lens": ((B,), "int64"),
         "req_pool_indices": ((B,), "int64"), "req_to_token": ((B, C), "int32"), "free_slots": ((100,), "int64"),
         "free_count": ((1,), "int64")}
    return dl.RequestState(**{k: _arr(s, d) for k, (s, d) in f.items()})


def test_plans_refuse_a_stream_of_another_device_before_any_launch():
    plan = _ddtree_plan()
    with pytest.raises(ValueError, match=r"^stream is on device 1, but the plan is on device 0$"):
        plan.compile(stream_on(DEV1), _state())
    assert plan._cache == {}  # nothing packed
    verify = object.__new__(VerifyAttention)
    verify.device, verify.num_heads, verify.max_batch, verify.max_q = DEV0, 9, 8, 64
    verify.mask_format, verify.mask_words = parse_mask_format("bitmask"), bitmask_words(64)
    verify._stream_handle, verify._cached_key = None, None
    meta = VerifyMetadata(_arr((2,), "int64"), _arr((2,), "int32"), _arr((100,), "int64"), _arr((4,), "int64"),
                          _arr((4, 2), "uint32"))
    with pytest.raises(ValueError, match=r"^stream is on device 1, but the plan is on device 0$"):
        verify.run(stream_on(DEV1), _arr((4, 9, 576), bfloat16), _arr((200, 576), bfloat16), meta,
                   _arr((4, 9, 512), bfloat16))
    assert verify._stream_handle is None  # not bound


# == M3: ml_dtypes' bfloat16 ============================================================================
class bfloat(np.void):
    """numpy names a void dtype of this type, 2 bytes, "bfloat16": a lookalike of ml_dtypes' dtype."""


def test_a_void_dtype_named_bfloat16_is_refused_clearly_without_ml_dtypes():
    plain, structured = np.dtype((bfloat, 2)), np.dtype((bfloat, [("x", "<u2")]))
    assert plain.name == structured.name == "bfloat16" and plain.kind == "V" and plain.itemsize == 2
    for dt, kind in ((plain, "plain"), (structured, "structured")):
        assert not _dtypes.is_ml_bfloat16(dt)
        with pytest.raises(TypeError) as ei:
            DeviceArray(PTR, (4,), dt, DEV0)
        assert f"named 'bfloat16' (a {kind} void type, not ml_dtypes.bfloat16): a device array holds" in str(ei.value)
        assert str(ei.value).endswith(_dtypes.SUPPORTED)
        host = np.zeros(4, dt)
        with pytest.raises(TypeError, match="expected host dtype uint16 for a bfloat16 array"):
            DeviceArray(PTR, (4,), bfloat16, DEV0).copy_from_host(host)


def test_every_dtype_message_lists_the_same_bfloat16_forms():
    forms = 'driverlevel.bfloat16, "bfloat16", "bf16" or ml_dtypes.bfloat16'
    assert _dtypes.BF16_FORMS == forms
    with pytest.raises(TypeError) as ei:
        DeviceArray(PTR, (4,), np.complex64, DEV0)
    assert str(ei.value).endswith(f"or bfloat16 ({forms})")
    from driverlevel.ddtree import _logit_dtype

    with pytest.raises(TypeError) as ei:
        _logit_dtype("logits_dtype", "float16")
    assert forms in str(ei.value)
    with pytest.raises(TypeError) as ei:
        DeviceArray(PTR, (4,), bfloat16, DEV0).copy_from_host(np.zeros(4, np.float32))
    assert "ml_dtypes.bfloat16" in str(ei.value)


def test_ml_dtypes_bfloat16_is_bfloat16():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bf = ml_dtypes.bfloat16
    assert _dtypes.is_ml_bfloat16(np.dtype(bf)) and _dtypes.is_ml_bfloat16(bf)
    for dt in (bf, np.dtype(bf), "bfloat16"):
        assert _dtypes.as_dtype(dt) is bfloat16
    a = DeviceArray(PTR, (3,), bf, DEV0)
    assert a.dtype is bfloat16 and a.nbytes == 6
    from driverlevel.ddtree import _logit_dtype

    assert _logit_dtype("logits_dtype", bf) is bfloat16
    values = np.array([1.0, -2.5, 3.0e38], bf)
    bits = values.view(np.uint16)
    np.testing.assert_array_equal(_dtypes.bf16_bits_to_f32(values), values.astype(np.float32))  # read as bits
    np.testing.assert_array_equal(_dtypes.bf16_bits_to_f32(bits), values.astype(np.float32))


def test_copy_from_host_takes_an_ml_dtypes_bfloat16_array_as_its_bits(calls, monkeypatch):
    import ctypes

    ml_dtypes = pytest.importorskip("ml_dtypes")
    host = np.array([[1.0, 2.0], [-0.5, 65280.0]], ml_dtypes.bfloat16)
    seen = []
    monkeypatch.setattr(driver, "cuMemcpyHtoDAsync", lambda dst, src, n, h: seen.append(ctypes.string_at(src, n)) or (OK,))
    DeviceArray(PTR, (2, 2), bfloat16, DEV0).copy_from_host(host)
    assert seen == [host.view(np.uint16).tobytes()]


# == M4: fill values are checked, not wrapped ===========================================================
@pytest.mark.parametrize("method, value, exc, words", [
    ("fill_bytes", 256, ValueError, "fill_bytes: value must be an int in 0 .. 255, got 256"),
    ("fill_bytes", -1, ValueError, "fill_bytes: value must be an int in 0 .. 255, got -1"),
    ("fill_bytes", np.int64(1000), ValueError, "fill_bytes: value must be an int in 0 .. 255, got 1000"),
    ("fill_bytes", 1.5, TypeError, "fill_bytes: value must be an int in 0 .. 255, got float 1.5"),
    ("fill_bytes", True, TypeError, "fill_bytes: value must be an int in 0 .. 255, got bool True"),
    ("fill_bytes", "7", TypeError, "fill_bytes: value must be an int in 0 .. 255, got str '7'"),
    ("fill_u32", 2**32, ValueError, "fill_u32: word must be an int in 0 .. 4294967295, got 4294967296"),
    ("fill_u32", -1, ValueError, "fill_u32: word must be an int in 0 .. 4294967295, got -1"),
    ("fill_u32", 2.0, TypeError, "fill_u32: word must be an int in 0 .. 4294967295, got float 2.0"),
    ("fill_u32", np.float32(1), TypeError, f"fill_u32: word must be an int in 0 .. 4294967295, got float32 {np.float32(1)!r}"),
    ("fill_u32", False, TypeError, "fill_u32: word must be an int in 0 .. 4294967295, got bool False"),
])
def test_fill_values_out_of_range_or_not_integers_are_refused_before_the_memset(calls, method, value, exc, words):
    a = DeviceArray(PTR, (8,), np.float32, DEV0)
    with pytest.raises(exc) as ei:
        getattr(a, method)(value, stream_on(DEV0))
    assert str(ei.value) == words
    assert calls == []  # no memset queued


def test_fill_values_in_range_reach_the_driver_as_they_are(calls):
    a = DeviceArray(PTR, (8,), np.float32, DEV0)
    s = stream_on(DEV0)
    a.fill_bytes(np.uint8(255), s).fill_bytes(0, s).fill_u32(0xFFFFFFFF, s).fill_u32(np.uint32(0x7FC00000), s)
    assert [(n, args[1]) for n, args in calls] == [("cuMemsetD8Async", 255), ("cuMemsetD8Async", 0),
                                                  ("cuMemsetD32Async", 0xFFFFFFFF), ("cuMemsetD32Async", 0x7FC00000)]
    assert all(type(args[1]) is int for _, args in calls)


# == L2: Stream.from_handle takes what it documents ======================================================
@pytest.mark.parametrize("handle", [driver.CUevent(0x5000), driver.CUgraph(0x5000), driver.CUcontext(0x5000), 1.0,
                                    "0x5000", b"x", None, True, np.bool_(True), object()],
                         ids=lambda h: type(h).__name__)
def test_from_handle_refuses_what_is_not_a_stream_handle(stream_driver, handle):
    """A CUevent (it has __index__) was taken as the stream at its address."""
    with pytest.raises(TypeError) as ei:
        dl.Stream.from_handle(handle, 0)
    assert str(ei.value).startswith("handle must be an int stream address, a CUstream or an object with "
                                    f"__cuda_stream__, got {type(handle).__name__}")
    assert stream_driver.log == []


@pytest.mark.parametrize("pair", [(1, 0x5000), (0x5000,), [0, 0x5000], 0x5000])
def test_from_handle_refuses_a_cuda_stream_protocol_of_another_form(stream_driver, pair):
    class Odd:
        def __cuda_stream__(self):
            return pair

    with pytest.raises(TypeError, match=r"^handle.__cuda_stream__ must give \(0, address\)"):
        dl.Stream.from_handle(Odd(), 0)


def test_from_handle_takes_ints_numpy_ints_custreams_and_the_stream_protocol(stream_driver):
    class OldCoreStream:  # early cuda.core: a property
        __cuda_stream__ = property(lambda self: (0, 0x5000))

    for handle in (0x5000, np.int64(0x5000), np.uint64(0x5000), driver.CUstream(0x5000), OldCoreStream()):
        s = dl.Stream.from_handle(handle, 0)
        assert type(s.handle) is driver.CUstream and int(s) == 0x5000


# == L3: stream and event arguments are type-checked =====================================================
class CupyLikeStream:
    """What CuPy's stream looks like to us: a ``ptr``, and a class named Stream outside driverlevel."""
    ptr = 0x5000


CupyLikeStream.__name__ = CupyLikeStream.__qualname__ = "Stream"


def _array_calls(a, s):
    return {
        "copy_from_host": lambda: a.copy_from_host(np.zeros(8, np.float32), stream=s),
        "to_numpy": lambda: a.to_numpy(stream=s),
        "copy_from": lambda: a.copy_from(DeviceArray(PTR + 4096, (8,), np.float32, DEV0), s),
        "fill_bytes": lambda: a.fill_bytes(0, s),
        "fill_u32": lambda: a.fill_u32(0, s),
    }


@pytest.mark.parametrize("method", ["copy_from_host", "to_numpy", "copy_from", "fill_bytes", "fill_u32"])
@pytest.mark.parametrize("bad", [0x5000, driver.CUstream(0x5000), CupyLikeStream(), None], ids=lambda b: type(b).__name__)
def test_array_methods_refuse_a_stream_that_is_not_a_stream(calls, method, bad):
    if bad is None and method in ("copy_from_host", "to_numpy"):
        pytest.skip("stream=None is documented for the host copies")
    a = DeviceArray(PTR, (8,), np.float32, DEV0)
    with pytest.raises(TypeError) as ei:
        _array_calls(a, bad)[method]()
    assert str(ei.value).startswith(f"{method}: stream must be a driverlevel Stream (Device.create_stream() or "
                                    f"Stream.from_handle), got {type(bad).__name__}")
    if isinstance(bad, CupyLikeStream):
        assert "borrow another library's stream with driverlevel.Stream.from_handle(handle, device)" in str(ei.value)
    assert calls == []


@pytest.mark.parametrize("method", ["copy_from_host", "to_numpy", "copy_from", "fill_bytes", "fill_u32"])
def test_array_methods_refuse_a_stream_of_another_device(calls, method):
    a = DeviceArray(PTR, (8,), np.float32, DEV0)
    with pytest.raises(ValueError, match=f"^{method}: stream is on device 1, but the array is on device 0$"):
        _array_calls(a, stream_on(DEV1))[method]()
    assert calls == []
    _array_calls(a, stream_on(DEV0))[method]()  # its own device's stream: queued
    assert calls


def _exec(device=DEV0):
    ex = object.__new__(GraphExec)
    ex._handle, ex.device = driver.CUgraphExec(0x7000), device
    return ex


@pytest.mark.parametrize("bad", [0x5000, driver.CUstream(0x5000), CupyLikeStream(), event_on(DEV0)],
                         ids=lambda b: type(b).__name__)
def test_graph_exec_launch_and_upload_refuse_what_is_not_a_stream(calls, bad):
    ex = _exec()
    for call in (ex.launch, ex.replay, ex.upload):
        with pytest.raises(TypeError, match=f"^{STREAM_WORDS}{type(bad).__name__}"):
            call(bad)
    assert calls == []


def test_graph_exec_launch_passes_a_streams_handle(calls):
    _exec().launch(stream_on(DEV0))
    assert [(n, int(a[0]), int(a[1])) for n, a in calls] == [("cuGraphLaunch", 0x7000, 0x5000)]


def test_graph_exec_launch_on_another_devices_stream_names_both_devices(calls, monkeypatch):
    monkeypatch.setattr(driver, "cuGraphLaunch", lambda h, s: (driver.CUresult.CUDA_ERROR_INVALID_HANDLE,))
    with pytest.raises(ValueError, match=r"^stream is on device 1, but the graph is on device 0: cuGraphLaunch "
                                         r"failed with CUDA_ERROR_INVALID_HANDLE$"):
        _exec().launch(stream_on(DEV1))
    with pytest.raises(ValueError, match=r"^stream is on device 1, but the graph is on device 0$"):
        _exec().upload(stream_on(DEV1))


def test_instantiate_checks_the_upload_stream_before_instantiating(calls):
    g = object.__new__(Graph)
    g._handle, g.device = driver.CUgraph(0x8000), DEV0
    with pytest.raises(TypeError, match=f"^upload_{STREAM_WORDS}int$"):
        g.instantiate(upload_stream=0x5000)
    with pytest.raises(ValueError, match="^upload_stream is on device 1, but the graph is on device 0$"):
        g.instantiate(upload_stream=stream_on(DEV1))
    assert calls == []


def test_capture_names_another_librarys_stream():
    with pytest.raises(TypeError, match=r"^capture needs a driverlevel Stream .*got Stream \(\S*\.Stream: "
                                        r"borrow another library's stream"):
        with dl.capture(CupyLikeStream()):
            pytest.fail("captured")


def test_event_methods_check_their_stream_and_event_arguments(calls):
    ev, other = event_on(DEV0), event_on(DEV1, 0x6001)
    for bad in (0x5000, driver.CUstream(0x5000), CupyLikeStream(), ev):
        with pytest.raises(TypeError, match=f"^{STREAM_WORDS}{type(bad).__name__}"):
            ev.record(bad)
    with pytest.raises(ValueError, match="^stream is on device 1, but the event is on device 0$"):
        ev.record(stream_on(DEV1))
    for bad in (0x6000, driver.CUevent(0x6000), stream_on(DEV0)):
        with pytest.raises(TypeError, match=rf"^event must be a driverlevel Event \(Device.create_event\(\)\), "
                                            rf"got {type(bad).__name__}$"):
            stream_on(DEV0).wait(bad)
        with pytest.raises(TypeError, match=rf"^end must be a driverlevel Event \(Device.create_event\(\)\), "
                                            rf"got {type(bad).__name__}$"):
            ev.elapsed_ms(bad)
    with pytest.raises(ValueError, match="^end is an event of device 1, this event of device 0"):
        ev.elapsed_ms(other)
    assert calls == []
    ev.record(stream_on(DEV0))
    stream_on(DEV0).wait(other)  # CUDA lets a stream wait for another device's event
    assert ev.elapsed_ms(event_on(DEV0, 0x6002)) == 1.5
    assert names(calls) == ["cuEventRecord", "cuStreamWaitEvent", "cuEventElapsedTime"]


# == L4: sizes are multiplied as Python ints =============================================================
def test_reshape_does_not_take_a_wrapped_numpy_product_for_a_match():
    """np.int32(65536) * np.int32(65536) wraps to 0: an empty array became a 16 GiB view."""
    a = DeviceArray(PTR, (0,), np.float32, DEV0)
    with np.errstate(over="ignore"), pytest.raises(ValueError, match=r"^cannot reshape \(0,\) into \(65536, 65536\)$"):
        a.reshape(np.int32(65536), np.int32(65536))
    b = DeviceArray(PTR, (6,), np.float32, DEV0).reshape(np.int32(2), np.int64(3))
    assert b.shape == (2, 3) and all(type(n) is int for n in b.shape + b.strides)
    with pytest.raises(TypeError, match="^reshape: shape must be an int or a sequence of ints, got float 2.0"):
        DeviceArray(PTR, (6,), np.float32, DEV0).reshape(2.0, 3)


def test_verify_attention_checks_max_q_times_heads_in_python_ints():
    with np.errstate(over="ignore"), pytest.raises(ValueError, match=r"^max_q \* num_heads must be < 2\*\*31, "
                                                                     r"got 65536 \* 65536$"):
        VerifyAttention(None, np.int32(65536), max_batch=1, max_q=np.int32(65536))
    assert VerifyAttention.workspace_bytes_for(np.int32(132), np.int32(64), np.int32(8)) == \
        VerifyAttention.workspace_bytes_for(132, 64, 8)


def test_shared_memory_and_alignment_sums_never_wrap():
    from driverlevel import ddtree
    from driverlevel._memory import align_up

    with np.errstate(over="ignore"):
        assert align_up(2**31 - 1, np.int32(256)) == 2**31
        big = np.int32(2**15)
        assert ddtree._build_union_bytes(big, big, np.int32(1)) == ddtree._build_union_bytes(2**15, 2**15, 1) >= 2**32
        assert ddtree.build_shared_bytes(np.int32(15), np.int32(256), np.int32(256)) == \
            ddtree.build_shared_bytes(15, 256, 256)
    with pytest.raises(TypeError):
        align_up(10.5, 8)  # was truncated


# == L8: len() of a 0-d array, and the pool-too-small message ============================================
def test_len_of_a_0d_device_array_is_a_type_error_as_in_numpy():
    with pytest.raises(TypeError, match=r"^len\(\) of unsized object"):
        len(DeviceArray(PTR, (), np.float32, DEV0))
    assert len(DeviceArray(PTR, (3, 2), np.float32, DEV0)) == 3


@pytest.fixture
def pool(monkeypatch):
    buf = SimpleNamespace(ptr=0x7E00_0000_0000, device=DEV0, _finalizer=None)
    monkeypatch.setattr(dl.DeviceBuffer, "allocate", staticmethod(lambda d, n, label="": buf))
    return dl.WorkspacePool.allocate(DEV0, 1 << 20, label="small")


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
                             "(1.0 MiB)). Allocate it with at least the plan's workspace_bytes, or let the plan "
                             "allocate its own.")
    assert [c.name for c in pool.carves()] == ["a"] and pool.used == 1 << 19
    pool._require_room([((1 << 17,), np.float32)], "DDTreePlan 'ddtree'")  # 512 KiB: fits exactly
