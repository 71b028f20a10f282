#!/usr/bin/env python3
"""Soak benchmark: many concurrent sessions on one worker for minutes; everything must stay exact.

It starts one worker on 127.0.0.1 and ``--sessions`` coordinator processes
that generate through it in a loop for ``--seconds``, checking every output
against the target's own greedy output. It samples the worker's resident
memory once every client has finished its first generation (after warm-up)
and again at the end, and checks that no session is left open.

    python scripts/soak.py                      # 8 sessions, 2 minutes
    python scripts/soak.py --sessions 4 --seconds 60 --json soak.json
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio

PROMPTS = [
    "def factorial(n):\n    ",
    "The sky is blue because",
    "Once upon a time, a lighthouse keeper",
    "Question: What is 17 multiplied by 23?\nAnswer:",
]


async def client(address: str, seconds: float, index: int, max_tokens: int) -> dict:
    """One coordinator: AR references first, then generations through the worker until time is up."""
    from coordinator.decoding.engine import SpeculativeDecoder
    from coordinator.drafting.factory import DraftSources, WorkerAccess
    from coordinator.drafting.spec import DraftSpec
    from coordinator.runtime import coordinator_runtime
    from coordinator.workers.credentials import Credentials
    from specwire.drafting.sampling import SamplingParams
    from specwire.models.loading import load_model

    async with coordinator_runtime() as runtime:
        target = await runtime.compute.run(load_model, "default")
        prompts = [target.tokenizer.encode(p) for p in PROMPTS]
        greedy = SamplingParams()
        expected = [
            (
                await runtime.compute.run(
                    SpeculativeDecoder(target).generate, p, max_tokens=max_tokens, k=0, params=greedy
                )
            ).tokens
            for p in prompts
        ]
        access = WorkerAccess(Credentials.from_args(argparse.Namespace()))
        sources = DraftSources(runtime, target, access)
        source = await sources.open(DraftSpec("remote", workers=(address,), on_loss="fail"))
        decoder = SpeculativeDecoder(target, source)
        done = exact = tokens = 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            i = (index + done) % len(prompts)
            result = await runtime.compute.run(
                decoder.generate, prompts[i], max_tokens=max_tokens, k=4, params=greedy
            )
            done += 1
            exact += result.tokens == expected[i]
            tokens += len(result.tokens)
            if done == 1:
                print(json.dumps({"event": "warm", "client": index}), flush=True)
        await sources.aclose()
    return {"event": "done", "client": index, "generations": done, "lossless": exact, "tokens": tokens}


async def worker_hello(address: str) -> dict:
    from coordinator.workers.connection import connect
    from coordinator.workers.credentials import Credentials

    connection = await connect(address, Credentials.from_args(argparse.Namespace()))
    try:
        c = connection.hello.counters
        return {
            "rss_bytes": c.rss_bytes,
            "sessions_active": c.sessions_active,
            "sessions_opened": c.sessions_opened,
        }
    finally:
        await connection.close()


def main(args: argparse.Namespace) -> int:
    env = {**os.environ, "SPECWIRE_MDNS_INTERFACES": "127.0.0.1"}
    env.setdefault("SPECWIRE_TOKEN", secrets.token_urlsafe(32))
    os.environ.update(env)
    serve = [
        sys.executable,
        "-m",
        "worker.cli",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--no-advertise",
    ]
    serve += ["--max-sessions", str(args.sessions), "--json"]
    worker = subprocess.Popen(serve, stdout=subprocess.PIPE, text=True, env=env)
    clients: list[subprocess.Popen[str]] = []
    try:
        assert worker.stdout is not None
        ready = json.loads(worker.stdout.readline())
        address = f"127.0.0.1:{ready['port']}"
        for i in range(args.sessions):
            command = [
                sys.executable,
                __file__,
                "--client",
                address,
                "--index",
                str(i),
                "--seconds",
                str(args.seconds),
            ]
            command += ["--max-tokens", str(args.max_tokens)]
            clients.append(subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env))
        for c in clients:
            assert c.stdout is not None
            json.loads(c.stdout.readline())  # warm
        warm = anyio.run(worker_hello, address)
        results = []
        for c in clients:
            assert c.stdout is not None
            results.append(json.loads(c.stdout.readline()))
            c.wait()
        end = anyio.run(worker_hello, address)
        for _ in range(50):  # a stream's end reaches the worker a moment after the client exits
            if end["sessions_active"] == 0:
                break
            time.sleep(0.1)
            end = anyio.run(worker_hello, address)
    finally:
        for c in clients:
            if c.poll() is None:
                c.kill()
        worker.send_signal(signal.SIGTERM)
        worker.wait(30)
    generations = sum(r["generations"] for r in results)
    lossless = sum(r["lossless"] for r in results)
    growth = end["rss_bytes"] / warm["rss_bytes"] - 1 if warm["rss_bytes"] else float("nan")
    report = {
        "sessions": args.sessions,
        "seconds": args.seconds,
        "generations": generations,
        "lossless": lossless,
        "tokens": sum(r["tokens"] for r in results),
        "worker_rss_after_warmup_mb": warm["rss_bytes"] / 2**20,
        "worker_rss_at_end_mb": end["rss_bytes"] / 2**20,
        "rss_growth": growth,
        "sessions_left_open": end["sessions_active"],
        "sessions_opened": end["sessions_opened"],
    }
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    ok = lossless == generations and abs(growth) <= 0.10 and end["sessions_active"] == 0
    print("soak: " + ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sessions", type=int, default=8, help="concurrent sessions")
    parser.add_argument("--seconds", type=float, default=120.0, help="how long each session generates")
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens per generation")
    parser.add_argument("--json", type=Path, help="write the report here")
    parser.add_argument("--client", help=argparse.SUPPRESS)
    parser.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    parsed = parser.parse_args()
    if parsed.client:
        print(
            json.dumps(anyio.run(client, parsed.client, parsed.seconds, parsed.index, parsed.max_tokens)),
            flush=True,
        )
        os._exit(0)
    sys.exit(main(parsed))
