"""Defects of a user review of the verify-attention plan (no GPU): tiles the kernel rejects, a
spilling tile= that went unnoticed, the workspace formula, sm_scale's errors, the README's layout."""

from __future__ import annotations

import re
import warnings
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

import driverlevel as dl
from driverlevel import verify_attention as va
from driverlevel._compile import compile_file, nvrtc_version
from driverlevel.verify_attention import TileConfig, VerifyAttention, compile_defines, tile_config

REPO = Path(__file__).resolve().parents[1]

# (tile fields, the kernel's static_assert message that rejects them, the words of TileConfig's ValueError)
_KERNEL_REJECTS = [
    (dict(rows=64, csplit=1, keys=48, stages=2), "row loaders assume whole threads per row",
     "row loaders assume whole threads per row"),
    (dict(rows=16, csplit=1, keys=16, stages=2, qreg=True), "mask words: whole keys per thread, whole warps",
     "mask words: whole keys per thread, whole warps"),
    (dict(rows=16, csplit=2, keys=16, stages=2, exchange="reduce_scatter"),
     "mask words: whole keys per thread, whole warps", "mask words: whole keys per thread, whole warps"),
    (dict(rows=48, csplit=1, keys=48, stages=2), "whole loader threads per key row",
     "whole loader threads per key row"),
    (dict(rows=128, csplit=4, keys=16, stages=2, bulk=True), "a key row's threads are lanes of one warp",
     "a key row's threads are lanes of one warp"),
    (dict(rows=32, csplit=4, keys=16, stages=2, qreg=True), "the requests of the prefix pass do not fit",
     "the requests of the prefix pass need"),
]


def _unchecked(**fields) -> TileConfig:
    """A TileConfig without __post_init__'s checks (to hand the kernel what TileConfig refuses)."""
    cfg = object.__new__(TileConfig)
    full = dict(qreg=False, exchange="allreduce", pv_rows=16, bulk=False, ws=False, qk_chains=1, q_regs=32,
                pv_softmax=False, qk_skew=False) | fields
    for k, v in full.items():
        object.__setattr__(cfg, k, v)
    return cfg


def _static_asserts(cfg: TileConfig, arch: str = "sm_90") -> list[str]:
    """The static_assert messages NVRTC's front end reports for ``cfg`` (no code generation)."""
    try:
        compile_file("verify_attention.cu", arch, compile_defines(arch, cfg), extra_options=["-fdevice-syntax-only"],
                     use_cache=False)
    except dl.NvrtcError as exc:
        found = re.findall(r'static assertion failed with "([^"]*)"', str(exc))
        assert found, str(exc)[:2000]
        return found
    return []


@pytest.mark.parametrize("fields, kernel_words, words", _KERNEL_REJECTS)
def test_tile_config_rejects_what_the_kernel_rejects(fields, kernel_words, words):
    # the kernel refuses the tile at compile time ...
    assert any(kernel_words in m for m in _static_asserts(_unchecked(**fields))), fields
    # ... so TileConfig refuses it at construction, naming the same constraint
    with pytest.raises(ValueError, match=re.escape(words)):
        TileConfig(**fields)


# 96 x 48: 192 threads, 384 loader threads; bulk with 128 rows x 2: 32 threads a key row (one warp);
# 32 rows x 4 qreg, 3 stages: 64,160 B below the tile's records (58,032 needed; 2 stages have 45,472)
@pytest.mark.parametrize("fields", [dict(rows=96, csplit=1, keys=48, stages=2),
                                    dict(rows=32, csplit=1, keys=64, stages=2),
                                    dict(rows=128, csplit=2, keys=16, stages=2, bulk=True),
                                    dict(rows=32, csplit=4, keys=16, stages=3, qreg=True),
                                    dict(rows=80, csplit=1, keys=16, stages=2),
                                    dict(rows=32, csplit=1, keys=16, stages=3, ws=True, q_regs=32)])
def test_tiles_next_to_the_kernels_limits_are_accepted_by_both(fields):
    cfg = TileConfig(**fields)
    assert _static_asserts(cfg) == []


def test_full_compile_matches_for_the_reviewed_tile():
    with pytest.raises(dl.NvrtcError, match="row loaders assume whole threads per row"):
        defines = compile_defines("sm_90", _unchecked(rows=64, csplit=1, keys=48, stages=2))
        compile_file("verify_attention.cu", "sm_90", defines, use_cache=False)


def test_each_fields_own_value_is_checked_before_the_combinations():
    with pytest.raises(ValueError, match="exchange must be one of"):
        TileConfig(rows=64, csplit=1, keys=16, stages=3, ws=True, exchange="bad")
    with pytest.raises(ValueError, match="pv_rows must be 16 or 32"):
        TileConfig(rows=64, csplit=1, keys=16, stages=3, ws=True, pv_rows=64)
    with pytest.raises(ValueError, match="q_regs must be"):
        TileConfig(rows=64, csplit=1, keys=16, stages=3, ws=True, q_regs=40, bulk=True)
    with pytest.raises(ValueError, match="qk_chains must be"):
        TileConfig(rows=64, csplit=2, keys=16, stages=3, ws=True, qk_chains=7)


