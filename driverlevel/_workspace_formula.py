"""The published size of the verify attention's split-KV workspace.

The verify attention splits each request's keys across ``num_splits`` CTAs.
Every split writes, for every (draft token, query head) row it covers, a partial
output over its share of the keys (``v_dim`` values, not yet normalised across
splits) and the log-sum-exp of its scores; a second kernel merges the splits.
Because the grid is fixed when a graph is captured, the workspace is sized for
the plan's maxima, not for the lengths of any one step.

Derivation
----------
rows  = max_batch * max_q * num_heads
    One row per (draft token, query head) of the largest batch the plan admits
    (``total_q <= max_batch * max_q``). The kernels place the row of global draft
    token ``t`` and head ``h`` at ``t * num_heads + h``, so the rows of one step
    are packed and never exceed this bound, whatever the per-request lengths.
per (row, split)
    ``v_dim`` partial output values + 1 log-sum-exp, all stored in the partial
    dtype: ``v_dim + 1`` elements.
bytes = rows * num_splits * (v_dim + 1) * partial_dtype_bytes

Check against the seed deployment (9 heads, 512-wide values, fp32 partials,
256 draft tokens per request, batch 8): rows = 8 * 256 * 9 = 18,432, so

* 64 splits: 18,432 * 64 * 513 * 4 = 2,420,637,696 B (about 2.42 GB),
* 16 splits: 18,432 * 16 * 513 * 4 =   605,159,424 B (about 605 MB).

The formula counts payload only; any alignment padding a plan adds between the
output and the log-sum-exp regions must be reported by the plan on top of it.
"""

from __future__ import annotations

import operator

__all__ = ["partial_workspace_bytes"]


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got bool")
    try:
        value = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}") from None
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return value


def partial_workspace_bytes(
    max_batch: int,
    max_q: int,
    num_heads: int,
    num_splits: int,
    v_dim: int = 512,
    partial_dtype_bytes: int = 4,
) -> int:
    """Bytes of split-KV partial outputs and log-sum-exps for a verify plan.

    ``rows * num_splits * (v_dim + 1) * partial_dtype_bytes`` with
    ``rows = max_batch * max_q * num_heads`` (see the module docstring for the
    derivation).

    Parameters
    ----------
    max_batch : int
        Largest batch (number of requests) the plan accepts.
    max_q : int
        Largest number of draft tokens in one request.
    num_heads : int
        Query heads (all share one latent KV head).
    num_splits : int
        Splits of the key range per request, fixed at capture.
    v_dim : int, default 512
        Width of the value / output per head (the latent ``c_kv`` width of MLA).
    partial_dtype_bytes : int, default 4
        Bytes per element of the partials (4 for fp32).

    Returns
    -------
    int
        Workspace size in bytes.

    Raises
    ------
    TypeError
        An argument is not an int (bool is refused).
    ValueError
        An argument is < 1.

    Examples
    --------
    >>> partial_workspace_bytes(8, 256, 9, 64)
    2420637696
    >>> partial_workspace_bytes(8, 256, 9, 16)
    605159424
    """
    max_batch = _positive_int("max_batch", max_batch)
    max_q = _positive_int("max_q", max_q)
    num_heads = _positive_int("num_heads", num_heads)
    num_splits = _positive_int("num_splits", num_splits)
    v_dim = _positive_int("v_dim", v_dim)
    partial_dtype_bytes = _positive_int("partial_dtype_bytes", partial_dtype_bytes)
    rows = max_batch * max_q * num_heads
    return rows * num_splits * (v_dim + 1) * partial_dtype_bytes
