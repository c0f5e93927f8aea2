"""The runners check every argument before they touch the device (CPU only; review 15 #4).

``_check_device_arg`` is replaced by a function that fails the test: a bad argument must be
its own TypeError / ValueError, not the driver's absence, and nothing may be allocated first.
"""

from __future__ import annotations

import numpy as np
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
    # (past the argmax kernels' row length: was refused only after the KV cache and the logits were allocated)
    (dict(vocab_size=2**30 + 1), ValueError, r"vocab_size must be <= 1,073,741,824 \(2\*\*30, the argmax kernels' row "
                                             r"length\), got 1,073,741,825"),
    (dict(max_prompt_len=10**6), ValueError, r"max_prompt_len \(1000000\) exceeds max_context \(4096\)"),
    (dict(max_prompt_len=0), ValueError, "max_prompt_len must be a positive int, got 0"),
    (dict(num_splits=0), ValueError, "num_splits must be a positive int, got 0"),
    (dict(num_splits=2.0), TypeError, "num_splits must be a positive int, got float 2.0"),
    (dict(prefill_splits=True), TypeError, "prefill_splits must be a positive int, got bool True"),
    (dict(ring_slots=0), ValueError, "ring_slots must be a positive int, got 0"),
    (dict(ring_slots=10**9), ValueError, "ring_slots must be <= 4096, got 1000000000"),
    (dict(max_stop_tokens=0), ValueError, "max_stop_tokens must be a positive int, got 0"),
    (dict(max_stop_tokens=4.0), TypeError, "max_stop_tokens must be a positive int, got float 4.0"),
    (dict(slot_seed=-1), ValueError, "slot_seed must be an int >= 0, got -1"),
    (dict(name=3), TypeError, "name must be a str, got int"),
    (dict(pdl="yes"), TypeError, "pdl must be None, True or False, got str"),
    (dict(pdl=1), TypeError, "pdl must be None, True or False, got int"),
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


@pytest.mark.parametrize("kind, rows", [("autoregressive", 1), ("ddtree", 17)])
def test_a_max_prompt_len_whose_prompts_could_never_be_reset_is_refused(no_device, kind, rows):
    """reset() needs len(prompt) + max_new_tokens (>= 1) + one step's rows <= max_context: a max_prompt_len
    above max_context - 1 - rows was taken and then no prompt of that length could ever start."""
    def make(p):
        kw = {**BASE, "max_context": 64, "max_prompt_len": p}
        if kind == "autoregressive":
            return AutoregressiveRunner(0, **kw)
        return DecodeStepRunner(0, drafter=_Drafter(), budget=rows - 1, **kw)

    fits = 64 - 1 - rows
    for p in (fits + 1, 64):
        with pytest.raises(ValueError, match=rf"^max_prompt_len \({p}\) leaves no room in max_context \(64\): a prompt "
                                             rf"that long needs {p + 1 + rows} positions .* use max_prompt_len <= "
                                             rf"{fits} or max_context >= {p + 1 + rows}$"):
            make(p)
    with pytest.raises(_Touched):  # the longest that fits reaches the device
        make(fits)


def test_good_arguments_reach_the_device(no_device):
    with pytest.raises(_Touched):
        AutoregressiveRunner(0, **BASE)
    with pytest.raises(_Touched):
        DecodeStepRunner(0, drafter=_Drafter(), budget=16, **BASE)


class _Model:
    """A TargetModel whose forwards must not be made: the runner checks its arguments first."""

    vocab_size = 32768

    def forward_plan(self, **kw):
        raise AssertionError("forward_plan() reached")


MODEL = dict(model=_Model(), max_batch=8, max_context=4096, max_prompt_len=512)


@pytest.mark.parametrize("kw, words", [
    (dict(num_splits=5000), "num_splits must be <= 1024"),
    (dict(prefill_splits=5000), "prefill_splits must be <= 1024"),
])
def test_splits_above_the_verify_attention_limit_are_refused_before_the_device(no_device, kw, words):
    """Review 16 #3: with model=, VerifyAttention refused them only inside model.forward_plan, after
    the runner had allocated its buffers and compiled its module."""
    with pytest.raises(ValueError, match=words):
        AutoregressiveRunner(0, **MODEL, **kw)
    with pytest.raises(ValueError, match=words):
        DecodeStepRunner(0, drafter=_Drafter(), budget=16, **MODEL, **kw)


