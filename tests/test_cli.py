"""The ``driverlevel`` command line through click's test runner (CPU only).

``info`` is tested with the driver simulated away (and with a fake GPU), ``compile``
with the real NVRTC, ``capture-demo`` and ``bench replay`` for their plain failures.
"""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

import driverlevel as dl
from driverlevel import cli
from driverlevel._compile import CompileVariant, Cubin, KernelResources
from driverlevel._device import DeviceProperties
from driverlevel._errors import CudaError, DriverUnavailableError


@pytest.fixture
def runner():
    return CliRunner()


def invoke(runner, *args):
    return runner.invoke(cli.main, list(args), catch_exceptions=False)


# -- help ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, words", [
    ([], ["info", "compile", "capture-demo", "bench", "NVRTC"]),
    (["info"], ["compute capability", "exits 0"]),
    (["compile"], ["--arch", "--kernel", "sm_120", "'all'", "sm_90a", "spill", "headroom", "Exits 1"]),
    (["capture-demo"], ["DDTree", "graph"]),
    (["bench"], ["replay"]),
    (["bench", "replay"], ["--nodes", "--replays", "--json", "cuGraphLaunch", "torch"]),
])
def test_help(runner, args, words):
    r = invoke(runner, *args, "--help")
    assert r.exit_code == 0, r.output
    for w in words:
        assert w in r.output, (w, r.output)


def test_version(runner):
    """``--version`` prints what ``info`` prints in its first line: ``driverlevel 0.1.0``."""
    r = invoke(runner, "--version")
    assert r.exit_code == 0 and r.output.strip() == f"driverlevel {dl.__version__}"


# -- info ----------------------------------------------------------------------------------------
def _no_driver():
    from driverlevel._device import NO_DRIVER_LIBRARY_MESSAGE

    raise DriverUnavailableError("cuInit", 100, "CUDA_ERROR_NO_DEVICE", NO_DRIVER_LIBRARY_MESSAGE,
                                 message=NO_DRIVER_LIBRARY_MESSAGE)


def test_info_without_driver(runner, monkeypatch):
    """Without libcuda info says so, not "no driver or no device" (a fresh-user trial's finding)."""
    from driverlevel._device import NO_DRIVER_LIBRARY_MESSAGE

    monkeypatch.setattr(cli, "init_driver", _no_driver)
    r = invoke(runner, "info")
    assert r.exit_code == 0
    lines = r.output.strip().splitlines()
    assert lines[0] == f"driverlevel {dl.__version__}"
    assert lines[1].startswith("NVRTC 13.")
    assert lines[-1] == (f"No NVIDIA GPU is usable on this machine: {NO_DRIVER_LIBRARY_MESSAGE} "
                         "(kernels can still be compiled with `driverlevel compile`).")
    assert "Traceback" not in r.output


def test_info_with_a_driver_and_no_device(runner, monkeypatch):
    monkeypatch.setattr(cli, "init_driver", lambda: None)
    monkeypatch.setattr(cli, "device_count", lambda: 0)
    r = invoke(runner, "info")
    assert r.exit_code == 0
    assert r.output.strip().splitlines()[-1] == (
        "No NVIDIA GPU is usable on this machine: the CUDA driver sees no device (CUDA_VISIBLE_DEVICES may hide "
        "them) (kernels can still be compiled with `driverlevel compile`).")


