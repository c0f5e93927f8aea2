"""Shared test set-up: GPU tests are skipped cleanly where no CUDA GPU is usable.

Markers (declared in pyproject.toml):

* ``gpu``      — needs a CUDA GPU and driver; skipped when ``driverlevel.device_count() == 0``.
* ``multigpu`` — needs two or more GPUs.
* ``slow``     — long-running.

``python -m pytest -m gpu`` runs only the GPU tests. The ``device`` fixture is GPU 0
(and skips the test without one), ``stream`` a fresh non-blocking stream on it.

``--reverse-order`` runs the collected tests last to first: a test that only passes after
another one set something up (a module cache, a context, a warm allocator) fails there.
"""

from __future__ import annotations

import pytest

import driverlevel as dl

_gpu_count: int | None = None


def gpu_count() -> int:
    """Visible CUDA devices (0 without a driver); asked once per session."""
    global _gpu_count
    if _gpu_count is None:
        try:
            _gpu_count = dl.device_count()
        except dl.CudaError:  # a driver that fails to initialise counts as none
            _gpu_count = 0
    return _gpu_count


def pytest_addoption(parser):
    parser.addoption("--reverse-order", action="store_true", default=False,
                     help="run the collected tests in reverse order (order-dependence check)")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--reverse-order"):
        items.reverse()
    no_gpu = pytest.mark.skip(reason="needs a CUDA GPU and driver: driverlevel.device_count() == 0")
    one_gpu = pytest.mark.skip(reason="needs two or more CUDA GPUs")
    for item in items:
        if item.get_closest_marker("gpu") is not None and gpu_count() == 0:
            item.add_marker(no_gpu)
        if item.get_closest_marker("multigpu") is not None and gpu_count() < 2:
            item.add_marker(one_gpu)


@pytest.fixture(scope="session")
def device():
    """GPU 0 as a :class:`driverlevel.Device` (skips without a GPU)."""
    if gpu_count() == 0:
        pytest.skip("needs a CUDA GPU and driver")
    return dl.Device(0)


@pytest.fixture
def stream(device):
    """A fresh stream on ``device``; synchronized and destroyed after the test."""
    s = device.create_stream()
    yield s
    try:
        s.synchronize()
    finally:
        s.close()


@pytest.fixture(scope="session")
def selftest_module(device):
    """``cu/selftest.cu`` compiled for ``device`` and loaded on it."""
    from driverlevel import selftest

    return selftest.load(device)


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """An empty on-disk cubin cache in ``tmp_path/cache`` and an empty in-process cache."""
    from driverlevel import _compile

    d = tmp_path / "cache"
    monkeypatch.setenv("DRIVERLEVEL_CACHE_DIR", str(d))
    monkeypatch.delenv("DRIVERLEVEL_CACHE", raising=False)
    _compile._clear_memory_cache()
    yield d
    _compile._clear_memory_cache()


@pytest.fixture
def torch_cuda(device):
    """PyTorch with CUDA on ``device`` (skips without it): the peer and caller of the interop tests."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    torch.cuda.set_device(device.ordinal)
    return torch