def test_splits_at_the_verify_attention_limit_reach_the_device(no_device):
    from driverlevel.verify_attention import MAX_SPLITS

    with pytest.raises(_Touched):
        AutoregressiveRunner(0, **MODEL, num_splits=MAX_SPLITS, prefill_splits=MAX_SPLITS)
    # with target_forward= the runner makes no VerifyAttention plan: no limit of its own
    with pytest.raises(_Touched):
        AutoregressiveRunner(0, **BASE, num_splits=5000)


def test_vocab_times_budget_beyond_the_ddtree_merge_is_refused_before_the_device(no_device):
    """Review 16 #3: DDTreePlan's vocabulary x budget rule was checked only when the runner built its
    DDTreePlan, after allocating and compiling; the message is DDTreePlan's own."""
    from driverlevel.ddtree import check_merge_capacity

    kw = {**BASE, "vocab_size": 200000}
    with pytest.raises(ValueError, match="vocab=200000 at K=512 needs 27 chunks x 512 candidates") as e:
        DecodeStepRunner(0, drafter=_Drafter((8, 15, 200000)), budget=512, **kw)
    with pytest.raises(ValueError) as direct:
        check_merge_capacity(200000, 512)
    assert str(e.value) == str(direct.value)
    with pytest.raises(_Touched):  # a budget that fits that vocabulary
        DecodeStepRunner(0, drafter=_Drafter((8, 15, 200000)), budget=455, **kw)


@pytest.mark.parametrize("vocab, budget, fits", [
    (163840, 512, True), (184320, 512, True), (184321, 512, False), (200000, 455, True), (200000, 456, False),
    (12288 * 7680, 1, True), (12288 * 7680 + 1, 1, False), (100, 512, True),
])
def test_check_merge_capacity_is_the_plans_rule(vocab, budget, fits):
    """ceil(vocab / 7680) * min(budget, vocab) <= 12288, as DDTreePlan documents it."""
    from driverlevel.ddtree import check_merge_capacity

    if fits:
        check_merge_capacity(vocab, budget)
    else:
        with pytest.raises(ValueError, match="more than the row merge's 12288"):
            check_merge_capacity(vocab, budget)


def test_an_unknown_keyword_names_the_public_runner(no_device):
    """A keyword neither runner takes: the TypeError names the runner the user called, not the
    private base class the other keywords are passed on to (a new user's trial, twenty-third session)."""
    with pytest.raises(TypeError, match=r"^AutoregressiveRunner\(\) got an unexpected keyword argument 'foo'$"):
        AutoregressiveRunner(0, **BASE, foo=1)
    with pytest.raises(TypeError, match=r"^DecodeStepRunner\(\) got an unexpected keyword argument 'foo'$"):
        DecodeStepRunner(0, drafter=_Drafter(), budget=16, **BASE, foo=1)
    # the base's own keywords still pass (and reach the device)
    with pytest.raises(_Touched):
        AutoregressiveRunner(0, **BASE, ring_slots=8, slot_seed=1)


class _NoLogits(_Drafter):
    def __init__(self, logits):
        self.logits = logits


@pytest.mark.parametrize("logits, words", [(None, "got None$"), ([1.0, 2.0], "got list without a dtype$")])
def test_drafter_logits_without_a_dtype_say_what_they_are(no_device, logits, words):
    with pytest.raises(ValueError, match=r"drafter.logits must be float32 \[max_batch, depth_limit, vocab\] = "
                                         r"\[8, 15, 32768\], " + words):
        DecodeStepRunner(0, drafter=_NoLogits(logits), budget=16, **BASE)


# -- reset() / generate() / step(): the per-call arguments (review: loose checks) ---------------

