"""The verify attention's device-side schedule, by brute force on the reference (no GPU).

The GPU tests check that the kernel's tables equal :func:`driverlevel.reference.verify_schedule.schedule`
entry for entry; here the reference itself is checked: every unit covered once, pieces
in bounded slots, every split pair merged by exactly one combine entry, parts balanced.
"""

from __future__ import annotations

import numpy as np
import pytest

from driverlevel.reference.verify_schedule import schedule, segments
from driverlevel._workspace_formula import partial_workspace_bytes, scheduler_bytes


def combine_pieces(s, entry):
    """The slots the combine kernel reads for one entry (same rule as verify_attn_combine)."""
    b, r, pf, pl = entry[:4]
    gp = s.cuts[pf + 1][3]
    slots = []
    for k in range(pl - pf + 1):
        part = pf + k
        if k == 0:
            c0 = s.cuts[part]
            slots.append(2 * part if (c0[3] == gp and c0[2] == 0) else 2 * part + 1)
        else:
            a, z = s.cuts[part], s.cuts[part + 1]
            if not (a[3] == z[3] and a[2] == z[2]):
                slots.append(2 * part)
    return slots


def check_schedule(q_lens, kv_lens, H, M, N, ovh, G, cap=0):
    s = schedule(q_lens, kv_lens, H, M, N, ovh, G, cap)
    covered = {}
    split_slots = {}
    part_cost = []
    for p in range(G):
        segs = segments(s, p)
        partial = [g for g in segs if not g[4]]
        assert len(partial) <= 2, (p, segs)
        if len(partial) == 2:
            assert partial[0] is segs[0] and partial[1] is segs[-1]
        cost = 0
        for b, r, t0, t1, complete, slot in segs:
            assert 0 <= t0 <= t1 <= s.key_tiles[b]
            for t in range(t0, t1):
                assert (b, r, t) not in covered, f"unit {(b, r, t)} covered twice"
                covered[(b, r, t)] = p
            if complete and s.key_tiles[b] == 0:
                covered.setdefault((b, r, "empty"), p)
            if not complete:
                assert 0 <= slot < 2 * G
                split_slots.setdefault((b, r), []).append(slot)
            cost += (t1 - t0) + ovh
        part_cost.append(cost)
    # every unit exactly once; every pair with rows reached (even a bad request without keys)
    for b in range(len(q_lens)):
        for r in range(s.row_tiles[b]):
            if s.key_tiles[b] == 0:
                assert (b, r, "empty") in covered
            for t in range(s.key_tiles[b]):
                assert (b, r, t) in covered, f"unit {(b, r, t)} not covered"
    all_slots = [x for v in split_slots.values() for x in v]
    assert len(all_slots) == len(set(all_slots)), "two pieces share a partial slot"
    # exactly one combine entry per split pair, listing exactly its pieces
    listed = {}
    for e in s.entries:
        if e[0] < 0:
            continue
        assert (e[0], e[1]) not in listed
        listed[(e[0], e[1])] = sorted(combine_pieces(s, e))
        # the kernel's own rule: slot0, then 2 * part unless the entry table marks the part empty
        b, r, pf, pl, _, _, rows, slot0, _, out_row0 = e
        mine = [slot0] + [2 * (pf + k) for k in range(1, pl - pf + 1) if not s.entries[pf + k][8]]
        assert sorted(mine) == listed[(b, r)]
        assert rows == min(M, q_lens[b] * H - r * M) and out_row0 == (sum(q_lens[:b]) * H + r * M)
    assert listed == {k: sorted(v) for k, v in split_slots.items()}
    # the combine's work items (the kernel's walk: item -> the first entry whose item_end exceeds
    # it -> a block of 8 / row_warps rows) reach every row of every split pair exactly once, and no
    # warp of a row streams more than 8 pieces unless 8 warps share it
    ends = [e[4] for e in s.entries]
    assert ends == sorted(ends)
    total = ends[-1] if ends else 0
    reached = {}
    for item in range(total):
        q = next(i for i, x in enumerate(ends) if x > item)
        b, r, p_first, p_last, _, w = s.entries[q][:6]
        assert b >= 0 and w in (1, 2, 4, 8)
        n = p_last - p_first + 1
        assert -(-n // w) <= 8 or w == 8
        per = 8 // w
        first = ends[q - 1] if q else 0
        rows = [(item - first) * per + j for j in range(per)]
        valid = [x for x in rows if x < M and r * M + x < q_lens[b] * H]
        assert valid, f"item {item} covers no row"
        for x in valid:
            assert (b, r, x) not in reached
            reached[(b, r, x)] = item
    want = {(b, r, x) for (b, r) in split_slots for x in range(min(M, q_lens[b] * H - r * M))}
    assert set(reached) == want
    # balance: no part costs more than per_part plus one pair's overhead per extra piece
    assert max(part_cost) <= s.per_part + 2 * ovh
    return s


@pytest.mark.parametrize("seed", range(40))
def test_random_batches_cover_every_unit_once(seed):
    rng = np.random.default_rng(seed)
    B = int(rng.integers(1, 12))
    q_lens = [int(x) for x in rng.integers(0, 40, B)]
    kv_lens = [int(x) for x in rng.choice([0, 1, 15, 16, 17, 100, 1000, 5000], B)]
    G = int(rng.choice([1, 2, 3, 7, 16, 132]))
    cap = int(rng.choice([0, 0, 1, 3]))
    check_schedule(q_lens, kv_lens, int(rng.choice([1, 9, 16])), int(rng.choice([32, 48, 64])),
                   int(rng.choice([16, 32])), int(rng.choice([1, 6, 12])), G, cap)


def test_ragged_batch_is_balanced_and_bounded():
    # 1 x 200k + 7 x 4k, 9 heads x 16 tokens, 48-row tile, 32-key tiles, 132 parts
    s = check_schedule([16] * 8, [200_000] + [4096] * 7, 9, 48, 32, 6, 132)
    longest = max(len(segments(s, p)) for p in range(132))
    assert longest <= 4
    assert s.per_part <= -(-s.total // 132)


def test_padded_requests_and_empty_steps():
    s = check_schedule([0, 0, 5, 0], [10, 0, 3, 7], 9, 64, 32, 6, 16)
    assert all(c[0] == 2 or c[0] == 4 for c in s.cuts)
    s = check_schedule([0, 0], [10, 20], 9, 64, 32, 6, 8)
    assert s.total == 0 and all(not segments(s, p) for p in range(8))


def test_bad_request_gets_its_rows_without_keys():
    s = schedule([4, 4], [100, 100], 9, 64, 32, 6, 8, bad={1})
    assert s.key_tiles == [4, 0]
    segs = [g for p in range(8) for g in segments(s, p) if g[0] == 1]
    assert segs and all(g[2] == g[3] == 0 and g[4] for g in segs)


def test_split_cap_limits_pieces_per_pair():
    s = check_schedule([16], [200_000], 9, 48, 32, 6, 132, cap=4)
    pieces = sum(1 for p in range(132) for g in segments(s, p) if not g[4])
    assert pieces <= 3 * 5  # 3 pairs, each at most cap + 1 pieces


def test_workspace_formula_is_bounded_by_the_grid():
    assert partial_workspace_bytes(132, 64) == 2 * 132 * 64 * (512 * 2 + 4) == 17_369_088  # bf16 values, fp32 LSE
    assert partial_workspace_bytes(188, 32) == 12_368_896
    assert partial_workspace_bytes(132, 64, value_bytes=4) == 2 * 132 * 64 * 513 * 4  # the fp32 partials before
    assert partial_workspace_bytes(132, 64) < 64 * 2**20  # the seed configuration's target
    assert scheduler_bytes(8, 132) == 40 * 8 + 64 * 132 + 16


@pytest.mark.parametrize("bad, exc", [(0, ValueError), (-3, ValueError), (True, TypeError), (2.0, TypeError)])
def test_workspace_formula_rejects(bad, exc):
    with pytest.raises(exc, match="num_parts"):
        partial_workspace_bytes(bad, 64)


def test_reference_schedule_rejects_what_no_plan_has():
    with pytest.raises(ValueError, match="num_parts must be >= 1"):
        schedule([4], [10], 9, 64, 32, 6, 0)
    with pytest.raises(ValueError, match="tile_rows must be >= 1"):
        schedule([4], [10], 9, 0, 32, 6, 8)
    with pytest.raises(ValueError, match="same length"):
        schedule([4, 4], [10], 9, 64, 32, 6, 8)


def test_uniform_batches_take_aligned_splits_when_they_save_a_segment():
    # 16 heads x 8 x 4k x 16 tokens (64-row tiles, 32-key tiles, 132 parts): 32 pairs of 129 key
    # tiles, cut 4 ways each (parts 128..131 empty): no part starts a second segment
    s = check_schedule([16] * 8, [4096] * 8, 16, 64, 32, 6, 132)
    assert s.aligned and s.per_part == 33
    assert all(len(segments(s, p)) == 1 for p in range(128)) and not any(segments(s, p) for p in range(128, 132))
    # the cuts are rounded up: the pair's longer piece is its first, not the one with the draft keys
    assert [segments(s, p)[0][3] - segments(s, p)[0][2] for p in range(4)] == [33, 32, 32, 32]
    # 9 heads x 200k x 16 (48-row tiles): 3 pairs, 43 parts each
    s = check_schedule([16], [200_000], 9, 48, 32, 6, 132)  # 3 pairs x 43 pieces: the last part left out
    assert s.aligned and all(len(segments(s, p)) == 1 for p in range(129)) and not segments(s, 131)
    # 16 heads x 8 x 32k: a 4-way piece (257 tiles) is longer than per_part + ovh / 2 (253): equal-cost cuts
    s = check_schedule([16] * 8, [32768] * 8, 16, 64, 32, 6, 132)
    assert not s.aligned
    # ragged, capped, or with a bad request: equal-cost cuts
    assert not check_schedule([16] * 8, [200_000] + [4096] * 7, 9, 48, 32, 6, 132).aligned
    assert not check_schedule([16] * 8, [4096] * 8, 16, 64, 32, 6, 132, cap=3).aligned
    assert not schedule([16, 16], [4096, 4096], 16, 64, 32, 6, 132, bad={1}).aligned
    # fewer key tiles than parts per pair: at most one piece per key tile
    s = check_schedule([1], [40], 16, 64, 32, 6, 132)
    assert s.aligned and sum(1 for p in range(132) if segments(s, p)) == 2


@pytest.mark.parametrize("q_lens, kv_lens, name", [([-1], [10], "q_lens"), ([2, 3], [5, -4], "kv_lens")])
def test_schedule_refuses_negative_lengths(q_lens, kv_lens, name):
    """Lengths come from well-formed indptrs (bad metadata is marked by ``bad``): a negative one is a
    ValueError naming it, not a schedule with negative tiles."""
    with pytest.raises(ValueError, match=f"{name} must be >= 0"):
        schedule(q_lens, kv_lens, 9, 64, 16, 1, 8)


def test_schedule_refuses_negative_overhead_and_non_integers():
    """Review 38: ``ovh = -5`` gave a total of -4; ``num_heads=True`` and float lengths were taken."""
    assert schedule([1], [10], 9, 64, 32, 3, 4).total > 0
    with pytest.raises(ValueError, match="ovh must be >= 0, got -5"):
        schedule([1], [10], 9, 64, 32, -5, 4)
    with pytest.raises(ValueError, match="split_cap must be >= 0, got -1"):
        schedule([1], [10], 9, 64, 32, 3, 4, split_cap=-1)
    with pytest.raises(TypeError, match="num_heads must be an int, got bool"):
        schedule([1], [10], True, 64, 32, 3, 4)
    with pytest.raises(TypeError, match="q_lens must be integers, got dtype float64"):
        schedule([1.5], [10], 9, 64, 32, 3, 4)
    with pytest.raises(ValueError, match="tile_rows must be >= 1, got 0"):
        schedule([1], [10], 9, 0, 32, 3, 4)


def test_segments_refuses_parts_outside_the_schedule():
    """Review 39: segments(s, num_parts) raised a bare IndexError and segments(s, -1) returned []."""
    s = schedule([4, 1], [100, 3000], 9, 48, 32, 2, 8)
    assert sum(len(segments(s, p)) for p in range(8)) > 0
    for bad in (8, -1):
        with pytest.raises(IndexError, match=r"part must be in \[0, 8\)"):
            segments(s, bad)
    with pytest.raises(TypeError, match="part must be an int"):
        segments(s, 1.0)


def test_schedule_and_segments_name_what_is_wrong():
    """Review s54: ``schedule(None, ...)`` and 2-D lengths failed inside numpy or ``len``, a ``bad``
    index that is no request was ignored, and ``segments(None, 0)`` raised AttributeError."""
    with pytest.raises(TypeError, match="q_lens must be a sequence of integers, got None"):
        schedule(None, [1], 9, 64, 32, 1, 8)
    with pytest.raises(TypeError, match="kv_lens must be a sequence of integers, got None"):
        schedule([1], None, 9, 64, 32, 1, 8)
    with pytest.raises(ValueError, match=r"kv_lens must be one-dimensional .* got shape \(1, 2\)"):
        schedule([1, 2], [[3, 4]], 9, 64, 32, 1, 8)
    for bad in ([2], [-1], {0, 5}):
        with pytest.raises(ValueError, match=r"bad must hold request indices in \[0, 2\)"):
            schedule([1, 2], [3, 4], 9, 64, 32, 1, 8, bad=bad)
    assert schedule([1, 2], [3, 4], 9, 64, 32, 1, 8, bad=[1]).key_tiles[1] == 0
    with pytest.raises(TypeError, match="s must be a Schedule"):
        segments(None, 0)


def test_combine_row_warps_takes_a_split_pairs_pieces():
    """combine_row_warps(0) returned 1 warp: its argument is a split pair's piece count (an entry's
    p_last - p_first + 1, at least 2); 1, 2, 4 or 8 are its results, not its arguments (3 pieces: 1 warp)."""
    from driverlevel.reference.verify_schedule import COMBINE_WARPS, combine_row_warps

    want = {p: 1 if p <= 8 else 2 if p <= 16 else 4 if p <= 32 else 8 for p in range(2, 100)}
    assert {p: combine_row_warps(p) for p in want} == want and combine_row_warps(np.int64(16)) == 2
    assert combine_row_warps(3) == 1 and combine_row_warps(10**6) == COMBINE_WARPS
    for bad in (1, 0, -4):
        with pytest.raises(ValueError, match=f"pieces must be >= 2, got {bad}"):
            combine_row_warps(bad)
    for bad in (3.0, True, "3", None):
        with pytest.raises(TypeError, match="pieces must be an int"):
            combine_row_warps(bad)
    rng = np.random.default_rng(11)  # the schedule's own entries: their piece counts are >= 2
    for _ in range(20):
        q = rng.integers(1, 9, 5).tolist()
        s = schedule(q, rng.integers(0, 3000, 5).tolist(), 16, 64, 64, 2, int(rng.integers(2, 40)))
        for e in s.entries:
            if e[0] >= 0:
                assert e[3] - e[2] + 1 >= 2 and e[5] == combine_row_warps(e[3] - e[2] + 1)
