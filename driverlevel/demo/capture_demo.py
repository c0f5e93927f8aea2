"""``driverlevel capture-demo``: the whole DDTree decode step as one CUDA graph, checked lossless.

Builds the demo MLA model and its drafter, compiles the kernels (saying whether the cubin
cache was hit), plans and allocates every buffer, captures one full step, then:

1. runs the same prompts eagerly and from the graph and states that the tokens are identical;
2. lists the captured kernel nodes (``Graph.audit()``), so a silent fallback would show;
3. replays the step with a progress bar and reports median / p99 step latency, tokens per
   step, tokens per second;
4. does the same for plain autoregressive decoding with the same model (one token per step,
   also a graph) and reports the speed-up;
5. checks that DDTree's tokens equal the autoregressive tokens for every request (lossless).

On a machine without a usable GPU it prints one sentence and exits with status 2.
``--json`` writes one JSON object (see :data:`JSON_SCHEMA`) to stdout; the log goes to stderr.

The heavy modules are imported only when the demo runs, so ``--help`` and the no-GPU path
stay fast.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field

import click

from .._constants import MAX_BUDGET, MAX_DEPTH

__all__ = ["capture_demo", "run", "DemoReport", "JSON_SCHEMA", "NO_GPU_MESSAGE", "check_schema"]

from .._cli_common import json_usage_errors, report_no_gpu  # noqa: E402
from .._device import NO_GPU_MESSAGE, gpu_usable  # noqa: E402 - re-exported for the tests

#: Keys of the ``--json`` object and their types (nested dicts list their own keys).
JSON_SCHEMA = {
    "device": {"name": str, "arch": str, "sm_count": int, "driver": str, "nvrtc": str},
    "config": {"heads": int, "vocab": int, "d_model": int, "batch": int, "budget": int, "depth_limit": int,
               "prompt_lens": list, "max_new_tokens": int, "num_splits": int, "ar_num_splits": int, "seed": int,
               "arch": str, "max_context": int},
    "compile": {"seconds": float, "cubins": list},
    "memory": {"weights_bytes": int, "ddtree_workspace_bytes": int, "ar_workspace_bytes": int,
               "graph_bytes": int, "free_after_capture_bytes": int, "total_bytes": int},
    "capture": {"seconds": float, "nodes": int, "kernel_nodes": int, "unregistered_pointers": int,
                "kernels": list},
    "eager_equals_graph": bool,
    "ddtree": {"steps": int, "tokens": int, "median_us": float, "p99_us": float, "gpu_median_us": float,
               "tokens_per_step": float, "tokens_per_s": float},
    "autoregressive": {"steps": int, "tokens": int, "median_us": float, "p99_us": float, "gpu_median_us": float,
                       "tokens_per_step": float, "tokens_per_s": float},
    "speedup": float,
    "lossless": bool,
    "requests_equal": int,
    "tokens_compared": int,
    "seconds": float,
}


def check_schema(obj: dict, schema: dict = JSON_SCHEMA, where: str = "") -> None:
    """Raise ``ValueError`` naming the first key of ``obj`` missing or of the wrong type."""
    for k, t in schema.items():
        if k not in obj:
            raise ValueError(f"missing key {where}{k}")
        v = obj[k]
        if isinstance(t, dict):
            if not isinstance(v, dict):
                raise ValueError(f"{where}{k} must be an object")
            check_schema(v, t, f"{where}{k}.")
        elif t is float:
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                raise ValueError(f"{where}{k} must be a number, got {type(v).__name__}")
        elif t is int:
            if not isinstance(v, int) or isinstance(v, bool):
                raise ValueError(f"{where}{k} must be an int, got {type(v).__name__}")
        elif not isinstance(v, t):
            raise ValueError(f"{where}{k} must be {t.__name__}, got {type(v).__name__}")


@dataclass
class DemoReport:
    """Everything the demo measured; :meth:`to_json` gives the ``--json`` object."""

    device: dict = field(default_factory=dict)
    config: dict = field(default_factory=dict)
    compile: dict = field(default_factory=dict)
    memory: dict = field(default_factory=dict)
    capture: dict = field(default_factory=dict)
    eager_equals_graph: bool = False
    ddtree: dict = field(default_factory=dict)
    autoregressive: dict = field(default_factory=dict)
    speedup: float = 0.0
    lossless: bool = False
    requests_equal: int = 0
    tokens_compared: int = 0
    seconds: float = 0.0

    def to_json(self) -> dict:
        return asdict(self)


class _Log:
    def __init__(self, to_stderr: bool):
        self.err = to_stderr

    def __call__(self, msg: str = "") -> None:
        for line in str(msg).splitlines() or [""]:
            click.echo(f"[driverlevel] {line}", err=self.err)


def _mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def _gib(n: int) -> str:
    return f"{n / 2**30:,.2f} GiB"


def _stats_us(seconds: list) -> tuple[float, float]:
    import numpy as np

    if not seconds:
        return 0.0, 0.0
    a = np.asarray(seconds) * 1e6
    return float(np.median(a)), float(np.percentile(a, 99))


def _prompts(rng, batch: int, prompt_len: int, vocab: int) -> list:
    lens = [max(2, prompt_len - (b * (prompt_len // 2)) // max(batch - 1, 1)) for b in range(batch)]
    return [rng.integers(0, vocab, size=n).tolist() for n in lens]


def _timed_run(runner, prompts, max_new, max_steps, bar=None):
    """Graph replays until every request finished; per-step host latency and GPU time."""
    runner.reset(prompts, max_new)
    lat, gpu = [], []
    steps = 0
    while not runner.all_finished and steps < max_steps:
        before = runner._step_tokens
        t0 = time.perf_counter()
        runner.step(graph=True)
        runner.collect()
        lat.append(time.perf_counter() - t0)
        gpu.append(runner.step_gpu_ms(steps) * 1e3)
        steps += 1
        if bar is not None:
            bar.update(runner._step_tokens - before)
    tokens = sum(len(o) for o in runner.outputs)
    med, p99 = _stats_us(lat)
    import numpy as np

    return {
        "steps": steps, "tokens": tokens, "median_us": med, "p99_us": p99,
        "gpu_median_us": float(np.median(gpu)) if gpu else 0.0,
        "tokens_per_step": float(runner.tokens_per_step),
        "tokens_per_s": float(tokens / max(sum(lat), 1e-12)),
    }


@contextlib.contextmanager
def _bad_options():
    """A ValueError from checking the options (a device ordinal, a shape the plans refuse) as a click usage
    error (exit 2). Only the checks before the run go in it: a ValueError of the run itself propagates."""
    from .._compile import UnsupportedTargetError

    try:
        yield
    except UnsupportedTargetError:  # the GPU's own architecture, which the NVRTC lacks: not bad usage
        raise
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


def _run_demo(opts: dict, log: _Log, quiet: bool) -> DemoReport:
    import numpy as np

    from .. import _compile
    from .._device import Device, driver_version
    from ..runner import AutoregressiveRunner, DecodeStepRunner
    from .drafter import Drafter
    from .mla_model import MLAModel, MLAModelConfig

    t_start = time.perf_counter()
    rep = DemoReport()
    ordinal = opts.get("device", 0)
    # Building checks the options against the device and the plans (an ordinal out of range, a shape the plans
    # refuse): its ValueErrors are usage errors. A ValueError later, during the run, is a failure, not bad usage.
    with _bad_options():
        dev = Device(ordinal)
        arch = _compile.normalize_arch(opts["arch"] or dev.arch)
        if arch != dev.arch:
            raise click.UsageError(f"--arch {arch} cannot run on GPU {ordinal}, which is {dev.arch}: "
                                   f"cubins are built for the exact architecture (omit --arch to use {dev.arch})")
        drv = driver_version()
        nv = _compile.nvrtc_version()
        p = dev.properties
        rep.device = {"name": p.name, "arch": dev.arch, "sm_count": p.sm_count, "driver": f"{drv[0]}.{drv[1]}",
                      "nvrtc": f"{nv[0]}.{nv[1]}"}
        log(f"device: {p.name} ({dev.arch}), {p.sm_count} SMs, {_gib(p.total_memory_bytes)}; CUDA driver "
            f"{drv[0]}.{drv[1]}, NVRTC {nv[0]}.{nv[1]}")

        B, budget, L = opts["batch"], opts["budget"], opts["depth_limit"]
        H, V = opts["heads"], opts["vocab"]
        max_new = opts["max_new_tokens"]
        rng = np.random.default_rng(opts["seed"])
        prompts = _prompts(rng, B, opts["prompt_len"], V)
        max_prompt = max(len(x) for x in prompts)
        max_context = max_prompt + max_new + budget + 2
        splits = ar_splits = opts["num_splits"]  # None: the verify attention's scheduler splits on the GPU

        # -- build and compile -----------------------------------------------------------------
        t0 = time.perf_counter()
        cfg = MLAModelConfig(vocab_size=V, num_heads=H, seed=opts["seed"])
        model = MLAModel(dev, cfg, arch=arch)
        log(f"model: 1 MLA layer (absorbed, q/k 576, v 512), {H} heads, d_model {cfg.d_model}, vocab {V}, "
            f"{_mib(model.weight_bytes)} of bf16 weights from seed {cfg.seed}")
        s = dev.create_stream()
        free0 = dev.mem_info()[0]
        drafter = Drafter(model, max_batch=B, depth_limit=L, noise_std=opts["draft_noise"],
                          logit_scale=opts["draft_scale"], seed=opts["seed"], name="ddtree.drafter")
        dd = DecodeStepRunner(dev, model=model, drafter=drafter, max_batch=B, budget=budget, depth_limit=L,
                              max_context=max_context, max_prompt_len=max_prompt, num_splits=splits, stream=s,
                              name="ddtree")
        ar = AutoregressiveRunner(dev, model=model, max_batch=B, max_context=max_context, max_prompt_len=max_prompt,
                                  num_splits=ar_splits, stream=s, name="ar")
    compile_s = time.perf_counter() - t0
    cubins = []
    seen = set()
    for label, cub in (("mla_model.cu", model.cubin), ("verify_attention.cu (tree)", dd.forward.attention.cubin),
                       ("verify_attention.cu (chain)", ar.forward.attention.cubin),
                       ("ddtree.cu", dd.tree.cubin), ("runner.cu", dd._module.cubin),
                       ("argmax.cu", ar._argmax_module.cubin)):
        key = cub.key or id(cub)
        if key in seen:
            continue
        seen.add(key)
        cubins.append({"source": label, "arch": cub.arch, "cache_hit": bool(cub.cache_hit)})
    log(f"compile ({arch}, {compile_s:.1f} s with weights and tables): " +
        ", ".join(f"{c['source']} {'cache hit' if c['cache_hit'] else 'compiled'}" for c in cubins))
    rep.compile = {"seconds": compile_s, "cubins": cubins}
    rep.config = {"heads": H, "vocab": V, "d_model": cfg.d_model, "batch": B, "budget": budget, "depth_limit": L,
                  "prompt_lens": [len(x) for x in prompts], "max_new_tokens": max_new, "num_splits": splits or 0,
                  "ar_num_splits": ar_splits or 0, "seed": opts["seed"], "arch": arch, "max_context": max_context}
    log(f"plan: batch {B}, prompts of {min(rep.config['prompt_lens'])}..{max_prompt} tokens, {max_new} new tokens "
        f"each, tree budget {budget} (+ root), depth limit {L}, split cap {splits or 'none (scheduled on the GPU)'}, "
        f"max context {max_context}")

    # -- capture ------------------------------------------------------------------------------
    dd.reset(prompts, max_new)
    free_before = dev.mem_info()[0]
    dd.capture()
    ar.reset(prompts, max_new)
    ar.capture()
    dev.synchronize()
    free_after = dev.mem_info()[0]
    graph_bytes = max(0, free_before - free_after)
    g = dd.graph
    knodes = g.kernel_nodes()
    unreg = sum(len(k.unregistered) for k in knodes)
    rep.capture = {"seconds": dd.capture_seconds, "nodes": g.node_count(), "kernel_nodes": len(knodes),
                   "unregistered_pointers": unreg, "kernels": [k.name for k in knodes]}
    rep.memory = {"weights_bytes": model.weight_bytes, "ddtree_workspace_bytes": dd.workspace_bytes,
                  "ar_workspace_bytes": ar.workspace_bytes, "graph_bytes": graph_bytes,
                  "free_after_capture_bytes": free_after, "total_bytes": p.total_memory_bytes}
    log(f"capture: one DDTree step in {dd.capture_seconds * 1e3:.1f} ms: {g.node_count()} graph nodes "
        f"({len(knodes)} kernels); autoregressive step: {ar.graph.node_count()} nodes")
    log(f"memory: weights {_mib(model.weight_bytes)}, DDTree workspace {_mib(dd.workspace_bytes)} (KV cache "
        f"{_mib(dd.kv_pool.capacity)}), AR workspace {_mib(ar.workspace_bytes)}, graphs {_mib(graph_bytes)}; "
        f"free device memory after capture {_gib(free_after)} of {_gib(p.total_memory_bytes)} "
        f"(runner allocations {_mib(max(0, free0 - free_after))})")

    # -- eager vs graph ------------------------------------------------------------------------
    eager = dd.generate(prompts, max_new, graph=False).tokens
    graph_out = dd.generate(prompts, max_new, graph=True).tokens
    rep.eager_equals_graph = eager == graph_out
    log(f"eager vs graph: {'identical' if rep.eager_equals_graph else 'DIFFERENT'} tokens for all {B} requests "
        f"({sum(len(t) for t in eager)} tokens)")
    log(f"captured kernel nodes of the DDTree step ({len(knodes)} of {g.node_count()} nodes; the pools each "
        f"kernel's pointer arguments lie in):")
    for k in knodes:
        pools = sorted({(p_.owner or "UNREGISTERED").removeprefix("pool:") for p_ in k.pointers})
        log(f"  {k.name:<26} grid={str(k.grid):<14} block={str(k.block):<13} smem={k.shared_mem:>7,}  "
            f"{', '.join(pools) or '(no pointers)'}")
    if unreg:
        log(f"WARNING: {unreg} pointer argument(s) lie outside driverlevel's pools")

    # -- timed runs ----------------------------------------------------------------------------
    bar = None
    if not quiet:
        from tqdm import tqdm

        bar = tqdm(total=B * max_new, unit="tok", desc="DDTree graph", file=sys.stderr, leave=False)
    rep.ddtree = _timed_run(dd, prompts, max_new, opts["steps"], bar)
    dd_tokens = dd.outputs
    if bar is not None:
        bar.close()
        bar = tqdm(total=B * max_new, unit="tok", desc="autoregressive graph", file=sys.stderr, leave=False)
    rep.autoregressive = _timed_run(ar, prompts, max_new, max_new + 2, bar)
    ar_tokens = ar.outputs
    if bar is not None:
        bar.close()
    d, a = rep.ddtree, rep.autoregressive
    rep.speedup = float(d["tokens_per_s"] / a["tokens_per_s"]) if a["tokens_per_s"] else 0.0
    log(f"DDTree:         {d['steps']} steps, step latency median {d['median_us']:.1f} us, p99 {d['p99_us']:.1f} us "
        f"(GPU {d['gpu_median_us']:.1f} us), {d['tokens_per_step']:.2f} tokens/step, {d['tokens_per_s']:,.0f} tokens/s")
    log(f"autoregressive: {a['steps']} steps, step latency median {a['median_us']:.1f} us, p99 {a['p99_us']:.1f} us "
        f"(GPU {a['gpu_median_us']:.1f} us), {a['tokens_per_step']:.2f} tokens/step, {a['tokens_per_s']:,.0f} tokens/s")
    log(f"speed-up: {rep.speedup:.2f}x tokens/s")

    # -- lossless --------------------------------------------------------------------------------
    equal = 0
    compared = 0
    for x, y in zip(dd_tokens, ar_tokens):
        n = min(len(x), len(y))
        compared += n
        equal += int(x[:n] == y[:n] and n > 0 and (len(x) == len(y) or d["steps"] >= opts["steps"]))
    rep.requests_equal = equal
    rep.tokens_compared = compared
    rep.lossless = equal == B
    log(f"lossless: DDTree tokens {'==' if rep.lossless else '!='} autoregressive tokens for {equal}/{B} requests "
        f"({compared} tokens compared)")
    rep.seconds = time.perf_counter() - t_start
    log(f"done in {rep.seconds:.1f} s")
    return rep


def _run_ranks(opts: dict, devices: list, log: _Log) -> dict:
    """``--devices`` with several entries: one rank per entry, each capturing and replaying its own graph."""
    from .._device import Device
    from .multi_device import RankConfig, run_ranks_threads

    with _bad_options():
        for d in sorted(set(devices)):
            Device(d)  # a bad ordinal fails here, with the number of visible GPUs
        cfg = RankConfig(vocab=opts["vocab"], heads=opts["heads"], batch=opts["batch"], prompt_len=opts["prompt_len"],
                         max_new_tokens=opts["max_new_tokens"], budget=opts["budget"], depth_limit=opts["depth_limit"],
                         replays=1, seed=opts["seed"])
    log(f"ranks: {len(devices)} (one thread each, thread-local capture) on GPU(s) {','.join(map(str, devices))}; "
        f"batch {cfg.batch} per rank, budget {cfg.budget}, {cfg.max_new_tokens} new tokens per request")
    t0 = time.perf_counter()
    results = run_ranks_threads(devices, cfg)
    for r in results:
        log(f"[rank {r.rank} | GPU {r.device} {r.device_name}] capture {r.capture_ms:.1f} ms, {r.graph_nodes} graph "
            f"nodes, workspace {_mib(r.workspace_bytes)}, free after capture {_gib(r.free_after_capture_bytes)}; "
            f"{r.replays} replays, step median {r.step_median_us:.1f} us; pointers into another GPU's pools: "
            f"{r.foreign_pointers}, unregistered: {r.unregistered_pointers}")
    same = all(r.tokens == results[0].tokens for r in results)
    ok = same and all(r.foreign_pointers == 0 and r.unregistered_pointers == 0 and r.rounds_identical
                      for r in results)
    log(f"tokens identical on every rank: {'yes' if same else 'NO'}; done in {time.perf_counter() - t0:.1f} s")
    return {"devices": devices, "ok": ok, "tokens_identical": same,
            "ranks": [{k: v for k, v in asdict(r).items() if k != "tokens"} for r in results]}


def _finite(obj):
    """``obj`` with every non-finite float replaced by None (JSON has no NaN or infinity)."""
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


#: ``--prompt-len``'s range, in tokens: at least 2 (the root and one to prefill). benchmarks/bench_step.py
#: takes the same.
PROMPT_LEN_RANGE = (2, 65536)
#: ``--max-new-tokens``' range (benchmarks/bench_step.py takes the same).
MAX_NEW_TOKENS_RANGE = (1, 65536)

#: Options of the single-device demo that the ranks of ``--devices A,B`` do not take.
_NOT_FOR_RANKS = ("steps", "num_splits", "arch", "draft_noise", "draft_scale")


@click.command("capture-demo", context_settings={"help_option_names": ["-h", "--help"]},
               short_help="The DDTree step as one CUDA graph, checked lossless (needs a GPU).",
               cls=json_usage_errors("as_json"))
@click.option("--heads", default=9, show_default=True, type=click.IntRange(1, 128), help="Query heads of the MLA layer.")
@click.option("--prompt-len", default=512, show_default=True, type=click.IntRange(*PROMPT_LEN_RANGE),
              help="Longest prompt (the committed prefix); requests get 1/2x .. 1x of it.")
@click.option("--max-new-tokens", default=256, show_default=True, type=click.IntRange(*MAX_NEW_TOKENS_RANGE),
              help="Tokens generated per request.")
@click.option("--budget", default=16, show_default=True, type=click.IntRange(1, MAX_BUDGET),
              help="DDTree nodes per request besides the root.")
@click.option("--depth-limit", default=15, show_default=True, type=click.IntRange(1, MAX_DEPTH),
              help="Depths the drafter proposes (block size - 1).")
@click.option("--batch", default=8, show_default=True, type=click.IntRange(1, 256), help="Requests.")
@click.option("--steps", default=1000, show_default=True, type=click.IntRange(1),
              help="Most DDTree steps of the timed run (it stops earlier when every request is done).")
@click.option("--num-splits", default=None, type=click.IntRange(1, 1024),
              help="Cap on the verify attention's split-KV pieces per (request, row tile) pair "
                   "(default: none; its scheduler kernel splits each step's work on the GPU).")
@click.option("--arch", default=None, metavar="sm_XX",
              help="Architecture to compile for: one name, checked as `driverlevel compile --arch` checks it, and "
                   "it must be the GPU's own (cubins are built for the exact architecture). Default: the GPU's.")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(0), help="Seed of weights, prompts and noise.")
@click.option("--vocab", default=32768, show_default=True, type=click.IntRange(64, 1 << 20),
              help="Vocabulary size (a multiple of 8).")
@click.option("--draft-noise", default=1.0, show_default=True, type=click.FloatRange(0.0),
              help="Standard deviation of the drafter's logit noise.")
@click.option("--draft-scale", default=4.0, show_default=True, type=click.FloatRange(0.0, min_open=True),
              help="Sharpness of the drafter (multiplier of its no-context logits).")
@click.option("--devices", multiple=True, default=("0",), show_default=True, metavar="LIST",
              help="GPU ordinals, comma-separated or the option repeated (--devices 0 --devices 1 is 0,1). "
                   "Several entries run one rank per entry (a thread each, "
                   "each capturing its own graph), as tensor-parallel ranks do; an ordinal may repeat. The ranks "
                   "take neither --steps, --num-splits, --arch, --draft-noise nor --draft-scale.")
@click.option("--json", "as_json", is_flag=True, help="Write one JSON object to stdout (the log goes to stderr).")
def capture_demo(heads, prompt_len, max_new_tokens, budget, depth_limit, batch, steps, num_splits, arch, seed, vocab,
                 draft_noise, draft_scale, devices, as_json):
    """Run the DDTree decode step captured as one CUDA graph on a small MLA model, check it lossless.

    Builds the model (seeded bf16 weights, no downloads) and its drafter, compiles the
    kernels (reporting cubin cache hits), plans and allocates, captures one full step
    (draft -> tree build -> tree compile -> target forward -> greedy accept -> commit),
    runs eager and graph and states that the outputs are identical, lists the captured
    kernel nodes, replays the step with a progress bar and reports step latency and
    tokens per second beside the autoregressive baseline (also a graph), and checks that
    the DDTree tokens equal the autoregressive tokens for every request.

    Exits 2 with one sentence when no GPU is usable, 1 if the check fails.
    """
    if vocab % 8:
        raise click.BadParameter(f"must be a multiple of 8, got {vocab}", param_hint="--vocab")
    from ..ddtree import check_merge_capacity

    try:  # DDTreePlan's vocabulary x budget rule, before the GPU check (as bench_step's)
        check_merge_capacity(vocab, budget)
    except ValueError as exc:
        raise click.UsageError(f"--vocab {vocab} with --budget {budget}: {exc}") from None
    for hint, value in (("--draft-noise", draft_noise), ("--draft-scale", draft_scale)):
        if not math.isfinite(value):  # (click's FloatRange lets nan and inf through)
            raise click.BadParameter(f"must be a finite number, got {value}", param_hint=hint)
    from .multi_device import parse_devices

    try:
        device_list = parse_devices(",".join(devices))  # (repeated: every value, in order)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--devices") from None
    if len(device_list) > 1:
        # The ranks run multi_device.RankConfig, which has no such settings: refuse rather than ignore them.
        ctx = click.get_current_context()
        given = [f"--{name.replace('_', '-')}" for name in _NOT_FOR_RANKS
                 if ctx.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT]
        if given:
            raise click.UsageError(f"{', '.join(given)}: the ranks of several --devices do not take "
                                   f"{'this option' if len(given) == 1 else 'these options'}; drop "
                                   f"{'it' if len(given) == 1 else 'them'} or give one device")
    if arch is not None:
        from .._compile import check_arch

        if "," in arch:  # (a list, as `driverlevel compile --arch` takes: this run has one GPU's)
            raise click.BadParameter(f"{arch!r}: capture-demo takes one architecture, the GPU's own "
                                     f"(a list is for `driverlevel compile --arch`)", param_hint="--arch")
        try:
            arch = check_arch(arch)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--arch") from None
    if not gpu_usable():
        raise click.exceptions.Exit(report_no_gpu(json_to_stdout=as_json))
    opts = dict(heads=heads, prompt_len=prompt_len, max_new_tokens=max_new_tokens, budget=budget,
                depth_limit=depth_limit, batch=batch, steps=steps, num_splits=num_splits, arch=arch, seed=seed,
                vocab=vocab, draft_noise=draft_noise, draft_scale=draft_scale)
    log = _Log(to_stderr=as_json)
    if len(device_list) > 1:
        out = _run_ranks(opts, device_list, log)
        if as_json:
            click.echo(json.dumps(_finite(out), indent=2, allow_nan=False))
        raise click.exceptions.Exit(0 if out["ok"] else 1)
    opts["device"] = device_list[0]
    rep = _run_demo(opts, log, quiet=as_json)  # a shape the plans refuse is a usage error there (_bad_options)
    if as_json:
        out = _finite(rep.to_json())
        check_schema(out)
        click.echo(json.dumps(out, indent=2, allow_nan=False))
    ok = rep.lossless and rep.eager_equals_graph and rep.capture.get("unregistered_pointers", 0) == 0
    raise click.exceptions.Exit(0 if ok else 1)


def run(args) -> int:
    """Run ``capture-demo`` with command-line ``args``; returns the exit status (the CLI's entry)."""
    try:
        rv = capture_demo.main(args=list(args), prog_name="driverlevel capture-demo", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        return int(exc.exit_code)
    except click.Abort:
        click.echo("Aborted!", err=True)
        return 1
    return int(rv or 0)


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
