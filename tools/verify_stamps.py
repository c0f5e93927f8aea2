"""When the CTAs of one verify-attention replay reach their phases (a developer tool for the kernel's
speed): the scheduler, every partial CTA, the combine.

Builds a :class:`~driverlevel.VerifyAttention` whose ``verify_attention.cu`` is compiled with
``-DDL_STAMPS=1`` (``cu/phase_stamps.cuh``; without the define the kernels are unchanged), makes
``benchmarks/bench_attention.py``'s random inputs for one shape, captures ``plan.run`` and replays
it behind an L2 flush as the benchmark does, then prints a timeline in µs of the global timer
from the first stamp of the replay:

* the scheduler (thread 0): ``start``, ``end``;
* each partial CTA, thread 0 (a QK warp): ``start``, ``cuts`` (its two cuts computed), ``seg`` (a
  segment's record written; once more with no segment at the end), ``qissued`` (its Q
  fragments' loads issued), ``tile0`` (the segment's first key tile landed), ``t0done`` (that
  tile's P written), ``bar16`` / ``mma16`` / ``P16`` / ``bar17`` (iteration 16: past its
  barrier, its last mma issued, its P written, past the next barrier), ``lasttile`` (its last key
  tile begins), ``loop`` (its key loop done),
  ``qk lse`` (its row sums and LSEs written), ``done`` (the part done), ``waited`` (PDL: the
  scheduler has completed);
* each partial CTA, the first PV thread: ``pv kissued`` (the first tiles' slot ids read and their
  loads issued), ``pv tile0``, ``pv bar16`` / ``pv mma16`` (iteration 16: past its barrier, its
  last mma issued), ``pv loop``, ``pv bar`` (past the epilogue's barrier: the QK
  warps' row sums are in), ``pv epi`` (the segment's output stored);
* each combine CTA: ``cb start``, ``cb waited`` (PDL: the partial grid has completed), ``cb end``.

After the timeline: the key loop's µs per tile and iteration 16's points in SM cycles after its
barrier (medians over the CTAs). A stamp is one global store by one thread, but the points inside
the key loop make the stamped loop ~10% slower: compare the points with each other,
bench_attention's time stays the reference. ``--tile SPEC`` stamps another tile configuration
(bench_tiles' grammar). With the QK softmax a tile behind (``qk_skew``, sm_90's default tile)
iteration 16's ``P16`` is tile 16's P, written in iteration 17, and the QK warps have no
``mma16`` (a stamp inside their k-steps spills).

Usage::

    python tools/verify_stamps.py [--heads 16] [--batch 8] [--prefix 4096] [--tokens 16] [--tree]
                                  [--ctas N] [--tile SPEC] [--no-flush]

Needs a GPU and PyTorch (the random inputs).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import phase_stamps  # noqa: E402  (tools/phase_stamps.py)

PART, COMBINE = 8, 1024  # VA_STAMP_PART, VA_STAMP_COMBINE of cu/verify_attention.cu
ORDER = ["sched start", "sched end", "start", "cuts", "seg", "qissued", "pv kissued", "tile0", "pv tile0", "t0done",
         "bar16", "pv bar16", "mma16", "pv mma16", "P16", "bar17", "lasttile", "loop", "qk lse", "pv loop", "pv bar",
         "pv epi", "done", "waited", "cb start", "cb waited", "cb end"]
#: One steady iteration (it = 16) split per role, in SM cycles from the barrier both roles leave (bar16).
ITERATION = (("QK mma issued", "mma16"), ("QK P written", "P16"), ("PV mma issued", "pv mma16"),
             ("next barrier left", "bar17"))


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--heads", type=int, default=16, help="query heads (1..128; default 16)")
    ap.add_argument("--batch", type=int, default=8, help="requests (1..64; default 8)")
    ap.add_argument("--prefix", type=int, default=4096, help="cached tokens per request (1..1,000,000; default 4096)")
    ap.add_argument("--tokens", type=int, default=16, help="draft tokens per request (1..256; default 16)")
    ap.add_argument("--tree", action="store_true", help="a random draft tree (bitmask) instead of a chain")
    ap.add_argument("--ctas", type=int, default=0,
                    help="also list the partial CTAs that finished last, this many (default 0: none)")
    ap.add_argument("--tile", default=None,
                    help="a tile configuration in bench_tiles' SPEC grammar (e.g. 64x1x32x4wd_24); default: this GPU's")
    ap.add_argument("--no-flush", action="store_true", help="replay with a warm L2 (no flush before the stamped replay)")
    args = ap.parse_args(argv)
    for name, v, lo, hi in (("--heads", args.heads, 1, 128), ("--batch", args.batch, 1, 64),
                            ("--prefix", args.prefix, 1, 1_000_000), ("--tokens", args.tokens, 1, 256),
                            ("--ctas", args.ctas, 0, 1024)):
        if not lo <= v <= hi:
            ap.error(f"{name} must be in {lo}..{hi}, got {v}")
    args.tile_config = None  # the tile, parsed here: a bad --tile is a usage error before the GPU check
    if args.tile:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
        from bench_tiles import parse_tile_config

        try:
            args.tile_config = parse_tile_config(args.tile, "--tile")
        except SystemExit as e:  # its one-line message (it raises SystemExit for its other callers)
            ap.error(str(e.code))
    return args


def resolve_tile(tile_config, arch: str, rows: int):
    """``parse_args``' ``tile_config`` for ``arch``: a TileConfig or None (the GPU's default), as it
    comes, and ``native_rs`` (a function of ``(arch, rows)``, as ``tools/sass.py`` resolves it) called
    now that the arch is known, with ``rows`` the plan's rows per request (``tokens * heads``).

    Raises
    ------
    SystemExit
        ``native_rs`` on an arch whose default tile has QK and PV warps (no S exchange to change),
        with ``bench_tiles``' one-line message.
    """
    return tile_config(arch, rows) if callable(tile_config) else tile_config


def point_name(row: int, point: str) -> str:
    """The timeline's name of a stamp of ``row``: the scheduler's and the combine's prefixed, a
    partial CTA's PV role prefixed with ``pv``."""
    if row < PART:
        return f"sched {point}"
    if row >= COMBINE:
        return f"cb {point}"
    return f"pv {point}" if (row - PART) % 2 else point


