"""A network namespace of its own for each parallel test process (Linux, root).

The suite's workers listen on 127.0.0.1 and announce themselves over Bonjour
there, and several tests count the workers they discover. Two test
processes sharing one loopback would see each other's workers. With
``pytest -n auto`` (``make test``), each process started by pytest-xdist
moves into a fresh network namespace before its first test, so it has a
loopback of its own; the workers it starts inherit it. Where that is not
possible (macOS, or not root) the suite runs in one process.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct
import sys

CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1


def can_isolate() -> bool:
    """Whether a process here may enter a network namespace of its own."""
    return sys.platform == "linux" and os.geteuid() == 0 and _probe_in_child()


def enter_own_network_namespace() -> None:
    """Move this process (its calling thread, and all it starts later) into a new namespace, `lo` up.

    Call it before any thread that uses the network starts: a namespace
    belongs to a thread, and only threads and processes started afterwards
    inherit it.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"unshare(CLONE_NEWNET): {os.strerror(errno)}")
    loopback_up()


def loopback_up() -> None:
    """A new namespace starts with `lo` down; bring it up without needing `ip`.

    ``python3 -m tests.support.processes.isolation`` does only this (scripts/gpu/suite.sh, inside
    ``unshare -n``).
    """
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(sock, SIOCGIFFLAGS, request)[:18])[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


def _probe_in_child() -> bool:
    """Try it in a forked child, so that this process stays where it is (containers may forbid it)."""
    pid = os.fork()
    if pid == 0:
        try:
            enter_own_network_namespace()
        except OSError:
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


if __name__ == "__main__":
    loopback_up()
