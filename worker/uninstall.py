"""``worker uninstall``: stop the worker ``worker install`` keeps running, and remove its agent."""

from __future__ import annotations

import argparse
import sys

from worker.agent import add_agent_arguments, uninstall

NAME = "uninstall"
HELP = "Stop and remove the worker agent that `worker install` made."


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of ``worker uninstall``."""
    add_agent_arguments(p)


def run(args: argparse.Namespace) -> int:
    """Unload the agent and delete its file."""
    a = uninstall(args.kind, args.dir, load=not args.no_load)
    print(f"worker agent removed: {a.path}", file=sys.stderr)
    return 0
