"""The shared token: refused without it everywhere, created on first start, found by coordinators.

Workers and targets serve the tiny model: authentication is the point.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import stat
import struct
from pathlib import Path

import anyio
import grpc
import pytest
from zeroconf import IPVersion
from zeroconf.asyncio import AsyncServiceInfo, AsyncZeroconf

from specwire.v1 import draft_pb2 as pb
from specwire.wire.auth import AUTH_METADATA, TOKEN_ENV, caller_proof
from specwire.wire.bonjour import SERVICE_TYPE, WorkerAdvert
from specwire.wire.echo_frames import AUTHENTICATE, ECHO, HEADER
from specwire.wire.protocol import (
    DRAFT_METHOD,
    ECHO_METHOD,
    ECHO_STREAM_METHOD,
    EXECUTE_METHOD,
    HELLO_METHOD,
    PROTOCOL_VERSION,
)
from tests.support.processes.cli import one_error_line, run_cli
from tests.support.processes.workers import WorkerProcess, running_worker, unique_name

pytestmark = pytest.mark.anyio
WRONG = "not-the-token-but-long-enough-000"
UNARY = {HELLO_METHOD: pb.HelloRequest().SerializeToString(), ECHO_METHOD: b"ping"}
STREAMS = (DRAFT_METHOD, ECHO_STREAM_METHOD, EXECUTE_METHOD)


def proofs(method: str) -> dict[str, list[tuple[str, str]] | None]:
    """No proof, a proof of the wrong token, and a proof for another method."""
    return {
        "missing": None,
        "wrong token": [(AUTH_METADATA, caller_proof(WRONG, method))],
        "other method": [(AUTH_METADATA, caller_proof(os.environ[TOKEN_ENV], "/elsewhere"))],
        "garbage": [(AUTH_METADATA, "v1:1:2:3")],
    }


async def test_every_method_refuses_calls_without_the_token(tiny_worker: WorkerProcess) -> None:
    async with grpc.aio.insecure_channel(tiny_worker.address) as channel:
        for method, payload in UNARY.items():
            for case, metadata in proofs(method).items():
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await channel.unary_unary(method)(payload, timeout=10, metadata=metadata)
                assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, (method, case)
        for method in STREAMS:
            for case, metadata in proofs(method).items():
                # The worker ends the stream before reading anything from it.
                call = channel.stream_stream(method)(timeout=10, metadata=metadata)
                assert await call.code() == grpc.StatusCode.UNAUTHENTICATED, (method, case)
        # With the token it works, and a replayed proof does not.
        good = [(AUTH_METADATA, caller_proof(os.environ[TOKEN_ENV], ECHO_METHOD))]
        assert await channel.unary_unary(ECHO_METHOD)(b"ping", timeout=10, metadata=good) == b"ping"
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await channel.unary_unary(ECHO_METHOD)(b"ping", timeout=10, metadata=good)
        assert "replayed" in (err.value.details() or "")


def echo_round_trip(port: int, proof: str | None) -> bytes:
    """The echo of b"ping", or b"" when the worker closes the connection instead."""
    try:
        return _echo(port, proof)
    except ConnectionError:
        return b""


def _echo(port: int, proof: str | None) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        if proof is not None:
            s.sendall(HEADER.pack(AUTHENTICATE, len(proof)) + proof.encode())
            s.recv(8)
        s.sendall(HEADER.pack(ECHO, 4) + b"ping")
        data = b""
        while len(data) < 12:
            chunk = s.recv(64)
            if not chunk:
                break
            data += chunk
        return data


def test_echo_port_refuses_everyone_without_the_token(tiny_worker: WorkerProcess) -> None:
    port = tiny_worker.ready["echo_port"]
    assert echo_round_trip(port, None) == b""
    assert echo_round_trip(port, caller_proof(WRONG, "/specwire.echo")) == b""
    assert (
        echo_round_trip(port, caller_proof(os.environ[TOKEN_ENV], "/specwire.echo"))
        == struct.pack(">Q", 4) + b"ping"
    )


def test_token_is_created_on_first_start_and_found_by_a_coordinator(tmp_path: Path) -> None:
    env = {"XDG_CONFIG_HOME": str(tmp_path), TOKEN_ENV: ""}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        with running_worker("--model", "tiny", "--name", unique_name("fresh")) as w:
            token_file = tmp_path / "specwire" / "token"
            assert token_file.exists() and stat.S_IMODE(token_file.stat().st_mode) == 0o600
            assert "created a new shared token in" in w.process.stderr.readline()
            # A coordinator on the same machine finds the token there.
            out = run_cli(
                "coordinator",
                "generate",
                "--prompt",
                "Hi",
                "--target",
                "tiny",
                "--max-tokens",
                "3",
                "--draft",
                "remote",
                "--worker",
                w.address,
                "--json",
            )
            assert out.returncode == 0, out.stderr
            assert json.loads(out.stdout)["stats"]["rounds"] >= 1
    finally:
        for k, v in saved.items():
            os.environ[k] = v or ""
            if v is None:
                del os.environ[k]


def test_coordinator_without_the_token_gets_a_clear_error(tiny_worker: WorkerProcess, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong-token"
    wrong.write_text(WRONG)
    out = run_cli(
        "coordinator",
        "generate",
        "--prompt",
        "Hi",
        "--target",
        "tiny",
        "--draft",
        "remote",
        "--worker",
        tiny_worker.address,
        "--token-file",
        str(wrong),
    )
    assert out.returncode == 1
    line = one_error_line(out.stderr)
    assert "UNAUTHENTICATED" in line or "wrong token" in line
    assert "worker token set TOKEN" in line and "coordinator token show" in line


async def advertise(name: str, port: int, extra: dict[str, str], fingerprint: str) -> AsyncZeroconf:
    """A Bonjour record with no real worker behind the port's proof."""
    zc = AsyncZeroconf(interfaces=["127.0.0.1"], ip_version=IPVersion.V4Only)
    advert = WorkerAdvert(
        name, ("127.0.0.1",), port, PROTOCOL_VERSION, ("stream",), "default", fingerprint, extra=extra
    )
    info = AsyncServiceInfo(
        SERVICE_TYPE,
        f"{name}.{SERVICE_TYPE}",
        addresses=[socket.inet_aton("127.0.0.1")],
        port=port,
        properties=advert.txt(),
        server="spoof.local.",
    )
    await (await zc.async_register_service(info))
    return zc