class _ResetReached(Exception):
    pass


def _reset_runner(monkeypatch):
    """An AutoregressiveRunner shell with just what reset() reads before its first device call;
    that call raises _ResetReached, so a test sees whether the arguments were accepted."""
    from driverlevel import _capture_guard

    monkeypatch.setattr(runner, "ensure_not_capturing", lambda *a, **k: None)
    monkeypatch.setattr(_capture_guard, "ensure_not_capturing", lambda *a, **k: None)
    r = object.__new__(AutoregressiveRunner)

    class _Stream:
        def synchronize(self):
            raise _ResetReached

    r.stream, r.max_batch, r.max_context, r.max_prompt_len, r.vocab_size = _Stream(), 4, 256, 32, 1000
    r._rows_per_request, r.n_stop, r.slot_seed, r.num_slots, r.scratch_slot = 1, 4, 0, 1000, 999
    r._ready, r._exec = False, None
    return r


@pytest.mark.parametrize("args, kw, exc, words", [
    (([[1.7, 2.9]], 5), {}, TypeError, r"prompts\[0\] .*got float 1.7"),
    (([[True, False]], 5), {}, TypeError, r"prompts\[0\] .*got bool True"),
    ((["123"], 5), {}, TypeError, r"prompts\[0\] must be a sequence of int token ids, got str '123'"),
    (([1, 2, 3], 5), {}, TypeError, r"prompts\[0\] .*got int 1; for one request write prompts=\[\[\.\.\.\]\]"),
    (("hello", 5), {}, TypeError, "prompts must be a sequence of prompts"),
    (([[1, 2]], 5.0), {}, TypeError, "max_new_tokens must be an int or a sequence of ints .*got float 5.0"),
    (([[1, 2]], [5.9]), {}, TypeError, "max_new_tokens .*got float 5.9"),
    (([[1, 2]], True), {}, TypeError, "max_new_tokens .*got bool True"),
    (([[1, 2]], "7"), {}, TypeError, "max_new_tokens .*got str '7'"),
    (([[1, 2]], None), {}, TypeError, "max_new_tokens .*got NoneType"),
    (([[1, 2]], 5), dict(stop_tokens=2.5), TypeError, "stop_tokens must be None, an int.*got float 2.5"),
    (([[1, 2]], 5), dict(stop_tokens=[2.5]), TypeError, r"stop_tokens\[0\] must be an int or a sequence of ints"),
    (([[1, 2]], 5), dict(stop_tokens=True), TypeError, "stop_tokens .*got bool True"),
    (([[1, 2]], 5), dict(stop_tokens=-5), ValueError, r"stop tokens outside \[0, vocab_size=1000\)"),
    (([[1, 2]], 5), dict(stop_tokens=2**40), ValueError, r"stop tokens outside \[0, vocab_size=1000\)"),
    (([[1, 2]], 5), dict(stop_tokens=[[1], [2]]), ValueError, r"one list per request \(1\) expected, got 2"),
])
def test_reset_refuses_bad_arguments_naming_them(monkeypatch, args, kw, exc, words):
    r = _reset_runner(monkeypatch)
    with pytest.raises(exc, match=words):
        r.reset(*args, **kw)


@pytest.mark.parametrize("args, kw", [
    (([[1, 2, 3]], 5), {}),
    ((np.array([[1, 2], [3, 4]]), np.array([3, 4])), {}),
    (([[1, 2]], [5]), dict(stop_tokens=[])),            # [] for all: no stop token
    (([[1, 2], [3]], 5), dict(stop_tokens=[7, [8, 9]])),  # one int or list per request
    (([[1, 2]], 5), dict(stop_tokens=np.int64(7))),
])
def test_reset_takes_good_arguments(monkeypatch, args, kw):
    r = _reset_runner(monkeypatch)
    with pytest.raises(_ResetReached):
        r.reset(*args, **kw)


