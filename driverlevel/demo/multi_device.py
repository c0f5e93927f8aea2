"""One captured decode step per GPU, as tensor-parallel ranks run it.

Every rank builds its own model, plans, pools and decode-step graph on its own
device, captures in thread-local mode and replays; nothing is shared between
ranks but the read-only configuration. Two ways to run ranks:

* :func:`run_ranks_threads`: one process, one thread per entry of ``devices``
  (an ordinal may repeat: two threads on one GPU exercise the same path where
  only one GPU is at hand);
* :func:`run_ranks_processes`: one process per GPU, started with
  ``CUDA_VISIBLE_DEVICES`` set to that GPU (``python -m driverlevel.demo.multi_device``).

Each rank reports its capture time, memory, step latency, generated tokens and
the graph audit: pointers of its graph that lie in another device's pools
(``foreign_pointers``, must be 0) or in no registered pool
(``unregistered_pointers``, must be 0 for the built-in model).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field

import numpy as np

__all__ = ["RankConfig", "RankResult", "run_rank", "run_ranks_threads", "run_ranks_processes", "parse_devices"]


@dataclass(frozen=True)
class RankConfig:
    """What every rank builds and runs (identical on every rank, so the tokens must agree).

    Attributes
    ----------
    vocab, heads : int
        Demo model size (see :class:`~driverlevel.demo.mla_model.MLAModelConfig`).
    batch, prompt_len, max_new_tokens : int
        Requests per rank, prompt length (tokens), tokens to generate per request.
    budget, depth_limit : int
        DDTree node budget (excluding the root) and depth limit.
    replays : int
        At least this many graph replays per rank: generation rounds over the same
        prompts are repeated until the count is reached (each round must give the
        same tokens).
    seed : int
        Seed of weights, prompts and drafter noise.
    """

    vocab: int = 2048
    heads: int = 9
    batch: int = 2
    prompt_len: int = 64
    max_new_tokens: int = 256
    budget: int = 16
    depth_limit: int = 15
    replays: int = 100
    seed: int = 0


@dataclass
class RankResult:
    """What one rank did (JSON-serialisable).

    Attributes
    ----------
    rank, device : int
        Rank index and the CUDA ordinal it ran on (as seen by its process).
    device_name : str
    tokens : list of list of int
        Tokens of the first generation round, per request.
    rounds, replays : int
        Generation rounds and graph replays run.
    capture_ms : float
        Capture + instantiate time of the step graph, ms.
    graph_nodes : int
    workspace_bytes : int
        Bytes of the runner's pools.
    free_after_capture_bytes : int
    step_median_us : float
        Median host latency of a step (launch to results read), µs.
    foreign_pointers, unregistered_pointers : int
        Graph-audit counts (must be 0).
    rounds_identical : bool
        Every round produced the first round's tokens.
    """

    rank: int
    device: int
    device_name: str = ""
    tokens: list = field(default_factory=list)
    rounds: int = 0
    replays: int = 0
    capture_ms: float = 0.0
    graph_nodes: int = 0
    workspace_bytes: int = 0
    free_after_capture_bytes: int = 0
    step_median_us: float = 0.0
    foreign_pointers: int = 0
    unregistered_pointers: int = 0
    rounds_identical: bool = True


def parse_devices(text: str) -> list[int]:
    """``"0,1"`` -> ``[0, 1]``.

    Raises
    ------
    ValueError
        For an empty list, an empty entry (``"0,,1"``, ``"0,"``) or a non-integer / negative entry.
    """
    parts = [p.strip() for p in str(text).split(",")]
    if not any(parts):
        raise ValueError("expected a comma-separated list of GPU ordinals, e.g. 0,1")
    if not all(parts):
        raise ValueError(f"empty GPU ordinal in {str(text)!r}: give ordinals separated by single commas, e.g. 0,1")
    out = []
    for p in parts:
        if not p.isdigit():
            raise ValueError(f"GPU ordinal {p!r} is not a non-negative integer")
        out.append(int(p))
    return out


def _prompts(cfg: RankConfig) -> list:
    rng = np.random.default_rng(cfg.seed)
    return [rng.integers(0, cfg.vocab, size=cfg.prompt_len - (b % 3)).tolist() for b in range(cfg.batch)]


def run_rank(rank: int, ordinal: int, cfg: RankConfig) -> RankResult:
    """Build, capture and replay one rank's decode step on device ``ordinal`` in the calling thread.

    Raises
    ------
    DriverUnavailableError, ValueError
        No such device.
    CaptureError, CudaError
        If capture or a replay fails.
    """
    from .._device import Device
    from ..runner import DecodeStepRunner
    from .drafter import Drafter
    from .mla_model import MLAModel, MLAModelConfig

    dev = Device(ordinal)
    dev.set_current()
    prompts = _prompts(cfg)
    max_prompt = max(len(p) for p in prompts)
    model = MLAModel(dev, MLAModelConfig(vocab_size=cfg.vocab, num_heads=cfg.heads, seed=cfg.seed))
    stream = dev.create_stream()
    drafter = Drafter(model, max_batch=cfg.batch, depth_limit=cfg.depth_limit, seed=cfg.seed, name=f"rank{rank}.drafter")
    runner = DecodeStepRunner(dev, model=model, drafter=drafter, max_batch=cfg.batch, budget=cfg.budget,
                              depth_limit=cfg.depth_limit, max_context=max_prompt + cfg.max_new_tokens + cfg.budget + 2,
                              max_prompt_len=max_prompt, stream=stream, name=f"rank{rank}")
    runner.reset(prompts, cfg.max_new_tokens)
    runner.capture()
    dev.synchronize()
    res = RankResult(rank=rank, device=ordinal, device_name=dev.name, capture_ms=runner.capture_seconds * 1e3,
                     graph_nodes=runner.graph.node_count(), workspace_bytes=runner.workspace_bytes,
                     free_after_capture_bytes=dev.mem_info()[0])
    for k in runner.graph.kernel_nodes():
        res.foreign_pointers += len(k.foreign(ordinal))
        res.unregistered_pointers += len(k.unregistered)
    step_s = []
    while res.replays < cfg.replays or res.rounds == 0:
        out = runner.generate(prompts, cfg.max_new_tokens, graph=True)
        step_s.extend(out.step_seconds)
        res.replays += out.steps
        if res.rounds == 0:
            res.tokens = [list(map(int, t)) for t in out.tokens]
        elif [list(map(int, t)) for t in out.tokens] != res.tokens:
            res.rounds_identical = False
        res.rounds += 1
    runner.check_slots()
    res.step_median_us = statistics.median(step_s) * 1e6 if step_s else 0.0
    return res


def run_ranks_threads(devices, cfg: RankConfig = RankConfig()) -> list[RankResult]:
    """Run one rank per entry of ``devices`` in its own thread, all at once; results in rank order.

    Raises
    ------
    The first exception any rank raised.
    """
    devices = list(devices)
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(devices), thread_name_prefix="rank") as ex:
        futures = [ex.submit(run_rank, r, d, cfg) for r, d in enumerate(devices)]
        return [f.result() for f in futures]


def run_ranks_processes(devices, cfg: RankConfig = RankConfig(), timeout: float = 600.0) -> list[RankResult]:
    """Run one rank per GPU, each in its own process with ``CUDA_VISIBLE_DEVICES`` set to that GPU.

    The processes share nothing; each sees its GPU as ordinal 0. Results in rank order,
    with ``device`` set to the physical ordinal.

    Raises
    ------
    RuntimeError
        If a rank's process fails (its stderr is in the message).
    """
    devices = list(devices)
    procs = []
    for r, d in enumerate(devices):
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=str(d))
        cmd = [sys.executable, "-m", "driverlevel.demo.multi_device", "--rank", str(r), "--config",
               json.dumps(dataclasses.asdict(cfg))]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for r, (d, p) in enumerate(zip(devices, procs)):
        out, err = p.communicate(timeout=timeout)
        if p.returncode != 0:
            raise RuntimeError(f"rank {r} (GPU {d}) exited with status {p.returncode}:\n{err.strip()}")
        res = RankResult(**json.loads(out))
        res.device = d
        results.append(res)
    return results


def _main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description="Run one rank of driverlevel's decode step on GPU 0 of this process.")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--config", default="{}", help="RankConfig fields as JSON")
    args = ap.parse_args(argv)
    from .._device import require_gpu

    require_gpu()
    cfg = RankConfig(**json.loads(args.config))
    t0 = time.perf_counter()
    res = run_rank(args.rank, 0, cfg)
    print(json.dumps(dataclasses.asdict(res)))
    print(f"rank {args.rank}: {res.replays} replays in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(_main())
