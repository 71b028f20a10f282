"""The file that keeps ``worker serve`` running: a launchd agent (macOS) or a systemd user unit (Linux).

The agent runs this very Python (``sys.executable -m worker.cli serve``) with
the serve flags given to ``worker install`` (``worker.agent.serve_flags``: checked,
relative paths made absolute) and ``--log-file``, in the directory install
ran in (launchd would start it in ``/``). It starts at login (a reboot
included) and is restarted after a crash, not after a clean stop.

Logs: the worker writes its own log, rotated (``worker.server.log_file``), to
``~/Library/Logs/specwire/worker.log`` on macOS and
``~/.local/state/specwire/worker.log`` on Linux; what it prints before that
log starts, or a crash below Python, goes to ``worker-output.log`` beside it.

Environment: the ``SPECWIRE_*`` variables set at install time (the mDNS
interfaces, the device) and ``HF_HOME``/``HF_HUB_OFFLINE`` are written into
the file, but never ``SPECWIRE_TOKEN``: the worker reads the token file at
each start, so a later ``worker token set`` reaches it at the next
``worker stop`` / ``worker start``.

``--dir`` writes the file elsewhere than the service manager's place (for a
look at it, and for the tests); ``worker.agent.agent_control`` loads, starts and
stops it.
"""

from __future__ import annotations

import argparse
import os
import plistlib
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from specwire.errors import InvalidArgumentError
from specwire.wire.auth import TOKEN_ENV

LABEL = "dev.specwire.worker"
UNIT = "specwire-worker.service"
KINDS = ("launchd", "systemd")
PASSED_ENV = ("HF_HOME", "HF_HUB_OFFLINE")  # and every SPECWIRE_* variable but the token
NOT_PASSED_ENV = (TOKEN_ENV,)


@dataclass(frozen=True)
class Agent:
    """Where an agent's file lives, and where its worker logs (``log``) and prints (``output``)."""

    kind: str
    path: Path
    log: Path
    output: Path

    @property
    def manager(self) -> str:
        """The service manager's command, for messages."""
        return "launchctl" if self.kind == "launchd" else "systemctl --user"


def default_kind() -> str:
    """launchd on macOS, systemd elsewhere."""
    return "launchd" if sys.platform == "darwin" else "systemd"


def agent(kind: str, directory: Path | None = None) -> Agent:
    """The agent of ``kind``, its file in ``directory`` or the system's usual place."""
    home = Path.home()
    if kind == "launchd":
        logs = home / "Library" / "Logs" / "specwire"
        path = (directory or home / "Library" / "LaunchAgents") / f"{LABEL}.plist"
    else:
        logs = Path(os.environ.get("XDG_STATE_HOME") or home / ".local" / "state") / "specwire"
        config = Path(os.environ.get("XDG_CONFIG_HOME") or home / ".config")
        path = (directory or config / "systemd" / "user") / UNIT
    return Agent(kind, path, logs / "worker.log", logs / "worker-output.log")


def command(serve_args: list[str]) -> list[str]:
    """The command the agent runs."""
    return [sys.executable, "-m", "worker.cli", "serve", *serve_args]


def environment() -> dict[str, str]:
    """What the worker needs of this shell's environment (never the token)."""
    return {
        k: v
        for k, v in sorted(os.environ.items())
        if v and (k.startswith("SPECWIRE_") or k in PASSED_ENV) and k not in NOT_PASSED_ENV
    }


def launchd_plist(argv: list[str], env: dict[str, str], workdir: Path, output: Path) -> bytes:
    """A launchd agent that runs ``argv`` in ``workdir`` at login and again after a crash."""
    return plistlib.dumps(
        {
            "Label": LABEL,
            "ProgramArguments": argv,
            "EnvironmentVariables": env,
            "WorkingDirectory": str(workdir),
            "RunAtLoad": True,
            "KeepAlive": {"SuccessfulExit": False},  # restarted unless it stopped cleanly
            "ThrottleInterval": 5,
            "StandardOutPath": str(output),
            "StandardErrorPath": str(output),
            "ProcessType": "Interactive",  # a worker serves requests: no App Nap throttling
        }
    )


def systemd_unit(argv: list[str], env: dict[str, str], workdir: Path, output: Path) -> str:
    """A systemd user unit that runs ``argv`` in ``workdir`` at login (or boot, with lingering) and after a
    crash."""
    lines = [
        "[Unit]",
        "Description=specwire draft worker",
        "After=network-online.target",
        "",
        "[Service]",
        f"ExecStart={' '.join(_systemd_quote(a) for a in argv)}",
        *([f"Environment={' '.join(_systemd_quote(f'{k}={v}') for k, v in env.items())}"] if env else []),
        f"WorkingDirectory={_systemd_escape(str(workdir))}",
        "Restart=on-failure",
        "RestartSec=5",
        f"StandardOutput=append:{_systemd_escape(str(output))}",
        f"StandardError=append:{_systemd_escape(str(output))}",
        "",
        "[Install]",
        "WantedBy=default.target",
        "",
    ]
    return "\n".join(lines)


def write(a: Agent, serve_args: list[str], workdir: Path) -> None:
    """Write the agent's file (replacing an earlier one), and make its log directory."""
    argv, env = command(serve_args), environment()
    a.path.parent.mkdir(parents=True, exist_ok=True)
    a.log.parent.mkdir(parents=True, exist_ok=True)
    if a.kind == "launchd":
        a.path.write_bytes(launchd_plist(argv, env, workdir, a.output))
    else:
        a.path.write_text(systemd_unit(argv, env, workdir, a.output))
    a.path.chmod(0o600)  # it names this user's paths and environment


def serve_args_of(a: Agent) -> list[str]:
    """The serve flags the installed agent runs with, read back from its file."""
    if not a.path.exists():
        raise InvalidArgumentError(f"no worker agent is installed at {a.path}: `worker install` makes one")
    try:
        if a.kind == "launchd":
            argv = [str(w) for w in plistlib.loads(a.path.read_bytes())["ProgramArguments"]]
        else:
            line = next(ln for ln in a.path.read_text().splitlines() if ln.startswith("ExecStart="))
            argv = _systemd_words(line.removeprefix("ExecStart="))
    except (OSError, ValueError, KeyError, StopIteration, plistlib.InvalidFileException) as err:
        raise InvalidArgumentError(f"cannot read the worker agent {a.path}: {err}") from err
    if "serve" not in argv:
        raise InvalidArgumentError(f"the worker agent {a.path} does not run `worker serve`")
    return argv[argv.index("serve") + 1 :]


def _systemd_escape(text: str) -> str:
    return text.replace("%", "%%")


def _systemd_quote(text: str) -> str:
    """One word of an ExecStart or Environment line (systemd's quoting: double quotes, backslash)."""
    text = _systemd_escape(text)
    if text and not any(c in text for c in " \t\"\\'$;"):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("$", "$$") + '"'


def _systemd_words(line: str) -> list[str]:
    """The words ``_systemd_quote`` wrote."""
    return [w.replace("$$", "$").replace("%%", "%") for w in shlex.split(line)]


def add_agent_arguments(p: argparse.ArgumentParser, no_load: bool = True) -> None:
    """Flags every agent command takes (``--no-load``: only those that write or delete the file)."""
    p.add_argument("--kind", choices=KINDS, default=default_kind(), help="the service manager")
    p.add_argument("--dir", type=Path, help="the agent's file is here instead of the service manager's place")
    if no_load:
        p.add_argument(
            "--no-load", action="store_true", help="write or delete the file only; do not (un)load it"
        )
