"""Review 16 #8: a launch's ``stream`` and a verify call's ``metadata`` are checked before any launch
(CPU only).

``VerifyAttention.run(None, ...)`` ended in ``AttributeError: 'NoneType' object has no attribute
'handle'``, ``metadata=None`` in a misleading ``qo_indptr is required``; the DDTree stages had the
same stream problem (an ``AttributeError`` from the launch, after packing it). The plans are built
with ``object.__new__`` on a stand-in device, as in ``test_verify_attention`` and
``test_readonly_outputs``: the checks run before any launch, so no GPU is needed.
"""

from __future__ import annotations

from types import MappingProxyType, SimpleNamespace

import numpy as np
import pytest

import driverlevel as dl
from driverlevel import DDTreePlan, RequestState, VerifyAttention, VerifyMetadata
from driverlevel._checks import stream_arg
from driverlevel._graph import Graph, GraphExec
from driverlevel._mask import bitmask_words, parse_mask_format

DEV = SimpleNamespace(ordinal=0)
BAD_STREAMS = [None, 0, 7, "stream", object()]
STREAM_WORDS = r"^stream must be a driverlevel Stream \(Device.create_stream\(\) or Stream.from_handle\), got "


def arr(shape, dtype):
    return dl.DeviceArray(0x10000, shape, dtype, DEV)


def _with_handle(cls):
    """A ``cls`` as its ``_create`` leaves it, without the driver: a handle and a device."""
    obj = object.__new__(cls)
    obj._handle, obj.device = 0x1234, DEV
    return obj


def _stream():
    s = object.__new__(dl.Stream)
    s._handle, s.device, s._capture, s._finalizer = 0x1234, DEV, None, None
    return s


def test_stream_arg_takes_what_capture_takes():
    s = _stream()
    assert stream_arg("stream", s) is s
    for bad in BAD_STREAMS:
        with pytest.raises(TypeError, match=STREAM_WORDS + type(bad).__name__ + "$"):
            stream_arg("stream", bad)


# Review 17 M2: an Event, a Graph or a GraphExec has a ``handle`` and a ``device`` too; the duck test passed
# them, and their CUevent / CUgraph handle would have gone to cuLaunchKernel as a CUstream.
NOT_STREAMS = [dl.Event, Graph, GraphExec, SimpleNamespace]


@pytest.mark.parametrize("cls", NOT_STREAMS, ids=lambda c: c.__name__)
def test_stream_arg_refuses_the_other_objects_with_a_handle_and_a_device(cls):
    bad = SimpleNamespace(handle=0x1234, device=DEV) if cls is SimpleNamespace else _with_handle(cls)
    with pytest.raises(TypeError, match=STREAM_WORDS + cls.__name__ + "$"):
        stream_arg("stream", bad)


@pytest.mark.parametrize("cls", NOT_STREAMS, ids=lambda c: c.__name__)
def test_capture_refuses_the_other_objects_with_a_handle_and_a_device(cls):
    bad = SimpleNamespace(handle=0x1234, device=DEV) if cls is SimpleNamespace else _with_handle(cls)
    words = r"^capture needs a driverlevel Stream \(Device.create_stream\(\) or Stream.from_handle\), got "
    with pytest.raises(TypeError, match=words + cls.__name__ + "$"):
        with dl.capture(bad):
            pytest.fail("captured")


# -- VerifyAttention ---------------------------------------------------------------------------------
def _verify_plan():
    plan = object.__new__(VerifyAttention)
    plan.device, plan.num_heads, plan.max_batch, plan.max_q = DEV, 9, 8, 64
    plan.mask_format, plan.mask_words = parse_mask_format("bitmask"), bitmask_words(64)
    plan._stream_handle, plan._cached_key = None, None
    return plan


def _verify_args(metadata="good"):
    meta = VerifyMetadata(arr((2,), "int64"), arr((2,), "int32"), arr((100,), "int64"), arr((4,), "int64"),
                          arr((4, 2), "uint32"))
    return (arr((4, 9, 576), dl.bfloat16), arr((200, 576), dl.bfloat16), meta if metadata == "good" else metadata,
            arr((4, 9, 512), dl.bfloat16), arr((4, 9), "float32"))


@pytest.mark.parametrize("stream", BAD_STREAMS)
def test_verify_attention_run_refuses_a_stream_that_is_not_a_stream(stream):
    plan = _verify_plan()
    with pytest.raises(TypeError, match=STREAM_WORDS + type(stream).__name__ + "$"):
        plan.run(stream, *_verify_args())
    assert plan._stream_handle is None  # nothing bound


