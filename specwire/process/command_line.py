"""What both command lines share: logging setup, error reporting and exit codes.

A command exits 0 only when it did what it said. A ``SpecwireError`` (bad
input, missing model, incompatible peer) prints one ``error:`` line and exits
1; Ctrl-C exits 130. No traceback reaches the user for bad input.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType

from specwire.errors import InvalidArgumentError, SpecwireError

EXIT_ERROR = 1
EXIT_INTERRUPTED = 130
# Where MLX computes (cpu or gpu; unset: MLX's default). Paced compute needs no GPU: on a GPU host, emulated
# workers and coordinator on CPUs of their own do not queue for its one device (docs/gpu.md).
DEVICE_ENV = "SPECWIRE_DEVICE"


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Shows defaults in --help (a default of None, False or "" only where the help says what it means)
    and keeps description paragraphs as written."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.default is None or action.default is False or action.default == "":
            return action.help
        return super()._get_help_string(action)


def add_common_options(parser: argparse.ArgumentParser) -> None:
    """Options every subcommand takes."""
    parser.add_argument(
        "--log-level",
        default="warning",
        choices=["debug", "info", "warning", "error"],
        help="verbosity of log lines on stderr",
    )


def configure_logging(level: str) -> None:
    """Log to stderr with timestamps, at ``level``."""
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def run_command(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    handlers: dict[str, Callable[[argparse.Namespace], int]],
) -> int:
    """Parse ``argv``, run the chosen subcommand, and turn domain errors into exit codes."""
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help(sys.stderr)
        return 2
    configure_logging(args.log_level)
    try:
        use_device_of_environment()
        return handlers[args.command](args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as err:
        domain = domain_error(err)
        if domain is None:
            raise
        print(f"error: {domain}", file=sys.stderr)
        return EXIT_ERROR


def use_device_of_environment() -> None:
    """Make ``$SPECWIRE_DEVICE`` (cpu or gpu) MLX's default device, if it is set."""
    name = os.environ.get(DEVICE_ENV, "").strip().lower()
    if not name:
        return
    if name not in ("cpu", "gpu"):
        raise InvalidArgumentError(f"{DEVICE_ENV}={name!r}: use cpu or gpu")
    import mlx.core as mx

    mx.set_default_device(mx.cpu if name == "cpu" else mx.gpu)


def domain_error(err: BaseException) -> SpecwireError | None:
    """The ``SpecwireError`` behind ``err``, looking inside task-group exception groups."""
    if isinstance(err, SpecwireError):
        return err
    for inner in getattr(err, "exceptions", ()):
        found = domain_error(inner)
        if found is not None:
            return found
    return None


def build_command_parser(
    prog: str, description: str, commands: Sequence[ModuleType]
) -> argparse.ArgumentParser:
    """A parser with one subcommand per module; each module has NAME, HELP and add_arguments."""
    parser = argparse.ArgumentParser(prog=prog, description=description, formatter_class=HelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in commands:
        sp = sub.add_parser(
            module.NAME, help=module.HELP, description=module.HELP, formatter_class=HelpFormatter
        )
        add_command_options(sp, module)
    return parser


def add_command_options(parser: argparse.ArgumentParser, module: ModuleType) -> None:
    """Every option of ``module``'s subcommand: its own, then the common ones."""
    module.add_arguments(parser)
    add_common_options(parser)


def subcommand_parser(prog: str, module: ModuleType) -> argparse.ArgumentParser:
    """A parser of ``module``'s subcommand alone, taking what ``command_main`` takes after its name.

    It raises ``argparse.ArgumentError`` instead of exiting, for a command that
    checks another's flags before it runs them (``worker install``).
    """
    parser = argparse.ArgumentParser(prog=f"{prog} {module.NAME}", exit_on_error=False)
    add_command_options(parser, module)
    return parser


def command_main(
    prog: str, description: str, commands: Sequence[ModuleType], argv: Sequence[str] | None
) -> int:
    """Parse and run one of ``commands`` (modules with NAME, HELP, add_arguments and run)."""
    parser = build_command_parser(prog, description, commands)
    return run_command(parser, argv, {m.NAME: m.run for m in commands})


def exit_process(code: int) -> None:
    """Flush output and end the process with ``code``, skipping interpreter finalization.

    MLX keeps thread-local compile caches on the compute thread whose
    destructors need the GIL; if finalization catches that thread between
    jobs, the process aborts. Command lines are done when they return, so
    they leave through ``os._exit`` once everything is flushed.
    """
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    logging.shutdown()
    os._exit(code)
