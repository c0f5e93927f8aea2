"""driverlevel.capture and prepared launches with the driver stubbed (CPU only): what a graph keeps after a
set_arg, the capture bookkeeping when a failed block's cleanup fails too, and a stream already being captured
through another Stream object.

The stubs answer as a driver would for one capturing stream (capture id 42) and record what was asked.
"""

from __future__ import annotations

import gc
import types

import pytest
from cuda.bindings import driver

import driverlevel as dl
from driverlevel import _capture_guard
from driverlevel._errors import CaptureError
from driverlevel._module import Kernel
from driver_stub_util import DEV0, stream_on

OK = driver.CUresult.CUDA_SUCCESS
ACTIVE = driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE
NONE = driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE


@pytest.fixture
def stubbed(monkeypatch):
    """A driver for one capturing stream; its log of calls (``log.capturing``: the handles capturing)."""

    class Log(list):
        pass

    log, capturing = Log(), set()

    def stub(name, f):
        monkeypatch.setattr(driver, name, f)

    def begin(h, mode):
        capturing.add(int(h))
        log.append("begin")
        return (OK,)

    def end(h):
        capturing.discard(int(h))
        log.append("end")
        return OK, driver.CUgraph(0x9000)

    stub("cuStreamBeginCapture", begin)
    stub("cuStreamEndCapture", end)
    stub("cuStreamGetCaptureInfo", lambda h: (OK, ACTIVE if int(h) in capturing else NONE, 42, None, None, 0))
    stub("cuStreamIsCapturing", lambda h: (OK, ACTIVE if int(h) in capturing else NONE))
    stub("cuGraphDestroy", lambda g: (log.append("destroy"), (OK,))[1])
    stub("cuGraphGetNodes", lambda g, n: (OK, None, 0))
    stub("cuLaunchKernel", lambda *a: (log.append("launch"), (OK,))[1])
    stub("cuThreadExchangeStreamCaptureMode", lambda m: (OK, m))
    stub("cuCtxPushCurrent", lambda c: (OK,))  # (the release of the graph handle, when a test drops it)
    stub("cuCtxPopCurrent", lambda: (OK, None))
    log.capturing = capturing
    try:
        yield log
        assert _capture_guard.captures_in_progress() == 0
    finally:  # (a failure must not leave this worker's later tests a capture "in progress")
        g = _capture_guard
        with g._cv:
            g._in_progress = 0
            g._capturing_on.clear()
        with g._lock:
            g._active.clear()
            g._keep_by_id.clear()


def _kernel():
    k = object.__new__(Kernel)
    k.module = types.SimpleNamespace(device=DEV0, cubin=types.SimpleNamespace(arch="sm_90"))
    k.name, k._func, k._max_dynamic_shared = "k", driver.CUfunction(0x1234), None
    return k


class Foreign:
    """A foreign array (torch-like: a pointer and a size) whose memory goes when the object does."""

    freed: list = []

    def __init__(self, ptr):
        self.ptr, self.nbytes = ptr, 64

    def __del__(self):
        Foreign.freed.append(self.ptr)


def test_a_graph_keeps_what_its_launch_recorded_after_a_set_arg(stubbed):
    """The graph node holds the argument the launch had when it was captured: set_arg replacing it in the launch
    must not free it while the graph lives (the graph kept the launch, whose keep list set_arg changed)."""
    Foreign.freed.clear()
    s = stream_on(DEV0)
    launch = _kernel().prepare(1, 32, [Foreign(0x7000_0000)])
    with dl.capture(s) as cap:
        launch.launch(s)
    launch.set_arg(0, Foreign(0x7100_0000))
    gc.collect()
    assert 0x7000_0000 not in Foreign.freed  # the graph still points at it
    graph = cap.graph
    del cap, graph
    launch.set_arg(0, Foreign(0x7200_0000))
    gc.collect()
    assert 0x7000_0000 in Foreign.freed and 0x7100_0000 in Foreign.freed



def test_keep_alive_ties_objects_to_the_graph_inside_the_block_and_refuses_after_it(stubbed):
    """keep_alive after the with block held the objects by the session only: dropping it freed them while the
    graph replays (fresh-user review, seventy-seventh session). Inside the block the graph keeps them."""
    Foreign.freed.clear()
    s = stream_on(DEV0)
    with dl.capture(s) as cap:
        cap.keep_alive(Foreign(0x7300_0000))
    graph = cap.graph
    with pytest.raises(ValueError, match=r"^keep_alive: this capture has ended \(the graph took what it keeps "
                                         r"when the with block was left\): call it inside the block"):
        cap.keep_alive(Foreign(0x7400_0000))
    del cap
    gc.collect()
    assert 0x7300_0000 not in Foreign.freed  # the graph holds it
    del graph
    gc.collect()
    assert 0x7300_0000 in Foreign.freed
    with pytest.raises(RuntimeError):  # a failed block ends the session too
        with dl.capture(s) as failed:
            raise RuntimeError("the block failed")
    with pytest.raises(ValueError, match="this capture has ended"):
        failed.keep_alive(Foreign(0x7500_0000))

def test_a_failed_blocks_cleanup_that_fails_too_still_ends_the_bookkeeping(stubbed, monkeypatch):
    """Otherwise every later free is deferred forever and Device.synchronize waits for a capture that ended."""
    s = stream_on(DEV0)

    def interrupted(h):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        with dl.capture(s):
            monkeypatch.setattr(driver, "cuStreamEndCapture", interrupted)
            raise RuntimeError("the block failed")
    assert _capture_guard.captures_in_progress() == 0


def test_a_stream_captured_through_another_stream_object_is_refused_as_a_capture_error(stubbed):
    s, same = stream_on(DEV0, 0x5000), stream_on(DEV0, 0x5000)  # (two objects of one handle: Stream.from_handle twice)
    with dl.capture(s):
        with pytest.raises(CaptureError, match="this stream is already being captured"):
            with dl.capture(same):
                pytest.fail("captured twice")
    assert stubbed.count("begin") == 1


def test_a_stream_captured_by_another_library_is_refused_before_begin_capture(stubbed):
    s = stream_on(DEV0, 0x5100)
    stubbed.capturing.add(0x5100)  # (a capture driverlevel did not begin: the driver says ACTIVE)
    with pytest.raises(CaptureError, match=r"this stream is already being captured \(CU_STREAM_CAPTURE_STATUS_ACTIVE\)"):
        with dl.capture(s):
            pytest.fail("captured")
    assert "begin" not in stubbed and _capture_guard.captures_in_progress() == 0


@pytest.mark.parametrize("mode", [["global"], None, 1, "GLOBAL"])
def test_a_capture_mode_that_is_not_one_of_the_names_is_a_value_error(stubbed, mode):
    """A list was "unhashable type: 'list'" (fresh-user review, seventy-seventh session)."""
    with pytest.raises(ValueError, match=r"^capture mode must be one of \['global', 'relaxed', 'thread_local'\], got "):
        with dl.capture(stream_on(DEV0), mode):
            pass
    assert stubbed == []  # no capture began
