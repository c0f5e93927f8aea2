"""Review 19 (c): managed memory through ``__cuda_array_interface__``, ``DeviceArray.copy_from``
between devices, integer checks of ``check_merge_capacity`` / ``mask_words``, the benchmarks'
upper bounds and ``TileConfig``'s bool checks (CPU only).

No GPU is needed: the driver calls these paths make are replaced by stubs that answer as the
driver would and record that they were asked (the pattern of ``test_review18_b.py``). Each test
fails on the code before its fix.
"""

from __future__ import annotations

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


from bench_util import assert_usage_error  # noqa: E402
from bench_util import load_bench as _load_bench  # noqa: E402
from test_review18_b import DEV0, DEV1, FakeDevice, stream_on  # noqa: E402 (the fakes of review 18's tests)


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


# == 4: the benchmarks' options have upper bounds, refused before the GPU check ========================
class ReachedTheGPUCheck(Exception):
    pass


@pytest.fixture
def gpu_check(monkeypatch):
    """The GPU check raises :class:`ReachedTheGPUCheck`: the options were all taken."""
    def reached():
        raise ReachedTheGPUCheck

    monkeypatch.setattr(_device, "gpu_usable", reached)
    monkeypatch.setattr(_device, "require_gpu", reached)


_TILE_MEMORY = ("--batch 1024 x (--prefix 65536 + --tokens 256) with --heads 16 needs 81.8 GiB of inputs on the "
                "GPU, more than 64 GiB: lower --batch, --prefix, --tokens or --heads")


@pytest.mark.parametrize("script, argv, words", [
    ("peer_read", ["--batch", "1", "2000"], "--batch must be <= 1024 (1024 x 15 x 163840 logits are 10 GB in "
     "float32), got 2000"),
    ("peer_read", ["--k", "163841"], "--k must be <= 163840 (torch.topk takes at most a row's 163840 logits), "
     "got 163841"),
    ("peer_read", ["--reps", "10001"], "--reps must be <= 10000 (each writes 256 MB before it is timed), got 10001"),
    ("profile_topk", ["--batch", "257"], "--batch must be <= 256 (the target logits are batch x (budget + 1) x "
     "163840 bf16: 43 GB at batch 256 and budget 512), got 257"),
    ("profile_tile", ["--heads", "129"], "--heads must be <= 128 (an MLA model's heads, as bench_step.py's "
     "--heads), got 129"),
    ("profile_tile", ["--batch", "1025"], "--batch must be <= 1024 (VerifyAttention's MAX_BATCH), got 1025"),
    ("profile_tile", ["--prefix", str(2**31)], "--prefix must be <= 2147483647 (VerifyMetadata's kv_indptr is "
     "int32), got 2147483648"),
    ("profile_tile", ["--tokens", "1025"], "--tokens must be <= 1024 (twice the draft tokens a DDTree step verifies "
     "at most), got 1025"),
    ("profile_tile", ["--batch", "1024", "--prefix", "65536"], _TILE_MEMORY),
    ("profile_tile", ["--prefix", "100000000"], "--batch 2 x (--prefix 100000000 + --tokens 256) with --heads 16 "
     "needs 217.6 GiB"),
    ("bench_ddtree", ["--max-context", "268434944"], "--max-context must be <= 268434943 (batch 8 x (max_context "
     "+ 513) KV slots must fit the state's int32 req_to_token; 69 GB of state there), got 268434944"),
])
def test_benchmark_options_above_their_bound_are_usage_errors(script, argv, words, capsys, gpu_check):
    """Each went on to the GPU check and failed there: out of memory, a plan's ValueError after the
    batch-1 rows ran (bench_ddtree), or hours of repetitions."""
    assert_usage_error(script, argv, words, capsys)


@pytest.mark.parametrize("script, argv", [
    ("peer_read", []), ("peer_read", ["--batch", "1", "1024", "--k", "163840", "--reps", "10000"]),
    ("profile_topk", []), ("profile_topk", ["--batch", "256", "--budget", "512"]),
    ("profile_tile", []), ("profile_tile", ["--heads", "128", "--batch", "1024", "--prefix", "32768",
                                            "--tokens", "16"]),
    ("profile_tile", ["--prefix", "50000000", "--batch", "1"]),
    ("bench_ddtree", []), ("bench_ddtree", ["--max-context", "268434943"]),
])
def test_defaults_and_values_at_the_bounds_reach_the_gpu_check(script, argv, gpu_check):
    with pytest.raises(ReachedTheGPUCheck):
        _load_bench(script).main(argv)


def test_bench_ddtree_bound_fits_the_state_it_allocates():
    """At --max-context MAX_CONTEXT the batch-8 state's slots fit an int32 req_to_token (RequestState's
    rule) and DDTreePlan's int32 kv_indptr; one more token does not."""
    from driverlevel.request_state import RequestState

    mod = _load_bench("bench_ddtree")
    mc, b = mod.MAX_CONTEXT, max(mod.BATCHES)
    RequestState.specs(max_batch=b, max_context=mc, num_slots=b * (mc + 513))
    assert b * mc <= 2**31 - 1
    with pytest.raises(ValueError, match="num_slots must be at most 2"):
        RequestState.specs(max_batch=b, max_context=mc + 1, num_slots=b * (mc + 1 + 513))


# == 5: TileConfig's bool fields through _checks.bool_arg ============================================
_WS_TILE = dict(rows=64, csplit=1, keys=32, stages=4, ws=True)


@pytest.mark.parametrize("field, bad, words", [
    ("ws", "yes", "^TileConfig.ws must be a bool, got str 'yes'$"),
    ("qk_skew", 1, "^TileConfig.qk_skew must be a bool, got int 1$"),
    ("bulk", None, "^TileConfig.bulk must be a bool, got NoneType None$"),
    ("pv_softmax", 0.0, "^TileConfig.pv_softmax must be a bool, got float 0.0$"),
])
def test_tile_config_bool_fields_name_what_they_got(field, bad, words):
    """The message names the type as every other 'must be a bool' of the package (_checks.bool_arg)."""
    from driverlevel.verify_attention import TileConfig

    with pytest.raises(TypeError, match=words):
        TileConfig(**(_WS_TILE | {field: bad}))


def test_tile_config_stores_numpy_bools_as_python_bools():
    from driverlevel.verify_attention import TileConfig

    cfg = TileConfig(**(_WS_TILE | dict(ws=np.True_, qk_skew=np.True_, qreg=np.False_)))
    assert type(cfg.ws) is bool and type(cfg.qk_skew) is bool and type(cfg.qreg) is bool
    assert cfg == TileConfig(**(_WS_TILE | dict(qk_skew=True))) and cfg.defines()["DL_WS_SKEW"] == 1
    assert "np." not in repr(cfg)


@pytest.mark.parametrize("call", ["tile_config", "sm_scale"])
def test_numpy_bools_are_refused_as_numbers(call):
    """rows_per_request and sm_scale refuse numpy's bool as they refuse Python's (through _checks.is_bool)."""
    from driverlevel import verify_attention as va

    with pytest.raises(TypeError, match="rows_per_request must be an int or None, got bool" if call == "tile_config"
                       else r"sm_scale must be a real number \(float or int\), got bool"):
        if call == "tile_config":
            va.tile_config("sm_90", rows_per_request=np.True_)
        else:
            va._check_sm_scale(np.True_)
