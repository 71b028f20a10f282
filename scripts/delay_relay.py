#!/usr/bin/env python3
"""A TCP relay that adds a fixed one-way delay in each direction.

It stands on the path between a coordinator and a worker (for the gRPC port
and the echo port alike), so a known latency can be added where the kernel
has no netem: the attribution test uses it on loopback, and the LAN test bed
uses it between network namespaces. Every chunk is forwarded ``--delay-ms``
after it arrived, in order, so the delay adds to latency without capping
throughput. Each direction of each connection has a reader and a writer
thread with blocking sockets: the writer sleeps until just before each
chunk is due and spins the last half millisecond, so the added delay stays
precise even where waking a sleeping thread is slow (an event loop's timers
would round up to whole milliseconds).

Two helpers measure what relaying itself costs, so a caller can take it off
the delay (the LAN test bed does): ``--echo HOST:PORT`` also serves a plain
TCP echo there, and ``--measure A,B`` (run alone) prints the median round
trip of small messages echoed at each address, interleaved.

SIGUSR1 turns it into a black hole (connections stay open, nothing passes,
what arrives is dropped); SIGUSR2 lets traffic through again; SIGHUP sets
the delay to ``--then-delay-ms`` (a link that turns slow mid-run). It prints one
JSON ready line with the listening ports, and runs until SIGINT or SIGTERM.

    python scripts/delay_relay.py --map 127.0.0.1:0=127.0.0.1:50051 --delay-ms 2
"""

from __future__ import annotations

import argparse
import contextlib
import json
import queue
import signal
import socket
import sys
import threading
import time

CHUNK = 1 << 16
SPIN_S = 0.0005  # sleep until this close to a chunk's due time, then spin: wake-ups are late


class Relay:
    """Forwards connections from listening sockets to targets with a delay."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.black_hole = threading.Event()

    def _read(self, source: socket.socket, chunks: queue.SimpleQueue[tuple[float, bytes]]) -> None:
        try:
            while data := source.recv(CHUNK):
                if not self.black_hole.is_set():
                    chunks.put((time.monotonic() + self.delay_s, data))
        except OSError:
            pass
        chunks.put((time.monotonic() + self.delay_s, b""))

    @staticmethod
    def _write(sink: socket.socket, chunks: queue.SimpleQueue[tuple[float, bytes]]) -> None:
        try:
            while True:
                due, data = chunks.get()
                if not data:
                    break
                wait = due - time.monotonic()
                if wait > SPIN_S:
                    time.sleep(wait - SPIN_S)
                while time.monotonic() < due:
                    pass
                sink.sendall(data)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def pipe(self, source: socket.socket, sink: socket.socket) -> list[threading.Thread]:
        """Start both threads of one direction."""
        chunks: queue.SimpleQueue[tuple[float, bytes]] = queue.SimpleQueue()
        threads = [
            threading.Thread(target=self._read, args=(source, chunks), daemon=True),
            threading.Thread(target=self._write, args=(sink, chunks), daemon=True),
        ]
        for t in threads:
            t.start()
        return threads

    def join(self, client: socket.socket, target: tuple[str, int]) -> None:
        """Relay one accepted connection to a new connection to ``target``."""
        try:
            server = socket.create_connection(target, timeout=10)
        except OSError:
            client.close()
            return
        server.settimeout(None)
        for s in (client, server):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threads = self.pipe(client, server) + self.pipe(server, client)
        for t in threads:
            t.join()
        client.close()
        server.close()

    def listen(self, listener: socket.socket, target: tuple[str, int]) -> None:
        """Accept connections forever, relaying each on threads of its own."""
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=self.join, args=(client, target), daemon=True).start()


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT``."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: expected HOST:PORT")
    return host, int(port)


def parse_map(text: str) -> tuple[tuple[str, int], tuple[str, int]]:
    """``LISTEN_HOST:PORT=TARGET_HOST:PORT``."""
    listen, _, target = text.partition("=")
    lh, _, lp = listen.rpartition(":")
    th, _, tp = target.rpartition(":")
    if not (lh and lp and th and tp):
        raise argparse.ArgumentTypeError(f"--map {text!r}: expected LISTEN_HOST:PORT=TARGET_HOST:PORT")
    return (lh, int(lp)), (th, int(tp))


def echo_forever(listener: socket.socket) -> None:
    """Echo every connection's bytes back, on a thread per connection."""

    def serve(conn: socket.socket) -> None:
        with contextlib.suppress(OSError), conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            while data := conn.recv(CHUNK):
                conn.sendall(data)

    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return
        threading.Thread(target=serve, args=(conn,), daemon=True).start()


def median_rtts_ms(addresses: list[tuple[str, int]], rounds: int = 300, size: int = 64) -> list[float]:
    """The median round trip of ``size``-byte echoes at each address, the addresses taken in turn."""
    conns = [socket.create_connection(a, timeout=5) for a in addresses]
    times: list[list[float]] = [[] for _ in conns]
    try:
        for conn in conns:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(rounds):
            for conn, samples in zip(conns, times, strict=True):
                started = time.perf_counter()
                conn.sendall(b"x" * size)
                got = 0
                while got < size:
                    got += len(conn.recv(CHUNK))
                samples.append(time.perf_counter() - started)
    finally:
        for conn in conns:
            conn.close()
    return [sorted(s)[len(s) // 2] * 1e3 for s in times]


def main(args: argparse.Namespace) -> int:
    if args.measure:
        print(json.dumps({"rtt_p50_ms": median_rtts_ms(args.measure)}), flush=True)
        return 0
    if not args.map:
        raise SystemExit("delay_relay: give --map (or --measure)")
    for host, port in args.echo or []:
        threading.Thread(target=echo_forever, args=(socket.create_server((host, port)),), daemon=True).start()
    relay = Relay(args.delay_ms / 1000.0)
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGUSR1, lambda *_: relay.black_hole.set())
    signal.signal(signal.SIGUSR2, lambda *_: relay.black_hole.clear())
    then_s = (args.delay_ms if args.then_delay_ms is None else args.then_delay_ms) / 1000.0
    signal.signal(signal.SIGHUP, lambda *_: setattr(relay, "delay_s", then_s))
    maps = []
    for (lh, lp), target in args.map:
        listener = socket.create_server((lh, lp))
        threading.Thread(target=relay.listen, args=(listener, target), daemon=True).start()
        maps.append({"listen": f"{lh}:{listener.getsockname()[1]}", "target": f"{target[0]}:{target[1]}"})
    print(json.dumps({"event": "ready", "delay_ms": args.delay_ms, "maps": maps}), flush=True)
    while not stop.wait(0.5):
        pass
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--map", type=parse_map, action="append", help="LISTEN:PORT=TARGET:PORT")
    parser.add_argument(
        "--echo", type=parse_address, action="append", help="also serve a TCP echo at HOST:PORT"
    )
    parser.add_argument(
        "--measure",
        type=lambda text: [parse_address(a) for a in text.split(",")],
        help="A,B,...: print the median round trip of small echoes at each address, and exit",
    )
    parser.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay added in each direction")
    parser.add_argument("--then-delay-ms", type=float, help="the one-way delay after a SIGHUP")
    sys.exit(main(parser.parse_args()))
