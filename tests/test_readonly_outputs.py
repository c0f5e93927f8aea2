"""review15 #5: a read-only array (``DeviceArray.readonly``, e.g. imported from a read-only
``__cuda_array_interface__``) is never written by a plan (CPU only).

The plans are built with ``object.__new__`` on a stand-in device, as in ``test_verify_attention``:
the checks run before any launch, so no GPU is needed. Read-only *inputs* stay accepted.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import driverlevel as dl
from driverlevel import DDTreePlan, RequestState, VerifyAttention, VerifyMetadata
from driverlevel._mask import bitmask_words, parse_mask_format

DEV = SimpleNamespace(ordinal=0)


@pytest.fixture(autouse=True)
def _pointers_on_device_0(monkeypatch):
    """A ``__cuda_array_interface__`` import asks the driver which device its pointer is on (review 18 M1):
    the made-up pointers of these tests are on device 0."""
    from driverlevel import _array

    monkeypatch.setattr(_array, "_pointer_ordinal", lambda ptr, device=None: 0)


class RO:
    """A read-only foreign device array (``data=(ptr, True)``), as in the report."""

    def __init__(self, shape, typestr, ptr=0x20000):
        self.__cuda_array_interface__ = dict(shape=shape, typestr=typestr, data=(ptr, True), version=3, strides=None)


def arr(shape, dtype, readonly=False):
    return dl.DeviceArray(0x10000, shape, dtype, DEV, readonly=readonly)


# -- VerifyAttention ---------------------------------------------------------------------------------
def _verify_plan():
    plan = object.__new__(VerifyAttention)
    plan.device, plan.num_heads, plan.max_batch, plan.max_q = DEV, 9, 8, 64
    plan.mask_format, plan.mask_words = parse_mask_format("bitmask"), bitmask_words(64)
    return plan


def _verify_args(**kw):
    meta = VerifyMetadata(arr((2,), "int64"), arr((2,), "int32"), arr((100,), "int64"), arr((4,), "int64"),
                          arr((4, 2), "uint32"))
    args = dict(q=arr((4, 9, 576), dl.bfloat16), kv_cache=arr((200, 576), dl.bfloat16), metadata=meta,
                out=arr((4, 9, 512), dl.bfloat16), lse=arr((4, 9), "float32"))
    args.update(kw)
    return args


@pytest.mark.parametrize("name, value", [("out", RO((4, 9, 512), "<u2")), ("lse", RO((4, 9), "<f4")),
                                         ("out", arr((4, 9, 512), dl.bfloat16, readonly=True))])
def test_verify_attention_refuses_read_only_outputs(name, value):
    """_validate accepted a read-only out and lse (the reviewer's repro printed 'True True')."""
    a = _verify_args(**{name: value})
    with pytest.raises(ValueError) as ei:
        _verify_plan()._validate(a["q"], a["kv_cache"], a["metadata"], a["out"], a["lse"])
    assert str(ei.value) == f"{name} is read-only, but the launch writes it"


def test_verify_attention_takes_read_only_inputs():
    a = _verify_args(q=RO((4, 9, 576), "<u2"), kv_cache=RO((200, 576), "<u2", ptr=0x30000))
    r = _verify_plan()._validate(a["q"], a["kv_cache"], a["metadata"], a["out"], a["lse"])
    assert r[0].readonly and r[1].readonly and not r[8].readonly and not r[9].readonly


# -- DDTreePlan --------------------------------------------------------------------------------------
B, C = 4, 64


def _ddtree_plan():
    plan = object.__new__(DDTreePlan)
    plan.device, plan.max_batch, plan.max_context = DEV, B, C
    return plan


def _state(readonly=()):
    f = {"active": ((B,), "uint8"), "root_tokens": ((B,), "int32"), "seq_lens": ((B,), "int64"),
         "req_pool_indices": ((B,), "int64"), "req_to_token": ((B, C), "int32"), "free_slots": ((100,), "int64"),
         "free_count": ((1,), "int64")}
    return RequestState(**{k: arr(s, d, readonly=k in readonly) for k, (s, d) in f.items()})


@pytest.mark.parametrize("field", ["active", "root_tokens"])
def test_accept_refuses_a_read_only_field_it_writes(field):
    with pytest.raises(ValueError) as ei:
        _ddtree_plan().accept(None, _state(readonly=(field,)), target_tokens=arr((64,), "int32"))
    assert str(ei.value) == f"state.{field} is read-only, but the launch writes it"


@pytest.mark.parametrize("field", ["seq_lens", "req_to_token", "free_slots", "free_count"])
def test_commit_refuses_a_read_only_field_it_writes(field):
    with pytest.raises(ValueError) as ei:
        _ddtree_plan().commit(None, _state(readonly=(field,)))
    assert str(ei.value) == f"state.{field} is read-only, but the launch writes it"


def test_commit_dense_refuses_a_read_only_cache_or_field():
    plan = _ddtree_plan()
    cache = arr((2, B, C, 8), "float32")
    for field in ("active", "seq_lens"):
        with pytest.raises(ValueError, match=f"^state.{field} is read-only, but the launch writes it$"):
            plan.commit_dense(None, _state(readonly=(field,)), cache)
    with pytest.raises(ValueError, match="^cache is read-only, but the launch writes it$"):
        plan.commit_dense(None, _state(), arr((2, B, C, 8), "float32", readonly=True))


def test_accept_refuses_a_read_only_mirror():
    plan = _ddtree_plan()
    plan.max_rows, plan.record_width = 64, 12
    with pytest.raises(ValueError, match="^mirror is read-only, but the launch writes it$"):
        plan.accept(None, _state(), target_tokens=arr((64,), "int32"), mirror=RO((B, 12), "<i4"))


def test_state_fields_only_read_may_be_read_only():
    """build and compile only read the state; accept does not write req_pool_indices or free_count."""
    plan = _ddtree_plan()
    everything = tuple(f for f in dl.request_state.ARRAY_FIELDS)
    plan._check_state(_state(readonly=everything))                      # compile's check
    plan._check_state(_state(readonly=everything), need_table=False)    # build's check
    plan._check_state(_state(readonly=("seq_lens", "req_pool_indices", "free_count", "req_to_token")),
                      need_table=False, writes=("active", "root_tokens"))


# -- argmax ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["part", "index"])
def test_argmax_refuses_a_read_only_output(monkeypatch, name):
    from driverlevel import argmax

    monkeypatch.setattr(argmax, "_check_device_arg", lambda d: DEV)
    out = dict(part=arr((8,), "uint64"), index=arr((8,), "int32"))
    out[name] = dl.DeviceArray(0x10000, out[name].shape, out[name].dtype, DEV, readonly=True)
    with pytest.raises(ValueError) as ei:
        argmax.argmax_rows_launch(0, arr((8, 100), "float32"), m_max=8, **out)
    assert str(ei.value) == f"{name} is read-only, but the launch writes it"


@pytest.mark.parametrize("bad", [1, "yes", None.__class__])
def test_argmax_programmatic_must_be_a_bool_or_none(monkeypatch, bad):
    """Refused before the device is opened, the arrays are looked at or the module is loaded."""
    from driverlevel import argmax

    monkeypatch.setattr(argmax, "_check_device_arg", lambda d: pytest.fail("opened the device for a bad argument"))
    monkeypatch.setattr(argmax, "load", lambda d: pytest.fail("loaded the module for a bad argument"))
    with pytest.raises(TypeError, match="programmatic must be None, True or False, got "):
        argmax.argmax_rows_launch(0, arr((8, 100), "float32"), m_max=8, index=arr((8,), "int32"), programmatic=bad)