def test_info_when_the_driver_fails_to_initialise(runner, monkeypatch):
    def broken():
        raise CudaError("cuInit", 803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", "driver/library version mismatch")

    monkeypatch.setattr(cli, "init_driver", broken)
    r = invoke(runner, "info")
    assert r.exit_code == 0
    assert ("No NVIDIA GPU is usable on this machine (CUDA_ERROR_SYSTEM_DRIVER_MISMATCH): the CUDA driver is "
            "installed but failed to initialise") in r.output
    # a failure after the count (the driver's version) reports no GPU too, not a traceback
    monkeypatch.setattr(cli, "init_driver", lambda: None)
    monkeypatch.setattr(cli, "device_count", lambda: 1)
    monkeypatch.setattr(cli, "driver_version", broken)
    r = invoke(runner, "info")
    assert r.exit_code == 0 and "No NVIDIA GPU is usable on this machine (CUDA_ERROR_SYSTEM_DRIVER_MISMATCH)" in r.output


def test_info_on_this_machine_never_fails(runner):
    r = invoke(runner, "info")
    assert r.exit_code == 0
    if dl.device_count() == 0:
        assert "No NVIDIA GPU is usable on this machine" in r.output
    else:
        assert "GPU(s):" in r.output and "compute capability" in r.output


def test_info_with_a_fake_gpu(runner, monkeypatch):
    class FakeDevice:
        def __init__(self, i):
            self.properties = DeviceProperties(
                name="NVIDIA H200", compute_capability=(9, 0), sm_count=132,
                max_shared_memory_per_block_optin=232_448, max_shared_memory_per_block=49_152,
                l2_cache_bytes=60 << 20, total_memory_bytes=141 << 30)

        def mem_info(self):
            return 140 << 30, 141 << 30

    monkeypatch.setattr(cli, "init_driver", lambda: None)
    monkeypatch.setattr(cli, "device_count", lambda: 1)
    monkeypatch.setattr(cli, "driver_version", lambda: (13, 0))
    monkeypatch.setattr(cli, "Device", FakeDevice)
    r = invoke(runner, "info")
    assert r.exit_code == 0
    assert "CUDA driver supports CUDA 13.0; 1 GPU(s):" in r.output
    line = r.output.strip().splitlines()[-1]
    for w in ("[0] NVIDIA H200", "compute capability 9.0 (sm_90)", "132 SMs", "232,448 B opt-in", "49,152 B default",
              "L2 60 MiB", "143,360 MiB free of 144,384 MiB"):
        assert w in line, (w, line)


# -- compile -------------------------------------------------------------------------------------
def _rows(output):
    """Table rows as lists of cells (the file column may hold a bracketed variant label)."""
    out = []
    for line in output.splitlines()[2:]:
        if "]" in line:
            where, rest = line.split("]", 1)
            out.append([where + "]", *rest.split()])
        else:
            out.append(line.split())
    return out


def test_compile_sm120_every_kernel(runner):
    r = invoke(runner, "compile", "--arch", "sm_120")
    assert r.exit_code == 0, r.output
    header = r.stdout.splitlines()[0]
    assert header.split()[:4] == ["file", "kernel", "arch", "regs"]
    for col in ("static smem", "dynamic smem", "smem limit", "headroom", "spill B", "cache"):
        assert col in header
    for name in dl.runtime.kernel_sources():
        assert name in r.output
    assert "verify_attn_partial" in r.output and "noop" in r.output
    assert "SPILLS" not in r.output and "SMEM>LIMIT" not in r.output
    for row in _rows(r.stdout):
        static, dynamic, limit, headroom = (int(c.replace(",", "").replace("-", "0") or 0) if c != "-" else 0
                                            for c in row[4:8])
        assert limit == 101_376 and headroom == limit - static - dynamic >= 0, row


def test_compile_one_kernel_reports_cache_and_dynamic_smem(runner, fresh_cache):
    first = invoke(runner, "compile", "--arch", "sm_90", "--kernel", "selftest.cu")
    assert first.exit_code == 0, first.output
    rows = _rows(first.stdout)
    assert {row[1] for row in rows} >= {"noop", "reverse_f32_dynamic_smem", "block_sum_f32"}
    assert all(row[0] == "selftest.cu" and row[2] == "sm_90" for row in rows)
    assert all(row[-1] == "compiled" for row in rows)
    by_name = {row[1]: row for row in rows}
    assert by_name["reverse_f32_dynamic_smem"][4:8] == ["0", "65,536", "232,448", "166,912"]  # from selftest.py
    assert by_name["block_sum_f32"][4:8] == ["1,024", "-", "232,448", "231,424"]  # static from ptxas
    assert by_name["noop"][5] == "-"
    second = invoke(runner, "compile", "--arch", "sm_90", "--kernel", "selftest.cu")
    assert all(row[-1] == "hit" for row in _rows(second.stdout))


def test_compile_several_archs(runner):
    r = invoke(runner, "compile", "--arch", "sm_80,sm_100", "--kernel", "selftest.cu")
    assert r.exit_code == 0
    archs = {row[2] for row in _rows(r.stdout)}
    assert archs == {"sm_80", "sm_100"}


def test_compile_repeated_arch_takes_every_value(runner):
    """A repeated --arch adds to the list, as a repeated --kernel does (it kept only the last)."""
    r = invoke(runner, "compile", "--arch", "sm_80", "--arch", "sm_100,sm_80", "--kernel", "selftest.cu")
    assert r.exit_code == 0, r.output
    assert {row[2] for row in _rows(r.stdout)} == {"sm_80", "sm_100"}
    r = runner.invoke(cli.main, ["compile", "--arch", "all", "--arch", "sm_90"])
    assert r.exit_code == 2 and "'all' stands alone" in r.output and "--arch all --arch sm_90" in r.output
    r = runner.invoke(cli.main, ["compile", "--arch", "sm_90", "--arch", ""])
    assert r.exit_code == 2 and "empty architecture name in ''" in r.output


def test_compile_repeated_arch_all_is_all():
    """`--arch all` given twice still means every architecture (the values are not joined into 'all,all')."""
    assert cli._archs(("all", "ALL")) == list(cli.SUPPORTED_ARCHS)
    assert cli._archs(("sm_90", "sm_90,sm_80")) == ["sm_90", "sm_80"]


def test_compile_accepts_spellings_and_every_known_arch(runner):
    r = invoke(runner, "compile", "--arch", "SM_121,87", "--kernel", "selftest.cu")
    assert r.exit_code == 0, r.output
    assert {row[2] for row in _rows(r.stdout)} == {"sm_121", "sm_87"}


@pytest.mark.parametrize("arch, why", [
    ("sm_75", "'sm_75' is older than sm_80"),
    ("sm_999", "'sm_999' is not an architecture driverlevel knows"),
    ("foo", "'foo' is not an architecture name"),
    ("sm_90a", "'sm_90a' is an architecture-specific target"),
    ("sm_120a", "'sm_120a' is an architecture-specific target"),
    ("sm_100f", "'sm_100f' is a family-specific target"),
    ("compute_90", "'compute_90' is a virtual architecture"),
    ("sm_90,sm_12", "'sm_12' is older than sm_80"),
])
def test_compile_refuses_unsupported_archs(runner, arch, why):
    r = runner.invoke(cli.main, ["compile", "--arch", arch])
    assert r.exit_code == 2, r.output
    text = " ".join(r.output.split())  # click wraps the message
    assert "Invalid value for --arch: unsupported architecture: " + why in text
    assert "Supported: sm_80, sm_86, sm_87, sm_89, sm_90, sm_100, sm_103, sm_120, sm_121" in text
    assert "Traceback" not in r.output


@pytest.mark.parametrize("arch", ["sm_90,", ",sm_90", "sm_90,,sm_120", ","])
def test_compile_refuses_empty_names_in_the_list(runner, arch):
    r = runner.invoke(cli.main, ["compile", "--arch", arch])
    assert r.exit_code == 2, r.output
    assert "empty architecture name" in " ".join(r.output.split())


@pytest.mark.parametrize("arch", ["all,sm_90", "sm_90, ALL"])
def test_compile_all_stands_alone(runner, arch):
    r = runner.invoke(cli.main, ["compile", "--arch", arch])
    assert r.exit_code == 2, r.output
    assert "'all' stands alone" in " ".join(r.output.split())


def test_compile_suffixed_arch_names_the_plain_one(runner):
    r = runner.invoke(cli.main, ["compile", "--arch", "sm_90a"])
    assert "tile): use sm_90" in " ".join(r.output.split())


def test_compile_default_arch_of_an_unknown_gpu(runner, monkeypatch):
    monkeypatch.setattr(cli, "_default_arch", lambda: "sm_130")
    r = runner.invoke(cli.main, ["compile", "--kernel", "selftest.cu"])
    assert r.exit_code == 2
    assert "(GPU 0's; pass --arch to choose)" in " ".join(r.output.split())


def test_compile_bad_kernel(runner):
    r = runner.invoke(cli.main, ["compile", "--kernel", "nope.cu"])
    assert r.exit_code == 2 and "no kernel source 'nope.cu'" in r.output and "did you mean" not in r.output
    r = runner.invoke(cli.main, ["compile", "--kernel", "argmax"])  # the file name without .cu: a hint
    assert r.exit_code == 2 and " ".join(r.output.split()).endswith("did you mean --kernel argmax.cu?")


def _fake_compile(resources):
    def compile_file(filename, arch, defines=None, *a, **k):
        return Cubin(b"\x7fELF", arch, filename, (), resources, "", False, "k")

    return compile_file


def test_compile_fails_on_spills(runner, monkeypatch):
    monkeypatch.setattr(cli, "compile_file", _fake_compile(
        {"spilly": KernelResources(registers=255, spill_store_bytes=64, spill_load_bytes=32)}))
    r = runner.invoke(cli.main, ["compile", "--arch", "sm_120", "--kernel", "selftest.cu"])
    assert r.exit_code == 1
    assert "SPILLS" in r.output
    assert "selftest.cu:spilly (sm_120) spills 64 B stored and 32 B loaded per thread" in r.output


@pytest.mark.parametrize("nvrtc, hint", [((13, 0), True), ((13, 4), False)])
def test_compile_names_an_nvrtc_that_spills_the_defaults(runner, monkeypatch, nvrtc, hint):
    """NVRTC 13.0-13.3 spill the 48-row verify tile: a spill report then says which NVRTC is in use."""
    monkeypatch.setattr(cli, "compile_file", _fake_compile(
        {"spilly": KernelResources(registers=255, spill_store_bytes=64, spill_load_bytes=32)}))
    monkeypatch.setattr(cli, "nvrtc_version", lambda: nvrtc)
    r = runner.invoke(cli.main, ["compile", "--arch", "sm_120", "--kernel", "selftest.cu"])
    assert r.exit_code == 1
    line = "NVRTC 13.0 is in use; the kernels build without spills with NVRTC 13.4 or newer"
    assert (line in r.stderr) == hint
    assert ("pip install -U 'nvidia-cuda-nvrtc>=13.4,<14'" in r.stderr) == hint


def test_compile_fails_over_the_shared_memory_limit(runner, monkeypatch):
    monkeypatch.setattr(cli, "compile_file", _fake_compile({"big": KernelResources(registers=32, shared_bytes=1024)}))
    monkeypatch.setattr(cli, "compile_variants", lambda f, arch: [CompileVariant({}, {"big": 100_400})])
    r = runner.invoke(cli.main, ["compile", "--arch", "sm_120", "--kernel", "selftest.cu"])
    assert r.exit_code == 1
    assert "selftest.cu:big (sm_120) needs 101,424 B of shared memory per block, over the 101,376 B limit" in r.output
    assert _rows(r.stdout)[0][4:8] == ["1,024", "100,400", "101,376", "-48"]
    r = runner.invoke(cli.main, ["compile", "--arch", "sm_90", "--kernel", "selftest.cu"])
    assert r.exit_code == 0  # 227 KB on sm_90
    assert _rows(r.stdout)[0][6:8] == ["232,448", "131,024"]


def test_compile_reports_a_compile_error(runner, monkeypatch):
    def failing(filename, arch, defines=None, *a, **k):
        raise dl.NvrtcError("nvrtcCompileProgram", "NVRTC_ERROR_COMPILATION", "x.cu(1): error: oops", (), arch,
                            filename)

    monkeypatch.setattr(cli, "compile_file", failing)
    r = runner.invoke(cli.main, ["compile", "--arch", "sm_120", "--kernel", "selftest.cu"])
    assert r.exit_code == 1 and "selftest.cu (sm_120) failed to compile" in r.output and "oops" in r.output


def test_compile_progress_bar_on_stderr_counts_every_compile(runner, monkeypatch):
    """With stderr a terminal, a progress bar over the (file, variant, arch) compiles goes to stderr and ends
    at the total; stdout is the table alone (no bar text, no carriage returns)."""
    calls = []

    def fake(filename, arch, defines=None, *a, **k):
        calls.append((filename, arch))
        return _fake_compile({"k": KernelResources(registers=32)})(filename, arch, defines)

    monkeypatch.setattr(cli, "compile_file", fake)
    monkeypatch.setattr(cli, "compile_variants", lambda f, arch: [CompileVariant({}, {}, "a"),
                                                                  CompileVariant({"X": 1}, {}, "b")])
    monkeypatch.setattr(cli, "_stderr_is_tty", lambda: True)
    bars, real = [], cli._progress

    def recorded(total):
        bar = real(total)
        bar.mininterval = bar.miniters = 0  # draw every update
        bars.append(bar)
        return bar

    monkeypatch.setattr(cli, "_progress", recorded)
    r = runner.invoke(cli.main, ["compile", "--arch", "sm_90,sm_120", "--kernel", "selftest.cu"])
    assert r.exit_code == 0, r.output
    assert len(calls) == 4 and len(bars) == 1 and (bars[0].n, bars[0].total) == (4, 4)
    assert "compile" in r.stderr and "0/4" in r.stderr and "4/4" in r.stderr and "selftest.cu [b] sm_120" in r.stderr
    assert "\r" not in r.stdout and "4/4" not in r.stdout
    assert r.stdout.splitlines()[0].split()[:3] == ["file", "kernel", "arch"] and len(_rows(r.stdout)) == 4


def test_compile_no_progress_bar_when_stderr_is_not_a_terminal(runner, monkeypatch):
    """No bar text in a log or a pipe: one plain line per kernel NVRTC compiled, none for cache hits."""
    hits = iter([False, True])

    def compile_file(filename, arch, defines=None, *a, **k):
        return Cubin(b"\x7fELF", arch, filename, (), {"k": KernelResources(registers=32)}, "", next(hits), "k")

    monkeypatch.setattr(cli, "compile_file", compile_file)
    monkeypatch.setattr(cli, "_stderr_is_tty", lambda: False)
    r = runner.invoke(cli.main, ["compile", "--arch", "sm_90,sm_120", "--kernel", "selftest.cu"])
    assert r.exit_code == 0, r.output
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and re.fullmatch(r"compiled selftest\.cu for sm_90 in \d+\.\d s \(1/2\)", lines[0]), lines
    assert "\r" not in r.stderr and "compiled selftest" not in r.stdout


WARNING_LOG = ('w.cu(1): warning #177-D: variable "unused" was declared but never referenced\n'
               '  __global__ void k(int*p){int unused;}\n                               ^\n\n'
               "ptxas info    : 0 bytes gmem\nptxas info    : Compiling entry function '_Z1kPi' for 'sm_90'\n"
               "ptxas info    : Function properties for _Z1kPi\n"
               "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
               "ptxas info    : Used 8 registers, used 0 barriers\n")


def test_log_warnings():
    text = cli._log_warnings(WARNING_LOG)
    assert text.startswith('w.cu(1): warning #177-D: variable "unused"') and "ptxas info" not in text
    assert cli._log_warnings(WARNING_LOG.split("\n\n")[1]) == ""  # the resource report alone
    assert cli._log_warnings("") == "" and cli._log_warnings(None) == ""
    assert cli._log_warnings("ptxas warning : Registers are spilled\n") == "ptxas warning : Registers are spilled"


def test_compile_prints_nvrtc_warnings_on_stderr_after_the_table(runner, monkeypatch):
    def warned(filename, arch, defines=None, *a, **k):
        return Cubin(b"\x7fELF", arch, filename, (), {"k": KernelResources(registers=8)}, WARNING_LOG, False, "k")

    monkeypatch.setattr(cli, "compile_file", warned)
    monkeypatch.setattr(cli, "compile_variants", lambda f, arch: [CompileVariant({}, {}, "a")])
    r = runner.invoke(cli.main, ["compile", "--arch", "sm_90,sm_120", "--kernel", "selftest.cu"])
    assert r.exit_code == 0, r.output  # warnings do not fail the command
    assert "warning" not in r.stdout
    assert r.stderr.count('warning #177-D: variable "unused"') == 1  # the same text once, naming where
    assert "NVRTC warnings compiling selftest.cu [a] (sm_90), selftest.cu [a] (sm_120):" in r.stderr
    assert r.output.index("selftest.cu [a]  k") < r.output.index("NVRTC warnings")  # after the table


def test_compile_of_the_real_kernels_has_no_warning_text(runner):
    r = runner.invoke(cli.main, ["compile", "--arch", "sm_90", "--kernel", "selftest.cu"])
    assert r.exit_code == 0 and "NVRTC warnings" not in r.stderr


def test_every_kernel_source_has_a_registered_launcher():
    import importlib

    assert set(cli.LAUNCHERS) == set(dl.runtime.kernel_sources())
    for filename, name in cli.LAUNCHERS.items():
        mod = importlib.import_module(name)
        assert hasattr(mod, "compile_variants") or hasattr(mod, "compile_defines"), name
        for arch in ("sm_80", "sm_90", "sm_120"):
            variants = cli.compile_variants(filename, arch)
            assert variants and all(isinstance(v, CompileVariant) for v in variants)
            assert len({v.label for v in variants}) == len(variants)  # labels tell variants apart


def test_a_source_without_a_launcher_fails_the_command(runner, monkeypatch):
    monkeypatch.setattr(cli, "LAUNCHERS", {k: v for k, v in cli.LAUNCHERS.items() if k != "selftest.cu"})
    r = runner.invoke(cli.main, ["compile", "--arch", "sm_120", "--kernel", "selftest.cu"])
    assert r.exit_code == 1
    assert "selftest.cu (sm_120): its compile variants could not be computed: selftest.cu has no launcher " \
           "registered in driverlevel.cli.LAUNCHERS" in r.output


def test_compile_variants_come_from_the_launcher():
    from driverlevel import selftest

    (v,) = cli.compile_variants("selftest.cu", "sm_90")
    assert v == selftest.compile_variants("sm_90")[0]
    assert v.label == "" and v.defines == selftest.compile_defines("sm_90")
    assert v.dynamic_shared == {"reverse_f32_dynamic_smem": 65536}


def test_compile_variants_of_the_modules_without_the_hook_yet():
    from driverlevel import ddtree, runner

    for filename, mod in (("ddtree.cu", ddtree), ("runner.cu", runner)):
        if hasattr(mod, "compile_variants"):
            continue  # the module declares its own now
        (v,) = cli.compile_variants(filename, "sm_90")
        assert v.defines == mod.compile_defines("sm_90") and v.dynamic_shared == mod.dynamic_shared_bytes("sm_90")


def test_compile_variants_of_verify_attention_follow_the_plan():
    from driverlevel import verify_attention as va
    from driverlevel._device_error import error_defines
    from driverlevel._module import struct_layout_defines

    for arch in ("sm_80", "sm_90", "sm_120"):
        variants = cli.compile_variants("verify_attention.cu", arch)
        cfg = va.tile_config(arch)
        first = variants[0]
        limits = dict(DL_VA_MAX_BATCH=va.MAX_BATCH, DL_VA_MAX_PARTS=va.MAX_PARTS, DL_VA_REQUEST_BYTES=40,
                      DL_VA_CUT_BYTES=16, DL_VA_ENTRY_BYTES=48)
        assert first.defines == {**cfg.defines(), **error_defines(), **struct_layout_defines(va._Params), **limits,
                                 "DL_SMEM_BYTES": cfg.shared_bytes}
        assert first.defines == va.compile_defines(arch)  # what VerifyAttention compiles with
        assert first.dynamic_shared == {"verify_attn_partial": cfg.shared_bytes}
        for rows in range(1, 4097):  # whatever the plan picks is among the variants, with its exact defines
            want = va.compile_defines(arch, va.tile_config(arch, rows))
            assert any(v.defines == want for v in variants), (arch, rows)


# -- capture-demo and bench ----------------------------------------------------------------------
def test_capture_demo_is_the_demo_command():
    from driverlevel.demo import capture_demo as demo_cli

    assert cli.main.commands["capture-demo"] is demo_cli.capture_demo


def test_bench_replay_without_gpu(runner, monkeypatch):
    from driverlevel import _device

    monkeypatch.setattr(_device, "device_count", lambda: 0)
    r = runner.invoke(cli.main, ["bench", "replay", "--replays", "100", "--repeats", "1"])
    assert r.exit_code == 2
    assert r.output.strip() == _device.NO_GPU_MESSAGE


@pytest.mark.parametrize("args, says", [
    (["--device", "3"], "--device 3: only 1 GPU(s) visible"),
    (["--json", "/nonexistent-dir/replay.json"], "--json: the directory '/nonexistent-dir' does not exist"),
])
def test_bench_replay_usage_errors_before_measuring(runner, monkeypatch, args, says):
    from driverlevel import _device, bench_replay

    monkeypatch.setattr(_device, "device_count", lambda: 1)
    monkeypatch.setattr(bench_replay, "run", lambda *a, **k: pytest.fail("measured despite a usage error"))
    r = runner.invoke(cli.main, ["bench", "replay", *args])
    assert r.exit_code == 2 and says in r.output and "Traceback" not in r.output


def test_bench_replay_device_past_the_gpus_with_json_to_stdout_is_a_json_object(runner, monkeypatch):
    from driverlevel import _device, bench_replay

    monkeypatch.setattr(_device, "gpu_usable", lambda: True)
    monkeypatch.setattr(_device, "device_count", lambda: 1)
    monkeypatch.setattr(bench_replay, "run", lambda *a, **k: pytest.fail("measured despite a usage error"))
    r = runner.invoke(cli.main, ["bench", "replay", "--device", "3", "--json", "-"])
    assert r.exit_code == 2
    assert json.loads(r.stdout) == {"error": "--device 3: only 1 GPU(s) visible (ordinals 0 to 0)", "exit_status": 2}
    assert r.stderr.strip() == "--device 3: only 1 GPU(s) visible (ordinals 0 to 0)"


def _fake_replay_result():
    from driverlevel.bench_replay import ReplayRow

    row = ReplayRow(nodes=10, ours_host_us=5.0, raw_host_us=4.5, eager_host_us_per_step=30.0, ours_gpu_us=2.0,
                    eager_gpu_us_per_step=20.0)
    return {"device": "Fake GPU", "arch": "sm_90", "driver_cuda": "12.8", "torch": None, "repeats": 1,
            "replays": 100, "rows": [row]}


@pytest.mark.parametrize("to_stdout", [True, False])
def test_bench_replay_json_stdout_is_json_only(runner, monkeypatch, tmp_path, to_stdout):
    """``--json -``: stdout is the JSON alone (``| jq`` parses it), the table goes to stderr;
    ``--json FILE``: the table stays on stdout and the file holds the JSON."""
    import json

    from driverlevel import _device, bench_replay

    monkeypatch.setattr(_device, "gpu_usable", lambda: True)
    monkeypatch.setattr(_device, "device_count", lambda: 1)
    monkeypatch.setattr(bench_replay, "run", lambda *a, **k: _fake_replay_result())
    path = "-" if to_stdout else str(tmp_path / "r.json")
    r = runner.invoke(cli.main, ["bench", "replay", "--json", path])
    assert r.exit_code == 0, r.output
    if to_stdout:
        d = json.loads(r.stdout)
        assert "graph replay latency" in r.stderr and "ours/raw worst" in r.stderr
    else:
        d = json.loads((tmp_path / "r.json").read_text())
        assert "graph replay latency" in r.stdout and "{" not in r.stdout
    assert d["device"] == "Fake GPU" and d["rows"][0]["nodes"] == 10


@pytest.mark.parametrize("nodes", ["0", "a,b", ""])
def test_bench_replay_bad_nodes(runner, nodes):
    r = runner.invoke(cli.main, ["bench", "replay", "--nodes", nodes])
    assert r.exit_code == 2 and "--nodes" in r.output


_NODES_HINT = "give kernel counts 1 to 1,000 separated by single commas, e.g. 1,10,50"


@pytest.mark.parametrize("nodes, words", [
    ("1,,2", f"empty item in '1,,2': {_NODES_HINT}"),
    ("1,", f"empty item in '1,': {_NODES_HINT}"),
    (" , ", f"no kernel counts in ' , ': {_NODES_HINT}"),
    ("a,b", f"'a' in 'a,b' is not an integer: {_NODES_HINT}"),
    ("0,5", f"0 in '0,5' is below 1: {_NODES_HINT}"),
    ("5,-3", f"-3 in '5,-3' is below 1: {_NODES_HINT}"),
    ("1,1001", f"1,001 in '1,1001' is above 1,000 kernels per graph: {_NODES_HINT}"),
    ("abc", f"'abc' is not an integer: {_NODES_HINT}"),  # (one item: not "'abc' in 'abc'")
    ("5000", f"5,000 is above 1,000 kernels per graph: {_NODES_HINT}"),
])
def test_bench_replay_nodes_refuse_an_empty_item_as_devices_does(runner, monkeypatch, nodes, words):
    """Review 17 L11: --nodes 1,,2 was accepted (the empty item dropped) while capture-demo --devices 0,,1
    is refused. Every refusal names what is wrong, then the same hint (they were worded differently)."""
    from driverlevel import _device

    monkeypatch.setattr(_device, "gpu_usable", lambda: pytest.fail("GPU check before the --nodes check"))
    r = runner.invoke(cli.main, ["bench", "replay", "--nodes", nodes])
    assert r.exit_code == 2
    assert f"Invalid value for --nodes: {words}\n" in r.stderr


def test_bench_replay_node_counts():
    from driverlevel.bench_replay import parse_node_counts

    assert parse_node_counts("1,10,50") == [1, 10, 50] and parse_node_counts(" 1 , 2 ") == [1, 2]


def test_compile_of_a_target_the_nvrtc_lacks_is_a_problem_line_not_a_traceback(runner, monkeypatch):
    from driverlevel._compile import UnsupportedTargetError

    def lacks(filename, arch, defines=None, *a, **k):
        raise UnsupportedTargetError(f"unsupported architecture {arch!r}: NVRTC 99.0 compiles for sm_80")

    monkeypatch.setattr(cli, "compile_file", lacks)
    monkeypatch.setattr(cli, "compile_variants", lambda f, arch: [CompileVariant({}, {}, "a")])
    r = runner.invoke(cli.main, ["compile", "--arch", "sm_90", "--kernel", "selftest.cu"])
    assert r.exit_code == 1, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)  # no traceback
    assert "failed to compile" in r.stderr and "NVRTC 99.0 compiles for sm_80" in r.stderr


