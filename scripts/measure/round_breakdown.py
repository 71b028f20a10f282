#!/usr/bin/env python3
"""Where one stream round's time goes, measured part by part (p50 and p95 over many rounds).

Runs speculative decoding over the stream backend against a worker (one it
starts on 127.0.0.1 serving ``--model``, by default the fast ``tiny``
model, or the one at ``--worker HOST:PORT``), and splits every round the
engine asked for into:

    hop in          engine on the compute thread -> the event loop takes the call up
    encode          coordinator encodes the Round
    to worker       gRPC takes it; it reaches the worker's stream reader (same host only)
    worker parse    the worker decodes it
    to compute      the worker hands it to its compute thread (queueing included)
    compute         drafting
    from compute    back to the worker's event loop
    worker encode   the worker encodes the Drafts
    to coordinator  the worker's write, the wire, and the coordinator's
                    event loop reading it                              (same host only)
    decode          the coordinator decodes the Drafts
    hop out         the drafts reach the engine on the compute thread

"to worker" and "to coordinator" compare instants of the two processes'
monotonic clocks, which is valid only when both run on one host (loopback,
or the LAN test bed's namespaces, which share a kernel); otherwise only
their sum is shown, as "transport". The raw-TCP echo floor for the same
bytes (the worker's echo service) is measured at the start, and the
protocol cost is total - compute - floor.

Several workers (``--worker`` repeated, and with ``--local`` one started
here beside them) are measured in one run, generation by generation in turn, so
their tables compare: a worker started from an older checkout against this
one is a before/after of the same run.

    python scripts/measure/round_breakdown.py                 # a local tiny worker, k = 4
    python scripts/measure/round_breakdown.py --worker 127.0.0.1:PORT --local   # an older checkout's
                                                                                # worker beside
    python scripts/measure/round_breakdown.py --rounds 1000 --json breakdown.json
    sudo .venv/bin/python scripts/lan_testbed exec m2-ultra -- \\
        .venv/bin/python scripts/measure/round_breakdown.py --worker 198.18.77.2:PORT

Its figures are in ``docs/measurements.md#one-stream-round-part-by-part``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import anyio
import numpy as np

from coordinator.decoding.engine import SpeculativeDecoder
from coordinator.drafting.factory import DraftSources, WorkerAccess
from coordinator.drafting.failover import FailoverDraftSource
from coordinator.drafting.spec import DraftSpec
from coordinator.drafting.stream import StreamDraftSource
from coordinator.runtime import coordinator_runtime
from coordinator.workers.connection import WorkerConnection
from coordinator.workers.credentials import Credentials
from coordinator.workers.netprobe import NetworkFloor, probe_tcp
from specwire.drafting.sampling import SamplingParams
from specwire.errors import SpecwireError
from specwire.models.loading import load_model
from specwire.process.command_line import exit_process
from specwire.wire.protocol import ECHO_STREAM_METHOD
from specwire.wire.timing import CallRecord

PROMPT = "Once upon a time, a lighthouse keeper"
PARTS = (
    "hop in",
    "encode",
    "to worker",
    "worker parse",
    "to compute",
    "compute",
    "from compute",
    "worker encode",
    "to coordinator",
    "decode",
    "hop out",
)
FLOOR_SIZES = (16, 64, 256, 1024)


def parts_of(call: CallRecord, same_clock: bool) -> dict[str, float]:
    """One round's parts in microseconds (see the module docstring)."""
    s = call.server
    us = {
        "hop in": call.entered_ns - call.requested_ns,
        "encode": call.serialize_ns,
        "worker parse": s.deserialize_ns,
        "to compute": s.receive_to_start_ns,
        "compute": s.compute_ns,
        "from compute": s.compute_to_reply_ns,
        "worker encode": s.serialize_ns,
        "decode": call.deserialize_ns,
        "hop out": call.returned_ns - call.receive_ns,
    }
    worker_span = s.encoded_at_ns - s.arrived_at_ns  # worker clock: arrival to reply encoded
    transport = (call.read_ns - call.send_ns) - worker_span
    if same_clock:
        us["to worker"] = s.arrived_at_ns - call.send_ns
        us["to coordinator"] = call.read_ns - s.encoded_at_ns
    else:
        us["transport"] = transport
    us["total"] = call.returned_ns - call.requested_ns
    return {k: v / 1e3 for k, v in us.items()}


