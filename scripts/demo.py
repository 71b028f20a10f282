#!/usr/bin/env python3
"""The main job out of the box: two local workers, and the bench across both backends.

It starts two ``worker serve`` processes on 127.0.0.1, labelled as stand-ins
for the paper's M1 Max and M2 Pro, with Bonjour bound to 127.0.0.1, waits
until both are ready, runs ``coordinator bench --backend stream,ggml-rpc``
against them with the default model, and prints the tables. The workers are
stopped on the way out, whether the bench succeeded, failed or was
interrupted. Extra arguments go to ``coordinator bench``.

    python scripts/demo.py                      # the README's `make demo`
    python scripts/demo.py --max-tokens 200     # the paper's length
    python scripts/demo.py --fast               # the tiny model: where protocol cost shows

``--fast`` serves and benches the ``tiny`` model (seeded random weights, the
default model's tokenizer; a draft pass of about 2 ms here), both backends
and every granularity of the per-op baseline, 64 tokens per prompt: the
regime of the Macs, where a round is tens of milliseconds and the protocol's
cost decides the result.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

WORKERS = (("m1-max", "M1 Max (stand-in)"), ("m2-pro", "M2 Pro (stand-in)"))
# Short enough to finish in minutes on a CPU; the paper used 200 tokens.
DEFAULT_BENCH = ["--max-tokens", "32", "--k", "4", "--plot", "demo-bench.png", "--json", "demo-bench.json"]
FAST_BENCH = ["--target", "tiny", "--draft", "tiny", "--granularity", "op,layer,token,round"]
FAST_BENCH += ["--max-tokens", "64", "--k", "4", "--json", "demo-fast-bench.json"]
READY_TIMEOUT_S = 300.0
ENV = {**os.environ, "SPECWIRE_MDNS_INTERFACES": "127.0.0.1"}


def start_worker(name: str, label: str, model: str = "default") -> subprocess.Popen[str]:
    """Start one worker on 127.0.0.1 with mDNS on loopback."""
    command = [sys.executable, "-m", "worker.cli", "serve", "--host", "127.0.0.1", "--port", "0"]
    command += ["--interface", "127.0.0.1", "--name", name, "--label", label, "--json", "--model", model]
    return subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=ENV)


def wait_ready(process: subprocess.Popen[str], name: str) -> dict:
    """Read the worker's ready line (or fail if it exits first)."""
    assert process.stdout is not None
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            raise SystemExit(f"demo: worker {name} exited before it was ready (code {process.wait()})")
        if line.startswith("{") and json.loads(line).get("event") == "ready":
            return json.loads(line)
    raise SystemExit(f"demo: worker {name} was not ready within {READY_TIMEOUT_S:.0f} s")


def stop(processes: list[subprocess.Popen[str]]) -> None:
    """SIGTERM every worker (they send their Bonjour goodbye), then make sure they are gone."""
    for p in processes:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in processes:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def main(argv: list[str]) -> int:
    """Start the workers, run the bench, stop the workers."""
    processes: list[subprocess.Popen[str]] = []
    fast = "--fast" in argv
    argv = [a for a in argv if a != "--fast"]
    try:
        for name, label in WORKERS:
            processes.append(start_worker(name, label, "tiny" if fast else "default"))
        for (name, _), process in zip(WORKERS, processes, strict=True):
            ready = wait_ready(process, name)
            print(
                f"demo: worker {ready['name']} ready on 127.0.0.1:{ready['port']} (pid {ready['pid']})",
                flush=True,
            )
        bench = [sys.executable, "-m", "coordinator.cli", "bench", "--backend", "stream,ggml-rpc"]
        bench += ["--workers", ",".join(name for name, _ in WORKERS), "--interface", "127.0.0.1"]
        bench += [*(FAST_BENCH if fast else DEFAULT_BENCH), *argv]
        print("demo: " + " ".join(Path(a).name if i == 0 else a for i, a in enumerate(bench)), flush=True)
        return subprocess.run(bench, env=ENV, check=False).returncode
    except KeyboardInterrupt:
        print("demo: interrupted", file=sys.stderr)
        return 130
    finally:
        stop(processes)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