def test_compile_unwritable_cache_is_one_plain_warning_line(runner, tmp_path, monkeypatch):
    """Review 15 #12: the RuntimeWarning pointed at click's core.py and printed a line of click's source."""
    f = tmp_path / "afile"
    f.write_text("x")
    monkeypatch.setenv("DRIVERLEVEL_CACHE_DIR", str(f))
    monkeypatch.delenv("DRIVERLEVEL_CACHE", raising=False)
    from driverlevel import _compile

    _compile._clear_memory_cache()
    try:
        r = invoke(runner, "compile", "--arch", "sm_90", "--kernel", "selftest.cu")
    finally:
        _compile._clear_memory_cache()
    assert r.exit_code == 0, r.output
    assert [line for line in r.stderr.splitlines() if not line.startswith("compiled selftest.cu for sm_90 in ")] == [
        f"warning: could not write the cubin cache in DRIVERLEVEL_CACHE_DIR={f}: it is not a directory; compiling "
        f"without the disk cache (set DRIVERLEVEL_CACHE_DIR to a writable directory, or DRIVERLEVEL_CACHE=0)"]
    assert "click" not in r.stderr and "RuntimeWarning" not in r.stderr
    assert _rows(r.stdout)


def test_compile_unknown_cache_value_is_a_usage_error(runner, monkeypatch):
    monkeypatch.setenv("DRIVERLEVEL_CACHE", "maybe")
    r = invoke(runner, "compile", "--arch", "sm_90", "--kernel", "selftest.cu")
    assert r.exit_code == 2
    assert r.stderr.startswith("Error: DRIVERLEVEL_CACHE='maybe' is not understood")
    assert r.stdout == ""


