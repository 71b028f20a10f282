"""The emulated LAN test bed: real namespaces, bridge, shaped links and mDNS between them.

These tests need root and network namespaces; without them they skip and
say why. They use host names, a subnet and a state file of their own, so a
test bed someone left up is never touched.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from specwire.models.loading import LoadedModel
from tests.support.prompts import text_ar_tokens

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "lan_testbed"
TAG = str(os.getpid())
COORD, WORKER, OTHER = f"tbc-{TAG}", f"tbw-{TAG}", f"tbo-{TAG}"
SWITCH = f"tbs-{TAG}"
SUBNET = "198.18.78.0/24"
RATE_MBIT = 100


def _netns_usable() -> str | None:
    if os.geteuid() != 0:
        return "needs root"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "needs iproute2 (ip, tc)"
    probe = subprocess.run(
        ["ip", "netns", "add", f"tbprobe-{TAG}"], capture_output=True, text=True, check=False
    )
    if probe.returncode != 0:
        return f"cannot create network namespaces: {probe.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", f"tbprobe-{TAG}"], check=False)
    return None


REASON = _netns_usable()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"LAN test bed: {REASON}")


def run_testbed(*args: str, check: bool = True, state: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SPECWIRE_TESTBED_STATE": str(state)}
    out = subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    if check:
        assert out.returncode == 0, out.stderr
    return out


def up_args(delay: str) -> list[str]:
    return [
        "up",
        "--coordinator",
        COORD,
        "--workers",
        f"{WORKER},{OTHER}",
        "--switch-name",
        SWITCH,
        "--subnet",
        SUBNET,
        "--rate",
        f"{RATE_MBIT}mbit",
        "--delay",
        delay,
    ]


def ours() -> set[str]:
    out = subprocess.run(["ip", "-json", "netns", "list"], capture_output=True, text=True, check=False).stdout
    names = {n["name"] for n in json.loads(out)} if out.strip() else set()
    return names & {COORD, WORKER, OTHER, SWITCH}


@contextmanager
def worker_on_lan(state: Path, host: str = WORKER) -> Iterator[dict]:
    """A worker serving the tiny model on a worker host, through the test bed's exec."""
    env = {**os.environ, "SPECWIRE_TESTBED_STATE": str(state)}
    serve = [
        sys.executable,
        "-m",
        "worker.cli",
        "serve",
        "--model",
        "tiny",
        "--name",
        host,
        "--label",
        host,
        "--json",
        "--warmup-tokens",
        "2",
    ]
    process = subprocess.Popen(
        [sys.executable, str(SCRIPT), "exec", host, "--", *serve],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert process.stdout is not None
        ready = {}
        for line in process.stdout:
            if line.startswith("{") and json.loads(line).get("event") == "ready":
                ready = json.loads(line)
                break
        assert ready, "the worker on the test bed never became ready"
        yield ready
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(60)


def on_coordinator(state: Path, *command: str) -> subprocess.CompletedProcess[str]:
    return run_testbed("exec", COORD, "--", sys.executable, *command, state=state, check=False)


@pytest.fixture
def state(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "testbed.json"
    yield path
    run_testbed("down", state=path, check=False)


def test_up_is_idempotent_and_refuses_names_it_does_not_own(state: Path, tmp_path: Path) -> None:
    first = run_testbed(*up_args("0ms"), state=state)
    assert ours() == {COORD, WORKER, OTHER, SWITCH}
    assert "via relay" in first.stdout or "via netem" in first.stdout
    assert run_testbed(*up_args("0ms"), state=state).returncode == 0
    assert ours() == {COORD, WORKER, OTHER, SWITCH}
    # Another state file does not own these namespaces: it must refuse, and change nothing.
    refused = run_testbed(*up_args("0ms"), state=tmp_path / "other.json", check=False)
    assert refused.returncode == 1 and "are not this test bed's" in refused.stderr
    assert ours() == {COORD, WORKER, OTHER, SWITCH}


def probe(state: Path) -> dict:
    out = on_coordinator(
        state,
        str(SCRIPT.parent / "lan_probe.py"),
        "--worker",
        WORKER,
        "--sizes",
        "16,4096",
        "--count",
        "60",
        "--time-budget",
        "1",
        "--bulk-bytes",
        str(8 << 20),
        "--json",
        "/dev/stdout",
    )
    assert out.returncode == 0, out.stderr
    start = out.stdout.index('{\n  "workers"')
    (report,) = json.loads(out.stdout[start:])["workers"]
    return report


def test_workers_are_discovered_across_the_bridge_and_the_probe_measures_the_configured_link(
    state: Path, tiny: LoadedModel
) -> None:
    # One test bed for discovery, a lossless generation and the unshaped probe (bringing one up costs).
    run_testbed(*up_args("0ms"), state=state)
    with worker_on_lan(state) as ready, worker_on_lan(state, OTHER) as other:
        assert ready["advertised"].startswith("198.18.78.")
        found = on_coordinator(
            state, "-m", "coordinator.cli", "discover", "--discover-timeout", "2", "--json"
        )
        assert found.returncode == 0, found.stderr
        workers = {w["name"]: w for w in json.loads(found.stdout)["workers"]}
        assert workers[WORKER]["address"] == ready["advertised"] and workers[WORKER]["fingerprint_match"]
        # Both hosts share the machine's hostname: each worker must still resolve to its own address.
        assert workers[OTHER]["address"] == other["advertised"] != ready["advertised"]
        text = "The sky is blue because"
        args = ["--target", "tiny", "--max-tokens", "16", "--json", "--prompt", text]
        remote = on_coordinator(
            state, "-m", "coordinator.cli", "generate", "--draft", "remote", "--worker", WORKER, *args
        )
        assert remote.returncode == 0, remote.stderr
        assert json.loads(remote.stdout)["token_ids"] == text_ar_tokens(tiny, text, 16)
        unshaped = probe(state)
    run_testbed(*up_args("1ms"), state=state)  # different settings: torn down and rebuilt
    with worker_on_lan(state):
        delayed = probe(state)
    # Load only ever adds to a round trip, so the fastest one shows the link's delay:
    # a p50 here moved by up to 2 ms on a busy machine, the minimum by 0.05 ms.
    floor0 = unshaped["tcp"][0]["min_us"] / 1e3
    floor1 = delayed["tcp"][0]["min_us"] / 1e3
    assert floor1 == pytest.approx(2 * 1.0 + floor0, rel=0.20)
    # The shaper caps throughput at the rate (TCP payload gets ~96% of it); a busy
    # host only slows a transfer, so the cap is tight and the floor loose.
    rate = RATE_MBIT * 1e6 / 8
    for report in (unshaped, delayed):
        for direction in ("upload_bytes_per_s", "download_bytes_per_s"):
            assert 0.70 * rate <= report[direction] <= 1.02 * rate, (direction, report[direction])


def test_down_leaves_nothing_behind(state: Path) -> None:
    run_testbed(*up_args("0ms"), state=state)
    with worker_on_lan(state) as ready:
        pid = ready["pid"]
        removed = run_testbed("down", state=state)
    assert SWITCH in removed.stdout
    assert ours() == set()
    assert not Path(f"/proc/{pid}").exists()
    root_links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=False).stdout
    assert f"sw-{COORD}"[:15] not in root_links and f"sw-{WORKER}"[:15] not in root_links
    assert not state.exists()
    assert run_testbed("down", state=state).stdout.strip() == "nothing to remove"
