"""Bring the loopback interface up in a fresh network namespace, on machines without `ip` (Linux only).

scripts/gpu/suite.sh runs each test group in its own namespace (`unshare -n`) so that the groups' workers
and their Bonjour announcements cannot see each other; a new namespace starts with `lo` down.
"""

import fcntl
import socket
import struct

SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1


def main() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(sock, SIOCGIFFLAGS, request)[:18])[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


if __name__ == "__main__":
    main()