def test_too_big_for_shared_memory_states_the_limit_and_the_tiles_bytes():
    tile = TileConfig(rows=64, csplit=2, keys=32, stages=2)
    with pytest.raises(ValueError, match=f"needs {tile.shared_bytes} B per block, more than the 101376 B sm_120 allows"):
        va._check_tile_fits(tile, "sm_120")
    va._check_tile_fits(tile, "sm_90")


def test_a_spilling_tile_warns_and_the_default_does_not():
    tile = TileConfig(rows=32, csplit=1, keys=64, stages=2)  # ~4.9 KB of spills per thread on sm_90 (NVRTC 13.5)
    cub = compile_file("verify_attention.cu", "sm_90", compile_defines("sm_90", tile))
    res = cub.resources["verify_attn_partial"]
    if not res.spills:  # (4,916 B with NVRTC 13.5; another NVRTC may allocate it without spills)
        pytest.skip(f"{tile.label} does not spill on sm_90 with this NVRTC")
    with pytest.warns(RuntimeWarning) as rec:
        assert va._warn_if_spills(cub, tile) == res.spills
    assert len(rec) == 1
    msg = str(rec[0].message)
    assert tile.label in msg and "sm_90" in msg
    assert f"{res.spill_store_bytes} B of spill stores" in msg and f"{res.spill_load_bytes} B of spill loads" in msg
    assert rec[0].filename == __file__  # stacklevel: the caller's line
    default = tile_config("sm_90")
    cub = compile_file("verify_attention.cu", default.nvrtc_target("sm_90"), compile_defines("sm_90", default))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert va._warn_if_spills(cub, default) == 0


class _Loaded(Exception):
    """Raised by a stand-in load_module: the plan compiled its kernels and got no further."""


def _plan_warnings(monkeypatch, **kw):
    """The warnings of building a 9-head sm_90 plan (max_q 16) whose load_module stops it right
    after the compile (no device)."""
    def load_module(device, cubin):
        raise _Loaded(cubin)

    monkeypatch.setattr(va, "load_module", load_module)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        with pytest.raises(_Loaded):
            VerifyAttention(0, 9, max_batch=2, max_q=16, arch="sm_90", **kw)
    return rec


@pytest.mark.parametrize("tile, warns", [(TileConfig(rows=32, csplit=1, keys=64, stages=2), True), (None, False)])
def test_plan_warns_for_a_spilling_tile_given_by_the_caller(monkeypatch, tile, warns):
    # no device: a stand-in device and a load_module that stops the plan right after the compile
    monkeypatch.setattr(va, "_check_device_arg", lambda d: SimpleNamespace(ordinal=0, arch="sm_90"))

    if tile is None and nvrtc_version() < va._NVRTC_SPILL_FREE:
        pytest.skip(f"NVRTC {nvrtc_version()} spills the 48-row default tile (13.4 or newer does not)")
    rec = _plan_warnings(monkeypatch, tile=tile)
    spills = [w for w in rec if issubclass(w.category, RuntimeWarning) and "spills registers" in str(w.message)]
    assert len(spills) == (1 if warns else 0), [str(w.message) for w in rec]
    if warns:
        assert "rows=32 csplit=1 keys=64 stages=2" in str(spills[0].message)
        assert spills[0].filename == __file__  # the first line outside driverlevel: the one that built the plan


@pytest.mark.parametrize("num_parts, tile_rows, max_batch", [(132, 64, 8), (188, 48, 1024), (1, 16, 1)])
def test_published_workspace_formula_is_the_real_size(num_parts, tile_rows, max_batch):
    formula = 2 * num_parts * tile_rows * (512 * 2 + 4) + 40 * max_batch + 64 * num_parts + 16
    assert VerifyAttention.workspace_bytes_for(num_parts, tile_rows, max_batch) == formula
    doc = VerifyAttention.workspace_bytes_for.__doc__
    assert "2 * num_parts * tile_rows * (512 * 2 + 4) + 40 * max_batch + 64 * num_parts + 16" in doc
    readme = (REPO / "README.md").read_text()
    assert "plan.workspace_bytes = 2 * num_parts * tile_rows * (512 * 2 + 4) B" in readme
    assert "40 * max_batch + 64 * num_parts + 16 B" in readme
    assert "(512 + 1) * 4" not in readme and "513 * 4" not in doc


