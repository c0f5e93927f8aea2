"""``python -m driverlevel`` is the ``driverlevel`` command."""

from .cli import main

main(prog_name="driverlevel")
