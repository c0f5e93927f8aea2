"""The demo drafter: per-depth logits for the DDTree step from the demo MLA model's own tables.

Per step (capture-safe): a chain of guesses ``g_0 = root``, ``g_{i+1} = successor[g_i]``
where ``successor`` is the model's own argmax with the attention ablated (computed on the GPU
once, :meth:`~driverlevel.demo.mla_model.MLAModel.compute_successor`; every token's chain is
tabulated once, :func:`chain_table`, so a step reads each guess with one load), then one GEMM over
``bs * depth_limit`` rows giving ``logit_scale * (embed[g_i] @ w_lm^T) + noise_std * z`` as
the logits of depth ``i + 1``; ``z`` is a counter-based normal of (seed, step counter in
device memory, row, token). Kernels ``draft_chain`` and ``mla_gemm`` of ``cu/mla_model.cu``;
the float64 reference is :func:`driverlevel.demo.reference.drafter_logits_reference`.

A :class:`Drafter` is a :class:`~driverlevel.interfaces.DraftModel`: the
:class:`~driverlevel.runner.DecodeStepRunner` takes it (or any other drafter) through that
protocol only.

Example
-------
>>> from driverlevel.demo import Drafter, MLAModel                       # doctest: +SKIP
>>> model = MLAModel(dev)  # doctest: +SKIP
>>> drafter = Drafter(model, max_batch=8, depth_limit=15, seed=0)  # doctest: +SKIP
>>> runner = DecodeStepRunner(dev, model=model, drafter=drafter, max_batch=8, budget=32,  # doctest: +SKIP
...                           max_context=2048, max_prompt_len=512)
"""

from __future__ import annotations

import math

import numpy as np

from .._checks import positive_int
from .._memory import WorkspacePool
from .mla_model import MLAModel, _dev_array, _DraftChainParams, _need

__all__ = ["Drafter", "chain_table"]


def chain_table(successor, depth: int) -> np.ndarray:
    """int32 ``[vocab, depth]``: row ``t`` is ``t``'s chain ``(t, successor[t], successor[successor[t]], ...)``.

    ``draft_chain`` reads a request's guesses as the row of its root
    (:func:`driverlevel.demo.reference.drafter_chain_reference` of every token at once).

    Parameters
    ----------
    successor : int ``[vocab]``
        The no-context next-token table (values in ``[0, vocab)``).
    depth : int
        Tokens per chain (the drafter's depth limit), >= 1.

    Raises
    ------
    ValueError
        If ``successor`` is not a one-dimensional integer array with values in ``[0, vocab)``,
        or ``depth`` < 1.
    TypeError
        If ``depth`` is not an integer.
    """
    succ = np.asarray(successor)
    depth = positive_int("depth", depth)
    if not np.issubdtype(succ.dtype, np.integer):
        raise ValueError(f"successor must hold integers, got {succ.dtype}")
    if succ.ndim != 1 or succ.size == 0:
        raise ValueError(f"successor must be a non-empty [vocab] array, got shape {succ.shape}")
    V = succ.shape[0]
    if succ.min() < 0 or succ.max() >= V:
        raise ValueError(f"successor values must lie in [0, {V}), got [{succ.min()}, {succ.max()}]")
    table = np.empty((V, depth), dtype=np.int32)
    table[:, 0] = np.arange(V, dtype=np.int32)
    for i in range(1, depth):
        table[:, i] = succ[table[:, i - 1]]
    return table


