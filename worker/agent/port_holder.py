"""Who listens on a TCP port of this machine, found without binding it.

``worker install`` and ``worker start`` refuse to start an agent whose port a
worker in a terminal (or anything else) already holds: the agent would fail
to bind and be restarted every few seconds. On Linux the listening sockets
come from ``/proc/net/tcp`` and ``tcp6`` and their process from
``/proc/*/fd``; elsewhere (macOS) from ``lsof -nP -iTCP:PORT -sTCP:LISTEN``.
When neither can name the holder, a connection to the port on loopback still
tells that it is taken, and the holder is described as unknown.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path

LISTEN = "0A"  # the state column of /proc/net/tcp for a listening socket
LSOF_TIMEOUT_S = 10.0
COMMAND_CHARS = 80


@dataclass(frozen=True)
class Holder:
    """A process listening on a port: its pid and command line, where they could be found."""

    port: int
    pid: int | None = None
    command: str = ""

    def describe(self) -> str:
        """One clause for an error line, such as ``port 7070 is in use by pid 812 (python -m ...)``."""
        if self.pid is None:
            return f"port {self.port} is in use"
        return f"port {self.port} is in use by pid {self.pid}" + (
            f" ({self.command})" if self.command else ""
        )


def port_holder(port: int) -> Holder | None:
    """The listener on TCP ``port`` (any address, IPv4 or IPv6), or None when the port is free."""
    found = _from_proc(port) if Path("/proc/net/tcp").exists() else None
    if found is None or found.pid is None:
        found = _from_lsof(port) or found
    if found is None and _answers(port):
        found = Holder(port)
    return found


def _from_proc(port: int) -> Holder | None:
    """Linux: the listening socket's inode in /proc/net/tcp*, then the process holding that inode."""
    inodes = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if len(fields) > 9 and fields[3] == LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.append(fields[9])
    if not inodes:
        return None
    wanted = {f"socket:[{inode}]" for inode in inodes}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (proc / "fd").iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) in wanted:
                        return Holder(port, int(proc.name), _proc_command(proc))
    return Holder(port)  # another user's process, which this one may not look into


def _proc_command(proc: Path) -> str:
    try:
        words = (proc / "cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    except OSError:
        return ""
    return _short(" ".join(w.decode(errors="replace") for w in words))


def _from_lsof(port: int) -> Holder | None:
    """The first listener ``lsof`` reports (``-F pc``: a ``p<pid>`` line, then ``c<command>``)."""
    lsof = shutil.which("lsof") or ("/usr/sbin/lsof" if Path("/usr/sbin/lsof").exists() else None)
    if lsof is None:
        return None
    try:
        done = subprocess.run(
            [lsof, "-nP", f"-iTCP:{port}", "-sTCP:LISTEN", "-Fpc"],
            capture_output=True,
            text=True,
            check=False,
            timeout=LSOF_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    pid, command = None, ""
    for line in done.stdout.splitlines():
        if line.startswith("p") and pid is None:
            pid = int(line[1:])
        elif line.startswith("c") and pid is not None:
            command = _short(line[1:])
            break
    return Holder(port, pid, command) if pid is not None else None


def _answers(port: int) -> bool:
    """Whether something accepts a connection on ``port`` at loopback."""
    for family, address in ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")):
        with contextlib.suppress(OSError), socket.socket(family, socket.SOCK_STREAM) as s:
            s.settimeout(1.0)
            if s.connect_ex((address, port)) == 0:
                return True
    return False


def _short(text: str) -> str:
    return text if len(text) <= COMMAND_CHARS else text[: COMMAND_CHARS - 3] + "..."
