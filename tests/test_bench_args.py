"""The benchmarks' options (no GPU needed): bad values, values above their upper bounds and bad --json paths
are refused in one line (exit 2) before the GPU check, values at the bounds reach it, and tile names are
taken in any case."""

import pytest

from bench_util import BENCH, assert_usage_error
from bench_util import load_bench as _load
from bench_util import load_bench as _load_bench
from driverlevel import _device


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


def test_tile_spec_takes_the_wgmma_letters():
    """bench_tiles' SPEC: ``g`` is the QK warps' S by wgmma, ``v`` P V by wgmma too (sm_90's default)."""
    from driverlevel.verify_attention import tile_config
    mod = _load("bench_tiles")
    qk = mod.parse_tile("a=64x1x32x4wdg_20")[1]
    assert qk.wgmma and not qk.wgmma_pv and qk.label.endswith(" skew wgmma")
    assert mod.parse_tile("a=64x1x32x4wdgv_20")[1] == tile_config("sm_90")
    with pytest.raises(SystemExit, match="wgmma_pv=True needs wgmma=True"):
        mod.parse_tile("a=64x1x32x4wdv_20")
    assert "[g][v]" in mod.SPEC_GRAMMAR and "[g][v]" in mod.__doc__  # the error message and --help name it


def test_tile_bench_takes_extra_defines():
    """bench_tiles' --define DL_NAME=INT: a kernel knob for every tile of the run (experiments)."""
    mod = _load("bench_tiles")
    assert mod.parse_defines(["DL_SKEW_STORE_AT=27", "DL_SKEW_MATH_AT=2"]) == {"DL_SKEW_STORE_AT": 27, "DL_SKEW_MATH_AT": 2}
    for bad in ("SKEW=3", "DL_X=", "DL_X=1.5", "dl_x=1"):
        with pytest.raises(SystemExit, match="bad --define"):
            mod.parse_defines([bad])


# -- review 15 #10: one rule for every script: options and the --json path before the run, exit 2 with usage --
_NO_DIR = "--json: the directory '/nonexistent-dir' does not exist"


