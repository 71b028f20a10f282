"""A worker that stays up: ``worker install`` makes ``worker serve`` a launchd agent (macOS) or a systemd
user unit (Linux), and ``worker uninstall`` removes it.

The agent runs this very Python (``sys.executable -m worker.cli serve``) with
the serve flags given after ``--``, checked first by ``worker serve``'s own
parser, so a typo fails now and not at the next boot. It starts at login (a
reboot included), is restarted after a crash, and logs to a known file:
``~/Library/Logs/specwire/worker.log`` on macOS, ``~/.local/state/specwire/
worker.log`` on Linux. The environment the worker needs is written into the
file: ``SPECWIRE_*`` variables set now (the token, the mDNS interfaces) and
``HF_HOME``/``HF_HUB_OFFLINE`` where set.

Installing writes the file and loads it (``launchctl bootstrap``; ``systemctl
--user enable --now``); removing unloads it and deletes the file. ``--dir``
and ``--no-load`` write elsewhere and skip the loading, for a look at the
file (and for the tests).
"""

from __future__ import annotations

import argparse
import os
import plistlib
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from specwire.errors import InvalidArgumentError

LABEL = "dev.specwire.worker"
UNIT = "specwire-worker.service"
KINDS = ("launchd", "systemd")
PASSED_ENV = ("HF_HOME", "HF_HUB_OFFLINE")  # and every SPECWIRE_* variable


@dataclass(frozen=True)
class Agent:
    """Where an agent's file lives, how it is named, and where it logs."""

    kind: str
    path: Path
    log: Path


def default_kind() -> str:
    """launchd on macOS, systemd elsewhere."""
    return "launchd" if sys.platform == "darwin" else "systemd"


def agent(kind: str, directory: Path | None = None) -> Agent:
    """The agent of ``kind``, its file in ``directory`` or the system's usual place."""
    home = Path.home()
    if kind == "launchd":
        return Agent(
            kind,
            (directory or home / "Library" / "LaunchAgents") / f"{LABEL}.plist",
            home / "Library" / "Logs" / "specwire" / "worker.log",
        )
    state = Path(os.environ.get("XDG_STATE_HOME") or home / ".local" / "state")
    config = Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config")
    return Agent(kind, (directory or config / "systemd" / "user") / UNIT, state / "specwire" / "worker.log")


def command(serve_args: list[str]) -> list[str]:
    """The command the agent runs."""
    return [sys.executable, "-m", "worker.cli", "serve", *serve_args]


def environment() -> dict[str, str]:
    """What the worker needs of this shell's environment."""
    return {
        k: v for k, v in sorted(os.environ.items()) if v and (k.startswith("SPECWIRE_") or k in PASSED_ENV)
    }


def launchd_plist(argv: list[str], env: dict[str, str], log: Path) -> bytes:
    """A launchd agent that runs ``argv`` at login and again after a crash."""
    return plistlib.dumps(
        {
            "Label": LABEL,
            "ProgramArguments": argv,
            "EnvironmentVariables": env,
            "RunAtLoad": True,
            "KeepAlive": {"SuccessfulExit": False},  # restarted unless it stopped cleanly
            "ThrottleInterval": 5,
            "StandardOutPath": str(log),
            "StandardErrorPath": str(log),
            "ProcessType": "Interactive",  # a worker serves requests: no App Nap throttling
        }
    )


def systemd_unit(argv: list[str], env: dict[str, str], log: Path) -> str:
    """A systemd user unit that runs ``argv`` at login (or boot, with lingering) and after a crash."""
    lines = [
        "[Unit]",
        "Description=specwire draft worker",
        "After=network-online.target",
        "",
        "[Service]",
        f"ExecStart={' '.join(_systemd_quote(a) for a in argv)}",
        *([f"Environment={' '.join(_systemd_quote(f'{k}={v}') for k, v in env.items())}"] if env else []),
        "Restart=on-failure",
        "RestartSec=5",
        f"StandardOutput=append:{_systemd_escape(str(log))}",
        f"StandardError=append:{_systemd_escape(str(log))}",
        "",
        "[Install]",
        "WantedBy=default.target",
        "",
    ]
    return "\n".join(lines)


def install(kind: str, serve_args: list[str], directory: Path | None, load: bool) -> Agent:
    """Write the agent's file (replacing an earlier one) and load it."""
    a = agent(kind, directory)
    argv, env = command(serve_args), environment()
    a.path.parent.mkdir(parents=True, exist_ok=True)
    a.log.parent.mkdir(parents=True, exist_ok=True)
    if load and a.path.exists():
        _unload(a, missing_ok=True)
    if kind == "launchd":
        a.path.write_bytes(launchd_plist(argv, env, a.log))
    else:
        a.path.write_text(systemd_unit(argv, env, a.log))
    a.path.chmod(0o600)  # it may carry the token
    if load:
        _load(a)
    return a


def uninstall(kind: str, directory: Path | None, load: bool) -> Agent:
    """Unload the agent and delete its file; an agent that is not there is a clear error."""
    a = agent(kind, directory)
    if not a.path.exists():
        raise InvalidArgumentError(f"no worker agent is installed at {a.path}")
    if load:
        _unload(a, missing_ok=True)
    a.path.unlink()
    if load and kind == "systemd":
        _run(["systemctl", "--user", "daemon-reload"])
    return a


def _load(a: Agent) -> None:
    if a.kind == "launchd":
        _run(["launchctl", "bootstrap", f"gui/{os.getuid()}", str(a.path)])
    else:
        _run(["systemctl", "--user", "daemon-reload"])
        _run(["systemctl", "--user", "enable", "--now", UNIT])


def _unload(a: Agent, missing_ok: bool) -> None:
    if a.kind == "launchd":
        _run(["launchctl", "bootout", f"gui/{os.getuid()}/{LABEL}"], quiet=missing_ok)
    else:
        _run(["systemctl", "--user", "disable", "--now", UNIT], quiet=missing_ok)


def _run(argv: list[str], quiet: bool = False) -> None:
    """Run a service-manager command; a failure is one clear error (unless ``quiet``)."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        if quiet:
            return
        raise InvalidArgumentError(f"{shlex.join(argv)} failed: {err}") from err
    if done.returncode and not quiet:
        why = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise InvalidArgumentError(f"{shlex.join(argv)} failed ({done.returncode}): {why[0]}")


def _systemd_escape(text: str) -> str:
    return text.replace("%", "%%")


def _systemd_quote(text: str) -> str:
    """One word of an ExecStart or Environment line (systemd's quoting: double quotes, backslash)."""
    text = _systemd_escape(text)
    if text and not any(c in text for c in " \t\"\\'$;"):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("$", "$$") + '"'


def add_agent_arguments(p: argparse.ArgumentParser) -> None:
    """Flags both ``install`` and ``uninstall`` take."""
    p.add_argument("--kind", choices=KINDS, default=default_kind(), help="the service manager")
    p.add_argument("--dir", type=Path, help="write the file here instead of the service manager's place")
    p.add_argument("--no-load", action="store_true", help="write or delete the file only; do not (un)load it")
