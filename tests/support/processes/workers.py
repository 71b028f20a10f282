"""Real ``worker serve`` subprocesses on 127.0.0.1, with mDNS bound to 127.0.0.1."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from tests.support.processes import zygote

READY_TIMEOUT_S = 120.0


def unique_name(base: str) -> str:
    """A Bonjour name no other test run on this machine uses (runs may overlap)."""
    return f"{base}-{os.getpid()}"


@dataclass
class WorkerProcess:
    """A running worker and what its ready line said."""

    process: subprocess.Popen[str]
    ready: dict

    @property
    def port(self) -> int:
        return int(self.ready["port"])

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def name(self) -> str:
        return str(self.ready["name"])

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        """Signal the worker and wait for it to exit; returns its exit code."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


def read_ready(process: subprocess.Popen[str], what: str = "worker") -> dict:
    """Wait for the JSON ready line on stdout (or the process dying)."""
    assert process.stdout is not None
    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if not selector.select(timeout=deadline - time.monotonic()):
            break
        line = process.stdout.readline()
        if not line:
            break
        if line.startswith("{"):
            ready = json.loads(line)
            if ready.get("event") == "ready":
                return ready
    process.kill()
    stderr = process.stderr.read() if process.stderr else ""
    raise RuntimeError(f"{what} did not become ready:\n{stderr}")


@contextmanager
def running_worker(*args: str) -> Iterator[WorkerProcess]:
    """Start ``worker serve`` with ``args`` on 127.0.0.1; stop it (SIGTERM) on exit."""
    env = {**os.environ, "SPECWIRE_MDNS_INTERFACES": "127.0.0.1"}
    command = [sys.executable, "-m", "worker.cli", "serve", "--host", "127.0.0.1", "--port", "0"]
    command += ["--interface", "127.0.0.1", "--json", "--warmup-tokens", "4", *args]
    process = zygote.popen(command, env=env)
    worker = WorkerProcess(process, read_ready(process))
    try:
        yield worker
    finally:
        worker.stop()
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()
