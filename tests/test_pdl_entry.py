"""The kernels that start with ``dl::pdl_enter`` (cu/common.cuh) and may be launched
programmatically on sm_90+: in their PTX nothing but register and shared-memory declarations and
the move of the parameter block's address comes before ``griddepcontrol.wait`` (no memory
instruction, no branch, no label, no call), and ``griddepcontrol.launch_dependents`` comes after
it; below sm_90 both are gone. A kernel that touched memory before its wait could read what the
kernel before it has not finished writing (or overwrite what it still reads) once its launch
overlaps that kernel's tail. Every entry point of these files is listed here as entering,
ordinary or with a PDL protocol of its own, so that a new kernel must be classified. CPU only
(NVRTC's PTX)."""
from __future__ import annotations

import re

import pytest

import driverlevel as dl
from driverlevel import argmax, ddtree, runner
from driverlevel._compile import SUPPORTED_ARCHS
from driverlevel.demo import mla_model
from ptx_util import ptx_entries, ptx_of

# source module -> the entry points that start with dl::pdl_enter
ENTERING = {
    mla_model: ("mla_gemm", "mla_gemm_m32", "mla_gemm_m144", "mla_gemm_pair", "mla_gemm_pair_m32",
                "mla_gemm_reduce", "mla_embed"),
    argmax: ("argmax_rows_f32", "argmax_rows_bf16"),
    runner: ("ar_commit", "limit_records", "publish_records"),
    ddtree: ("ddtree_compile", "ddtree_accept", "ddtree_commit"),
}
# ordinary launches only (a step's or a drafter's first kernel, the dense commit): no wait
ORDINARY = {mla_model: ("draft_chain",), runner: ("ar_prepare",), ddtree: ("ddtree_commit_dense",)}
# a PDL protocol of their own (tests/test_ddtree_compile.py: the build's kernels)
OWN = {ddtree: ("ddtree_topk_chunks_f32", "ddtree_topk_chunks_bf16", "ddtree_topk_sample_f32", "ddtree_topk_sample_bf16",
                "ddtree_topk_stream_f32", "ddtree_topk_stream_bf16", "ddtree_build")}

# what may precede the wait: blank lines, comments, the body's brace, register and shared-memory
# declarations, the move of the parameter block's address and reads of the thread's and CTA's
# indices (special registers, no memory)
_ALLOWED = re.compile(r"^\s*(?:$|//.*|\{|\.reg\s.*;|\.shared\s.*;|mov\.(?:b|u)64\s+%rd\d+,\s*\w+_param_\d+;"
                      r"|mov\.u32\s+%r\d+,\s*%(?:tid|ntid|ctaid|nctaid)\.[xyz];)\s*$")
PDL_ARCHS = [a for a in SUPPORTED_ARCHS if int(a[3:]) >= 90]


def _entries(mod, arch):
    src = (dl._compile.kernel_source_dir() / mod.SOURCE).read_text()
    return ptx_entries(ptx_of(src, mod.SOURCE, arch, mod.compile_defines(arch)))


def _body_before_wait(entry: str, name: str) -> list:
    body = entry[entry.index("{"):]  # (after the parameter list and the performance directives)
    wait = body.find("griddepcontrol.wait;")
    assert wait >= 0, f"{name} has no griddepcontrol.wait"
    return body[:wait].splitlines()


@pytest.mark.parametrize("arch", PDL_ARCHS)
@pytest.mark.parametrize("mod", list(ENTERING), ids=lambda m: m.SOURCE)
def test_programmatic_kernels_wait_before_anything_else(mod, arch):
    ptx = _entries(mod, arch)
    for name in ENTERING[mod]:
        before = [ln for ln in _body_before_wait(ptx[name], name) if not _ALLOWED.match(ln)]
        assert not before, f"{name} ({arch}): {before[0].strip()!r} comes before its griddepcontrol.wait"
        e = ptx[name]
        assert e.find("griddepcontrol.wait;") < e.find("griddepcontrol.launch_dependents;"), \
            f"{name} ({arch}): its successor may start before it waits"
    for name in ORDINARY.get(mod, ()):
        assert "griddepcontrol" not in ptx[name], f"{name} is an ordinary launch: it needs neither wait nor trigger"


@pytest.mark.parametrize("mod", list(ENTERING), ids=lambda m: m.SOURCE)
def test_every_entry_point_is_classified(mod):
    """A new kernel in one of these files must be added above (and its launch decided)."""
    listed = set(ENTERING[mod]) | set(ORDINARY.get(mod, ())) | set(OWN.get(mod, ()))
    assert set(_entries(mod, "sm_90")) == listed


def test_the_allowed_prologue_is_narrow():
    """The whitelist refuses what would matter before a wait: loads and stores in any state space,
    generic ones included, atomics, comparisons, branches, labels, calls, barriers."""
    for line in ("\tld.global.u32 \t%r1, [%rd2];", "\tld.u32 \t%r1, [%rd2];", "\tst.global.u32 \t[%rd2], %r1;",
                 "\tatom.global.add.u32 \t%r1, [%rd2], 1;", "\t@%p1 bra \t$L__BB0_2;", "$L__BB0_2:",
                 "\tcall.uni \tfoo, ();", "\tbar.sync \t0;", "\tld.param.u64 \t%rd1, [foo_param_0];",
                 "\tsetp.ge.s32 \t%p1, %r1, %r2;", "\tcp.async.cg.shared.global [%r1], [%rd2], 16;"):
        assert not _ALLOWED.match(line), line
    for line in ("\t.reg .b64 \t%rd<80>;", "\t// demoted variable", "\t.shared .align 4 .b8 _ZZ13fE2sm[5644];",
                 "\tmov.b64 \t%rd32, mla_embed_param_0;", "\tmov.u32 \t%r1, %ctaid.y;", "", "{"):
        assert _ALLOWED.match(line), line


@pytest.mark.parametrize("arch", [a for a in SUPPORTED_ARCHS if int(a[3:]) < 90])
def test_below_sm_90_the_entry_is_empty(arch):
    for mod, names in ENTERING.items():
        ptx = _entries(mod, arch)
        for name in names:
            assert "griddepcontrol" not in ptx[name], (arch, name)
