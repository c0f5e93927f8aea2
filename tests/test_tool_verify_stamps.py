"""tools/verify_stamps.py without a GPU: its argument checks, the naming of the stamp rows
(scheduler, partial CTA roles, combine) and their timeline, and verify_attention.cu compiling with
its stamps (NVRTC, 0 spills) while the plain build has none."""

import importlib.util
from pathlib import Path

import pytest

import driverlevel as dl
from driverlevel import verify_attention as va

_spec = importlib.util.spec_from_file_location("verify_stamps", Path(__file__).parents[1] / "tools" / "verify_stamps.py")
vs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(vs)


def test_argument_ranges():
    a = vs.parse_args([])
    assert (a.heads, a.batch, a.prefix, a.tokens, a.tree) == (16, 8, 4096, 16, False)
    for bad in (["--heads", "0"], ["--batch", "65"], ["--tokens", "300"], ["--prefix", "0"]):
        with pytest.raises(SystemExit):
            vs.parse_args(bad)


def test_row_names_and_timeline():
    assert vs.point_name(0, "start") == "sched start"
    assert vs.point_name(vs.PART + 6, "loop") == "loop" and vs.point_name(vs.PART + 7, "loop") == "pv loop"
    assert vs.point_name(vs.COMBINE + 3, "waited") == "cb waited"
    rows = {0: [("start", 0, 10, 5_000), ("end", 4, 90, 9_000)],
            vs.PART: [("start", 0, 1, 6_000), ("cuts", 0, 2, 7_000), ("loop", 0, 3, 40_000)],
            vs.PART + 1: [("loop", 0, 3, 41_000), ("epi", 0, 4, 42_000)],
            vs.PART + 2: [("start", 0, 1, 6_500), ("loop", 0, 3, 44_000)],
            vs.COMBINE: [("start", 0, 0, 8_000), ("waited", 0, 0, 45_000), ("end", 0, 0, 47_000)]}
    lines = vs.phase_stamps.timeline(vs.named(rows), vs.ORDER, None)
    by = {ln[:12].strip(): ln.split()[-4:] for ln in lines[1:]}
    assert by["sched start"] == ["1", "0.00", "0.00", "0.00"]  # µs from the first stamp (5,000 ns)
    assert by["start"] == ["2", "1.00", "1.25", "1.50"]
    assert by["loop"] == ["2", "35.00", "37.00", "39.00"] and by["pv loop"] == ["1", "36.00", "36.00", "36.00"]
    assert by["cb end"] == ["1", "42.00", "42.00", "42.00"]
    last = vs.last_ctas(rows, 1)
    assert last == []  # no CTA stamped "done"
    rows[vs.PART].append(("done", 0, 9, 43_000))
    rows[vs.PART + 2] += [("seg", 31, 5, 7_000), ("done", 0, 9, 45_000)]
    last = vs.last_ctas(rows, 1)
    assert len(last) == 1 and last[0].startswith("part    1 tiles [31]:") and "done=40.00" in last[0]
    assert "pv" not in last[0]  # part 1 has no PV row here
    assert len(vs.last_ctas(rows, 5)) == 2 and "pv epi=37.00" in vs.last_ctas(rows, 5)[0]
    names = [ln[:12].strip() for ln in lines[1:]]
    assert names == ["sched start", "sched end", "start", "cuts", "loop", "pv loop", "pv epi",
                     "cb start", "cb waited", "cb end"]  # the tool's order


def test_loop_rate_and_iteration_split():
    """tile_rates: (lasttile - t0done) / (tiles - 2) over CTAs with one segment of >= 3 tiles;
    iteration_split: iteration 16's points in SM cycles after bar16, both roles of a CTA."""
    P = vs.PART
    rows = {P: [("seg", 10, 0, 1_000), ("t0done", 0, 0, 2_000), ("bar16", 0, 1_000, 3_000), ("mma16", 0, 4_000, 0),
                ("P16", 0, 5_000, 0), ("bar17", 0, 6_000, 0), ("lasttile", 0, 0, 18_000), ("loop", 0, 0, 20_500)],
            P + 1: [("bar16", 0, 1_010, 0), ("mma16", 0, 3_000, 0)],
            P + 2: [("seg", 6, 0, 1_000), ("t0done", 0, 0, 2_000), ("bar16", 0, 100, 0), ("mma16", 0, 3_100, 0),
                    ("P16", 0, 4_100, 0), ("bar17", 0, 5_100, 0), ("lasttile", 0, 0, 14_000), ("loop", 0, 0, 16_000)],
            P + 4: [("seg", 2, 0, 1_000), ("seg", 30, 0, 9_000)]}  # two segments: not counted
    rate, last = vs.tile_rates(rows)
    assert rate == "key loop µs per tile over 2 CTAs: median 2.500  min 2.000  max 3.000"  # 16 / 8 and 12 / 4 µs
    assert last == "last tile's span µs: median 2.250  min 2.000  max 2.500"
    split = vs.iteration_split(rows)
    assert split == ["iteration 16, SM cycles after its barrier (median over CTAs): QK mma issued 3000, "
                     "QK P written 4000, PV mma issued 2000, next barrier left 5000"]
    assert vs.tile_rates({P + 4: rows[P + 4]}) == ["(no CTA with one segment of 3 or more key tiles)"]
    assert vs.iteration_split({P + 4: rows[P + 4]})[0].startswith("(no CTA ran 18 key tiles")


