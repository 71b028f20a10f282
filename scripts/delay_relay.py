#!/usr/bin/env python3
"""A TCP relay that adds a fixed one-way delay in each direction.

It stands on the path between a coordinator and a worker (for the gRPC port
and the echo port alike), so a known latency can be added where the kernel
has no netem: the attribution test uses it on loopback, and the LAN test bed
uses it between network namespaces. Every chunk is forwarded ``--delay-ms``
after it arrived, in order, so the delay adds to latency without capping
throughput.

SIGUSR1 turns it into a black hole (connections stay open, nothing passes,
what arrives is dropped); SIGUSR2 lets traffic through again. It prints one
JSON ready line with the listening ports, and runs until SIGINT or SIGTERM.

    python scripts/delay_relay.py --map 127.0.0.1:0=127.0.0.1:50051 --delay-ms 2
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import socket
import sys
import time

CHUNK = 1 << 16


class Relay:
    """Forwards connections from listening ports to targets with a delay."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.black_hole = False

    async def pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Copy one direction: each chunk is written ``delay_s`` after it was read."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                if not data:
                    break
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()

        delivery = asyncio.create_task(deliver())
        try:
            while data := await reader.read(CHUNK):
                if not self.black_hole:
                    queue.put_nowait((time.monotonic() + self.delay_s, data))
            queue.put_nowait((time.monotonic() + self.delay_s, b""))
            await delivery
        except (ConnectionError, asyncio.CancelledError):
            delivery.cancel()
        finally:
            with contextlib.suppress(ConnectionError, OSError):
                writer.close()

    async def connect(
        self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter, target: tuple[str, int]
    ) -> None:
        """Join one accepted connection to a new connection to ``target``."""
        try:
            server_r, server_w = await asyncio.open_connection(*target)
        except OSError:
            client_w.close()
            return
        for w in (client_w, server_w):
            sock = w.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await asyncio.gather(self.pump(client_r, server_w), self.pump(server_r, client_w))


def parse_map(text: str) -> tuple[tuple[str, int], tuple[str, int]]:
    """``LISTEN_HOST:PORT=TARGET_HOST:PORT``."""
    listen, _, target = text.partition("=")
    lh, _, lp = listen.rpartition(":")
    th, _, tp = target.rpartition(":")
    if not (lh and lp and th and tp):
        raise argparse.ArgumentTypeError(f"--map {text!r}: expected LISTEN_HOST:PORT=TARGET_HOST:PORT")
    return (lh, int(lp)), (th, int(tp))


async def main(args: argparse.Namespace) -> None:
    relay = Relay(args.delay_ms / 1000.0)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, lambda: setattr(relay, "black_hole", True))
    loop.add_signal_handler(signal.SIGUSR2, lambda: setattr(relay, "black_hole", False))
    servers, ports = [], []
    for (lh, lp), target in args.map:
        server = await asyncio.start_server(lambda r, w, t=target: relay.connect(r, w, t), lh, lp)
        servers.append(server)
        ports.append(
            {"listen": f"{lh}:{server.sockets[0].getsockname()[1]}", "target": f"{target[0]}:{target[1]}"}
        )
    print(json.dumps({"event": "ready", "delay_ms": args.delay_ms, "maps": ports}), flush=True)
    await stop.wait()
    for server in servers:
        server.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--map", type=parse_map, action="append", required=True, help="LISTEN:PORT=TARGET:PORT"
    )
    parser.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay added in each direction")
    asyncio.run(main(parser.parse_args()))
    sys.exit(0)
