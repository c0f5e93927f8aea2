"""Decode-step benchmark: graph vs eager step latency, DDTree vs autoregressive tokens/s.

On the demo MLA model (seeded bf16 weights), side by side in one run:

* host µs per step (the time ``runner.step()`` spends on the CPU to queue one step) for
  graph replay, for the same launches issued eagerly, and for a bare ``cuGraphLaunch``
  loop on the same executable graph (the floor of graph replay);
* GPU µs per step (events around each step, steps queued back to back);
* tokens per step and tokens per second of DDTree and of autoregressive decoding with the
  same model (one step in flight at a time: what a serving loop that reads each step's
  tokens sees), and the speed-up.

The target of issue 5 is graph replay within 10 µs of host overhead of the bare
``cuGraphLaunch``. Prints a markdown table for BENCHMARKS.md; ``--json`` writes the numbers.

Usage: python benchmarks/bench_step.py [--batch 8] [--budget 16] [--prompt-len 512]
           [--vocab 32768] [--heads 9] [--steps 400] [--json out.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

if __name__ == "__main__":  # (run as a script: a missing package or dependency is one line, exit 2)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
    import tool_output

    tool_output.require_package("benchmarks/bench_step.py")

import numpy as np  # noqa: E402

from driverlevel.demo.capture_demo import MAX_NEW_TOKENS_RANGE, PROMPT_LEN_RANGE  # noqa: E402

#: ``--prompt-len``'s and ``--max-new-tokens``' ranges: ``driverlevel capture-demo``'s.
MIN_PROMPT_LEN, MAX_PROMPT_LEN = PROMPT_LEN_RANGE
MAX_NEW_TOKENS = MAX_NEW_TOKENS_RANGE[1]


def _host_us(runner, n: int, graph: bool) -> float:
    """Median host µs of runner.step() with the queue kept short (collect outside the timing)."""
    times = []
    for _ in range(n):
        if runner._launched - runner._collected >= runner.ring_slots - 1:
            runner.collect()
        t0 = time.perf_counter()
        runner.step(graph=graph)
        times.append(time.perf_counter() - t0)
    runner.collect()
    return statistics.median(times) * 1e6


def _bare_launch_us(runner, n: int) -> float:
    from cuda.bindings import driver

    h, sh = runner.graph_exec._handle, runner.stream.handle
    times = []
    for i in range(n):
        if i % 32 == 0:
            runner.stream.synchronize()
        t0 = time.perf_counter()
        driver.cuGraphLaunch(h, sh)
        times.append(time.perf_counter() - t0)
    runner.stream.synchronize()
    return statistics.median(times) * 1e6


def _gpu_us(runner, n: int, graph: bool) -> float:
    runner.gpu_timing = True
    k0 = runner._launched
    for _ in range(n):
        runner.step(graph=graph)
        if runner._launched - runner._collected >= runner.ring_slots - 1:
            runner.collect()
    runner.collect()
    ks = range(max(k0, runner._collected - runner.ring_slots), runner._collected)
    return statistics.median(runner.step_gpu_ms(k) for k in ks) * 1e3


def _tokens_per_s(runner, prompts, max_new) -> dict:
    runner.gpu_timing = False
    res = runner.generate(prompts, max_new, graph=True)
    wall = sum(res.step_seconds)
    toks = sum(len(t) for t in res.tokens)
    return {"steps": res.steps, "tokens": toks, "tokens_per_step": res.tokens_per_step,
            "tokens_per_s": toks / wall, "step_median_us": statistics.median(res.step_seconds) * 1e6,
            "tokens_list": res.tokens}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--batch", type=int, default=8, help="requests decoded together")
    ap.add_argument("--budget", type=int, default=16, help="DDTree's draft nodes per step (besides the root)")
    ap.add_argument("--depth-limit", type=int, default=15, help="the drafter's depths (rows of logits per request)")
    ap.add_argument("--prompt-len", type=int, default=512,
                    help=f"the longest prompt, in tokens (the prompts are half this to this long; "
                         f"{MIN_PROMPT_LEN}..{MAX_PROMPT_LEN}, as capture-demo's)")
    ap.add_argument("--max-new-tokens", type=int, default=256,
                    help=f"tokens generated per request (1..{MAX_NEW_TOKENS}, as capture-demo's)")
    ap.add_argument("--vocab", type=int, default=32768, help="the demo model's vocabulary")
    ap.add_argument("--heads", type=int, default=9, help="the demo model's attention heads")
    ap.add_argument("--num-splits", type=int, default=None,
                    help="cap on the verify attention's split-KV pieces per (request, row tile); None: its "
                         "scheduler kernel splits each step's work on the GPU")
    ap.add_argument("--steps", type=int, default=400, help="steps per latency measurement")
    ap.add_argument("--seed", type=int, default=0, help="seed of the model's weights and the prompts")
    ap.add_argument("--no-pdl", action="store_true",
                    help="every launch of both steps ordinary (MLAModel and the runners with pdl=False); "
                         "default: programmatic dependent launches on sm_90+")
    ap.add_argument("--json", default=None, metavar="PATH", help="also write the results as JSON to PATH")
    a = ap.parse_args(argv)
    # the option checks, before the GPU check and the minutes of work before the JSON is written: the
    # package's own limits (the runners', the verify attention's, MLAModelConfig's heads, DDTreePlan's
    # merge rule, the int32 KV index below) and capture-demo's --prompt-len range, none of which touches a device
    from driverlevel._cli_common import dump_json_file, json_path_problem
    from driverlevel._constants import MAX_BUDGET, MAX_DEPTH
    from driverlevel.ddtree import check_merge_capacity
    from driverlevel.runner import MAX_RUNNER_BATCH
    from driverlevel.verify_attention import MAX_SPLITS

    bounds = {"batch": (1, MAX_RUNNER_BATCH), "budget": (1, MAX_BUDGET), "depth_limit": (1, MAX_DEPTH),
              "prompt_len": (MIN_PROMPT_LEN, MAX_PROMPT_LEN),  # capture-demo's range
              "max_new_tokens": (1, MAX_NEW_TOKENS), "vocab": (64, None), "heads": (1, 128),
              "steps": (1, None), "num_splits": (1, MAX_SPLITS), "seed": (0, None)}
    for name, (lo, hi) in bounds.items():
        v, opt = getattr(a, name), f"--{name.replace('_', '-')}"
        if v is None:  # --num-splits: none by default
            continue
        if v < lo:
            ap.error(f"{opt} must be >= {lo}, got {v}")
        if hi is not None and v > hi:
            ap.error(f"{opt} must be <= {hi}, got {v}")
    if a.vocab % 8:
        ap.error(f"--vocab must be a multiple of 8, >= 64, got {a.vocab}")
    try:
        check_merge_capacity(a.vocab, a.budget)  # DDTreePlan's vocabulary x budget rule
    except ValueError as exc:
        ap.error(f"--vocab {a.vocab} with --budget {a.budget}: {exc}")
    # Latency runs replay up to 2 * steps with requests that must not finish: a long context.
    long_new = 2 * a.steps * (a.depth_limit + 1) + 8
    max_context = a.prompt_len + max(long_new, a.max_new_tokens) + a.budget + 2
    if a.batch * max_context > 2**31 - 1:  # the runners' int32 kv_indptr (they raise it after the model is built)
        # the option of the largest term (--budget is <= 512, never the one), and --batch unless it is 1 already
        terms = {"--prompt-len": a.prompt_len, "--steps": long_new, "--max-new-tokens": a.max_new_tokens}
        lower = max(terms, key=terms.get) + (" or --batch" if a.batch > 1 else "")
        ap.error(f"--batch {a.batch} x a context of {max_context} tokens (from --steps, --depth-limit, --prompt-len, "
                 f"--max-new-tokens and --budget) exceeds 2**31 - 1: lower {lower}")
    problem = json_path_problem(a.json, stdout_ok=False)  # (the tables go to stdout)
    if problem:
        ap.error(f"--json: {problem}")

    import driverlevel as dl
    from driverlevel._device import require_gpu
    from driverlevel.demo import Drafter, MLAModel, MLAModelConfig
    from driverlevel.runner import AutoregressiveRunner, DecodeStepRunner

    require_gpu()
    dev = dl.Device(0)
    rng = np.random.default_rng(a.seed)
    lens = [max(2, a.prompt_len - (b * (a.prompt_len // 2)) // max(a.batch - 1, 1)) for b in range(a.batch)]
    prompts = [rng.integers(0, a.vocab, size=n).tolist() for n in lens]
    splits = ar_splits = a.num_splits  # None: the verify attention's scheduler splits on the GPU
    pdl = False if a.no_pdl else None
    model = MLAModel(dev, MLAModelConfig(vocab_size=a.vocab, num_heads=a.heads, seed=a.seed), pdl=pdl)
    s = dev.create_stream()
    drafter = Drafter(model, max_batch=a.batch, depth_limit=a.depth_limit, name="ddtree.drafter")
    dd = DecodeStepRunner(dev, model=model, drafter=drafter, max_batch=a.batch, budget=a.budget,
                          depth_limit=a.depth_limit, max_context=max_context, max_prompt_len=a.prompt_len,
                          num_splits=splits, stream=s, pdl=pdl)
    ar = AutoregressiveRunner(dev, model=model, max_batch=a.batch, max_context=max_context,
                              max_prompt_len=a.prompt_len, num_splits=ar_splits, stream=s, pdl=pdl)

    rows = []
    out = {"config": vars(a), "num_splits": splits, "ar_num_splits": ar_splits, "device": dev.name}
    for name, r in (("DDTree", dd), ("autoregressive", ar)):
        r.reset(prompts, long_new if name == "DDTree" else min(long_new, max_context - a.prompt_len - 2))
        r.capture()
        r.gpu_timing = False
        _host_us(r, 50, True)  # warm-up
        g_host = _host_us(r, a.steps, True)
        e_host = _host_us(r, min(a.steps, 200), False)
        bare = _bare_launch_us(r, a.steps)
        r.reset(prompts, long_new if name == "DDTree" else min(long_new, max_context - a.prompt_len - 2))
        g_gpu = _gpu_us(r, a.steps, True)
        e_gpu = _gpu_us(r, min(a.steps, 200), False)
        out[name] = {"graph_host_us": g_host, "eager_host_us": e_host, "bare_cuGraphLaunch_us": bare,
                     "graph_gpu_us": g_gpu, "eager_gpu_us": e_gpu, "graph_nodes": r.graph.node_count()}
        rows.append((name, g_host, e_host, bare, g_gpu, e_gpu, r.graph.node_count()))

    dtok = _tokens_per_s(dd, prompts, a.max_new_tokens)
    atok = _tokens_per_s(ar, prompts, a.max_new_tokens)
    lossless = dtok.pop("tokens_list") == atok.pop("tokens_list")
    out["ddtree_tokens"], out["ar_tokens"], out["lossless"] = dtok, atok, lossless
    out["speedup"] = dtok["tokens_per_s"] / atok["tokens_per_s"]

    print(f"Decode step on {dev.name}: batch {a.batch}, budget {a.budget}, depth limit {a.depth_limit}, "
          f"prompts {min(lens)}..{a.prompt_len}, vocab {a.vocab}, {a.heads} heads, splits {splits}/{ar_splits}, "
          f"pdl {model.pdl}/{dd.pdl}/{ar.pdl} (model/DDTree/AR)\n")
    print("| step | graph host µs | eager host µs | bare cuGraphLaunch µs | graph − bare µs | graph GPU µs | "
          "eager GPU µs | nodes |")
    print("|---|---|---|---|---|---|---|---|")
    for name, gh, eh, bare, gg, eg, nodes in rows:
        print(f"| {name} | {gh:.1f} | {eh:.1f} | {bare:.1f} | {gh - bare:.1f} | {gg:.1f} | {eg:.1f} | {nodes} |")
    print()
    print("| decoding | steps | tokens/step | median step µs (host, 1 in flight) | tokens/s |")
    print("|---|---|---|---|---|")
    for name, t in (("DDTree", dtok), ("autoregressive", atok)):
        print(f"| {name} | {t['steps']} | {t['tokens_per_step']:.2f} | {t['step_median_us']:.1f} | "
              f"{t['tokens_per_s']:,.0f} |")
    print(f"\nspeed-up (tokens/s): {out['speedup']:.2f}x; lossless (DDTree tokens == AR tokens): {lossless}")
    within = all(gh - bare <= 10.0 for _, gh, _, bare, *_ in rows)
    print(f"graph replay within 10 µs of a bare cuGraphLaunch: {'yes' if within else 'NO'}")
    if a.json and dump_json_file(a.json, out, indent=2):
        return 2
    return 0 if lossless else 1


if __name__ == "__main__":  # (tool_output, imported above: a failed write of stdout is one line, exit 2)
    sys.exit(tool_output.run(main, "benchmarks/bench_step.py"))
