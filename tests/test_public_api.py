"""The public API: a small root, every other name reached through a public submodule (CPU only).

Most of the code that uses the package runs only on a GPU (``test_*_gpu.py``, ``examples/``,
``benchmarks/``), so a name dropped from the root would go unnoticed on a machine without one.
These tests read every ``.py`` file and every Markdown file of the checkout as text and check
that each ``dl.NAME`` / ``driverlevel.NAME`` they mention (code, docstrings, comments, strings,
README code blocks and prose alike), and each ``from driverlevel[.SUB] import NAME``, resolves:
``NAME`` is a root name, a dunder, or a submodule, and a longer dotted chain
(``driverlevel.runtime.GraphExec.launch``) resolves attribute by attribute.
"""

from __future__ import annotations

import ast
import doctest
import importlib
import importlib.util
import inspect
import re
from pathlib import Path

import pytest

import driverlevel

REPO = Path(__file__).resolve().parent.parent
SKIP_DIRS = {".git", ".venv", "venv", "build", "dist", "__pycache__", ".pytest_cache", ".wt"}
MAX_ROOT_NAMES = 28
#: ``dl.X`` or ``driverlevel.X.Y...``, not preceded by a word character, a dot, a slash or a dash
#: (so ``foo.dl.x``, ``mdl.x`` and paths such as ``.../driverlevel.egg-info`` are not read as uses).
_CHAIN = re.compile(r"(?<![\w./-])(dl|driverlevel)((?:\.[A-Za-z_]\w*)+)")
_FROM = re.compile(r"^[ \t>.]*from (driverlevel(?:\.\w+)*) import ([\w, ]+?)\s*(?:#.*)?$", re.MULTILINE)
#: Names of the package that are not modules on disk: the wheel's kernel-source package.
_NOT_ON_DISK = {"driverlevel.cu"}


def _files(pattern):
    out = []
    for p in sorted(REPO.rglob(pattern)):
        rel = p.relative_to(REPO)
        if any(part in SKIP_DIRS or part.endswith(".egg-info") for part in rel.parts[:-1]):
            continue
        out.append(p)
    return out


def _py_files():
    here = Path(__file__).resolve()
    return [p for p in _files("*.py") if p.resolve() != here]  # this file's own examples are made up


def _md_files():
    return _files("*.md")


def _resolve(dotted: str):
    """Resolve ``driverlevel.a.b.c`` attribute by attribute, importing submodules as needed.

    Returns None when it resolves, else what is wrong. The first name must be in
    ``driverlevel.__all__``, a dunder or a module of the package; past a class or a
    function, the chain goes on through class attributes (instance attributes are not checked).
    """
    parts = dotted.split(".")
    first = parts[1]
    if first.startswith("__") and first.endswith("__"):
        return None  # __version__, __file__, __all__, ...
    if first not in driverlevel.__all__ and importlib.util.find_spec(f"driverlevel.{first}") is None \
            and f"driverlevel.{first}" not in _NOT_ON_DISK:
        return f"{first!r} is neither in driverlevel.__all__ nor a submodule"
    obj, path = driverlevel, "driverlevel"
    for name in parts[1:]:
        if f"{path}.{name}" in _NOT_ON_DISK:
            return None
        if inspect.ismodule(obj) and not hasattr(obj, name):
            try:
                importlib.import_module(f"{path}.{name}")
            except ModuleNotFoundError as exc:
                if exc.name != f"{path}.{name}":
                    raise
        if not hasattr(obj, name):
            return f"{path} has no attribute {name!r}"
        obj, path = getattr(obj, name), f"{path}.{name}"
        if not (inspect.ismodule(obj) or inspect.isclass(obj) or callable(obj)):
            return None  # a constant or an instance: what follows is its own attributes
    return None


def _uses(text: str):
    """``(line, dotted name)`` of every ``dl.X...`` / ``driverlevel.X...`` and ``from driverlevel... import X``."""
    for m in _CHAIN.finditer(text):
        chain = m.group(2)
        if chain.endswith("._"):
            chain = chain[:-2]  # a prefix in a string, e.g. startswith("driverlevel.runner._")
        yield text.count("\n", 0, m.start()) + 1, "driverlevel" + chain
    for m in _FROM.finditer(text):
        for name in m.group(2).split(","):
            name = name.strip().split(" as ")[0].strip()
            if name:
                yield text.count("\n", 0, m.start()) + 1, f"{m.group(1)}.{name}"


