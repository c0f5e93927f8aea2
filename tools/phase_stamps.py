"""Reading the phase stamps of ``cu/phase_stamps.cuh`` back from a loaded module (shared by
``tools/ddtree_stamps.py`` and ``tools/verify_stamps.py``; needs a GPU to be useful).

A kernel compiled with ``-DDL_STAMPS=1`` writes ``(point, arg, clock64, %globaltimer ns)`` records
into fixed slots of rows of the module global ``dl_stamps``: :func:`zero_stamps` before the launch,
:func:`read_stamps` after it (the records of a row in slot order). :func:`timeline` turns the records of many rows into a table
of when each point was reached (µs of the global timer from the earliest stamp of a start point).
"""

from __future__ import annotations

import statistics
from collections import defaultdict

ROWS, POINTS = 8192, 32  # DL_STAMP_ROWS, DL_STAMP_POINTS of cu/phase_stamps.cuh


def _global(module, name: bytes):
    from cuda.bindings import driver

    from driverlevel._errors import check

    return check("cuModuleGetGlobal", driver.cuModuleGetGlobal(module._handle, name))


def zero_stamps(module) -> None:
    """Empty every record of ``module``'s stamps (call before the stamped launch)."""
    from cuda.bindings import driver

    from driverlevel._errors import check

    with module.device.activated():
        ptr, size = _global(module, b"dl_stamps")
        check("cuMemsetD32", driver.cuMemsetD32(ptr, 0, size // 4))
        check("cuCtxSynchronize", driver.cuCtxSynchronize())  # (the null stream's memset, before any stream's launch)


def read_stamps(module) -> dict:
    """``{row: [(point, arg, clock, gtime_ns), ...]}`` of the rows with records, in slot order (after a sync).

    Raises ``RuntimeError`` if the global's size differs from :data:`ROWS` x :data:`POINTS` records."""
    import numpy as np
    from cuda.bindings import driver

    from driverlevel._errors import check

    recs = np.zeros((ROWS, POINTS, 4), np.uint64)
    with module.device.activated():
        ptr, size = _global(module, b"dl_stamps")
        if size != recs.nbytes:
            raise RuntimeError(f"dl_stamps is {size} B; this tool expects {recs.nbytes} B")
        check("cuMemcpyDtoH", driver.cuMemcpyDtoH(recs.ctypes.data, ptr, size))
    return records_by_row(recs)


def records_by_row(recs) -> dict:
    """``{row: [(point, arg, clock, gtime_ns), ...]}`` from the raw ``[ROWS, POINTS, 4]`` uint64
    array of ``dl_stamps`` (name, clock, global timer, arg per slot; name 0: an empty slot)."""
    import numpy as np

    out = {}
    for row in np.nonzero(recs[:, :, 0].any(axis=1))[0]:
        recs_row = []
        for name, clock, gtime, arg in recs[row]:
            if name:
                point = int(name).to_bytes(8, "little").rstrip(b"\0").decode()
                recs_row.append((point, int(np.int64(arg)), int(np.int64(clock)), int(gtime)))
        out[int(row)] = recs_row
    return out


def timeline(rows: dict, order: list[str], start: str, name=lambda point, arg: point) -> list[str]:
    """Table lines: for each point name (``name(point, arg)``; listed in ``order``, then any other
    in order of first appearance), the rows that reached it and the first / median / last time, in
    µs of the global timer from the earliest record of point ``start`` (``None``: of any point)."""
    at = defaultdict(list)
    for recs in rows.values():
        for point, arg, _, g in recs:
            at[name(point, arg)].append(g)
    starts = [g for recs in rows.values() for point, _, _, g in recs if start is None or point == start]
    if not starts:
        return [f"(no {start or 'stamp'} point recorded)"]
    t0 = min(starts)
    lines = [f"{'point':12s} {'rows':>5s} {'first µs':>9s} {'median µs':>10s} {'last µs':>8s}"]
    for k in [k for k in order if k in at] + [k for k in at if k not in order]:
        v = [(g - t0) / 1e3 for g in at[k]]
        lines.append(f"{k:12s} {len(v):5d} {min(v):9.2f} {statistics.median(v):10.2f} {max(v):8.2f}")
    return lines


if __name__ == "__main__":  # a library of the two stamp tools, not a script
    import sys

    print("tools/phase_stamps.py is the stamp reader that tools/verify_stamps.py and tools/ddtree_stamps.py "
          "share; run one of those", file=sys.stderr)
    sys.exit(2)