@pytest.mark.parametrize("kw, exc, words", [
    (dict(graph="no"), TypeError, "graph must be a bool, got str 'no'"),
    (dict(max_steps=0), ValueError, "max_steps must be a positive int, got 0"),
    (dict(max_steps=2.5), TypeError, "max_steps must be a positive int, got float 2.5"),
    (dict(progress=5), TypeError, "progress must be a callable or None, got int"),
])
def test_generate_checks_its_own_arguments_before_the_reset(monkeypatch, kw, exc, words):
    r = _reset_runner(monkeypatch)
    with pytest.raises(exc, match=words):
        r.generate([[1, 2]], 5, **kw)


def test_step_graph_must_be_a_bool(monkeypatch):
    r = _reset_runner(monkeypatch)
    with pytest.raises(TypeError, match="graph must be a bool, got int 0"):
        r.step(0)


# -- step(), collect() and step_gpu_ms(): arguments and the ring's timing slots ---------------------------
class _ElapsedEvent:
    def __init__(self, ms):
        self.ms = ms

    def elapsed_ms(self, end):
        return end.ms - self.ms


def _ring_runner():
    """A runner shell after 6 collected steps in a ring of 4: steps 4 and 5 and 3 kept their timing,
    step 2's slot was taken by step 6 (launched with gpu_timing off, not collected)."""
    r = object.__new__(AutoregressiveRunner)
    r.ring_slots, r._launched, r._collected = 4, 7, 6
    r._timed = [4, 5, -1, 3]
    r._start_events = [_ElapsedEvent(10.0 * i) for i in range(4)]
    r._events = [_ElapsedEvent(10.0 * i + 0.25 * (i + 1)) for i in range(4)]
    return r


def test_step_gpu_ms_gives_a_kept_step_and_refuses_the_others():
    r = _ring_runner()
    assert r.step_gpu_ms(4) == 0.25 and r.step_gpu_ms(5) == 0.5 and r.step_gpu_ms(3) == 1.0
    assert r.step_gpu_ms(np.int64(5)) == 0.5
    with pytest.raises(ValueError, match=r"^step_gpu_ms\(6\): step 6 is not collected yet \(6 collected\)$"):
        r.step_gpu_ms(6)
    for k in (1, 2, 0):  # slot 1 holds step 5; slot 2 step 6, untimed; slot 0 step 4
        with pytest.raises(ValueError, match=rf"^step_gpu_ms\({k}\): no timing of step {k}: it ran with gpu_timing"):
            r.step_gpu_ms(k)
    for bad, exc in ((5.0, TypeError), (True, TypeError), (-1, ValueError), ("5", TypeError)):
        with pytest.raises(exc, match="k must be"):
            r.step_gpu_ms(bad)


def test_collect_refuses_a_float_or_negative_upto_before_waiting():
    r = _ring_runner()
    for bad, exc in ((2.5, TypeError), (True, TypeError), (-1, ValueError)):
        with pytest.raises(exc, match="upto must be"):
            r.collect(bad)
    assert r.collect(3) == 0 and r._collected == 6  # already collected: nothing to read


def test_step_with_graph_before_capture_is_refused_before_it_collects(monkeypatch):
    r = _ring_runner()
    r._ready, r._exec, r._launched = True, None, 10  # a full ring: step() would collect first
    monkeypatch.setattr(AutoregressiveRunner, "collect", lambda self, upto=None: pytest.fail("collected"))
    with pytest.raises(RuntimeError, match=r"step\(graph=True\) before capture\(\)"):
        r.step(graph=True)
    with pytest.raises(TypeError, match="graph must be a bool"):
        r.step(graph="yes")
    assert r._launched == 10 and r._timed == [4, 5, -1, 3]


