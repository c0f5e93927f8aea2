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