@pytest.mark.parametrize("arch", ["sm_90", "sm_120"])
def test_stamped_verify_attention_compiles_and_the_plain_one_has_no_stamps(arch):
    cfg = va.tile_config(arch)
    target = cfg.nvrtc_target(arch)
    plain = dl.runtime.compile_file("verify_attention.cu", target, va.compile_defines(arch, cfg))
    stamped = dl.runtime.compile_file("verify_attention.cu", target, {**va.compile_defines(arch, cfg), "DL_STAMPS": 1})
    for k in ("verify_attn_schedule", "verify_attn_partial", "verify_attn_combine"):
        assert stamped.resources[k].spills == 0, k
    assert b"dl_stamps" in stamped.data and b"dl_stamp" not in plain.data


def test_a_bad_tile_is_a_usage_error_before_the_gpu_check(capsys, monkeypatch):
    """--tile was parsed after require_gpu(): without a GPU a typo gave the no-GPU sentence (review 16 #9)."""
    from driverlevel import _device

    def no_gpu():
        raise AssertionError("the GPU check came first")

    monkeypatch.setattr(_device, "require_gpu", no_gpu)
    with pytest.raises(SystemExit) as e:
        vs.main(["--tile", "bogus"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: ") and "bad --tile" in err
    cfg = vs.parse_args(["--tile", "64x1x32x4w"]).tile_config
    assert isinstance(cfg, va.TileConfig) and (cfg.rows, cfg.keys, cfg.stages, cfg.ws) == (64, 32, 4, True)
    assert vs.parse_args([]).tile_config is None


# -- review 17 M3: --tile native_rs (a function of the arch and rows) resolved once the GPU's arch is known -----
def test_native_rs_is_resolved_with_the_arch_as_sass_does():
    from dataclasses import replace

    f = vs.parse_args(["--tile", "native_rs"]).tile_config
    assert callable(f)
    got = vs.resolve_tile(f, "sm_100", 16 * 16)
    assert isinstance(got, va.TileConfig) and got == replace(va.tile_config("sm_100", 256), exchange="reduce_scatter")
    assert vs.resolve_tile(None, "sm_90", 256) is None  # native: the plan's default
    fixed = vs.parse_args(["--tile", "sm_120"]).tile_config
    assert vs.resolve_tile(fixed, "sm_90", 256) is fixed
    with pytest.raises(SystemExit, match="^--tile: sm_90's tile has QK and PV warps, no S exchange to change$"):
        vs.resolve_tile(f, "sm_90", 256)


class _Stop(Exception):
    pass


@pytest.mark.parametrize("arch", ["sm_90", "sm_100"])
def test_main_passes_native_rs_resolved_and_refuses_it_before_the_stream(monkeypatch, capsys, arch):
    """Without a GPU: torch, the device and the plan are stand-ins. sm_90's tile has no S exchange: a
    usage error (exit 2) before the stream and the flush buffer; sm_100's: the plan gets a TileConfig."""
    import sys
    import types

    from driverlevel import _device

    made = []

    class FakeDevice:
        def __init__(self, ordinal):
            self.arch = arch

        def create_stream(self):
            made.append("stream")

    def fake_plan(*a, tile=None, **k):
        raise _Stop(tile)

    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))
    monkeypatch.setattr(_device, "require_gpu", lambda: None)
    monkeypatch.setattr(dl, "Device", FakeDevice)
    monkeypatch.setattr(dl.DeviceBuffer, "allocate", lambda *a, **k: types.SimpleNamespace(as_array=lambda: None))
    monkeypatch.setattr(dl, "VerifyAttention", fake_plan)
    if arch == "sm_90":
        assert vs.main(["--tile", "native_rs"]) == 2 and made == []
        assert capsys.readouterr().err == ("verify_stamps.py: error: --tile: sm_90's tile has QK and PV warps, "
                                           "no S exchange to change\n")
    else:
        with pytest.raises(_Stop) as e:
            vs.main(["--tile", "native_rs"])
        assert isinstance(e.value.args[0], va.TileConfig) and e.value.args[0].exchange == "reduce_scatter"
