"""``worker status``: whether the agent ``worker install`` made is installed, loaded and running, what it
serves, where it logs, and the last lines of its log.

It exits 0 when it could tell; 1 (after printing what it could tell) when the
service manager could not be asked whether the agent is loaded.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from specwire.errors import InvalidArgumentError
from worker.agent import agent_control, serve_flags
from worker.agent.agent import Agent, add_agent_arguments, agent, serve_args_of

NAME = "status"
HELP = (
    "Say whether the worker agent is installed, loaded and running, where it serves and logs, its last lines."
)
TAIL_BYTES = 64 << 10


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of ``worker status``."""
    add_agent_arguments(p, no_load=False)
    p.add_argument("--lines", type=int, default=10, help="last lines of the log to show")
    p.add_argument("--json", action="store_true", help="print the state as one JSON object")


def run(args: argparse.Namespace) -> int:
    """Print the agent's state; an error (exit 1) only when the service manager could not be asked."""
    a = agent(args.kind, args.dir)
    report = describe(a, args.lines)
    print(json.dumps(report) if args.json else _table(report))
    if report["installed"] and report["loaded"] is None:
        raise InvalidArgumentError(f"could not ask {a.manager} whether the agent is loaded: {report['why']}")
    return 0


def describe(a: Agent, lines: int) -> dict[str, Any]:
    """The agent's state, as ``--json`` prints it."""
    report: dict[str, Any] = {
        "installed": a.path.exists(),
        "loaded": False,
        "running": False,
        "pid": None,
        "why": "",
        "kind": a.kind,
        "file": str(a.path),
        "address": None,
        "log": str(a.log),
        "output": str(a.output),
        "last_lines": [],
        "last_output": [],
    }
    if not report["installed"]:
        return report
    now = agent_control.state(a)
    report.update(loaded=now.loaded, running=now.running, pid=now.pid, why=now.why)
    try:
        flags = serve_flags.parse(serve_args_of(a))
    except InvalidArgumentError as err:
        report["why"] = report["why"] or str(err)
    else:
        report["address"] = flags.address
        report["echo_ports"] = flags.ports[1:]
        report["log"] = str(flags.args.log_file or a.log)
    report["last_lines"] = last_lines(Path(report["log"]), lines)
    report["last_output"] = last_lines(a.output, lines)
    return report


def last_lines(path: Path, n: int) -> list[str]:
    """The last ``n`` lines of ``path`` (none when it does not exist)."""
    if n <= 0:
        return []
    try:
        with path.open("rb") as f:
            size = f.seek(0, 2)
            f.seek(max(0, size - TAIL_BYTES))
            text = f.read().decode(errors="replace")
    except OSError:
        return []
    return text.splitlines()[-n:]


def _table(r: dict[str, Any]) -> str:
    rows = [("agent", _state(r)), ("file", r["file"])]
    if r["installed"]:
        echo = f" (echo port {r['echo_ports'][0]})" if r.get("echo_ports") else ""
        rows.append(("serves", f"{r['address']}{echo}" if r["address"] else "unknown"))
        rows += [("log", r["log"]), ("output", f"{r['output']} (what it printed before its log started)")]
    out = [f"{k:<8}{v}" for k, v in rows]
    if r["installed"]:
        out += ["", f"last lines of {r['log']}:" if r["last_lines"] else f"no log yet in {r['log']}"]
        out += [f"  {line}" for line in r["last_lines"]]
    if r["last_output"]:
        out += ["", f"last lines of {r['output']}:", *(f"  {line}" for line in r["last_output"])]
    return "\n".join(out)


def _state(r: dict[str, Any]) -> str:
    if not r["installed"]:
        return "not installed (`worker install` makes it)"
    why = f": {r['why']}" if r["why"] else ""
    if r["loaded"] is None:
        return f"installed, not loaded{why}"
    if not r["loaded"]:
        return f"installed, not loaded{why} (`worker start` loads it)"
    return (
        f"installed, loaded, running (pid {r['pid']})" if r["running"] else "installed, loaded, not running"
    )