def test_sm_scale_type_and_range_errors_before_the_device():
    for bad in ("x", None, True, complex(1, 0), [0.1]):
        with pytest.raises(TypeError, match="sm_scale must be a real number"):
            va._check_sm_scale(bad)
    for bad in (10**400, -10**400):
        with pytest.raises(ValueError, match=r"sm_scale about 8.15e-39 to 2.36e\+38"):
            va._check_sm_scale(bad)
    with pytest.raises(ValueError, match=r"sm_scale \* log2\(e\) must be a normal float32 \(sm_scale about"):
        va._check_sm_scale(10**39)
    assert va._check_sm_scale(2) == 2.0
    # in the plan: before the device (object() would fail only later, as "device must be")
    with pytest.raises(TypeError, match="sm_scale must be a real number"):
        VerifyAttention(object(), 9, max_batch=2, max_q=16, sm_scale="x")
    with pytest.raises(ValueError, match="sm_scale must be a positive finite float"):
        VerifyAttention(object(), 9, max_batch=2, max_q=16, sm_scale=10**400)


@pytest.mark.parametrize("name, arch, stores, loads, text", [
    ("_WS32", "sm_100", 0, 0, "With NVRTC 13.5 the sm_100 3-stage ws tile builds without spills (0 B on sm_100 and "
                              "sm_103) but is not enabled because it was never measured on an sm_100 GPU."),
    ("_WS32_SKEW", "sm_100", 40, 44, "spills on sm_100 and sm_103 (40 B of spill stores + 44 B of spill loads = 84 B "
                                     "per thread with NVRTC 13.5)"),
    ("_WS32 pv_softmax", "sm_90", 64, 40, "also spills on sm_90: 64 B of spill stores and 40 B of spill loads per "
                                          "thread with NVRTC 13.5"),
])
def test_spill_bytes_in_the_comments_are_the_bundled_nvrtcs(name, arch, stores, loads, text):
    src = " ".join((REPO / "driverlevel" / "verify_attention.py").read_text().replace("#", " ").split())
    assert text in src
    # what stays as it was: _WS32 and _WS32_SKEW are left out from sm_100 on
    assert va._SPILLS_FROM == {va._WS32: 100, va._WS32_SKEW: 100}
    if nvrtc_version()[:2] != (13, 5):
        pytest.skip(f"the comments give NVRTC 13.5's numbers; this is NVRTC {nvrtc_version()}")
    cfg = replace(va._WS32, pv_softmax=True) if name == "_WS32 pv_softmax" else getattr(va, name)
    res = compile_file("verify_attention.cu", arch, compile_defines(arch, cfg)).resources["verify_attn_partial"]
    assert (res.spill_store_bytes, res.spill_load_bytes) == (stores, loads)


def _layout_first_column() -> set[str]:
    text = (REPO / "README.md").read_text()
    sec = text[text.index("## Layout"):]
    sec = sec[:sec.index("\n## ", 1)]
    paths = set()
    for line in sec.splitlines():
        if line.startswith("| `"):
            cell = line.split(" | ")[0]
            for path in re.findall(r"`([^`]+)`", cell):
                paths |= {path, path.rsplit("/", 1)[-1]}
    return paths


def test_readme_layout_lists_the_reviewed_files_and_every_private_module():
    first = _layout_first_column()
    for path in ("cu/phase_stamps.cuh", "cu/ddtree/topk_threshold.cuh", "driverlevel/_topk_threshold.py"):
        assert (REPO / path).is_file(), path
        assert path in first, path
    missing = sorted(p.name for p in (REPO / "driverlevel").glob("_[a-z]*.py") if p.name not in first)
    assert missing == []


@pytest.mark.parametrize("nvrtc, advice", [((13, 0), "NVRTC 13.0 is in use; the default tiles do not spill with NVRTC 13.4 "
                                                      "or newer (pip install -U 'nvidia-cuda-nvrtc>=13.4,<14')"),
                                           ((13, 5), "(the default tiles do not)")])
def test_a_spilling_default_tile_warns_and_names_an_old_nvrtc(monkeypatch, nvrtc, advice):
    """NVRTC 13.0-13.3 spill sm_90's 48-row tile (68 B; the H200 machine's 13.0): the plan said nothing
    for a default tile. Now every plan warns for a spilling tile, and names an NVRTC older than 13.4."""
    from driverlevel._compile import KernelResources
    monkeypatch.setattr(va, "_check_device_arg", lambda d: SimpleNamespace(ordinal=0, arch="sm_90"))
    monkeypatch.setattr(va, "nvrtc_version", lambda: nvrtc)
    spilling = KernelResources(registers=168, spill_store_bytes=68, spill_load_bytes=68)
    monkeypatch.setattr(va, "compile_file", lambda *a, **k: SimpleNamespace(
        arch="sm_90", resources={"verify_attn_partial": spilling}))

    rec = _plan_warnings(monkeypatch)  # 9 heads x 16 tokens = 144 rows: the 48-row default tile
    assert [w.filename for w in rec if "spills registers" in str(w.message)] == [__file__]  # the caller's line
    spills = [str(w.message) for w in rec if "spills registers" in str(w.message)]
    assert len(spills) == 1 and tile_config("sm_90", 144).label in spills[0], spills
    assert "68 B of spill stores" in spills[0] and advice in spills[0]
    assert va._NVRTC_SPILL_FREE == (13, 4)
    assert '"nvidia-cuda-nvrtc>=13.4,<14"' in (REPO / "pyproject.toml").read_text()  # the floor pip installs
