"""scripts/lan_probe.py against a real worker on loopback (the tiny one: the probe times the link)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.processes.workers import WorkerProcess

PROBE = Path(__file__).resolve().parents[2] / "scripts" / "lan_probe.py"
QUICK = ["--count", "40", "--time-budget", "0.5", "--bulk-bytes", str(4 << 20)]


def run_probe(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(PROBE), *QUICK, *args], capture_output=True, text=True, timeout=300, check=False
    )


def test_raw_tcp_floor_is_below_grpc_and_json_is_valid(tiny_worker: WorkerProcess, tmp_path: Path) -> None:
    worker = tiny_worker
    out = run_probe("--host", worker.address, "--json", str(tmp_path / "probe.json"))
    assert out.returncode == 0, out.stderr
    (report,) = json.loads((tmp_path / "probe.json").read_text())["workers"]
    assert report["echo_address"].endswith(f":{worker.ready['echo_port']}")
    sizes = [s["size"] for s in report["tcp"]]
    assert sizes[0] == 16 and sizes[-1] == 1 << 20
    for tcp, unary, stream in zip(report["tcp"], report["grpc_unary"], report["grpc_stream"], strict=True):
        assert tcp["size"] == unary["size"] == stream["size"]
        assert 0 < tcp["min_us"] <= tcp["p50_us"] <= tcp["p95_us"] <= tcp["p99_us"]
        assert tcp["samples"] >= 2
    # The floor: at the smallest size, where gRPC's own work is most of an echo, raw TCP's fastest echo is
    # below both of gRPC's (fastest, not median: a busy machine moves medians, and at 1 MiB copying decides).
    tcp, unary, stream = report["tcp"][0], report["grpc_unary"][0], report["grpc_stream"][0]
    assert tcp["min_us"] < unary["min_us"] and tcp["min_us"] < stream["min_us"]
    assert report["upload_bytes_per_s"] > 0 and report["download_bytes_per_s"] > 0
    assert "unary-tcp" in out.stdout and "throughput: to worker" in out.stdout


def test_probe_finds_workers_over_bonjour(tiny_worker: WorkerProcess) -> None:
    worker = tiny_worker
    out = run_probe("--interface", "127.0.0.1", "--worker", worker.name, "--sizes", "16,4096")
    assert out.returncode == 0, out.stderr
    assert f"worker {worker.name}: gRPC {worker.address}" in out.stdout


def test_probe_without_workers_is_a_clear_error() -> None:
    out = run_probe("--interface", "127.0.0.1", "--worker", "nobody-here", "--discover-timeout", "1")
    assert out.returncode == 1
    assert out.stderr.strip().startswith("error: no worker answered on Bonjour")
