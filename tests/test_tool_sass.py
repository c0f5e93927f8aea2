"""tools/sass.py's schedule statistics on a hand-written SASS fragment, and its usage errors (no GPU,
no nvdisasm)."""

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location("sass_tool", Path(__file__).parents[1] / "tools" / "sass.py")
sass = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sass)


def test_ldsm_to_hmma_distances_and_opcodes():
    ins = [
        "LDSM.16.M88.4 R40, [R182]",          # 0: A fragment
        "LDSM.16.M88.4 R32, [R148]",          # 1: B fragment
        "IMAD R5, R6, 0x2, R7",               # 2
        "HMMA.16816.F32.BF16 R156, R40, R32, RZ",   # 3: A from 0, B from 1 -> distance 2
        "@P0 BRA 0x100",                      # 4
        "HMMA.16816.F32.BF16 R156, R40, R34, R156",  # 5: A from 0 (5), B R34 from 1 (4) -> 4
        "MOV R34, R5",                        # 6: R34 now written by a MOV (R35 still by LDSM 1)
        "HMMA.16816.F32.BF16 R172, R44, R34, RZ",   # 7: A never written, B: R35 from 1 -> 6
        "MOV R35, R5",                        # 8
        "HMMA.16816.F32.BF16 R176, R44, R34, RZ",   # 9: no operand from an LDSM -> not counted
    ]
    ops, dist = sass.stats(ins)
    assert ops == {"LDSM": 2, "IMAD": 1, "HMMA": 4, "BRA": 1, "MOV": 2}
    assert dist == {2: 1, 4: 1, 6: 1}


def test_disassembly_parser_keeps_instructions_of_each_kernel():
    text = """
//--------------------- .text.k1 --------------------------
.text.k1:
        /*0000*/                   LDC R1, c[0x0][0x28] ;
.L_x_1:
        /*0010*/               @P0 EXIT ;
//--------------------- .text.k2 --------------------------
.text.k2:
        /*0000*/                   HMMA.16816.F32.BF16 R4, R8, R12, RZ ;
"""
    kernels = sass.parse_nvdisasm(text)
    assert kernels == {"k1": ["LDC R1, c[0x0][0x28]", "@P0 EXIT"], "k2": ["HMMA.16816.F32.BF16 R4, R8, R12, RZ"]}


_cs_spec = importlib.util.spec_from_file_location("code_sections_tool",
                                                  Path(__file__).parents[1] / "tools" / "code_sections.py")
code_sections = importlib.util.module_from_spec(_cs_spec)
_cs_spec.loader.exec_module(code_sections)


def test_code_sections_checks_its_arguments_before_compiling(tmp_path, capsys):
    import pytest

    bad_json = tmp_path / "bad.json"
    bad_json.write_text("not json")
    for argv, words in [([str(tmp_path / "no" / "x.json")], "out: the directory"),
                        ([str(tmp_path / "o.json"), "--compare", str(bad_json)], "--compare"),
                        ([str(tmp_path / "o.json"), "--compare", str(tmp_path / "missing.json")], "--compare"),
                        ([str(tmp_path / "o.json"), "--kernel", "nope.cu"], "not a kernel file"),
                        ([str(tmp_path / "o.json"), "--arch", "sm_999"], "--arch")]:
        with pytest.raises(SystemExit) as e:
            code_sections.main(argv)
        assert e.value.code == 2
        assert words in capsys.readouterr().err
    assert not (tmp_path / "o.json").exists()  # nothing compiled, nothing written


def test_code_sections_compares_section_by_section(tmp_path, capsys):
    import json

    out = tmp_path / "a.json"
    assert code_sections.main([str(out), "--arch", "sm_90", "--kernel", "selftest.cu"]) == 0
    old = json.loads(out.read_text())
    assert old and all(any(n.startswith(".text") for n in v) for v in old.values())
    assert code_sections.main([str(tmp_path / "b.json"), "--arch", "sm_90", "--kernel", "selftest.cu",
                               "--compare", str(out)]) == 0
    key = next(iter(old))
    text = next(n for n in old[key] if n.startswith(".text"))
    old[key][text] = "0" * 16  # as if that kernel's code had changed
    out.write_text(json.dumps(old))
    assert code_sections.main([str(tmp_path / "c.json"), "--arch", "sm_90", "--kernel", "selftest.cu",
                               "--compare", str(out)]) == 1
    assert f"differs: {key}: {text}" in capsys.readouterr().out


# -- review 16 #9: usage errors exit 2 with the usage line, before anything is compiled ----------
def _no_compiles(monkeypatch):
    from driverlevel import _compile

    def refuse(*a, **k):
        raise AssertionError("compiled")

    monkeypatch.setattr(_compile, "_nvrtc_compile", refuse)


