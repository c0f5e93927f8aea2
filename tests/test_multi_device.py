"""One captured decode step per GPU (issue 6): threads per GPU, processes per GPU, ``--devices``.

With one GPU the same code runs with two threads on that GPU, and the process path with
one process; the ``multigpu`` tests need two or more GPUs and are skipped otherwise.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

import driverlevel as dl
from driverlevel.cli import main as cli_main
from driverlevel.demo import reference as R
from driverlevel.demo._mla_weights import MLAModelConfig, make_weights
from driverlevel.demo.multi_device import (RankConfig, _prompts, parse_devices, run_rank, run_ranks_processes,
                                           run_ranks_threads)

CFG = RankConfig(vocab=2048, heads=9, batch=2, prompt_len=48, max_new_tokens=200, budget=16, replays=1000)


def test_parse_devices():
    assert parse_devices("0") == [0]
    assert parse_devices(" 0, 1 ,3") == [0, 1, 3]
    assert parse_devices("0,0") == [0, 0]
    for bad in ("", ",", "a", "-1", "0,1.5"):
        with pytest.raises(ValueError):
            parse_devices(bad)
    for bad in ("0,,1", "0,", ",1", "0, ,1"):  # an empty item was dropped silently
        with pytest.raises(ValueError, match="empty GPU ordinal"):
            parse_devices(bad)


def test_devices_option_rejects_bad_lists():
    r = CliRunner().invoke(cli_main, ["capture-demo", "--devices", "0,x"])
    assert r.exit_code == 2
    assert "--devices" in r.output and "'x' is not a non-negative integer" in r.output


@pytest.fixture(scope="module")
def single():
    """The reference: one rank, alone, on GPU 0, whose tokens are the float64 greedy reference's (the
    demo model's top-1 margins over these 200 steps are >= 3.69 logits: no bf16 rounding can flip one)."""
    if dl.device_count() == 0:
        pytest.skip("needs a CUDA GPU")
    res = run_rank(0, 0, RankConfig(**{**CFG.__dict__, "replays": 1}))
    w = make_weights(MLAModelConfig(vocab_size=CFG.vocab, num_heads=CFG.heads, seed=CFG.seed))
    want = R.greedy_generate_reference(w, _prompts(CFG), CFG.max_new_tokens)
    assert res.tokens == want, "one rank alone differs from the float64 greedy reference"
    return res


def _check(results, single, ordinals):
    assert [r.device for r in results] == list(ordinals)
    for r in results:
        assert r.tokens == single.tokens, f"rank {r.rank} on GPU {r.device} produced other tokens"
        assert r.rounds_identical
        assert r.replays >= CFG.replays
        assert r.foreign_pointers == 0, "a graph points into another GPU's pools"
        assert r.unregistered_pointers == 0
        assert r.graph_nodes > 0 and r.capture_ms > 0


@pytest.mark.gpu
def test_two_threads_on_one_gpu_capture_and_replay_concurrently(single):
    assert len(single.tokens) == CFG.batch and all(len(t) == CFG.max_new_tokens for t in single.tokens)
    results = run_ranks_threads([0, 0], CFG)
    _check(results, single, [0, 0])


@pytest.mark.gpu
def test_process_path_on_one_gpu(single):
    results = run_ranks_processes([0], RankConfig(**{**CFG.__dict__, "replays": 50}))
    assert results[0].tokens == single.tokens and results[0].foreign_pointers == 0


@pytest.mark.gpu
def test_capture_demo_ranks_on_one_gpu():
    r = CliRunner().invoke(cli_main, ["capture-demo", "--devices", "0,0", "--batch", "2", "--prompt-len", "48",
                                      "--max-new-tokens", "64", "--vocab", "2048"])
    assert r.exit_code == 0, r.output
    assert "[rank 0 | GPU 0" in r.output and "[rank 1 | GPU 0" in r.output
    assert "tokens identical on every rank: yes" in r.output


@pytest.mark.gpu
@pytest.mark.multigpu
def test_one_thread_per_gpu(single):
    n = dl.device_count()
    results = run_ranks_threads(range(n), CFG)
    _check(results, single, range(n))


@pytest.mark.gpu
@pytest.mark.multigpu
def test_one_process_per_gpu(single):
    n = dl.device_count()
    results = run_ranks_processes(range(n), CFG)
    _check(results, single, range(n))
