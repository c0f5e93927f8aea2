"""The tools' standard output: a failure to write it is one line on stderr and exit status 2.

``python tools/X.py ... | head -1`` (a closed pipe), ``> /dev/full`` (a full disk) or a closed
descriptor would otherwise end in a Python traceback and exit status 1, which some tools use for
their own verdict (``sass_compare.py``: a kernel differs). ``driverlevel`` itself does the same in
``driverlevel/cli.py``; both ask ``driverlevel._cli_common.is_output_failure``. A library of the
scripts in ``tools/`` and ``benchmarks/``, not a script.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys


def _print_message(self, message, file=None):
    """argparse's ``ArgumentParser._print_message`` without its ``except OSError: pass``: a ``--help``
    to a full disk or a closed pipe is a failed write here too, also with unbuffered output
    (``PYTHONUNBUFFERED``), where the write itself fails and argparse swallowed it."""
    if message:
        (file or sys.stderr).write(message)


#: The package and its dependencies (pyproject.toml): a tool run where one of them cannot be imported
#: says so in one line (a Python without the package installed, no PYTHONPATH to the checkout).
PACKAGES = {"driverlevel": "install the package (pip install -e .) or set PYTHONPATH to the checkout",
            "numpy": "install the package's dependencies (pip install -e .)",
            "cuda": "install the package's dependencies (pip install -e .)",
            "click": "install the package's dependencies (pip install -e .)",
            "tqdm": "install the package's dependencies (pip install -e .)"}


def missing_package_line(exc: ModuleNotFoundError, prog: str) -> str | None:
    """``PROG: cannot import NAME (...): WHAT TO DO`` where ``exc`` is the package or one of its
    dependencies (:data:`PACKAGES`) missing; None for any other module."""
    top = (exc.name or "").split(".")[0]
    if top not in PACKAGES or exc.name not in (top, "cuda.bindings", "cuda.pathfinder"):
        return None
    return f"{prog}: cannot import {exc.name} ({exc}): {PACKAGES[top]}"


def _mend_closed_stderr() -> None:
    """``2>&-``: Python found descriptor 2 closed and set ``sys.stderr`` to None, and
    ``print(file=None)`` would write the tool's messages to standard output; they go nowhere."""
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w", encoding="utf-8")


def require_package(prog: str) -> None:
    """For a script that imports the package at module level: import it now, and on a missing
    package or dependency print :func:`missing_package_line` and exit 2 (not a traceback)."""
    _mend_closed_stderr()
    try:
        importlib.import_module("driverlevel")
    except ModuleNotFoundError as exc:
        line = missing_package_line(exc, prog)
        if line is None:
            raise
        print(line, file=sys.stderr)
        raise SystemExit(2) from None


def run(main, prog: str) -> int:
    """``main()``'s exit status, with its output flushed here: a failure to write standard output
    (in ``main`` or in the flush, also for an argparse ``--help`` or usage exit) is reported as
    ``PROG: cannot write the output: REASON`` on stderr, exit status 2; stdout's unwritten buffer
    is dropped so that Python's exit does not fail on it again. A closed standard error (``2>&-``)
    drops what goes there, rather than Python's ``print(file=None)`` sending it to standard output
    ahead of a table or JSON. A ``ModuleNotFoundError`` for the package or one of its dependencies
    (:data:`PACKAGES`) is ``PROG: cannot import NAME (...): WHAT TO DO``, exit status 2. Any other
    error propagates."""
    _mend_closed_stderr()
    swallowing = argparse.ArgumentParser._print_message
    argparse.ArgumentParser._print_message = _print_message
    try:
        try:
            status = main()
        except SystemExit as exc:  # (argparse's --help and usage errors: their output flushed below too)
            status = exc.code
        except ModuleNotFoundError as exc:
            line = missing_package_line(exc, prog)
            if line is None:
                raise  # (a module missing inside the package is its own bug)
            print(line, file=sys.stderr)
            return 2
        sys.stdout.flush()
    except OSError as exc:
        try:  # (here, not at load: a tool such as kernel_cache.py reports a missing package itself)
            from driverlevel._cli_common import is_output_failure
        except ImportError:
            raise exc from None
        if not is_output_failure(exc):
            raise
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        try:
            print(f"{prog}: cannot write the output: {exc.strerror or exc}", file=sys.stderr)
        except OSError:  # (stderr unwritable too: the status says it)
            pass
        return 2
    finally:
        argparse.ArgumentParser._print_message = swallowing
    return status


if __name__ == "__main__":
    print("tools/tool_output.py is a library of the scripts in tools/; run one of those", file=sys.stderr)
    sys.exit(2)
