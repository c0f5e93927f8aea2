"""Reference of the verify attention's device-side schedule (``verify_attn_schedule``).

Pure Python, the same arithmetic as the kernel, so tests can check the GPU's
tables entry for entry and check the schedule's properties by brute force:
every (request, row tile, key tile) unit is covered exactly once, a part holds
at most two pieces of split pairs, and every split pair's pieces are listed by
exactly one combine entry.

The work is the sequence of units (b, r, t): requests ``b`` in order, each with
``row_tiles = ceil(q_len * H / M)`` pairs of ``key_tiles = ceil((kv_len + q_len) / N)``
tiles. A pair costs ``key_tiles + ovh`` units; cut ``p`` is at unit
``min(p * per_part, total)``, ``per_part = ceil(total / num_parts)`` (raised to
``ceil(max_pair_cost / split_cap)`` under a cap). This is the shape of FlashMLA's
``get_mla_metadata`` (fixed split overhead, equal-cost parts); the kernel's
side is described at the top of ``cu/verify_attention.cu``.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from .trees import _count, _int_array

__all__ = ["COMBINE_WARPS", "Schedule", "combine_row_warps", "schedule", "segments"]


@dataclass
class Schedule:
    """Cuts ``[(b, r, t, gp)] * (num_parts + 1)`` and entries
    ``[(b, r, p_first, p_last, item_end, row_warps, rows, slot0, empty, out_row0)] * num_parts``
    (b=-1: none, with ``(-1, 0, 0, 0, item_end, 0, 0, 0, empty, 0)``): ``item_end`` is the
    combine's running count of work items through the entry, ``row_warps``
    (:func:`combine_row_warps`) the warps that share a row, ``rows`` the pair's rows,
    ``slot0`` its first piece's partial slot, ``empty`` whether part ``q`` has no segment,
    ``out_row0`` the pair's first output row (``q_start * H + r * M``)."""

    cuts: list
    entries: list
    row_tiles: list
    key_tiles: list
    per_part: int
    total: int
    aligned: bool = False


#: Warps of one combine CTA (``COMBINE_WARPS``).
COMBINE_WARPS = 8


def combine_row_warps(pieces: int) -> int:
    """Warps of the combine that share one row of a pair split into ``pieces``: 1, 2, 4 or 8 (up to
    8, 16, 32 or more pieces).

    ``pieces`` is an entry's ``p_last - p_first + 1``: a split pair has at least 2 pieces (an unsplit
    pair has no combine entry). ValueError for ``pieces < 2``, TypeError for a non-int (bool and
    floats refused, never truncated)."""
    pieces = _count("pieces", pieces, 2)
    return 1 if pieces <= 8 else 2 if pieces <= 16 else 4 if pieces <= 32 else 8


