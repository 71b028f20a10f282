"""``worker uninstall``: stop the worker ``worker install`` keeps running, and remove its agent."""

from __future__ import annotations

import argparse
import sys

from specwire.errors import InvalidArgumentError
from worker.agent import agent_control
from worker.agent.agent import add_agent_arguments, agent

NAME = "uninstall"
HELP = "Stop and remove the worker agent that `worker install` made."


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of ``worker uninstall``."""
    add_agent_arguments(p)


def run(args: argparse.Namespace) -> int:
    """Unload the agent and delete its file; an agent that is not there is a clear error."""
    a = agent(args.kind, args.dir)
    if not a.path.exists():
        raise InvalidArgumentError(f"no worker agent is installed at {a.path}")
    if not args.no_load:
        agent_control.unload(a)
    a.path.unlink()
    print(f"worker agent removed: {a.path} (its logs stay in {a.log.parent})", file=sys.stderr)
    return 0