@pytest.mark.parametrize("metadata", [None, [], ["qo_indptr"], "metadata", 3])
def test_verify_attention_refuses_metadata_that_is_neither_a_verify_metadata_nor_a_mapping(metadata):
    q, kv, meta, out, lse = _verify_args(metadata)
    words = r"^metadata must be a VerifyMetadata or a mapping of its fields \(qo_indptr, .*\), got "
    with pytest.raises(TypeError, match=words + type(metadata).__name__ + "$"):
        _verify_plan()._validate(q, kv, meta, out, lse)


def test_verify_attention_takes_a_mapping_or_an_object_with_the_fields():
    good = _verify_args()[2]
    fields = dict(qo_indptr=good.qo_indptr, kv_indptr=good.kv_indptr, kv_indices=good.kv_indices,
                  out_cache_loc=good.out_cache_loc, custom_mask=good.custom_mask)
    q, kv, _, out, lse = _verify_args()
    for meta in (good, fields, MappingProxyType(fields), SimpleNamespace(**fields)):
        assert _verify_plan()._validate(q, kv, meta, out, lse)[-1] == 1  # bs
    with pytest.raises(TypeError, match=r"^qo_indptr is required \(metadata's keys: kv_indptr\)$"):
        _verify_plan()._validate(q, kv, {"kv_indptr": good.kv_indptr}, out, lse)  # the field named, and the keys
    misspelt = dict(fields, qo_indptrs=fields.pop("qo_indptr"))
    with pytest.raises(TypeError, match=r"^qo_indptr is required \(metadata's keys: .*qo_indptrs"):
        _verify_plan()._validate(q, kv, misspelt, out, lse)
    legacy = dict(fields, qo_indptr=good.qo_indptr, mask=fields.pop("custom_mask"))  # (the mask's other name)
    assert _verify_plan()._validate(q, kv, legacy, out, lse)[-1] == 1


# -- DDTreePlan --------------------------------------------------------------------------------------
B, C, D, V = 4, 64, 3, 128


def _ddtree_plan():
    plan = object.__new__(DDTreePlan)
    plan.device, plan.max_batch, plan.max_context = DEV, B, C
    plan.depth_limit, plan.vocab, plan.logits_dtype = D, V, np.dtype(np.float32)
    plan.max_rows, plan.record_width = 64, 12
    plan.pdl = False  # (the stand-in device's code is not sm_90's)
    plan._cache = {}  # the packed launches: still empty after a refused call
    return plan


def _state():
    f = {"active": ((B,), "uint8"), "root_tokens": ((B,), "int32"), "seq_lens": ((B,), "int64"),
         "req_pool_indices": ((B,), "int64"), "req_to_token": ((B, C), "int32"), "free_slots": ((100,), "int64"),
         "free_count": ((1,), "int64")}
    return RequestState(**{k: arr(s, d) for k, (s, d) in f.items()})


STAGES = {
    "build": lambda plan, s: plan.build(s, arr((B, D, V), "float32"), _state()),
    "compile": lambda plan, s: plan.compile(s, _state()),
    "accept": lambda plan, s: plan.accept(s, _state(), target_tokens=arr((64,), "int32")),
    "commit": lambda plan, s: plan.commit(s, _state()),
    "commit_dense": lambda plan, s: plan.commit_dense(s, _state(), arr((2, B, C, 8), "float32")),
}


@pytest.mark.parametrize("stage", sorted(STAGES))
@pytest.mark.parametrize("stream", [None, 0, "stream"])
def test_ddtree_stages_refuse_a_stream_that_is_not_a_stream(stage, stream):
    plan = _ddtree_plan()
    with pytest.raises(TypeError, match=STREAM_WORDS + type(stream).__name__ + "$"):
        STAGES[stage](plan, stream)
    assert plan._cache == {}  # refused before any launch was packed


# -- the runners' stream= --------------------------------------------------------------------------
def test_runner_stream_must_be_a_stream(monkeypatch):
    from driverlevel import runner

    monkeypatch.setattr(runner, "_check_device_arg", lambda d: pytest.fail("the device was touched first"))
    with pytest.raises(TypeError, match=STREAM_WORDS + "int$"):
        runner.AutoregressiveRunner(0, target_forward=lambda stream, buffers: None, vocab_size=64, max_batch=2,
                                    max_context=64, max_prompt_len=8, stream=5)


