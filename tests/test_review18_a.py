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


# -- M2: cache entries and directories per the umask; a read failure says it is one ------------------

_SRC = "__global__ void k() {}\n"


@pytest.fixture
def fake_nvrtc(monkeypatch):
    """compile_source without NVRTC's work: every compile returns a tiny stand-in cubin; the list counts them."""
    from driverlevel import _compile

    calls = []

    def compile_(source, name, arch, options, path=None):
        calls.append(name)
        return _compile.Cubin(b"\x7fELF-stand-in", arch, name, ())

    monkeypatch.setattr(_compile, "_nvrtc_compile", compile_)
    return calls


@pytest.fixture
def umask():
    """Set the process umask for the test (``umask(0o022)``); the old one is restored after."""
    import os

    old = os.umask(0o022)
    os.umask(old)
    yield lambda m: os.umask(m)
    os.umask(old)


@pytest.mark.parametrize("mask, file_mode, dir_mode", [(0o022, 0o644, 0o755), (0o002, 0o664, 0o775),
                                                       (0o077, 0o600, 0o700)],
                         ids=["umask022", "umask002", "umask077"])
def test_cache_entries_and_directories_follow_the_umask(tmp_path, monkeypatch, fake_nvrtc, umask, mask, file_mode,
                                                        dir_mode):
    """Entries were made by mkstemp, mode 0600 whatever the umask: another user of the cache could not read them."""
    import stat

    from driverlevel import _compile

    cache = tmp_path / "shared" / "deeper" / "cache"
    monkeypatch.setenv("DRIVERLEVEL_CACHE_DIR", str(cache))
    monkeypatch.delenv("DRIVERLEVEL_CACHE", raising=False)
    _compile._clear_memory_cache()
    umask(mask)
    try:
        _compile.compile_source(_SRC, "mode.cu", "sm_90")
    finally:
        _compile._clear_memory_cache()
    (entry,) = cache.glob("*.cubin")
    assert stat.S_IMODE(entry.stat().st_mode) == file_mode
    for d in (cache, cache.parent, cache.parent.parent):
        assert stat.S_IMODE(d.stat().st_mode) == dir_mode, d
    assert not list(cache.glob(".tmp-*"))  # the temporary file was renamed


def _warm_entry(monkeypatch, tmp_path):
    """A cache in tmp_path/cache holding the entry of _SRC; returns that entry's path."""
    from driverlevel import _compile

    cache = tmp_path / "cache"
    monkeypatch.setenv("DRIVERLEVEL_CACHE_DIR", str(cache))
    monkeypatch.delenv("DRIVERLEVEL_CACHE", raising=False)
    _compile._clear_memory_cache()
    _compile.compile_source(_SRC, "read.cu", "sm_90")
    _compile._clear_memory_cache()  # as a new process: the next compile reads the disk
    (entry,) = cache.glob("*.cubin")
    return entry


def test_an_unreadable_cache_entry_warns_about_reading(tmp_path, monkeypatch, fake_nvrtc):
    """An entry the user may not read (another user's, mode 0600) was a silent miss, and the only warning
    (when the write failed next) talked about writing."""
    import pathlib

    from driverlevel import _compile

    entry = _warm_entry(monkeypatch, tmp_path)
    real = pathlib.Path.read_bytes

    def read_bytes(self):
        if self == entry:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(pathlib.Path, "read_bytes", read_bytes)
    try:
        with pytest.warns(RuntimeWarning) as rec:
            cub = _compile.compile_source(_SRC, "read.cu", "sm_90")
    finally:
        _compile._clear_memory_cache()
    assert [str(w.message) for w in rec] == [
        f"driverlevel: could not read the cubin cache entry {entry}: Permission denied; compiling the kernel again "
        f"(make the entry readable or remove it, set DRIVERLEVEL_CACHE_DIR to a cache of your own, or "
        f"DRIVERLEVEL_CACHE=0)"]
    assert rec[0].filename == __file__  # the caller's line
    assert not cub.cache_hit and fake_nvrtc == ["read.cu", "read.cu"]  # compiled again