@pytest.mark.parametrize("script, argv, words", [
    ("bench_step", ["--batch", "-5"], "--batch must be >= 1"),
    ("bench_step", ["--vocab", "100"], "--vocab must be a multiple of 8"),
    ("bench_ddtree", ["--vocab", "100"], "--vocab must be a multiple of 8, >= 512"),
    ("bench_ddtree", ["--vocab", "32770"], "--vocab must be a multiple of 8, >= 512"),
    # the floor is the largest budget's top-K: 256 with --quick (a fresh-user trial: it said 512 there too)
    ("bench_ddtree", ["--quick", "--vocab", "200"], "--vocab must be a multiple of 8, >= 256 (the largest budget's "
     "top-K, with --quick), got 200"),
    ("bench_ddtree", ["--vocab", "100000000"], "--vocab 100000000 with budget 16: vocab=100000000 at K=16 needs"),
    ("bench_tiles", ["--tile", "a=64x1x32x3", "--tile", "a=48x1x32x3"], "--tile: name 'a' given twice"),
    ("bench_step", ["--budget", "600"], "--budget must be <= 512"),
    ("bench_step", ["--steps", "0"], "--steps must be >= 1"),
    ("bench_step", ["--json", "/nonexistent-dir/x.json"], "--json: the directory '/nonexistent-dir' does not exist"),
    ("bench_ddtree", ["--max-context", "-1"], "--max-context must be >="),
    ("bench_ddtree", ["--flush", "bogus"], "argument --flush: invalid choice: 'bogus'"),
    ("bench_ddtree", ["--evict-code", "--flush", "none"], "--evict-code evicts the code with the flush: give --flush "
     "read, write or drafted"),
    ("peer_read", ["--k", "0"], "--batch, --k and --reps must be >= 1"),
    ("profile_topk", ["--budget", "100000"], "--batch must be >= 1 and --budget in 1..512, got 8 and 100000"),
    ("bench_replay", ["--nodes", "a,b"], "--nodes: 'a' in 'a,b' is not an integer: give kernel counts 1 to 1,000 "
     "separated by single commas, e.g. 1,10,50\n"),
    # review 17 L11: an empty item was dropped; refused now, as capture-demo --devices 0,,1 is
    ("bench_replay", ["--nodes", "1,,2"], "--nodes: empty item in '1,,2': give kernel counts 1 to 1,000 separated "
     "by single commas, e.g. 1,10,50\n"),
    ("bench_replay", ["--replays", "5"], "--replays must be >= 100 and --repeats >= 1, got 5 and 5\n"),
    ("bench_attention", ["--json", "/nonexistent-dir/x.json"], _NO_DIR),
    ("bench_ddtree", ["--json", "/nonexistent-dir/x.json"], _NO_DIR),
    ("bench_tiles", ["--json", "/nonexistent-dir/x.json"], _NO_DIR),
    ("bench_replay", ["--json", "/nonexistent-dir/x.json"], _NO_DIR),
    ("bench_step", ["--json", "/"], "--json: '/' is a directory, not a file"),
    ("bench_step", ["--json", ""], "--json: '' is an empty path, not a file\n"),  # review 17 L9: 'a directory'
    ("bench_step", ["--batch", "300"], "--batch must be <= 256, got 300"),
    ("bench_step", ["--budget", "512", "--vocab", "200000"],
     "--vocab 200000 with --budget 512: vocab=200000 at K=512 needs 27 chunks x 512 candidates"),
    # review 16 #4: capture-demo's bounds, the package's limits and the DDTree merge rule, before the GPU check
    ("bench_step", ["--depth-limit", "99"], "--depth-limit must be <= 32, got 99"),
    ("bench_step", ["--num-splits", "5000"], "--num-splits must be <= 1024, got 5000"),
    ("bench_step", ["--num-splits", "0"], "--num-splits must be >= 1, got 0"),
    ("bench_step", ["--seed", "-1"], "--seed must be >= 0, got -1"),
    ("bench_step", ["--prompt-len", "1"], "--prompt-len must be >= 2, got 1"),
    ("bench_step", ["--heads", "129"], "--heads must be <= 128, got 129"),
    ("bench_step", ["--vocab", "100000000"], "--vocab 100000000 with --budget 16: vocab=100000000 at K=16 needs "
     "13021 chunks x 16 candidates per row, more than the row merge's 12288: no budget fits: the vocabulary can have at "
     "most 94371840 tokens"),
    ("bench_step", ["--steps", "10000000"], "--batch 8 x a context of 320000538 tokens (from --steps, --depth-limit, "
     "--prompt-len, --max-new-tokens and --budget) exceeds 2**31 - 1: lower --steps or --batch\n"),
    # review 17 L8: the option of the largest term is named (it said --steps whatever dominated), --batch unless 1
    # (--prompt-len is refused above capture-demo's 65536 now, before the context's sum: see below)
    ("bench_step", ["--prompt-len", "99999999999"], "--prompt-len must be <= 65536, got 99999999999\n"),
    # capture-demo's --prompt-len range (2..65536): 10000000 passed and stopped only at the GPU check
    ("bench_step", ["--prompt-len", "10000000"], "--prompt-len must be <= 65536, got 10000000\n"),
    ("bench_step", ["--prompt-len", "65537"], "--prompt-len must be <= 65536, got 65537\n"),
    # capture-demo's --max-new-tokens range (1..65536) too; the context's sum then names --steps alone
    ("bench_step", ["--max-new-tokens", "10000000000", "--batch", "256"], "--max-new-tokens must be <= 65536, "
     "got 10000000000\n"),
    ("bench_step", ["--max-new-tokens", "65537"], "--max-new-tokens must be <= 65536, got 65537\n"),
    ("bench_step", ["--steps", "100000000", "--batch", "1"], "--batch 1 x a context of 3200000538 tokens (from "
     "--steps, --depth-limit, --prompt-len, --max-new-tokens and --budget) exceeds 2**31 - 1: lower --steps\n"),
    ("bench_tiles", ["--tile", "bogus"], "bad --tile 'bogus': want NAME=SPEC"),
    ("bench_tiles", ["--tile", "a=1x2"], "bad --tile 'a=1x2': want ROWSxCSPLIT"),
    ("bench_tiles", ["--define", "FOO"], "bad --define 'FOO': want DL_NAME=INT"),
    ("bench_tiles", ["--ratio", "a/b"], "bad --ratio 'a/b': want A/B with A, B among ['native', 'sm120']"),
    ("profile_tile", ["--spec", "bogus"], "bad --spec 'bogus': want ROWSxCSPLIT"),
    ("profile_tile", ["--heads", "0"], "--heads must be >= 1, got 0"),
    ("profile_tile", ["--tokens", "-3"], "--tokens must be >= 1, got -3"),
    ("bench_replay", ["--device", "-1"], "--device must be a GPU ordinal >= 0, got -1"),
    # review finding: '-' passed json_path_problem and, after the run, was written as a file named '-'
    ("bench_attention", ["--json", "-"], "--json: '-' (stdout) is not supported by this script: give a file path"),
    ("bench_ddtree", ["--json", "-"], "--json: '-' (stdout) is not supported by this script: give a file path"),
    ("bench_tiles", ["--json", "-"], "--json: '-' (stdout) is not supported by this script: give a file path"),
    ("bench_step", ["--json", "-"], "--json: '-' (stdout) is not supported by this script: give a file path"),
])
def test_bad_options_and_json_paths_are_usage_errors(script, argv, words, capsys, monkeypatch):
    """bench_attention/ddtree/tiles opened --json only after the whole run; bad specs exited 1 without a
    usage line; bench_replay.py --device -1 went on to the GPU check. The GPU check must not be reached."""
    from driverlevel import _device

    monkeypatch.setattr(_device, "gpu_usable", lambda: pytest.fail("the GPU check came before the options'"))
    monkeypatch.setattr(_device, "require_gpu", lambda: pytest.fail("the GPU check came before the options'"))
    assert_usage_error(script, argv, words, capsys)


