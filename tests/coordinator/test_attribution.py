"""Attribution of drafting time: the arithmetic, and its validity under a known added delay.

The validity test benches the stream backend of a tiny-model worker through
the project's delay relay, REPEATS times at no added delay and REPEATS times
at 2 ms each way, interleaved, k = 1, so each run makes about 50 calls of
roughly 2 ms compute and 1-2 ms protocol (the tiny model leaves the
protocol share visible instead of burying it under 140 ms of compute). The
network share per call must rise by the added round trip (4 ms), and the
protocol and compute shares must not move, each within
max(15%, the measured noise of that share).

The noise figures (NOISE_MS) were measured on the 2-core development
machine with one core kept busy by another process (``python -c 'while
True: pass'``): ``python -m tests.coordinator.test_attribution 12``
runs this test's measurement 12 times and prints, per share, the largest
difference between the two delays that a correct attribution showed. Each
figure here is that maximum plus half again, rounded up (12 runs, 2026-11-23:
network 0.07, protocol 0.28, compute 0.68 ms; compute after the longer idle
gap of the delayed runs is the noisiest). A CI run on a clean clone
(2026-11-26) then saw compute move by 1.15 ms (1.10 -> 2.25 ms, the worker's
own timer, so the host's load and not the attribution), so the compute
figure is that plus half again. Measured again on 2026-11-28 with `yes`
keeping a core busy (12 runs: network 0.25, protocol 0.36, compute 1.22 ms),
after a busy ``make test`` saw the protocol share move by 0.46 ms (2.00 ->
1.54 ms, over the 0.45 allowed then): the protocol figure is now that 0.46
plus half again, and the network figure 0.25 plus half again. They stay below the 4 ms the
test injects: booking the delay to the protocol share, or dropping it from
the network share, fails the test by several times its tolerance.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from coordinator.attribution import CallShares, attribute, attribute_call
from coordinator.workers.netprobe import NetworkFloor, RttSummary
from specwire.wire.timing import CallRecord, ServerTiming
from tests.support.processes.cli import run_cli
from tests.support.processes.relay import delay_relay, free_port
from tests.support.processes.workers import running_worker, unique_name

ADDED_DELAY_MS = 2.0
REPEATS = 4  # bench runs per delay
MAX_TOKENS = 48
RELATIVE = 0.15
NOISE_MS = {"network": 0.4, "protocol": 0.7, "compute": 1.8}  # measured: 0.25, 0.46, 1.22 (docstring)


def summary(size: int, p50_us: float) -> RttSummary:
    return RttSummary(size, 10, p50_us, p50_us, p50_us, p50_us, p50_us)


def test_floor_interpolates_and_extrapolates() -> None:
    floor = NetworkFloor([summary(16, 100.0), summary(1016, 200.0), summary(2016, 400.0)])
    assert floor.echo_ns(16) == pytest.approx(100_000)
    assert floor.echo_ns(516) == pytest.approx(150_000)
    assert floor.echo_ns(3016) == pytest.approx(600_000)  # the last segment's slope
    assert floor.echo_ns(1) == pytest.approx(100_000)
    assert floor.call_ns(16, 2016) == pytest.approx(250_000)


def test_call_is_split_into_compute_network_and_protocol() -> None:
    floor = NetworkFloor([summary(16, 100.0), summary(4096, 100.0)])
    call = CallRecord("round", 0, 1_000_000, 5_000, 5_000, 40, 60, ServerTiming(compute_ns=600_000))
    shares = attribute_call(call, floor)
    assert (shares.compute_ns, shares.network_ns, shares.protocol_ns) == (600_000, 100_000, 300_000)
    opening = CallRecord("open", 0, 9_000_000, 0, 0, 40, 60, ServerTiming(compute_ns=1))
    total = attribute([call, call, opening], floor, draft_tokens=4, generated_tokens=5)
    assert total.calls == 2  # the session opening (prefill) is left out
    assert total.per("draft") == pytest.approx(
        {
            "calls": 0.5,
            "bytes": 50.0,
            "network_ms": 0.05,
            "protocol_ms": 0.15,
            "compute_ms": 0.3,
            "wall_ms": 0.5,
        }
    )
    assert total.per("token")["compute_ms"] == pytest.approx(0.24)


def call_shares(bench: dict) -> list[CallShares]:
    """The attributed shares of every drafting call of the remote row."""
    floor = NetworkFloor([RttSummary(**s) for s in bench["workers"][0]["probe_tcp"]])
    remote_rows = {i for i, row in enumerate(bench["rows"]) if row["kind"] == "remote"}
    shares = []
    for run in bench["runs"]:
        if run["row"] not in remote_rows:
            continue
        c = run["calls"]
        for i, kind in enumerate(c["kind"]):
            if kind == "open":
                continue
            record = CallRecord(
                kind,
                0,
                c["wall_ns"][i],
                0,
                0,
                c["bytes_sent"][i],
                c["bytes_received"][i],
                ServerTiming(compute_ns=c["worker_compute_ns"][i]),
            )
            shares.append(attribute_call(record, floor))
    return shares


def typical(shares: list[CallShares]) -> dict[str, float]:
    """Per-call network (median), protocol and compute (lower quartile), in ms.

    Scheduling noise on a shared machine only ever adds time, in a long tail;
    the lower quartile is the robust typical value of a one-sided noisy share.
    """
    assert len(shares) >= 30
    return {
        "network": float(np.median([s.network_ns for s in shares])) / 1e6,
        "protocol": float(np.percentile([s.protocol_ns for s in shares], 25)) / 1e6,
        "compute": float(np.percentile([s.compute_ns for s in shares], 25)) / 1e6,
    }


@contextmanager
def vcpus_kept_awake() -> Iterator[None]:
    """Keep every CPU busy at the lowest priority (SCHED_IDLE) while the benches run.

    On a virtual machine an idle vCPU halts, and waking it costs hundreds of
    microseconds that depend on how long it slept, so the added delay would
    change wake-up costs and blur the shares. Spinners at SCHED_IDLE keep the
    vCPUs awake and yield at once to any real work. Linux only; elsewhere a
    no-op.
    """
    if not hasattr(os, "SCHED_IDLE"):
        yield
        return
    code = "import os; os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\nwhile True: pass"
    spinners = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(os.cpu_count() or 1)]
    try:
        yield
    finally:
        for p in spinners:
            p.kill()
            p.wait()


def run_bench_through_relay(
    tmp_path: Path, delay_ms: float, worker_port: int, relay_port: int, echo: tuple[int, int]
) -> dict:
    """One bench of the stream backend (k = 1, many small rounds) through the relay."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Once upon a time, a lighthouse keeper\n")
    out = tmp_path / f"bench-{delay_ms}.json"
    with delay_relay(delay_ms, [(relay_port, worker_port), (echo[1], echo[0])]):
        result = run_cli(
            "coordinator",
            "bench",
            "--workers",
            f"127.0.0.1:{relay_port}",
            "--backend",
            "stream",
            "--local-draft",
            "none",
            "--target",
            "tiny",
            "--max-tokens",
            str(MAX_TOKENS),
            "--k",
            "1",
            "--prompts",
            str(prompts),
            "--no-chat",
            "--json",
            str(out),
            timeout=300,
        )
    assert result.returncode == 0, result.stderr
    return json.loads(out.read_text())


