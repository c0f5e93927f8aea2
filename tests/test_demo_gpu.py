"""The main job and the examples, end to end on a GPU.

``driverlevel capture-demo`` (small sizes) must exit 0 with a ``--json`` report that passes
its schema, says the graph replay equals the eager step and that DDTree's tokens equal
greedy decoding's; every script in ``examples/`` must exit 0 (each checks its own result
against a reference and returns non-zero on a mismatch).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from driverlevel.demo.capture_demo import check_schema

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = sorted(p.name for p in (REPO / "examples").glob("*.py"))


def _env():
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))


def test_capture_demo_small_is_lossless_and_reports_valid_json():
    p = subprocess.run([sys.executable, "-m", "driverlevel", "capture-demo", "--batch", "2", "--prompt-len", "48",
                        "--max-new-tokens", "40", "--vocab", "4096", "--heads", "9", "--budget", "8", "--steps", "200",
                        "--json"], cwd=REPO, env=_env(), capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, f"exit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    rep = json.loads(p.stdout)
    check_schema(rep)
    assert rep["eager_equals_graph"] is True
    assert rep["lossless"] is True and rep["requests_equal"] == 2
    assert rep["tokens_compared"] >= 2 * 40
    assert rep["ddtree"]["tokens"] >= 2 * 40 and rep["ddtree"]["steps"] <= rep["autoregressive"]["steps"]


@pytest.mark.parametrize("script", EXAMPLES)
def test_example_runs(script):
    if script == "verify_attention_cupy.py":
        pytest.importorskip("cupy")
    p = subprocess.run([sys.executable, str(REPO / "examples" / script)], cwd=REPO, env=_env(), capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, f"{script} exited {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
