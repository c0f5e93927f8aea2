"""The benchmarks refuse bad options in one line (exit 2) before the GPU check: no GPU needed."""

import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[1] / "benchmarks"


def _load(name):
    import sys

    sys.path.insert(0, str(BENCH))  # the scripts import their siblings
    try:
        spec = importlib.util.spec_from_file_location(f"bench_{name}_under_test", BENCH / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(BENCH))


@pytest.mark.parametrize("script, argv, words", [
    ("bench_step", ["--batch", "-5"], "--batch must be >= 1"),
    ("bench_step", ["--vocab", "100"], "--vocab must be a multiple of 8"),
    ("bench_step", ["--budget", "600"], "--budget must be <= 512"),
    ("bench_step", ["--steps", "0"], "--steps must be >= 1"),
    ("bench_step", ["--json", "/nonexistent-dir/x.json"], "no directory"),
    ("bench_ddtree", ["--max-context", "-1"], "--max-context must be >="),
    ("peer_read", ["--k", "0"], "must be >= 1"),
    ("profile_topk", ["--budget", "100000"], "--budget in 1..512"),
    ("bench_replay", ["--nodes", "a,b"], "--nodes needs positive ints"),
])
def test_bad_options_exit_2_with_one_line(script, argv, words, capsys):
    with pytest.raises(SystemExit) as e:
        _load(script).main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err


def test_tile_spec_takes_the_qk_chain_count():
    """bench_tiles' SPEC: ``c`` is two QK accumulator sets, ``cN`` N of them (TileConfig checks N)."""
    mod = _load("bench_tiles")
    assert mod.parse_tile("a=64x1x32x3wc_24")[1].qk_chains == 2
    assert mod.parse_tile("a=64x1x32x3wc3_24")[1].qk_chains == 3
    assert mod.parse_tile("a=64x1x32x3w_24")[1].qk_chains == 1
    with pytest.raises(SystemExit, match="qk_chains must be"):
        mod.parse_tile("a=64x1x32x3wc5_24")


def test_tile_spec_takes_the_qk_skew():
    """bench_tiles' SPEC: ``d`` defers the QK warps' softmax by a tile (TileConfig needs 4 stages)."""
    mod = _load("bench_tiles")
    cfg = mod.parse_tile("a=64x1x32x4wd_24")[1]
    assert cfg.qk_skew and cfg.qk_chains == 1 and cfg.q_regs == 24 and cfg.label.endswith(" skew")
    assert mod.parse_tile("a=64x1x16x4wcd_28")[1].qk_chains == 2
    assert not mod.parse_tile("a=64x1x32x4wc_24")[1].qk_skew
    with pytest.raises(SystemExit, match="qk_skew=True needs"):
        mod.parse_tile("a=64x1x32x3wd_24")


def test_tile_bench_takes_extra_defines():
    """bench_tiles' --define DL_NAME=INT: a kernel knob for every tile of the run (experiments)."""
    mod = _load("bench_tiles")
    assert mod.parse_defines(["DL_SKEW_STORE_AT=27", "DL_SKEW_MATH_AT=2"]) == {"DL_SKEW_STORE_AT": 27, "DL_SKEW_MATH_AT": 2}
    for bad in ("SKEW=3", "DL_X=", "DL_X=1.5", "dl_x=1"):
        with pytest.raises(SystemExit, match="bad --define"):
            mod.parse_defines([bad])
