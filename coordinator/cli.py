"""``coordinator``: the command line of the target machine."""

from __future__ import annotations

from collections.abc import Sequence

from coordinator.commands import bench, discover, generate, plan, serve
from specwire.process.command_line import command_main, exit_process
from specwire.wire import token_command

COMMANDS = (bench, generate, serve, discover, plan, token_command)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``coordinator`` console script."""
    return command_main(
        "coordinator",
        "Run a target model and verify drafts from local or remote draft models.",
        COMMANDS,
        argv,
    )


def run() -> None:
    """Console-script entry point: run, then leave (see ``exit_process``)."""
    exit_process(main())


if __name__ == "__main__":
    run()
