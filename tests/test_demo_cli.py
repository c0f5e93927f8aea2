"""``driverlevel capture-demo`` on the CPU: option parsing, the no-GPU sentence and exit
status 2, and the ``--json`` schema."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from driverlevel import _device, cli
from driverlevel.demo import capture_demo as demo_cli
from driverlevel.demo.capture_demo import JSON_SCHEMA, NO_GPU_MESSAGE, DemoReport, check_schema


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(_device, "device_count", lambda: 0)


def invoke(*args):
    return CliRunner().invoke(cli.main, ["capture-demo", *args])


def test_help_lists_every_option():
    r = invoke("--help")
    assert r.exit_code == 0, r.output
    for opt in ("--heads", "--prompt-len", "--budget", "--batch", "--steps", "--num-splits", "--arch", "--seed",
                "--vocab", "--json", "--max-new-tokens", "--depth-limit", "--draft-noise", "DDTree", "graph"):
        assert opt in r.output, opt
    assert "[default: 9" in r.output  # --heads


def test_the_real_demo_replaces_the_placeholder():
    assert cli.main.commands["capture-demo"] is demo_cli.capture_demo


def test_no_gpu_prints_one_sentence_and_exits_2(no_gpu):
    r = invoke()
    assert r.exit_code == 2
    assert r.output.strip() == NO_GPU_MESSAGE
    assert "Traceback" not in r.output
    assert NO_GPU_MESSAGE.count(".") == 1 and NO_GPU_MESSAGE.endswith(".")


def test_no_gpu_through_run_returns_2(no_gpu, capsys):
    assert demo_cli.run([]) == 2
    err = capsys.readouterr().err
    assert err.strip() == NO_GPU_MESSAGE


def test_no_gpu_with_json_prints_an_error_object(no_gpu, capsys):
    assert demo_cli.run(["--json", "--batch", "2"]) == 2
    cap = capsys.readouterr()
    obj = json.loads(cap.out)
    assert obj == {"error": NO_GPU_MESSAGE, "exit_status": 2}
    assert cap.err.strip() == NO_GPU_MESSAGE


@pytest.mark.parametrize("args, hint", [
    (["--heads", "0"], "--heads"),
    (["--heads", "x"], "--heads"),
    (["--budget", "513"], "--budget"),
    (["--batch", "0"], "--batch"),
    (["--vocab", "1001"], "--vocab"),
    (["--arch", "sm_70"], "--arch"),
    (["--arch", "sm_90a"], "--arch"),
    (["--num-splits", "0"], "--num-splits"),
    (["--steps", "0"], "--steps"),
    (["--prompt-len", "1"], "--prompt-len"),
    (["--draft-noise", "-1"], "--draft-noise"),
    (["--draft-noise", "nan"], "--draft-noise"),
    (["--draft-scale", "inf"], "--draft-scale"),
    (["--no-such-option"], "--no-such-option"),
])
def test_bad_options_are_usage_errors(args, hint):
    r = invoke(*args)
    assert r.exit_code == 2, r.output
    assert hint in r.output and "Traceback" not in r.output


@pytest.mark.parametrize("args, named", [
    (["--steps", "5"], ["--steps"]),
    (["--num-splits", "4", "--draft-scale", "2"], ["--num-splits", "--draft-scale"]),
    (["--arch", "sm_90"], ["--arch"]),
    (["--draft-noise", "1.0"], ["--draft-noise"]),  # given, even if equal to the default
])
def test_options_the_ranks_do_not_take_are_refused_with_several_devices(no_gpu, args, named):
    r = invoke("--devices", "0,0", *args)
    assert r.exit_code == 2, r.output
    assert all(n in r.output for n in named) and "several --devices" in r.output and "Traceback" not in r.output


def test_rank_options_with_several_devices_reach_the_gpu_check(no_gpu):
    r = invoke("--devices", "0,0", "--batch", "2", "--budget", "8", "--seed", "1", "--json")
    assert r.exit_code == 2 and NO_GPU_MESSAGE in r.output


def test_a_repeated_devices_option_takes_every_value():
    """``--devices 0 --devices 1`` is ``0,1`` (the last one alone was kept, silently; a fresh-user trial's
    finding): two ranks, so an option the ranks do not take is refused naming several --devices."""
    r = invoke("--devices", "0", "--devices", "0", "--steps", "5")
    assert r.exit_code == 2 and "several --devices" in r.output and "--steps" in r.output, r.output
    r = invoke("--devices", "0", "--devices", "0,")
    assert r.exit_code == 2 and "--devices" in r.output and "Traceback" not in r.output


@pytest.mark.parametrize("devices", ["0", "0,0"])
def test_vocab_and_budget_past_the_merge_rule_are_refused_before_the_gpu_check(monkeypatch, devices):
    """Review 17 L3: capture-demo --vocab 1048576 --budget 512 reached the GPU check (and, on a GPU, built the
    model before the runner refused it); bench_step checks the rule first, with these words."""
    monkeypatch.setattr(demo_cli, "gpu_usable", lambda: pytest.fail("the GPU check came before the merge rule"))
    r = invoke("--vocab", "1048576", "--budget", "512", "--devices", devices)
    assert r.exit_code == 2, r.output
    assert ("Error: --vocab 1048576 with --budget 512: vocab=1048576 at K=512 needs 137 chunks x 512 candidates per "
            "row, more than the row merge's 12288: lower the budget\n") in r.output
    assert "Traceback" not in r.output
    monkeypatch.setattr(demo_cli, "gpu_usable", lambda: False)
    r = invoke("--vocab", "1048576", "--budget", "64", "--devices", devices)  # 137 x 64 fits: on to the GPU check
    assert r.exit_code == 2 and NO_GPU_MESSAGE in r.output


def test_bad_options_through_run(capsys):
    assert demo_cli.run(["--vocab", "1001"]) == 2
    assert "--vocab" in capsys.readouterr().err


def test_good_options_parse_before_the_gpu_check(no_gpu):
    r = invoke("--heads", "16", "--prompt-len", "1024", "--budget", "64", "--batch", "1", "--steps", "10",
               "--num-splits", "8", "--arch", "sm_90", "--seed", "3", "--vocab", "65536", "--json")
    assert r.exit_code == 2  # parsed fine, then no GPU


def _filled(schema):
    out = {}
    for k, t in schema.items():
        if isinstance(t, dict):
            out[k] = _filled(t)
        else:
            out[k] = {int: 1, float: 1.5, bool: True, str: "x", list: []}[t]
    return out


def test_json_schema_matches_the_report():
    rep = DemoReport(**_filled(JSON_SCHEMA))
    obj = json.loads(json.dumps(rep.to_json()))
    check_schema(obj)
    assert set(obj) == set(JSON_SCHEMA)


@pytest.mark.parametrize("mutate, msg", [
    (lambda o: o.pop("lossless"), "missing key lossless"),
    (lambda o: o["ddtree"].pop("p99_us"), "missing key ddtree.p99_us"),
    (lambda o: o.__setitem__("speedup", "fast"), "speedup must be a number"),
    (lambda o: o["config"].__setitem__("batch", 8.0), "config.batch must be an int"),
    (lambda o: o.__setitem__("eager_equals_graph", 1), "eager_equals_graph must be bool"),
])
def test_check_schema_names_the_problem(mutate, msg):
    obj = _filled(JSON_SCHEMA)
    mutate(obj)
    with pytest.raises(ValueError, match=msg):
        check_schema(obj)


def test_prompts_have_different_lengths():
    import numpy as np

    ps = demo_cli._prompts(np.random.default_rng(0), 8, 512, 1000)
    lens = [len(p) for p in ps]
    assert lens[0] == 512 and min(lens) >= 256 and len(set(lens)) == 8
    assert all(0 <= t < 1000 for p in ps for t in p)
    assert [len(p) for p in demo_cli._prompts(np.random.default_rng(0), 1, 64, 1000)] == [64]


@pytest.mark.parametrize("devices", ["0,,1", "0,", ",0", " , "])
def test_devices_with_an_empty_item_is_a_usage_error(devices):
    r = invoke("--devices", devices)
    assert r.exit_code == 2, r.output
    assert "--devices" in r.output and "Traceback" not in r.output
    assert "empty GPU ordinal" in r.output or "expected a comma-separated list" in r.output


@pytest.fixture
def fake_gpu(monkeypatch):
    monkeypatch.setattr(demo_cli, "gpu_usable", lambda: True)


@pytest.mark.parametrize("devices, target", [("0", "_run_demo"), ("0,0", "_run_ranks")])
def test_a_value_error_during_the_run_is_an_error_not_a_usage_error(fake_gpu, monkeypatch, devices, target):
    def fails(*a, **k):
        raise ValueError("something went wrong during the run")

    monkeypatch.setattr(demo_cli, target, fails)
    r = invoke("--devices", devices)
    assert r.exit_code == 1, r.output
    assert isinstance(r.exception, ValueError) and "during the run" in str(r.exception)
    assert "Usage:" not in r.output


@pytest.mark.parametrize("devices", ["3", "0,3"])
def test_a_bad_ordinal_found_while_building_is_still_a_usage_error(fake_gpu, monkeypatch, devices):
    def device(ordinal):
        if ordinal == 3:
            raise ValueError("device ordinal 3 out of range: 1 device(s) visible")
        return object()  # device 0 of the ranks: checked first, fine

    monkeypatch.setattr(_device, "Device", device)
    r = invoke("--devices", devices)
    assert r.exit_code == 2, r.output
    assert "Usage:" in r.output and "device ordinal 3 out of range" in r.output


def test_a_target_the_nvrtc_lacks_is_an_error_not_a_usage_error(fake_gpu, monkeypatch):
    """The GPU's own architecture missing from the installed NVRTC is the environment's problem:
    exit 1 with the error, not 'Usage:' (the option checks' ValueErrors stay usage errors)."""
    from driverlevel._compile import UnsupportedTargetError

    def device(ordinal):
        raise UnsupportedTargetError("unsupported architecture 'sm_90': NVRTC 99.0 compiles for sm_80")

    monkeypatch.setattr(_device, "Device", device)
    r = invoke("--devices", "0")
    assert r.exit_code == 1, r.output
    assert isinstance(r.exception, UnsupportedTargetError)
    assert "Usage:" not in r.output
