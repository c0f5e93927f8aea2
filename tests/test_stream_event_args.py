"""The stream and event arguments of DeviceArray's copies and fills, graphs, events, ``capture``, the plans and
the device error word (CPU only): each must be a driverlevel Stream or Event, and a stream must be on the
object's own device, checked before anything is queued.

The driver calls are stubs that record that they were asked (``driver_stub_util``).
"""

from __future__ import annotations

import numpy as np
import pytest
from cuda.bindings import driver

import driverlevel as dl
from driverlevel import DDTreePlan, DeviceArray, VerifyAttention, VerifyMetadata, bfloat16
from driverlevel._device_error import DeviceErrorWord
from driverlevel._graph import Graph, GraphExec
from driverlevel._mask import bitmask_words, parse_mask_format
from driver_stub_util import DEV0, DEV1, PTR, calls, event_on, names, stream_on  # noqa: F401 (calls: a fixture)

STREAM_WORDS = r"stream must be a driverlevel Stream \(Device.create_stream\(\) or Stream.from_handle\), got "


# -- the plans check their stream's device (a launch on another device's stream fails in the driver) ---------
def _arr(shape, dtype, device=DEV0):
    return DeviceArray(0x10000, shape, dtype, device)


def _ddtree_plan():
    plan = object.__new__(DDTreePlan)
    plan.device, plan.max_batch, plan.max_context = DEV0, 4, 64
    plan.depth_limit, plan.vocab, plan.logits_dtype = 3, 128, np.dtype(np.float32)
    plan.max_rows, plan.record_width = 64, 12
    plan._cache = {}
    return plan



@pytest.mark.parametrize("mirror, words", [
    (None, r"^read_records: mirror must be a PinnedHostBuffer \(allocate_mirror\(\)\), got NoneType$"),
    (_arr((4, 12), "int32"), r"^read_records: mirror must be a PinnedHostBuffer \(allocate_mirror\(\)\), got DeviceArray: "
                             r"a DeviceArray mirror is read with mirror.to_numpy\(stream\)$"),
])
def test_read_records_names_a_mirror_it_cannot_read(mirror, words):
    """accept() takes an int32 DeviceArray mirror too; read_records gave AttributeError ('numpy') for it
    (fresh-user review, seventy-seventh session)."""
    with pytest.raises(TypeError, match=words):
        _ddtree_plan().read_records(mirror)

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


# -- DeviceArray's copies and fills --------------------------------------------------------------------------
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


def test_to_numpy_on_a_stream_copies_on_that_stream_and_never_on_the_legacy_one(calls):
    """With a stream the copy is queued on it and that stream is synchronized: no cuMemcpyDtoH, which runs on
    the legacy default stream and so breaks another thread's capture of a blocking stream."""
    a = DeviceArray(PTR, (8,), np.float32, DEV0)
    a.to_numpy(stream=stream_on(DEV0))
    calls[:] = [c for c in calls if c[0] != "cuStreamIsCapturing"]  # the capture check before the copy
    assert names(calls) == ["cuMemcpyDtoHAsync", "cuStreamSynchronize"]
    (_, copy), (_, sync) = calls
    assert (int(copy[1]), copy[2], int(copy[3])) == (PTR, 32, 0x5000)
    assert int(sync[0]) == 0x5000
    calls.clear()
    a.to_numpy()  # without one: the documented legacy-stream copy
    assert [n for n in names(calls) if n != "cuStreamIsCapturing"] == ["cuMemcpyDtoH"]


# -- graphs, capture and events ------------------------------------------------------------------------------
def _exec(device=DEV0):
    ex = object.__new__(GraphExec)
    ex._handle, ex.device, ex._node_count = driver.CUgraphExec(0x7000), device, 1
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