@pytest.mark.parametrize("argv, words", [
    (["bench_tiles.py", "--tile", "bogus"], "bench_tiles.py: error: bad --tile 'bogus'"),
    (["bench_attention.py", "--json", "/nonexistent-dir/x.json"], "bench_attention.py: error: " + _NO_DIR),
])
def test_scripts_exit_2_with_usage_in_a_process(argv, words):
    """As a user runs them (the path is checked before the no-GPU sentence, on any machine)."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=str(BENCH.parent))
    r = subprocess.run([sys.executable, str(BENCH / argv[0]), *argv[1:]], capture_output=True, text=True, env=env,
                       cwd=BENCH.parent, timeout=120)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("usage: ") and words in r.stderr and r.stdout == ""


def test_json_path_problem(tmp_path):
    from driverlevel._cli_common import json_path_problem

    f = tmp_path / "afile"
    f.write_text("x")
    assert json_path_problem(None) is None and json_path_problem("-") is None
    assert json_path_problem("-", stdout_ok=False) == "'-' (stdout) is not supported by this script: give a file path"
    assert json_path_problem(None, stdout_ok=False) is None
    assert json_path_problem(str(tmp_path / "out.json")) is None
    assert json_path_problem(str(f)) is None  # an existing file is overwritten
    assert json_path_problem(str(tmp_path)) == f"{str(tmp_path)!r} is a directory, not a file"
    assert json_path_problem(str(f / "x.json")) == f"the directory {str(f)!r} is not a directory"
    assert json_path_problem("/nonexistent-dir/x.json") == "the directory '/nonexistent-dir' does not exist"
    assert json_path_problem("") == "'' is an empty path, not a file"  # review 17 L9: Path('') is '.'


def test_json_path_problem_spelled_as_a_directory(tmp_path):
    """Review 16 #5: 'newdir/' (not there yet) passed, Path() having dropped the slash; open() then
    failed with IsADirectoryError after the run. '.' and '..' as the last component too."""
    from driverlevel._cli_common import json_path_problem

    for path in (f"{tmp_path}/newdir/", f"{tmp_path}/", f"{tmp_path}/newdir/.", f"{tmp_path}/.", f"{tmp_path}/.."):
        assert json_path_problem(path) == f"{str(path)!r} is a directory, not a file", path
        with pytest.raises(OSError):  # what writing the JSON would have met
            open(path, "w")
    assert json_path_problem(f"{tmp_path}/newdir.json") is None


def test_bench_replay_script_json_stdout_without_gpu(capsys, monkeypatch):
    """Review 15 #11 through the script: --json - gives the JSON error object on stdout, as capture-demo --json."""
    import json

    from driverlevel import _device

    monkeypatch.setattr(_device, "device_count", lambda: 0)
    assert _load("bench_replay").main(["--json", "-"]) == 2
    cap = capsys.readouterr()
    assert json.loads(cap.out) == {"error": _device.NO_GPU_MESSAGE, "exit_status": 2}
    assert cap.err.strip() == _device.NO_GPU_MESSAGE


