"""``worker stop``: stop the worker agent ``worker install`` made until ``worker start`` or the next login."""

from __future__ import annotations

import argparse
import sys

from specwire.errors import InvalidArgumentError
from worker.agent import agent_control
from worker.agent.agent import add_agent_arguments, agent, serve_args_of

NAME = "stop"
HELP = (
    "Stop the installed worker agent until `worker start` or the next login (`worker uninstall` removes it)."
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of ``worker stop``."""
    add_agent_arguments(p, no_load=False)


def run(args: argparse.Namespace) -> int:
    """Stop the agent's worker; one that is not loaded is already stopped."""
    a = agent(args.kind, args.dir)
    serve_args_of(a)  # installed, and readable
    now = agent_control.state(a)
    if now.loaded is False:
        print(f"worker agent not running (not loaded): {a.path}", file=sys.stderr)
        return 0
    try:
        agent_control.stop(a)
    except InvalidArgumentError as err:
        raise InvalidArgumentError(f"could not stop the worker agent: {err}") from err
    print(f"worker agent stopped: {a.path}; `worker start` starts it again", file=sys.stderr)
    return 0