# -- check_errors(stream) ----------------------------------------------------------------------------
# Review 17 L2: ``DeviceErrorWord.check`` ran ``stream.synchronize()`` on whatever it was given. An Event's
# ``synchronize`` returns at once if it was never recorded (or was recorded before the step), so the word was
# read before the kernels finished and an error could be missed; a GraphExec gave a bare AttributeError.
def _error_word(code=0):
    from driverlevel._device_error import DeviceErrorWord

    word = object.__new__(DeviceErrorWord)
    word.label, word.device, word._words = "test", DEV, np.array([code, 1, 2, 1], np.int32)  # an error, if code
    return word


def _check_errors_owners():
    plan = object.__new__(DDTreePlan)
    plan.error_word = _error_word(code=3)
    verify = _verify_plan()
    verify.error_word = _error_word(code=3)
    return {"DeviceErrorWord": (plan.error_word, plan.error_word.check), "DDTreePlan": (plan.error_word,
            plan.check_errors), "VerifyAttention": (verify.error_word, verify.check_errors)}


@pytest.fixture
def synced(monkeypatch):
    """Every ``synchronize`` of an Event, a Stream or any object, recorded instead of run."""
    calls = []
    for cls in (dl.Event, dl.Stream):
        monkeypatch.setattr(cls, "synchronize", lambda self: calls.append(self))
    return calls


@pytest.mark.parametrize("owner", ["DeviceErrorWord", "DDTreePlan", "VerifyAttention"])
@pytest.mark.parametrize("cls", NOT_STREAMS, ids=lambda c: c.__name__)
def test_check_errors_refuses_an_event_or_a_graph_in_place_of_the_stream(owner, cls, synced):
    word, check_errors = _check_errors_owners()[owner]
    bad = SimpleNamespace(handle=0x1234, device=DEV, synchronize=lambda: synced.append("duck")) \
        if cls is SimpleNamespace else _with_handle(cls)
    with pytest.raises(TypeError, match=STREAM_WORDS + cls.__name__ + "$"):
        check_errors(bad)
    assert synced == []  # nothing synchronised in the stream's place
    assert word.read() == (3, 1, 2, 1)  # the word neither read into an error nor cleared


@pytest.mark.parametrize("owner", ["DeviceErrorWord", "DDTreePlan", "VerifyAttention"])
@pytest.mark.parametrize("stream", [0, "stream"])
def test_check_errors_refuses_a_stream_that_is_not_a_stream(owner, stream, synced):
    word, check_errors = _check_errors_owners()[owner]
    with pytest.raises(TypeError, match=STREAM_WORDS + type(stream).__name__ + "$"):
        check_errors(stream)
    assert word.read() == (3, 1, 2, 1)


@pytest.mark.parametrize("owner", ["DeviceErrorWord", "DDTreePlan", "VerifyAttention"])
def test_check_errors_synchronises_a_stream_and_takes_none(owner, synced):
    word, check_errors = _check_errors_owners()[owner]
    s = _stream()
    with pytest.raises(dl.MetadataError):
        check_errors(s)
    assert synced == [s] and word.read() == (0, 0, 0, 0)  # synchronised first, then raised and cleared
    check_errors(s)  # a clear word: no error
    check_errors(None)  # documented: no synchronisation
    assert synced == [s, s]


def test_ddtree_launches_are_packed_again_for_a_state_of_other_shapes_at_the_same_addresses(monkeypatch):
    """The packed parameters hold free_slots' length and req_to_token's rows and dtype: a state at the same
    addresses with other shapes or dtypes must not replay the launches packed for the first one (a 50-slot
    free list replayed as a 100-slot one would be written past its end)."""
    from driverlevel import ddtree

    plan = _ddtree_plan()
    plan._what, plan.pool = "DDTreePlan 'x'", SimpleNamespace()  # (a pool with no finalizer reads as live)
    packed = []

    class Kernel:
        def prepare(self, *a, **k):
            packed.append(a)
            return SimpleNamespace(keep=lambda *a: None, launch=lambda s: None)

    plan._k_commit = plan._k_dense = Kernel()
    monkeypatch.setattr(plan, "_params", lambda state: SimpleNamespace(), raising=False)
    monkeypatch.setattr(ddtree, "_pack", lambda cls, p: p)

    def state(cap=100, r2t="int32", rows=B):
        f = {"active": ((B,), "uint8"), "root_tokens": ((B,), "int32"), "seq_lens": ((B,), "int64"),
             "req_pool_indices": ((B,), "int64"), "req_to_token": ((rows, C), r2t), "free_slots": ((cap,), "int64"),
             "free_count": ((1,), "int64")}
        return RequestState(**{k: dl.DeviceArray(0x100000 * (i + 1), s, d, DEV) for i, (k, (s, d)) in enumerate(f.items())})

    s = _stream()
    plan.commit(s, state())
    plan.commit(s, state())
    assert len(packed) == 1  # the same arrays: replayed
    for other in (state(cap=50), state(r2t="int64"), state(rows=2)):
        plan.commit(s, other)
    assert len(packed) == 4
    # the dense commit's parameters hold its cache's shape and strides (two launches packed per new key)
    dense = lambda shape: dl.DeviceArray(0x9000000, shape, "float32", DEV)  # noqa: E731
    plan.commit_dense(s, state(), dense((2, B, C, 8)))
    plan.commit_dense(s, state(), dense((2, B, C, 8)))
    assert len(packed) == 6
    plan.commit_dense(s, state(), dense((3, B, C, 8)))
    plan.commit_dense(s, state(), dense((2, B, C + 4, 8)))
    assert len(packed) == 10


