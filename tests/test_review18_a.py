"""Defects of the eighteenth user review (no GPU): pickled exceptions, sm_90a cubins on CC 9.0, the
cubin cache's file modes and directory, launch geometry, benchmark bounds, tool output paths,
``use_cache`` and architecture names."""

from __future__ import annotations

import importlib
import inspect
import pickle
import pkgutil

import pytest

import driverlevel

# -- H1: every exception class of the package survives pickling ---------------------------------

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
    assert not own, f"{cls.__name__} has {own[0]}'s __init__: add an instance to _SAMPLES so that its pickling is tested"
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


# -- H2: an sm_XXa cubin loads on exactly CC XX; sm_XXf on its family; L8: architecture names in any case ----

@pytest.mark.parametrize("cubin_arch, device_arch", [
    ("sm_90a", "sm_90"), ("sm_90", "sm_90"), ("sm_100a", "sm_100"), ("sm_120a", "sm_120"),
    ("sm_100f", "sm_100"), ("sm_100f", "sm_103"), ("sm_120f", "sm_121"), ("sm_103f", "sm_103"),
    ("SM_90A", "sm_90"), ("Sm_120a", "SM_120"), ("sm_100F", "sm_103"), (" sm_90 ", "sm_90"),
])
def test_cubin_arch_that_runs_on_the_device_is_accepted(cubin_arch, device_arch):
    from driverlevel._compile import check_cubin_arch

    assert check_cubin_arch(cubin_arch, device_arch) is None


@pytest.mark.parametrize("cubin_arch, device_arch, words", [
    ("sm_90a", "sm_100", "sm_90a, an architecture-specific target that runs only on compute capability 9.0, but the "
     "device is sm_100 (compute capability 10.0): compile for sm_100"),
    ("sm_100a", "sm_103", "runs only on compute capability 10.0, but the device is sm_103"),
    ("sm_90a", "sm_89", "runs only on compute capability 9.0"),
    ("sm_103f", "sm_100", "sm_103f, a family-specific target that runs on compute capability 10.x with x >= 3, but "
     "the device is sm_100 (compute capability 10.0)"),
    ("sm_100f", "sm_110", "compute capability 10.x with x >= 0, but the device is sm_110"),
    ("sm_120f", "sm_100", "the device is sm_100"),
    ("sm_80", "sm_86", "cubin was compiled for sm_80 but the device is sm_86: compile for sm_86"),
    ("sm_90", "sm_100", "cubin was compiled for sm_90 but the device is sm_100"),
    ("compute_90", "sm_90", "'compute_90' is no real target"),
])
def test_cubin_arch_that_does_not_run_on_the_device_is_refused(cubin_arch, device_arch, words):
    from driverlevel._compile import check_cubin_arch

    with pytest.raises(ValueError) as ei:
        check_cubin_arch(cubin_arch, device_arch)
    assert words in str(ei.value)


class _FakeGpu:
    ordinal = 0

    def __init__(self, arch):
        self.arch = arch

    def __repr__(self):
        return f"<Device 0: fake ({self.arch})>"


def _fake_load(monkeypatch, arch):
    """load_module against a stand-in device of ``arch``; returns the list the stand-in loader fills."""
    from driverlevel import _device, _module

    loaded = []
    monkeypatch.setattr(_device, "_check_device_arg", lambda d: d)
    monkeypatch.setattr(_module.Module, "_load", classmethod(lambda cls, dev, cub: loaded.append(cub.arch) or "mod"))
    return _FakeGpu(arch), loaded


def test_load_module_takes_an_sm_90a_cubin_on_compute_capability_9_0(monkeypatch):
    """load_module compared cubin.arch with device.arch as strings: 'sm_90a' != 'sm_90', refused."""
    from driverlevel._compile import Cubin
    from driverlevel._module import load_module

    dev, loaded = _fake_load(monkeypatch, "sm_90")
    assert load_module(dev, Cubin(b"\x7fELF", "sm_90a", "k.cu", ())) == "mod"
    assert loaded == ["sm_90a"]


def test_load_module_refuses_an_sm_90a_cubin_elsewhere_before_the_driver(monkeypatch):
    from driverlevel._compile import Cubin
    from driverlevel._module import load_module

    dev, loaded = _fake_load(monkeypatch, "sm_100")
    with pytest.raises(ValueError, match=r"<Device 0: fake \(sm_100\)>: cubin was compiled for sm_90a, an "
                                         r"architecture-specific target that runs only on compute capability 9\.0"):
        load_module(dev, Cubin(b"\x7fELF", "sm_90a", "k.cu", ()))
    assert loaded == []


@pytest.mark.parametrize("given, normalized", [("SM_90", "sm_90"), ("Sm_120a", "sm_120a"), ("sm_90A", "sm_90a"),
                                               (" 90 ", "sm_90")])
def test_architecture_names_are_case_insensitive(given, normalized):
    from driverlevel._compile import check_arch, normalize_arch, shared_limit

    assert normalize_arch(given) == normalized
    assert shared_limit(given) == shared_limit(normalized.rstrip("a"))
    if not normalized.endswith("a"):
        assert check_arch(given) == normalized
    else:  # refused as the lower-case name is, with the same reason
        with pytest.raises(ValueError, match="is an architecture-specific target") as upper:
            check_arch(given)
        with pytest.raises(ValueError) as lower:
            check_arch(normalized)
        assert str(upper.value).replace(repr(given.strip()), repr(normalized)) == str(lower.value)


def test_arch_text_is_the_one_normalisation():
    from driverlevel._compile import _arch_text

    assert [_arch_text(s) for s in ("SM_90", " Sm_120A ", "90", "compute_90")] == ["sm_90", "sm_120a", "sm_90",
                                                                                    "compute_90"]


@pytest.mark.parametrize("script, argv", [("bench_attention", ["--tile", "SM_120", "--json", "/nonexistent-dir/x"]),
                                          ("profile_tile", ["--tile", "SM_120", "--heads", "0"])])
def test_benchmark_tile_names_are_case_insensitive(script, argv, capsys):
    """'--tile SM_120' was an invalid choice; now the option passes and the next check speaks."""
    from test_bench_args import _load

    with pytest.raises(SystemExit) as e:
        _load(script).main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice" not in err and ("--json:" in err or "--heads must be" in err), err


def test_bench_tiles_named_spec_in_any_case():
    from test_bench_args import _load

    mod = _load("bench_tiles")
    assert mod.parse_tile("a=SM_120")[1] == mod.parse_tile("a=sm_120")[1]
    assert mod.parse_tile("a=Native")[1] is None
