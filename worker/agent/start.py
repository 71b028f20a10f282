"""``worker start``: start the worker agent ``worker install`` made (after ``worker stop``, a clean exit)."""

from __future__ import annotations

import argparse
import sys

from specwire.errors import InvalidArgumentError
from worker.agent import agent_control, serve_flags
from worker.agent.agent import add_agent_arguments, agent, serve_args_of

NAME = "start"
HELP = "Start the installed worker agent (refused while its ports are taken)."


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of ``worker start``."""
    add_agent_arguments(p, no_load=False)


def run(args: argparse.Namespace) -> int:
    """Start the agent's worker unless it runs already; its ports must be free."""
    a = agent(args.kind, args.dir)
    flags = serve_flags.parse(serve_args_of(a))
    now = agent_control.state(a)
    if now.running:
        print(f"worker agent already running (pid {now.pid}): {a.path}", file=sys.stderr)
        return 0
    agent_control.refuse_taken_ports(flags.ports, None)
    try:
        agent_control.start(a, now)
    except InvalidArgumentError as err:
        raise InvalidArgumentError(f"could not start the worker agent: {err}") from err
    pid = agent_control.state(a).pid
    started = f"started (pid {pid})" if pid else "started"
    print(
        f"worker agent {started}: it will serve {flags.address}; `worker status` shows whether it is up",
        file=sys.stderr,
    )
    return 0
