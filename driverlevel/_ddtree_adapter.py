"""The runner's use of :mod:`driverlevel.ddtree`: one :class:`~driverlevel.ddtree.DDTreePlan`
over the runner's own request state.

The runner owns the state (active flags, root tokens, committed lengths, the request to
token table, the free-slot pool, stop tokens) and hands it to the DDTree kernels as a
:class:`~driverlevel.ddtree.DDTreeState` made of its own arrays, so the autoregressive
baseline, the DDTree step and the host-side checks all see the same slots.
"""

from __future__ import annotations

import numpy as np

from ._memory import WorkspacePool

__all__ = ["TreeSteps"]


class TreeSteps:
    """Tree build + compile before the target forward, accept + commit after it.

    Parameters
    ----------
    runner : DecodeStepRunner
        Supplies the device, the maxima and the state arrays.
    draft_logits : float32 ``[max_batch, depth_limit, vocab]``
        The drafter's output buffer (read by :meth:`build_and_compile`).

    Attributes
    ----------
    plan : DDTreePlan
    state : DDTreeState
    input_ids, positions : the verify inputs (int32 / int64 ``[max_batch * (budget + 1)]``)
    metadata : VerifyMetadata (bitmask format)
    num_rows : int64 ``[1]`` (``qo_indptr[max_batch]``)
    records : int32 ``[max_batch, 4 + depth_limit + 1]``
    cubin : the compiled ``ddtree.cu``
    sglang : None (the runner asks only for the packed bitmask)
    """

    def __init__(self, runner, draft_logits):
        from .ddtree import DDTreePlan, DDTreeState

        r = runner
        B = r.max_batch
        self.plan = DDTreePlan(r.device, max_batch=B, depth_limit=r.depth_limit, vocab=r.vocab_size, budget=r.budget,
                               max_context=r.max_context, logits_dtype="float32", name=f"{r.name}.tree")
        self._pool = WorkspacePool.allocate(r.device, WorkspacePool.required_bytes([((B,), np.int64)]),
                                            label=f"{r.name}.tree_rows")
        self.req_pool_indices = self._pool.carve("req_pool_indices", (B,), np.int64)
        self.req_pool_indices.copy_from_host(np.arange(B, dtype=np.int64))
        self.state = DDTreeState(active=r.active, root_tokens=r.roots, committed_lens=r.committed,
                                 req_pool_indices=self.req_pool_indices, req_to_token=r.req_to_token,
                                 free_slots=r.pool_slots, free_count=r.pool_count, stop_tokens=r.stop_tokens)
        self.draft_logits = draft_logits
        p = self.plan
        self.input_ids = p.input_ids
        self.positions = p.positions
        self.metadata = p.metadata()
        self.num_rows = p.qo_indptr[B:]
        self.records = p.records
        self.cubin = p.cubin
        self.sglang = None

    @property
    def workspace_bytes(self) -> int:
        return self.plan.pool.capacity + self._pool.capacity

    @property
    def pools(self) -> list:
        return [self.plan.pool, self._pool]

    def reset(self) -> None:
        """Nothing per request: the build re-arms the plan's counters itself; only stale errors go."""
        self.plan.error_word.clear()

    def build_and_compile(self, stream) -> None:
        self.plan.build(stream, self.draft_logits, self.state)
        self.plan.compile(stream, self.state)

    def accept(self, stream, logits) -> None:
        self.plan.accept(stream, self.state, target_logits=logits)

    def commit(self, stream) -> None:
        self.plan.commit(stream, self.state)

    def accept_and_commit(self, stream, logits) -> None:
        self.accept(stream, logits)
        self.commit(stream)