# -- tile names in any case ----------------------------------------------------------------------------------
@pytest.mark.parametrize("script, argv", [("bench_attention", ["--tile", "SM_120", "--json", "/nonexistent-dir/x"]),
                                          ("profile_tile", ["--tile", "SM_120", "--heads", "0"])])
def test_benchmark_tile_names_are_case_insensitive(script, argv, capsys):
    """'--tile SM_120' was an invalid choice; now the option passes and the next check speaks."""
    from test_bench_args import _load

    with pytest.raises(SystemExit) as e:
        _load(script).main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice" not in err and ("--json:" in err or "--heads must be" in err), err


def test_bench_tiles_named_spec_in_any_case():
    from test_bench_args import _load

    mod = _load("bench_tiles")
    assert mod.parse_tile("a=SM_120")[1] == mod.parse_tile("a=sm_120")[1]
    assert mod.parse_tile("a=Native")[1] is None


# -- bench replay's --replays, --repeats and --nodes have upper bounds ---------------------------------------
def _no_gpu_check(monkeypatch):
    from driverlevel import _device

    monkeypatch.setattr(_device, "gpu_usable", lambda: pytest.fail("the GPU check came before the options'"))
    monkeypatch.setattr(_device, "require_gpu", lambda: pytest.fail("the GPU check came before the options'"))
    monkeypatch.setattr(_device, "Device", lambda *a: pytest.fail("a device was opened"))


@pytest.mark.parametrize("argv, words", [
    (["--replays", str(10**9)], "--replays must be <= 1,000,000 (calls per variant and repetition), got 1,000,000,000"),
    (["--replays", "1000001"], "--replays must be <= 1,000,000"),
    (["--repeats", "101"], "--repeats must be <= 100, got 101"),
    (["--repeats", str(10**9)], "--repeats must be <= 100, got 1,000,000,000"),
    (["--nodes", "1,10,1001"], "--nodes: 1,001 in '1,10,1001' is above 1,000 kernels per graph: give"),
    (["--nodes", str(10**9)], "--nodes: 1,000,000,000 is above 1,000 kernels per graph"),
    # the lower bounds keep their words
    (["--replays", "5"], "--replays must be >= 100 and --repeats >= 1, got 5 and 5"),
])
def test_bench_replay_script_bounds(argv, words, capsys, monkeypatch):
    """10**9 replays or repeats ran for days; 10**9 kernels per graph prepared launches until memory ran out."""
    from test_bench_args import _load

    _no_gpu_check(monkeypatch)
    with pytest.raises(SystemExit) as e:
        _load("bench_replay").main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"bench_replay.py: error: {words}" in err or f"error: {words}" in err, err
    assert err.startswith("usage: ")


@pytest.mark.parametrize("argv, words", [
    (["--replays", str(10**9)], "Invalid value for '--replays': 1000000000 is not in the range 100<=x<=1000000"),
    (["--repeats", "101"], "Invalid value for '--repeats': 101 is not in the range 1<=x<=100"),
    (["--nodes", "1,5000"], "Invalid value for --nodes: 5,000 in '1,5000' is above 1,000 kernels per graph"),
])
def test_bench_replay_command_bounds(argv, words, monkeypatch):
    from click.testing import CliRunner

    from driverlevel import cli

    _no_gpu_check(monkeypatch)
    r = CliRunner().invoke(cli.main, ["bench", "replay", *argv])
    assert r.exit_code == 2, r.output
    assert words in r.stderr