def test_compile_without_an_nvrtc_library_is_one_line(runner, monkeypatch):
    """Review 76: with no NVRTC library visible (a --no-deps install), `driverlevel compile` died
    with cuda.pathfinder's DynamicLibNotFoundError traceback, where `info` said it in one line."""
    from cuda.pathfinder import DynamicLibNotFoundError

    def missing():
        raise DynamicLibNotFoundError("Failure finding libnvrtc.so")

    monkeypatch.setattr(cli, "nvrtc_version", missing)
    monkeypatch.setattr(cli, "compile_file", lambda *a, **k: pytest.fail("compiled"))
    r = invoke(runner, "compile", "--arch", "sm_90", "--kernel", "selftest.cu")
    assert r.exit_code == 1 and r.stdout == ""
    assert r.stderr == ("Error: NVRTC is not usable here (DynamicLibNotFoundError: Failure finding libnvrtc.so); "
                        "`driverlevel info` says what it finds\n")


def test_compile_unknown_lineinfo_value_is_a_usage_error(runner, monkeypatch):
    monkeypatch.setenv("DRIVERLEVEL_LINEINFO", "maybe")
    monkeypatch.setattr(cli, "compile_file", lambda *a, **k: pytest.fail("compiled"))
    r = invoke(runner, "compile", "--arch", "sm_90", "--kernel", "selftest.cu")
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr.startswith("Error: DRIVERLEVEL_LINEINFO='maybe' is not understood")


