"""Helpers for tests that run the benchmark scripts' code without a GPU."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def load_bench(name):
    """``benchmarks/NAME.py`` as a fresh module (the scripts import their siblings: the folder is on
    ``sys.path`` while it loads). NAME may name a subfolder's file, e.g. ``"baseline/v1"``."""
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(f"bench_{name.replace('/', '_')}_under_test", BENCH / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod  # (dataclasses look their module up while it loads)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(BENCH))


def assert_usage_error(script, argv, words, capsys):
    """``benchmarks/SCRIPT.py``'s ``main(argv)`` exits 2 with argparse's usage line and ``words`` in its
    one-line error, and no traceback."""
    with pytest.raises(SystemExit) as e:
        load_bench(script).main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert f"{script}.py: error: {words}" in err or f"error: {words}" in err, err
    assert err.startswith("usage: ") and "Traceback" not in err