@pytest.mark.parametrize(
    ("extra", "fingerprint", "reason"),
    [
        ({"auth": "none", "tls": "0"}, "v1:828729b754d5d82c", "advertises no authentication"),
        ({"auth": "token", "tls": "0"}, "v1:0000000000000000", "differs from the target's"),
    ],
)
async def test_spoofed_advertisements_are_not_used_and_the_coordinator_says_why(
    extra: dict[str, str], fingerprint: str, reason: str
) -> None:
    name = unique_name("spoofed")
    zc = await advertise(name, 9, extra, fingerprint)
    try:  # the CLI runs on a thread so this event loop keeps answering for the spoof
        out = await anyio.to_thread.run_sync(
            functools.partial(
                run_cli,
                "coordinator",
                "generate",
                "--prompt",
                "Hi",
                "--target",
                "tiny",
                "--draft",
                "remote",
                "--worker",
                name,
                "--interface",
                "127.0.0.1",
                "--discover-timeout",
                "5",  # the spoof answers at once (2 s missed it once on a busy CI run); no better one comes
            )
        )
    finally:
        await zc.async_close()
    assert out.returncode == 1
    line = one_error_line(out.stderr)
    assert name in line and reason in line


def test_a_worker_that_cannot_prove_the_token_is_not_used(tmp_path: Path) -> None:
    # A worker without authentication answers Hello, but cannot show the token.
    with running_worker("--model", "tiny", "--name", unique_name("open"), "--insecure") as w:
        assert "warning: --insecure" in w.process.stderr.readline()
        out = run_cli(
            "coordinator",
            "generate",
            "--prompt",
            "Hi",
            "--target",
            "tiny",
            "--draft",
            "remote",
            "--worker",
            w.address,
        )
    assert out.returncode == 1
    assert "does not use the shared token" in one_error_line(out.stderr)
    # A worker holding another token refuses the coordinator's proof.
    other = tmp_path / "other-token"
    other.write_text("another-token-" + "x" * 20)
    with running_worker("--model", "tiny", "--name", unique_name("other"), "--token-file", str(other)) as w:
        out = run_cli(
            "coordinator",
            "generate",
            "--prompt",
            "Hi",
            "--target",
            "tiny",
            "--draft",
            "remote",
            "--worker",
            w.address,
        )
    assert out.returncode == 1
    assert "wrong token" in one_error_line(out.stderr)
