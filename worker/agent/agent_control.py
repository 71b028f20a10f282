"""Asking the service manager about the worker agent, and having it load, start and stop it.

launchd (macOS): loaded means ``launchctl print gui/UID/LABEL`` knows it;
``load``/``start`` bootstrap the plist (``kickstart`` when it is loaded but
not running); ``stop`` boots it out, so it stays stopped until ``worker
start`` or the next login. systemd (Linux): ``systemctl --user`` ``show``,
``enable --now``, ``start`` and ``stop``; ``stop`` likewise lasts until
``worker start`` or the next login.

Where the service manager cannot be asked (no ``launchctl``; no user
``systemd``, as in a container or an ssh session without lingering), the state
says so (``loaded`` is None) and every command that needed it fails with one
line naming why. The agent is "loaded" only when the manager's job is this
very file, so an agent written elsewhere with ``--dir`` is never mistaken for
the one the manager runs.

Before the agent starts, its ports must be free: a worker left running in a
terminal would make it fail to bind and be restarted every few seconds.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from specwire.errors import InvalidArgumentError
from worker.agent.agent import LABEL, UNIT, Agent
from worker.agent.port_holder import port_holder

MANAGER_TIMEOUT_S = 60
PORT_FREE_TIMEOUT_S = 15.0
PORT_POLL_S = 0.2


@dataclass(frozen=True)
class State:
    """What the service manager says of the agent: loaded (None: it could not ask), its pid if running."""

    loaded: bool | None
    pid: int | None = None
    why: str = ""  # why it could not be asked, or why it does not count as loaded

    @property
    def running(self) -> bool:
        """Whether a worker process of the agent runs now."""
        return self.pid is not None


def state(a: Agent) -> State:
    """The agent's state as its service manager sees it."""
    return _launchd_state(a) if a.kind == "launchd" else _systemd_state(a)


def load(a: Agent) -> None:
    """Load the agent's file, starting its worker."""
    if a.kind == "launchd":
        _run(["launchctl", "bootstrap", _domain(), str(a.path)])
    else:
        _run(["systemctl", "--user", "daemon-reload"])
        _run(["systemctl", "--user", "enable", "--now", str(a.path)])  # a path: --dir works too


def unload(a: Agent) -> None:
    """Stop the agent's worker and unload its file; an agent that is not loaded is no error."""
    if a.kind == "launchd":
        _run(["launchctl", "bootout", f"{_domain()}/{LABEL}"], quiet=True)
    else:
        _run(["systemctl", "--user", "disable", "--now", UNIT], quiet=True)
        _run(["systemctl", "--user", "daemon-reload"], quiet=True)


def start(a: Agent, now: State) -> None:
    """Start the agent's worker (loading its file where it is not loaded)."""
    if a.kind == "launchd":
        if now.loaded:
            _run(["launchctl", "kickstart", f"{_domain()}/{LABEL}"])
        else:
            _run(["launchctl", "bootstrap", _domain(), str(a.path)])
    elif now.loaded:
        _run(["systemctl", "--user", "daemon-reload"])  # the file may have been rewritten since
        _run(["systemctl", "--user", "start", UNIT])
    else:
        load(a)


def stop(a: Agent) -> None:
    """Stop the agent's worker until ``start`` or the next login."""
    if a.kind == "launchd":
        _run(["launchctl", "bootout", f"{_domain()}/{LABEL}"])
    else:
        _run(["systemctl", "--user", "stop", UNIT])


def refuse_taken_ports(ports: list[int], own_pid: int | None) -> None:
    """One clear error when a port is held by something other than the agent's own running worker
    (``own_pid``; a holder this user may not name counts as that worker, when there is one)."""
    for port in ports:
        holder = port_holder(port)
        if holder is None or (own_pid is not None and holder.pid in (own_pid, None)):
            continue
        raise InvalidArgumentError(
            f"{holder.describe()}, which the worker agent needs: stop that first (a `worker serve` in a "
            "terminal?), or give the agent other ports (-- --port N)"
        )


def wait_ports_free(ports: list[int], timeout_s: float = PORT_FREE_TIMEOUT_S) -> None:
    """Wait until the old worker of the agent has let go of its ports (an error after ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        taken = [h for h in map(port_holder, ports) if h is not None]
        if not taken:
            return
        if time.monotonic() > deadline:
            raise InvalidArgumentError(f"{taken[0].describe()} {timeout_s:.0f} s after the agent was stopped")
        time.sleep(PORT_POLL_S)


def _launchd_state(a: Agent) -> State:
    code, out, why = _call(["launchctl", "print", f"{_domain()}/{LABEL}"])
    if code is None:
        return State(None, why=why)
    if code:
        return State(False)  # "Could not find service"
    path = re.search(r"^\s*path = (.+)$", out, re.MULTILINE)
    if path and not _same_file(path.group(1).strip(), a.path):
        return State(False, why=f"launchd's {LABEL} is {path.group(1).strip()}, not this file")
    pid = re.search(r"^\s*pid = (\d+)$", out, re.MULTILINE)
    return State(True, int(pid.group(1)) if pid else None)


def _systemd_state(a: Agent) -> State:
    argv = ["systemctl", "--user", "show", UNIT, "--property=LoadState,ActiveState,MainPID,FragmentPath"]
    code, out, why = _call(argv)
    if code is None or code:
        return State(None, why=why)
    props = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    if props.get("LoadState") != "loaded":
        return State(False)
    if not _same_file(props.get("FragmentPath", ""), a.path):
        return State(False, why=f"systemd's {UNIT} is {props.get('FragmentPath')}, not this file")
    pid = int(props.get("MainPID") or 0)
    return State(True, pid if pid and props.get("ActiveState") in ("active", "reloading") else None)


def _same_file(text: str, path: Path) -> bool:
    try:
        return Path(text).resolve() == path.resolve()
    except OSError:
        return False


def _domain() -> str:
    return f"gui/{os.getuid()}"


def _run(argv: list[str], quiet: bool = False) -> str:
    """Run a service-manager command, return its stdout; a failure is one clear error (unless ``quiet``)."""
    code, out, why = _call(argv)
    if code != 0 and not quiet:
        raise InvalidArgumentError(why)
    return out


def _call(argv: list[str]) -> tuple[int | None, str, str]:
    """Run ``argv``: its exit code (None: it could not run, or could not reach the manager), its stdout,
    and one line saying why it failed."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=MANAGER_TIMEOUT_S)
    except FileNotFoundError:
        return None, "", f"{argv[0]} is not available here"
    except (OSError, subprocess.TimeoutExpired) as err:
        return None, "", f"{shlex.join(argv)} failed: {err}"
    last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
    if "Failed to connect to bus" in last[0] or "Failed to connect to user scope bus" in last[0]:
        return None, "", f"systemctl --user is not available here ({last[0]})"
    return done.returncode, done.stdout, f"{shlex.join(argv)} failed ({done.returncode}): {last[0]}"
