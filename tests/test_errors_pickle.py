"""Every exception class of the package survives pickling (CPU only): its message, arguments, attributes and
notes come back, also when it is raised in a worker of a process pool and re-raised in the parent."""

from __future__ import annotations

import importlib
import inspect
import pickle
import pkgutil

import pytest

import driverlevel

#: One instance of every exception class whose ``__init__`` takes other arguments than a message.
_SAMPLES = {
    "CudaError": lambda c: c("cuMemAlloc", 2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory", "4096 MiB"),
    "DriverUnavailableError": lambda c: c("cuInit", 100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device"),
    "GraphUpdateError": lambda c: c("cuGraphExecUpdate", 910, "CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE",
                                    message="TOPOLOGY_CHANGED: the new graph has 5 nodes, the instantiated one 4"),
    "NvrtcError": lambda c: c("nvrtcCompileProgram", "NVRTC_ERROR_COMPILATION", "k.cu(3): error: x", ["-DX=1"],
                              "sm_90", "k.cu"),
    "MetadataError": lambda c: c("VerifyAttention", 3, "qo_indptr", "not_monotonic", 2),
}


def _exception_classes() -> list[type]:
    """Every exception class defined in a module of the package (found by walking it)."""
    found = {}
    for info in pkgutil.walk_packages(driverlevel.__path__, "driverlevel."):
        if info.name == "driverlevel.__main__":  # runs the command line when imported
            continue
        mod = importlib.import_module(info.name)
        for obj in vars(mod).values():
            if (inspect.isclass(obj) and issubclass(obj, BaseException)
                    and obj.__module__.startswith("driverlevel.")):
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    return [found[k] for k in sorted(found)]


def _sample(cls):
    if cls.__name__ in _SAMPLES:
        return _SAMPLES[cls.__name__](cls)
    own = [k.__name__ for k in cls.__mro__ if k.__module__.startswith("driverlevel") and "__init__" in vars(k)]
    assert not own, (f"{cls.__name__} has {own[0]}'s __init__: add an instance to _SAMPLES so that its pickling "
                     f"is tested")
    return cls("something went wrong: details")


def test_the_walk_finds_the_exception_classes():
    names = {c.__name__ for c in _exception_classes()}
    assert {"CudaError", "DriverUnavailableError", "NvrtcError", "CaptureError", "GraphUpdateError",
            "PoolExhaustedError", "MetadataError", "UnsupportedTargetError"} <= names


@pytest.mark.parametrize("cls", _exception_classes(), ids=lambda c: c.__name__)
def test_every_exception_round_trips_through_pickle(cls):
    exc = _sample(cls)
    exc.add_note("a note added on the way up")
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        back = pickle.loads(pickle.dumps(exc, protocol))
        assert type(back) is cls
        assert str(back) == str(exc) and back.args == exc.args
        assert vars(back) == vars(exc)  # call, code, name, log, options, request, field, __notes__ ...


def test_cuda_error_attributes_after_pickling():
    from driverlevel import CudaError

    back = pickle.loads(pickle.dumps(_SAMPLES["CudaError"](CudaError)))
    assert (back.call, back.code, back.name, back.description) == ("cuMemAlloc", 2, "CUDA_ERROR_OUT_OF_MEMORY",
                                                                     "out of memory")
    assert str(back) == "cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY (2): out of memory [4096 MiB]"


def _raise_metadata_error(request):
    raise driverlevel.MetadataError("VerifyAttention", request, "kv_indices", "out_of_range", 1)


def test_an_error_raised_in_a_process_pool_reaches_the_parent():
    """Unpickling it in the parent raised TypeError: the pool broke (BrokenProcessPool) instead."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("fork")) as pool:
        fut = pool.submit(_raise_metadata_error, 7)
        with pytest.raises(driverlevel.MetadataError) as ei:
            fut.result(timeout=60)
    assert (ei.value.request, ei.value.field, ei.value.code) == (7, "kv_indices", "out_of_range")
    assert str(ei.value).startswith("VerifyAttention: request 7: kv_indices is out of range")
