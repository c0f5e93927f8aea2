"""The kernels that start with ``dl::pdl_enter`` (cu/common.cuh) and are launched programmatically
on sm_90+: in their PTX the ``griddepcontrol.wait`` comes before any memory instruction but the
reads of the kernel's own parameters, and ``griddepcontrol.launch_dependents`` after it; below
sm_90 both are gone. A kernel that touched memory before its wait could read what the kernel before
it has not finished writing (or overwrite what it still reads) once its launch overlaps that
kernel's tail. CPU only (NVRTC's PTX)."""
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
# and those of the same files that are ordinary launches (a chain's or a drafter's first)
ORDINARY = {mla_model: ("draft_chain",), runner: ("ar_prepare",), ddtree: ("ddtree_commit_dense",)}

# a PTX memory instruction other than a parameter read (ld.param), or a barrier that orders one
_MEMORY = re.compile(r"^\s*(?:@%p\d+\s+)?(?:ld|st|atom|red|cp\.async|prefetch|bar|membar|fence)\.(?!param)", re.M)


def _entries(mod, arch):
    src = (dl._compile.kernel_source_dir() / mod.SOURCE).read_text()
    return ptx_entries(ptx_of(src, mod.SOURCE, arch, mod.compile_defines(arch)))


@pytest.mark.parametrize("mod", list(ENTERING), ids=lambda m: m.SOURCE)
def test_programmatic_kernels_wait_before_any_memory_access(mod):
    ptx = _entries(mod, "sm_90")
    for name in ENTERING[mod]:
        body = ptx[name]
        wait = body.find("griddepcontrol.wait;")
        assert wait >= 0, f"{name} has no griddepcontrol.wait"
        first = _MEMORY.search(body)
        line = body[first.start():body.find("\n", first.start())].strip() if first else "?"
        assert first is not None and wait < first.start(), f"{name}: `{line}` comes before its griddepcontrol.wait"
        assert wait < body.find("griddepcontrol.launch_dependents;"), f"{name}: its successor may start before it waits"
    for name in ORDINARY.get(mod, ()):
        assert "griddepcontrol.wait;" not in ptx[name], f"{name} is an ordinary launch: it needs no wait"


@pytest.mark.parametrize("arch", [a for a in SUPPORTED_ARCHS if int(a[3:]) < 90])
def test_below_sm_90_the_entry_is_empty(arch):
    for mod, names in ENTERING.items():
        ptx = _entries(mod, arch)
        for name in names:
            assert "griddepcontrol" not in ptx[name], (arch, name)
