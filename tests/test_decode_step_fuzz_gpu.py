"""Fuzz of the captured DDTree decode step (issue 11): 1,000 replays of one graph, each with one
metadata field of the request state corrupted on the device.

Every replay starts from the same snapshot of the state, so the step is deterministic: the clean
replay's accepted tokens are the reference for every request the corruption does not touch
(the target's attention runs with ``num_splits=1``, so a request's sums do not depend on how
the scheduler cut its batchmates' work). For every corrupted replay the test asserts that

* the context survives: the next clean replay from the snapshot is bitwise the clean result;
* the device error words report the corrupted request and field (and nothing else);
* the requests that were not corrupted accept the same tokens and commit the same lengths.
"""

from __future__ import annotations

import numpy as np
import pytest

from driverlevel._device_error import FIELDS
from driverlevel.demo import Drafter, MLAModel
from driverlevel.runner import DecodeStepRunner
from test_runner_gpu import SMALL, prompts_for

pytestmark = pytest.mark.gpu

#: The request state a step reads and writes (restored before every replay).
STATE = ("root_tokens", "active", "seq_lens", "remaining", "req_pool_indices", "req_to_token", "stop_tokens",
         "free_slots", "free_count")


def _error_words(r):
    """Every device error word the step's kernels write."""
    words = [r.error_word, r.tree.error_word]
    for fwd in (r.forward, r.prefill_forward):
        att = getattr(fwd, "attention", None)
        if att is not None:
            words.append(att.error_word)
    return words


def _drain(r):
    """``{(request, field)}`` reported since the last drain; clears every word."""
    seen = set()
    for w in _error_words(r):
        code, request, field, _count = w.read()
        if code:
            seen.add((request, FIELDS[field]))
        w.clear()
    return seen


def test_decode_step_graph_survives_1000_corrupted_replays(device):
    B, budget, ctx = 4, 16, 160
    model = MLAModel(device, SMALL)
    drafter = Drafter(model, max_batch=B, depth_limit=6)
    r = DecodeStepRunner(device, model=model, drafter=drafter, max_batch=B, budget=budget, depth_limit=6,
                         max_context=ctx, max_prompt_len=40, num_splits=1)
    rng = np.random.default_rng(2026)
    r.reset(prompts_for(rng, SMALL.vocab_size, (30, 17, 40, 9)), 100)
    r.capture()
    gx, s = r.graph_exec, r.stream
    arrays = {name: getattr(r.state, name) for name in STATE}
    arrays.update(step_counter=r.step_counter, status=r.status, drafter_step=r.drafter.step_counter)
    snap = {name: a.to_numpy() for name, a in arrays.items()}
    committed0 = snap["seq_lens"].astype(np.int64)
    assert (committed0 > 0).all()
    assert _drain(r) == set()

    def restore():
        for name, a in arrays.items():
            a.copy_from_host(snap[name], stream=s)

    def replay():
        restore()
        r.tree.records.fill_u32(0xDEADBEEF, s)  # poisoned: every request's record must be rewritten
        gx.launch(s)
        s.synchronize()
        return r.tree.records.to_numpy(), r.state.seq_lens.to_numpy()

    clean_rec, clean_committed = replay()
    assert _drain(r) == set()
    assert (clean_committed > committed0).all(), "every request accepts its root token at least"
    accepted = clean_rec[:, 1]
    assert (accepted >= 1).all()

    kinds = ("seq_lens", "req_to_token", "req_pool_indices", "root_token", "free_count", "free_slot")
    n_slots = int(r.num_slots)
    counts = dict.fromkeys(kinds, 0)
    for it in range(1000):
        kind = kinds[it % len(kinds)]
        bad = int(rng.integers(B))
        restore()
        if kind == "seq_lens":
            x = snap["seq_lens"].copy()
            x[bad] = int(rng.choice([-3, ctx + 1 + int(rng.integers(1000)), 2**40]))
            r.state.seq_lens.copy_from_host(x, stream=s)
            fields, affected = {"seq_lens"}, {bad}
        elif kind == "req_to_token":
            x = snap["req_to_token"].copy()
            x[bad, int(rng.integers(committed0[bad]))] = int(rng.choice([-2, n_slots + int(rng.integers(1000))]))
            r.state.req_to_token.copy_from_host(x, stream=s)
            fields, affected = {"req_to_token", "kv_indices"}, {bad}  # compile writes -1, attention sees it
        elif kind == "req_pool_indices":
            x = snap["req_pool_indices"].copy()
            x[bad] = int(rng.choice([-1, B + int(rng.integers(1000))]))
            r.state.req_pool_indices.copy_from_host(x, stream=s)
            fields, affected = {"req_pool_indices"}, {bad}
        elif kind == "root_token":
            x = snap["root_tokens"].copy()
            x[bad] = int(rng.choice([-1, SMALL.vocab_size + int(rng.integers(1000))]))
            r.state.root_tokens.copy_from_host(x, stream=s)
            fields, affected = {"tree_tokens"}, {bad}
        elif kind == "free_count":
            r.state.free_count.copy_from_host(np.array([int(rng.choice([-1, n_slots + 1 + int(rng.integers(99))]))], np.int64),
                                        stream=s)
            fields, affected = {"out_cache_loc"}, None  # no request gets a slot: only the report is checked
        else:
            x = snap["free_slots"].copy()
            top = int(snap["free_count"][0])
            x[top - 1 - int(rng.integers(B * (budget + 1)))] = int(rng.choice([-5, n_slots + int(rng.integers(1000))]))
            r.state.free_slots.copy_from_host(x, stream=s)
            fields, affected = {"out_cache_loc"}, None  # whichever request popped it
        r.tree.records.fill_u32(0xDEADBEEF, s)
        gx.launch(s)
        s.synchronize()
        rec, committed = r.tree.records.to_numpy(), r.state.seq_lens.to_numpy()
        seen = _drain(r)
        assert seen, (it, kind, bad, "no error reported")
        assert {f for _, f in seen} <= fields, (it, kind, bad, seen)
        if affected is not None:
            assert {q for q, _ in seen} == affected, (it, kind, bad, seen)
            for b in range(B):
                if b in affected:
                    continue
                np.testing.assert_array_equal(rec[b], clean_rec[b], err_msg=f"{it} {kind}: request {b}")
                assert committed[b] == clean_committed[b], (it, kind, b)
        counts[kind] += 1
        if it % 10 == 9:  # the context and the graph survive: a clean replay is bitwise the clean one
            rec2, committed2 = replay()
            assert _drain(r) == set(), it
            np.testing.assert_array_equal(rec2, clean_rec)
            np.testing.assert_array_equal(committed2, clean_committed)
    assert min(counts.values()) >= 1000 // len(kinds)
    rec2, committed2 = replay()
    assert _drain(r) == set()
    np.testing.assert_array_equal(rec2, clean_rec)
    np.testing.assert_array_equal(committed2, clean_committed)
