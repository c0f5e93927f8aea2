"""The runners check every argument before they touch the device (CPU only; review 15 #4).

``_check_device_arg`` is replaced by a function that fails the test: a bad argument must be
its own TypeError / ValueError, not the driver's absence, and nothing may be allocated first.
"""

from __future__ import annotations

import pytest

import driverlevel as dl
from driverlevel import _device, runner
from driverlevel.runner import AutoregressiveRunner, DecodeStepRunner


class _FakeDev:
    ordinal = 0


class _Drafter:
    def __init__(self, shape=(8, 15, 32768), dtype="float32"):
        self.logits = dl.DeviceArray(0x1000, shape, dtype, _FakeDev())

    def prepare(self, root_tokens):
        raise AssertionError("prepare() reached")

    def run(self, stream):
        raise AssertionError("run() reached")


BASE = dict(target_forward=lambda stream, buffers: None, max_batch=8, max_context=4096, max_prompt_len=512,
            vocab_size=32768)


class _Touched(Exception):
    pass


@pytest.fixture
def no_device(monkeypatch):
    def touched(device):
        raise _Touched("the device was touched before the arguments were checked")

    monkeypatch.setattr(runner, "_check_device_arg", touched)
    monkeypatch.setattr(_device, "_check_device_arg", touched)


BAD_BASE = [
    (dict(vocab_size=1), ValueError, "vocab_size must be an int >= 2, got 1"),
    (dict(vocab_size=2.0), TypeError, "vocab_size must be an int >= 2, got float 2.0"),
    (dict(max_prompt_len=10**6), ValueError, r"max_prompt_len \(1000000\) exceeds max_context \(4096\)"),
    (dict(max_prompt_len=0), ValueError, "max_prompt_len must be a positive int, got 0"),
    (dict(num_splits=0), ValueError, "num_splits must be a positive int, got 0"),
    (dict(num_splits=2.0), TypeError, "num_splits must be a positive int, got float 2.0"),
    (dict(prefill_splits=True), TypeError, "prefill_splits must be a positive int, got bool True"),
    (dict(ring_slots=0), ValueError, "ring_slots must be a positive int, got 0"),
    (dict(max_stop_tokens=0), ValueError, "max_stop_tokens must be a positive int, got 0"),
    (dict(max_stop_tokens=4.0), TypeError, "max_stop_tokens must be a positive int, got float 4.0"),
    (dict(slot_seed=-1), ValueError, "slot_seed must be an int >= 0, got -1"),
    (dict(name=3), TypeError, "name must be a str, got int"),
    (dict(max_batch=257, max_context=64, max_prompt_len=8), ValueError, "max_batch must be <= 256, got 257"),
]


@pytest.mark.parametrize("kw, exc, words", BAD_BASE)
def test_autoregressive_runner_checks_arguments_before_the_device(no_device, kw, exc, words):
    with pytest.raises(exc, match=words):
        AutoregressiveRunner(0, **{**BASE, **kw})


@pytest.mark.parametrize("kw, exc, words", BAD_BASE)
def test_decode_step_runner_checks_arguments_before_the_device(no_device, kw, exc, words):
    shape = (kw.get("max_batch", 8), 15, kw.get("vocab_size", 32768))
    drafter = _Drafter(shape if isinstance(shape[2], int) and shape[2] >= 2 else (8, 15, 32768))
    with pytest.raises(exc, match=words):
        DecodeStepRunner(0, drafter=drafter, budget=16, **{**BASE, **kw})


@pytest.mark.parametrize("drafter, kw, exc, words", [
    (_Drafter((1, 2, 3), "float16"), {}, ValueError,
     r"drafter.logits must be float32 \[max_batch, depth_limit, vocab\] = \[8, 15, 32768\], got float16 \[1, 2, 3\]"),
    (_Drafter(), dict(depth_limit=14), ValueError, r"= \[8, 14, 32768\], got float32 \[8, 15, 32768\]"),
    (_Drafter((8, 15, 32768), "bfloat16"), {}, ValueError, "got bfloat16"),
    (_Drafter(), dict(budget=2.0), TypeError, r"budget must be an int in \[1, 512\], got float 2.0"),
    (_Drafter(), dict(budget=0), ValueError, r"budget must be an int in \[1, 512\], got 0"),
    (_Drafter(), dict(depth_limit=True), TypeError, r"depth_limit must be an int in \[1, 32\], got bool True"),
])
def test_decode_step_runner_checks_the_drafter_logits_and_budget_first(no_device, drafter, kw, exc, words):
    with pytest.raises(exc, match=words):
        DecodeStepRunner(0, drafter=drafter, **{"budget": 16, **BASE, **kw})


def test_good_arguments_reach_the_device(no_device):
    with pytest.raises(_Touched):
        AutoregressiveRunner(0, **BASE)
    with pytest.raises(_Touched):
        DecodeStepRunner(0, drafter=_Drafter(), budget=16, **BASE)