@pytest.mark.parametrize("args, json_out", [(["--json", "-"], True), ([], False)])
def test_bench_replay_json_stdout_without_gpu_is_an_error_object(runner, monkeypatch, args, json_out):
    """Review 15 #11: ``bench replay --json -`` wrote nothing to stdout without a GPU, while
    ``capture-demo --json`` writes ``{"error": ..., "exit_status": 2}``; both now do (the same code)."""
    import json

    from driverlevel import _device

    monkeypatch.setattr(_device, "device_count", lambda: 0)
    r = runner.invoke(cli.main, ["bench", "replay", *args])
    demo = runner.invoke(cli.main, ["capture-demo", *(["--json"] if json_out else [])])
    assert r.exit_code == demo.exit_code == 2
    assert r.stderr.strip() == demo.stderr.strip() == _device.NO_GPU_MESSAGE
    if json_out:
        assert json.loads(r.stdout) == json.loads(demo.stdout) == {"error": _device.NO_GPU_MESSAGE, "exit_status": 2}
    else:
        assert r.stdout == demo.stdout == ""


def test_bench_replay_json_path_checked_before_the_gpu(runner, monkeypatch):
    from driverlevel import _device

    monkeypatch.setattr(_device, "gpu_usable", lambda: pytest.fail("GPU check before the --json path's"))
    r = runner.invoke(cli.main, ["bench", "replay", "--json", "/nonexistent-dir/x.json"])
    assert r.exit_code == 2
    assert "Invalid value for --json: the directory '/nonexistent-dir' does not exist" in r.stderr
    assert r.stdout == ""


