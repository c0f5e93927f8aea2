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
