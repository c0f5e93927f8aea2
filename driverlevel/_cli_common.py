"""What the command line and the benchmark scripts share: the ``--json PATH`` check made before a run,
its write after the run (whole or not at all), and the no-GPU report (one sentence on stderr; with
JSON to stdout, an error object there too).

Imports nothing of the driver at load time, so a script can check its arguments first.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import sys
import tempfile
from pathlib import Path

__all__ = ["json_path_problem", "write_json_file", "dump_json_file", "report_no_gpu", "report_error", "json_usage_errors",
           "is_output_failure"]

# An OSError with one of these and no file name is a write to standard output or error that failed
_OUTPUT_ERRNOS = {errno.ENOSPC, errno.EPIPE, errno.EIO, errno.EDQUOT, errno.EFBIG, errno.EBADF}


def is_output_failure(exc: OSError) -> bool:
    """Whether ``exc`` is a failed write of standard output or error (``> /dev/full``, a closed pipe
    or descriptor), which ``driverlevel`` and the scripts in ``tools/`` report in one line with exit
    status 2, rather than an error of a file the program opened (it has a file name)."""
    return exc.filename is None and exc.errno in _OUTPUT_ERRNOS


def json_path_problem(path, *, stdout_ok: bool = True) -> str | None:
    """Why the ``--json`` output ``path`` could not be written, or None when it can (``None`` always
    can; ``"-"``, stdout, can unless ``stdout_ok`` is False: a script that prints its table to stdout
    and writes JSON to a file only).

    Checked before a benchmark runs, so that a typo in the path does not cost the measurements:
    the directory must exist and be writable, and ``path`` must not be a directory or a file
    that cannot be written. A path that names a directory by its spelling (a trailing
    separator, or a last component ``.`` or ``..``) is a directory whether it exists or not;
    ``""`` is an empty path. A symbolic link is checked at its target, where
    :func:`write_json_file` writes (a dangling link's target is a new file); a link loop or a
    name too long is a problem, not an exception.

    Example
    -------
    >>> json_path_problem("/nonexistent-dir/x.json")
    "the directory '/nonexistent-dir' does not exist"
    """
    if path is None:
        return None
    if path == "-":
        return None if stdout_ok else "'-' (stdout) is not supported by this script: give a file path"
    text = os.fspath(path)
    if text == "":  # Path('') is '.', a directory: say what was given
        return "'' is an empty path, not a file"
    # Path() drops a trailing separator and a last '.' ('newdir/' -> 'newdir'): look at the text itself
    spelled_dir = text.endswith(tuple(s for s in (os.sep, os.altsep) if s)) or os.path.basename(text) in (".", "..")
    # (os.path's tests answer False on any OSError; Path's raise some on Python < 3.14: a name too
    # long, a symbolic link loop, a directory that cannot be searched)
    if spelled_dir or not Path(text).name or os.path.isdir(text):
        return f"{text!r} is a directory, not a file"
    st = None  # what is at path, a symbolic link followed (its target, which write_json_file writes)
    try:
        st = os.stat(text)
    except OSError as exc:  # a missing file is fine; a loop or a name too long cannot be written
        if exc.errno not in (errno.ENOENT, errno.ENOTDIR, errno.EACCES):
            return f"{text!r} cannot be written: {exc.strerror or exc}"
    # write_json_file writes a symbolic link's target, dangling or not: the target is checked
    p = Path(os.path.realpath(text))
    parent = p.parent
    if not os.path.isdir(parent):
        what = "is not a directory" if os.path.exists(parent) else "does not exist"
        return f"the directory {str(parent)!r} {what}"
    exists = st is not None
    if exists and not os.access(p, os.W_OK):
        return f"{text!r} is not writable"
    if not exists and not os.access(parent, os.W_OK | os.X_OK):
        return f"the directory {str(parent)!r} is not writable"
    # os.access answers yes to root whatever the file system says (/proc, a read-only mount, a
    # file flagged immutable): try it. An existing regular file is opened for appending (nothing
    # written, nothing truncated); a new one is created and removed. A device or a FIFO is left
    # to the write (opening a FIFO would wait for its reader).
    try:
        if exists:
            if stat.S_ISREG(st.st_mode):
                with open(p, "a"):
                    pass
        else:
            os.close(os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            os.unlink(p)
    except OSError as exc:
        where = f"{text!r}" if exists else f"the directory {str(parent)!r}"
        return f"{where} is not writable ({exc.strerror or exc})"
    return None


def write_json_file(path, text: str) -> str | None:
    """Write ``text`` (a whole JSON document) to the file ``path``; None when done, else why not, as
    one line (``"cannot write it: No space left on device"``), with ``path`` as it was before.

    A regular file (or a new one; through a symbolic link, its target) is written whole or not at
    all: ``text`` goes to a temporary file in the same directory, which then replaces ``path``
    (``os.replace``), keeping an existing file's permission bits (a new one gets the umask's). A
    full disk or a failed write thus leaves no truncated JSON behind. Anything else that exists
    at ``path`` (``/dev/stdout``, a FIFO), and an existing file in a directory where no temporary
    file can be made (the file writable, its directory not), is opened and written in place (a
    failure there may leave it truncated).
    """
    target = os.path.realpath(path)
    try:
        try:
            st = os.stat(target)
        except FileNotFoundError:
            st = None
        in_place = st is not None and not stat.S_ISREG(st.st_mode)
        if not in_place:
            if st is not None:
                mode = stat.S_IMODE(st.st_mode)
            else:
                umask = os.umask(0)
                os.umask(umask)
                mode = 0o666 & ~umask
            try:
                fd, tmp = tempfile.mkstemp(dir=os.path.dirname(target), prefix=f".{os.path.basename(target)}.",
                                           suffix=".tmp")
            except OSError:
                if st is None:
                    raise
                in_place = True
        if in_place:
            with open(target, "w") as f:
                f.write(text)
            return None
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.chmod(tmp, mode)
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError as exc:
        return f"cannot write it: {exc.strerror or exc}"
    return None


def dump_json_file(path, obj, *, indent: int = 1, label: str = "--json") -> int:
    """``obj`` as JSON into the file ``path`` (:func:`write_json_file`); the exit status to use: 0, or 2
    after one line on stderr, ``"LABEL PATH: cannot write it: REASON"``. What a benchmark or tool does
    with its results at the end of a run."""
    problem = write_json_file(path, json.dumps(obj, indent=indent) + "\n")
    if problem:
        print(f"{label} {path}: {problem}", file=sys.stderr)
        return 2
    return 0


def report_no_gpu(*, json_to_stdout: bool = False) -> int:
    """Say that no GPU is usable and return the exit status to use (``NO_GPU_EXIT_STATUS``, 2).

    Prints ``NO_GPU_MESSAGE`` on stderr and, with ``json_to_stdout``, the object
    ``{"error": NO_GPU_MESSAGE, "exit_status": 2}`` on stdout, so that a ``| jq`` pipeline gets
    valid JSON (``capture-demo --json`` and ``bench replay --json -``).
    """
    from ._device import NO_GPU_EXIT_STATUS, NO_GPU_MESSAGE

    return report_error(NO_GPU_MESSAGE, NO_GPU_EXIT_STATUS, json_to_stdout=json_to_stdout)


def report_error(message: str, exit_status: int = 2, *, json_to_stdout: bool = False) -> int:
    """Print ``message`` on stderr and, with ``json_to_stdout``, ``{"error": message, "exit_status":
    exit_status}`` on stdout; return ``exit_status``. For an error a command finds after its
    options are parsed (``bench replay --device`` past the visible GPUs)."""
    print(message, file=sys.stderr, flush=True)
    if json_to_stdout:
        print(json.dumps({"error": message, "exit_status": exit_status}), flush=True)
    return exit_status


def json_usage_errors(param: str):
    """A click command class that also writes a usage error as JSON to stdout when the command
    asks for JSON there, as :func:`report_no_gpu` does for the no-GPU error:
    ``{"error": "Invalid value for '--heads': ...", "exit_status": 2}``, so that a ``| jq``
    pipeline reads JSON on a usage error too (other failures of a run are the command's own to
    report). The usual message and usage line still go to stderr, and the exit status is
    click's (2).

    ``param`` names the command's JSON option: a flag (``capture-demo --json``) or an option
    whose value ``-`` means stdout (``bench replay --json -``). An error of the command body
    (``click.BadParameter`` raised after parsing) goes by the parsed value; an error of the
    parsing itself by a scan of the raw arguments that skips the values of the command's other
    options (``--arch --json`` gives ``--arch`` the value ``--json``: no JSON then).
    """
    import click

    def _say(exc) -> None:
        print(json.dumps({"error": exc.format_message(), "exit_status": exc.exit_code}), flush=True)

    def _wants(value) -> bool:
        return value is True or value == "-"

    class _JsonUsageErrors(click.Command):
        def _raw_wants(self, args) -> bool:
            opts = {o: p for p in self.params if isinstance(p, click.Option) for o in p.opts + p.secondary_opts}
            wants, i = False, 0
            while i < len(args) and args[i] != "--":
                key, eq, val = args[i].partition("=") if args[i].startswith("--") else (args[i], "", "")
                p = opts.get(key)
                if p is None:  # an argument, or an option this command does not have
                    i += 1
                    continue
                if p.is_flag or p.count:
                    value, i = True, i + 1
                elif eq:
                    value, i = val, i + 1
                else:
                    value, i = (args[i + 1] if i + 1 < len(args) else None), i + 2
                if p.name == param:
                    wants = _wants(value)
            return wants

        def make_context(self, info_name, args, parent=None, **extra):
            raw = self._raw_wants(list(args))
            try:
                return super().make_context(info_name, args, parent=parent, **extra)
            except click.UsageError as exc:
                if raw:
                    _say(exc)
                raise

        def invoke(self, ctx):
            try:
                return super().invoke(ctx)
            except click.UsageError as exc:
                if _wants(ctx.params.get(param)):
                    _say(exc)
                raise

    return _JsonUsageErrors
