"""The tools' standard output: a failure to write it is one line on stderr and exit status 2.

``python tools/X.py ... | head -1`` (a closed pipe), ``> /dev/full`` (a full disk) or a closed
descriptor would otherwise end in a Python traceback and exit status 1, which some tools use for
their own verdict (``sass_compare.py``: a kernel differs). ``driverlevel`` itself does the same in
``driverlevel/cli.py``. A library of the scripts in ``tools/``, not a script.
"""

from __future__ import annotations

import errno
import os
import sys

# An OSError with one of these and no file name is a failed write to standard output
OUTPUT_ERRNOS = {errno.ENOSPC, errno.EPIPE, errno.EIO, errno.EDQUOT, errno.EFBIG, errno.EBADF}


def run(main, prog: str) -> int:
    """``main()``'s exit status, with its output flushed here: a failure to write standard output
    (in ``main`` or in the flush, also after an argparse ``--help`` or usage exit) is reported as
    ``PROG: cannot write the output: REASON`` on stderr, exit status 2; stdout's unwritten buffer
    is dropped so that Python's exit does not fail on it again. Any other error propagates."""
    try:
        try:
            status = main()
        except SystemExit as exc:  # (argparse's --help and usage errors: their output flushed below too)
            status = exc.code
        sys.stdout.flush()
    except OSError as exc:
        if exc.filename is not None or exc.errno not in OUTPUT_ERRNOS:
            raise
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        print(f"{prog}: cannot write the output: {exc.strerror or exc}", file=sys.stderr)
        return 2
    return status


if __name__ == "__main__":
    print("tools/tool_output.py is a library of the scripts in tools/; run one of those", file=sys.stderr)
    sys.exit(2)