def test_an_entry_that_is_a_directory_is_named_as_such(tmp_path, monkeypatch, fake_nvrtc):
    from driverlevel import _compile

    entry = _warm_entry(monkeypatch, tmp_path)
    entry.unlink()
    entry.mkdir()
    try:
        with pytest.warns(RuntimeWarning) as rec:
            _compile.compile_source(_SRC, "read.cu", "sm_90")
    finally:
        _compile._clear_memory_cache()
    texts = [str(w.message) for w in rec]
    assert texts[0].startswith(f"driverlevel: could not read the cubin cache entry {entry}: it is a directory; ")
    assert all("could not read" in t or "could not write" in t for t in texts)  # the rename onto it fails too


def test_a_missing_entry_is_a_quiet_miss(tmp_path, monkeypatch, fake_nvrtc):
    import warnings

    from driverlevel import _compile

    monkeypatch.setenv("DRIVERLEVEL_CACHE_DIR", str(tmp_path / "not-yet"))
    monkeypatch.delenv("DRIVERLEVEL_CACHE", raising=False)
    _compile._clear_memory_cache()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert not _compile.compile_source(_SRC, "miss.cu", "sm_90").cache_hit
    finally:
        _compile._clear_memory_cache()


# -- L7: DRIVERLEVEL_CACHE_DIR: ~ expanded, a relative path made absolute once ----------------------

def test_cache_dir_expands_the_home_directory(tmp_path, monkeypatch):
    from driverlevel._compile import cache_dir

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("DRIVERLEVEL_CACHE", raising=False)
    monkeypatch.setenv("DRIVERLEVEL_CACHE_DIR", f"~/dl-cache-{tmp_path.name}")
    assert cache_dir() == tmp_path / f"dl-cache-{tmp_path.name}"


def test_relative_cache_dir_is_made_absolute_once(tmp_path, monkeypatch):
    """A relative DRIVERLEVEL_CACHE_DIR moved with every os.chdir: one process wrote several caches."""
    from driverlevel._compile import cache_dir

    first, later = tmp_path / "first", tmp_path / "later"
    first.mkdir()
    later.mkdir()
    value = f"rel-cache-{tmp_path.name}/sub"  # a value no other test used: the first call decides
    monkeypatch.delenv("DRIVERLEVEL_CACHE", raising=False)
    monkeypatch.setenv("DRIVERLEVEL_CACHE_DIR", value)
    monkeypatch.chdir(first)
    assert cache_dir() == first / value and cache_dir().is_absolute()
    monkeypatch.chdir(later)
    assert cache_dir() == first / value