class Drafter:
    """The drafter: per-depth logits ``[max_batch, depth_limit, vocab]`` (fp32) for the next positions.

    Parameters
    ----------
    model : MLAModel
        Its embedding, LM head and no-context successor table are used.
    max_batch : int
    depth_limit : int
        Depths drafted per step (the tree's depth limit; block size - 1).
    noise_std : float
        Standard deviation of the added normal noise, logit units (0: none).
    logit_scale : float
        Multiplier of the model's no-context logits (default 4: a confident drafter whose
        rank-0 chain gets explored deep before alternatives; at 1 the per-depth
        distributions over a large vocabulary are flat and the tree stays shallow and wide).
    seed : int
        Seed of the noise.
    name : str
        Pool label prefix.

    Attributes
    ----------
    roots : int32 ``[max_batch]`` (device)
        Root tokens read by :meth:`run` (the runner points this at its own buffer via :meth:`prepare`).
    guesses : int32 ``[max_batch, depth_limit]``
    logits : float32 ``[max_batch, depth_limit, vocab]``
    table : int32 ``[vocab, depth_limit]``
        Every token's chain (:func:`chain_table`), uploaded at construction (vocab x depth_limit
        x 4 bytes: 2 MB at 32,768 tokens and depth 15).
    step_counter : uint64 ``[1]``
        Incremented by every :meth:`run`; the noise of a step depends on it.
    """

    def __init__(self, model: MLAModel, *, max_batch: int, depth_limit: int, noise_std: float = 1.0,
                 logit_scale: float = 4.0, seed: int = 0, name: str = "drafter"):
        self.model = model
        self.device = model.device
        positive_int("max_batch", max_batch)
        positive_int("depth_limit", depth_limit)
        if not (math.isfinite(noise_std) and noise_std >= 0):
            raise ValueError(f"noise_std must be finite and >= 0, got {noise_std}")
        self.max_batch, self.depth_limit = int(max_batch), int(depth_limit)
        self.noise_std, self.logit_scale, self.seed = float(noise_std), float(logit_scale), int(seed)
        stream = self.device.create_stream()
        try:
            if not model._successor_ready:  # the no-context table, computed once per model (not capture-safe)
                model.compute_successor(stream)
            successor = model.successor.to_numpy(stream)
        finally:
            stream.close()
        V = model.vocab_size
        B, L = self.max_batch, self.depth_limit
        table = chain_table(successor, L)
        specs = [((B, L), np.int32), ((B * L, V), np.float32), ((1,), np.uint64), ((V, L), np.int32)]
        self.pool = WorkspacePool.allocate(self.device, WorkspacePool.required_bytes(specs), label=f"{name}")
        self.guesses = self.pool.carve("guesses", (B, L), np.int32)
        self.logits = self.pool.carve("logits", (B, L, V), np.float32)
        self.step_counter = self.pool.carve("step_counter", (1,), np.uint64)
        self.table = self.pool.carve("table", (V, L), np.int32)
        self.table.copy_from_host(table)
        self.roots = None
        self._launches = None

    @property
    def workspace_bytes(self) -> int:
        return self.pool.capacity

    @property
    def pools(self) -> list:
        """The drafter's pool (the ``pools`` member of :class:`~driverlevel.interfaces.DraftModel`)."""
        return [self.pool]

    def prepare(self, roots) -> "Drafter":
        """Bind the root-token buffer (int32 ``[max_batch]``) and pack the launches."""
        m = self.model
        roots = _dev_array("roots", roots, self.device)
        _need("roots", roots, ("int32",), 1)
        if roots.shape[0] < self.max_batch:
            raise ValueError(f"roots needs >= {self.max_batch} entries, got {roots.shape}")
        p = _DraftChainParams()
        p.table, p.roots, p.guesses, p.step_counter = self.table.ptr, roots.ptr, self.guesses.ptr, self.step_counter.ptr
        p.bs, p.depth, p.vocab = self.max_batch, self.depth_limit, m.vocab_size
        chain = m._k_chain.prepare((-(-self.max_batch * self.depth_limit // 256), 1, 1), 256, [p])
        chain.keep(roots, self.table, self.guesses, self.step_counter)
        rows = self.max_batch * self.depth_limit
        V = m.vocab_size
        gemm = m.gemm(m.embed, m.w_lm, self.logits.reshape(rows, V), m_max=rows,
                      a_index=self.guesses.reshape(rows), out_scale=self.logit_scale,
                      noise_counter=self.step_counter if self.noise_std > 0 else None,
                      noise_seed=self.seed, noise_std=self.noise_std)
        self.roots = roots
        self._launches = (chain, gemm)
        return self

    def reset(self, stream=None) -> None:
        """Set the step counter to 0 (not capture-safe: a host copy)."""
        self.step_counter.copy_from_host(np.zeros(1, np.uint64))

    def run(self, stream) -> None:
        """Launch the drafter on ``stream`` (capture-safe): chain, then one GEMM with noise."""
        if self._launches is None:
            raise RuntimeError("Drafter.run() before prepare(roots)")
        for ln in self._launches:
            ln.launch(stream)
