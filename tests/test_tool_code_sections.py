"""tools/code_sections.py without a GPU: the per-section hashes of a cubin (launch attributes and initialised
globals count, comments and names do not, relocations by symbol name), the comparison with a saved file, and
the output path, checked before anything is compiled."""

from __future__ import annotations

import pytest


def _code_sections(monkeypatch=None):
    """``tools/code_sections.py`` as a fresh module. With ``monkeypatch``, a compile fails the test: the
    output path must be checked before anything is compiled."""
    import importlib.util
    from pathlib import Path

    from driverlevel import _compile

    spec = importlib.util.spec_from_file_location("code_sections_under_test",
                                                  Path(__file__).parents[1] / "tools" / "code_sections.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    if monkeypatch is not None:
        def refuse(*a, **k):
            raise AssertionError("compiled before the output path was checked")

        monkeypatch.setattr(mod, "hashes", refuse)
        monkeypatch.setattr(_compile, "_nvrtc_compile", refuse)
    return mod


# -- what the hashes see -------------------------------------------------------------------------------------
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


# -- --compare -----------------------------------------------------------------------------------------------
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


# -- the output path, checked before any compile -------------------------------------------------------------
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


# -- the --compare file's structure, checked before any compile ----------------------------------------------
@pytest.mark.parametrize("content, words", [
    ('{"argmax.cu sm_90 ": 5}', "variant 'argmax.cu sm_90 ' is a number (5), not an object of section hashes"),
    ('"str"', "not a code_sections.py file: a string ('str'), not an object of variants"),
    ("[1, 2]", "not a code_sections.py file: an array, not an object of variants"),
    ("null", "not a code_sections.py file: null, not an object of variants"),
    ('{"argmax.cu sm_90 ": {".text.k": 7}}', "section '.text.k' of variant 'argmax.cu sm_90 ' is a number (7), "
     "not a hash string"),
    ('{"argmax.cu sm_90 ": [".text.k"]}', "variant 'argmax.cu sm_90 ' is an array, not an object of section hashes"),
    ('{"argmax.cu": {".text.k": "aa"}}', "'argmax.cu' is not a variant ('FILE ARCH LABEL')"),
    ("{}", "holds no variants: nothing to compare with"),
])
def test_code_sections_checks_the_compare_files_structure_before_compiling(tmp_path, monkeypatch, capsys,
                                                                           content, words):
    """A --compare file of another structure ended, after every variant was compiled, in a TypeError traceback
    (``{"argmax.cu sm_90 ": 5}``) or in 'gone: s (not compared)' lines (``"str"``), exit status 1."""
    d = tmp_path / "D.json"
    d.write_text(content)
    err = _code_sections_error(_code_sections(monkeypatch), [str(tmp_path / "out.json"), "--kernel", "argmax.cu",
                                                             "--arch", "sm_90", "--compare", str(d)], capsys)
    line = err.splitlines()[-1]  # (argparse's usage before it)
    assert f": error: --compare {str(d)!r}: " in line and line.endswith(words), err
    assert "Traceback" not in err and not (tmp_path / "out.json").exists()


def test_code_sections_takes_its_own_output_as_the_compare_file(monkeypatch, tmp_path, capsys):
    """What main() writes is a --compare file it accepts (an empty label included)."""
    import json

    mod = _code_sections()
    written = {"argmax.cu sm_90 ": {".text.argmax": "00ff", ".nv.info": "aa"},
               "verify_attention.cu sm_90 rows=64 csplit=1 keys=32": {".text.k": "bb"}}
    monkeypatch.setattr(mod, "hashes", lambda archs, kernels: written)
    assert mod.main([str(tmp_path / "before.json"), "--arch", "sm_90"]) == 0
    assert mod.compare_file_problem(json.loads((tmp_path / "before.json").read_text())) is None
    assert mod.main([str(tmp_path / "after.json"), "--arch", "sm_90", "--compare", str(tmp_path / "before.json")]) == 0
    assert "2 of 2 variants in both files have identical code sections" in capsys.readouterr().out