def test_cache_dir_is_documented_in_the_readme_and_the_docstring():
    from pathlib import Path

    from driverlevel._compile import cache_dir

    readme = (Path(__file__).parents[1] / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| `DRIVERLEVEL_CACHE_DIR`"))
    assert "`~` is expanded" in row and "made absolute once" in row
    assert "``~`` is expanded" in cache_dir.__doc__ and "made absolute" in cache_dir.__doc__


# -- L8: use_cache is a bool --------------------------------------------------------------------------

@pytest.mark.parametrize("bad", ["no", "False", 0, 1, None, 1.0, [False]])
@pytest.mark.parametrize("via", ["compile_source", "compile_file"])
def test_use_cache_must_be_a_bool(bad, via, fake_nvrtc, fresh_cache, monkeypatch):
    """'no' (truthy) used the cache; every non-bool is refused before anything is read or compiled."""
    from driverlevel import _compile

    def must_not_read(*a, **k):
        raise AssertionError("the cache or the source was read")

    monkeypatch.setattr(_compile, "_read_entry", must_not_read)
    monkeypatch.setattr(_compile, "kernel_sources", must_not_read)
    with pytest.raises(TypeError, match=rf"^use_cache must be a bool, got {type(bad).__name__} "):
        if via == "compile_source":
            _compile.compile_source(_SRC, "u.cu", "sm_90", use_cache=bad)
        else:
            _compile.compile_file("selftest.cu", "sm_90", use_cache=bad)
    assert fake_nvrtc == []


def test_use_cache_takes_numpy_bools(fake_nvrtc, fresh_cache):
    import numpy as np

    from driverlevel import _compile

    assert not _compile.compile_source(_SRC, "np.cu", "sm_90", use_cache=np.False_).cache_hit
    assert not _compile.compile_source(_SRC, "np.cu", "sm_90", use_cache=np.True_).cache_hit  # not cached before
    assert _compile.compile_source(_SRC, "np.cu", "sm_90", use_cache=True).cache_hit
    assert fake_nvrtc == ["np.cu", "np.cu"]


def test_bool_arg():
    import numpy as np

    from driverlevel._checks import bool_arg, is_bool

    assert bool_arg("x", True) is True and bool_arg("x", np.False_) is False
    assert [is_bool(v) for v in (True, np.True_, 1, "yes", None, np.int8(1))] == [True, True, False, False, False,
                                                                                 False]
    with pytest.raises(TypeError, match=r"^flag must be a bool, got str 'no'$"):
        bool_arg("flag", "no")


# -- L1: launch geometry checked before the driver ----------------------------------------------------

def _fake_launch_kernel(monkeypatch):
    """A kernel whose launches must not reach the driver."""
    from driverlevel import _module
    from test_module_args import FakeKernel

    def no_driver(*a, **k):
        raise AssertionError("the driver was called")

    monkeypatch.setattr(_module.driver, "cuLaunchKernel", no_driver)
    monkeypatch.setattr(_module.driver, "cuLaunchKernelEx", no_driver)
    return FakeKernel()  # its reserve_shared records the requests: none may come from a refused launch


@pytest.mark.parametrize("grid, block, shared_mem, exc, words", [
    (0, 32, 0, ValueError, "grid must be 1 to 3 positive ints, got 0"),
    ((4, -1), 32, 0, ValueError, "grid must be 1 to 3 positive ints, got (4, -1)"),
    (1, 0, 0, ValueError, "block must be 1 to 3 positive ints, got 0"),
    ((1, 1, 1, 1), 32, 0, ValueError, "grid must be 1 to 3 positive ints, got 4 dimensions"),
    ((), 32, 0, ValueError, "grid must be 1 to 3 positive ints, got 0 dimensions"),
    (2.0, 32, 0, TypeError, "grid must be an int or a sequence of 1 to 3 ints, got float 2.0"),
    ((4, 2.5), 32, 0, TypeError, "grid must be 1 to 3 positive ints, got float 2.5 in (4, 2.5)"),
    (True, 32, 0, TypeError, "grid must be 1 to 3 positive ints, got bool True"),
    ("4", 32, 0, TypeError, "grid must be an int or a sequence of 1 to 3 ints, got str '4'"),
    (None, 32, 0, TypeError, "grid must be an int or a sequence of 1 to 3 ints, got NoneType None"),
    (2**31, 32, 0, ValueError, "grid dimension x is 2147483648, above CUDA's limit of 2,147,483,647"),
    ((1, 65_536), 32, 0, ValueError, "grid dimension y is 65536, above CUDA's limit of 65,535"),
    ((1, 1, 65_536), 32, 0, ValueError, "grid dimension z is 65536, above CUDA's limit of 65,535"),
    (1, 1025, 0, ValueError, "block dimension x is 1025, above CUDA's limit of 1,024"),
    (1, (1, 1025), 0, ValueError, "block dimension y is 1025, above CUDA's limit of 1,024"),
    (1, (1, 1, 65), 0, ValueError, "block dimension z is 65, above CUDA's limit of 64"),
    (1, (64, 32), 0, ValueError, "block (64, 32, 1) has 2,048 threads, above CUDA's limit of 1,024 per block"),
    (1, (16, 16, 8), 0, ValueError, "block (16, 16, 8) has 2,048 threads"),
    (1, 32, -1, ValueError, "shared_mem must be >= 0 bytes of dynamic shared memory per block, got -1"),
    (1, 32, 1.5, TypeError, "shared_mem must be an int (bytes of dynamic shared memory per block), got float 1.5"),
    (1, 32, "4096", TypeError, "shared_mem must be an int"),
    (1, 32, True, TypeError, "shared_mem must be an int"),
])
def test_bad_launch_geometry_is_refused_before_the_driver(monkeypatch, grid, block, shared_mem, exc, words):
    """These reached cuLaunchKernel (CUDA_ERROR_INVALID_VALUE, naming nothing), or were truncated (2.5 -> 2)."""
    import numpy as np

    from driverlevel._module import PreparedLaunch

    k = _fake_launch_kernel(monkeypatch)
    with pytest.raises(exc) as ei:
        PreparedLaunch(k, grid, block, shared_mem, [np.int32(1)])
    assert words in str(ei.value)
    assert k.shared_requests == []  # refused before the shared-memory opt-in too


@pytest.mark.parametrize("grid, block, shared_mem, want", [
    (2**31 - 1, 1024, 0, ((2**31 - 1, 1, 1), (1024, 1, 1), 0)),
    ((1, 65_535, 65_535), (1, 1024), 0, ((1, 65_535, 65_535), (1, 1024, 1), 0)),
    (1, (16, 1, 64), 0, ((1, 1, 1), (16, 1, 64), 0)),
    ((3, 2), [32, 32], 0, ((3, 2, 1), (32, 32, 1), 0)),
])
def test_launch_geometry_at_the_limits_is_accepted(monkeypatch, grid, block, shared_mem, want):
    import numpy as np

    from driverlevel._module import PreparedLaunch

    p = PreparedLaunch(_fake_launch_kernel(monkeypatch), grid, block, shared_mem, [])
    assert (p.grid, p.block, p.shared_mem) == want
    assert all(type(v) is int for v in p.grid + p.block)
    q = PreparedLaunch(_fake_launch_kernel(monkeypatch), np.int64(7), np.array([32, 2]), np.uint32(0), [])
    assert (q.grid, q.block, q.shared_mem) == ((7, 1, 1), (32, 2, 1), 0) and type(q.shared_mem) is int


def test_kernel_launch_checks_the_geometry_before_the_driver(monkeypatch):
    from driverlevel._module import Kernel

    k = _fake_launch_kernel(monkeypatch)
    k.module.cubin = type("C", (), {"arch": "sm_90"})()
    with pytest.raises(ValueError, match="block dimension z is 65"):
        Kernel.launch(k, object(), 1, (1, 1, 65), [])


# -- L5: bench replay's --replays, --repeats and --nodes have upper bounds -------------------------------

def _no_gpu_check(monkeypatch):
    from driverlevel import _device

    monkeypatch.setattr(_device, "gpu_usable", lambda: pytest.fail("the GPU check came before the options'"))
    monkeypatch.setattr(_device, "require_gpu", lambda: pytest.fail("the GPU check came before the options'"))
    monkeypatch.setattr(_device, "Device", lambda *a: pytest.fail("a device was opened"))


@pytest.mark.parametrize("argv, words", [
    (["--replays", str(10**9)], "--replays must be <= 1,000,000 (calls per variant and repetition), got 1,000,000,000"),
    (["--replays", "1000001"], "--replays must be <= 1,000,000"),
    (["--repeats", "101"], "--repeats must be <= 100, got 101"),
    (["--repeats", str(10**9)], "--repeats must be <= 100, got 1,000,000,000"),
    (["--nodes", "1,10,1001"], "--nodes: kernel counts must be at most 1,000 per graph, got 1,001 in '1,10,1001'"),
    (["--nodes", str(10**9)], "--nodes: kernel counts must be at most 1,000 per graph"),
    # the lower bounds keep their words
    (["--replays", "5"], "--replays must be >= 100 and --repeats >= 1, got 5 and 5"),
])
def test_bench_replay_script_bounds(argv, words, capsys, monkeypatch):
    """10**9 replays or repeats ran for days; 10**9 kernels per graph prepared launches until memory ran out."""
    from test_bench_args import _load

    _no_gpu_check(monkeypatch)
    with pytest.raises(SystemExit) as e:
        _load("bench_replay").main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"bench_replay.py: error: {words}" in err or f"error: {words}" in err, err
    assert err.startswith("usage: ")


@pytest.mark.parametrize("argv, words", [
    (["--replays", str(10**9)], "Invalid value for '--replays': 1000000000 is not in the range 100<=x<=1000000"),
    (["--repeats", "101"], "Invalid value for '--repeats': 101 is not in the range 1<=x<=100"),
    (["--nodes", "1,5000"], "Invalid value for --nodes: kernel counts must be at most 1,000 per graph, got 5,000"),
])
def test_bench_replay_command_bounds(argv, words, monkeypatch):
    from click.testing import CliRunner

    from driverlevel import cli

    _no_gpu_check(monkeypatch)
    r = CliRunner().invoke(cli.main, ["bench", "replay", *argv])
    assert r.exit_code == 2, r.output
    assert words in r.stderr


def test_bench_replay_bounds_at_the_limit_pass_the_checks(monkeypatch):
    """The largest accepted values reach main_from_options (the GPU check), the script's and the command's."""
    from click.testing import CliRunner

    from driverlevel import bench_replay, cli
    from test_bench_args import _load

    seen = []
    monkeypatch.setattr(bench_replay, "main_from_options", lambda *a: seen.append(a[:3]) or 0)
    argv = ["--replays", "1000000", "--repeats", "100", "--nodes", "1,1000"]
    assert _load("bench_replay").main(argv) == 0
    assert CliRunner().invoke(cli.main, ["bench", "replay", *argv]).exit_code == 0
    assert seen == [([1, 1000], 1_000_000, 100)] * 2


@pytest.mark.parametrize("kw, words", [
    (dict(replays=10**9), "replays must be <= 1,000,000"), (dict(repeats=1000), "repeats must be <= 100"),
    (dict(counts=(1, 2000)), "counts: kernel counts must be 1 to 1,000 per graph, got 2,000"),
    (dict(counts=(0,)), "counts: kernel counts must be 1 to 1,000 per graph, got 0"),
])
def test_bench_replay_run_checks_before_the_device(kw, words, monkeypatch):
    from driverlevel import bench_replay

    _no_gpu_check(monkeypatch)
    with pytest.raises(ValueError, match=words):
        bench_replay.run(0, **kw)


# -- L6: tools/code_sections.py checks its output path before compiling -------------------------------

def _code_sections(monkeypatch):
    import importlib.util
    from pathlib import Path

    from driverlevel import _compile

    spec = importlib.util.spec_from_file_location("code_sections_review18",
                                                  Path(__file__).parents[1] / "tools" / "code_sections.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    def refuse(*a, **k):
        raise AssertionError("compiled before the output path was checked")

    monkeypatch.setattr(mod, "hashes", refuse)
    monkeypatch.setattr(_compile, "_nvrtc_compile", refuse)
    return mod


def _code_sections_error(mod, argv, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        mod.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: ")
    return err


def test_code_sections_refuses_a_directory_as_output(tmp_path, monkeypatch, capsys):
    """A directory passed the old check (its parent exists) and failed with IsADirectoryError after the compiles."""
    mod = _code_sections(monkeypatch)
    err = _code_sections_error(mod, [str(tmp_path), "--arch", "sm_90", "--kernel", "selftest.cu"], capsys)
    assert f"error: out: {str(tmp_path)!r} is a directory, not a file" in err
    err = _code_sections_error(mod, [f"{tmp_path}/newdir/"], capsys)
    assert "is a directory, not a file" in err


def test_code_sections_refuses_a_file_as_the_output_directory(tmp_path, monkeypatch, capsys):
    f = tmp_path / "afile"
    f.write_text("x")
    err = _code_sections_error(_code_sections(monkeypatch), [str(f / "out.json")], capsys)
    assert f"error: out: the directory {str(f)!r} is not a directory" in err


def test_code_sections_refuses_an_unwritable_output_directory(tmp_path, monkeypatch, capsys):
    import os

    mod = _code_sections(monkeypatch)
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **k: False if str(p) == str(tmp_path) else real(p, mode, **k))
    err = _code_sections_error(mod, [str(tmp_path / "out.json")], capsys)
    assert f"error: out: the directory {str(tmp_path)!r} is not writable" in err


def test_code_sections_checks_the_output_path_first(tmp_path, monkeypatch, capsys):
    """The output path is the first thing checked: before --arch, --kernel and --compare."""
    err = _code_sections_error(_code_sections(monkeypatch),
                               [str(tmp_path / "no" / "x.json"), "--arch", "sm_999", "--kernel", "nope.cu"], capsys)
    assert f"error: out: the directory {str(tmp_path / 'no')!r} does not exist" in err and "--arch" not in err.split(
        "error:")[1]
    err = _code_sections_error(_code_sections(monkeypatch), ["-"], capsys)
    assert "error: out: '-' (stdout) is not supported" in err
