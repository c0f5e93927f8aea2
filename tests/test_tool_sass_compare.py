"""tools/sass_compare.py (no GPU): the verdict on two kernels' instruction lists, and a whole run of
one kernel file at HEAD against the working tree (needs git, a checkout and nvdisasm)."""

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("sass_compare", REPO / "tools" / "sass_compare.py")
sc = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sc)


def test_opcode_keeps_modifiers_and_drops_the_predicate():
    assert sc.opcode("@!P1 IMAD.MOV.U32 R41, RZ, RZ, RZ") == "IMAD.MOV.U32"
    assert sc.opcode("@UP0 BRA `(.L_x_7)") == "BRA"
    assert sc.opcode("HMMA.16816.F32.BF16 R72, R88, R28, R72") == "HMMA.16816.F32.BF16"


def test_verdicts():
    a = ["MOV R1, RZ", "IMAD.MOV.U32 R2, RZ, RZ, RZ", "@P0 BRA `(.L_x_1)"]
    assert sc.classify(a, list(a)) == ("identical", {})
    # two independent moves swapped, other registers: the same work scheduled differently
    b = ["IMAD.MOV.U32 R3, RZ, RZ, RZ", "MOV R1, RZ", "@P1 BRA `(.L_x_1)"]
    assert sc.classify(a, b) == ("same opcodes", {})
    # one instruction more, one modifier changed: the counts that moved, nothing else
    c = ["MOV R1, RZ", "IMAD.MOV.U32 R2, RZ, RZ, RZ", "IMAD.IADD R2, R2, 0x1, R1", "@P0 BRA.U `(.L_x_1)"]
    assert sc.classify(a, c) == ("differs", {"BRA": (1, 0), "BRA.U": (0, 1), "IMAD.IADD": (0, 1)})
    # label numbers aside (a kernel added before this one renumbers them), branches compare by the
    # instruction they go to: the same targets are identical, swapped targets are not
    d = ["@P0 BRA `(.L_x_3)", ".L_x_4:", "BRA `(.L_x_3)", ".L_x_3:", "@P1 BRA `(.L_x_4)"]
    renumbered = [i.replace("_3", "_90").replace("_4", "_91") for i in d]
    assert sc.classify(d, renumbered) == ("identical", {})
    swapped = ["@P0 BRA `(.L_x_4)", ".L_x_3:", "BRA `(.L_x_4)", ".L_x_4:", "@P1 BRA `(.L_x_3)"]
    assert sc.classify(d, swapped) == ("identical", {})  # (the same program: labels swapped with their uses)
    targets_swapped = ["@P0 BRA `(.L_x_4)", ".L_x_4:", "BRA `(.L_x_3)", ".L_x_3:", "@P1 BRA `(.L_x_4)"]
    assert sc.classify(d, targets_swapped) == ("same opcodes", {})
    assert sc.instructions(d) == ["@P0 BRA `(.L_x_3)", "BRA `(.L_x_3)", "@P1 BRA `(.L_x_4)"]


def test_usage_errors_exit_2(capsys):
    for argv, words in ((["argmax.cu", "--rev", "no-such-rev-xyz"], "is not a commit"),
                        (["argmax.cu", "--arch", "sm_12"], "--arch")):
        with pytest.raises(SystemExit) as ei:
            sc.main(argv)
        assert ei.value.code == 2
        assert words in capsys.readouterr().err


def test_a_revision_before_the_compile_entry_points_is_a_usage_error(capsys):
    """A --rev older than driverlevel/runtime.py (which the comparison's compile step imports) is one
    usage error naming the file, not a traceback from the old tree's compile (where an editable
    install would fill the missing module from the working tree)."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs git and a git checkout")
    added = subprocess.run(["git", "log", "--diff-filter=A", "--format=%H", "--", "driverlevel/runtime.py"], cwd=REPO,
                           capture_output=True, text=True).stdout.split()
    if not added or subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{added[-1]}~1"], cwd=REPO,
                                   capture_output=True).returncode != 0:
        pytest.skip("the history before driverlevel/runtime.py is not in this checkout")
    with pytest.raises(SystemExit) as ei:
        sc.main(["argmax.cu", "--rev", f"{added[-1]}~1", "--arch", "sm_80"])
    assert ei.value.code == 2
    err = capsys.readouterr().err
    assert "has no driverlevel/runtime.py" in err and "Traceback" not in err


def test_head_against_itself_is_identical():
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs git and a git checkout")
    changed = subprocess.run(["git", "status", "--porcelain", "--", "cu", "driverlevel/argmax.py"], cwd=REPO,
                             capture_output=True, text=True).stdout.strip()
    if changed:
        pytest.skip("argmax.cu or its launcher has uncommitted changes")
    from cuda.pathfinder import find_nvidia_binary_utility
    if find_nvidia_binary_utility("nvdisasm") is None:
        pytest.skip("needs nvdisasm (pip install nvidia-cuda-nvdisasm)")
    r = subprocess.run([sys.executable, str(REPO / "tools" / "sass_compare.py"), "argmax.cu", "--rev", "HEAD",
                        "--arch", "sm_90"], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines and all(": identical (" in ln for ln in lines), r.stdout
    assert {ln.split("] ")[1].split(":")[0] for ln in lines} == {"argmax_rows_f32", "argmax_rows_bf16"}