def test_bench_replay_json_empty_path_is_called_empty(runner, monkeypatch):
    """Review 17 L9: --json '' was called a directory (Path('') is '.')."""
    from driverlevel import _device

    monkeypatch.setattr(_device, "gpu_usable", lambda: pytest.fail("GPU check before the --json path's"))
    r = runner.invoke(cli.main, ["bench", "replay", "--json", ""])
    assert r.exit_code == 2
    assert "Invalid value for --json: '' is an empty path, not a file\n" in r.stderr


# -- compile lists a repeated --kernel once ------------------------------------------------------------------
@pytest.fixture
def compiled_files(monkeypatch):
    """The kernel files ``driverlevel compile`` asks the variants of, in order (a spy on compile_variants)."""
    seen = []
    real = cli.compile_variants

    def variants(filename, arch):
        seen.append(filename)
        return real(filename, arch)

    monkeypatch.setattr(cli, "compile_variants", variants)
    return seen


def test_cli_compile_lists_a_repeated_kernel_once(compiled_files):
    from click.testing import CliRunner

    seen = compiled_files
    r = CliRunner().invoke(cli.main, ["compile", "--arch", "sm_90", "--kernel", "argmax.cu", "--kernel", "argmax.cu"])
    assert r.exit_code == 0, r.output
    assert seen.count("argmax.cu") == 1