@pytest.mark.parametrize("argv, words", [
    (["argmax.cu", "--arch", "sm_75"], "--arch: unsupported architecture: 'sm_75' is older than sm_80"),
    (["argmax.cu", "--variant", "99"], "--variant 99 out of range 0..0 (see --list)"),
    (["argmax.cu", "--variant", "-1"], "--variant -1 out of range 0..0"),
    (["argmax.cu", "--kernel", "("], "--kernel '(' is not a regular expression"),
    (["verify_attention.cu", "--tile", "bogus"], "bad --tile 'bogus'"),
    (["argmax.cu", "--tile", "64x1x16x4w"], "--tile is for verify_attention.cu"),
    (["verify_attention.cu", "--tile", "64x1x16x4w", "--variant", "1"], "--tile and --variant each choose the variant"),
    (["verify_attention.cu", "--arch", "sm_120", "--tile", "64x1x64x4"], "of shared memory, sm_120 allows 101,376"),
])
def test_sass_usage_errors_exit_2_with_the_usage_line(monkeypatch, capsys, argv, words):
    _no_compiles(monkeypatch)
    with pytest.raises(SystemExit) as e:
        sass.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: ") and words in err


def test_sass_list_names_a_files_only_variant(monkeypatch, capsys):
    """argmax.cu's one variant has no label: --list printed a bare '  0  '."""
    _no_compiles(monkeypatch)
    assert sass.main(["argmax.cu", "--list"]) == 0
    assert capsys.readouterr().out == "  0  (the only variant)\n"
    assert sass.main(["verify_attention.cu", "--arch", "sm_90", "--list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) >= 2 and lines[0].startswith("  0  rows=")


@pytest.mark.parametrize("argv", [["verify_attention.cu", "--arch", "sm_90", "--tile", "native"],
                                  ["verify_attention.cu", "--arch", "sm_90", "--tile", "64x1x32x4wdg_20"],
                                  ["verify_attention.cu", "--arch", "sm_90"]])
def test_sass_compiles_sm_90s_wgmma_tile_for_sm_90a(monkeypatch, capsys, argv):
    """Review 27: --tile native on sm_90 compiled the wgmma tile for plain sm_90 (its #error)."""
    seen = []

    def fake_compile(filename, arch, defines, *a, **k):
        seen.append((arch, defines.get("DL_WS_WGMMA")))
        raise SystemExit(0)  # (stop before the disassembly)

    monkeypatch.setattr(sass, "compile_file", fake_compile, raising=False)
    import driverlevel.runtime as rt
    monkeypatch.setattr(rt, "compile_file", fake_compile)
    with pytest.raises(SystemExit):
        sass.main(argv)
    assert seen == [("sm_90a", 1)]


def test_sass_default_arch_is_driverlevel_compiles(monkeypatch, capsys):
    """The fresh-user trial: tools/sass.py defaulted to sm_90 while `driverlevel compile` takes GPU 0's
    architecture, or sm_120 without one. Both now ask the same function."""
    from driverlevel import cli

    _no_compiles(monkeypatch)
    monkeypatch.setattr(cli, "_default_arch", lambda: "sm_75")  # seen, then refused as any --arch is
    with pytest.raises(SystemExit) as e:
        sass.main(["argmax.cu", "--list"])
    assert e.value.code == 2 and "--arch: unsupported architecture: 'sm_75'" in capsys.readouterr().err


def test_sass_a_closed_output_is_one_line_not_a_traceback():
    """The fresh-user trial: `tools/sass.py argmax.cu | head -5` ended in a BrokenPipeError traceback."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[1]))
    p = subprocess.Popen([sys.executable, str(Path(__file__).parents[1] / "tools" / "sass.py"), "verify_attention.cu",
                          "--arch", "sm_90", "--list"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    p.stdout.close()  # the reader is gone before the first line
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 2
    assert err == "tools/sass.py: cannot write the output: Broken pipe\n"


def test_sass_a_kernel_expression_matching_nothing_is_a_usage_error(monkeypatch, capsys):
    """It printed the variant's header, then exited 1; the other bad arguments are usage errors (exit 2)."""
    monkeypatch.setattr(sass, "disassemble", lambda data, labels=False: {"argmax_rows_f32": [], "argmax_rows_bf16": []})
    with pytest.raises(SystemExit) as e:
        sass.main(["argmax.cu", "--kernel", "zzz"])
    out = capsys.readouterr()
    assert e.value.code == 2 and out.out == ""
    assert out.err.startswith("usage: ") and "--kernel 'zzz' matches none of ['argmax_rows_bf16', 'argmax_rows_f32']" in out.err


def test_sass_prints_the_branch_labels_but_does_not_count_them(monkeypatch, capsys):
    """A branch's target (``BRA `(.L_x_1)``) can be followed: the listing has ``.L_x_1:`` in place;
    ``--stats`` reads the instructions alone."""
    import types

    import driverlevel.runtime as runtime

    monkeypatch.setattr(runtime, "compile_file", lambda *a, **k: types.SimpleNamespace(data=b""))
    asked = []

    def fake_disassemble(cubin, labels=False):
        asked.append(labels)
        ins = ["@P0 BRA `(.L_x_1)", "MOV R1, R2", ".L_x_1:", "EXIT"]
        return {"argmax_rows_bf16": ins if labels else [i for i in ins if not i.endswith(":")]}

    monkeypatch.setattr(sass, "disassemble", fake_disassemble)
    assert sass.main(["argmax.cu", "--arch", "sm_90"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1:] == ["// argmax_rows_bf16: 3 instructions", "@P0 BRA `(.L_x_1)", "MOV R1, R2", ".L_x_1:", "EXIT"]
    assert sass.main(["argmax.cu", "--arch", "sm_90", "--stats"]) == 0
    assert "argmax_rows_bf16: 3 instructions; " in capsys.readouterr().out and asked == [True, False]
