"""The device of an array (CPU only): a foreign array (DLPack, ``__cuda_array_interface__``) is checked
against the device it is used on, by asking its producer or the driver for its pointer's context (managed
memory is taken on any device), and ``DeviceArray.copy_from`` refuses a source on another device.

The driver calls are stubs that answer as the driver would and record that they were asked.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from cuda.bindings import driver

import driverlevel as dl
from driverlevel import DeviceArray, _device
from driverlevel._array import as_device_array
from driverlevel._checks import device_array_arg
from driver_stub_util import DEV0, DEV1, OK, PTR, FakeDevice, stream_on

ATTR = driver.CUpointer_attribute


class DLPackOnly:
    """A foreign array that exports only DLPack, wrapping one of ours; records whether its capsule was taken."""

    def __init__(self, arr, device_type=2):
        self._arr, self._type, self.taken = arr, device_type, 0

    def __dlpack__(self, stream=None):
        self.taken += 1
        return self._arr.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return (self._type, self._arr.device.ordinal)



class BadDLPackDevice(DLPackOnly):
    def __init__(self, got):
        super().__init__(DeviceArray(PTR, (4,), np.float32, DEV0))
        self._got = got

    def __dlpack_device__(self):
        return self._got


@pytest.mark.parametrize("got", [None, (2,), ("cuda", 0), (2, 0, 0), (2, 0.0), (True, 0)])
def test_a_malformed_dlpack_device_is_named_before_the_capsule(got):
    """Was 'cannot unpack non-iterable NoneType object' or int('cuda')'s message (fresh-user review, s77)."""
    src = BadDLPackDevice(got)
    with pytest.raises(TypeError, match=r"^BadDLPackDevice.__dlpack_device__\(\) must return a \(device_type, "
                                        r"device_id\) pair of ints \(DLPack\), got "):
        as_device_array(src, device=DEV0)
    assert src.taken == 0

class CAIOnly:
    def __init__(self, ptr=PTR, shape=(4,), typestr="<f4"):
        self.__cuda_array_interface__ = dict(version=3, strides=None, shape=shape, typestr=typestr, data=(ptr, False))


# -- a foreign array of another device is refused ------------------------------------------------------------
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


# -- a managed __cuda_array_interface__ pointer of another device is taken -----------------------------------
@pytest.fixture
def pointer(monkeypatch):
    """``cuPointerGetAttribute`` stub: the pointer is on device ``pointer.ordinal``, managed if
    ``pointer.managed``; ``pointer.err[attr]`` makes that attribute's question fail."""
    st = SimpleNamespace(ordinal=1, managed=1, err={}, asked=[])
    monkeypatch.setattr(_device, "_initialized", True)

    def get(attr, ptr):
        st.asked.append((attr, ptr))
        value = st.managed if attr == ATTR.CU_POINTER_ATTRIBUTE_IS_MANAGED else st.ordinal
        if attr == ATTR.CU_POINTER_ATTRIBUTE_CONTEXT:  # FakeDevice(n)'s primary context
            value = driver.CUcontext(0xC000 + st.ordinal)
        return (st.err.get(attr, OK), value)

    monkeypatch.setattr(driver, "cuPointerGetAttribute", get)
    monkeypatch.setattr(_device, "context_ordinal", lambda ctx: int(ctx) - 0xC000)
    return st


def test_a_managed_cai_array_allocated_on_another_device_is_taken(pointer):
    """Managed memory is reachable from every device (DLPack's kDLCUDAManaged already was taken)."""
    a = as_device_array(CAIOnly(), device=DEV0)
    assert a.ptr == PTR and a.device is DEV0
    assert pointer.asked == [(ATTR.CU_POINTER_ATTRIBUTE_CONTEXT, PTR), (ATTR.CU_POINTER_ATTRIBUTE_IS_MANAGED, PTR)]
    b = device_array_arg("kv_cache", CAIOnly(), DEV0)  # as the plans import their arguments
    assert b.device is DEV0 and len(pointer.asked) == 4  # the questions are asked per import


def test_a_plain_cai_array_of_another_device_is_still_refused(pointer):
    pointer.managed = 0
    with pytest.raises(ValueError, match=r"^kv_cache: CAIOnly is on device 1 \(the driver's answer for its pointer "
                                         rf"0x{PTR:x}\), not on device 0$"):
        device_array_arg("kv_cache", CAIOnly(), DEV0)


def test_a_cai_array_on_its_own_device_asks_one_question(pointer):
    pointer.ordinal = 0
    assert as_device_array(CAIOnly(), device=DEV0).device is DEV0
    assert pointer.asked == [(ATTR.CU_POINTER_ATTRIBUTE_CONTEXT, PTR)]


def test_a_failed_is_managed_question_is_a_cuda_error(pointer):
    pointer.err[ATTR.CU_POINTER_ATTRIBUTE_IS_MANAGED] = driver.CUresult.CUDA_ERROR_INVALID_VALUE
    with pytest.raises(dl.CudaError, match=r"^cuPointerGetAttribute failed: CUDA_ERROR_INVALID_VALUE .*"
                                           r"\[CU_POINTER_ATTRIBUTE_IS_MANAGED of 0x.*pointer\]$"):
        as_device_array(CAIOnly(), device=DEV0)


# -- the pointer's context, not CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL ------------------------------------------
# cuda.bindings from PR #1451 until the fix of NVIDIA/cuda-python#2928 answers 0 for the ordinal
# attribute whatever the device: a CAI array of device 1 would have been refused on device 1.
_CAI = CAIOnly  # a float32 [4] at PTR


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


# -- DeviceArray.copy_from between two devices ---------------------------------------------------------------
@pytest.fixture
def memcpy(monkeypatch):
    """``cuMemcpyDtoDAsync`` stub: records ``(dst, src, nbytes)``."""
    log = []
    monkeypatch.setattr(driver, "cuMemcpyDtoDAsync", lambda dst, src, n, h: log.append((dst, src, n)) or (OK,))
    return log


def test_copy_from_refuses_a_source_on_another_device(memcpy):
    """cuMemcpyDtoDAsync was queued with the pointers of two devices (no peer access set up)."""
    dst = DeviceArray(PTR, (8,), np.float32, DEV0)
    src = DeviceArray(PTR + 4096, (8,), np.float32, DEV1)
    with pytest.raises(ValueError, match=r"^copy_from: the source is on device 1, this array on device 0: copies "
                                         r"between devices \(peer copies\) are not supported$"):
        dst.copy_from(src, stream_on(DEV0))
    assert memcpy == []
    with pytest.raises(ValueError, match=r"^copy_from: the source is on device 0, this array on device 1"):
        src.copy_from(dst, stream_on(DEV1))  # either way round
    assert memcpy == []


def test_copy_from_refuses_a_foreign_source_on_another_device(memcpy):
    dst = DeviceArray(PTR, (8,), np.float32, DEV0)
    src = DLPackOnly(DeviceArray(PTR + 4096, (8,), np.float32, DEV1))
    with pytest.raises(ValueError, match=r"^copy_from: src: DLPackOnly is on device 1 \(its __dlpack_device__\(\)\), "
                                         r"not on device 0$"):
        dst.copy_from(src, stream_on(DEV0))
    assert memcpy == []


def test_copy_from_on_one_device_copies(memcpy):
    dst = DeviceArray(PTR, (8,), np.float32, DEV0)
    assert dst.copy_from(DeviceArray(PTR + 4096, (2, 4), np.float32, FakeDevice(0)), stream_on(DEV0)) is dst
    assert memcpy == [(PTR, PTR + 4096, 32)]
