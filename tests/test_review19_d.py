"""Review 19 (d): the references' logits and bf16 converters, ``code_sections.py``, the reference
argument checks, ``compile_source``'s defines and options, and names and flags (CPU only).

Each test fails on the code before its fix.
"""

from __future__ import annotations

import numpy as np
import pytest

from driverlevel.reference import ddtree as R
from driverlevel.reference.attention import bf16_to_f32, f32_to_bf16


# --------------------------------------------------------------------------- M3: bf16 logits in reference.ddtree


def _bf16_logits(shape, seed=0):
    """Random logits rounded to bf16: (uint16 bits, the same values widened to float32)."""
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    bits = f32_to_bf16(x)
    return bits, bf16_to_f32(bits)


def test_row_argmax_reads_uint16_as_bf16_bits():
    bits = f32_to_bf16(np.array([[1.0, -1.0], [-3.0, -2.0]]))
    ids, finite = R.row_argmax(bits)
    assert ids.tolist() == [0, 1] and finite.all()


def test_topk_logprobs_reads_uint16_as_bf16_bits():
    bits, wide = _bf16_logits((3, 16))
    for got, want in zip(R.topk_logprobs(bits, 4), R.topk_logprobs(wide, 4)):
        np.testing.assert_array_equal(got, want)
    _, _, lse = R.topk_logprobs(np.array([[0x3F80, 0x4000]], np.uint16), 1)  # 1.0, 2.0
    assert lse[0] == pytest.approx(np.log(np.e + np.e ** 2), rel=1e-6)


def test_build_tree_and_greedy_accept_read_uint16_as_bf16_bits():
    bits, wide = _bf16_logits((1, 3, 16), seed=1)
    got, want = R.build_tree([1], bits, budget=4), R.build_tree([1], wide, budget=4)
    np.testing.assert_array_equal(got.tokens, want.tokens)
    n = int(want.node_counts[0])
    tbits, twide = _bf16_logits((n, 16), seed=2)
    a = R.greedy_accept(want, [0, n], tbits, [True], [0], 100, 3)
    b = R.greedy_accept(want, [0, n], twide, [True], [0], 100, 3)
    np.testing.assert_array_equal(a.posterior, b.posterior)
    np.testing.assert_array_equal(a.accepted_nodes, b.accepted_nodes)


@pytest.mark.parametrize("call", [
    lambda x: R.row_argmax(x),
    lambda x: R.topk_logprobs(x, 1),
    lambda x: R.build_tree([0], x[None], budget=2),
    lambda x: R.greedy_accept(R.build_tree([0], np.zeros((1, 1, 2), np.float32), budget=1), [0, 2],
                              np.concatenate([x, x])[:2], [True], [0], 100, 1),
])
@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.int16, np.uint32, np.bool_])
def test_integer_logits_are_refused(call, dtype):
    with pytest.raises(TypeError, match="float array, an ml_dtypes.bfloat16 array or uint16"):
        call(np.array([[1, 0]], dtype))