def _ast_from_imports(path: Path):
    """``from driverlevel[.SUB] import (A, B, ...)`` of a module, multi-line forms included."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and (node.module == "driverlevel" or node.module.startswith("driverlevel.")):
            for a in node.names:
                if a.name != "*":
                    yield node.lineno, f"{node.module}.{a.name}"


def _bad_uses(paths, from_ast: bool):
    bad = []
    for path in paths:
        text = path.read_text()
        uses = set(_uses(text))
        if from_ast:
            uses |= set(_ast_from_imports(path))
        for line, dotted in sorted(uses):
            err = _resolve(dotted)
            if err:
                bad.append(f"{path.relative_to(REPO)}:{line}: {dotted}: {err}")
    return bad


def test_the_scan_sees_the_checkout():
    names = {p.relative_to(REPO).as_posix() for p in _py_files()}
    assert {"driverlevel/__init__.py", "driverlevel/runtime.py", "examples/sglang_metadata.py",
            "tests/test_runtime_gpu.py", "benchmarks/bench_replay.py"} <= names
    assert "README.md" in {p.name for p in _md_files()}


def test_every_dotted_use_in_the_python_files_resolves():
    bad = _bad_uses(_py_files(), from_ast=True)
    assert not bad, "uses of names the package does not have:\n" + "\n".join(bad)


def test_every_dotted_use_in_the_markdown_and_other_text_files_resolves():
    others = _files("*.sh") + _files("*.toml") + [p for p in [REPO / ".ci" / "run"] if p.is_file()]
    bad = _bad_uses(_md_files() + others, from_ast=False)
    assert not bad, "uses of names the package does not have:\n" + "\n".join(bad)


@pytest.mark.parametrize("text, dotted", [
    ("x = dl.Graph(1)", "driverlevel.Graph"),
    ("driverlevel.runtime.GraphExec.launch", "driverlevel.runtime.GraphExec.launch"),
    ("    >>> from driverlevel import compile_file, Stream", "driverlevel.compile_file"),
    ("from driverlevel.runtime import Graph as G", "driverlevel.runtime.Graph"),
])
def test_the_scan_finds_uses(text, dotted):
    assert dotted in {d for _, d in _uses(text)}


@pytest.mark.parametrize("text", ["mdl.Graph", "foo.dl.Graph", "/x/driverlevel.egg-info", "dl_device.x"])
def test_the_scan_ignores_lookalikes(text):
    assert not list(_uses(text))


@pytest.mark.parametrize("dotted, ok", [
    ("driverlevel.Device", True), ("driverlevel.__version__", True), ("driverlevel.runtime", True),
    ("driverlevel.runtime.GraphExec.launch", True), ("driverlevel.demo.mla_model.MLAModel", True),
    ("driverlevel.cu", True), ("driverlevel.ddtree.DDTreeState", True),
    ("driverlevel.GraphExec", False), ("driverlevel.compile_file", False), ("driverlevel.as_device_array", False),
    ("driverlevel.runtime.NoSuchThing", False), ("driverlevel.runtime.GraphExec.no_such_method", False),
    ("driverlevel.interfaces.TargetForward", True), ("driverlevel.TargetForward", False),
])
def test_resolve(dotted, ok):
    assert (_resolve(dotted) is None) == ok, _resolve(dotted)


def test_the_root_is_small_and_documented():
    names = driverlevel.__all__
    assert len(names) <= MAX_ROOT_NAMES, f"{len(names)} root names: move some to a submodule"
    assert len(set(names)) == len(names)
    undocumented = []
    for name in names:
        obj = getattr(driverlevel, name)
        if not (inspect.isclass(obj) or inspect.isfunction(obj)):
            obj = type(obj)  # bfloat16: an instance, documented by its class
        doc = inspect.getdoc(obj) or ""
        if len(doc) < 40 or doc == inspect.getdoc(object):
            undocumented.append(name)
    assert not undocumented, f"root names without a docstring: {undocumented}"


def test_version_stays():
    assert isinstance(driverlevel.__version__, str) and driverlevel.__version__.count(".") >= 1


def test_runtime_reexports_every_name_of_the_driver_layer():
    import driverlevel.runtime as rt

    layer = {}
    for mod in ("_device", "_stream", "_memory", "_array", "_dtypes", "_compile", "_module", "_graph"):
        m = importlib.import_module(f"driverlevel.{mod}")
        for name in m.__all__:
            layer[name] = getattr(m, name)
    assert set(rt.__all__) == set(layer) and len(rt.__all__) == len(set(rt.__all__))
    for name, obj in layer.items():
        assert getattr(rt, name) is obj, name
    for name in driverlevel.__all__:
        if name in layer:
            assert getattr(driverlevel, name) is layer[name], name  # the root re-exports, never copies


def test_the_other_homes():
    from driverlevel import ddtree, interfaces, request_state

    assert ddtree.DDTreeState is request_state.RequestState is driverlevel.RequestState
    assert set(interfaces.__all__) == {"TargetBuffers", "TargetForward", "TargetModel", "DraftModel"}


# -- help(driverlevel) ------------------------------------------------------------------------------

def _package_examples():
    return doctest.DocTestParser().get_examples(driverlevel.__doc__)


def test_help_opens_with_an_example_marked_as_not_run():
    doc = driverlevel.__doc__
    first = doc.index(">>>")
    assert first < 600, "the package docstring should open with its example"
    examples = _package_examples()
    assert len(examples) >= 10
    assert all(e.options.get(doctest.SKIP) for e in examples), "the example needs a GPU: every line +SKIP"


def test_help_example_calls_match_the_signatures():
    """Not a run: the example is parsed, and each call it makes binds to the signature it names."""
    from driverlevel.runtime import CaptureSession, Graph, GraphExec

    source = "\n".join(e.source for e in _package_examples())
    tree = ast.parse(source)
    pool_carve_types = {"q", "kv", "out", "lse"}
    #: the example's variables and what they hold (checked below where they are assigned)
    kinds = {"dev": driverlevel.Device, "stream": driverlevel.Stream, "plan": driverlevel.VerifyAttention,
             "pool": driverlevel.WorkspacePool, "step": GraphExec, "cap": CaptureSession,
             **{v: driverlevel.DeviceArray for v in pool_carve_types}}
    checked = []

    def callee(func):
        """The function a call names, or None for calls outside the API (numpy, put, ...)."""
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            base = func.value.id
            if base == "dl":
                return getattr(driverlevel, func.attr)
            if base in kinds:
                return getattr(kinds[base], func.attr)
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Attribute):
            inner = func.value  # cap.graph.instantiate, dl.WorkspacePool.allocate
            if isinstance(inner.value, ast.Name) and inner.value.id == "cap" and inner.attr == "graph":
                return getattr(Graph, func.attr)
            if isinstance(inner.value, ast.Name) and inner.value.id == "dl":
                return getattr(getattr(driverlevel, inner.attr), func.attr)
        return None

    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        fn = callee(node.func)
        if fn is None:
            continue
        sig = inspect.signature(fn)
        args = [object()] * len(node.args)
        kwargs = {k.arg: object() for k in node.keywords}
        if inspect.isfunction(fn) and "." in fn.__qualname__:
            args = [object()] + args  # a method taken from its class: the instance comes first
        sig.bind(*args, **kwargs)  # raises TypeError on a wrong name or count
        checked.append(getattr(fn, "__qualname__", str(fn)))
    for want in ("VerifyAttention", "VerifyMetadata", "WorkspacePool.allocate", "WorkspacePool.carve",
                 "VerifyAttention.run", "Graph.instantiate", "GraphExec.launch", "VerifyAttention.check_errors",
                 "DeviceArray.copy_from_host", "DeviceArray.to_numpy", "Device.create_stream", "capture"):
        assert want in checked, (want, checked)
    # the variables are what the table above says they are
    assigned = {t.id: n.value for n in ast.walk(tree) if isinstance(n, ast.Assign) for t in n.targets
                if isinstance(t, ast.Name)}
    assert ast.unparse(assigned["plan"].func) == "dl.VerifyAttention"
    assert ast.unparse(assigned["pool"].func) == "dl.WorkspacePool.allocate"
    assert ast.unparse(assigned["stream"].func) == "dev.create_stream"
    assert ast.unparse(assigned["step"].func) == "cap.graph.instantiate"
    assert all(ast.unparse(assigned[v].func) == "pool.carve" for v in pool_carve_types)


def test_unsupported_target_error_is_public_and_caught_as_raised(monkeypatch):
    """compile_source raises it where the NVRTC in use lacks the target; callers catch it from the root."""
    from driverlevel import _compile
    monkeypatch.setattr(_compile, "_nvrtc_supported_archs", lambda: ("sm_80",))
    with pytest.raises(driverlevel.UnsupportedTargetError, match="unsupported architecture 'sm_90'.*sm_80") as e:
        driverlevel.compile_source('extern "C" __global__ void k() {}', "k.cu", arch="sm_90", use_cache=False)
    assert isinstance(e.value, ValueError) and driverlevel.UnsupportedTargetError is _compile.UnsupportedTargetError
