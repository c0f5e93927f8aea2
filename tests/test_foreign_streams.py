"""Borrowed streams (CPU only): ``Stream.from_handle`` takes an int address, a ``CUstream`` or an object with
``__cuda_stream__``, refuses anything else, and refuses a stream of another device or of another context,
asking the driver (stubbed here) for the stream's context.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from cuda.bindings import driver

import driverlevel as dl
from driverlevel import _device
from driver_stub_util import DEV0, DEV1, OK


# -- the stream's device and context -------------------------------------------------------------------------
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


# -- the handle's type ---------------------------------------------------------------------------------------
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


@pytest.mark.parametrize("address", [-1, 1 << 64, np.int64(-5)], ids=["negative", "2**64", "numpy-negative"])
def test_from_handle_refuses_an_address_outside_64_bits(stream_driver, address):
    """2**64 raised cuda.bindings' OverflowError, which from_handle does not document."""
    class Protocol:
        def __cuda_stream__(self):
            return (0, address)

    for handle, name in ((address, "handle"), (Protocol(), "handle.__cuda_stream__ address")):
        with pytest.raises(ValueError, match=rf"^{name} must be an int in 0 \.\. 18446744073709551615"):
            dl.Stream.from_handle(handle, 0)
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


# -- the per-thread default stream: one handle, a different stream in every thread ----------------------------
def test_another_threads_capture_of_the_per_thread_stream_is_not_this_threads(monkeypatch):
    """Handle 2 (CU_STREAM_PER_THREAD) captured by thread A is not the handle-2 stream of thread B: B asks the
    driver about its own, and only A's own check matches A's capture."""
    import threading

    from driverlevel import _capture_guard

    asked = []
    monkeypatch.setattr(driver, "cuStreamIsCapturing", lambda h: asked.append(int(h)) or
                        (OK, driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE))
    other = threading.get_ident() + 1
    monkeypatch.setitem(_capture_guard._active, -1, (2, "thread_local", other))
    assert not _capture_guard.stream_is_capturing(2) and asked == [2]  # this thread's own per-thread stream
    monkeypatch.setitem(_capture_guard._active, -1, (2, "thread_local", threading.get_ident()))
    assert _capture_guard.stream_is_capturing(2) and asked == [2]  # this thread's capture: no driver call
    monkeypatch.setitem(_capture_guard._active, -1, (0x5000, "thread_local", other))
    assert _capture_guard.stream_is_capturing(0x5000)  # an ordinary stream is one stream in every thread
