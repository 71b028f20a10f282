"""The raw TCP echo service: its framing, and blocking socket helpers both ends use.

In the spirit of GGML_RPC's wire format: a command byte, a 64-bit big-endian
length, then the payload.

* ``E`` (echo): the reply is the same length and payload.
* ``U`` (upload): the payload is consumed; the reply is the 8-byte length.
* ``D`` (download): no payload; the reply is the length, then that many bytes.
* ``A`` (authenticate): the payload is a token proof (``specwire.wire.auth``); the
  reply is a length of 1 when it is accepted. When the worker requires the
  token, this must be the first frame, or the connection is closed.

Both ends use plain blocking sockets on threads of their own, so the floor
they measure is the link's, not an event loop's: receiving goes through
``recv_into`` on a preallocated buffer, sending through ``sendall``.
"""

from __future__ import annotations

import socket
import struct

HEADER = struct.Struct(">cQ")
LENGTH = struct.Struct(">Q")
CHUNK = 1 << 16
MAX_PAYLOAD = 64 * 1024 * 1024
ECHO, UPLOAD, DOWNLOAD, AUTHENTICATE = b"E", b"U", b"D", b"A"


def no_delay(sock: socket.socket) -> None:
    """Send small frames at once (no Nagle delay), as any latency-sensitive RPC does."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def recv_exactly(sock: socket.socket, view: memoryview) -> None:
    """Fill ``view`` from ``sock``; ``ConnectionError`` if the peer closes first."""
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("peer closed the connection")
        got += n


def send_zeros(sock: socket.socket, nbytes: int) -> None:
    """Send ``nbytes`` zero bytes in chunks."""
    chunk = bytes(min(CHUNK, nbytes))
    while nbytes > 0:
        sock.sendall(chunk[: min(CHUNK, nbytes)])
        nbytes -= CHUNK
