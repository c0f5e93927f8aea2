"""The README's Layout table (CPU only, reads the files): it names the kernel headers and modules a reader
looks for, and every private module of the package."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _layout_first_column() -> set[str]:
    text = (REPO / "README.md").read_text()
    sec = text[text.index("## Layout"):]
    sec = sec[:sec.index("\n## ", 1)]
    paths = set()
    for line in sec.splitlines():
        if line.startswith("| `"):
            cell = line.split(" | ")[0]
            for path in re.findall(r"`([^`]+)`", cell):
                paths |= {path, path.rsplit("/", 1)[-1]}
    return paths


def test_readme_layout_lists_the_reviewed_files_and_every_private_module():
    first = _layout_first_column()
    for path in ("cu/phase_stamps.cuh", "cu/ddtree/topk_threshold.cuh", "driverlevel/_topk_threshold.py"):
        assert (REPO / path).is_file(), path
        assert path in first, path
    missing = sorted(p.name for p in (REPO / "driverlevel").glob("_[a-z]*.py") if p.name not in first)
    assert missing == []


def test_every_script_the_readme_and_benchmarks_name_is_in_the_tree_or_in_the_patch_named_beside_it():
    """BENCHMARKS.md sent readers to ``benchmarks/bench_grid_barrier.py`` and ``tests/test_grid_sync_gpu.py``,
    which only ``research/patches/persistent-build.patch`` adds: a script not in the tree is named on the
    same line as a patch under ``research/patches/`` that adds it."""
    missing = []
    for doc in ("README.md", "BENCHMARKS.md"):
        for n, line in enumerate((REPO / doc).read_text().splitlines(), 1):
            for path in re.findall(r"\b((?:benchmarks|tools|tests|examples|driverlevel)/[\w/.-]+\.(?:py|sh))\b", line):
                if (REPO / path).is_file():
                    continue
                patches = re.findall(r"research/patches/[\w.-]+\.patch", line)
                if not any(f"+++ b/{path}\n" in (REPO / p).read_text() for p in patches if (REPO / p).is_file()):
                    missing.append(f"{doc}:{n}: {path}")
    assert missing == []
