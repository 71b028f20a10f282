"""A worker's own log file, which rotates: what ``worker serve --log-file PATH`` writes.

A worker kept running by ``worker install`` runs for weeks, so its log must
not grow forever. launchd has no rotation of its own and systemd's
``append:`` files have none either, so the worker rotates its log itself,
the same way on macOS and Linux: given ``--log-file``, its log records go
through a ``logging.handlers.RotatingFileHandler`` (10 MB, then
``PATH.1`` .. ``PATH.3``; at most 40 MB in all), and so does everything it
prints: its stdout (the ready line) and stderr (warnings, a traceback) are
written as lines of the log, named ``stdout`` and ``stderr``, whatever
``--log-level`` lets through.

What the process writes before it gets here (an import error) or below
Python (a crash in native code) still lands on its real stdout and stderr,
which the agent sends to a second file (``worker-output.log``). That file
stays small: when it is past 1 MB at a start, only its last 256 KB are kept.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import logging
import os
import sys
from logging.handlers import RotatingFileHandler
from pathlib import Path

LOG_MAX_BYTES = 10 << 20
LOG_BACKUPS = 3
OUTPUT_MAX_BYTES = 1 << 20
OUTPUT_KEEP_BYTES = 256 << 10
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"  # command_line.configure_logging's


def log_to_file(path: Path, max_bytes: int = LOG_MAX_BYTES, backups: int = LOG_BACKUPS) -> None:
    """Send this process's log records, stdout and stderr to ``path``, rotated at ``max_bytes``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for fd in (1, 2):
        trim_output(fd)
    handler = RotatingFileHandler(path, maxBytes=max_bytes, backupCount=backups, encoding="utf-8")
    handler.setFormatter(logging.Formatter(FORMAT))
    root = logging.getLogger()
    for old in root.handlers[:]:  # the stderr handler: stderr is the output file now
        root.removeHandler(old)
    root.addHandler(handler)
    sys.stdout = _LineLog("stdout", logging.INFO, handler)
    sys.stderr = _LineLog("stderr", logging.WARNING, handler)


def trim_output(fd: int, max_bytes: int = OUTPUT_MAX_BYTES, keep_bytes: int = OUTPUT_KEEP_BYTES) -> None:
    """Keep only the last ``keep_bytes`` of the file open at ``fd`` once it is past ``max_bytes``.

    Only a regular file opened for appending is trimmed (launchd's
    StandardOutPath, systemd's ``append:``), so every later write still goes
    to its end; a terminal or a pipe is left alone.
    """
    with contextlib.suppress(OSError):
        st = os.fstat(fd)
        if not (st.st_mode & 0o170000 == 0o100000 and fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_APPEND):
            return
        if st.st_size <= max_bytes:
            return
        with open(_path_of(fd), "rb") as f:  # the fd itself is open for writing only
            f.seek(st.st_size - keep_bytes)
            tail = f.read(keep_bytes)
        os.ftruncate(fd, 0)
        os.write(fd, b"[earlier output trimmed]\n" + tail)


def _path_of(fd: int) -> str:
    """The path of the file open at ``fd``: macOS names it (F_GETPATH), Linux links it in /proc."""
    if hasattr(fcntl, "F_GETPATH"):
        return os.fsdecode(fcntl.fcntl(fd, fcntl.F_GETPATH, bytes(1024)).rstrip(b"\0"))
    return f"/proc/self/fd/{fd}"


class _LineLog(io.TextIOBase):
    """A text stream that writes each whole line it is given as one log record of its own logger."""

    def __init__(self, name: str, level: int, handler: logging.Handler) -> None:
        self._log = logging.getLogger(name)
        self._log.propagate = False
        for old in self._log.handlers[:]:
            self._log.removeHandler(old)
        self._log.setLevel(logging.DEBUG)  # what a worker prints is kept, whatever --log-level says
        self._log.addHandler(handler)
        self._level = level
        self._pending = ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        *lines, self._pending = (self._pending + text).split("\n")
        for line in lines:
            self._log.log(self._level, "%s", line)
        return len(text)

    def flush(self) -> None:
        if self._pending:
            self._log.log(self._level, "%s", self._pending)
            self._pending = ""