def measure(tmp_path: Path, repeats: int = REPEATS) -> tuple[dict[str, float], dict[str, float]]:
    """Typical shares per call (ms) with no added delay and with ADDED_DELAY_MS each way."""
    grpc_port, echo_port, relay_grpc, relay_echo = (free_port() for _ in range(4))
    worker_args = ["--model", "tiny", "--name", unique_name("relayed"), "--port", str(grpc_port)]
    worker_args += ["--echo-port", str(echo_port), "--advertise-echo-port", str(relay_echo), "--no-advertise"]
    pooled: dict[float, list[CallShares]] = {0.0: [], ADDED_DELAY_MS: []}
    with running_worker(*worker_args), vcpus_kept_awake():
        for delay in (0.0, ADDED_DELAY_MS) * repeats:  # interleaved against drift
            bench = run_bench_through_relay(tmp_path, delay, grpc_port, relay_grpc, (echo_port, relay_echo))
            pooled[delay] += call_shares(bench)
    return typical(pooled[0.0]), typical(pooled[ADDED_DELAY_MS])


def within(measured: float, expected: float, share: str) -> bool:
    """``measured`` equals ``expected`` within max(RELATIVE, the share's measured noise)."""
    return abs(measured - expected) <= max(RELATIVE * abs(expected), NOISE_MS[share])


@pytest.mark.serial
def test_added_delay_lands_in_the_network_share_only(tmp_path: Path) -> None:
    base, slow = measure(tmp_path)
    shares = f"no delay {base}, +{ADDED_DELAY_MS} ms each way {slow}"
    assert within(slow["network"] - base["network"], 2 * ADDED_DELAY_MS, "network"), shares
    assert within(slow["protocol"], base["protocol"], "protocol"), shares
    assert within(slow["compute"], base["compute"], "compute"), shares


if __name__ == "__main__":
    # The noise of each share: the largest change between the two delays over N measurements.
    import tempfile

    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    os.environ.setdefault("SPECWIRE_TOKEN", "noise-measurement-token-0123456789")
    os.environ["SPECWIRE_MDNS_INTERFACES"] = "127.0.0.1"
    worst = {"network": 0.0, "protocol": 0.0, "compute": 0.0}
    for i in range(runs):
        with tempfile.TemporaryDirectory() as tmp:
            base, slow = measure(Path(tmp))
        diff = {
            "network": slow["network"] - base["network"] - 2 * ADDED_DELAY_MS,
            "protocol": slow["protocol"] - base["protocol"],
            "compute": slow["compute"] - base["compute"],
        }
        worst = {k: max(worst[k], abs(v)) for k, v in diff.items()}
        print(f"{i + 1}/{runs}: base {base} slow {slow} diff {diff}", flush=True)
    print("largest |difference| (ms):", worst)
