"""The ``driverlevel`` command line through click's test runner (CPU only).

``info`` is tested with the driver simulated away (and with a fake GPU), ``compile``
with the real NVRTC, ``capture-demo`` and ``bench replay`` for their plain failures.
"""

from __future__ import annotations


import pytest
from click.testing import CliRunner

import driverlevel as dl
from driverlevel import cli
from driverlevel._compile import Cubin, KernelResources
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
    (["compile"], ["--arch", "--kernel", "sm_120", "'all'", "spill", "Exits 1"]),
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
    r = invoke(runner, "--version")
    assert r.exit_code == 0 and dl.__version__ in r.output


# -- info ----------------------------------------------------------------------------------------
def _no_driver():
    raise DriverUnavailableError("cuInit", 100, "CUDA_ERROR_NO_DEVICE", "the NVIDIA driver library could not be loaded")


def test_info_without_driver(runner, monkeypatch):
    monkeypatch.setattr(cli, "device_count", lambda: 0)
    monkeypatch.setattr(cli, "driver_version", _no_driver)
    r = invoke(runner, "info")
    assert r.exit_code == 0
    lines = r.output.strip().splitlines()
    assert lines[0] == f"driverlevel {dl.__version__}"
    assert lines[1].startswith("NVRTC 13.")
    assert lines[-1] == ("No NVIDIA GPU is usable on this machine: there is no CUDA driver or no device "
                         "(kernels can still be compiled with `driverlevel compile`).")
    assert "Traceback" not in r.output


def test_info_when_the_driver_fails_to_initialise(runner, monkeypatch):
    def broken():
        raise CudaError("cuInit", 803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", "driver/library version mismatch")

    monkeypatch.setattr(cli, "device_count", broken)
    r = invoke(runner, "info")
    assert r.exit_code == 0
    assert "No NVIDIA GPU is usable on this machine (CUDA_ERROR_SYSTEM_DRIVER_MISMATCH)" in r.output


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
def test_compile_sm120_every_kernel(runner):
    r = invoke(runner, "compile", "--arch", "sm_120")
    assert r.exit_code == 0, r.output
    header = r.output.splitlines()[0].split()
    assert header[:4] == ["file", "kernel", "arch", "regs"] and "spill" in header and "cache" in header
    for name in dl.kernel_sources():
        assert name in r.output
    assert "verify_attn_partial" in r.output and "noop" in r.output
    assert "SPILLS" not in r.output and "SMEM>LIMIT" not in r.output


def test_compile_one_kernel_reports_cache_and_dynamic_smem(runner, fresh_cache):
    first = invoke(runner, "compile", "--arch", "sm_90", "--kernel", "selftest.cu")
    assert first.exit_code == 0, first.output
    rows = [line.split() for line in first.output.splitlines()[2:]]
    assert {row[1] for row in rows} >= {"noop", "reverse_f32_dynamic_smem", "block_sum_f32"}
    assert all(row[0] == "selftest.cu" and row[2] == "sm_90" for row in rows)
    assert all(row[-1] == "compiled" for row in rows)
    by_name = {row[1]: row for row in rows}
    assert by_name["reverse_f32_dynamic_smem"][5] == "65,536"  # dynamic shared memory from selftest.py
    assert by_name["block_sum_f32"][4] == "1,024"  # static shared memory from ptxas
    assert by_name["noop"][5] == "-"
    second = invoke(runner, "compile", "--arch", "sm_90", "--kernel", "selftest.cu")
    assert all(line.split()[-1] == "hit" for line in second.output.splitlines()[2:])


def test_compile_several_archs(runner):
    r = invoke(runner, "compile", "--arch", "sm_80,sm_100", "--kernel", "selftest.cu")
    assert r.exit_code == 0
    archs = {line.split()[2] for line in r.output.splitlines()[2:]}
    assert archs == {"sm_80", "sm_100"}


def test_compile_bad_arch_and_kernel(runner):
    r = runner.invoke(cli.main, ["compile", "--arch", "sm_75"])
    assert r.exit_code == 2 and "unsupported architecture 'sm_75'" in r.output
    r = runner.invoke(cli.main, ["compile", "--kernel", "nope.cu"])
    assert r.exit_code == 2 and "no kernel source 'nope.cu'" in r.output


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


def test_compile_fails_over_the_shared_memory_limit(runner, monkeypatch):
    monkeypatch.setattr(cli, "compile_file", _fake_compile({"big": KernelResources(registers=32, shared_bytes=1024)}))
    monkeypatch.setattr(cli, "compile_variants", lambda f, arch: [("", {}, {"big": 100_400})])
    r = runner.invoke(cli.main, ["compile", "--arch", "sm_120", "--kernel", "selftest.cu"])
    assert r.exit_code == 1
    assert "selftest.cu:big (sm_120) needs 101,424 B of shared memory per block, over the 101,376 B limit" in r.output
    r = runner.invoke(cli.main, ["compile", "--arch", "sm_90", "--kernel", "selftest.cu"])
    assert r.exit_code == 0  # 227 KB on sm_90


def test_compile_reports_a_compile_error(runner, monkeypatch):
    def failing(filename, arch, defines=None, *a, **k):
        raise dl.NvrtcError("nvrtcCompileProgram", "NVRTC_ERROR_COMPILATION", "x.cu(1): error: oops", (), arch,
                            filename)

    monkeypatch.setattr(cli, "compile_file", failing)
    r = runner.invoke(cli.main, ["compile", "--arch", "sm_120", "--kernel", "selftest.cu"])
    assert r.exit_code == 1 and "selftest.cu (sm_120) failed to compile" in r.output and "oops" in r.output


def test_compile_variants_use_the_paired_module_hooks():
    from driverlevel import selftest

    ((variant, defines, dynamic),) = cli.compile_variants("selftest.cu", "sm_90")
    assert variant == "" and defines == selftest.compile_defines("sm_90")
    assert dynamic == {"reverse_f32_dynamic_smem": 65536}


def test_compile_variants_of_verify_attention_follow_the_plan():
    from driverlevel import verify_attention as va
    from driverlevel._module import struct_layout_defines

    for arch in ("sm_90", "sm_120"):
        variants = cli.compile_variants("verify_attention.cu", arch)
        cfg = va.tile_config(arch)
        label, defines, dynamic = variants[0]
        assert defines == {**cfg.defines(), **struct_layout_defines(va._Params)}
        assert dynamic == {"verify_attn_partial": cfg.shared_bytes}
        for rows in (16, 144, 2304):  # whatever the plan picks is among the variants
            want = va.tile_config(arch, rows).defines()
            assert any(all(d[k] == v for k, v in want.items()) for _, d, _ in variants)


# -- capture-demo and bench ----------------------------------------------------------------------
def test_capture_demo_is_the_demo_command():
    from driverlevel import demo_cli

    assert cli.main.commands["capture-demo"] is demo_cli.capture_demo


def test_bench_replay_without_gpu(runner, monkeypatch):
    from driverlevel import _device

    monkeypatch.setattr(_device, "device_count", lambda: 0)
    r = runner.invoke(cli.main, ["bench", "replay", "--replays", "100", "--repeats", "1"])
    assert r.exit_code == 2
    assert r.output.strip() == _device.NO_GPU_MESSAGE


@pytest.mark.parametrize("nodes", ["0", "a,b", ""])
def test_bench_replay_bad_nodes(runner, nodes):
    r = runner.invoke(cli.main, ["bench", "replay", "--nodes", nodes])
    assert r.exit_code == 2 and "--nodes" in r.output
