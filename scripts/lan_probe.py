#!/usr/bin/env python3
"""LAN latency probe: measure the link to draft workers, by itself.

For payload sizes from 16 B to 1 MiB it measures raw TCP echo round trips
(min, p50, p95, p99) against the worker's echo service, gRPC unary and
streaming echo round trips against the worker's gRPC server, and bulk
throughput in each direction; it prints a table with gRPC's overhead over
bare TCP at each size. Workers are found over Bonjour, or named with --host.
Every measurement is bounded in count and time, so the probe stops by itself.

    python scripts/lan_probe.py --interface 127.0.0.1
    python scripts/lan_probe.py --host 10.0.0.7:7070 --json probe.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import anyio

from coordinator.commands.options import add_credential_arguments
from coordinator.workers.connection import connect
from coordinator.workers.credentials import Credentials
from coordinator.workers.discovery import WorkerDirectory, browse
from coordinator.workers.netprobe import DEFAULT_SIZES, ProbeReport, probe_grpc, probe_tcp, probe_throughput
from specwire.errors import NoWorkerError, SpecwireError
from specwire.process.command_line import exit_process
from specwire.wire.bonjour import mdns_interfaces


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The probe's flags."""
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, prog="lan_probe.py"
    )
    p.add_argument(
        "--host", action="append", help="worker gRPC address HOST:PORT (repeatable; skips Bonjour)"
    )
    p.add_argument("--worker", help="probe only the discovered worker with this name")
    p.add_argument("--interface", help="mDNS interfaces: 'all' or comma-separated IPv4 addresses")
    p.add_argument("--discover-timeout", type=float, default=3.0, help="seconds to listen on Bonjour")
    p.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)), help="payload sizes in bytes")
    p.add_argument("--count", type=int, default=200, help="most round trips per size and method")
    p.add_argument("--time-budget", type=float, default=2.0, help="most seconds per size and method")
    p.add_argument(
        "--bulk-bytes",
        type=int,
        default=32 << 20,
        help="bytes per transfer for throughput (best of 3 each way)",
    )
    p.add_argument("--json", type=Path, help="write every summary to this file")
    add_credential_arguments(p)
    return p.parse_args(argv)


async def targets(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(name, gRPC address) of each worker to probe."""
    if args.host:
        return [(h, h) for h in args.host]
    if args.worker is None:
        found = await browse(mdns_interfaces(args.interface), args.discover_timeout)
    else:  # one named worker: done as soon as it answers
        async with WorkerDirectory(mdns_interfaces(args.interface)) as directory:
            await directory.wait_until(
                lambda ws: any(w.name == args.worker for w in ws), args.discover_timeout
            )
            found = directory.workers()
    chosen = [(w.name, w.address) for w in found if args.worker in (None, w.name)]
    if not chosen:
        raise NoWorkerError(
            "no worker answered on Bonjour" + (f" under the name {args.worker!r}" if args.worker else "")
        )
    return chosen


async def probe(name: str, address: str, args: argparse.Namespace) -> ProbeReport:
    """Measure one worker."""
    credentials = Credentials.from_args(args)
    connection = await connect(address, credentials)
    try:
        host = address.rsplit(":", 1)[0]
        echo_port = connection.hello.echo_port
        if not echo_port:
            raise NoWorkerError(f"worker {connection.name} serves no echo port")
        sizes = tuple(int(s) for s in args.sizes.split(","))
        report = ProbeReport(connection.name or name, address, f"{host}:{echo_port}")
        token = credentials.token
        report.tcp = await probe_tcp(host, echo_port, sizes, args.count, args.time_budget, token)
        report.grpc_unary, report.grpc_stream = await probe_grpc(
            connection, sizes, args.count, args.time_budget
        )
        report.upload_bytes_per_s, report.download_bytes_per_s = await probe_throughput(
            host, echo_port, args.bulk_bytes, token
        )
        return report
    finally:
        await connection.close()


def print_report(report: ProbeReport) -> None:
    """The human-readable table of one worker."""
    print(
        f"\nworker {report.worker}: gRPC {report.grpc_address}, "
        f"TCP echo {report.echo_address}  (round trips in µs)"
    )
    head = (
        "size",
        "tcp min",
        "tcp p50",
        "tcp p95",
        "tcp p99",
        "unary p50",
        "stream p50",
        "unary-tcp",
        "stream-tcp",
    )
    print("  ".join(f"{h:>10}" for h in head))
    for tcp, unary, stream in zip(report.tcp, report.grpc_unary, report.grpc_stream, strict=True):
        row = (
            _size(tcp.size),
            *(
                f"{v:.0f}"
                for v in (tcp.min_us, tcp.p50_us, tcp.p95_us, tcp.p99_us, unary.p50_us, stream.p50_us)
            ),
            f"{unary.p50_us - tcp.p50_us:+.0f}",
            f"{stream.p50_us - tcp.p50_us:+.0f}",
        )
        print("  ".join(f"{v:>10}" for v in row))
    print(
        f"throughput: to worker {report.upload_bytes_per_s / 1e6:.1f} MB/s, "
        f"from worker {report.download_bytes_per_s / 1e6:.1f} MB/s"
    )


def _size(n: int) -> str:
    for unit, scale in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n} B"


async def main(args: argparse.Namespace) -> int:
    """Probe every target, print, and write JSON if asked."""
    reports = [await probe(name, address, args) for name, address in await targets(args)]
    for report in reports:
        print_report(report)
    if args.json:
        args.json.write_text(json.dumps({"workers": [r.to_dict() for r in reports]}, indent=2))
    return 0


if __name__ == "__main__":
    try:
        code = anyio.run(main, parse_args())
    except SpecwireError as err:
        print(f"error: {err}", file=sys.stderr)
        code = 1
    exit_process(code)
