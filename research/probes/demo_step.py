"""The demo decode step that the step probes (step_stamps.py, step_marks.py) take apart: the demo
MLA model, its drafter and a DecodeStepRunner built as benchmarks/bench_step.py builds them (prompts
of half to all of 512 tokens, depth limit 15, 9 heads, seed 0)."""
import numpy as np

PROMPT_LEN, DEPTH = 512, 15


def demo_runner(dev, batch: int, budget: int, vocab: int, max_context: int):
    """``(runner, stream, prompts)``: a DecodeStepRunner on ``dev`` of ``max_context`` tokens per
    request, and the prompts to reset it with (not yet reset or captured: a probe may change its
    launches first)."""
    from driverlevel.demo import Drafter, MLAModel, MLAModelConfig
    from driverlevel.runner import DecodeStepRunner

    rng = np.random.default_rng(0)
    lens = [max(2, PROMPT_LEN - (b * (PROMPT_LEN // 2)) // max(batch - 1, 1)) for b in range(batch)]
    prompts = [rng.integers(0, vocab, size=n).tolist() for n in lens]
    model = MLAModel(dev, MLAModelConfig(vocab_size=vocab, num_heads=9, seed=0))
    stream = dev.create_stream()
    drafter = Drafter(model, max_batch=batch, depth_limit=DEPTH, name="ddtree.drafter")
    r = DecodeStepRunner(dev, model=model, drafter=drafter, max_batch=batch, budget=budget, depth_limit=DEPTH,
                         max_context=max_context, max_prompt_len=PROMPT_LEN, stream=stream)
    return r, stream, prompts
