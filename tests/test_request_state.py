"""One request state and one slot pool under one set of names (CPU only).

The runner's kernels (``cu/runner.cu``, ``StepParams``) and the DDTree stages
(``cu/ddtree/*.cuh``, the stages' params structs) read the same :class:`RequestState` under the same
field names, SGLang's where SGLang has the array.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from driverlevel import ddtree, runner
from driverlevel._compile import kernel_source_dir
from driverlevel.request_state import ARRAY_FIELDS, RequestState

SHARED = ("active", "root_tokens", "seq_lens", "req_pool_indices", "req_to_token", "free_slots", "free_count",
          "stop_tokens")
OLD_NAMES = ("roots", "committed", "committed_lens", "pool_slots", "pool_count", "pool_capacity")


def test_array_fields_are_the_dataclass_fields():
    names = [f.name for f in dataclasses.fields(RequestState) if f.name != "pool"]
    assert tuple(names) == ARRAY_FIELDS
    assert {"req_to_token", "req_pool_indices", "seq_lens"} <= set(ARRAY_FIELDS)  # SGLang's names


def test_ddtree_state_is_the_request_state():
    assert ddtree.DDTreeState is RequestState


def _ddtree_state_fields():
    return {n for c in ddtree._STRUCTS.values() for n in ddtree._struct_fields(c)}


@pytest.mark.parametrize("names", [_ddtree_state_fields(), {n for n, *_ in runner._StepParams._fields_}],
                         ids=["DDTree stages", "StepParams"])
def test_both_params_structs_carry_the_state_under_the_same_names(names):
    assert set(SHARED) <= names
    assert not names & set(OLD_NAMES)
    assert "free_capacity" in names and "r2t_rows" in names


def test_no_kernel_uses_the_old_names():
    cu = kernel_source_dir()
    pat = re.compile(r"\bp\.(" + "|".join(OLD_NAMES) + r")\b")
    for path in [cu / "runner.cu", cu / "ddtree.cu", *sorted((cu / "ddtree").glob("*.cuh"))]:
        assert not pat.search(path.read_text()), path.name


def test_specs_and_host_checks():
    specs = RequestState.specs(max_batch=4, max_context=16, num_slots=100, n_stop=2, remaining=True)
    got = {n: (s, np.dtype(d)) for n, s, d in specs}
    assert got["req_to_token"] == ((4, 16), np.dtype(np.int32))
    assert got["free_slots"] == ((100,), np.dtype(np.int64))
    assert got["seq_lens"] == ((4,), np.dtype(np.int64))
    assert got["stop_tokens"] == ((4, 2), np.dtype(np.int32))
    assert got["remaining"] == ((4,), np.dtype(np.int32))
    assert "budgets" not in got
    st = RequestState(*([None] * 7))
    with pytest.raises(ValueError, match="no field 'committed_lens'"):
        st.upload(committed_lens=[0])
    with pytest.raises(ValueError, match="no 'budgets' array"):
        st.upload(budgets=[0])
    assert st.key() == (0,) * len(ARRAY_FIELDS) and st.arrays() == {}


def test_specs_check_counts_and_the_table_dtype():
    import pytest

    good = dict(max_batch=2, max_context=8, num_slots=10)
    for kw, exc, words in [(dict(max_batch=0), ValueError, "max_batch must be a positive int"),
                           (dict(num_slots=-1), ValueError, "num_slots must be a positive int"),
                           (dict(req_rows=0), ValueError, "req_rows must be a positive int"),
                           (dict(n_stop=-1), ValueError, "n_stop must be an int >= 0"),
                           (dict(n_stop=2.0), TypeError, "n_stop must be an int >= 0, got float 2.0"),
                           (dict(n_stop=True), TypeError, "n_stop must be an int >= 0, got bool True"),
                           (dict(r2t_dtype=np.int8), TypeError, "r2t_dtype must be int32 or int64")]:
        with pytest.raises(exc, match=words):
            RequestState.specs(**(good | kw))
    assert RequestState.specs(**good, r2t_dtype=np.int64)[4] == ("req_to_token", (2, 8), np.int64)


def test_allocate_checks_the_arguments_before_the_device(monkeypatch):
    """A bad count is the ValueError naming it, not DriverUnavailableError from touching the device first."""
    import pytest

    from driverlevel import _device, request_state

    def touched(device):
        pytest.fail("the device was touched before the arguments were checked")

    monkeypatch.setattr(request_state, "_check_device_arg", touched)
    monkeypatch.setattr(_device, "_check_device_arg", touched)
    with pytest.raises(ValueError, match="max_batch must be a positive int, got 0"):
        RequestState.allocate(0, max_batch=0, max_context=10, num_slots=10)
    with pytest.raises(TypeError, match="r2t_dtype must be int32 or int64"):
        RequestState.allocate(0, max_batch=1, max_context=10, num_slots=10, r2t_dtype=np.float32)


class _FakeDev:
    ordinal = 0


def _recording_state(monkeypatch):
    """A state over made-up addresses whose ``copy_from_host`` records what it would copy (no GPU)."""
    from driverlevel._array import DeviceArray

    copied = []
    monkeypatch.setattr(DeviceArray, "copy_from_host", lambda self, src, stream=None: copied.append(src) or self)
    da = lambda shape, dt: DeviceArray(0x1000, shape, dt, _FakeDev())  # noqa: E731
    st = RequestState(da((4,), "uint8"), da((4,), "int32"), da((4,), "int64"), da((4,), "int64"),
                      da((4, 16), "int32"), da((8,), "int64"), da((1,), "int64"))
    return st, copied


@pytest.mark.parametrize("kw, exc, words", [
    (dict(seq_lens=np.array([100.9, 5.5, 1e3, -0.5])), TypeError, "seq_lens must hold int64 integers, got dtype float64"),
    (dict(seq_lens=np.array([1.0, 2.0, 3.0, 4.0])), TypeError, "seq_lens must hold int64 integers, got dtype float64"),
    (dict(free_count=5.0), TypeError, "free_count must hold int64 integers, got dtype float64"),
    (dict(root_tokens=np.array([2**31 + 5, 1, 2, 3])), ValueError,
     r"root_tokens value 2147483653 at flat index 0 does not fit int32"),
    (dict(active=np.array([True, False, 2, 300])), ValueError, r"active value 300 at flat index 3 does not fit uint8"),
    (dict(active=[1, 0, -1, 1]), ValueError, r"active value -1 at flat index 2 does not fit uint8"),
    (dict(seq_lens=[2**70, 1, 2, 3]), ValueError, r"seq_lens value 1180591620717411303424 at flat index 0"),
    (dict(seq_lens=np.array([1, 2, 3, 2**64 - 1], np.uint64)), ValueError,
     r"seq_lens value 18446744073709551615 at flat index 3 does not fit int64"),
    (dict(seq_lens=["1", "2", "3", "4"]), TypeError, "seq_lens must hold int64 integers, got dtype <U1"),
    (dict(root_tokens=np.array([True, False, True, True])), TypeError, "root_tokens must hold int32 integers, got bool"),
    (dict(seq_lens=[1, 2, 3]), ValueError, r"seq_lens must have shape \(4,\) \(4 elements\), got shape \(3,\)"),
    # the values' type before their count (fresh-user review, seventy-seventh session: these three were
    # "must have shape (4,) (4 elements), got shape ()"; the ragged one was numpy's message alone)
    (dict(active=None), TypeError, r"^upload: active must hold uint8 integers, got NoneType None$"),
    (dict(active="abcd"), TypeError, r"^upload: active must hold uint8 integers, got dtype <U4"),
    (dict(active=(1 for _ in range(4))), TypeError, r"^upload: active must hold uint8 integers, got generator "),
    (dict(req_to_token=[[1, 2], [3]]), ValueError, r"^upload: req_to_token is not a rectangular array of integers \("),
])
def test_upload_refuses_values_that_do_not_fit_exactly(monkeypatch, kw, exc, words):
    """Review 15 #3: upload cast with np.asarray(dtype=...), so 100.9 -> 100, 2**31+5 -> negative, 300 -> 44."""
    st, copied = _recording_state(monkeypatch)
    with pytest.raises(exc, match=words):
        st.upload(**kw)
    assert copied == []