def test_ctrl_c_is_one_line_and_status_130(runner, monkeypatch):
    """Ctrl-C in a command (here while info looks for the driver) exits 130, as a shell reports SIGINT,
    which a script can tell from a failed compile's 1 (click's own handling printed "Aborted!" and
    exited 1; a fresh-user trial's finding)."""
    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "init_driver", interrupted)
    r = runner.invoke(cli.main, ["info"])
    assert r.exit_code == 130
    said = r.output  # (CliRunner's output holds stderr too)
    assert "driverlevel: interrupted" in said and "Aborted!" not in said and "Traceback" not in said


@pytest.mark.skipif(not __import__("os").path.exists("/dev/full"), reason="needs /dev/full (Linux)")
@pytest.mark.parametrize("args", [["info"], ["compile", "--arch", "sm_120", "--kernel", "argmax.cu"], ["--help"],
                                  ["-h"], ["--version"], ["info", "--help"]])
def test_output_that_cannot_be_written_is_one_line_and_status_2(args):
    """``driverlevel ... > /dev/full``: one line on stderr naming the failure and exit status 2 (status 1
    means a kernel failed), not a traceback."""
    import subprocess
    import sys

    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-m", "driverlevel", *args], stdout=full, stderr=subprocess.PIPE,
                           text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert r.stderr.strip().splitlines()[-1] == "driverlevel: cannot write the output: No space left on device"


def test_cli_compile_takes_a_kernel_by_its_path_in_cu(compiled_files, monkeypatch, tmp_path):
    """``--kernel cu/argmax.cu`` (from the checkout's root, as a shell completes it) or an absolute path
    names the file argmax.cu; a path outside cu/ is still refused."""
    from click.testing import CliRunner

    from driverlevel._compile import kernel_source_dir

    seen = compiled_files
    monkeypatch.chdir(kernel_source_dir().parent)
    r = CliRunner().invoke(cli.main, ["compile", "--arch", "sm_90", "--kernel", "cu/argmax.cu",
                                      "--kernel", str(kernel_source_dir() / "argmax.cu")])
    assert r.exit_code == 0, r.output
    assert seen == ["argmax.cu"]
    elsewhere = tmp_path / "argmax.cu"
    elsewhere.write_text("// not the package's")
    r = CliRunner().invoke(cli.main, ["compile", "--arch", "sm_90", "--kernel", str(elsewhere)])
    # (a checkout's cu/argmax.cu after a plain `pip install .` is such a file: the message says how to
    # compile it instead of compiling the installed copy)
    assert r.exit_code == 2 and "is not in the kernel source directory this driverlevel compiles" in r.output
    assert "pip install -e ." in r.output
    r = CliRunner().invoke(cli.main, ["compile", "--arch", "sm_90", "--kernel", str(tmp_path / "nothere.cu")])
    assert r.exit_code == 2 and "no kernel source" in r.output


def test_closed_stdout_is_one_line_and_status_2():
    """``driverlevel info >&-``: Python starts with ``sys.stdout = None`` and click would print nothing
    and exit 0; the command says that it cannot write its output, as for ``> /dev/full``."""
    import os
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "driverlevel", "info"], stderr=subprocess.PIPE, text=True,
                       timeout=300, preexec_fn=lambda: os.close(1))
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines()[-1] == "driverlevel: cannot write the output: standard output is closed"


def test_closed_stdout_still_reports_a_usage_error_and_the_no_gpu_sentence():
    """Review 38, finding 11: with descriptor 1 closed every command was refused up front with the
    closed-stdout line, which hid a usage error (``--arch foo``) and the no-GPU sentence, both of
    which go to stderr; now only a write to stdout ends in that line."""
    import os
    import subprocess
    import sys

    def run(*argv):
        return subprocess.run([sys.executable, "-m", "driverlevel", *argv], stderr=subprocess.PIPE, text=True,
                              timeout=300, preexec_fn=lambda: os.close(1))

    r = run("compile", "--arch", "foo")
    assert r.returncode == 2 and "Invalid value for --arch" in r.stderr and "'foo' is not an architecture name" in r.stderr
    assert "standard output is closed" not in r.stderr
    r = run("--version")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == "driverlevel: cannot write the output: standard output is closed"


def test_closed_stderr_leaves_stdout_to_the_table_and_the_json(tmp_path):
    """``2>&-``: Python starts with ``sys.stderr = None``. ``compile`` failed (exit 1, nothing on
    stdout: the progress bar's ``sys.stderr.isatty()``), and ``capture-demo --json`` without a GPU
    printed its no-GPU sentence to stdout ahead of the JSON (``print(file=None)``); now what goes
    to stderr is dropped and stdout holds only the table or the JSON."""
    import json
    import os
    import subprocess
    import sys

    from conftest import gpu_count

    def run(*argv):
        return subprocess.run([sys.executable, "-m", "driverlevel", *argv], stdout=subprocess.PIPE, text=True,
                              timeout=600, cwd=tmp_path, preexec_fn=lambda: os.close(2))

    r = run("compile", "--kernel", "argmax.cu", "--arch", "sm_90")
    assert r.returncode == 0
    lines = r.stdout.splitlines()
    assert lines[0].split()[:3] == ["file", "kernel", "arch"]
    assert any(line.startswith("argmax.cu") and "sm_90" in line for line in lines[2:])
    if gpu_count() == 0:
        r = run("capture-demo", "--json")
        assert r.returncode == 2
        out = json.loads(r.stdout)  # (the whole of stdout: nothing ahead of the JSON)
        assert out["exit_status"] == 2 and "NVIDIA GPU" in out["error"]


