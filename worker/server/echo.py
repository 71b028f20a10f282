"""The raw TCP echo service the LAN probe measures the link with.

Framing: ``specwire.wire.echo_frames``. When the worker requires the shared
token, a connection must authenticate in its first frame or it is closed.
Each connection is served by a blocking
thread of its own, off the event loop, so a busy worker does not inflate the
floor the probe measures. Payloads are capped at ``MAX_PAYLOAD``; anything
else closes the connection. It never touches the model.
"""

from __future__ import annotations

import logging
import socket
import threading

from specwire.wire.auth import ECHO_METHOD, ProofChecker
from specwire.wire.echo_frames import (
    AUTHENTICATE,
    DOWNLOAD,
    ECHO,
    HEADER,
    LENGTH,
    MAX_PAYLOAD,
    UPLOAD,
    no_delay,
    recv_exactly,
    send_zeros,
)

log = logging.getLogger(__name__)


def _authenticated(conn: socket.socket, checker: ProofChecker) -> bool:
    """Read the first frame; True when it is a valid token proof."""
    header = bytearray(HEADER.size)
    recv_exactly(conn, memoryview(header))
    command, length = HEADER.unpack(header)
    if command != AUTHENTICATE or length > 512:
        log.info("echo: refused a connection that did not authenticate first")
        return False
    proof = bytearray(length)
    recv_exactly(conn, memoryview(proof))
    try:
        checker.check(proof.decode(errors="replace"), ECHO_METHOD)
    except Exception as err:  # any failure refuses the connection
        log.info("echo: refused a connection: %s", err)
        return False
    conn.sendall(LENGTH.pack(1))
    return True


def _serve_connection(conn: socket.socket, checker: ProofChecker | None) -> None:
    no_delay(conn)
    header = bytearray(HEADER.size)
    buffer = bytearray(1 << 16)
    with conn:
        try:
            if checker is not None and not _authenticated(conn, checker):
                return
            while True:
                recv_exactly(conn, memoryview(header))
                command, length = HEADER.unpack(header)
                if command == AUTHENTICATE and length <= 512:
                    recv_exactly(conn, memoryview(buffer)[:length])
                    conn.sendall(LENGTH.pack(1))
                    continue
                if length > MAX_PAYLOAD or command not in (ECHO, UPLOAD, DOWNLOAD):
                    log.info("echo: closing a connection that sent %r with %d bytes", command, length)
                    return
                if command == DOWNLOAD:
                    conn.sendall(LENGTH.pack(length))
                    send_zeros(conn, length)
                    continue
                if len(buffer) < length:
                    buffer = bytearray(length)
                view = memoryview(buffer)[:length]
                recv_exactly(conn, view)
                conn.sendall(LENGTH.pack(length))
                if command == ECHO:
                    conn.sendall(view)
        except OSError:
            return


class EchoServer:
    """Accepts connections on a thread; serves each on a thread of its own."""

    def __init__(self, host: str, port: int, checker: ProofChecker | None) -> None:
        self.checker = checker
        self.sock = socket.create_server((host, port), reuse_port=False)
        self.port = int(self.sock.getsockname()[1])
        self._thread = threading.Thread(target=self._accept, name="echo-accept", daemon=True)

    def start(self) -> EchoServer:
        """Start accepting; returns self."""
        self._thread.start()
        return self

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            threading.Thread(
                target=_serve_connection, args=(conn, self.checker), name="echo", daemon=True
            ).start()

    def close(self) -> None:
        """Stop accepting (open connections end with their peers)."""
        self.sock.close()
