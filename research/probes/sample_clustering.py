"""The threshold top-K's fallback rate on rows whose large logits sit in runs of consecutive token
ids, for sample groups of 8 tokens (fp32 on main: 32 bytes) against 16 (bf16 on main, and fp32
under the removed sample-g64-f32.patch, in the history at e7c18b0: 64 bytes). Seventy-first session.

The numpy twin (driverlevel.reference.topk_threshold.threshold_topk, at the build's merge capacity)
decides each row with the group size forced by replacing `group_tokens` (the twin's and the host
module's: a probe, not an API): the row falls back when fewer than K logits are >= T (or T is not
finite) or more than `candidate_capacity` are (the build then refines the row's threshold, or
runs the exact chunk top-K: a cost in time, never in exactness; ~+19 µs at batch 8 on an H100
since the seventy-second session's refine_row, ~+360 µs before). A row: N(0, 1) noise over 163,840 tokens, `hot` x K hot logits 8 + N(0, 1) in runs of
`run` consecutive ids at random run-aligned positions (run 1: no clustering, the bench's drafters'
kind).

    python research/probes/sample_clustering.py --rows 2000 --hot 1     (CPU, ~5-8 minutes)
    python research/probes/sample_clustering.py --rows 2000 --hot 2

Printed on 2026-12-07 (2,000 rows per cell, seed 1; the rows with count < K; no row ever had more
than the capacity; K = 16 and run 1 never fell back in either form):

    hot  K    run:   4            8            16           32           64      (G=8 / G=16)
    1    64       .001 / 0     .001 / .001  .001 / .004  0 / .003     0 / 0
    1    256      .004 / .003  .048 / .050  .043 / .054  .038 / .055  .030 / .062
    1    512      .005 / .004  .022 / .025  .018 / .045  .016 / .045  .013 / .041
    2    256      0 / 0        .007 / .004  .004 / .022  .004 / .024  .002 / .018
    2    512      0 / 0        .004 / .002  .004 / .021  .004 / .021  .002 / .022

Once the runs are 16 ids or longer, 16-token groups fall back 1.3-11x as often (or where 8-token
groups never did); for runs of 4 or 8 ids the two forms are alike."""

import click
import numpy as np

import driverlevel._topk_threshold as host
import driverlevel.reference.topk_threshold as twin
from driverlevel.ddtree import MERGE_CAPACITY

VOCAB = 163_840


def _force_group(g: int) -> None:
    forced = lambda bf16: g  # noqa: E731 (the probe's override of both modules' binding)
    host.group_tokens = forced
    twin.group_tokens = forced


def fallback_rates(g: int, k: int, run: int, rows: int, hot: int, seed: int) -> tuple[float, float]:
    """(share of rows with count < K or T not finite, share with count > capacity) for group size g."""
    _force_group(g)
    rng = np.random.default_rng(seed)
    low = high = 0
    for _ in range(rows):
        row = rng.normal(0.0, 1.0, VOCAB).astype(np.float32)
        runs = max(1, hot * k // run)
        starts = rng.choice(VOCAB // run, runs, replace=False) * run
        idx = (starts[:, None] + np.arange(run)[None, :]).reshape(-1)
        row[idx] = (8.0 + rng.normal(0.0, 1.0, idx.size)).astype(np.float32)
        r = twin.threshold_topk(row, k, False, MERGE_CAPACITY)
        high += r.count > r.capacity
        low += r.fallback and r.count <= r.capacity
    return low / rows, high / rows


@click.command()
@click.option("--rows", default=2000, show_default=True, help="rows per (K, run) cell")
@click.option("--hot", default=1, show_default=True, help="hot logits per row, as a multiple of K")
@click.option("--seed", default=1, show_default=True)
def main(rows: int, hot: int, seed: int) -> None:
    click.echo("  K run | G=8: count<K >cap | G=16: count<K >cap")
    for k in (16, 64, 256, 512):
        for run in (1, 4, 8, 16, 32, 64):
            a = fallback_rates(8, k, run, rows, hot, seed)
            b = fallback_rates(16, k, run, rows, hot, seed)
            click.echo(f"{k:3d} {run:3d} |   {a[0]:.3f}   {a[1]:.3f}  |    {b[0]:.3f}   {b[1]:.3f}")


if __name__ == "__main__":
    main()