def schedule(q_lens, kv_lens, num_heads: int, tile_rows: int, tile_keys: int, ovh: int, num_parts: int,
             split_cap: int = 0, bad=()) -> Schedule:
    """The schedule the kernel computes for these lengths (``bad``: requests with bad kv/mask metadata).

    Raises ``ValueError`` when ``q_lens`` or ``kv_lens`` is not one-dimensional, they differ in
    length, a length is negative (lengths come from well-formed indptrs; a request whose metadata
    is bad is marked by ``bad``), a ``bad`` index is not a request (outside ``[0, len(q_lens))``),
    or a count that the kernel takes from the plan (``num_heads``, ``tile_rows``, ``tile_keys``,
    ``num_parts``) is not positive, or ``ovh`` or ``split_cap`` is negative; ``TypeError`` when a
    length or a count is not an int (bool and floats refused, never truncated; ``None`` is no
    array), or ``bad`` holds anything but request indices."""
    lens = {}
    for lname, v in (("q_lens", q_lens), ("kv_lens", kv_lens)):
        if v is None:
            raise TypeError(f"{lname} must be a sequence of integers, got None")
        a = _int_array(lname, v, "integers")
        if a.ndim != 1:
            raise ValueError(f"{lname} must be one-dimensional (one length per request), got shape {a.shape}")
        lens[lname] = [int(x) for x in a]
    q_lens, kv_lens = lens["q_lens"], lens["kv_lens"]
    if len(q_lens) != len(kv_lens):
        raise ValueError(f"q_lens and kv_lens must have the same length, got {len(q_lens)} and {len(kv_lens)}")
    for lname, lens in (("q_lens", q_lens), ("kv_lens", kv_lens)):
        neg = [v for v in lens if v < 0]
        if neg:
            raise ValueError(f"{lname} must be >= 0, got {neg[0]}")
    num_heads, tile_rows, tile_keys, num_parts = (
        _count(pname, v, 1) for pname, v in (("num_heads", num_heads), ("tile_rows", tile_rows),
                                             ("tile_keys", tile_keys), ("num_parts", num_parts)))
    ovh, split_cap = _count("ovh", ovh, 0), _count("split_cap", split_cap, 0)
    bad = {int(v) for v in _int_array("bad", list(bad) if isinstance(bad, (set, frozenset)) else bad,
                                      "request indices (integers)").reshape(-1)}
    B = len(q_lens)
    if any(not 0 <= v < B for v in bad):
        raise ValueError(f"bad must hold request indices in [0, {B}), got {sorted(bad)}")
    rt = [math.ceil(q * num_heads / tile_rows) for q in q_lens]
    kt = [0 if (b in bad or q_lens[b] == 0) else math.ceil((kv_lens[b] + q_lens[b]) / tile_keys) for b in range(B)]
    pc = [kt[b] + ovh for b in range(B)]
    cost = [rt[b] * pc[b] for b in range(B)]
    excl = [0]
    pairs = [0]
    for b in range(B):
        excl.append(excl[-1] + cost[b])
        pairs.append(pairs[-1] + rt[b])
    total = excl[-1]
    per = -(-total // num_parts)
    if split_cap:
        per = max(per, -(-max([pc[b] for b in range(B) if rt[b]] or [0]) // split_cap))
    per = max(per, 1)
    # aligned splits (a uniform batch, no cap): every pair cut into s equal pieces, one per part,
    # when a piece is at most per + ovh / 2 key tiles (the kernel's rule, cu/verify_attention.cu)
    npairs = pairs[-1]
    with_rows = [pc[b] for b in range(B) if rt[b]]
    kt_al = (with_rows[0] - ovh) if with_rows else 0
    g_al = num_parts - 1 if num_parts > 1 else num_parts  # the last part left out (the kernel's rule)
    s_al = min(g_al // npairs, max(kt_al, 1)) if 0 < npairs <= g_al else 0
    aligned = (not split_cap and s_al >= 1 and len(set(with_rows)) == 1 and kt_al >= 1
               and 2 * (-(-kt_al // s_al)) <= 2 * per + ovh)
    cuts = []
    for p in range(num_parts + 1):
        if aligned:
            if p >= npairs * s_al:
                cuts.append((B, 0, 0, npairs))
            else:
                gp, j = divmod(p, s_al)
                b = max(i for i in range(B) if pairs[i] <= gp)
                cuts.append((b, gp - pairs[b], -(-j * kt_al // s_al), gp))  # rounded up: longer pieces first
            continue
        u = min(p * per, total)
        if u >= total:
            cuts.append((B, 0, 0, pairs[-1]))
            continue
        b = max(i for i in range(B) if excl[i] <= u)
        r, y = divmod(u - excl[b], pc[b])
        cuts.append((b, r, max(0, y - ovh), pairs[b] + r))
    q_start = [sum(q_lens[:b]) for b in range(B)]
    entries = []
    items = 0
    for q in range(num_parts):
        c = q + 1
        empty = int(cuts[q][3] == cuts[q + 1][3] and cuts[q][2] == cuts[q + 1][2])
        e = (-1, 0, 0, 0, items, 0, 0, 0, empty, 0)
        if c < num_parts:
            cc, cp = cuts[c], cuts[c - 1]
            if cc[2] > 0 and not (cp[3] == cc[3] and cp[2] > 0):
                last = c
                while last + 1 <= num_parts and cuts[last + 1][3] == cc[3] and cuts[last + 1][2] > 0:
                    last += 1
                w = combine_row_warps(last - (c - 1) + 1)
                rows = min(tile_rows, q_lens[cc[0]] * num_heads - cc[1] * tile_rows)
                items += -(-rows * w // COMBINE_WARPS)
                slot0 = 2 * q if (cp[3] == cc[3] and cp[2] == 0) else 2 * q + 1
                e = (cc[0], cc[1], c - 1, last, items, w, rows, slot0, empty,
                     q_start[cc[0]] * num_heads + cc[1] * tile_rows)
        entries.append(e)
    return Schedule(cuts, entries, rt, kt, -(-kt_al // s_al) if aligned else per, total, aligned)


def segments(s: Schedule, part: int):
    """The segments part ``part`` runs: ``[(b, r, t_begin, t_end, complete, slot)]``, as the kernel walks them.

    TypeError for an ``s`` that is not a :class:`Schedule` or a ``part`` that is not an int,
    IndexError outside ``[0, num_parts)`` (the schedule's ``len(cuts) - 1`` parts)."""
    if not isinstance(s, Schedule):
        raise TypeError(f"s must be a Schedule (schedule()'s result), got {type(s).__name__}")
    n_parts = len(s.cuts) - 1
    if isinstance(part, bool) or not isinstance(part, numbers.Integral):
        raise TypeError(f"part must be an int, got {type(part).__name__}")
    if not 0 <= part < n_parts:
        raise IndexError(f"part must be in [0, {n_parts}) (the schedule's parts), got {part}")
    st, en = s.cuts[part], s.cuts[part + 1]
    B = len(s.row_tiles)
    b, r, t0, gp = st
    out = []
    seg = 0
    while b < B and (gp < en[3] or (gp == en[3] and t0 < en[2])):
        t1 = min(en[2], s.key_tiles[b]) if gp == en[3] else s.key_tiles[b]
        out.append((b, r, t0, t1, t0 == 0 and t1 == s.key_tiles[b], 2 * part + (0 if seg == 0 else 1)))
        seg += 1
        gp += 1
        r += 1
        t0 = 0
        while b < B and r >= s.row_tiles[b]:
            b += 1
            r = 0
    return out
