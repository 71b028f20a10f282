"""``worker install``: keep ``worker serve`` running on this machine, at login and after a crash
(``worker.agent``)."""

from __future__ import annotations

import argparse
import sys

from specwire.errors import InvalidArgumentError
from worker import serve
from worker.agent import add_agent_arguments, install

NAME = "install"
HELP = "Keep a worker running on this machine: a launchd agent (macOS) or a systemd user unit (Linux)."


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of ``worker install``: its own, then ``--`` and the serve flags."""
    add_agent_arguments(p)
    p.add_argument(
        "serve_args",
        nargs=argparse.REMAINDER,
        metavar="-- SERVE-FLAGS",
        help="the flags of `worker serve` the agent runs with, such as -- --model "
        'mlx-community/Qwen3-0.6B-4bit --label "M1 Max"',
    )


def run(args: argparse.Namespace) -> int:
    """Check the serve flags, write the agent's file, and load it."""
    serve_args = args.serve_args[1:] if args.serve_args[:1] == ["--"] else args.serve_args
    checker = argparse.ArgumentParser(prog="worker serve", exit_on_error=False)
    serve.add_arguments(checker)
    try:
        _, unknown = checker.parse_known_args(serve_args)
    except argparse.ArgumentError as err:
        raise InvalidArgumentError(f"the serve flags: {err}") from err
    if unknown:
        raise InvalidArgumentError(f"worker serve takes no {' '.join(unknown)}: see `worker serve --help`")
    a = install(args.kind, serve_args, args.dir, load=not args.no_load)
    state = "written (not loaded)" if args.no_load else "installed and started"
    print(f"worker agent {state}: {a.path}; it logs to {a.log}", file=sys.stderr)
    return 0
