"""The demo: a small MLA target model, its drafter and ``driverlevel capture-demo``.

Nothing here is part of the library: the core (runtime, verify attention, DDTree, the
runner) imports nothing from this package. The demo plugs into the runner exactly as any
other runtime does, through :class:`driverlevel.interfaces.TargetModel` /
:class:`~driverlevel.interfaces.TargetForward` (the model and its forward plans) and
:class:`driverlevel.interfaces.DraftModel` (the drafter).

Modules
-------
``mla_model``     the demo MLA model (seeded bf16 weights, no downloads) and its forward plan
``drafter``       the demo drafter (the model's no-context chain + noise)
``_mla_weights``  the weights' generator and :class:`MLAModelConfig`
``reference``     float64 numpy references of the model, the drafter and greedy decoding
``capture_demo``  the ``driverlevel capture-demo`` command
``multi_device``  one decode-step graph per GPU (ranks as threads or processes)

Example
-------
>>> import driverlevel as dl                                            # doctest: +SKIP
>>> from driverlevel.demo import Drafter, MLAModel, MLAModelConfig  # doctest: +SKIP
>>> dev = dl.Device(0)  # doctest: +SKIP
>>> model = MLAModel(dev, MLAModelConfig(vocab_size=32768, num_heads=9, seed=0))  # doctest: +SKIP
>>> runner = dl.DecodeStepRunner(dev, model=model, drafter=Drafter(model, max_batch=8, depth_limit=15),  # doctest: +SKIP
...                              max_batch=8, budget=32, depth_limit=15, max_context=2048, max_prompt_len=512)
"""

from ._mla_weights import MLAModelConfig, MLAWeights, make_weights
from .drafter import Drafter
from .mla_model import ForwardPlan, MLAModel

__all__ = ["MLAModel", "MLAModelConfig", "MLAWeights", "ForwardPlan", "Drafter", "make_weights"]