def named(rows: dict) -> dict:
    """The records with their timeline names (``point_name``) in place of the points."""
    return {r: [(point_name(r, pt), a, c, g) for pt, a, c, g in recs] for r, recs in rows.items()}


def last_ctas(rows: dict, n: int) -> list[str]:
    """One line per partial CTA among the ``n`` whose ``done`` came last: its part, its segments'
    key tiles, and its points in µs from the first stamp (both roles)."""
    t0 = min(g for recs in rows.values() for *_, g in recs)
    parts = []
    for r, recs in rows.items():
        if PART <= r < COMBINE and (r - PART) % 2 == 0:
            done = [g for pt, _, _, g in recs if pt == "done"]
            if done:
                parts.append((done[0], r))
    out = []
    for _, r in sorted(parts)[-n:] if n else []:
        recs = rows[r] + rows.get(r + 1, [])
        tiles = [a for pt, a, _, _ in rows[r] if pt == "seg" and a >= 0]
        pts = " ".join(f"{point_name(r + (i >= len(rows[r])), pt)}={(g - t0) / 1e3:.2f}"
                       for i, (pt, _, _, g) in enumerate(recs))
        out.append(f"part {(r - PART) // 2:4d} tiles {tiles}: {pts}")
    return out


def tile_rates(rows: dict) -> list[str]:
    """Per partial CTA with one segment of n >= 3 key tiles: the steady loop's µs per tile,
    (lasttile - t0done) / (n - 2), and the last tile's span (lasttile to loop); medians and
    extremes over the CTAs."""
    import numpy as np

    rate, last = [], []
    for r, recs in rows.items():
        if not (PART <= r < COMBINE and (r - PART) % 2 == 0):
            continue
        pts = {}
        for pt, a, _, g in recs:
            pts.setdefault(pt, (a, g))
        tiles = [a for pt, a, _, _ in recs if pt == "seg" and a >= 0]
        if len(tiles) != 1 or tiles[0] < 3 or not {"t0done", "lasttile", "loop"} <= pts.keys():
            continue
        rate.append((pts["lasttile"][1] - pts["t0done"][1]) / 1e3 / (tiles[0] - 2))
        last.append((pts["loop"][1] - pts["lasttile"][1]) / 1e3)
    if not rate:
        return ["(no CTA with one segment of 3 or more key tiles)"]
    q = lambda v: f"median {np.median(v):.3f}  min {np.min(v):.3f}  max {np.max(v):.3f}"
    return [f"key loop µs per tile over {len(rate)} CTAs: {q(rate)}", f"last tile's span µs: {q(last)}"]