def test_bench_replay_bounds_at_the_limit_pass_the_checks(monkeypatch):
    """The largest accepted values reach main_from_options (the GPU check), the script's and the command's."""
    from click.testing import CliRunner

    from driverlevel import bench_replay, cli
    from test_bench_args import _load

    seen = []
    monkeypatch.setattr(bench_replay, "main_from_options", lambda *a: seen.append(a[:3]) or 0)
    argv = ["--replays", "1000000", "--repeats", "100", "--nodes", "1,1000"]
    assert _load("bench_replay").main(argv) == 0
    assert CliRunner().invoke(cli.main, ["bench", "replay", *argv]).exit_code == 0
    assert seen == [([1, 1000], 1_000_000, 100)] * 2


@pytest.mark.parametrize("kw, words", [
    (dict(replays=10**9), "replays must be <= 1,000,000"), (dict(repeats=1000), "repeats must be <= 100"),
    (dict(counts=(1, 2000)), "counts: kernel counts must be 1 to 1,000 per graph, got 2,000"),
    (dict(counts=(0,)), "counts: kernel counts must be 1 to 1,000 per graph, got 0"),
])
def test_bench_replay_run_checks_before_the_device(kw, words, monkeypatch):
    from driverlevel import bench_replay

    _no_gpu_check(monkeypatch)
    with pytest.raises(ValueError, match=words):
        bench_replay.run(0, **kw)


# -- the other benchmarks' upper bounds, refused before the GPU check ----------------------------------------
class ReachedTheGPUCheck(Exception):
    pass


@pytest.fixture
def gpu_check(monkeypatch):
    """The GPU check raises :class:`ReachedTheGPUCheck`: the options were all taken."""
    def reached():
        raise ReachedTheGPUCheck

    monkeypatch.setattr(_device, "gpu_usable", reached)
    monkeypatch.setattr(_device, "require_gpu", reached)


_TILE_MEMORY = ("--batch 1024 x (--prefix 65536 + --tokens 256) with --heads 16 needs 81.8 GiB of inputs on the "
                "GPU, more than 64 GiB: lower --batch, --prefix, --tokens or --heads")


@pytest.mark.parametrize("script, argv, words", [
    ("peer_read", ["--batch", "1", "2000"], "--batch must be <= 1024 (1024 x 15 x 163840 logits are 10 GB in "
     "float32), got 2000"),
    ("peer_read", ["--k", "163841"], "--k must be <= 163840 (torch.topk takes at most a row's 163840 logits), "
     "got 163841"),
    ("peer_read", ["--reps", "10001"], "--reps must be <= 10000 (each writes 256 MB before it is timed), got 10001"),
    ("profile_topk", ["--batch", "257"], "--batch must be <= 256 (the target logits are batch x (budget + 1) x "
     "163840 bf16: 43 GB at batch 256 and budget 512), got 257"),
    ("profile_tile", ["--heads", "129"], "--heads must be <= 128 (an MLA model's heads, as bench_step.py's "
     "--heads), got 129"),
    ("profile_tile", ["--batch", "1025"], "--batch must be <= 1024 (VerifyAttention's MAX_BATCH), got 1025"),
    ("profile_tile", ["--prefix", str(2**31)], "--prefix must be <= 2147483647 (VerifyMetadata's kv_indptr is "
     "int32), got 2147483648"),
    ("profile_tile", ["--tokens", "1025"], "--tokens must be <= 1024 (twice the draft tokens a DDTree step verifies "
     "at most), got 1025"),
    ("profile_tile", ["--batch", "1024", "--prefix", "65536"], _TILE_MEMORY),
    ("profile_tile", ["--prefix", "100000000"], "--batch 2 x (--prefix 100000000 + --tokens 256) with --heads 16 "
     "needs 217.6 GiB"),
    ("bench_ddtree", ["--max-context", "268434944"], "--max-context must be <= 268434943 (batch 8 x (max_context "
     "+ 513) KV slots must fit the state's int32 req_to_token; 69 GB of state there), got 268434944"),
])
def test_benchmark_options_above_their_bound_are_usage_errors(script, argv, words, capsys, gpu_check):
    """Each went on to the GPU check and failed there: out of memory, a plan's ValueError after the
    batch-1 rows ran (bench_ddtree), or hours of repetitions."""
    assert_usage_error(script, argv, words, capsys)


