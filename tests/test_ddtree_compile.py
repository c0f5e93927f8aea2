"""CPU tests of cu/ddtree.cu and its launcher: every kernel compiles for every architecture
without spills and within the shared-memory limit (its size summed in Python ints), the params struct
matches its ctypes mirror, and the plan's parameter checks name the argument (no GPU needed)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import driverlevel as dl
from driverlevel import ddtree
from driverlevel._compile import MAX_SHARED_PER_BLOCK, SUPPORTED_ARCHS
from driverlevel._mask import MaskFormat
from driverlevel._module import resolve_pdl
from ptx_util import ptx_entries, ptx_of

KERNELS = {
    "ddtree_topk_chunks_f32", "ddtree_topk_chunks_bf16", "ddtree_build", "ddtree_compile",
    "ddtree_accept", "ddtree_commit", "ddtree_commit_dense",
    "ddtree_topk_sample_f32", "ddtree_topk_sample_bf16", "ddtree_topk_stream_f32", "ddtree_topk_stream_bf16",
}


@pytest.mark.parametrize("topk", ddtree.TOPK_MODES)
@pytest.mark.parametrize("arch", SUPPORTED_ARCHS)
def test_every_kernel_compiles_without_spills(arch, topk):
    cub = dl.runtime.compile_file(ddtree.SOURCE, arch, ddtree.compile_defines(arch, topk))
    assert cub.data[:4] == b"\x7fELF"
    assert set(cub.resources) == KERNELS
    limit = MAX_SHARED_PER_BLOCK[arch]
    dynamic = ddtree.dynamic_shared_bytes(arch)
    for name, r in cub.resources.items():
        assert r.spills == 0 and r.stack_bytes == 0, f"{name} on {arch}: {r}"
        assert 0 < r.registers <= 128, f"{name} on {arch}: {r}"
        assert r.shared_bytes + dynamic.get(name, 0) <= limit, f"{name} on {arch}: {r}"
    # two 320-thread chunk CTAs per SM: at most 65536 / 640 registers per thread
    assert cub.resources["ddtree_topk_chunks_f32"].registers <= 102
    # the threshold top-K's stream kernel: as many 256-thread CTAs per SM as its segments
    # assume (_topk_threshold.STREAM_CTAS_PER_SM), registers allocated by 8
    from driverlevel._topk_threshold import STREAM_CTAS_PER_SM, STREAM_STATIC_BYTES, STREAM_THREADS
    for name in ("ddtree_topk_stream_f32", "ddtree_topk_stream_bf16"):
        regs = -(-cub.resources[name].registers // 8) * 8
        assert regs * STREAM_THREADS * STREAM_CTAS_PER_SM <= 65536, f"{name} on {arch}: {regs}"
        # the ring is sized with this bound of the static part (+ the 1 KB the driver reserves)
        assert cub.resources[name].shared_bytes + 1024 <= STREAM_STATIC_BYTES, f"{name} on {arch}"
        assert dynamic[name] % (16384 if name.endswith("f32") else 8192) == 0, f"{name} on {arch}: whole tiles"


@pytest.mark.parametrize("key, struct", [("DL_OFF_CP_seq_lens", "CompileParams.seq_lens"),
                                         ("DL_OFF_BD_vocab", "BuildParams.vocab"),
                                         ("DL_OFF_TK_tk_cand", "TopKParams.tk_cand"),
                                         ("DL_OFF_AC_argmax_part", "AcceptParams.argmax_part"),
                                         ("DL_OFF_CM_dense_window", "CommitParams.dense_window")])
def test_params_layout_drift_fails_the_compile(key, struct):
    defines = ddtree.compile_defines("sm_90")
    defines[key] += 8
    with pytest.raises(dl.NvrtcError) as ei:
        dl.runtime.compile_file(ddtree.SOURCE, "sm_90", defines, use_cache=False)
    assert f"{struct} offset differs from its ctypes mirror" in ei.value.log


def test_params_mirrors_are_packed_as_the_c_structs():
    """A struct per stage over the shared one: every size a multiple of 8 (so a derived struct's
    own fields start at its base's size, in C as in ctypes), the shared fields first."""
    sh = ddtree._Shared
    assert ctypes.sizeof(sh) == 2 * 8 + 8 * 4
    sizes = {}
    for prefix, cls in ddtree._STRUCTS.items():
        assert ctypes.sizeof(cls) % 8 == 0, prefix
        names = ddtree._struct_fields(cls)
        assert names[:len(sh._fields_)] == [n for n, _ in sh._fields_], prefix
        assert len(set(names)) == len(names), prefix
        sizes[prefix] = ctypes.sizeof(cls)
    assert ddtree._BuildParams.root_tokens.offset == sizes["TK"]
    assert ddtree._TopKParams.logits.offset == ddtree._AcceptParams.active.offset == sizes["SH"]
    # each stage's struct is far smaller than the one struct all stages shared (592 B)
    assert max(sizes.values()) <= 280, sizes


def test_a_field_of_one_name_has_one_type_in_every_stage():
    seen = {}
    for cls in ddtree._STRUCTS.values():
        for c in cls.__mro__:
            for n, t in c.__dict__.get("_fields_", ()):
                assert seen.setdefault(n, t) is t, n


def test_values_reject_a_name_no_stage_has():
    v = ddtree._Values()
    v.vocab = 7
    assert ddtree._pack(ddtree._AcceptParams, v).vocab == 7
    with pytest.raises(AttributeError, match="no DDTree params struct has a field 'vocabulary'"):
        v.vocabulary = 7


@pytest.mark.parametrize("args, exc, match", [
    ((-1, 8, 16), ValueError, "depth_limit must be"), ((0, 1, 1), ValueError, "depth_limit must be"),
    ((33, 8, 16), ValueError, "depth_limit must be"), ((15, 8, 0), ValueError, "budget must be"),
    ((15, 8, 513), ValueError, "budget must be"), ((15, 0, 16), ValueError, "k must be"),
    ((15, 17, 16), ValueError, "k must be"), ((True, 8, 16), TypeError, "depth_limit must be"),
    ((15, 8, 16.0), TypeError, "budget must be"),
])
def test_build_shared_bytes_refuses_what_no_plan_has(args, exc, match):
    """Was a number for (-1, 8, 16), (0, 0, 0) and (True, 8, 16): the ranges are DDTreePlan's."""
    with pytest.raises(exc, match=match):
        ddtree.build_shared_bytes(*args)


@pytest.mark.parametrize("depth, k, budget", [(15, 256, 256), (15, 512, 512), (32, 512, 512), (1, 1, 1), (4, 50, 100)])
def test_build_shared_bytes_formula(depth, k, budget):
    n = budget + 1
    words = -(-n // 32)
    union = max(8 * (1 << max(k - 1, 0).bit_length()), -(-4 * depth * k // 16) * 16 + 12 * n, 4 * n * words)
    union = -(-union // 16) * 16
    assert ddtree._build_union_bytes(depth, k, budget) == union
    assert ddtree.build_shared_bytes(depth, k, budget) == -(-(union + 5 * n) // 16) * 16
    # the largest plan fits the smallest per-block limit (sm_86 / sm_89 / sm_120: 99 KB)
    assert ddtree.dynamic_shared_bytes("sm_120")["ddtree_build"] + 4096 <= 101_376


def _plan(**kw):
    args = dict(max_batch=8, depth_limit=15, vocab=163840, budget=256, max_context=4096)
    args.update(kw)
    return ddtree.DDTreePlan(None, **args)


@pytest.mark.parametrize("kw, msg", [
    (dict(max_batch=0), "max_batch must be an int in 1 .. 1024, got 0"),
    (dict(max_batch=2000), "max_batch must be an int in 1 .. 1024, got 2000"),
    (dict(depth_limit=33), "depth_limit must be an int in 1 .. 32, got 33"),
    (dict(budget=513), "budget must be an int in 1 .. 512, got 513"),
    (dict(budget=0), "budget must be an int in 1 .. 512, got 0"),
    (dict(vocab=400_000, budget=512), "more than the row merge"),
    (dict(mask_formats=("bitmask", "dense")), "mask_formats must be a subset"),
])
def test_plan_rejects_bad_parameters_before_touching_the_device(kw, msg):
    with pytest.raises(ValueError, match=msg):
        _plan(**kw)


def test_mask_words_rejects_a_negative_budget():
    from driverlevel._constants import mask_words
    assert mask_words(0) == 1 and mask_words(31) == 1 and mask_words(32) == 2
    with pytest.raises(ValueError, match="budget must be an int >= 0, got -1"):
        mask_words(-1)


def test_plan_checks_pool_name_and_pdl_against_arch_before_the_device():
    with pytest.raises(TypeError, match="pool must be a WorkspacePool"):
        _plan(pool="x")
    with pytest.raises(TypeError, match="name must be a str"):
        _plan(name=3)
    with pytest.raises(ValueError, match="pdl=True needs sm_90"):
        _plan(arch="sm_86", pdl=True)
    with pytest.raises(ValueError, match="unsupported architecture 'sm_999': NVRTC"):  # (not DriverUnavailableError)
        _plan(arch="sm_999")
    with pytest.raises(TypeError, match="arch must be a str"):
        _plan(arch=object())


def test_plan_rejects_wrong_types():
    with pytest.raises(TypeError, match="budget must be an int"):
        _plan(budget=2.5)
    with pytest.raises(TypeError, match="max_batch must be an int"):
        _plan(max_batch=True)
    with pytest.raises(TypeError, match="logits_dtype must be float32 or bfloat16"):
        _plan(logits_dtype="float16")
    for name in ("logits_dtype", "target_dtype"):  # a name numpy does not know either: the argument is named
        with pytest.raises(TypeError, match=f"{name} must be float32 or bfloat16 .*\"bf16\".*got 'garbage'"):
            _plan(**{name: "garbage"})
    with pytest.raises(TypeError, match="mask_formats must be an iterable of format names"):
        _plan(mask_formats="full")  # (a str would be taken as its characters)


def test_vocab_limit_matches_the_merge_capacity():
    assert -(-163840 // ddtree.CHUNK) * 512 <= ddtree.MERGE_CAPACITY
    assert -(-184320 // ddtree.CHUNK) * 512 <= ddtree.MERGE_CAPACITY < -(-184321 // ddtree.CHUNK) * 512


def test_launcher_constants_match_the_kernel_source():
    """The shared constants reach the kernels only as defines from driverlevel._constants: the
    source spells no value of its own, and the launcher's re-exports are the same objects."""
    import re

    from driverlevel import _constants

    src = (dl._compile.kernel_source_dir() / ddtree.SOURCE).read_text()
    for sub in sorted((dl._compile.kernel_source_dir() / "ddtree").glob("*.cuh")):
        src += sub.read_text()
    const = {m.group(1): m.group(2) for m in re.finditer(r"constexpr int (\w+) = ([\w:]+);", src)}
    assert const["TOPK_THREADS"] == "DL_DDTREE_TOPK_THREADS" and const["TOPK_ELEMS"] == "DL_DDTREE_TOPK_ELEMS"
    assert const["BUILD_THREADS"] == "DL_DDTREE_BUILD_THREADS" and const["MERGE_ELEMS"] == "DL_DDTREE_MERGE_ELEMS"
    assert const["MAX_K"] == "DL_MAX_BUDGET" and const["SMALL_THREADS"] == "DL_DDTREE_SMALL_THREADS"
    for name in ("RECORD_HEADER", "FINISH_DONE", "FINISH_NONFINITE", "FLAG_LEGACY_SEARCH") + tuple(
            f"STATUS_{n}" for n in ("POOL_EXHAUSTED", "CONTEXT_FULL", "KV_CAPACITY", "MASK_CAPACITY", "NONFINITE")):
        assert const[name] == f"DL_{name}", name
    assert _constants.DDTREE_TOPK_THREADS * _constants.DDTREE_TOPK_ELEMS == ddtree.CHUNK
    assert _constants.DDTREE_BUILD_THREADS * _constants.DDTREE_MERGE_ELEMS == ddtree.MERGE_CAPACITY
    for name in ("RECORD_HEADER", "MAX_DEPTH", "MAX_BUDGET", "MAX_BATCH", "FINISH_DONE", "FINISH_NONFINITE",
                 "FLAG_LEGACY_SEARCH", "LP_FLOOR") + tuple(f"STATUS_{n}" for n in (
                     "POOL_EXHAUSTED", "CONTEXT_FULL", "KV_CAPACITY", "MASK_CAPACITY", "NONFINITE")):
        assert getattr(ddtree, name) == getattr(_constants, name), name
    d = ddtree.compile_defines("sm_90")
    for k, v in _constants.kernel_defines().items():
        assert d[k] == v


def test_each_topk_mode_compiles_its_own_merge():
    """The threshold plans' cubin holds the histogram merge (DL_DDTREE_HIST_MERGE=1), the chunked plans'
    does not, so the two ddtree_build kernels differ; a bad mode or a missing define is refused."""
    thr, chk = (ddtree.compile_defines("sm_90", t) for t in ("threshold", "chunked"))
    assert thr["DL_DDTREE_HIST_MERGE"] == 1 and chk["DL_DDTREE_HIST_MERGE"] == 0
    assert {k: v for k, v in thr.items() if k != "DL_DDTREE_HIST_MERGE"} == \
        {k: v for k, v in chk.items() if k != "DL_DDTREE_HIST_MERGE"}
    assert ddtree.compile_defines("sm_90") == thr  # the default plans' top-K
    assert ddtree.compile_defines("sm_90", "Chunked") == chk  # case-insensitive, as DDTreePlan's
    assert [(v.label, v.defines) for v in ddtree.compile_variants("sm_90")] == [("threshold", thr), ("chunked", chk)]
    for bad in ("fused", None, 1):
        with pytest.raises(ValueError, match="topk must be one of"):
            ddtree.compile_defines("sm_90", bad)
    a, b = (dl.runtime.compile_file(ddtree.SOURCE, "sm_90", d) for d in (thr, chk))
    assert a.data != b.data
    del chk["DL_DDTREE_HIST_MERGE"]
    with pytest.raises(dl.NvrtcError) as ei:
        dl.runtime.compile_file(ddtree.SOURCE, "sm_90", chk, use_cache=False)
    assert "compile with driverlevel.ddtree.compile_variants()" in ei.value.log


@pytest.mark.parametrize("arch", ["sm_90", "sm_120"])
def test_the_builds_rare_paths_stay_out_of_line(arch):
    """ddtree_build's rare paths are functions of their own in the cubin (__noinline__ in
    cu/ddtree/build.cuh), so that the common path runs straight on: after an L2 flush a jump over their
    inlined code cost the build 1-4 µs of instruction fetch (research/patches/README.md, `select-cold`).
    The threshold plans call the select and the sort out of line; the chunked plans, whose rows all take
    them, inline them. Both call the chunk fallback out of line."""
    cubins = {t: dl.runtime.compile_file(ddtree.SOURCE, arch, ddtree.compile_defines(arch, t)).data
              for t in ("threshold", "chunked")}
    assert b"select_row_cold" in cubins["threshold"] and b"select_row_cold" not in cubins["chunked"]
    assert all(b"chunk_fallback_row" in c for c in cubins.values())


@pytest.mark.parametrize("missing", ["DL_RECORD_HEADER", "DL_STATUS_POOL_EXHAUSTED", "DL_DDTREE_TOPK_THREADS"])
def test_a_missing_shared_constant_fails_the_compile(missing):
    defines = ddtree.compile_defines("sm_90")
    del defines[missing]
    with pytest.raises(dl.NvrtcError) as ei:
        dl.runtime.compile_file(ddtree.SOURCE, "sm_90", defines, use_cache=False)
    assert f"{missing} is not defined" in ei.value.log


def test_plan_over_int32_kv_indptr_is_rejected_before_the_gpu():
    """kv_indptr is int32: max_batch * max_context above 2**31 - 1 must fail at construction
    (issue 11 item 4: two requests of 1.1e9 prefix tokens wrapped to -2094967312)."""
    with pytest.raises(ValueError, match=r"max_batch \* max_context = 2 \* 1100000000") as ei:
        ddtree.DDTreePlan(None, max_batch=2, depth_limit=4, vocab=1000, budget=16, max_context=1_100_000_000)
    assert "int32" in str(ei.value) and "kv_indptr" in str(ei.value)
    with pytest.raises(ValueError, match="max_batch \\* max_context"):
        ddtree.DDTreePlan(None, max_batch=1024, depth_limit=4, vocab=1000, budget=16, max_context=2**21)


def test_compile_defines_carry_the_error_word_numbers():
    from driverlevel._device_error import error_defines

    d = ddtree.compile_defines("sm_90")
    for k, v in error_defines().items():
        assert d[k] == v


class _NeverRunDrafter:
    """A DraftModel that is never prepared nor run: the sizes are rejected before."""

    logits = None

    def prepare(self, root_tokens):
        raise AssertionError("prepare() reached")

    def run(self, stream):
        raise AssertionError("run() reached")


def test_runner_over_int32_kv_indptr_is_rejected_before_the_gpu():
    from driverlevel.runner import AutoregressiveRunner, DecodeStepRunner

    with pytest.raises(ValueError, match=r"max_batch \* max_context = 4 \* 1073741824"):
        AutoregressiveRunner(None, target_forward=lambda s, b: None, vocab_size=100, max_batch=4,
                             max_context=2**30, max_prompt_len=8)
    with pytest.raises(ValueError, match=r"max_batch \* max_context"):
        DecodeStepRunner(None, target_forward=lambda s, b: None, drafter=_NeverRunDrafter(), vocab_size=100, max_batch=2, budget=8,
                         max_context=1_100_000_000, max_prompt_len=8)


def test_cache_key_covers_every_stage_header():
    """ddtree.cu is one translation unit over cu/ddtree/*.cuh: every one of them (and common.cuh,
    constants.cuh, request_state.cuh, logit_keys.cuh, and phase_stamps.cuh, which ddtree/stamps.cuh
    includes as ../phase_stamps.cuh) is part of its compile cache key."""
    from driverlevel._compile import _local_headers, kernel_source_dir

    cu = kernel_source_dir()
    headers = _local_headers((cu / ddtree.SOURCE).read_text(), [cu])
    stages = {f"ddtree/{p.name}" for p in (cu / "ddtree").glob("*.cuh")}
    assert {"ddtree/topk.cuh", "ddtree/search.cuh", "ddtree/compile.cuh", "ddtree/accept.cuh",
            "ddtree/commit.cuh"} <= stages
    assert stages | {"common.cuh", "constants.cuh", "request_state.cuh", "logit_keys.cuh", "phase_stamps.cuh"} == set(headers)


# ------------------------------------------------------------------------------ programmatic launch


PDL_PROBE = """#include "common.cuh"
extern "C" __global__ void pdl_probe(int* x) {
  dl::pdl_launch_dependents();
  dl::pdl_wait();
  x[threadIdx.x] = 1;
}
"""


@pytest.mark.parametrize("arch", SUPPORTED_ARCHS)
def test_pdl_helpers_are_griddepcontrol_from_sm_90_and_empty_below(arch):
    """dl::pdl_wait / dl::pdl_launch_dependents (common.cuh) compile to griddepcontrol on sm_90,
    sm_100, sm_120 (ptxas accepts them) and to nothing on sm_80 / sm_86 / sm_89."""
    ptx = ptx_of(PDL_PROBE, "pdl_probe.cu", arch)
    sm90 = int(arch[3:]) >= 90
    assert ptx.count("griddepcontrol.wait;") == int(sm90), ptx
    assert ptx.count("griddepcontrol.launch_dependents;") == int(sm90), ptx
    cub = dl.runtime.compile_source(PDL_PROBE, "pdl_probe.cu", arch)
    assert cub.resources["pdl_probe"].spills == 0


def test_ddtree_kernels_wait_before_reading_their_predecessors():
    """In the PTX of cu/ddtree.cu (sm_90): the kernels a pdl build launches programmatically
    (stream, build) wait; the stream kernel issues its first tiles (cp.async) before its wait
    and reads the sample's flag after it; the sample, stream and chunk kernels (the first two
    threshold's, the last chunked's first kernel: ordinary launches without a wait) let their
    successor start; compile, accept and commit (programmatic with pdl) wait first, then let their
    successor start (tests/test_pdl_entry.py checks that nothing comes before the wait);
    commit_dense (an ordinary launch) uses neither."""
    ptx = ptx_entries(ptx_of((dl._compile.kernel_source_dir() / ddtree.SOURCE).read_text(), ddtree.SOURCE, "sm_90",
                        ddtree.compile_defines("sm_90")))
    for sfx in ("f32", "bf16"):
        stream = ptx[f"ddtree_topk_stream_{sfx}"]
        assert "griddepcontrol.wait;" in stream and "griddepcontrol.launch_dependents;" in stream
        assert stream.index("cp.async.cg.shared.global") < stream.index("griddepcontrol.wait;"), \
            "the stream kernel's first tiles are issued before its wait"
        chunks = ptx[f"ddtree_topk_chunks_{sfx}"]
        assert "griddepcontrol.wait;" not in chunks and "griddepcontrol.launch_dependents;" in chunks
        assert "griddepcontrol.launch_dependents;" in ptx[f"ddtree_topk_sample_{sfx}"]
        assert "griddepcontrol.wait;" not in ptx[f"ddtree_topk_sample_{sfx}"]  # the build's first: ordinary
    assert "griddepcontrol.wait;" in ptx["ddtree_build"]
    for name in ("ddtree_compile", "ddtree_accept", "ddtree_commit"):
        e = ptx[name]
        assert 0 <= e.find("griddepcontrol.wait;") < e.find("griddepcontrol.launch_dependents;"), name
    assert "griddepcontrol" not in ptx["ddtree_commit_dense"]


def test_pdl_option_resolves_per_arch():
    assert resolve_pdl(None, "sm_90") and resolve_pdl(None, "sm_120")
    assert not resolve_pdl(None, "sm_89") and not resolve_pdl(None, "sm_80")
    assert not resolve_pdl(False, "sm_100") and resolve_pdl(True, "sm_100")
    with pytest.raises(ValueError, match="pdl=True needs sm_90 or newer.*sm_86"):
        resolve_pdl(True, "sm_86")
    with pytest.raises(TypeError, match="pdl must be None, True or False"):
        _plan(pdl="on")


def _function_bytes(cubin: bytes, name: str) -> int:
    """Bytes of SASS of kernel ``name`` in a cubin: its ``.text`` section (tools/code_sections.py reads the ELF)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("code_sections", Path(__file__).parents[1] / "tools" / "code_sections.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return len(mod.elf_sections(cubin)[f".text.{name}"])


@pytest.mark.parametrize("arch", ["sm_90", "sm_120"])
def test_the_code_warmer_runs_the_search_code_not_a_copy(arch):
    """ddtree_build's warmer CTA must run the very instructions of the request's search (one call
    site of build_tree, a run-time flag): its code adds a few hundred bytes, not a second search."""
    on = dl.runtime.compile_file(ddtree.SOURCE, arch, ddtree.compile_defines(arch))
    off = dl.runtime.compile_file(ddtree.SOURCE, arch, {**ddtree.compile_defines(arch), "DL_BUILD_WARMER": 0})
    n_on, n_off = _function_bytes(on.data, "ddtree_build"), _function_bytes(off.data, "ddtree_build")
    assert n_off > 100_000  # (the search and the merge: ~14,000 instructions on sm_90)
    assert 0 < n_on - n_off < 0.05 * n_off, (n_on, n_off)


@pytest.mark.parametrize("arch", ["sm_90", "sm_120"])
def test_the_guess_skew_of_the_gpu_test_compiles_and_changes_the_code(arch):
    """test_count_children_guess_off_still_exact builds with -DDL_SEARCH_GUESS_SKEW (every count's
    float32 guess moved, so that the exact fallback runs): that variant compiles with no spills and
    no stack, and is not the plain cubin (the define reaches count_children)."""
    plain_defines = ddtree.compile_defines(arch)
    plain = dl.runtime.compile_file(ddtree.SOURCE, arch, plain_defines)
    for skew in (-1000, 3):
        skewed = dl.runtime.compile_file(ddtree.SOURCE, arch, {**plain_defines, "DL_SEARCH_GUESS_SKEW": skew})
        r = skewed.resources["ddtree_build"]
        assert r.spills == 0 and r.stack_bytes == 0, (skew, r)
        assert skewed.data != plain.data, skew


# -- shared memory and alignment sums in Python ints ---------------------------------------------------------
def test_shared_memory_and_alignment_sums_never_wrap():
    from driverlevel import ddtree
    from driverlevel._memory import align_up

    with np.errstate(over="ignore"):
        assert align_up(2**31 - 1, np.int32(256)) == 2**31
        big = np.int32(2**15)
        assert ddtree._build_union_bytes(big, big, np.int32(1)) == ddtree._build_union_bytes(2**15, 2**15, 1) >= 2**32
        assert ddtree.build_shared_bytes(np.int32(15), np.int32(256), np.int32(256)) == \
            ddtree.build_shared_bytes(15, 256, 256)
    with pytest.raises(TypeError):
        align_up(10.5, 8)  # was truncated


# -- check_merge_capacity takes ints only --------------------------------------------------------------------
@pytest.mark.parametrize("vocab, budget, exc, words", [
    (163840.9, 512, TypeError, "^vocab must be a positive int, got float 163840.9$"),
    (163840, 16.5, TypeError, "^budget must be a positive int, got float 16.5$"),
    (163840, True, TypeError, "^budget must be a positive int, got bool True$"),
    (np.float64(32768), 16, TypeError, r"^vocab must be a positive int, got float64 (np.float64\(32768.0\)|32768.0)$"),
    ("32768", 16, TypeError, "^vocab must be a positive int, got str '32768'$"),
    (0, 16, ValueError, "^vocab must be a positive int, got 0$"),
    (32768, -1, ValueError, "^budget must be a positive int, got -1$"),
])
def test_check_merge_capacity_refuses_what_is_not_a_positive_int(vocab, budget, exc, words):
    from driverlevel.ddtree import check_merge_capacity

    with pytest.raises(exc, match=words):
        check_merge_capacity(vocab, budget)


def test_check_merge_capacity_takes_numpy_ints_and_keeps_its_rule():
    from driverlevel.ddtree import check_merge_capacity

    check_merge_capacity(np.int64(163840), np.int32(512))
    with pytest.raises(ValueError, match="vocab=200000 at K=512 needs 27 chunks x 512 candidates"):
        check_merge_capacity(np.int64(200000), 512)


# -- mask_formats and topk in any case -----------------------------------------------------------------------
def _plan_error(**kw):
    """What DDTreePlan(None, ...) raises: the device check (past every argument check) or an argument's error."""
    args = dict(max_batch=2, depth_limit=4, vocab=1000, budget=16, max_context=256)
    args.update(kw)
    with pytest.raises(Exception) as e:
        ddtree.DDTreePlan(None, **args)
    return type(e.value), str(e.value)


def test_ddtree_plan_reads_mask_formats_and_topk_case_insensitively():
    past = _plan_error()  # only the device (None) is wrong
    assert "mask_formats" not in past[1] and "topk" not in past[1]
    assert _plan_error(mask_formats=("BITMASK", "Full"), topk="THRESHOLD") == past
    assert _plan_error(mask_formats=(MaskFormat.FULL, "qlen_only"), topk="Chunked") == past
    assert _plan_error(mask_formats=("causal",))[0] is ValueError
    assert _plan_error(topk="fast")[0] is ValueError
