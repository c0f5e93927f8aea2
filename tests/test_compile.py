"""NVRTC compile to cubin (its defines), the ptxas resource report, the on-disk cubin cache (its directory,
file modes and unreadable entries) and the architectures: their names, and which cubin loads on which
device (CPU only).

The cache tests compile a tiny source that includes a header from a temporary
directory, so they do not depend on the kernels in cu/.
"""

from __future__ import annotations

import errno
import json
import os
import struct
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

import driverlevel as dl
from driverlevel import _compile, selftest
from driverlevel._compile import (
    MAX_SHARED_PER_BLOCK,
    SUPPORTED_ARCHS,
    KernelResources,
    cache_dir,
    compile_source,
    kernel_source_dir,
    kernel_sources,
    normalize_arch,
    parse_resource_report,
)
from driverlevel.cli import compile_variants

SELFTEST_KERNELS = {
    "noop", "add_scalar_f32", "saxpy_f32", "saxpy_params", "add_i64", "fill_iota_f32",
    "copy_plus_one_from_device_scalar", "block_sum_f32", "spin_wait_ns", "reverse_f32_dynamic_smem",
}

EM_CUDA = 190


# -- the self-test kernels on every architecture ------------------------------------------
@pytest.mark.parametrize("arch", SUPPORTED_ARCHS)
def test_selftest_compiles_for_arch_with_resource_report(arch, fresh_cache):
    cub = selftest.compile(arch)
    assert not cub.cache_hit
    assert cub.arch == arch
    assert cub.data[:4] == b"\x7fELF"  # a cubin, never PTX
    assert int.from_bytes(cub.data[18:20], "little") == EM_CUDA
    assert set(cub.resources) == SELFTEST_KERNELS
    for name, r in cub.resources.items():
        assert r.registers > 0, name
        assert r.spills == 0 and r.spill_store_bytes == 0 and r.spill_load_bytes == 0, name
        assert r.stack_bytes == 0, name
    assert cub.resources["block_sum_f32"].shared_bytes == 256 * 4
    assert cub.resources["saxpy_f32"].shared_bytes == 0
    assert f"--gpu-architecture={arch}" in cub.options


@pytest.mark.parametrize("arch", SUPPORTED_ARCHS)
def test_every_kernel_source_compiles_without_spills_within_shared_limit(arch):
    """Every .cu in cu/, compiled as its launcher does, fits ``arch`` (the CI gate of DESIGN.md),
    and NVRTC warns about nothing in it."""
    limit = MAX_SHARED_PER_BLOCK[arch]
    for f in kernel_sources():
        for v in compile_variants(f, arch):
            cub = dl.runtime.compile_file(f, v.target or arch, v.defines)
            assert cub.resources, f"{f} [{v.label}] has no kernels"
            warnings = [ln for ln in cub.log.splitlines() if "warning" in ln]
            assert not warnings, f"{f} [{v.label}] on {arch}: {warnings}"
            assert set(v.dynamic_shared) <= set(cub.resources), f"{f} [{v.label}] names kernels it does not have"
            for k, r in cub.resources.items():
                assert r.spills == 0, f"{f} [{v.label}] {k} spills on {arch}: {r}"
                assert r.shared_bytes + v.dynamic_shared.get(k, 0) <= limit, f"{f} [{v.label}] {k} on {arch}"


def test_struct_layout_drift_fails_the_compile(fresh_cache):
    defines = selftest.compile_defines("sm_90")
    defines["DL_OFF_a"] += 4
    with pytest.raises(dl.NvrtcError) as ei:
        dl.runtime.compile_file("selftest.cu", "sm_90", defines)
    assert "SaxpyParams.a offset differs from its ctypes mirror" in ei.value.log


def test_kernel_sources_are_found():
    d = kernel_source_dir()
    assert (d / "common.cuh").is_file()
    names = kernel_sources()
    assert "selftest.cu" in names and "verify_attention.cu" in names
    assert all(n.endswith(".cu") for n in names)
    with pytest.raises(FileNotFoundError, match="no kernel source 'nope.cu'"):
        dl.runtime.compile_file("nope.cu", "sm_90")


@pytest.mark.parametrize("given, want", [("sm_90", "sm_90"), ("90", "sm_90"), (120, "sm_120"), ((8, 6), "sm_86"),
                                         (" SM_100 ", "sm_100"), ("sm_90a", "sm_90a")])
def test_normalize_arch(given, want):
    assert normalize_arch(given) == want


@pytest.mark.parametrize("given, want", [("sm_90", 90), ("sm_90a", 90), ("120", 120), ((8, 6), 86), ("sm_100", 100)])
def test_arch_number(given, want):
    assert _compile.arch_number(given) == want


@pytest.mark.parametrize("bad", ["sm_75", "compute_90", "hopper", "sm_", 70, (9,), (9, 0, 1), (), "sm_100f",
                                 "sm_\uff11\uff12\uff10", "\u0669\u0660"])  # (review 39: full-width / Arabic-Indic digits)
def test_normalize_arch_rejects(bad):
    with pytest.raises(ValueError, match="unsupported architecture"):
        normalize_arch(bad)


@pytest.mark.parametrize("bad", [True, False, np.bool_(True), None, 90.0, b"sm_90", ["sm_90"]])
def test_normalize_arch_refuses_what_is_no_architecture_type(bad):
    """A bool was a ValueError ("unsupported architecture True"), as if a number; every other
    argument of the package refuses bools with a TypeError."""
    with pytest.raises(TypeError, match="arch must be a str such as 'sm_90', an int, a"):
        normalize_arch(bad)


def test_normalize_arch_message_lists_every_known_architecture():
    """The message listed SUPPORTED_ARCHS (sm_87, sm_103 and sm_121 missing), where the CLI lists
    every architecture whose shared-memory limit is known."""
    with pytest.raises(ValueError) as ei:
        normalize_arch("sm_75")
    assert all(a in str(ei.value) for a in _compile.MAX_SHARED_PER_BLOCK)


def test_normalize_arch_message_matches_behaviour():
    """The message names what normalize_arch accepts: sm_90a passes, so it may not say suffixes are refused
    outright; it names the refused kinds (compute_XX, the family target sm_100f)."""
    assert normalize_arch("sm_90a") == "sm_90a"
    with pytest.raises(ValueError) as ei:
        normalize_arch("sm_100f")
    msg = str(ei.value)
    assert "sm_90a" in msg and "sm_100f" in msg and "compute_XX" in msg
    with pytest.raises(ValueError, match=r"\(major, minor\)"):
        normalize_arch((9,))


def test_tile_config_short_tuple_is_value_error():
    from driverlevel.verify_attention import tile_config

    with pytest.raises(ValueError, match="unsupported architecture"):
        tile_config((9,))


@pytest.mark.parametrize("arch", ["sm_999", "sm_89a", 999])
def test_compile_source_unsupported_arch_is_value_error(arch, monkeypatch):
    """An architecture the NVRTC in use does not know is a ValueError naming the supported ones (the
    docstring's promise), found before NVRTC is asked (which would say NVRTC_ERROR_INVALID_OPTION)."""
    monkeypatch.setattr(_compile, "_nvrtc_compile", lambda *a: pytest.fail("NVRTC called for a bad arch"))
    with pytest.raises(ValueError, match="unsupported architecture") as ei:
        compile_source("__global__ void k() {}", "k.cu", arch, use_cache=False)
    assert "sm_90" in str(ei.value) and "sm_120" in str(ei.value)



def test_nvrtc_version():
    major, minor = dl.runtime.nvrtc_version()
    assert major >= 13 and minor >= 0


# -- resource report parsing -----------------------------------------------------------------
def test_parse_resource_report_with_spills_and_smem():
    log = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'big' for 'sm_90'
