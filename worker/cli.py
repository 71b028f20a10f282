"""``worker``: the command line of a drafting machine."""

from __future__ import annotations

from collections.abc import Sequence

from specwire.process.command_line import command_main, exit_process
from specwire.wire import token_command
from worker import inspect_model
from worker.agent import agent_status, install, start, stop, uninstall
from worker.server import serve

COMMANDS = (serve, install, uninstall, agent_status, start, stop, token_command, inspect_model)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``worker`` console script."""
    return command_main("worker", "Serve a draft model to coordinators on the LAN.", COMMANDS, argv)


def run() -> None:
    """Console-script entry point: run, then leave (see ``exit_process``)."""
    exit_process(main())


if __name__ == "__main__":
    run()