def test_a_closed_exec_or_graph_refuses_before_the_driver_is_called(calls):
    """After close() the handle is destroyed: a launch, upload, update or instantiate must raise, never
    hand the driver a destroyed (maybe reused) handle."""
    ex = _exec()
    ex._finalizer = lambda: None
    ex.close()
    assert ex.handle is None
    for call in (lambda: ex.launch(stream_on(DEV0)), lambda: ex.replay(stream_on(DEV0)),
                 lambda: ex.upload(stream_on(DEV0))):
        with pytest.raises(ValueError, match=r"^this GraphExec was closed \(GraphExec.close\): instantiate"):
            call()
    g = object.__new__(Graph)
    g._handle, g.device, g._finalizer = driver.CUgraph(0x8000), DEV0, lambda: None
    with pytest.raises(ValueError, match="this GraphExec was closed"):
        ex.update(g)
    g.close()
    g.close()  # idempotent
    for call in (g.instantiate, g.node_count, g.kernel_nodes, lambda: _exec().update(g)):
        with pytest.raises(ValueError, match=r"^this Graph was closed \(Graph.close\): capture"):
            call()
    assert calls == []


def test_a_closed_stream_or_event_is_refused_before_the_driver_is_called(calls):
    """A destroyed CUstream / CUevent value may already name a newer one: every use after close() raises."""
    import weakref

    from driverlevel._checks import stream_arg

    class Owner:  # (what the finalizers are attached to; closing runs them)
        pass

    s, ev, other = stream_on(DEV0), event_on(DEV0), event_on(DEV0, 0x6001)
    keep = [Owner(), Owner()]
    s._finalizer, ev._finalizer = weakref.finalize(keep[0], lambda: None), weakref.finalize(keep[1], lambda: None)
    s.close()
    ev.close()
    for words, call in (("stream", lambda: stream_arg("stream", s)), ("Stream.synchronize", s.synchronize),
                        ("Stream.wait", lambda: s.wait(other)), ("Stream.is_capturing", s.is_capturing),
                        ("stream", lambda: other.record(s)), ("stream", lambda: _exec().upload(s)),
                        ("Event.record", lambda: ev.record(stream_on(DEV0))), ("Event.synchronize", ev.synchronize),
                        ("Event.query", ev.query), ("Event.elapsed_ms", lambda: ev.elapsed_ms(other)),
                        ("end", lambda: other.elapsed_ms(ev)), ("event", lambda: stream_on(DEV0).wait(ev))):
        kind = "Event" if words.startswith(("Event", "end", "event")) else "Stream"
        with pytest.raises(ValueError, match=rf"^{words}: this {kind} was closed \({kind}.close\); create a new one$"):
            call()
    assert calls == []
    borrowed = stream_on(DEV0)  # (no finalizer: the lender's to close; close() leaves it usable)
    borrowed.close()
    assert stream_arg("stream", borrowed) is borrowed


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


# -- the device error word's check ---------------------------------------------------------------------------
def _word(device):
    """A DeviceErrorWord on ``device`` without pinned memory: its words are a host array."""
    w = object.__new__(DeviceErrorWord)
    w.label, w.device, w._words, w.device_ptr = "DDTreePlan test", device, np.zeros(4, np.int32), 0
    return w


def test_check_refuses_a_stream_of_another_device_before_reading(calls):
    w = _word(DEV0)
    w._words[:] = (1, 2, 0, 1)  # an error the check must not lose
    with pytest.raises(ValueError, match="stream is on device 1, but DDTreePlan test is on device 0"):
        w.check(stream_on(DEV1))
    assert "cuStreamSynchronize" not in names(calls)
    assert tuple(w._words) == (1, 2, 0, 1)  # not read and cleared


def test_check_synchronises_a_stream_of_its_own_device_then_raises(calls):
    w = _word(DEV0)
    w._words[:] = (1, 2, 0, 1)
    with pytest.raises(dl.MetadataError):
        w.check(stream_on(DEV0))
    assert names(calls)[-1] == "cuStreamSynchronize"
    assert tuple(w._words) == (0, 0, 0, 0)