def test_check_slots_finds_a_slot_committed_and_free_at_once():
    """The counts alone balanced when slot 1 was both committed and on the free stack and slot 7 had leaked."""
    from types import SimpleNamespace

    from driverlevel.runner import AutoregressiveRunner

    host = lambda a: SimpleNamespace(to_numpy=lambda: np.asarray(a))  # noqa: E731
    r = object.__new__(AutoregressiveRunner)
    r.stream, r.num_slots = SimpleNamespace(synchronize=lambda: None), 11  # slots 0 .. 9, scratch 10

    def state(table, lens, free):
        return SimpleNamespace(free_count=host([len(free)]), seq_lens=host(lens), req_to_token=host(table),
                               req_pool_indices=host([0, 1]), free_slots=host(free + [-1] * (10 - len(free))))

    r.state = state([[0, 1, 2, 0], [3, 4, 0, 0]], [3, 2], [5, 6, 8, 9, 7])
    r.check_slots()  # every slot once
    r.state = state([[0, 1, 2, 0], [3, 4, 0, 0]], [3, 2], [5, 6, 8, 9, 1])
    with pytest.raises(AssertionError, match="slot 1 is committed and free at once"):
        r.check_slots()
    r.state = state([[0, 1, 2, 0], [3, 4, 0, 0]], [3, 2], [5, 6, 8, 9, 10])
    with pytest.raises(AssertionError, match="outside 0 .. 9"):
        r.check_slots()


def test_a_failed_reset_leaves_the_runner_not_ready(monkeypatch):
    """A reset that fails (bad arguments, or its copies or prefill) must not leave the previous run steppable:
    step() and collect() would read the new requests' records into the old bookkeeping."""
    r = _reset_runner(monkeypatch)
    r._ready = True  # (as after an earlier successful reset)
    with pytest.raises(TypeError):
        r.reset([[1.5]], 5)
    assert r._ready is False
    r._ready = True
    with pytest.raises(_ResetReached):  # (the device part failed)
        r.reset([[1, 2]], 5)
    assert r._ready is False
    with pytest.raises(RuntimeError, match=r"step\(\) before reset"):
        r.step(graph=False)


def test_collect_never_clears_an_error_word_under_queued_steps():
    """While steps launched after the collected one are still queued, collect() only looks at the error words: with
    none set it neither checks nor clears; with one set it synchronizes the stream first; the collect of the last
    step launched runs the full check."""
    from types import SimpleNamespace

    from driverlevel.runner import RING_HEADER

    r = object.__new__(AutoregressiveRunner)
    word = [0, 0, 0, 0]
    log = []
    r.error_word = SimpleNamespace(read=lambda: tuple(word))
    r.stream = SimpleNamespace(synchronize=lambda: log.append("sync"))
    r.check_errors = lambda: log.append("check")
    r.ring_slots, r.max_batch, r.record_width, r.keep_history, r._n_requests = 4, 1, 8, False, 0
    r._events = [SimpleNamespace(synchronize=lambda: None)] * 4
    r._ring_host = np.zeros((4, RING_HEADER + 8), np.int32)
    r._ring_host[:, 0] = np.arange(4)
    r._launched, r._collected = 3, 0
    assert r.collect(1) == 1 and log == []  # steps 1 and 2 still queued, no error seen: nothing
    word[0] = 3
    assert r.collect(2) == 1 and log == ["sync", "check"]  # an error seen: the queued steps finish first
    word[0] = 0
    assert r.collect() == 1 and log == ["sync", "check", "check"]  # the last step launched: the full check


@pytest.mark.parametrize("pdl", ["yes", 1, 0.0])
def test_mla_model_refuses_a_pdl_that_is_not_a_bool_or_none_before_the_device(monkeypatch, pdl):
    from driverlevel.demo import mla_model

    def touched(device):
        raise _Touched("the device was touched before pdl was checked")

    monkeypatch.setattr(mla_model, "_check_device_arg", touched)
    with pytest.raises(TypeError, match="pdl must be None, True or False"):
        mla_model.MLAModel(0, pdl=pdl)


def test_mla_model_refuses_pdl_true_below_sm_90_before_the_device_when_arch_is_given(monkeypatch):
    from driverlevel.demo import mla_model

    def touched(device):
        raise _Touched("the device was touched before pdl was checked")

    monkeypatch.setattr(mla_model, "_check_device_arg", touched)
    with pytest.raises(ValueError, match="pdl=True needs sm_90 or newer"):
        mla_model.MLAModel(0, arch="sm_80", pdl=True)