def test_cli_compile_names_the_file_name_for_a_path_that_is_not_here(monkeypatch, tmp_path):
    """``--kernel cu/argmax.cu`` from a directory without that path: the error says the path is not
    there and gives the name to use, instead of listing argmax.cu among the sources it lacks."""
    from click.testing import CliRunner

    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(cli.main, ["compile", "--arch", "sm_90", "--kernel", "cu/argmax.cu"])
    assert r.exit_code == 2
    assert "no file 'cu/argmax.cu' here" in r.output and "--kernel argmax.cu" in r.output


def test_capture_demo_arch_list_says_one_architecture():
    """``capture-demo --arch sm_90,sm_120``: both names are valid, the list is not (one GPU's code)."""
    from click.testing import CliRunner

    r = CliRunner().invoke(cli.main, ["capture-demo", "--arch", "sm_90,sm_120"])
    assert r.exit_code == 2
    assert "capture-demo takes one architecture" in r.output


@pytest.mark.parametrize("argv", [["tools/phase_stamps.py"], ["-m", "driverlevel.bench_replay"]])
def test_library_modules_run_as_scripts_say_what_to_run(argv):
    """Two modules that are libraries of a command were silent no-ops when run (exit 0): now one line
    naming the command to run, and status 2."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    r = subprocess.run([sys.executable, *argv], cwd=root, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stdout == ""
    assert "run" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_compile_kernel_takes_a_comma_list_as_arch_does(runner, monkeypatch):
    calls = []

    def fake(filename, arch, defines=None, *a, **k):
        calls.append(filename)
        return _fake_compile({"k": KernelResources(registers=32)})(filename, arch, defines)

    monkeypatch.setattr(cli, "compile_file", fake)
    monkeypatch.setattr(cli, "compile_variants", lambda f, arch: [CompileVariant({}, {}, "")])
    r = runner.invoke(cli.main, ["compile", "--arch", "sm_90", "--kernel", "selftest.cu,argmax.cu",
                                 "--kernel", "selftest.cu"])
    assert r.exit_code == 0, r.output
    assert calls == ["selftest.cu", "argmax.cu"]
    r = runner.invoke(cli.main, ["compile", "--arch", "sm_90", "--kernel", "selftest.cu,nope.cu"])
    assert r.exit_code == 2 and "no kernel source 'nope.cu' in cu/" in r.stderr


@pytest.mark.parametrize("args, words", [
    (["capture-demo", "--json", "--heads", "0"], "Invalid value for '--heads': 0 is not in the range"),
    (["capture-demo", "--heads", "0", "--json"], "Invalid value for '--heads'"),
    (["capture-demo", "--json", "--no-such-option"], "No such option"),
    (["bench", "replay", "--json", "-", "--repeats", "0"], "Invalid value for '--repeats'"),
    (["bench", "replay", "--json=-", "--nodes", "0"], "Invalid value for --nodes: 0 is below 1: give kernel "
     "counts"),
])
def test_a_usage_error_with_json_to_stdout_is_a_json_object_too(runner, monkeypatch, args, words):
    from driverlevel import _device

    from driverlevel.demo import capture_demo

    no = lambda: pytest.fail("GPU check before the options'")  # noqa: E731
    monkeypatch.setattr(_device, "gpu_usable", no)
    monkeypatch.setattr(capture_demo, "gpu_usable", no, raising=False)
    r = runner.invoke(cli.main, args)
    assert r.exit_code == 2
    err = json.loads(r.stdout)
    assert set(err) == {"error", "exit_status"} and err["exit_status"] == 2 and words in err["error"], err
    assert words in r.stderr and "Usage:" in r.stderr  # the usual message stays on stderr


@pytest.mark.parametrize("args", [["capture-demo", "--heads", "0"], ["bench", "replay", "--repeats", "0"],
                                  ["bench", "replay", "--json", "/tmp/x.json", "--repeats", "0"],
                                  ["capture-demo", "--arch", "--json", "--heads", "0"],  # --arch's value
                                  ["bench", "replay", "--nodes", "--json", "--repeats", "0"]])
def test_a_usage_error_without_json_to_stdout_leaves_stdout_empty(runner, args):
    r = runner.invoke(cli.main, args)
    assert r.exit_code == 2 and r.stdout == "" and "Invalid value" in r.stderr


@pytest.mark.parametrize("value", ["", ",", "selftest.cu,", " "])
def test_compile_refuses_an_empty_kernel_name_instead_of_compiling_everything(runner, monkeypatch, value):
    monkeypatch.setattr(cli, "compile_file", lambda *a, **k: pytest.fail("compiled"))
    r = runner.invoke(cli.main, ["compile", "--arch", "sm_90", "--kernel", value])
    assert r.exit_code == 2 and "Invalid value for --kernel: an empty kernel name" in r.stderr


def test_compile_kernel_list_entries_are_stripped(runner, monkeypatch):
    calls = []
    monkeypatch.setattr(cli, "compile_file", lambda f, arch, defines=None, *a, **k: calls.append(f) or
                        _fake_compile({"k": KernelResources(registers=32)})(f, arch, defines))
    monkeypatch.setattr(cli, "compile_variants", lambda f, arch: [CompileVariant({}, {}, "")])
    r = runner.invoke(cli.main, ["compile", "--arch", "sm_90", "--kernel", "selftest.cu, argmax.cu"])
    assert r.exit_code == 0, r.output
    assert calls == ["selftest.cu", "argmax.cu"]
