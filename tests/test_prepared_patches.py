"""The prepared kernel patches of research/patches/ (CPU only): each applies to this tree alone, as the
device scripts apply it (research/patches/patched_tree.sh), but the ones its README names as based on
an older commit.

A patch that no longer applies costs a whole device call when found there: the forty-second session
found dev-rounds.patch carrying two test files' hunks that main already had, which ``patch -p1``
refuses as a reversed patch, so the next session's first call would have stopped at its first step.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PATCHES = REPO / "research" / "patches"

#: Patches research/patches/README.md says apply to an older commit, not to main.
OLDER_BASE = {"warp-enum.patch", "persistent-build.patch", "pb-dry-l1.patch"}


def _patches():
    return sorted(p.name for p in PATCHES.glob("*.patch")) if PATCHES.is_dir() else []


def test_the_readme_names_the_older_based_patches_that_are_here():
    text = (PATCHES / "README.md").read_text()
    head = text[:text.index("\n## ")]
    for name in OLDER_BASE & set(_patches()):
        assert f"`{name.removesuffix('.patch')}`" in head, name


@pytest.mark.parametrize("name", [n for n in _patches() if n not in OLDER_BASE])
def test_prepared_patch_applies_to_this_tree(name):
    if shutil.which("git") is None:  # (outside a checkout, as .ci/run's copy, git apply works as patch does)
        pytest.skip("needs git")
    env = dict(os.environ)
    if not (REPO / ".git").exists():  # a copy (.ci/run's): never the repository of a folder above it, where
        env["GIT_CEILING_DIRECTORIES"] = str(REPO.parent)  # git apply would skip the paths outside its cwd
    r = subprocess.run(["git", "apply", "--check", str(PATCHES / name)], cwd=REPO, capture_output=True, text=True,
                       env=env)
    assert r.returncode == 0, f"{name} does not apply here:\n{r.stderr}"