async def grpc_echo_after_idle(connection: WorkerConnection, count: int, gap_s: float) -> list[float]:
    """Round trips (µs) of 64 bytes each way on one EchoStream, each after ``gap_s`` of idleness."""
    credentials = connection.credentials
    stream = connection.channel.stream_stream(ECHO_STREAM_METHOD)(
        metadata=credentials.metadata(ECHO_STREAM_METHOD)
    )
    payload = bytes(64)
    samples = []
    try:
        for _ in range(count + 1):
            await anyio.sleep(gap_s)
            t0 = time.perf_counter_ns()
            await stream.write(payload)
            await stream.read()
            samples.append((time.perf_counter_ns() - t0) / 1e3)
    finally:
        stream.cancel()
    return samples[1:]  # the first opens the stream


def start_worker(model: str) -> tuple[subprocess.Popen[str], str]:
    """A worker on 127.0.0.1 (not advertised), and its address."""
    command = [sys.executable, "-m", "worker.cli", "serve", "--host", "127.0.0.1", "--port", "0"]
    command += ["--model", model, "--no-advertise", "--json", "--warmup-tokens", "2"]
    command += ["--name", f"breakdown-{os.getpid()}"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith("{") and json.loads(line).get("event") == "ready":
            return process, f"127.0.0.1:{json.loads(line)['port']}"
    raise SystemExit(f"round_breakdown: the worker exited before it was ready (code {process.wait()})")


async def measure(args: argparse.Namespace, workers: dict[str, str]) -> dict:
    """Rounds through each worker (label -> address), in turn; every part of every round, and the floors."""
    access = WorkerAccess(Credentials.from_args(args), round_timeout=60.0)
    params = SamplingParams()
    calls: dict[str, list[CallRecord]] = {label: [] for label in workers}
    report: dict = {"target": args.target, "k": args.k, "variants": {}}
    async with coordinator_runtime() as runtime:
        target = await runtime.compute.run(load_model, args.target)
        prompt = target.tokenizer.encode(PROMPT)
        async with DraftSources(runtime, target, access) as sources:
            floors, same_clock, identity, echoes = {}, {}, {}, {}
            for label, address in workers.items():
                connection = await sources.connection(address)
                hello = connection.hello
                echoes[label] = await grpc_echo_after_idle(connection, args.echoes, args.echo_gap_ms / 1e3)
                host = address.rsplit(":", 1)[0]
                token = access.credentials.token
                probe = await probe_tcp(host, hello.echo_port, FLOOR_SIZES, 200, 2.0, token)
                floors[label] = NetworkFloor(probe)
                same_clock[label] = args.same_clock or hello.identity.host == socket.gethostname()
                identity[label] = {"address": address, "host": hello.identity.host, "pid": hello.identity.pid}
            while min(len(c) for c in calls.values()) < args.rounds + args.warmup:
                for label, address in workers.items():  # interleaved, generation by generation
                    failover = await sources.open(DraftSpec("remote", workers=(address,), on_loss="fail"))
                    assert isinstance(failover, FailoverDraftSource)
                    assert isinstance(failover.current, StreamDraftSource)
                    decoder = SpeculativeDecoder(target, failover)
                    result = await runtime.compute.run(
                        decoder.generate, prompt, max_tokens=args.max_tokens, k=args.k, params=params
                    )
                    calls[label] += [c for r in result.rounds for c in r.draft.calls if c.kind == "round"]
    for label, records in calls.items():
        records = records[args.warmup : args.warmup + args.rounds]
        rows = [parts_of(c, same_clock[label]) for c in records]
        for row, c in zip(rows, records, strict=True):
            row["tcp floor"] = floors[label].call_ns(c.bytes_sent, c.bytes_received) / 1e3
            row["protocol"] = row["total"] - row["compute"] - row["tcp floor"]
        report["variants"][label] = {
            "worker": identity[label],
            "same_clock": same_clock[label],
            "rounds": len(rows),
            "bytes_sent_p50": float(np.median([c.bytes_sent for c in records])),
            "bytes_received_p50": float(np.median([c.bytes_received for c in records])),
            "parts_us": {k: [r[k] for r in rows] for k in rows[0]},
            "grpc_echo_after_idle_us": echoes[label],
        }
    report["echo_gap_ms"] = args.echo_gap_ms
    return report


def summary(variant: dict) -> list[tuple[str, float, float]]:
    """(part, p50, p95) in microseconds, in path order."""
    parts = variant["parts_us"]
    order = [p for p in PARTS if p in parts] + [p for p in ("transport",) if p in parts]
    order += ["total", "tcp floor", "protocol"]
    return [(p, float(np.percentile(parts[p], 50)), float(np.percentile(parts[p], 95))) for p in order]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--worker", action="append", default=[], help="HOST:PORT of a running worker to measure (repeatable)"
    )
    p.add_argument(
        "--local",
        action="store_true",
        help="start a worker on 127.0.0.1 beside the --worker ones (without --worker, one is started anyway)",
    )
    p.add_argument("--model", default="tiny", help="model of the workers this script starts")
    p.add_argument("--target", default="tiny", help="target model spec")
    p.add_argument("--k", type=int, default=4, help="draft tokens per round")
    p.add_argument("--rounds", type=int, default=400, help="rounds measured per worker")
    p.add_argument("--warmup", type=int, default=20, help="rounds run first and not counted")
    p.add_argument("--max-tokens", type=int, default=200, help="tokens per generation")
    p.add_argument("--same-clock", action="store_true", help="the workers share this host's clock")
    p.add_argument("--echoes", type=int, default=200, help="gRPC echo round trips per worker")
    p.add_argument("--echo-gap-ms", type=float, default=10.0, help="idle ms before each gRPC echo")
    p.add_argument("--json", type=Path, help="write every round's parts here")
    p.add_argument("--token-file", type=Path, help="file holding the shared token")
    p.add_argument("--insecure", action="store_true", help="the workers run --insecure")
    args = p.parse_args()
    workers = {address: address for address in args.worker}
    processes = []
    try:
        if args.local or not args.worker:
            process, address = start_worker(args.model)
            processes.append(process)
            workers[f"local {address}"] = address
        report = anyio.run(measure, args, workers)
    finally:
        for process in processes:
            process.send_signal(signal.SIGTERM)
            process.wait(30)
    print_report(report)
    if args.json:
        args.json.write_text(json.dumps(report))
    return 0