def test_accept_takes_a_mapped_mirror_of_any_device_and_names_mirror_in_its_errors(monkeypatch):
    """driverlevel's pinned buffers are portable and mapped: the plan views one as its own device's memory.
    An unmapped or too small one is refused naming ``mirror``."""
    from driverlevel import PinnedHostBuffer, ddtree

    plan = _ddtree_plan()
    plan._what, plan.pool = "DDTreePlan 'x'", SimpleNamespace()
    packed = []
    plan._k_accept = SimpleNamespace(prepare=lambda *a, **k: packed.append(a[2][0]) or SimpleNamespace(
        keep=lambda *a: None, launch=lambda s: None))
    monkeypatch.setattr(plan, "_params", lambda state: SimpleNamespace(), raising=False)
    monkeypatch.setattr(ddtree, "_pack", lambda cls, p: p)

    def pinned(nbytes, device, mapped=True):
        b = object.__new__(PinnedHostBuffer)
        b.nbytes, b.mapped, b.device, b.label, b.host_ptr = nbytes, mapped, device, "mirror", 0x5500_0000
        b.device_ptr = 0x7F00_0030_0000 if mapped else None
        return b

    tokens = arr((plan.max_rows,), "int32")
    need = B * plan.record_width * 4
    plan.accept(_stream(), _state(), target_tokens=tokens, mirror=pinned(need, SimpleNamespace(ordinal=1)))
    assert packed[-1].mirror == 0x7F00_0030_0000
    for bad, words in ((pinned(need, DEV, mapped=False), r"^mirror: as_array\(\) needs a buffer allocated with "
                                                         r"mapped=True"),
                       (pinned(16, DEV), r"^mirror: view of \d+ bytes .*exceeds the buffer's 16")):
        with pytest.raises(ValueError, match=words):
            plan.accept(_stream(), _state(), target_tokens=tokens, mirror=bad)


def test_commit_dense_refuses_layer_counts_the_grid_cannot_take_and_empty_caches():
    plan = _ddtree_plan()
    for shape in ((0, B, C, 8), (70_000, B, C, 4), (1, B, C, 0, 16)):
        with pytest.raises(ValueError, match=r"cache must have 1 to 65,535 layers and hold elements"):
            plan.commit_dense(_stream(), _state(), dl.DeviceArray(0x10000, shape, "float32", DEV))
    assert plan._cache == {}


def test_an_int32_table_with_more_free_slots_than_it_can_name_is_refused():
    f = {"active": ((B,), "uint8"), "root_tokens": ((B,), "int32"), "seq_lens": ((B,), "int64"),
         "req_pool_indices": ((B,), "int64"), "req_to_token": ((B, C), "int32"), "free_slots": ((2**31 + 1,), "int64"),
         "free_count": ((1,), "int64")}
    st = RequestState(**{k: arr(s, d) for k, (s, d) in f.items()})
    with pytest.raises(ValueError, match=r"an int32 state.req_to_token holds slot ids below 2\*\*31, but "
                                         r"state.free_slots has 2,147,483,649 slots"):
        _ddtree_plan().commit(_stream(), st)
    f["free_slots"] = ((2**31,), "int64")  # ids 0 .. 2**31 - 1 all fit (RequestState.specs' own limit)
    st = RequestState(**{k: arr(s, d) for k, (s, d) in f.items()})
    _ddtree_plan()._check_state(st)


def test_verify_attentions_scale_and_split_cap_are_read_only():
    """Both are packed into the launches run() caches: an assignment after the first run was replayed silently
    with the old value (and skipped the constructor's checks)."""
    plan = _verify_plan()
    plan._sm_scale, plan._num_splits = 0.07, 8
    assert plan.sm_scale == 0.07 and plan.num_splits == 8
    for name in ("sm_scale", "num_splits"):
        with pytest.raises(AttributeError):
            setattr(plan, name, 1)
