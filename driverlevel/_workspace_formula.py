"""The published size of the verify attention's split-KV workspace.

The verify attention runs on a fixed persistent grid of ``num_parts`` CTAs (the
device's SM count times the CTAs of the partial kernel that fit one SM). On every
replay a scheduler kernel cuts the step's work, the sequence of (request, row
tile, key tile) units, into ``num_parts`` about-equal parts. A (request, row
tile) pair whose keys all fall in one part writes its final output directly;
only a pair cut by a part boundary leaves partial results, and a part holds at
most two such pieces (its first and its last segment). So the workspace is
bounded by the grid, not by ``batch × splits``.

Derivation
----------
slots = 2 * num_parts
    Part ``p`` writes its first segment's piece to slot ``2p`` and its last
    segment's piece to slot ``2p + 1``; a middle segment always covers a whole
    pair. (Exactly: pieces <= cuts inside pairs + split pairs <= 2 (num_parts - 1).)
per slot
    ``tile_rows`` rows (the kernel's row tile M), each ``v_dim`` bf16 partial
    outputs (normalised by the piece's own sum, so in the output's range) + 1 fp32
    log-sum-exp: ``tile_rows * (v_dim * 2 + 4)`` bytes.
bytes = 2 * num_parts * tile_rows * (v_dim * value_bytes + 4)

Plus the scheduler's tables (:func:`scheduler_bytes`): 40 B per request slot of
the batch and 64 B per part (a cut and a combine entry).

Examples (bf16 partials, 512-wide values; until 2026-12-01 they were fp32,
``(v_dim + 1) * 4`` bytes per row, twice the bytes to write and to read back):

* H200 (132 SMs, 1 CTA of the 64-row tile per SM): 2 * 132 * 64 * 1028 =
  17,369,088 B (16.6 MiB) for every batch size, draft count and head count
  (sm_90's tile has 64 rows; a 48-row tile, picked where it pads the rows less,
  e.g. 9 heads x 16 draft tokens on every target, gives 2 * SMs * 48 * 1028)
  — the seed deployment's configuration (batch 8, 256 draft tokens, 9 heads)
  at 16 host-fixed splits needed 605,159,424 B.
* RTX PRO 6000 (188 SMs, 1 CTA of the 64-row sm_120 tile per SM):
  2 * 188 * 64 * 1028 = 24,737,792 B.
"""

from __future__ import annotations

from ._checks import positive_int

__all__ = ["partial_workspace_bytes", "scheduler_bytes"]

#: Bytes of one request record written by the scheduler (``VaRequest``).
REQUEST_RECORD_BYTES = 40
#: Bytes of one cut (``VaCut``: b, r, t, gp); the table has ``num_parts + 1``.
CUT_RECORD_BYTES = 16
#: Bytes of one combine entry (``VaEntry``: b, r, p_first, p_last, item_end, row_warps, rows,
#: slot0, empty, a pad word, out_row0 as int64); the table has ``num_parts``.
ENTRY_RECORD_BYTES = 48


def partial_workspace_bytes(num_parts: int, tile_rows: int, v_dim: int = 512, value_bytes: int = 2) -> int:
    """Bytes of split-KV partial outputs and log-sum-exps of a verify plan.

    ``2 * num_parts * tile_rows * (v_dim * value_bytes + 4)`` (see the module
    docstring for the derivation).

    Parameters
    ----------
    num_parts : int
        CTAs of the persistent grid (``VerifyAttention.num_parts``).
    tile_rows : int
        Rows per CTA tile (``TileConfig.rows``: 64, 48 or 32).
    v_dim : int
        Value columns (512 for MLA).
    value_bytes : int
        Bytes per partial output value (2: bf16); each row's log-sum-exp is fp32.

    Raises
    ------
    TypeError, ValueError
        For a non-integer or non-positive argument, naming it.

    Examples
    --------
    >>> partial_workspace_bytes(132, 64)
    17369088
    """
    num_parts = positive_int("num_parts", num_parts)
    tile_rows = positive_int("tile_rows", tile_rows)
    v_dim = positive_int("v_dim", v_dim)
    value_bytes = positive_int("value_bytes", value_bytes)
    return 2 * num_parts * tile_rows * (v_dim * value_bytes + 4)


def scheduler_bytes(max_batch: int, num_parts: int) -> int:
    """Bytes of the scheduler's tables: ``40 * max_batch + 64 * num_parts + 16``.

    Raises
    ------
    TypeError, ValueError
        For a non-integer or non-positive argument, naming it.
    """
    max_batch = positive_int("max_batch", max_batch)
    num_parts = positive_int("num_parts", num_parts)
    return REQUEST_RECORD_BYTES * max_batch + CUT_RECORD_BYTES * (num_parts + 1) + ENTRY_RECORD_BYTES * num_parts
