"""What the command line and the benchmark scripts share: the ``--json PATH`` check made before a run,
and the no-GPU report (one sentence on stderr; with JSON to stdout, an error object there too).

Imports nothing of the driver at load time, so a script can check its arguments first.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

__all__ = ["json_path_problem", "report_no_gpu", "json_usage_errors"]


def json_path_problem(path, *, stdout_ok: bool = True) -> str | None:
    """Why the ``--json`` output ``path`` could not be written, or None when it can (``None`` always
    can; ``"-"``, stdout, can unless ``stdout_ok`` is False: a script that prints its table to stdout
    and writes JSON to a file only).

    Checked before a benchmark runs, so that a typo in the path does not cost the measurements:
    the directory must exist and be writable, and ``path`` must not be a directory or a file
    that cannot be written. A path that names a directory by its spelling (a trailing
    separator, or a last component ``.`` or ``..``) is a directory whether it exists or not;
    ``""`` is an empty path.

    Example
    -------
    >>> json_path_problem("/nonexistent-dir/x.json")
    "the directory '/nonexistent-dir' does not exist"
    """
    if path is None:
        return None
    if path == "-":
        return None if stdout_ok else "'-' (stdout) is not supported by this script: give a file path"
    if os.fspath(path) == "":  # Path('') is '.', a directory: say what was given
        return "'' is an empty path, not a file"
    p = Path(path)
    parent = p.resolve().parent if p.name else p.resolve()
    text = os.fspath(path)
    # Path() drops a trailing separator and a last '.' ('newdir/' -> 'newdir'): look at the text itself
    spelled_dir = text.endswith(tuple(s for s in (os.sep, os.altsep) if s)) or os.path.basename(text) in (".", "..")
    if p.is_dir() or not p.name or spelled_dir:
        return f"{str(path)!r} is a directory, not a file"
    if not parent.is_dir():
        what = "is not a directory" if parent.exists() else "does not exist"
        return f"the directory {str(parent)!r} {what}"
    if p.exists() and not os.access(p, os.W_OK):
        return f"{str(path)!r} is not writable"
    if not p.exists() and not os.access(parent, os.W_OK | os.X_OK):
        return f"the directory {str(parent)!r} is not writable"
    return None


def report_no_gpu(*, json_to_stdout: bool = False) -> int:
    """Say that no GPU is usable and return the exit status to use (``NO_GPU_EXIT_STATUS``, 2).

    Prints ``NO_GPU_MESSAGE`` on stderr and, with ``json_to_stdout``, the object
    ``{"error": NO_GPU_MESSAGE, "exit_status": 2}`` on stdout, so that a ``| jq`` pipeline gets
    valid JSON (``capture-demo --json`` and ``bench replay --json -``).
    """
    from ._device import NO_GPU_EXIT_STATUS, NO_GPU_MESSAGE

    print(NO_GPU_MESSAGE, file=sys.stderr, flush=True)
    if json_to_stdout:
        print(json.dumps({"error": NO_GPU_MESSAGE, "exit_status": NO_GPU_EXIT_STATUS}), flush=True)
    return NO_GPU_EXIT_STATUS


def json_usage_errors(wants_json_stdout):
    """A click command class that also writes a usage error as JSON to stdout when the command
    line asks for JSON there (``wants_json_stdout(args)``, given the raw arguments), as
    :func:`report_no_gpu` does for the no-GPU error: ``{"error": "Invalid value for --heads: ...",
    "exit_status": 2}``, so that a ``| jq`` pipeline reads JSON whatever went wrong. The usual
    message and usage line still go to stderr, and the exit status is click's (2).

    Covers errors of the option parsing and of the command body (``click.BadParameter`` raised
    after the options are parsed).
    """
    import click

    def _say(exc) -> None:
        print(json.dumps({"error": exc.format_message(), "exit_status": exc.exit_code}), flush=True)

    class _JsonUsageErrors(click.Command):
        def make_context(self, info_name, args, parent=None, **extra):
            wants = bool(wants_json_stdout(list(args)))
            try:
                ctx = super().make_context(info_name, args, parent=parent, **extra)
            except click.UsageError as exc:
                if wants:
                    _say(exc)
                raise
            ctx.meta["json_usage_errors"] = wants
            return ctx

        def invoke(self, ctx):
            try:
                return super().invoke(ctx)
            except click.UsageError as exc:
                if ctx.meta.get("json_usage_errors"):
                    _say(exc)
                raise

    return _JsonUsageErrors