def test_ml_dtypes_bfloat16_logits_match_their_bits():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    bits, wide = _bf16_logits((1, 3, 16), seed=3)
    ml = bits.view(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(R.build_tree([1], ml, budget=4).tokens, R.build_tree([1], wide, budget=4).tokens)
    assert R.row_argmax(np.array([[1.0, -1.0]], ml_dtypes.bfloat16))[0].tolist() == [0]


# --------------------------------------------------------------------------- M4 / L1: tools/code_sections.py


def _code_sections():
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("code_sections_review19",
                                                  Path(__file__).parents[1] / "tools" / "code_sections.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


CS_SRC = r'''
__constant__ int T[4] = {1, 2, 3, 4};
__device__ int G[2] = {5, 6};
__device__ __noinline__ int helper(int x) { return x * 3 + T[x & 3]; }
extern "C" __global__ void __launch_bounds__(128, 1) k(int *out) {
    int i = threadIdx.x;
    out[i] = helper(i) + G[i & 1];
}
'''


@pytest.fixture(scope="module")
def cs_hashes():
    from driverlevel import compile_source

    mod = _code_sections()
    return lambda src: mod.section_hashes(compile_source(src, "k.cu", "sm_90", use_cache=False).data)


@pytest.mark.parametrize("old, new, section", [
    ("(128, 1)", "(128, 4)", ".nv.info.k"),         # min CTAs per SM: a register limit, same code
    ("(128, 1)", "(256, 1)", ".nv.info.k"),         # max threads per block
    ("{1, 2, 3, 4}", "{1, 2, 3, 5}", ".nv.constant3"),  # an initialised __constant__
    ("{5, 6}", "{5, 7}", ".nv.global.init"),        # an initialised __device__ global
])
def test_code_sections_sees_launch_attributes_and_initialised_globals(cs_hashes, old, new, section):
    base, changed = cs_hashes(CS_SRC), cs_hashes(CS_SRC.replace(old, new))
    assert base[".text.k"] == changed[".text.k"]  # the code alone would call these identical
    assert sorted(n for n in set(base) | set(changed) if base.get(n) != changed.get(n)) == [section]


@pytest.mark.parametrize("old, new", [
    ("int i = threadIdx.x;", "// a comment\n\n    int i = threadIdx.x;  /* another */"),
    ("helper", "helper_renamed"),                          # a device function's (mangled) name
    ("int helper(int x)", "int helper(unsigned x)"),       # ... and its parameter type
])
def test_code_sections_ignores_comments_and_names_that_are_not_code(cs_hashes, old, new):
    assert cs_hashes(CS_SRC) == cs_hashes(CS_SRC.replace(old, new))


def test_code_sections_hashes_relocations_by_symbol_name_not_index():
    """Symbol indices move with the symbol table: a relocation is hashed by the symbol's name."""
    import struct

    mod = _code_sections()
    rela = lambda sym: struct.pack("<QQq", 0x10, (sym << 32) | 2, 0)  # noqa: E731
    assert mod._relocations(rela(1), 24, ["", "G", "H"]) == mod._relocations(rela(2), 24, ["", "H", "G"])
    assert mod._relocations(rela(1), 24, ["", "G", "H"]) != mod._relocations(rela(2), 24, ["", "G", "H"])


def _run_code_sections(monkeypatch, tmp_path, capsys, before: dict, after: dict, *flags):
    import json

    mod = _code_sections()
    monkeypatch.setattr(mod, "hashes", lambda archs, kernels: after)
    (tmp_path / "before.json").write_text(json.dumps(before))
    rc = mod.main([str(tmp_path / "after.json"), "--arch", "sm_90", "--compare", str(tmp_path / "before.json"), *flags])
    return rc, capsys.readouterr().out


SAME = {".text.k": "aa"}


@pytest.mark.parametrize("before, after", [
    ({"argmax.cu sm_90 ": SAME, "selftest.cu sm_90 ": SAME}, {"argmax.cu sm_90 ": SAME}),
    ({"argmax.cu sm_90 ": SAME}, {"argmax.cu sm_90 ": SAME, "selftest.cu sm_90 ": SAME}),
])
def test_code_sections_compares_only_the_variants_of_both_files(monkeypatch, tmp_path, capsys, before, after):
    rc, out = _run_code_sections(monkeypatch, tmp_path, capsys, before, after)
    assert rc == 0, out
    assert "differs" not in out and "selftest.cu sm_90 " in out and "1 of 1 variants" in out
    rc, out = _run_code_sections(monkeypatch, tmp_path, capsys, before, after, "--strict")
    assert rc == 1


def test_code_sections_still_fails_on_a_difference_or_nothing_in_common(monkeypatch, tmp_path, capsys):
    before = {"argmax.cu sm_90 ": SAME, "selftest.cu sm_90 ": SAME}
    rc, out = _run_code_sections(monkeypatch, tmp_path, capsys, before, {"argmax.cu sm_90 ": {".text.k": "bb"}})
    assert rc == 1 and "differs: argmax.cu sm_90 : .text.k" in out
    rc, out = _run_code_sections(monkeypatch, tmp_path, capsys, {"argmax.cu sm_80 ": SAME}, {"argmax.cu sm_90 ": SAME})
    assert rc == 1 and "nothing was compared" in out


def test_code_sections_refuses_to_overwrite_the_file_it_compares_with(tmp_path, monkeypatch, capsys):
    mod = _code_sections()

    def refuse(*a, **k):
        raise AssertionError("compiled before the arguments were checked")

    monkeypatch.setattr(mod, "hashes", refuse)
    base = tmp_path / "base.json"
    base.write_text("{}")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        mod.main(["base.json", "--arch", "sm_90", "--compare", str(base)])
    assert e.value.code == 2 and "is the output file" in capsys.readouterr().err
    assert base.read_text() == "{}"


# --------------------------------------------------------------------------- L2 / L3: reference.attention

from driverlevel.reference.attention import (  # noqa: E402
    verify_attention_bruteforce,
    verify_attention_reference,
)


@pytest.mark.parametrize("empty", [[], ()])
def test_verify_attention_reference_takes_an_empty_list_of_kv_indices(empty):
    kw = dict(qo_indptr=[0, 2], kv_indptr=[0, 0], kv_indices=empty, out_cache_loc=[0, 1], mask=None,
              mask_format="causal", sm_scale=1.0, v_dim=2)
    for f in (verify_attention_reference, verify_attention_bruteforce):
        out, lse = f(np.ones((2, 1, 4)), np.ones((4, 4)), **kw)
        assert out.shape == (2, 1, 2) and np.isfinite(lse).all()


def test_empty_index_lists_still_refuse_floats_and_wrong_shapes():
    kw = dict(qo_indptr=[0, 2], kv_indptr=[0, 0], out_cache_loc=[0, 1], mask=None,
              mask_format="causal", sm_scale=1.0, v_dim=2)
    with pytest.raises(TypeError, match="kv_indices must be an integer array"):
        verify_attention_reference(np.ones((2, 1, 4)), np.ones((4, 4)), kv_indices=np.array([], np.float64), **kw)
    with pytest.raises(ValueError, match="kv_indices must be 1-D"):
        verify_attention_reference(np.ones((2, 1, 4)), np.ones((4, 4)), kv_indices=[[]], **kw)


def test_bruteforce_agrees_with_the_reference_when_every_score_is_minus_inf():
    q = np.ones((1, 1, 4))
    q[0, 0, 0] = -np.inf
    kw = dict(qo_indptr=[0, 1], kv_indptr=[0, 2], kv_indices=[0, 1], out_cache_loc=[2], mask=None,
              mask_format="causal", sm_scale=1.0, v_dim=2)
    want = verify_attention_reference(q, np.ones((3, 4)), **kw)
    got = verify_attention_bruteforce(q, np.ones((3, 4)), **kw)
    assert want[0].tolist() == [[[0.0, 0.0]]] and want[1].tolist() == [[-np.inf]]
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


def test_bruteforce_keeps_a_nan_score_nan_even_when_the_others_are_minus_inf():
    kv = np.ones((3, 4))
    kv[1, 0] = np.nan
    q = np.ones((1, 1, 4))
    q[0, 0, 1] = -np.inf
    kw = dict(qo_indptr=[0, 1], kv_indptr=[0, 2], kv_indices=[0, 1], out_cache_loc=[2], mask=None,
              mask_format="causal", sm_scale=1.0, v_dim=2)
    want = verify_attention_reference(q, kv, **kw)
    got = verify_attention_bruteforce(q, kv, **kw)
    assert np.isnan(want[1]).all()
    np.testing.assert_array_equal(got[1], want[1])


# --------------------------------------------------------------------------- L4: greedy_accept's counts, build_tree's top


def _deep_tree():
    """A depth-2 chain (root, 0 at depth 1, 0 at depth 2) and target logits that accept all of it."""
    lg = np.full((1, 2, 4), -5.0, np.float32)
    lg[0, :, 0] = 5.0
    tb = R.build_tree([3], lg, budget=2)
    assert tb.depths[0].tolist() == [0, 1, 2]
    tgt = np.full((3, 4), -5.0, np.float32)
    tgt[:, 0] = 5.0
    return tb, tgt


def test_greedy_accept_refuses_a_depth_limit_below_the_trees_depth():
    tb, tgt = _deep_tree()
    R.greedy_accept(tb, [0, 3], tgt, [True], [0], 100, 2)
    with pytest.raises(ValueError, match="request 0's tree has a node at depth 2, past depth_limit = 1"):
        R.greedy_accept(tb, [0, 3], tgt, [True], [0], 100, 1)


@pytest.mark.parametrize("max_context, depth_limit, exc", [
    (100, True, TypeError), (100, 2.0, TypeError), (100, "x", TypeError), (100, -1, ValueError),
    (2.5, 2, TypeError), (False, 2, TypeError), ("100", 2, TypeError), (-1, 2, ValueError),
])
def test_greedy_accept_checks_max_context_and_depth_limit(max_context, depth_limit, exc):
    tb, tgt = _deep_tree()
    name = "depth_limit" if max_context == 100 else "max_context"
    with pytest.raises(exc, match=name):
        R.greedy_accept(tb, [0, 3], tgt, [True], [0], max_context, depth_limit)
    R.greedy_accept(tb, [0, 3], tgt, [True], [0], np.int64(100), np.int32(2))  # numpy ints are ints


def test_build_tree_takes_top_as_lists():
    lg = np.random.default_rng(4).standard_normal((1, 2, 8)).astype(np.float32)
    want = R.build_tree([3], lg, budget=4)
    got = R.build_tree([3], None, budget=4, top=(want.top_ids.tolist(), want.top_lp.tolist()))
    np.testing.assert_array_equal(got.tokens, want.tokens)


# --------------------------------------------------------------------------- L5: the bf16 converters

from driverlevel._dtypes import bf16_bits_to_f32, f32_to_bf16_bits  # noqa: E402
from driverlevel.reference.attention import round_to_bf16  # noqa: E402


@pytest.mark.parametrize("f, x, want", [
    (f32_to_bf16, 1.0, 0x3F80), (f32_to_bf16_bits, np.float32(1.0), 0x3F80),
    (round_to_bf16, 1.0, 1.0), (bf16_bits_to_f32, 0x3F80, 1.0), (bf16_bits_to_f32, np.uint16(0x3F80), 1.0),
    (bf16_to_f32, np.uint16(0x3F80), 1.0),
])
def test_bf16_converters_keep_a_scalars_0d_shape(f, x, want):
    got = f(x)
    assert got.shape == () and got == want
    assert f(np.full((2, 3), x)).shape == (2, 3)


def test_both_f32_to_bf16_converters_keep_the_sign_of_nan():
    x = np.array([np.nan, -np.nan, 1.5, -np.inf, 3.4e38], np.float32)
    got = f32_to_bf16_bits(x)
    np.testing.assert_array_equal(got, f32_to_bf16(x))
    assert got[:2].tolist() == [0x7FC0, 0xFFC0]
    assert np.isnan(bf16_bits_to_f32(got[:2])).all() and np.signbit(bf16_bits_to_f32(got[:2])).tolist() == [False, True]


@pytest.mark.parametrize("bits", [1.5, np.array([1.0]), [True], np.float32(2)])
def test_bf16_bits_to_f32_refuses_what_is_not_integer_bits(bits):
    with pytest.raises(TypeError, match="bf16 bit patterns must be integers"):
        bf16_bits_to_f32(bits)


def test_bf16_bits_to_f32_refuses_integers_that_are_no_16_bit_pattern():
    with pytest.raises(ValueError, match=r"\[0, 0xFFFF\]"):
        bf16_bits_to_f32([0x3F80, 0x10000])
    with pytest.raises(ValueError, match=r"\[0, 0xFFFF\]"):
        bf16_bits_to_f32(np.array([-1], np.int32))
    assert bf16_bits_to_f32(np.array([-16512], np.int16)).tolist() == [-1.0]  # int16 0xBF80 by its bits
    assert bf16_bits_to_f32([0x3F80, 0xBF80]).tolist() == [1.0, -1.0]


# --------------------------------------------------------------------------- L6: compile_source's defines

import driverlevel as dl  # noqa: E402
from driverlevel import _compile  # noqa: E402

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


@pytest.mark.parametrize("value", [np.bool_(True), np.float32(1.0), 1 + 2j])
def test_compile_source_still_refuses_other_define_types(no_nvrtc, value):
    with pytest.raises(TypeError, match="must be an int, float, bool or str"):
        dl.compile_source(K_SRC, "k.cu", "sm_90", defines={"N": value}, use_cache=False)


# --------------------------------------------------------------------------- L8: names and flags

from driverlevel import ddtree as _ddtree  # noqa: E402
from driverlevel._mask import MaskFormat  # noqa: E402
from driverlevel.request_state import RequestState  # noqa: E402


def _plan_error(**kw):
    """What DDTreePlan(None, ...) raises: the device check (past every argument check) or an argument's error."""
    args = dict(max_batch=2, depth_limit=4, vocab=1000, budget=16, max_context=256)
    args.update(kw)
    with pytest.raises(Exception) as e:
        _ddtree.DDTreePlan(None, **args)
    return type(e.value), str(e.value)


def test_ddtree_plan_reads_mask_formats_and_topk_case_insensitively():
    past = _plan_error()  # only the device (None) is wrong
    assert "mask_formats" not in past[1] and "topk" not in past[1]
    assert _plan_error(mask_formats=("BITMASK", "Full"), topk="THRESHOLD") == past
    assert _plan_error(mask_formats=(MaskFormat.FULL, "qlen_only"), topk="Chunked") == past
    assert _plan_error(mask_formats=("causal",))[0] is ValueError
    assert _plan_error(topk="fast")[0] is ValueError


@pytest.mark.parametrize("flag", ["budgets", "remaining"])
@pytest.mark.parametrize("value", [1, 0, "no", None, 1.0])
def test_request_state_flags_must_be_bools(flag, value):
    with pytest.raises(TypeError, match=f"{flag} must be a bool"):
        RequestState.specs(max_batch=2, max_context=8, num_slots=16, **{flag: value})
    with pytest.raises(TypeError, match=f"{flag} must be a bool"):
        RequestState.allocate(None, max_batch=2, max_context=8, num_slots=16, **{flag: value})
    names = [n for n, _, _ in RequestState.specs(max_batch=2, max_context=8, num_slots=16, **{flag: np.bool_(True)})]
    assert flag in names


def test_cli_compile_lists_a_repeated_kernel_once(monkeypatch):
    from click.testing import CliRunner

    from driverlevel import cli

    seen = []
    real = cli.compile_variants

    def variants(filename, arch):
        seen.append(filename)
        return real(filename, arch)

    monkeypatch.setattr(cli, "compile_variants", variants)
    r = CliRunner().invoke(cli.main, ["compile", "--arch", "sm_90", "--kernel", "argmax.cu", "--kernel", "argmax.cu"])
    assert r.exit_code == 0, r.output
    assert seen.count("argmax.cu") == 1


# --------------------------------------------------------------------------- L9: ml_dtypes in the test extra


def test_the_test_extra_brings_ml_dtypes():
    """CI installs '.[test]': without ml_dtypes there, every ml_dtypes test is skipped and cannot fail."""
    import re
    from pathlib import Path

    text = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    test_extra = re.search(r"^test = \[(.*)\]$", text, re.M)
    assert test_extra and re.search(r'"ml_dtypes[^"]*"', test_extra.group(1)), test_extra
