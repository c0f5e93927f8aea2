"""Stand-ins for the CUDA driver in CPU tests: made-up devices, streams and events, and a ``calls``
fixture that replaces the driver calls with stubs that answer CUDA_SUCCESS and record that they were asked.

A test module imports what it uses, the fixture included (``from driver_stub_util import calls``).
"""

from __future__ import annotations

import contextlib

import pytest
from cuda.bindings import driver

import driverlevel as dl

PTR = 0x7F12_3456_7800
OK = driver.CUresult.CUDA_SUCCESS


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
                 "cuMemcpyDtoHAsync",
                 "cuStreamSynchronize", "cuEventRecord", "cuStreamWaitEvent", "cuGraphLaunch", "cuGraphUpload"):
        stub(name)
    stub("cuEventElapsedTime", (1.5,))
    stub("cuStreamIsCapturing", (driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE,))
    stub("cuGraphInstantiate", (driver.CUgraphExec(0x7000),))
    return log


def names(log):
    return [n for n, _ in log]