@pytest.mark.parametrize("script, argv", [
    ("peer_read", []), ("peer_read", ["--batch", "1", "1024", "--k", "163840", "--reps", "10000"]),
    ("profile_topk", []), ("profile_topk", ["--batch", "256", "--budget", "512"]),
    ("profile_tile", []), ("profile_tile", ["--heads", "128", "--batch", "1024", "--prefix", "32768",
                                            "--tokens", "16"]),
    ("profile_tile", ["--prefix", "50000000", "--batch", "1"]),
    ("bench_ddtree", []), ("bench_ddtree", ["--max-context", "268434943"]),
    ("bench_step", []), ("bench_step", ["--prompt-len", "65536", "--batch", "256"]),
    ("bench_step", ["--prompt-len", "2"]),
])
def test_defaults_and_values_at_the_bounds_reach_the_gpu_check(script, argv, gpu_check):
    with pytest.raises(ReachedTheGPUCheck):
        _load_bench(script).main(argv)


def test_bench_step_prompt_len_range_is_capture_demos():
    """bench_step.py --prompt-len and --max-new-tokens take what ``driverlevel capture-demo``'s take (their
    click ranges; one more is a usage error: test_bad_options_and_json_paths_are_usage_errors)."""
    from driverlevel.demo.capture_demo import capture_demo

    opt = next(p for p in capture_demo.params if p.name == "prompt_len")
    bench_step = _load_bench("bench_step")
    assert (bench_step.MIN_PROMPT_LEN, bench_step.MAX_PROMPT_LEN) == (opt.type.min, opt.type.max)
    opt = next(p for p in capture_demo.params if p.name == "max_new_tokens")
    assert (1, bench_step.MAX_NEW_TOKENS) == (opt.type.min, opt.type.max)


def test_bench_ddtree_bound_fits_the_state_it_allocates():
    """At --max-context MAX_CONTEXT the batch-8 state's slots fit an int32 req_to_token (RequestState's
    rule) and DDTreePlan's int32 kv_indptr; one more token does not."""
    from driverlevel.request_state import RequestState

    mod = _load_bench("bench_ddtree")
    mc, b = mod.MAX_CONTEXT, max(mod.BATCHES)
    RequestState.specs(max_batch=b, max_context=mc, num_slots=b * (mc + 513))
    assert b * mc <= 2**31 - 1
    with pytest.raises(ValueError, match="num_slots must be at most 2"):
        RequestState.specs(max_batch=b, max_context=mc + 1, num_slots=b * (mc + 1 + 513))


@pytest.mark.skipif(not __import__("os").path.isdir("/proc/self"), reason="needs Linux's /proc")
def test_json_path_problem_tries_the_path_as_root_too(tmp_path):
    """``os.access`` says yes to root for any path, so ``--json /proc/x.json`` passed the check and the
    run's minutes were lost at the write (a fresh-user trial, run as root, sixty-fourth session):
    the check now tries the path. The try leaves nothing behind, and an existing file untouched."""
    import os

    from driverlevel._cli_common import json_path_problem
    problem = json_path_problem("/proc/x.json")
    assert problem is not None and problem.startswith("the directory '/proc' is not writable ("), problem
    assert json_path_problem(str(tmp_path / "new.json")) is None
    assert not (tmp_path / "new.json").exists()
    old = tmp_path / "old.json"
    old.write_text("{}\n")
    os.utime(old, (1, 1))
    assert json_path_problem(str(old)) is None
    assert old.read_text() == "{}\n" and old.stat().st_mtime == 1
    assert json_path_problem("/dev/null") is None  # (a device: left to the write, not opened)


