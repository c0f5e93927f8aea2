"""The import graph: the library apart from the demo and the references (CPU only, reads the sources).

The core (runtime, verify attention, DDTree, the runner and its plug-in interfaces) imports
nothing from :mod:`driverlevel.demo` nor :mod:`driverlevel.reference`; only the command line
(``cli.py``, which registers ``capture-demo``) reaches the demo. The demo plugs into the runner
through :mod:`driverlevel.interfaces`, and the runner's protocols accept it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import driverlevel

PKG = Path(driverlevel.__file__).resolve().parent
#: Modules of the package root allowed to import the demo: the command line only.
APPLICATION = {"cli.py", "__main__.py"}


def _imports(path: Path) -> set[str]:
    """Absolute names of every module ``path`` imports (relative imports resolved), at any depth."""
    rel = path.relative_to(PKG.parent).with_suffix("")
    package = list(rel.parts[:-1])
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)
    return out


def _core_modules():
    return sorted(p for p in PKG.glob("*.py") if p.name not in APPLICATION)


def test_core_imports_neither_the_demo_nor_the_references():
    bad = {}
    for path in _core_modules():
        names = {n for n in _imports(path) if n.startswith(("driverlevel.demo", "driverlevel.reference"))}
        if names:
            bad[path.name] = sorted(names)
    assert not bad, f"core modules importing the demo or the references: {bad}"


def test_the_import_walk_sees_relative_imports():
    names = _imports(PKG / "runner.py")
    assert "driverlevel.interfaces" in names and "driverlevel.argmax" in names
    assert "driverlevel.demo.capture_demo" in _imports(PKG / "cli.py")


def test_demo_imports_core_only_through_public_or_runtime_modules():
    """The demo is a client: it never reaches into the runner's or DDTree's internals."""
    for path in sorted((PKG / "demo").glob("*.py")):
        names = _imports(path)
        assert not any(n.startswith(("driverlevel.runner._", "driverlevel.ddtree._")) for n in names), path.name


def test_examples_import_only_the_public_api():
    """The examples show how a user writes against the package: none imports a private (underscore) module."""
    examples = sorted((PKG.parent / "examples").glob("*.py"))
    assert examples
    for path in examples:
        names = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
        private = sorted(n for n in names if n.split(".")[0] == PKG.name and any(
            part.startswith("_") for part in n.split(".")[1:]))
        assert not private, f"{path.name} imports private modules: {private}"


def test_demo_model_and_drafter_have_the_runner_protocols_methods():
    from driverlevel.demo import Drafter, ForwardPlan, MLAModel

    for cls, methods in ((MLAModel, ("forward_plan",)), (ForwardPlan, ("__call__", "bind", "check_errors")),
                         (Drafter, ("prepare", "run", "reset"))):
        for m in methods:
            assert callable(getattr(cls, m, None)), (cls.__name__, m)
    assert isinstance(MLAModel.vocab_size, property)
    assert isinstance(ForwardPlan.pools, property) and isinstance(Drafter.pools, property)


def test_runner_rejects_objects_that_are_not_the_protocols():
    import pytest

    from driverlevel.runner import AutoregressiveRunner, DecodeStepRunner

    with pytest.raises(TypeError, match="DraftModel"):
        DecodeStepRunner(None, target_forward=lambda s, b: None, drafter=object(), vocab_size=100, max_batch=2,
                         budget=8, max_context=64, max_prompt_len=8)
    with pytest.raises(TypeError, match="TargetModel"):
        AutoregressiveRunner(None, model=object(), max_batch=2, max_context=64, max_prompt_len=8)
    with pytest.raises(TypeError, match="TargetForward"):
        AutoregressiveRunner(None, target_forward=42, vocab_size=100, max_batch=2, max_context=64, max_prompt_len=8)
