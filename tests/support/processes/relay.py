"""The project's delay relay (scripts/delay_relay.py) as a test subprocess, and free ports."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

RELAY = Path(__file__).resolve().parents[3] / "scripts" / "delay_relay.py"


def free_port() -> int:
    """A TCP port nothing listens on right now (the OS may hand it out again later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def delay_relay(
    delay_ms: float, maps: list[tuple[int, int]], then_delay_ms: float | None = None
) -> Iterator[subprocess.Popen[str]]:
    """Relay 127.0.0.1:listen -> 127.0.0.1:target for each pair, adding ``delay_ms`` each way (after a
    SIGHUP, ``then_delay_ms``)."""
    command = [sys.executable, str(RELAY), "--delay-ms", str(delay_ms)]
    if then_delay_ms is not None:
        command += ["--then-delay-ms", str(then_delay_ms)]
    for listen, target in maps:
        command += ["--map", f"127.0.0.1:{listen}=127.0.0.1:{target}"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        ready = json.loads(process.stdout.readline() or "{}")
        assert ready.get("event") == "ready", process.stderr.read() if process.stderr else ""
        yield process
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()
