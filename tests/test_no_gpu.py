"""Every example, benchmark and GPU command run without a GPU: exit status 2 and one sentence (CPU only).

Each runs in a fresh interpreter with ``CUDA_VISIBLE_DEVICES=""``, so no GPU is usable
there even on a GPU machine. The sentence is :data:`driverlevel._device.NO_GPU_MESSAGE`,
printed once on stderr by :func:`driverlevel._device.require_gpu` (or, in click commands,
beside it); stdout stays empty and no traceback appears.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from driverlevel import _device

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = sorted(str(p.relative_to(REPO)) for p in [*REPO.glob("examples/*.py"), *REPO.glob("benchmarks/*.py")])
COMMANDS = [
    ["-m", "driverlevel", "capture-demo"],
    ["-m", "driverlevel", "capture-demo", "--devices", "0,0"],
    ["-m", "driverlevel", "bench", "replay"],
    ["-m", "driverlevel.demo.capture_demo"],
    ["-m", "driverlevel.demo.multi_device"],
]


def _run_without_gpu(args):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]))
    return subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_there_is_something_to_run():
    assert any(s.startswith("examples/") for s in SCRIPTS) and any(s.startswith("benchmarks/") for s in SCRIPTS)
    assert "examples/multi_gpu.py" in SCRIPTS


@pytest.mark.parametrize("args", [[s] for s in SCRIPTS] + COMMANDS, ids=lambda a: " ".join(a))
def test_exits_2_with_the_one_sentence(args):
    r = _run_without_gpu(args)
    assert (r.returncode, r.stdout, r.stderr) == (2, "", _device.NO_GPU_MESSAGE + "\n")


def test_the_sentence_is_one_sentence():
    msg = _device.NO_GPU_MESSAGE
    assert msg.count(".") == 1 and msg.endswith(".") and "\n" not in msg


def test_require_gpu(monkeypatch, capsys):
    monkeypatch.setattr(_device, "device_count", lambda: 0)
    with pytest.raises(SystemExit) as exc:
        _device.require_gpu()
    assert exc.value.code == 2
    assert capsys.readouterr().err == _device.NO_GPU_MESSAGE + "\n"

    def broken():
        raise _device.CudaError("cuInit", 803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", "driver/library version mismatch")

    monkeypatch.setattr(_device, "device_count", broken)
    assert _device.gpu_usable() is False
    monkeypatch.setattr(_device, "device_count", lambda: 1)
    assert _device.gpu_usable() is True
    _device.require_gpu()  # returns


def test_the_readme_quotes_the_sentence():
    assert _device.NO_GPU_MESSAGE in (REPO / "README.md").read_text()


def test_capture_of_something_that_is_not_a_stream_is_a_type_error():
    import driverlevel as dl

    for bad in (None, 0, "stream"):
        with pytest.raises(TypeError, match="capture needs a driverlevel Stream"):
            with dl.capture(bad):
                pass


def _driver_must_not_be_touched():
    pytest.fail("the driver was touched for bad input")


@pytest.mark.parametrize("bad", [-1, -7])
def test_device_negative_ordinal_is_value_error_before_the_driver(monkeypatch, bad):
    import numpy as np

    import driverlevel as dl

    monkeypatch.setattr(_device, "init_driver", _driver_must_not_be_touched)
    for ordinal in (bad, np.int64(bad)):
        with pytest.raises(ValueError, match=f"device ordinal {bad} out of range"):
            dl.Device(ordinal)
    for ordinal in (1.0, "0", True, None):
        with pytest.raises(TypeError, match="Device ordinal must be an int"):
            dl.Device(ordinal)


def test_device_accepts_numpy_integers(monkeypatch):
    import numpy as np

    import driverlevel as dl

    sentinel = object()
    monkeypatch.setattr(_device.Device, "_instances", {0: sentinel})
    for ordinal in (np.int64(0), np.int32(0), np.uint8(0)):
        assert dl.Device(ordinal) is sentinel


def test_no_driver_library_message(monkeypatch):
    """A driver library that cannot be loaded is said plainly, without quoting a CUresult no driver call returned;
    code and name stay for callers that test them."""
    from types import SimpleNamespace

    def cannot_load(_flags):
        raise RuntimeError('"cuda" is an NVIDIA driver library and can only be found via system search')

    monkeypatch.setattr(_device, "driver", SimpleNamespace(cuInit=cannot_load, CUresult=_device.driver.CUresult))
    monkeypatch.setattr(_device, "_initialized", False)
    with pytest.raises(_device.DriverUnavailableError) as ei:
        _device.init_driver()
    msg = str(ei.value)
    assert msg.startswith("the NVIDIA driver library (libcuda) could not be loaded: no NVIDIA driver is installed, "
                          "or it is not on the library search path")
    assert "found via system search" in msg  # the loader's own words, as detail
    assert "CUDA_ERROR_NO_DEVICE" not in msg and "(100)" not in msg and "driverlevel's" not in msg
    assert (ei.value.code, ei.value.name) == (100, "CUDA_ERROR_NO_DEVICE")
    assert _device.device_count() == 0  # still "no GPU" to device_count


EXAMPLES = [s for s in SCRIPTS if s.startswith("examples/")]


@pytest.mark.parametrize("script", EXAMPLES)
def test_example_help_needs_no_gpu(script):
    """--help printed the no-GPU sentence instead of the help (review 16 #9); the help is the docstring."""
    r = _run_without_gpu([script, "--help"])
    assert r.returncode == 0 and r.stderr == ""
    assert r.stdout.strip() and _device.NO_GPU_MESSAGE not in r.stdout


@pytest.mark.parametrize("script", EXAMPLES)
def test_example_without_arguments_refuses_one(script):
    """multi_gpu.py included since review 17 L11 (it called --bogus a GPU ordinal)."""
    r = _run_without_gpu([script, "--bogus"])
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr.startswith("usage: ") and "unrecognized arguments: --bogus" in r.stderr


@pytest.mark.parametrize("argv, words", [
    (["0,1", "extra"], "unrecognized arguments: extra"),  # was ignored
    (["0,,1"], "empty GPU ordinal in '0,,1': give ordinals separated by single commas, e.g. 0,1"),
    (["-1"], "GPU ordinal '-1' is not a non-negative integer"),
])
def test_multi_gpu_example_is_on_argparse(argv, words, capsys, monkeypatch):
    """Review 17 L11: examples/multi_gpu.py read sys.argv by hand: an extra argument was ignored."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("multi_gpu_example", REPO / "examples" / "multi_gpu.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "require_gpu", lambda: pytest.fail("the GPU check came before the arguments'"))
    with pytest.raises(SystemExit) as e:
        mod.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: ") and err.endswith(f"error: {words}\n"), err
    assert mod.parse_args([]) == [0, 0] and mod.parse_args(["0,1"]) == [0, 1]