@pytest.mark.parametrize("method, kw, exc, words", [
    ("create_stream", dict(non_blocking="no"), TypeError, "non_blocking must be a bool, got str 'no'"),
    ("create_stream", dict(non_blocking=0), TypeError, "non_blocking must be a bool, got int 0"),
    ("create_stream", dict(priority="high"), TypeError, "priority must be an int, got str 'high'"),
    ("create_stream", dict(priority=1.5), TypeError, "priority must be an int, got float 1.5"),
    ("create_stream", dict(priority=True), TypeError, "priority must be an int, got bool True"),
    ("create_stream", dict(priority=2**40), ValueError, "priority must be a C int"),
    ("create_event", dict(timing="no"), TypeError, "timing must be a bool, got str 'no'"),
    ("create_event", dict(timing=0), TypeError, "timing must be a bool, got int 0"),
])
def test_create_stream_and_event_check_their_flags_before_the_driver(monkeypatch, method, kw, exc, words):
    """``timing="no"`` made a timing event and ``priority=True`` priority 1 (review finding): refused now,
    before any driver call."""
    from cuda.bindings import driver

    def touched(*a):
        raise AssertionError("the driver was called before the arguments were checked")

    monkeypatch.setattr(driver, "cuStreamCreateWithPriority", touched)
    monkeypatch.setattr(driver, "cuEventCreate", touched)
    dev = object.__new__(dl.Device)
    with pytest.raises(exc, match=words):
        getattr(dev, method)(**kw)


def test_capture_refuses_a_closed_stream_before_the_driver_is_called(calls):
    import weakref

    class Owner:
        pass

    s, keep = stream_on(DEV0), Owner()
    s._finalizer = weakref.finalize(keep, lambda: None)
    s.close()
    with pytest.raises(ValueError, match=r"^capture: this Stream was closed"):
        with dl.capture(s):
            pytest.fail("captured")
    assert calls == []


def test_graph_exec_update_refuses_what_is_not_a_graph(calls):
    for bad in (None, "g", _exec()):
        with pytest.raises(TypeError, match=rf"^graph must be a driverlevel Graph \(CaptureSession.graph\), got "
                                            rf"{type(bad).__name__}$"):
            _exec().update(bad)
    assert calls == []


# -- RequestState's host copies take a stream -----------------------------------------------------------------
def _small_state():
    from driverlevel.request_state import RequestState

    da = lambda shape, dt: DeviceArray(PTR, shape, dt, DEV0)  # noqa: E731
    return RequestState(da((4,), "uint8"), da((4,), "int32"), da((4,), "int64"), da((4,), "int64"),
                        da((4, 16), "int32"), da((8,), "int64"), da((1,), "int64"))


def _copies(log):
    """(name, stream handle) of each copy and synchronization, the capture checks left out."""
    stream_at = {"cuMemcpyHtoDAsync": 3, "cuMemcpyDtoHAsync": 3, "cuStreamSynchronize": 0}
    return [(n, int(a[stream_at[n]]) if n in stream_at else None) for n, a in log if n != "cuStreamIsCapturing"]


def test_request_state_upload_and_download_queue_on_the_given_stream(calls):
    st = _small_state()
    st.upload(stream=stream_on(DEV0), active=np.ones(4, np.uint8), seq_lens=[1, 2, 3, 4])
    assert _copies(calls) == [("cuMemcpyHtoDAsync", 0x5000), ("cuStreamSynchronize", 0x5000)] * 2
    calls.clear()
    got = st.download(stream=stream_on(DEV0))
    assert sorted(got) == sorted(st.arrays())
    assert _copies(calls) == [("cuMemcpyDtoHAsync", 0x5000), ("cuStreamSynchronize", 0x5000)] * len(got)
    calls.clear()
    st.upload(active=np.ones(4, np.uint8))  # without one: the device's private copy stream
    assert _copies(calls) == [("cuMemcpyHtoDAsync", 0xC0FF), ("cuStreamSynchronize", 0xC0FF)]


@pytest.mark.parametrize("method", ["upload", "download"])
def test_request_state_copies_refuse_another_devices_stream_before_any_copy(calls, method):
    st = _small_state()
    go = {"upload": lambda s: st.upload(stream=s, active=np.ones(4, np.uint8), seq_lens=[1, 2, 3, 4]),
          "download": lambda s: st.download(stream=s)}[method]
    with pytest.raises(ValueError, match=f"^{method}: stream is on device 1, but the array is on device 0$"):
        go(stream_on(DEV1))
    with pytest.raises(TypeError, match=f"^{method}: " + STREAM_WORDS):
        go(0x5000)
    assert calls == []