def test_upload_checks_every_field_before_copying_any(monkeypatch):
    st, copied = _recording_state(monkeypatch)
    with pytest.raises(TypeError, match="seq_lens"):
        st.upload(active=np.ones(4, np.uint8), seq_lens=[0.5] * 4)
    assert copied == []  # active was not written either


def test_upload_accepts_exact_integer_values(monkeypatch):
    st, copied = _recording_state(monkeypatch)
    st.upload(active=np.array([True, False, True, True]), root_tokens=np.arange(4, dtype=np.int64),
              seq_lens=[1, 2, 3, 2**40], free_count=5, req_to_token=np.full(64, -1, np.int64),
              req_pool_indices=np.array([3, 2, 1, 0], np.uint8), free_slots=np.arange(8))
    got = [(c.dtype.name, c.shape, c.ravel()[:4].tolist()) for c in copied]
    assert got == [("uint8", (4,), [1, 0, 1, 1]), ("int32", (4,), [0, 1, 2, 3]), ("int64", (4,), [1, 2, 3, 2**40]),
                   ("int64", (1,), [5]), ("int32", (4, 16), [-1, -1, -1, -1]), ("int64", (4,), [3, 2, 1, 0]),
                   ("int64", (8,), [0, 1, 2, 3])]


# -- the specs' flags are bools ------------------------------------------------------------------------------
@pytest.mark.parametrize("flag", ["budgets", "remaining"])
@pytest.mark.parametrize("value", [1, 0, "no", None, 1.0])
def test_request_state_flags_must_be_bools(flag, value):
    with pytest.raises(TypeError, match=f"{flag} must be a bool"):
        RequestState.specs(max_batch=2, max_context=8, num_slots=16, **{flag: value})
    with pytest.raises(TypeError, match=f"{flag} must be a bool"):
        RequestState.allocate(None, max_batch=2, max_context=8, num_slots=16, **{flag: value})
    names = [n for n, _, _ in RequestState.specs(max_batch=2, max_context=8, num_slots=16, **{flag: np.bool_(True)})]
    assert flag in names