def print_report(report: dict) -> None:
    """Each worker's parts side by side, p50 and p95 in microseconds."""
    variants = report["variants"]
    print(f"k = {report['k']}, target {report['target']}; interleaved, generation by generation")
    for label, v in variants.items():
        w = v["worker"]
        print(
            f"  {label}: {v['rounds']} rounds, worker pid {w['pid']} on {w['host']}, bytes per round "
            f"{v['bytes_sent_p50']:.0f} out, {v['bytes_received_p50']:.0f} back"
        )
        v["summary"] = [{"part": n, "p50_us": a, "p95_us": b} for n, a, b in summary(v)]
    parts = [row["part"] for row in next(iter(variants.values()))["summary"]]
    width = max(22, *(len(label) + 2 for label in variants))
    print(f"{'part (µs)':<16}" + "".join(f"{label:>{width}}" for label in variants))
    print(f"{'':<16}" + "".join(f"{'p50 / p95':>{width}}" for _ in variants))
    for part in parts:
        cells = []
        for v in variants.values():
            row = next((r for r in v["summary"] if r["part"] == part), None)
            cells.append(f"{row['p50_us']:,.0f} / {row['p95_us']:,.0f}" if row else "–")
        print(f"{part:<16}" + "".join(f"{c:>{width}}" for c in cells))
    print(f"gRPC's own share: EchoStream, 64 B each way, after {report['echo_gap_ms']:g} ms idle (µs)")
    for label, v in variants.items():
        echo = np.array(v["grpc_echo_after_idle_us"])
        rows = {r["part"]: r for r in v["summary"]}
        floor, protocol = rows["tcp floor"]["p50_us"], rows["protocol"]["p50_us"]
        grpc_share = float(np.median(echo)) - floor
        print(
            f"  {label}: echo p50 {np.median(echo):,.0f} / p95 {np.percentile(echo, 95):,.0f}; of the "
            f"protocol's {protocol:,.0f} p50, gRPC's echo above the TCP floor is {grpc_share:,.0f} and the "
            f"rest, {protocol - grpc_share:,.0f}, is specwire's own"
        )
    if not all(v["same_clock"] for v in variants.values()):
        print("(a worker on another host: its transport is shown in one piece)")


if __name__ == "__main__":
    try:
        code = main()
    except SpecwireError as err:
        print(f"error: {err}", file=sys.stderr)
        code = 1
    exit_process(code)
