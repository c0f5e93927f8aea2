"""Every docstring example of the package (``>>>``) runs and gives what it shows, on a machine without a
GPU: the examples that need one are marked ``# doctest: +SKIP`` on every line (an unmarked line after a
marked one ran, and failed there; a fresh-user trial found five such examples)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import driverlevel


def _modules():
    names = [driverlevel.__name__]
    for info in pkgutil.walk_packages(driverlevel.__path__, driverlevel.__name__ + "."):
        if not info.name.endswith(".__main__"):  # (importing it runs the command line)
            names.append(info.name)
    return sorted(names)


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in finder.find(module, name):
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} docstring examples failed"
