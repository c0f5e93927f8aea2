"""Review 19 (c): managed memory through ``__cuda_array_interface__``, ``DeviceArray.copy_from``
between devices, integer checks of ``check_merge_capacity`` / ``mask_words``, the benchmarks'
upper bounds and ``TileConfig``'s bool checks (CPU only).

No GPU is needed: the driver calls these paths make are replaced by stubs that answer as the
driver would and record that they were asked (the pattern of ``test_review18_b.py``). Each test
fails on the code before its fix.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import numpy as np
import pytest
from cuda.bindings import driver

import driverlevel as dl
from driverlevel import DeviceArray, _device
from driverlevel._checks import device_array_arg
from driverlevel.runtime import as_device_array

PTR = 0x7F12_3456_7800
OK = driver.CUresult.CUDA_SUCCESS
ATTR = driver.CUpointer_attribute


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

    def __repr__(self):
        return f"FakeDevice({self.ordinal})"


DEV0, DEV1 = FakeDevice(0), FakeDevice(1)


def stream_on(device, handle=0x5000):
    s = object.__new__(dl.Stream)
    s._handle, s.device, s._capture, s._finalizer = driver.CUstream(handle), device, None, None
    return s


class CAIOnly:
    def __init__(self, ptr=PTR, shape=(4,), typestr="<f4"):
        self.__cuda_array_interface__ = dict(version=3, strides=None, shape=shape, typestr=typestr, data=(ptr, False))


# == 1: a managed __cuda_array_interface__ pointer of another device ==================================
@pytest.fixture
def pointer(monkeypatch):
    """``cuPointerGetAttribute`` stub: the pointer is on device ``pointer.ordinal``, managed if
    ``pointer.managed``; ``pointer.err[attr]`` makes that attribute's question fail."""
    st = SimpleNamespace(ordinal=1, managed=1, err={}, asked=[])
    monkeypatch.setattr(_device, "_initialized", True)

    def get(attr, ptr):
        st.asked.append((attr, ptr))
        value = st.managed if attr == ATTR.CU_POINTER_ATTRIBUTE_IS_MANAGED else st.ordinal
        return (st.err.get(attr, OK), value)

    monkeypatch.setattr(driver, "cuPointerGetAttribute", get)
    return st


def test_a_managed_cai_array_allocated_on_another_device_is_taken(pointer):
    """Managed memory is reachable from every device (DLPack's kDLCUDAManaged already was taken)."""
    a = as_device_array(CAIOnly(), device=DEV0)
    assert a.ptr == PTR and a.device is DEV0
    assert pointer.asked == [(ATTR.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, PTR), (ATTR.CU_POINTER_ATTRIBUTE_IS_MANAGED, PTR)]
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
    assert pointer.asked == [(ATTR.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, PTR)]


def test_a_failed_is_managed_question_is_a_cuda_error(pointer):
    pointer.err[ATTR.CU_POINTER_ATTRIBUTE_IS_MANAGED] = driver.CUresult.CUDA_ERROR_INVALID_VALUE
    with pytest.raises(dl.CudaError, match=r"^cuPointerGetAttribute failed: CUDA_ERROR_INVALID_VALUE .*"
                                           r"\[CU_POINTER_ATTRIBUTE_IS_MANAGED of 0x.*pointer\]$"):
        as_device_array(CAIOnly(), device=DEV0)


# == 2: DeviceArray.copy_from between two devices ======================================================
@pytest.fixture
def memcpy(monkeypatch):
    """``cuMemcpyDtoDAsync`` stub: records ``(dst, src, nbytes)``."""
    log = []
    monkeypatch.setattr(driver, "cuMemcpyDtoDAsync", lambda dst, src, n, h: log.append((dst, src, n)) or (OK,))
    return log


class DLPackOnly:
    """A foreign array that exports only DLPack, wrapping one of ours (device type 2: kDLCUDA)."""

    def __init__(self, arr, device_type=2):
        self._arr, self._type = arr, device_type

    def __dlpack__(self, stream=None):
        return self._arr.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return (self._type, self._arr.device.ordinal)


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


# == 3: check_merge_capacity and mask_words refuse floats and bools (int() truncated them) ============
@pytest.mark.parametrize("vocab, budget, exc, words", [
    (163840.9, 512, TypeError, "^vocab must be a positive int, got float 163840.9$"),
    (163840, 16.5, TypeError, "^budget must be a positive int, got float 16.5$"),
    (163840, True, TypeError, "^budget must be a positive int, got bool True$"),
    (np.float64(32768), 16, TypeError, r"^vocab must be a positive int, got float64 (np.float64\(32768.0\)|32768.0)$"),
    ("32768", 16, TypeError, "^vocab must be a positive int, got str '32768'$"),
    (0, 16, ValueError, "^vocab must be a positive int, got 0$"),
    (32768, -1, ValueError, "^budget must be a positive int, got -1$"),
])
def test_check_merge_capacity_refuses_what_is_not_a_positive_int(vocab, budget, exc, words):
    from driverlevel.ddtree import check_merge_capacity

    with pytest.raises(exc, match=words):
        check_merge_capacity(vocab, budget)


def test_check_merge_capacity_takes_numpy_ints_and_keeps_its_rule():
    from driverlevel.ddtree import check_merge_capacity

    check_merge_capacity(np.int64(163840), np.int32(512))
    with pytest.raises(ValueError, match="vocab=200000 at K=512 needs 27 chunks x 512 candidates"):
        check_merge_capacity(np.int64(200000), 512)


@pytest.mark.parametrize("budget, exc, words", [
    (31.9, TypeError, "^budget must be an int >= 0, got float 31.9$"),  # was mask_words(31) == 1
    (False, TypeError, "^budget must be an int >= 0, got bool False$"),
    (-1, ValueError, "^budget must be an int >= 0, got -1$"),
])
def test_mask_words_refuses_what_is_not_an_int(budget, exc, words):
    from driverlevel._constants import mask_words

    with pytest.raises(exc, match=words):
        mask_words(budget)


def test_mask_words_of_ints():
    from driverlevel._constants import mask_words

    assert [mask_words(b) for b in (0, 30, 31, 32, np.int64(512))] == [1, 1, 1, 2, 17]
