"""``worker``: the command line of a drafting machine."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from specwire.command_line import command_main
from worker import inspect_model, serve

COMMANDS = (serve, inspect_model)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``worker`` console script."""
    return command_main("worker", "Serve a draft model to coordinators on the LAN.", COMMANDS, argv)


if __name__ == "__main__":
    sys.exit(main())