def test_write_json_file_writes_whole_or_not_at_all(tmp_path, monkeypatch):
    """The JSON of a benchmark or tool run: a failed write leaves the old file as it was and no
    temporary file, and says why in one line (before, a full disk left a truncated JSON and the
    error was reported as a failure of standard output)."""
    import os
    import stat

    from driverlevel import _cli_common
    from driverlevel._cli_common import write_json_file
    f = tmp_path / "r.json"
    assert write_json_file(str(f), '{"a": 1}\n') is None and f.read_text() == '{"a": 1}\n'
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(f.stat().st_mode) == 0o666 & ~umask  # (as open(path, "w") would make it)
    f.chmod(0o640)
    assert write_json_file(str(f), '{"a": 2}\n') is None and f.read_text() == '{"a": 2}\n'
    assert stat.S_IMODE(f.stat().st_mode) == 0o640  # (an existing file keeps its bits)
    link = tmp_path / "link.json"
    link.symlink_to(f)
    assert write_json_file(str(link), '{"a": 3}\n') is None
    assert link.is_symlink() and f.read_text() == '{"a": 3}\n'

    def full(src, dst):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(_cli_common.os, "replace", full)
    assert write_json_file(str(f), '{"a": 4}\n') == "cannot write it: No space left on device"
    assert f.read_text() == '{"a": 3}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "r.json"]

    def no_temp(*args, **kwargs):  # (a directory that takes no new file, the file itself writable)
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(_cli_common.tempfile, "mkstemp", no_temp)
    assert write_json_file(str(f), '{"a": 5}\n') is None and f.read_text() == '{"a": 5}\n'
    assert write_json_file(str(tmp_path / "new.json"), "{}\n") == "cannot write it: Permission denied"
    assert not (tmp_path / "new.json").exists()


@pytest.mark.skipif(not __import__("os").path.exists("/dev/full"), reason="needs /dev/full")
def test_bench_replay_names_the_json_file_it_cannot_write(capsys, monkeypatch):
    """``driverlevel bench replay --json /dev/full``: the write's failure is returned to be reported
    with the file's name (exit 2), not raised as if standard output had failed."""
    from driverlevel import bench_replay
    monkeypatch.setattr(bench_replay, "format_table", lambda result: "the table")
    monkeypatch.setattr(bench_replay, "to_json", lambda result: "{}")
    assert bench_replay.write_result({}, "/dev/full") == "cannot write it: No space left on device"
    assert capsys.readouterr().out == "the table\n"


def test_dump_json_file_gives_the_exit_status_and_names_the_file(tmp_path, capsys):
    """The benchmarks' and code_sections.py's end of a run: 0 and the JSON written, or 2 and one line
    naming the file (the label is the option's)."""
    import json

    from driverlevel._cli_common import dump_json_file
    f = tmp_path / "r.json"
    assert dump_json_file(str(f), {"a": [1, 2]}, indent=2) == 0
    assert json.loads(f.read_text()) == {"a": [1, 2]} and f.read_text().endswith("\n")
    assert capsys.readouterr().err == ""
    if __import__("os").path.exists("/dev/full"):
        assert dump_json_file("/dev/full", {}, label="out") == 2
        assert capsys.readouterr().err == "out /dev/full: cannot write it: No space left on device\n"


def test_json_path_problem_links_and_long_names(tmp_path):
    """Review 76: a symbolic link loop (RuntimeError from Path.resolve on Python 3.11) and a name
    too long (OSError from Path.is_dir) raised out of the check; a dangling link was called an
    unwritable directory ("File exists"), though write_json_file writes its target."""
    from driverlevel._cli_common import json_path_problem, write_json_file

    loop = tmp_path / "loop"
    loop.symlink_to("loop")
    assert json_path_problem(str(loop)) == f"{str(loop)!r} cannot be written: Too many levels of symbolic links"
    long = str(tmp_path / ("a" * 300 + ".json"))
    assert json_path_problem(long) == f"{long!r} cannot be written: File name too long"
    dangling = tmp_path / "out.json"
    dangling.symlink_to("target.json")
    assert json_path_problem(str(dangling)) is None
    assert not (tmp_path / "target.json").exists()  # the check's trial file is removed
    assert write_json_file(str(dangling), "{}\n") is None
    assert (tmp_path / "target.json").read_text() == "{}\n" and dangling.is_symlink()
    elsewhere = tmp_path / "to-nowhere.json"
    elsewhere.symlink_to("/nonexistent-dir/x.json")
    assert json_path_problem(str(elsewhere)) == "the directory '/nonexistent-dir' does not exist"
    assert write_json_file(str(loop), "{}\n") == "cannot write it: Too many levels of symbolic links"
