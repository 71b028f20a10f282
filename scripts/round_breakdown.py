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

    python scripts/round_breakdown.py                         # a local tiny worker, k = 4
    python scripts/round_breakdown.py --rounds 1000 --json breakdown.json
    sudo .venv/bin/python scripts/lan_testbed exec m2-ultra -- \\
        .venv/bin/python scripts/round_breakdown.py --worker 198.18.77.2:PORT
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import anyio
import numpy as np
from anyio.from_thread import BlockingPortal

from coordinator.decoding.engine import SpeculativeDecoder
from coordinator.drafting.factory import DraftSources, DraftSpec, WorkerAccess
from coordinator.drafting.failover import FailoverDraftSource
from coordinator.drafting.stream import StreamDraftSource
from coordinator.runtime import Runtime, coordinator_runtime
from coordinator.workers.credentials import Credentials
from coordinator.workers.netprobe import NetworkFloor, probe_tcp
from specwire.command_line import exit_process
from specwire.errors import SpecwireError
from specwire.models import load_model
from specwire.sampling import SamplingParams
from specwire.timing import CallRecord

PROMPT = "Once upon a time, a lighthouse keeper"
VARIANTS = ("before", "after")
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


def start_worker(model: str) -> tuple[subprocess.Popen[str], str]:
    """A worker on 127.0.0.1 serving ``model``, not advertised; returns it and its address."""
    command = [sys.executable, "-m", "worker.cli", "serve", "--host", "127.0.0.1", "--port", "0"]
    command += ["--model", model, "--no-advertise", "--json", "--warmup-tokens", "2"]
    command += ["--name", f"breakdown-{os.getpid()}"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith("{") and json.loads(line).get("event") == "ready":
            return process, f"127.0.0.1:{json.loads(line)['port']}"
    raise SystemExit(f"round_breakdown: the worker exited before it was ready (code {process.wait()})")


async def measure(args: argparse.Namespace, address: str) -> dict:
    """Rounds through the worker at ``address``; every part of every round, and the floor."""
    access = WorkerAccess(Credentials.from_args(args), round_timeout=60.0)
    spec = DraftSpec("remote", workers=(address,), on_loss="fail")
    params = SamplingParams()
    variants = VARIANTS if args.compare else VARIANTS[1:]
    calls: dict[str, list[CallRecord]] = {v: [] for v in variants}
    async with coordinator_runtime() as runtime, BlockingPortal() as anyio_portal:
        target = await runtime.compute.run(load_model, args.target)
        runtimes = {"before": Runtime(runtime.compute, anyio_portal), "after": runtime}  # type: ignore[arg-type]
        async with DraftSources(runtime, target, access) as sources:
            connection = await sources.connection(address)
            hello = connection.hello
            host = address.rsplit(":", 1)[0]
            token = access.credentials.token
            floor_probe = await probe_tcp(host, hello.echo_port, FLOOR_SIZES, 200, 2.0, token)
            same_clock = args.same_clock or (hello.identity.host == socket.gethostname())
            prompt = target.tokenizer.encode(PROMPT)
            while min(len(c) for c in calls.values()) < args.rounds + args.warmup:
                for variant in variants:  # interleaved, generation by generation
                    sources.runtime = runtimes[variant]
                    failover = await sources.open(spec)
                    assert isinstance(failover, FailoverDraftSource)
                    assert isinstance(failover.current, StreamDraftSource)
                    decoder = SpeculativeDecoder(target, failover)
                    result = await runtime.compute.run(
                        decoder.generate, prompt, max_tokens=args.max_tokens, k=args.k, params=params
                    )
                    calls[variant] += [c for r in result.rounds for c in r.draft.calls if c.kind == "round"]
    floor = NetworkFloor(floor_probe)
    report: dict = {
        "worker": {"address": address, "host": hello.identity.host, "pid": hello.identity.pid},
        "target": args.target,
        "k": args.k,
        "same_clock": same_clock,
        "variants": {},
    }
    for variant, records in calls.items():
        records = records[args.warmup : args.warmup + args.rounds]
        rows = [parts_of(c, same_clock) for c in records]
        for row, c in zip(rows, records, strict=True):
            row["tcp floor"] = floor.call_ns(c.bytes_sent, c.bytes_received) / 1e3
            row["protocol"] = row["total"] - row["compute"] - row["tcp floor"]
        report["variants"][variant] = {
            "rounds": len(rows),
            "bytes_sent_p50": float(np.median([c.bytes_sent for c in records])),
            "bytes_received_p50": float(np.median([c.bytes_received for c in records])),
            "parts_us": {k: [r[k] for r in rows] for k in rows[0]},
        }
    return report


def summary(variant: dict) -> list[tuple[str, float, float]]:
    """(part, p50, p95) in microseconds, in path order."""
    parts = variant["parts_us"]
    order = [p for p in PARTS if p in parts] + [p for p in ("transport",) if p in parts]
    order += ["total", "tcp floor", "protocol"]
    return [(p, float(np.percentile(parts[p], 50)), float(np.percentile(parts[p], 95))) for p in order]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worker", help="HOST:PORT of a running worker (default: start one on 127.0.0.1)")
    p.add_argument("--model", default="tiny", help="model of the worker this script starts")
    p.add_argument("--target", default="tiny", help="target model spec")
    p.add_argument("--k", type=int, default=4, help="draft tokens per round")
    p.add_argument("--rounds", type=int, default=400, help="rounds measured")
    p.add_argument("--warmup", type=int, default=20, help="rounds run first and not counted")
    p.add_argument("--max-tokens", type=int, default=200, help="tokens per generation")
    p.add_argument("--same-clock", action="store_true", help="the worker shares this host's clock")
    p.add_argument(
        "--compare",
        action="store_true",
        help="interleave generations through anyio's BlockingPortal (the hop before the fast-regime "
        "cut) with generations through the current LoopPortal, and show both",
    )
    p.add_argument("--json", type=Path, help="write every round's parts here")
    p.add_argument("--token-file", type=Path, help="file holding the shared token")
    p.add_argument("--insecure", action="store_true", help="the worker runs --insecure")
    args = p.parse_args()
    process = None
    address = args.worker
    if address is None:
        process, address = start_worker(args.model)
    try:
        report = anyio.run(measure, args, address)
    finally:
        if process is not None:
            process.send_signal(signal.SIGTERM)
            process.wait(30)
    variants = report["variants"]
    first = next(iter(variants.values()))
    print(
        f"{first['rounds']} rounds per variant, k = {report['k']}, target {report['target']}, worker "
        f"{address} (pid {report['worker']['pid']}); bytes per round {first['bytes_sent_p50']:.0f} out, "
        f"{first['bytes_received_p50']:.0f} back"
    )
    tables = {v: summary(variants[v]) for v in variants}
    header = "".join(f"{v + ' p50':>14}{v + ' p95':>14}" for v in variants)
    print(f"{'part (µs)':<16}{header}")
    for i, (name, _, _) in enumerate(next(iter(tables.values()))):
        cells = "".join(f"{tables[v][i][1]:>14.1f}{tables[v][i][2]:>14.1f}" for v in variants)
        print(f"{name:<16}{cells}")
    if not report["same_clock"]:
        print("(the worker is on another host: the transport is shown in one piece)")
    if "before" in variants:
        print(
            "before: the compute thread reaches the event loop through anyio's BlockingPortal; "
            "after: LoopPortal"
        )
    if args.json:
        for v in variants:
            variants[v]["summary"] = [{"part": n, "p50_us": a, "p95_us": b} for n, a, b in tables[v]]
        args.json.write_text(json.dumps(report))
    return 0


if __name__ == "__main__":
    try:
        code = main()
    except SpecwireError as err:
        print(f"error: {err}", file=sys.stderr)
        code = 1
    exit_process(code)
