"""``worker install``: keep ``worker serve`` running on this machine, at login and after a crash
(``worker.agent.agent`` writes the file, ``worker.agent.agent_control`` loads it).

The serve flags are checked by serve's own parser and their paths made
absolute (``worker.agent.serve_flags``); the agent is refused while its ports are
taken, naming what holds them (the agent's own worker, being replaced, aside).
The token is never written into the agent: it reads the token file at each
start, and install says so when ``$SPECWIRE_TOKEN`` holds another one.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from specwire.errors import AuthenticationError, InvalidArgumentError
from specwire.wire.auth import TOKEN_ENV, default_token_path, read_token
from worker.agent import agent_control, serve_flags
from worker.agent.agent import Agent, add_agent_arguments, agent, write
from worker.agent.serve_flags import ServeFlags

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
    """Check the serve flags and the ports, write the agent's file, and load it."""
    serve_args = args.serve_args[1:] if args.serve_args[:1] == ["--"] else args.serve_args
    a = agent(args.kind, args.dir)
    cwd = Path.cwd()
    flags = serve_flags.absolute(serve_flags.parse(serve_args), cwd)
    flags = serve_flags.with_flag(flags, "--log-file", str(a.log))
    old = None if args.no_load else _ports_free(a, flags)
    _say_where_the_token_is(flags)
    if old is None:
        write(a, flags.argv, cwd)
        print(f"worker agent written (not loaded): {a.path}", file=sys.stderr)
    else:
        _install(a, flags, cwd, old)
    return 0


def _ports_free(a: Agent, flags: ServeFlags) -> agent_control.State:
    """The state of the agent being replaced, once its ports are known to be free (or held by it)."""
    old = agent_control.state(a) if a.path.exists() else agent_control.State(False)
    agent_control.refuse_taken_ports(flags.ports, old.pid)
    return old


def _install(a: Agent, flags: ServeFlags, cwd: Path, old: agent_control.State) -> None:
    """Replace the agent (``old``: waiting for its worker to let go of its ports), and start the new one."""
    if old.loaded is not False:
        agent_control.unload(a)
        agent_control.wait_ports_free(flags.ports)
    write(a, flags.argv, cwd)
    try:
        agent_control.load(a)
    except InvalidArgumentError as err:
        raise InvalidArgumentError(
            f"wrote {a.path}, but could not load it: {err} (`worker uninstall --no-load` removes it)"
        ) from err
    now = agent_control.state(a)
    running = f"started (pid {now.pid})" if now.running else "loaded"
    print(
        f"worker agent installed and {running}: {a.path}; it will serve {flags.address} and log to "
        f"{flags.args.log_file}; `worker status` shows whether it is up",
        file=sys.stderr,
    )


def _say_where_the_token_is(flags: ServeFlags) -> None:
    """One line when ``$SPECWIRE_TOKEN`` holds a token the agent will not see (it reads the token file)."""
    token = os.environ.get(TOKEN_ENV, "").strip()
    if not token or flags.args.insecure or flags.args.token_file is not None:
        return
    path = default_token_path()
    try:
        held = read_token(path) if path.exists() else None
    except AuthenticationError:
        held = None
    if held == token:
        return
    holds = "which holds another token" if held else "which does not exist yet (the worker would make one)"
    print(
        f"note: ${TOKEN_ENV} is not written into the agent: it reads {path} at each start, {holds}; "
        f'to use this token there, run `worker token set "${TOKEN_ENV}"`',
        file=sys.stderr,
    )