ptxas info    : Function properties for big
ptxas         .     24 bytes stack frame, 40 bytes spill stores, 36 bytes spill loads
ptxas info    : Used 255 registers, used 16 barriers, 12288 bytes smem, 400 bytes cmem[0]
ptxas info    : Compile time = 12.000 ms
ptxas info    : Compiling entry function 'small' for 'sm_90'
ptxas info    : Function properties for small
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, used 0 barriers
"""
    r = parse_resource_report(log)
    assert r["big"] == KernelResources(registers=255, shared_bytes=12288, stack_bytes=24,
                                       spill_store_bytes=40, spill_load_bytes=36)
    assert r["big"].spills == 76
    assert r["small"] == KernelResources(registers=8)


# -- compile errors --------------------------------------------------------------------------
def test_compile_error_raises_nvrtc_error_with_log(fresh_cache):
    src = 'extern "C" __global__ void broken(float* x) { x[0] = undefined_symbol; }\n'
    with pytest.raises(dl.NvrtcError) as ei:
        compile_source(src, "broken.cu", "sm_90")
    e = ei.value
    assert e.call == "nvrtcCompileProgram"
    assert e.name == "NVRTC_ERROR_COMPILATION"
    assert "undefined_symbol" in e.log
    assert e.arch == "sm_90" and e.source_name == "broken.cu"
    assert "--gpu-architecture=sm_90" in e.options
    text = str(e)
    assert "while compiling broken.cu for sm_90" in text and "--- NVRTC log ---" in text and "undefined_symbol" in text
    assert _entries(fresh_cache) == []


# -- the cubin cache ---------------------------------------------------------------------------
SRC = '#include "dl_test_header.cuh"\nextern "C" __global__ void scale(float* x) { x[threadIdx.x] *= SCALE; }\n'


@pytest.fixture
def header_dir(tmp_path):
    d = tmp_path / "inc"
    d.mkdir()
    (d / "dl_test_header.cuh").write_text("#pragma once\n#define SCALE 2.0f\n")
    return d


@pytest.fixture
def count_compiles(monkeypatch):
    calls = []
    real = _compile._nvrtc_compile

    def counting(*a, **k):
        calls.append(a[1])
        return real(*a, **k)

    monkeypatch.setattr(_compile, "_nvrtc_compile", counting)
    return calls


def _compile_t(header_dir, **kw):
    kw.setdefault("arch", "sm_90")
    return compile_source(SRC, "t.cu", include_dirs=[header_dir], **kw)


def _entries(d: Path):
    return sorted(d.glob("*.cubin")) if d.exists() else []


def test_cache_miss_then_disk_hit_then_memory_hit(fresh_cache, header_dir, count_compiles):
    a = _compile_t(header_dir)
    assert not a.cache_hit and count_compiles == ["t.cu"]
    (entry,) = _entries(fresh_cache)
    assert entry.name == f"{a.key}.cubin"
    b = _compile_t(header_dir)  # in-process cache
    assert b.cache_hit and b.data == a.data
    _compile._clear_memory_cache()  # as a new process would
    c = _compile_t(header_dir)
    assert c.cache_hit and c.data == a.data and c.resources == a.resources and c.key == a.key
    assert count_compiles == ["t.cu"]
    assert not list(fresh_cache.glob(".tmp-*"))  # atomic writes leave no temporaries


def test_header_change_invalidates(fresh_cache, header_dir, count_compiles):
    a = _compile_t(header_dir)
    (header_dir / "dl_test_header.cuh").write_text("#pragma once\n#define SCALE 3.0f\n")
    b = _compile_t(header_dir)
    assert not b.cache_hit and b.key != a.key and len(count_compiles) == 2
    assert len(_entries(fresh_cache)) == 2


def test_nested_header_change_invalidates(fresh_cache, header_dir, count_compiles):
    (header_dir / "dl_test_header.cuh").write_text('#pragma once\n#include "dl_inner.cuh"\n')
    (header_dir / "dl_inner.cuh").write_text("#pragma once\n#define SCALE 2.0f\n")
    a = _compile_t(header_dir)
    (header_dir / "dl_inner.cuh").write_text("#pragma once\n#define SCALE 5.0f\n")
    b = _compile_t(header_dir)
    assert b.key != a.key and not b.cache_hit


def test_header_in_a_subfolder_including_its_sibling_invalidates(fresh_cache, header_dir, count_compiles):
    """``sub/a.cuh`` including ``"b.cuh"`` finds ``sub/b.cuh`` (NVRTC searches the including file's
    folder first, as cu/ddtree.cu's stage headers do): the sibling is part of the key."""
    (header_dir / "sub").mkdir()
    (header_dir / "dl_test_header.cuh").write_text('#pragma once\n#include "sub/a.cuh"\n')
    (header_dir / "sub" / "a.cuh").write_text('#pragma once\n#include "b.cuh"\n')
    (header_dir / "sub" / "b.cuh").write_text("#pragma once\n#define SCALE 2.0f\n")
    a = _compile_t(header_dir)
    assert set(_compile._local_headers(SRC, [header_dir])) == {"dl_test_header.cuh", "sub/a.cuh", "sub/b.cuh"}
    (header_dir / "sub" / "b.cuh").write_text("#pragma once\n#define SCALE 5.0f\n")
    b = _compile_t(header_dir)
    assert b.key != a.key and not b.cache_hit and len(count_compiles) == 2


@pytest.mark.parametrize("change", [
    {"defines": {"EXTRA": 1}},
    {"extra_options": ["-lineinfo"]},
    {"arch": "sm_120"},
])
def test_option_define_or_arch_change_invalidates(fresh_cache, header_dir, count_compiles, change):
    a = _compile_t(header_dir)
    b = _compile_t(header_dir, **change)
    assert not b.cache_hit and b.key != a.key and len(count_compiles) == 2
    c = _compile_t(header_dir, **change)
    assert c.cache_hit and c.key == b.key


def test_define_value_change_invalidates(fresh_cache, header_dir):
    a = _compile_t(header_dir, defines={"X": 1})
    b = _compile_t(header_dir, defines={"X": 2})
    assert a.key != b.key and not b.cache_hit


def test_nvrtc_version_is_part_of_the_key(fresh_cache, header_dir, monkeypatch):
    a = _compile_t(header_dir)
    monkeypatch.setattr(_compile, "nvrtc_version", lambda: (13, 99))
    b = _compile_t(header_dir)
    assert b.key != a.key and not b.cache_hit


def _corrupt_truncate(p: Path):
    blob = p.read_bytes()
    p.write_bytes(blob[: len(blob) // 2])


def _corrupt_flip_cubin_bit(p: Path):
    blob = bytearray(p.read_bytes())
    blob[-100] ^= 0x10
    p.write_bytes(bytes(blob))


def _corrupt_flip_header_bit(p: Path):
    blob = bytearray(p.read_bytes())
    blob[20] ^= 0x01
    p.write_bytes(bytes(blob))


def _corrupt_magic(p: Path):
    blob = bytearray(p.read_bytes())
    blob[0] ^= 0xFF
    p.write_bytes(bytes(blob))


def _corrupt_empty(p: Path):
    p.write_bytes(b"")


def _rewrite_header(p: Path, change):
    """The entry with its JSON header replaced by ``change(header)`` (well-formed JSON, the right key
    and cubin checksum: a crafted entry, not a damaged one)."""
    blob = p.read_bytes()
    (hlen,) = struct.unpack_from("<Q", blob, 8)
    header = json.loads(blob[16:16 + hlen].decode())
    new = json.dumps(change(header)).encode()
    p.write_bytes(blob[:8] + struct.pack("<Q", len(new)) + new + blob[16 + hlen:])


def _corrupt_header_a_list(p: Path):
    _rewrite_header(p, lambda h: [h])


def _corrupt_resources_a_list(p: Path):
    _rewrite_header(p, lambda h: {**h, "resources": list(h["resources"])})


def _corrupt_resource_a_number(p: Path):
    _rewrite_header(p, lambda h: {**h, "resources": {k: 1 for k in h["resources"]}})


@pytest.mark.parametrize("corrupt", [_corrupt_truncate, _corrupt_flip_cubin_bit, _corrupt_flip_header_bit,
                                     _corrupt_magic, _corrupt_empty, _corrupt_header_a_list,
                                     _corrupt_resources_a_list, _corrupt_resource_a_number])
def test_corrupt_entry_is_recompiled_never_loaded(fresh_cache, header_dir, count_compiles, corrupt):
    a = _compile_t(header_dir)
    (entry,) = _entries(fresh_cache)
    corrupt(entry)
    assert _compile._read_entry(entry, a.key) is None  # the reader refuses it
    _compile._clear_memory_cache()
    b = _compile_t(header_dir)
    assert not b.cache_hit, "a corrupt entry must be recompiled"
    assert len(count_compiles) == 2
    assert b.data == a.data
    # ... and rewritten whole: the next process hits it again
    assert _compile._read_entry(entry, a.key) is not None
    _compile._clear_memory_cache()
    assert _compile_t(header_dir).cache_hit


def test_entry_under_another_key_is_not_loaded(fresh_cache, header_dir):
    a = _compile_t(header_dir)
    (entry,) = _entries(fresh_cache)
    assert _compile._read_entry(entry, "0" * 64) is None
    assert _compile._read_entry(entry, a.key) is not None


@pytest.mark.parametrize("value", ["0", "off", "false"])
def test_cache_disabled_by_env(fresh_cache, header_dir, monkeypatch, count_compiles, value):
    monkeypatch.setenv("DRIVERLEVEL_CACHE", value)
    assert cache_dir() is None
    a = _compile_t(header_dir)
    assert not a.cache_hit
    assert _entries(fresh_cache) == []
    _compile._clear_memory_cache()
    assert not _compile_t(header_dir).cache_hit
    assert len(count_compiles) == 2


def test_cache_dir_relocated_by_env(tmp_path, header_dir, monkeypatch, count_compiles):
    first, second = tmp_path / "first", tmp_path / "second"
    monkeypatch.delenv("DRIVERLEVEL_CACHE", raising=False)
    monkeypatch.setenv("DRIVERLEVEL_CACHE_DIR", str(first))
    _compile._clear_memory_cache()
    try:
        assert cache_dir() == first
        _compile_t(header_dir)
        assert len(_entries(first)) == 1
        monkeypatch.setenv("DRIVERLEVEL_CACHE_DIR", str(second))
        _compile._clear_memory_cache()
        assert not _compile_t(header_dir).cache_hit  # nothing in the new place yet
        assert len(_entries(second)) == 1 and len(count_compiles) == 2
    finally:
        _compile._clear_memory_cache()


def test_default_cache_dir_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.delenv("DRIVERLEVEL_CACHE", raising=False)
    monkeypatch.delenv("DRIVERLEVEL_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_dir() == tmp_path / "driverlevel"


@pytest.mark.parametrize("blank", ["", "   ", "\t"])
def test_a_blank_cache_dir_means_the_default(monkeypatch, tmp_path, blank):
    """Review s54: DRIVERLEVEL_CACHE_DIR="   " made a directory named three spaces in the current one."""
    monkeypatch.delenv("DRIVERLEVEL_CACHE", raising=False)
    monkeypatch.setenv("DRIVERLEVEL_CACHE_DIR", blank)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_dir() == tmp_path / "driverlevel"
    # and a failure to write there names the directory, not DRIVERLEVEL_CACHE_DIR (a helper's review)
    msg = _compile._cache_write_failure(tmp_path / "driverlevel", PermissionError(13, "Permission denied"))
    assert msg.startswith(f"driverlevel: could not write the cubin cache in {tmp_path / 'driverlevel'}: ")


@pytest.mark.parametrize("xdg", ["relative/cache", "."])
def test_a_relative_xdg_cache_home_is_ignored(monkeypatch, tmp_path, xdg):
    # (XDG Base Directory specification: a relative path in XDG_CACHE_HOME is invalid and ignored)
    monkeypatch.delenv("DRIVERLEVEL_CACHE", raising=False)
    monkeypatch.delenv("DRIVERLEVEL_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", xdg)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cache_dir() == tmp_path / ".cache" / "driverlevel"


def test_unwritable_cache_warns_and_still_compiles(tmp_path, header_dir, monkeypatch):
    blocker = tmp_path / "not_a_dir"
    blocker.write_text("a file where the cache directory should be")
    monkeypatch.setenv("DRIVERLEVEL_CACHE_DIR", str(blocker / "cache"))
    monkeypatch.delenv("DRIVERLEVEL_CACHE", raising=False)
    _compile._clear_memory_cache()
    try:
        with pytest.warns(RuntimeWarning, match="could not write the cubin cache"):
            cub = _compile_t(header_dir)
        assert cub.data[:4] == b"\x7fELF"
    finally:
        _compile._clear_memory_cache()


@pytest.mark.parametrize("via", ["compile_source", "compile_file"])
def test_unwritable_cache_warning_points_at_the_callers_line(fresh_cache, monkeypatch, via):
    """The warning names the user's line (this file), not driverlevel's own warnings.warn line, also when
    the compile goes through compile_file (two frames of driverlevel)."""
    from driverlevel._compile import Cubin

    def unwritable(path, cub):
        raise OSError("read-only file system")

    monkeypatch.setattr(_compile, "_write_entry", unwritable)
    monkeypatch.setattr(_compile, "_nvrtc_compile",
                        lambda source, name, arch, options, path=None: Cubin(b"\x7fELF", arch, name, ()))
    with pytest.warns(RuntimeWarning, match="could not write the cubin cache") as rec:
        if via == "compile_source":
            compile_source("__global__ void k() {}\n", "stacklevel.cu", "sm_90")
        else:
            dl.runtime.compile_file("selftest.cu", "sm_90", {"DL_STACKLEVEL_PROBE": 1})
    assert [w.filename for w in rec] == [__file__]


def test_use_cache_false_always_compiles(fresh_cache, header_dir, count_compiles):
    _compile_t(header_dir)
    b = _compile_t(header_dir, use_cache=False)
    assert not b.cache_hit and len(count_compiles) == 2


def test_include_dir_header_shadows_cu(fresh_cache, tmp_path):
    """A header in a caller's include directory is found before cu/ and keyed by its content."""
    d = tmp_path / "shadow"
    d.mkdir()
    (d / "common.cuh").write_text("#pragma once\n#define SHADOWED 1\n")
    src = '#include "common.cuh"\n#if !SHADOWED\n#error not shadowed\n#endif\nextern "C" __global__ void k() {}\n'
    cub = compile_source(src, "shadow.cu", "sm_90", include_dirs=[d])
    assert "k" in cub.resources
    with pytest.raises(dl.NvrtcError, match="not shadowed"):
        compile_source(src, "shadow.cu", "sm_90")



def test_cuda_header_contents_are_part_of_the_cache_key(tmp_path, monkeypatch):
    """Upgrading the CUDA header wheel (same NVRTC) must not reuse cubins built with the old headers."""
    from driverlevel import _compile

    (tmp_path / "cuda_bf16.h").write_text("// v1\n")
    _compile._system_headers_digest.cache_clear()
    d1 = _compile._system_headers_digest((str(tmp_path),))
    (tmp_path / "cuda_bf16.h").write_text("// v2\n")
    _compile._system_headers_digest.cache_clear()
    assert _compile._system_headers_digest((str(tmp_path),)) != d1

    src = 'extern "C" __global__ void k(float* x) { x[threadIdx.x] += 1.0f; }'
    monkeypatch.setattr(_compile, "_system_headers_digest", lambda dirs: "headers-A")
    a = _compile.compile_source(src, "hdr.cu", "sm_80", use_cache=False)
    key_a = _compile.compile_source(src, "hdr.cu", "sm_80").key
    monkeypatch.setattr(_compile, "_system_headers_digest", lambda dirs: "headers-B")
    key_b = _compile.compile_source(src, "hdr.cu", "sm_80").key
    assert a.data and key_a != key_b


def test_shared_limit_of_arch_specific_and_newer_targets():
    from driverlevel._compile import MAX_SHARED_PER_BLOCK, shared_limit
    from driverlevel.verify_attention import tile_config

    assert shared_limit("sm_90a") == shared_limit("sm_90") == MAX_SHARED_PER_BLOCK["sm_90"]
    assert shared_limit("sm_120a") == 101_376
    assert shared_limit("sm_130") == 101_376  # newer than the table: the smallest supported limit
    assert tile_config("sm_90a") == tile_config("sm_90")  # not the small sm_120 tile


# -- review 15 #8: compile_source's argument checks, before anything is compiled ---------------
_K = 'extern "C" __global__ void k(float* x){ x[threadIdx.x] = 1.f; }\n'


@pytest.mark.parametrize("kw, exc, words", [
    (dict(extra_options="-G"), TypeError, r"extra_options must be a sequence of str, not a single str: write \['-G'\]"),
    (dict(extra_options=[1]), TypeError, r"extra_options\[0\] must be a str, got int 1"),
    (dict(include_dirs="/tmp"), TypeError, r"include_dirs must be a sequence of paths, not a single str"),
    (dict(include_dirs=Path("/tmp")), TypeError, r"include_dirs must be a sequence of paths, not a single PosixPath"),
    (dict(include_dirs=[3]), TypeError, r"include_dirs\[0\] must be a str or path, got int 3"),
    (dict(extra_options=("-arch=sm_80",)), ValueError, r"extra_options must not select the target \('-arch=sm_80'\)"),
    (dict(extra_options=["--gpu-architecture", "sm_80"]), ValueError,
     r"must not select the target \('--gpu-architecture'\)"),
    (dict(extra_options=["--gpu-architecture=compute_80"]), ValueError, "must not select the target"),
    (dict(extra_options=["-gencode=arch=compute_80,code=sm_80"]), ValueError, "must not select the target"),
    (dict(defines={"A": None}), TypeError, r"defines\['A'\] is None: give a value \(e.g. 1\); a bare -DA is not"),
    (dict(defines={"A B": 1}), ValueError, r"defines: 'A B' is not a C identifier"),
    (dict(defines={1: 1}), TypeError, "defines: a name must be a str, got int 1"),
    (dict(defines={"A": [1]}), TypeError, r"defines\['A'\] must be an int, float, bool or str .*, got list"),
    (dict(defines=[("A", 1)]), TypeError, "defines must be a dict of NAME: value, got list"),
])
def test_compile_source_refuses_bad_options_before_compiling(fresh_cache, count_compiles, kw, exc, words):
    """A str was split into characters (NVRTC got '- G', '-I/ -It -Im -Ip'), -arch=sm_80 built an sm_80
    cubin labelled sm_90, and a None define became -DA=None."""
    with pytest.raises(exc, match=words):
        compile_source(_K, "k.cu", "sm_90", **kw)
    assert count_compiles == []
    assert not fresh_cache.exists()


def test_compile_source_options_that_are_fine_still_compile(fresh_cache):
    cub = compile_source(_K, "k.cu", "sm_90", defines={"A": True, "B": 2, "C": "x"}, extra_options=["-lineinfo"],
                         include_dirs=[Path("/tmp")])
    assert cub.arch == "sm_90" and "k" in cub.resources
    assert {"-DA=1", "-DB=2", "-DC=x", "-lineinfo"} <= set(cub.options)


# -- review 15 #9: compile_file compiles the kernel sources only --------------------------------
@pytest.mark.parametrize("name", ["common.cuh", "/etc/hostname", "../cu/argmax.cu", "ddtree/params.cuh",
                                  str(Path(__file__))])
def test_compile_file_refuses_what_is_not_a_kernel_source(fresh_cache, count_compiles, name):
    with pytest.raises(FileNotFoundError, match=rf"no kernel source '{name}' .*must be one of kernel_sources\(\): "
                                                rf"argmax\.cu, ddtree\.cu"):
        dl.runtime.compile_file(name, "sm_90")
    assert count_compiles == []


def test_compile_file_refuses_a_non_str_name():
    with pytest.raises(TypeError, match="filename must be a kernel source name"):
        dl.runtime.compile_file(5, "sm_90")


# -- review 15 #12: DRIVERLEVEL_CACHE values and the unwritable-cache message -------------------
@pytest.mark.parametrize("value", ["1", "on", "TRUE", "yes", "", " 1 "])
def test_cache_kept_by_documented_values(fresh_cache, monkeypatch, value):
    monkeypatch.setenv("DRIVERLEVEL_CACHE", value)
    assert cache_dir() == fresh_cache


@pytest.mark.parametrize("value", ["NO", " off ", "False"])
def test_cache_disabled_by_any_case(monkeypatch, value):
    monkeypatch.setenv("DRIVERLEVEL_CACHE", value)
    assert cache_dir() is None


def test_unknown_cache_value_is_an_error(fresh_cache, monkeypatch, count_compiles):
    """DRIVERLEVEL_CACHE=maybe silently meant "on"."""
    monkeypatch.setenv("DRIVERLEVEL_CACHE", "maybe")
    with pytest.raises(ValueError, match=r"DRIVERLEVEL_CACHE='maybe' is not understood: use 0, off, false or no"):
        cache_dir()
    with pytest.raises(ValueError, match="DRIVERLEVEL_CACHE='maybe'"):
        compile_source(_K, "k.cu", "sm_90")
    assert count_compiles == []


@pytest.mark.parametrize("sub, why", [("", "it is not a directory"), ("cache", "{file} is not a directory")])
def test_cache_dir_that_is_a_file_is_named_as_such(tmp_path, monkeypatch, sub, why):
    """mkdir's errno said "[Errno 17] File exists" for a file where the directory should be."""
    f = tmp_path / "afile"
    f.write_text("x")
    d = f / sub if sub else f
    monkeypatch.setenv("DRIVERLEVEL_CACHE_DIR", str(d))
    monkeypatch.delenv("DRIVERLEVEL_CACHE", raising=False)
    _compile._clear_memory_cache()
    try:
        with pytest.warns(RuntimeWarning) as rec:
            compile_source(_K, "k.cu", "sm_90")
    finally:
        _compile._clear_memory_cache()
    (w,) = rec
    assert str(w.message) == (f"driverlevel: could not write the cubin cache in DRIVERLEVEL_CACHE_DIR={d}: "
                              f"{why.format(file=f)}; compiling without the disk cache (set DRIVERLEVEL_CACHE_DIR "
                              f"to a writable directory, or DRIVERLEVEL_CACHE=0)")
    assert w.filename == __file__


# -- review 16 #1: the current directory never replaces cu/'s headers ---------------------------
def _argmax_defines(arch="sm_90"):
    from driverlevel import argmax

    return argmax.compile_variants(arch)[0].defines


def test_a_common_cuh_in_the_current_directory_does_not_replace_cu_s(fresh_cache, tmp_path, monkeypatch):
    """NVRTC searched the current directory before -I: a user's own common.cuh broke every kernel."""
    clean = dl.runtime.compile_file("argmax.cu", "sm_90", _argmax_defines(), use_cache=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "common.cuh").write_text('// my project helpers\n#pragma once\n#error "the cwd\'s common.cuh"\n')
    (tmp_path / "ddtree").mkdir()
    (tmp_path / "ddtree" / "params.cuh").write_text('#error "the cwd\'s ddtree/params.cuh"\n')
    cub = dl.runtime.compile_file("argmax.cu", "sm_90", _argmax_defines())
    assert not cub.cache_hit and cub.data == clean.data
    from driverlevel import ddtree

    v = ddtree.compile_variants("sm_90")[0]
    dl.runtime.compile_file("ddtree.cu", "sm_90", v.defines, use_cache=False)  # ddtree/*.cuh and their siblings


def test_a_header_in_the_current_directory_does_not_poison_the_cache(fresh_cache, tmp_path, monkeypatch):
    """A logit_keys.cuh that still compiled (one changed line) gave another cubin, stored under the
    genuine key and served from then on, from any directory."""
    src = (kernel_source_dir() / "logit_keys.cuh").read_text()
    changed = src.replace("static_cast<u32>(~id); }", "static_cast<u32>(~(id + 1)); }")
    assert changed != src
    poison, elsewhere = tmp_path / "poison", tmp_path / "clean"
    poison.mkdir()
    elsewhere.mkdir()
    (poison / "logit_keys.cuh").write_text(changed)
    monkeypatch.chdir(poison)
    built_there = dl.runtime.compile_file("argmax.cu", "sm_90", _argmax_defines())
    assert not built_there.cache_hit
    monkeypatch.chdir(elsewhere)
    _compile._clear_memory_cache()  # as a new process would
    served = dl.runtime.compile_file("argmax.cu", "sm_90", _argmax_defines())
    fresh = dl.runtime.compile_file("argmax.cu", "sm_90", _argmax_defines(), use_cache=False)
    assert served.cache_hit and served.key == built_there.key
    assert served.data == fresh.data == built_there.data


def test_compile_source_does_not_search_the_current_directory(fresh_cache, tmp_path, monkeypatch):
    """Its headers come from include_dirs and cu/ only (all of them part of the key), never from the
    current directory (which is not)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dl_cwd_only.h").write_text("#define VAL 1.f\n")
    src = '#include "dl_cwd_only.h"\nextern "C" __global__ void k(float* x){ x[threadIdx.x] = VAL; }\n'
    with pytest.raises(dl.NvrtcError, match='cannot open source file "dl_cwd_only.h"') as ei:
        compile_source(src, "k.cu", "sm_90")
    assert ei.value.source_name == "k.cu"
    cub = compile_source(src, "k.cu", "sm_90", include_dirs=["."])  # asked for: then it is part of the key
    (tmp_path / "dl_cwd_only.h").write_text("#define VAL 2.f\n")
    again = compile_source(src, "k.cu", "sm_90", include_dirs=["."])
    assert not again.cache_hit and again.key != cub.key and again.data != cub.data


def test_the_key_format_is_part_of_the_key(fresh_cache, header_dir, monkeypatch):
    """Entries written before a change of what the key covers (review 16: the current directory)
    are not served."""
    a = _compile_t(header_dir)
    monkeypatch.setattr(_compile, "_KEY_FORMAT", "1")
    assert _compile_t(header_dir).key != a.key


# -- review 16 #2: every header NVRTC reads is part of the key ----------------------------------
_ANGLE = '#include <dl_myval.h>\nextern "C" __global__ void k(float* x){ x[threadIdx.x] = VAL; }\n'


def test_an_angle_bracket_header_in_include_dirs_is_part_of_the_key(fresh_cache, tmp_path, count_compiles):
    """Editing a header that the source includes with <...> from include_dirs gave the old cubin as a
    cache hit."""
    (tmp_path / "dl_myval.h").write_text("#define VAL 1.f\n")
    a = compile_source(_ANGLE, "k.cu", "sm_90", include_dirs=[tmp_path])
    (tmp_path / "dl_myval.h").write_text("#define VAL 2.f\n")
    b = compile_source(_ANGLE, "k.cu", "sm_90", include_dirs=[tmp_path])
    assert not b.cache_hit and b.key != a.key and b.data != a.data and len(count_compiles) == 2
    assert b.data == compile_source(_ANGLE, "k.cu", "sm_90", include_dirs=[tmp_path], use_cache=False).data


def test_a_nested_angle_bracket_header_is_part_of_the_key(fresh_cache, header_dir):
    (header_dir / "dl_test_header.cuh").write_text("#pragma once\n#include <sub/dl_inner.h>\n")
    (header_dir / "sub").mkdir()
    (header_dir / "sub" / "dl_inner.h").write_text("#define SCALE 2.0f\n")
    a = _compile_t(header_dir)
    (header_dir / "sub" / "dl_inner.h").write_text("#define SCALE 3.0f\n")
    b = _compile_t(header_dir)
    assert not b.cache_hit and b.key != a.key
    assert set(_compile._local_headers(SRC, [header_dir])) == {"dl_test_header.cuh", "sub/dl_inner.h"}


@pytest.mark.parametrize("opts", [["-I/tmp"], ["-I", "/tmp"], ["--include-path=/tmp"], ["--include-path", "/tmp"],
                                  ["-include", "x.h"], ["-include=x.h"], ["--pre-include=x.h"]])
def test_include_options_are_refused_pointing_at_include_dirs(fresh_cache, count_compiles, opts):
    """-I in extra_options was passed to NVRTC, and the headers it found were not part of the key."""
    with pytest.raises(ValueError, match=rf"extra_options must not add include directories or headers "
                                         rf"\('{opts[0]}'\): pass the directories as include_dirs="):
        compile_source(_K, "k.cu", "sm_90", extra_options=opts)
    assert count_compiles == [] and not fresh_cache.exists()


# -- review 16 #7: compile_source checks source and name too -------------------------------------
@pytest.mark.parametrize("source, name, exc, words", [
    (_K.encode(), "k.cu", TypeError, r"source must be a str \(the CUDA C\+\+ text\), got bytes: decode it first"),
    (None, "k.cu", TypeError, r"source must be a str \(the CUDA C\+\+ text\), got NoneType"),
    (_K, None, TypeError, r"name must be a str \(a file name such as 'k.cu'\), got NoneType None"),
    (_K, b"k.cu", TypeError, "name must be a str"),
    (_K, "", ValueError, "name must end in a file name such as 'k.cu', got ''"),
    (_K, "kernels/", ValueError, "name must end in a file name"),
])
def test_compile_source_checks_source_and_name_first(fresh_cache, count_compiles, source, name, exc, words):
    """bytes gave "cannot use a string pattern on a bytes-like object", name=None an AttributeError."""
    with pytest.raises(exc, match=words):
        compile_source(source, name, "sm_999", extra_options="-G")  # checked before the other arguments
    assert count_compiles == [] and not fresh_cache.exists()


# -- review 16 #6: a kernel file compiled without its launcher's defines says where they come from ---
@pytest.mark.parametrize("name", kernel_sources())
def test_without_the_launchers_defines_a_kernel_file_names_them_or_compiles(fresh_cache, name):
    """argmax.cu said only 'identifier "DL_ARGMAX_THREADS" is undefined'."""
    try:
        dl.runtime.compile_file(name, "sm_90", use_cache=False)
    except dl.NvrtcError as e:
        errors = [ln for ln in e.log.splitlines() if "error" in ln]
        assert errors and "#error directive" in errors[0] and "compile with driverlevel." in errors[0], errors[:3]
    else:
        assert name in ("mla_model.cu", "selftest.cu")


def test_argmax_without_defines_names_compile_variants(fresh_cache):
    with pytest.raises(dl.NvrtcError, match=r'#error directive: "compile with driverlevel\.argmax\.compile_variants'):
        dl.runtime.compile_file("argmax.cu", "sm_90", use_cache=False)


# -- a review of the review-16 fixes: what the program's new name reaches ----------------------
_FILE_SRC = 'extern "C" __global__ void k(int* x){ x[0] = sizeof(__FILE__); }\n'


def test_the_program_path_is_part_of_the_key(fresh_cache, tmp_path):
    """NVRTC names the program as a file of the first include directory, and that path reaches the
    cubin (__FILE__, -lineinfo): two first directories gave two cubins under one key (a stale hit)."""
    a, ab = tmp_path / "a", tmp_path / "ab"
    a.mkdir()
    ab.mkdir()
    first = compile_source(_FILE_SRC, "k.cu", "sm_90", include_dirs=[a])
    second = compile_source(_FILE_SRC, "k.cu", "sm_90", include_dirs=[ab])
    assert not second.cache_hit and second.key != first.key and second.data != first.data
    assert second.data == compile_source(_FILE_SRC, "k.cu", "sm_90", include_dirs=[ab], use_cache=False).data


def test_the_log_names_the_program_as_the_caller_did(fresh_cache):
    """NVRTC's diagnostics would name cu/k.cu (a file that does not exist): they name k.cu."""
    src = 'extern "C" __global__ void k(float* x){ x[0] = oops; }\n'
    with pytest.raises(dl.NvrtcError) as ei:
        compile_source(src, "k.cu", "sm_90")
    assert 'k.cu(1): error: identifier "oops" is undefined' in str(ei.value)
    assert str(kernel_source_dir() / "k.cu") not in str(ei.value)  # (the -I options name cu/ itself)


def test_a_missing_header_says_where_headers_are_searched(fresh_cache, tmp_path):
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "dl_helper.h").write_text("#define VAL 1.f\n")
    src = '#include "dl_helper.h"\nextern "C" __global__ void k(float* x){ x[0] = VAL; }\n'
    with pytest.raises(dl.NvrtcError, match=r"never in the current directory or the directory of the name given: "
                                            r"pass your header directories as include_dirs"):
        compile_source(src, str(tmp_path / "kernels" / "k.cu"), "sm_90")
    assert compile_source(src, "k.cu", "sm_90", include_dirs=[tmp_path / "kernels"]).data[:4] == b"\x7fELF"


def test_a_header_in_another_encoding_is_hashed_and_compiled(fresh_cache, tmp_path):
    """Headers were read as UTF-8 text: a Latin-1 comment raised UnicodeDecodeError before compiling."""
    (tmp_path / "dl_myval.h").write_bytes(b"// (c) Jos\xe9\n#define VAL 1.f\n")
    a = compile_source(_ANGLE, "k.cu", "sm_90", include_dirs=[tmp_path])
    (tmp_path / "dl_myval.h").write_bytes(b"// (c) Jos\xe9\n#define VAL 2.f\n")
    b = compile_source(_ANGLE, "k.cu", "sm_90", include_dirs=[tmp_path])
    assert not b.cache_hit and b.key != a.key and b.data != a.data


# -- review 17: the key covers every header NVRTC may read; arguments checked before compiling ------
_VAL_SRC = 'extern "C" __global__ void k(int* p){ p[0] = VAL; }\n'


@pytest.mark.parametrize("include, defines", [
    ('#include HDR\n', {"HDR": '"dl_val.cuh"'}),              # a computed include: the header is a macro
    ('#define DL_STR(x) #x\n#define DL_HDR(x) DL_STR(x)\n#include DL_HDR(dl_val.cuh)\n', {}),  # a macro of the source
    ('/* x */ #include "dl_val.cuh"\n', {}),                 # a comment before the directive
    ('/* a\n b */ # include "dl_val.cuh"\n', {}),           # a comment over two lines before it
    ('#inc\\\nlude "dl_val.cuh"\n', {}),                      # a directive continued with a backslash
    ('%:include "dl_val.cuh"\n', {}),                        # the digraph of # (fresh-user trial, s65)
    ('  %: include "dl_val.cuh"\n', {}),
])
def test_an_edited_header_reached_by_a_macro_or_after_a_comment_changes_the_key(fresh_cache, tmp_path, include,
                                                                                 defines, count_compiles):
    """`#include HDR` and `/* x */ #include "d.cuh"` were not seen: the edited header's old cubin was served."""
    src = include + _VAL_SRC
    (tmp_path / "dl_val.cuh").write_text("#define VAL 7\n")
    a = compile_source(src, "k.cu", "sm_90", defines, include_dirs=[tmp_path])
    (tmp_path / "dl_val.cuh").write_text("#define VAL 8\n")
    _compile._clear_memory_cache()  # as a new process would
    b = compile_source(src, "k.cu", "sm_90", defines, include_dirs=[tmp_path])
    assert not b.cache_hit and b.key != a.key and b.data != a.data and len(count_compiles) == 2


def test_a_computed_include_hashes_every_file_of_the_include_dirs(fresh_cache, tmp_path):
    """The header a macro names is known only to NVRTC: every file under include_dirs (in subfolders too)
    and cu/ is part of the key, so an edit anywhere there changes it."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "dl_val.cuh").write_text("#define VAL 7\n")
    (tmp_path / "sub" / "unrelated.txt").write_text("a\n")
    src = '#include HDR\n' + _VAL_SRC
    kw = dict(defines={"HDR": '"sub/dl_val.cuh"'}, include_dirs=[tmp_path])
    a = compile_source(src, "k.cu", "sm_90", **kw)
    assert _compile._ALL_FILES in _compile._local_headers(src, [tmp_path, kernel_source_dir()])
    (tmp_path / "sub" / "unrelated.txt").write_text("b\n")
    b = compile_source(src, "k.cu", "sm_90", **kw)
    assert not b.cache_hit and b.key != a.key
    assert _compile._ALL_FILES not in _compile._local_headers(SRC, [tmp_path])  # literal includes only: as before


def test_a_header_that_appears_changes_the_key_of_a_source_asking_has_include(fresh_cache, tmp_path):
    """Fresh-user trial (s66): after `dl_h9.cuh` was created, the source that asked
    `__has_include("dl_h9.cuh")` was a cache hit and got the cubin built without it."""
    src = ('#if __has_include("dl_h9.cuh")\n#define VAL 7\n#else\n#define VAL 3\n#endif\n' + _VAL_SRC)
    a = compile_source(src, "k.cu", "sm_80", include_dirs=[tmp_path])
    (tmp_path / "dl_h9.cuh").write_text("\n")
    _compile._clear_memory_cache()  # as a new process would
    b = compile_source(src, "k.cu", "sm_80", include_dirs=[tmp_path])
    fresh = compile_source(src, "k.cu", "sm_80", include_dirs=[tmp_path], use_cache=False)
    assert not b.cache_hit and b.key != a.key and b.data == fresh.data != a.data
    assert _compile._ALL_FILES in _compile._local_headers("#if __has_include_next(<x.h>)\n#endif\n", [tmp_path])


def test_commented_out_includes_are_not_headers(tmp_path):
    (tmp_path / "a.h").write_text("")
    (tmp_path / "b.h").write_text("")
    (tmp_path / "c.h").write_text("")
    (tmp_path / "d.h").write_text("")
    src = ('// #include "a.h"\n/*\n#include "b.h"\n*/\nconst char* s = "/*"; int n = 1\'000;\n'
           '#include "c.h" // a comment\n#define T "*/"\n#include <d.h>\n')
    assert set(_compile._local_headers(src, [tmp_path])) == {"c.h", "d.h"}


def test_the_log_keeps_a_header_whose_path_starts_with_the_program_s(fresh_cache, tmp_path):
    """With name="k.cu" and include_dirs=[inc], an error in inc/k.cuh was reported as k.cuh(1)."""
    (tmp_path / "k.cuh").write_text("int x = ;\n")
    with pytest.raises(dl.NvrtcError) as ei:
        compile_source('#include "k.cuh"\nint y = ;\n', "k.cu", "sm_90", include_dirs=[tmp_path])
    errors = [ln for ln in ei.value.log.splitlines() if "error:" in ln]
    assert errors == [f"{tmp_path / 'k.cuh'}(1): error: expected an expression",
                      "k.cu(2): error: expected an expression"]


@pytest.mark.parametrize("dirs, exc, words", [
    (["nope"], ValueError, r"include_dirs\[0\] 'nope' is not a directory \(it does not exist\)"),
    ([""], ValueError, r"include_dirs\[0\] is '': an empty path \(write '\.' for the current directory\)"),
    ({"inc": 1}, TypeError, r"include_dirs must be a sequence of paths \(a list or tuple, in order\), got dict"),
    ({"inc"}, TypeError, r"include_dirs must be a sequence of paths \(a list or tuple, in order\), got set"),
])
def test_include_dirs_are_checked(fresh_cache, count_compiles, dirs, exc, words):
    with pytest.raises(exc, match=words):
        compile_source(_K, "k.cu", "sm_90", include_dirs=dirs)
    assert count_compiles == [] and not fresh_cache.exists()


def test_an_include_dir_that_is_a_file_is_named(fresh_cache, tmp_path, count_compiles):
    (tmp_path / "h.cuh").write_text("")
    with pytest.raises(ValueError, match=r"include_dirs\[1\] '.*h\.cuh' is a file, not a directory"):
        compile_source(_K, "k.cu", "sm_90", include_dirs=[tmp_path, tmp_path / "h.cuh"])
    assert count_compiles == []


@pytest.mark.parametrize("opts", [["-D"], ["-DX=1", "-U"], ["--define-macro"], ["-Xptxas"], ["-maxrregcount"]])
def test_a_last_option_without_its_value_is_refused(fresh_cache, count_compiles, opts):
    """It took driverlevel's -I<cu> as its value ("invalid macro definition: -I/.../cu"); last on the
    command line, NVRTC ignores -Xptxas and -maxrregcount silently."""
    with pytest.raises(ValueError, match=rf"extra_options ends with '{opts[-1]}', which takes a value: give the "
                                         rf"value as the next item \(\[\.\.\., '{opts[-1]}', value\]\)"):
        compile_source(_K, "k.cu", "sm_90", extra_options=opts)
    assert count_compiles == []


def test_the_callers_options_come_after_driverlevels(fresh_cache):
    """-Werror with no value named driverlevel's -I<cu> in NVRTC's message; now NVRTC names the option."""
    with pytest.raises(dl.NvrtcError) as ei:
        compile_source(_K, "k.cu", "sm_90", extra_options=["-Werror"], use_cache=False)
    assert ei.value.options[-1] == "-Werror"
    assert "expects valid value(s)" in ei.value.log and "-I" not in ei.value.log
    cub = compile_source(_K, "k.cu", "sm_90", extra_options=["-D", "X=1"])
    assert cub.options[-2:] == ("-D", "X=1")


@pytest.mark.parametrize("opt", ["-dlto", "--dlink-time-opt"])
def test_lto_options_are_refused(fresh_cache, count_compiles, opt):
    """-dlto gave "NVRTC produced no cubin (a virtual compute_XX target?)"."""
    with pytest.raises(ValueError, match=rf"extra_options must not ask for LTO IR instead of a cubin \('{opt}'\)"):
        compile_source(_K, "k.cu", "sm_90", extra_options=[opt])
    assert count_compiles == []


@pytest.mark.parametrize("bad", [(1, 20), (0, 9), (9, -1), (9.0, 0), ("9", "0"), (True, 0)])
def test_normalize_arch_checks_the_tuple_items(bad):
    """(1, 20) became sm_120."""
    with pytest.raises(ValueError, match=r"a compute capability tuple is \(major, minor\), two ints with major >= 1 "
                                         r"and minor 0 to 9, e\.g\. \(9, 0\)"):
        normalize_arch(bad)


def test_normalize_arch_takes_numpy_ints():
    np = pytest.importorskip("numpy")
    assert normalize_arch((np.int64(12), np.int32(0))) == "sm_120"


@pytest.mark.parametrize("bad, plain", [("sm_090", "sm_90"), ("0090", "sm_90"), ("sm_090a", "sm_90a")])
def test_a_leading_zero_is_refused(bad, plain):
    """sm_090 passed, had sm_86's shared-memory limit and was called unsupported by NVRTC."""
    with pytest.raises(ValueError, match=rf"unsupported architecture '{bad}': the number has a leading zero "
                                         rf"\(write '{plain}'\)"):
        normalize_arch(bad)
    with pytest.raises(ValueError, match=rf"'{bad}' has a leading zero in its number \(write {plain}\)"):
        _compile.check_arch(bad)


@pytest.mark.parametrize("bad", [None, b"sm_90", True, 9.0, ["sm_90"]])
def test_check_arch_refuses_what_normalize_arch_refuses_as_a_type_error(bad):
    """Review 38: check_arch(None) said "'None' is not an architecture name" (a ValueError) where
    normalize_arch raises TypeError for the same values."""
    with pytest.raises(TypeError, match="an architecture name must be a str such as 'sm_90'"):
        _compile.check_arch(bad)
    with pytest.raises(TypeError):
        normalize_arch(bad)
    assert _compile.check_arch(90) == _compile.check_arch("sm_90") == "sm_90"


@pytest.mark.parametrize("bad", ["sm_00", "SM_00", "00", "sm_000"])
def test_an_all_zero_number_is_older_than_sm_80_not_a_leading_zero(bad):
    """Review 17 L8: the leading-zero rule stripped every digit of sm_00 and suggested writing 'sm_'."""
    with pytest.raises(ValueError, match=rf"unsupported architecture '{bad}': expected a real target sm_XX of sm_80 "
                                         rf"or newer") as e:
        normalize_arch(bad)
    assert "leading zero" not in str(e.value)
    with pytest.raises(ValueError, match=rf"'{bad}' is older than sm_80") as e:
        _compile.check_arch(bad)
    assert "leading zero" not in str(e.value)


@pytest.mark.parametrize("source, name, words", [
    (_K, ".", "name must end in a file name such as 'k.cu', got '.'"),
    (_K, "..", "name must end in a file name such as 'k.cu', got '..'"),
    (_K, "dir/..", "name must end in a file name such as 'k.cu', got 'dir/..'"),
    (_K, "k\0.cu", r"name must not contain a NUL character, got 'k\\x00.cu'"),
    ("int x = 1;\0 garbage ;;;", "k.cu", r"source contains a NUL character \(at index 10\): NVRTC would stop reading "
                                         r"there and compile only the text before it"),
])
def test_nul_and_dot_names_are_refused(fresh_cache, count_compiles, source, name, words):
    """NVRTC cut the source at a NUL (while the key hashed all of it) and took '.' as a name."""
    with pytest.raises(ValueError, match=words):
        compile_source(source, name, "sm_90")
    assert count_compiles == [] and not fresh_cache.exists()



@pytest.mark.parametrize("kw, words", [
    (dict(source=_K + "// caf\udce9\n"), r"source is not valid Unicode text \(a lone surrogate '\\udce9' at index "),
    (dict(name="k\udce9.cu"), r"name is not valid Unicode text \(a lone surrogate '\\udce9' at index 1,"),
    (dict(defines={"X": "a\udce9"}), r"defines\['X'\] is not valid Unicode text \(a lone surrogate\)"),
    (dict(extra_options=["-DY=\udce9"]), r"extra_options\[0\] is not valid Unicode text \(a lone surrogate\)"),
])
@pytest.mark.parametrize("use_cache", [True, False])
def test_text_utf8_cannot_encode_is_refused_before_compiling(fresh_cache, count_compiles, kw, words, use_cache):
    """A lone surrogate (a file read with errors='surrogateescape') raised UnicodeEncodeError out of the
    cache key (fresh-user review, seventy-seventh session); NVRTC takes UTF-8."""
    args = {"source": _K, "name": "k.cu", **kw}
    with pytest.raises(ValueError, match=words):
        compile_source(args.pop("source"), args.pop("name"), "sm_90", use_cache=use_cache, **args)
    assert count_compiles == [] and not fresh_cache.exists()


def test_an_include_dir_utf8_cannot_encode_is_refused(fresh_cache, count_compiles, tmp_path):
    d = os.fsdecode(os.fsencode(str(tmp_path)) + b"/caf\xe9")  # a real directory whose name is no UTF-8
    os.mkdir(d)
    with pytest.raises(ValueError, match=r"include_dirs\[0\] is not valid Unicode text \(a lone surrogate\)"):
        compile_source(_K, "k.cu", "sm_90", include_dirs=[d])
    assert count_compiles == []

# -- review 17 L2: a kernel file compiled without (all of) its defines names the public launcher ----
def _partial_defines(which):
    from driverlevel._constants import kernel_defines
    from driverlevel._device_error import error_defines

    return {"none": {}, "constants": kernel_defines(), "errors": error_defines(),
            "both": {**kernel_defines(), **error_defines()}}[which]


@pytest.mark.parametrize("which", ["none", "constants", "errors", "both"])
@pytest.mark.parametrize("name, module", [("ddtree.cu", "ddtree"), ("runner.cu", "runner"),
                                          ("verify_attention.cu", "verify_attention")])
def test_a_partial_define_set_stops_at_one_error_naming_the_launcher(fresh_cache, name, module, which):
    """constants.cuh named the private _constants.kernel_defines(); following it, ddtree.cu and runner.cu
    gave a cascade of undefined identifiers (DL_FIELD_TREE_TOKENS ...), and verify_attention.cu pointed
    at _device_error.error_defines(), then at compile_defines() (no variant, no tile)."""
    with pytest.raises(dl.NvrtcError) as ei:
        dl.runtime.compile_file(name, "sm_90", _partial_defines(which), use_cache=False)
    errors = [ln for ln in ei.value.log.splitlines() if "error" in ln and not ln.startswith("  ")]
    assert errors[0].startswith(f"{name}(") and errors[0].endswith(
        f'#error directive: "compile with driverlevel.{module}.compile_variants()"'), errors
    assert len(errors) == 2 and "catastrophic error detected" in errors[1], errors


def test_constants_cuh_names_the_public_launchers(fresh_cache):
    with pytest.raises(dl.NvrtcError, match=r'#error directive: "DL_STATUS_POOL_EXHAUSTED is not defined: compile '
                                            r'with driverlevel\.ddtree\.compile_variants\(\) \(ddtree\.cu\) or '
                                            r'driverlevel\.runner\.compile_variants\(\) \(runner\.cu\)"'):
        compile_source('#include "constants.cuh"\n', "k.cu", "sm_90", use_cache=False)


@pytest.mark.parametrize("module", ["ddtree", "runner"])
def test_without_the_shared_constants_constants_cuh_names_the_launchers(fresh_cache, module):
    """The rest of the set given, the first missing shared constant stops the compile, naming the public way."""
    import importlib

    from driverlevel._constants import kernel_defines

    mod = importlib.import_module(f"driverlevel.{module}")
    defines = {k: v for k, v in mod.compile_defines("sm_90").items() if k not in kernel_defines()}
    with pytest.raises(dl.NvrtcError, match=r'#error directive: "DL_STATUS_POOL_EXHAUSTED is not defined: compile '
                                            r'with driverlevel\.ddtree\.compile_variants\(\) \(ddtree\.cu\) or '
                                            r'driverlevel\.runner\.compile_variants\(\) \(runner\.cu\)"'):
        dl.runtime.compile_file(f"{module}.cu", "sm_90", defines, use_cache=False)


# -- which cubin architecture loads on which device; architecture names in any case --------------------------
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


# -- the cache's file and directory modes follow the umask; an entry that cannot be read says so -------------
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


def test_a_cache_directory_that_cannot_be_searched_warns_and_compiles(tmp_path, monkeypatch, fake_nvrtc):
    """Review 76: the read and write warnings' own checks (Path.is_dir, Path.exists) raised on
    Python < 3.14 where the cache directory could not be searched (another user's, mode 0700) or
    its name was too long, so compiling died with a traceback instead of the warning. A name too
    long is a real OS error here (root passes any permission); Path's tests are made to raise as
    3.11's do for a directory that cannot be searched."""
    import pathlib

    from driverlevel import _compile

    def raising(self, *a, **k):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(pathlib.Path, "is_dir", raising)
    monkeypatch.setattr(pathlib.Path, "exists", raising)
    cache = tmp_path / ("a" * 300)
    monkeypatch.setenv("DRIVERLEVEL_CACHE_DIR", str(cache))
    _compile._clear_memory_cache()
    try:
        with pytest.warns(RuntimeWarning) as rec:
            cub = _compile.compile_source(_SRC, "long.cu", "sm_90")
    finally:
        _compile._clear_memory_cache()
    texts = [str(w.message) for w in rec]
    assert texts[0].startswith("driverlevel: could not read the cubin cache entry ")
    assert texts[0].split(": ")[2].startswith("File name too long;"), texts[0]
    assert texts[1].startswith(f"driverlevel: could not write the cubin cache in DRIVERLEVEL_CACHE_DIR={cache}: ")
    # (its reason is Path.mkdir's: the patched is_dir's "Permission denied" here, a name too long on 3.11)
    assert texts[1].endswith("; compiling without the disk cache (set DRIVERLEVEL_CACHE_DIR to a writable "
                             "directory, or DRIVERLEVEL_CACHE=0)") and len(texts) == 2
    assert not cub.cache_hit and fake_nvrtc == ["long.cu"]


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


# -- DRIVERLEVEL_CACHE_DIR: ~ expanded, a relative path made absolute once -----------------------------------
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


# -- use_cache is a bool -------------------------------------------------------------------------------------
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


# -- compile_source's defines --------------------------------------------------------------------------------
K_SRC = 'extern "C" __global__ void k(int *o) { o[0] = N; }\n'


@pytest.fixture
def no_nvrtc(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("reached NVRTC")

    monkeypatch.setattr(_compile, "_nvrtc_compile", refuse)


@pytest.mark.parametrize("value", [np.int64(4), np.int32(4), np.uint8(4)])
def test_compile_source_takes_numpy_integers_as_defines(value):
    cubin = dl.compile_source(K_SRC, "k.cu", "sm_90", defines={"N": value}, use_cache=False)
    assert "k" in cubin.resources and "-DN=4" in cubin.options
    assert _compile._check_compile_args({"N": value}, (), ())[0] == {"N": 4}
    assert type(_compile._check_compile_args({"N": value}, (), ())[0]["N"]) is int


@pytest.mark.parametrize("value, words", [
    (float("nan"), "finite"), (float("inf"), "finite"), (np.float64("-inf"), "finite"),
    ("4\n#error x", "line break"), ("4\r", "line break"), ("4\0", "NUL"),
])
def test_compile_source_refuses_define_values_no_compile_can_take(no_nvrtc, value, words):
    with pytest.raises(ValueError, match=words):
        dl.compile_source(K_SRC, "k.cu", "sm_90", defines={"N": value}, use_cache=False)


@pytest.mark.parametrize("value, want", [(np.bool_(True), True), (np.bool_(False), False), (np.float32(1.5), 1.5),
                                         (np.float16(-2.0), -2.0)])
def test_compile_source_takes_numpy_bools_and_floats_as_defines(value, want):
    """numpy's bool and floats become Python's (the same -D text and cache key as theirs); they were
    refused with "must be an int, float, bool or str, got bool np.True_"."""
    checked = _compile._check_compile_args({"N": value}, (), ())[0]
    assert checked == {"N": want} and type(checked["N"]) is type(want)
    with pytest.raises(ValueError, match="finite"):
        _compile._check_compile_args({"N": np.float32("nan")}, (), ())


@pytest.mark.parametrize("value", [1 + 2j, np.complex64(1), b"4", [4]])
def test_compile_source_still_refuses_other_define_types(no_nvrtc, value):
    with pytest.raises(TypeError, match=r"must be an int, float, bool or str \(or numpy's int, float or bool\)"):
        dl.compile_source(K_SRC, "k.cu", "sm_90", defines={"N": value}, use_cache=False)


def test_check_arch_takes_numpy_integers_and_only_ascii_digits():
    """Review 39: check_arch refused np.int64(90) where normalize_arch takes it; tile_config and
    normalize_arch took 'sm_\uff11\uff12\uff10' (full-width digits) where check_arch refused it."""
    from driverlevel.verify_attention import tile_config

    assert _compile.check_arch(np.int64(90)) == "sm_90" and _compile.check_arch(90) == "sm_90"
    for bad in ("sm_\uff11\uff12\uff10", "\u0669\u0660"):
        with pytest.raises(ValueError):
            _compile.check_arch(bad)
        with pytest.raises(ValueError, match="unsupported architecture"):
            tile_config(bad, 64)


def test_check_arch_list_is_what_every_arch_option_takes():
    """`driverlevel compile --arch`, tools/sass_compare.py and tools/code_sections.py read their
    --arch values alike (a helper's trial found three spellings): commas, repeats, 'all' in any case."""
    f = _compile.check_arch_list
    assert f(["sm_90,SM_120", "90"]) == ["sm_90", "sm_120"]  # (checked, a repeat listed once)
    assert f(["ALL"]) == f(["all", "All"]) == list(_compile.SUPPORTED_ARCHS)
    for bad, words in [(["sm_90,,sm_120"], "empty architecture name"), (["sm_90,"], "empty architecture name"),
                       (["all", "sm_90"], "'all' stands alone"), (["all,sm_90"], "'all' stands alone"),
                       (["sm_75"], "older than sm_80")]:
        with pytest.raises(ValueError, match=words):
            f(bad)
    with pytest.raises(ValueError, match="got '--kind all --kind sm_90'"):
        f(["all", "sm_90"], option="--kind")


def test_check_compile_options_checks_the_archs_then_the_environment(monkeypatch):
    """tools/sass_compare.py's and code_sections.py's checks before a compile: --arch (the message
    prefixed with the option), then DRIVERLEVEL_CACHE / DRIVERLEVEL_LINEINFO (their own message)."""
    monkeypatch.delenv("DRIVERLEVEL_LINEINFO", raising=False)
    monkeypatch.delenv("DRIVERLEVEL_CACHE", raising=False)
    assert _compile.check_compile_options(["sm_90,sm_120"]) == ["sm_90", "sm_120"]
    with pytest.raises(ValueError, match=r"^--arch: unsupported architecture"):
        _compile.check_compile_options(["sm_75"])
    monkeypatch.setenv("DRIVERLEVEL_LINEINFO", "2")
    with pytest.raises(ValueError, match=r"^DRIVERLEVEL_LINEINFO='2' is not understood"):
        _compile.check_compile_options(["sm_90"])


# -- DRIVERLEVEL_LINEINFO: -lineinfo for compute-sanitizer and Nsight Compute, cached under its own key ------------
@pytest.mark.parametrize("value, on", [("1", True), (" On ", True), ("yes", True), ("", False), ("0", False),
                                       ("off", False), ("NO", False)])
def test_lineinfo_values(monkeypatch, value, on):
    monkeypatch.setenv("DRIVERLEVEL_LINEINFO", value)
    assert _compile.lineinfo_requested() is on


def test_lineinfo_unset_is_off_and_a_typo_is_an_error_before_compiling(monkeypatch, count_compiles):
    monkeypatch.delenv("DRIVERLEVEL_LINEINFO", raising=False)
    assert _compile.lineinfo_requested() is False
    monkeypatch.setenv("DRIVERLEVEL_LINEINFO", "maybe")
    with pytest.raises(ValueError, match=r"^DRIVERLEVEL_LINEINFO='maybe' is not understood: use 1, on, true or yes"):
        compile_source('extern "C" __global__ void k() {}', "k.cu", "sm_90", use_cache=False)
    assert count_compiles == []


def test_lineinfo_puts_source_lines_in_the_cubin_under_another_key(fresh_cache, monkeypatch):
    src = 'extern "C" __global__ void k(float* x) { x[threadIdx.x] += 1.0f; }'
    monkeypatch.delenv("DRIVERLEVEL_LINEINFO", raising=False)
    plain = compile_source(src, "k.cu", "sm_90")
    monkeypatch.setenv("DRIVERLEVEL_LINEINFO", "1")
    lined = compile_source(src, "k.cu", "sm_90")
    assert "-lineinfo" in lined.options and "-lineinfo" not in plain.options
    assert b".debug_line" in lined.data and b".debug_line" not in plain.data
    assert lined.key != plain.key and not lined.cache_hit  # not the plain build's entry
    assert lined.resources["k"].registers == plain.resources["k"].registers


def test_a_loaded_entry_gets_a_new_modification_time(fresh_cache, header_dir):
    _compile_t(header_dir)
    (entry,) = _entries(fresh_cache)
    os.utime(entry, (1_000_000_000, 1_000_000_000))  # 2001
    _compile._clear_memory_cache()
    assert _compile_t(header_dir).cache_hit
    assert entry.stat().st_mtime > time.time() - 600


@pytest.mark.parametrize("exc, warns", [(PermissionError(errno.EPERM, "Operation not permitted"), False),
                                        (OSError(errno.EROFS, "Read-only file system"), False),
                                        (OSError(errno.EIO, "Input/output error"), True)])
def test_an_entry_that_cannot_be_touched_is_still_loaded(fresh_cache, header_dir, monkeypatch, exc, warns):
    _compile_t(header_dir)
    _compile._clear_memory_cache()

    def refuse(*a, **k):
        raise exc

    monkeypatch.setattr(_compile.os, "utime", refuse)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        assert _compile_t(header_dir).cache_hit
    texts = [str(w.message) for w in rec if issubclass(w.category, RuntimeWarning)]
    assert (len(texts) == 1 and "Input/output error" in texts[0] and "used all the same" in texts[0]) if warns \
        else texts == [], texts
