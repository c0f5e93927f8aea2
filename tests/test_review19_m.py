"""Review 19's M1 and M2 (no GPU): the error word's check refuses another device's stream, and a
0-d DeviceArray round-trips through copy_from_host; indexing a 0-d array is a clear IndexError."""
import ctypes

import numpy as np
import pytest
from cuda.bindings import driver

import driverlevel as dl
from driverlevel._array import DeviceArray
from driverlevel._device_error import DeviceErrorWord
from test_review18_b import DEV0, DEV1, OK, PTR, calls, names, stream_on  # noqa: F401 (calls: a fixture)


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


@pytest.mark.parametrize("host", [np.array(7, np.int64), np.int64(7)], ids=["0-d array", "numpy scalar"])
def test_a_0d_array_takes_a_0d_host_value(calls, monkeypatch, host):
    seen = []
    monkeypatch.setattr(driver, "cuMemcpyHtoDAsync", lambda dst, src, n, h: seen.append((int(dst), ctypes.string_at(src, n))) or (OK,))
    DeviceArray(PTR, (), np.int64, DEV0).copy_from_host(host)
    assert seen == [(PTR, np.int64(7).tobytes())]


def test_a_0d_array_still_refuses_a_1d_host_array(calls):
    with pytest.raises(ValueError, match=r"expected shape \(\), got \(1,\)"):
        DeviceArray(PTR, (), np.int64, DEV0).copy_from_host(np.array([7], np.int64))


@pytest.mark.parametrize("idx", [0, slice(None)], ids=["int", "slice"])
def test_indexing_a_0d_array_is_a_clear_index_error(idx):
    with pytest.raises(IndexError, match="a 0-d DeviceArray cannot be indexed"):
        DeviceArray(PTR, (), np.int64, DEV0)[idx]


# == the CAI device check asks the pointer's context, not CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL ==========
# cuda.bindings from PR #1451 until the fix of NVIDIA/cuda-python#2928 answers 0 for the ordinal
# attribute whatever the device: a CAI array of device 1 would have been refused on device 1.
from types import SimpleNamespace  # noqa: E402

from driverlevel import _device  # noqa: E402
from driverlevel._array import as_device_array  # noqa: E402

ATTR = driver.CUpointer_attribute


class _CAI:
    def __init__(self, ptr=PTR):
        self.__cuda_array_interface__ = {"data": (ptr, False), "typestr": "<f4", "shape": (4,), "strides": None,
                                         "version": 3}


@pytest.fixture
def buggy_bindings(monkeypatch):
    """The pointer lives in device 1's primary context; the ordinal attribute answers 0 (the binding bug);
    the context's device is found with cuCtxPushCurrent / cuCtxGetDevice / cuCtxPopCurrent."""
    st = SimpleNamespace(ctx=0xC001, asked=[], log=[])
    monkeypatch.setattr(_device, "_initialized", True)

    def get(attr, ptr):
        st.asked.append(attr)
        if attr == ATTR.CU_POINTER_ATTRIBUTE_CONTEXT:
            return (OK, driver.CUcontext(st.ctx))
        return (OK, 0)  # DEVICE_ORDINAL (wrongly 0) and IS_MANAGED (no)

    monkeypatch.setattr(driver, "cuPointerGetAttribute", get)
    monkeypatch.setattr(driver, "cuCtxPushCurrent", lambda c: st.log.append(("push", int(c))) or (OK,))
    monkeypatch.setattr(driver, "cuCtxGetDevice", lambda: st.log.append(("get",)) or (OK, driver.CUdevice(st.ctx - 0xC000)))
    monkeypatch.setattr(driver, "cuCtxPopCurrent", lambda: st.log.append(("pop",)) or (OK, driver.CUcontext(st.ctx)))
    return st


def test_a_cai_array_of_device_1_is_taken_on_device_1_despite_the_ordinal_bug(buggy_bindings):
    a = as_device_array(_CAI(), device=DEV1)
    assert a.device is DEV1 and buggy_bindings.asked == [ATTR.CU_POINTER_ATTRIBUTE_CONTEXT]
    assert buggy_bindings.log == []  # its device's own primary context: one question


def test_a_cai_array_of_device_1_is_refused_on_device_0_naming_device_1(buggy_bindings):
    with pytest.raises(ValueError, match=r"is on device 1 .*not on device 0"):
        as_device_array(_CAI(), device=DEV0)
    assert buggy_bindings.log == [("push", 0xC001), ("get",), ("pop",)]


def test_memory_without_a_context_falls_back_to_the_ordinal_attribute(buggy_bindings):
    buggy_bindings.ctx = 0  # mapped with the virtual memory management API: no context
    assert as_device_array(_CAI(), device=DEV0).device is DEV0
    assert buggy_bindings.asked == [ATTR.CU_POINTER_ATTRIBUTE_CONTEXT, ATTR.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL]
