"""Bonjour discovery on 127.0.0.1 with real workers (serving the tiny model: discovery is the point)."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys

import grpc
import pytest

from coordinator.drafting.base import Outcome
from coordinator.drafting.stream import StreamDraftSource
from coordinator.runtime import coordinator_runtime
from coordinator.workers.connection import connect
from coordinator.workers.discovery import WorkerDirectory
from specwire.drafting.sampling import SamplingParams
from specwire.errors import RemoteWorkerError
from specwire.models.loading import LoadedModel
from specwire.v1 import draft_pb2 as pb
from specwire.wire.protocol import DRAFT_METHOD, PROTOCOL_VERSION
from tests.support.credentials import channel as worker_channel
from tests.support.credentials import credentials
from tests.support.messages import open_request
from tests.support.processes.cli import one_error_line, run_cli
from tests.support.processes.workers import WorkerProcess, running_worker, unique_name

pytestmark = pytest.mark.anyio
LOOPBACK = ["127.0.0.1"]


async def test_discover_lists_worker_with_txt_matching_what_it_serves(tiny_worker: WorkerProcess) -> None:
    worker = tiny_worker
    out = run_cli("coordinator", "discover", "--interface", "127.0.0.1", "--discover-timeout", "5", "--json")
    assert out.returncode == 0, out.stderr
    listed = {w["name"]: w for w in json.loads(out.stdout)["workers"]}
    assert worker.name in listed
    row = listed[worker.name]
    connection = await connect(row["address"], credentials())
    try:
        hello = connection.hello
    finally:
        await connection.close()
    assert row["address"] == worker.address
    assert row["fingerprint"] == hello.model.fingerprint and row["fingerprint_match"] is True
    assert row["model"] == hello.model.spec
    assert row["label"] == hello.identity.label == "M1 Max (tiny)"
    assert row["backends"] == list(hello.backends)
    assert row["pid"] == hello.identity.pid == worker.pid
    assert row["draft_tok_s"] == pytest.approx(hello.draft_tokens_per_second, abs=0.01)
    assert row["protocol_version"] == hello.protocol_version == PROTOCOL_VERSION


async def test_discover_table_output(tiny_worker: WorkerProcess) -> None:
    worker = tiny_worker
    out = run_cli("coordinator", "discover", "--interface", "127.0.0.1", "--discover-timeout", "5")
    assert out.returncode == 0
    header, *rows = out.stdout.splitlines()
    assert header.split()[:3] == ["NAME", "ADDRESS", "LABEL"]
    mine = [r for r in rows if r.startswith(worker.name + " ")]
    assert len(mine) == 1 and worker.address in mine[0] and " yes " in mine[0]


async def test_sigterm_ends_sessions_and_leaves_running_browser(tiny: LoadedModel) -> None:
    name = unique_name("short-lived")
    with running_worker("--model", "tiny", "--name", name) as w:
        async with WorkerDirectory(LOOPBACK) as directory:
            assert await directory.wait_until(lambda ws: any(x.name == name for x in ws), 15)
            async with worker_channel(w.address) as channel:
                call = channel.stream_stream(DRAFT_METHOD)(timeout=60)
                await call.write(open_request(tiny.fingerprint, tiny.tokenizer.encode("Hello there")))
                kinds = [pb.DraftReply.FromString(await call.read()).WhichOneof("kind") for _ in range(2)]
                assert kinds == ["opened", "drafts"]
                w.process.send_signal(signal.SIGTERM)  # while the session waits for its next round
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await call.read()
                assert err.value.code() == grpc.StatusCode.UNAVAILABLE
                assert "shutting down" in (err.value.details() or "")
            assert w.process.wait(30) == 0
            assert await directory.wait_until(lambda ws: all(x.name != name for x in ws), 15)


async def test_drafting_from_a_stopped_worker_names_it(tiny: LoadedModel) -> None:
    with running_worker("--model", "tiny", "--name", unique_name("goes-away")) as w:
        async with coordinator_runtime() as runtime:
            connection = await connect(w.address, credentials())
            source = StreamDraftSource(runtime.portal, connection, tiny.fingerprint)
            await runtime.compute.run(source.start, tiny.tokenizer.encode("Hello there"), SamplingParams(), 2)
            first = await runtime.compute.run(source.propose, 2, None)
            assert w.stop(signal.SIGTERM) == 0
            with pytest.raises(RemoteWorkerError, match="worker goes-away"):
                await runtime.compute.run(source.propose, 2, Outcome(accepted=2, token=first.tokens[0]))
            await connection.close()


async def test_unreachable_worker_is_a_clear_error() -> None:
    with pytest.raises(RemoteWorkerError) as err:
        await connect("127.0.0.1:1", credentials(), timeout=3)
    assert err.value.code == grpc.StatusCode.UNAVAILABLE.name
    assert "unreachable" in str(err.value)


def test_mdns_on_an_interface_that_is_down_is_one_clear_error() -> None:
    # A fresh network namespace: its loopback is down, so joining the mDNS group fails.
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare (Linux) to make a namespace whose interfaces are down")
    for role, args in (
        ("coordinator", ["discover", "--discover-timeout", "1"]),
        ("coordinator", ["generate", "--target", "tiny", "--draft", "remote", "--worker", "m1-max"]),
    ):
        command = ["unshare", "-n", sys.executable, "-m", f"{role}.cli", *args, "--interface", "127.0.0.1"]
        out = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
        if "unshare failed" in out.stderr or "Operation not permitted" in out.stderr:
            pytest.skip("cannot create a network namespace here")
        assert out.returncode == 1
        # discover says what it does first (its progress lines), then the one error line.
        line = one_error_line(
            "".join(x for x in out.stderr.splitlines(True) if not x.startswith("discover: "))
        )
        assert "cannot use Bonjour (mDNS) on 127.0.0.1" in line and "--interface" in line