def iteration_split(rows: dict) -> list[str]:
    """Medians over the partial CTAs of iteration 16's points (``ITERATION``) in SM cycles after
    its barrier: how long the QK warps' S, their softmax and the PV warps' P V take against the
    iteration (a role that finishes well before ``bar17`` waits at the barrier)."""
    import numpy as np

    got = {name: [] for _, name in ITERATION}
    for r, recs in rows.items():
        if not (PART <= r < COMBINE and (r - PART) % 2 == 0):
            continue
        pts = {point_name(r, pt): c for pt, _, c, _ in recs}
        pts.update({point_name(r + 1, pt): c for pt, _, c, _ in rows.get(r + 1, [])})
        if "bar16" not in pts:
            continue
        for _, name in ITERATION:
            if name in pts:
                got[name].append(pts[name] - pts["bar16"])
    if not got["bar17"]:
        return ["(no CTA ran 18 key tiles in one segment: no iteration split)"]
    return ["iteration 16, SM cycles after its barrier (median over CTAs): "
            + ", ".join(f"{label} {np.median(got[name]):.0f}" for label, name in ITERATION if got[name])]


def main(argv=None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import driverlevel as dl
    from driverlevel import verify_attention as va
    from bench_attention import make_data

    from driverlevel._device import require_gpu

    require_gpu()
    try:
        import torch
    except ImportError:
        sys.exit("tools/verify_stamps.py needs PyTorch with CUDA (it makes the random inputs): pip install torch")
    dev = dl.Device(0)
    try:  # native_rs needs the arch: resolved before the stream and the flush buffer
        tile = resolve_tile(args.tile_config, dev.arch, args.tokens * args.heads)
    except SystemExit as e:
        print(f"verify_stamps.py: error: {e.code}", file=sys.stderr)
        return 2
    stream = dev.create_stream()
    flush = dl.DeviceBuffer.allocate(dev, 256 << 20, label="l2-flush").as_array()
    plain = va.compile_defines
    va.compile_defines = lambda arch, config=None: {**plain(arch, config), "DL_STAMPS": 1}
    try:
        prefixes = [args.prefix] * args.batch
        plan = dl.VerifyAttention(dev, args.heads, max_batch=args.batch, max_q=args.tokens,
                                  mask_format="bitmask" if args.tree else "causal",
                                  tile=tile)
        d = make_data(torch, dev, args.heads, prefixes, args.tokens, not args.tree, plan.mask_words, 7)
        torch.cuda.synchronize()
        with dl.capture(stream) as cap:
            plan.run(stream, d["q"], d["kv"], d["meta"], d["out"], d["lse"])
        gx = cap.graph.instantiate(upload_stream=stream)
        for _ in range(3):  # warm-up
            gx.launch(stream)
        stream.synchronize()
        phase_stamps.zero_stamps(plan._module)
        if args.no_flush:
            gx.launch(stream)
        else:
            flush.fill_bytes(0x5A, stream)
        gx.launch(stream)
        stream.synchronize()
        rows = phase_stamps.read_stamps(plan._module)
    finally:
        va.compile_defines = plain
    parts = sum(1 for r in rows if PART <= r < COMBINE and (r - PART) % 2 == 0)
    combine = sum(1 for r in rows if r >= COMBINE)
    print(f"# verify replay, {args.heads} heads x batch {args.batch} x prefix {args.prefix} x {args.tokens} tokens "
          f"({'tree' if args.tree else 'chain'}){', warm L2' if args.no_flush else ''}, tile {plan.config.label}: {parts} partial CTAs, "
          f"{combine} combine CTAs stamped; µs from the first stamp")
    print("\n".join(phase_stamps.timeline(named(rows), ORDER, None)))
    print("\n".join(tile_rates(rows) + iteration_split(rows)))
    if args.ctas:
        print("\n".join(last_ctas(rows, args.ctas)))
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import tool_output  # (tools/tool_output.py: a failed write of stdout is one line, exit 2)

    sys.exit(tool_output.run(main, "tools/verify_stamps.py"))
