"""Probe for research/patches/warp-enum.patch (thirty-ninth session): for each searched request of
deep budget-16 builds (the search-switch test's rows), the one-warp enumeration's stamps (`enum`
with its candidates, or `enumfail` with why: 4 = past the cap) and the GPU's top-K log-probs saved
as $OUT/top_lp_JITTER_SEED.npy, for research/probes/warp_enum_model.py to replay. It uses the GPU
tests' fixtures, so it runs from a patched tree's tests/ folder:

    . research/patches/patched_tree.sh; patched_tree warp-enum /tmp/we
    cp research/probes/enum_why_test.py /tmp/we/tests/
    cd /tmp/we && PYTHONPATH=$PWD OUT=... python -m pytest -q -s tests/enum_why_test.py
"""
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from test_ddtree_gpu import Rig, peaked_rows, search_defines, stamped_build


@pytest.mark.parametrize("jitter, seed", [(0.7, 16), (0.0, 16), (0.7, 3)])
def test_why(device, stream, monkeypatch, jitter, seed):
    """Prints each searched request's enum / enumfail stamp and saves the top-K log-probs."""
    search_defines(monkeypatch, {"DL_STAMPS": 1})
    rng = np.random.default_rng(seed)
    D, V, batch, budget = 15, 163_840, 2, 16
    rig = Rig(device, rng, max_batch=batch, depth=D, vocab=V, budget=budget, mask_formats=("bitmask",))
    rig.push_state()
    x = peaked_rows(rng, batch, D, V, jitter)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    import phase_stamps
    out, searched = stamped_build(monkeypatch, rig, stream, x)
    recs = phase_stamps.read_stamps(rig.plan._module)
    for row in sorted(searched):
        print("ROW", row, [(p, a) for p, a, _, _ in recs[row] if p in ("enum", "enumfail", "searched", "lp", "last")])
    np.save(os.path.join(os.environ.get("OUT", "/tmp"), f"top_lp_{jitter}_{seed}.npy"), out["top_lp"])
    print("K", rig.plan.k if hasattr(rig.plan, "k") else None, out["top_lp"].shape)
