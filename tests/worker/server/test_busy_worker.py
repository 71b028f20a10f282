"""A busy worker still answers: Hello, health, Bonjour and admission stay prompt while sessions compute.

The worker's passes are paced to about 200 ms each (a profile file, no
large model), and eight sessions keep its compute thread busy with Rounds
the whole time. Its event loop must not wait behind that work.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager

import anyio
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from coordinator.workers.discovery import WorkerDirectory
from specwire.models.loading import LoadedModel
from specwire.v1 import draft_pb2 as pb
from specwire.v1 import draft_pb2_grpc
from specwire.wire.protocol import DRAFT_METHOD
from tests.support.credentials import ProvingChannel
from tests.support.credentials import channel as worker_channel
from tests.support.messages import open_request, refused_open, round_request
from tests.support.processes.workers import WorkerProcess, running_worker, unique_name

pytestmark = [pytest.mark.anyio, pytest.mark.serial]  # serial: it times Hello, health and a refusal

PASS_S = 0.2
SESSIONS = 8
PROMPT_S = 1.0  # the bound on Hello, health and a refusal, whatever the sessions compute
DISCOVERY_S = 2.0  # what `coordinator discover` waits by default in the tests


@pytest.fixture(scope="module")
def slow_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerProcess]:
    """A tiny worker paced to 200 ms a pass, taking at most eight sessions."""
    profile = tmp_path_factory.mktemp("busy") / "slow.json"
    slow = {"name": "slow", "target_tok_s": 100, "workers": {"slow mac": 1 / PASS_S}}
    profile.write_text(json.dumps({**slow, "mean_accepted": 1, "k": 2}))
    args = ["--model", "tiny", "--name", unique_name("busy-worker"), "--pace", f"{profile}:slow-mac"]
    with running_worker(*args, "--max-sessions", str(SESSIONS), "--warmup-tokens", "1") as w:
        yield w


async def _keep_busy(channel: ProvingChannel, fingerprint: str, drafting: anyio.Event) -> None:
    """One session that asks for a draft round after every reply, until cancelled."""
    call = channel.stream_stream(DRAFT_METHOD)(timeout=300)
    await call.write(open_request(fingerprint, k=2))
    seq = 0
    async for raw in call:
        reply = pb.DraftReply.FromString(raw)
        if reply.WhichOneof("kind") == "opened":
            continue
        drafting.set()  # a round came back: past any kernel compiled at first use (a GPU)
        seq += 1
        await call.write(round_request(seq, 0, 1, 2))


@asynccontextmanager
async def _busy_sessions(address: str, fingerprint: str) -> AsyncIterator[None]:
    """Eight sessions computing on the worker (each past its first round) for the body of the block."""
    async with worker_channel(address) as channel, anyio.create_task_group() as tg:
        drafting = [anyio.Event() for _ in range(SESSIONS)]
        for event in drafting:
            tg.start_soon(_keep_busy, channel, fingerprint, event)
        with anyio.fail_after(120):  # setting up, not a bound under test
            for event in drafting:
                await event.wait()
        yield
        tg.cancel_scope.cancel()


async def test_a_busy_worker_answers_hello_health_bonjour_and_refuses_a_ninth_at_once(
    slow_worker: WorkerProcess, tiny: LoadedModel
) -> None:
    address = slow_worker.address
    async with _busy_sessions(address, tiny.fingerprint), worker_channel(address) as channel:
        stub = draft_pb2_grpc.DraftWorkerStub(channel)
        t0 = time.perf_counter()
        hello = await stub.Hello(pb.HelloRequest(), timeout=10)
        hello_s = time.perf_counter() - t0
        assert hello.counters.sessions_active == SESSIONS
        passes = hello.counters.paced_passes
        assert hello_s < PROMPT_S, f"Hello took {hello_s:.2f} s with {SESSIONS} busy sessions"

        health = health_pb2_grpc.HealthStub(channel)
        t0 = time.perf_counter()
        status = await health.Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
        health_s = time.perf_counter() - t0
        assert status.status == health_pb2.HealthCheckResponse.SERVING
        assert health_s < PROMPT_S, f"the health check took {health_s:.2f} s"

        t0 = time.perf_counter()
        code, details = await refused_open(channel, tiny.fingerprint)
        refused_s = time.perf_counter() - t0
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, details
        assert refused_s < PROMPT_S, f"the ninth session was refused after {refused_s:.2f} s"

        async with WorkerDirectory(["127.0.0.1"]) as directory:
            t0 = time.perf_counter()
            found = await directory.wait_until(
                lambda workers: any(w.name == slow_worker.name for w in workers), DISCOVERY_S
            )
            assert found, f"not discovered within {DISCOVERY_S} s while busy"

        # the sessions were computing all along: their passes go on (each takes its paced time, so the
        # checks above may all fit between two of them)
        with anyio.fail_after(30):
            while (await stub.Hello(pb.HelloRequest(), timeout=10)).counters.paced_passes <= passes:
                await anyio.sleep(0.05)