@pytest.mark.parametrize("r2t_dtype, got", [("garbage", "'garbage'"), (5, "5"), (None, "None"), (np.float32, "float32"),
                                            ("uint32", "uint32")])
def test_specs_names_r2t_dtype_when_numpy_cannot_read_it(r2t_dtype, got):
    """r2t_dtype='garbage' raised numpy's own "data type 'garbage' not understood", naming no argument."""
    with pytest.raises(TypeError, match=rf"^r2t_dtype must be int32 or int64, got {got}$"):
        RequestState.specs(max_batch=1, max_context=8, num_slots=8, r2t_dtype=r2t_dtype)


def test_a_host_array_in_the_constructor_is_refused_naming_the_field():
    with pytest.raises(TypeError, match=r"^RequestState.seq_lens: a numpy array lives in host memory"):
        RequestState(None, None, np.zeros(4, np.int64), None, None, None, None)
    with pytest.raises(TypeError, match=r"^RequestState.free_count: list exports neither"):
        RequestState(None, None, None, None, None, None, [0])


def test_upload_refuses_a_read_only_or_strided_field_before_the_first_copy(monkeypatch):
    from driverlevel._array import DeviceArray

    st, copied = _recording_state(monkeypatch)
    st.free_count = DeviceArray(0x2000, (1,), "int64", _FakeDev(), readonly=True)
    with pytest.raises(ValueError, match=r"^upload: free_count is read-only: it cannot be copied into$"):
        st.upload(seq_lens=[1, 2, 3, 4], free_count=[3])
    st.free_count = DeviceArray(0x2000, (2,), "int64", _FakeDev(), strides=(16,))
    with pytest.raises(ValueError, match=r"^upload: free_count is not C-contiguous"):
        st.upload(seq_lens=[1, 2, 3, 4], free_count=[3, 4])
    assert copied == []  # seq_lens, first in the call, was not copied either
    st.upload(seq_lens=[1, 2, 3, 4])
    assert len(copied) == 1


def test_a_host_array_assigned_after_construction_is_refused_naming_the_field():
    st = RequestState(*([None] * 7))
    with pytest.raises(TypeError, match=r"^RequestState.seq_lens: a numpy array lives in host memory"):
        st.seq_lens = np.zeros(4, np.int64)
    assert st.seq_lens is None
    st.pool = "anything"  # not an array field: kept as given
    assert dataclasses.replace(st, pool=None).pool is None


def test_the_key_changes_with_a_fields_shape_or_dtype_at_the_same_address():
    """DDTreePlan replays the launches it packed for a state's key, and those hold free_slots' length,
    req_to_token's rows and dtype and stop_tokens' width: the same addresses with other shapes or dtypes
    must pack anew (a 50-slot free list replayed as a 1,000-slot one would be written past its end)."""
    from types import SimpleNamespace

    import driverlevel as dl

    dev = SimpleNamespace(ordinal=0)

    def state(cap=1000, r2t=np.int32, rows=4):
        a = lambda shape, dt, ptr: dl.DeviceArray(ptr, shape, dt, dev)  # noqa: E731
        return RequestState(a((4,), np.uint8, 0x1000), a((4,), np.int32, 0x2000), a((4,), np.int64, 0x3000),
                            a((4,), np.int64, 0x4000), a((rows, 64), r2t, 0x5000), a((cap,), np.int64, 0x6000),
                            a((1,), np.int64, 0x7000))

    base = state().key()
    assert state().key() == base  # the same arrays again: replayed
    for other in (state(cap=50), state(r2t=np.int64), state(rows=2)):
        assert other.key() != base
    assert base[0] == (0x1000, (4,), np.dtype(np.uint8))


def test_target_buffers_key_holds_shapes_dtypes_and_sizes():
    from types import SimpleNamespace

    import driverlevel as dl
    from driverlevel.interfaces import TargetBuffers

    dev = SimpleNamespace(ordinal=0)
    a = lambda shape, dt, ptr: dl.DeviceArray(ptr, shape, dt, dev)  # noqa: E731

    def buffers(slots=1000, batch=2):
        meta = SimpleNamespace(qo_indptr=a((3,), np.int64, 0x100), kv_indptr=a((3,), np.int32, 0x200),
                               kv_indices=a((slots,), np.int64, 0x300), out_cache_loc=a((8,), np.int64, 0x400),
                               custom_mask=None, mask_indptr=None)
        return TargetBuffers(a((8,), np.int32, 0x500), a((8,), np.int64, 0x600), meta, a((slots, 576), dl.bfloat16, 0x700),
                             None, a((1,), np.int32, 0x800), 8, batch, 4, "bitmask")

    assert buffers().key() == buffers().key()
    assert buffers(slots=500).key() != buffers().key() and buffers(batch=1).key() != buffers().key()
