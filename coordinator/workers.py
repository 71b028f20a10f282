"""Choosing a worker and connecting to it.

A worker is named on the command line as ``HOST:PORT`` (no discovery) or by
its Bonjour name, or chosen automatically: among discovered workers that
speak this protocol version, offer the backend and share the target's
vocabulary, the one with the highest advertised draft speed. Connecting
calls Hello, so every connection starts with the worker's identity in hand.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import anyio
import grpc
import msgpack
from zeroconf import InterfaceChoice

from coordinator.credentials import Credentials
from coordinator.discovery import WorkerDirectory
from coordinator.rpc_errors import remote_error
from specwire.auth import AUTH_METADATA, caller_proof, check_worker_proof
from specwire.bonjour import WorkerAdvert
from specwire.errors import AuthenticationError, NoWorkerError
from specwire.protocol import BACKEND_STREAM, HELLO_METHOD, PROTOCOL_VERSION
from specwire.v1 import draft_pb2 as pb
from specwire.v1 import draft_pb2_grpc

HELLO_TIMEOUT_S = 10.0
SETTLE_S = 0.5
_HOST_PORT = re.compile(r"^\[?[\w.:-]+\]?:\d+$")


@dataclass
class WorkerConnection:
    """An open channel to a worker, and what the worker said about itself."""

    address: str
    channel: grpc.aio.Channel
    hello: pb.HelloReply
    credentials: Credentials

    @property
    def name(self) -> str:
        """The worker's instance name."""
        return self.hello.identity.name or self.address

    def model_config(self) -> dict[str, Any]:
        """The draft model's structure, as the worker's Hello sent it."""
        return (
            dict(msgpack.unpackb(self.hello.model.config_msgpack)) if self.hello.model.config_msgpack else {}
        )

    def identity(self) -> dict[str, Any]:
        """Name, label, host, pid and boot id: the proof of which process drafted."""
        ident = self.hello.identity
        return {
            "name": ident.name,
            "label": ident.label,
            "host": ident.host,
            "pid": ident.pid,
            "boot_id": ident.boot_id,
            "address": self.address,
        }

    async def close(self) -> None:
        """Close the channel."""
        await self.channel.close()


async def connect(
    address: str, credentials: Credentials, timeout: float = HELLO_TIMEOUT_S
) -> WorkerConnection:
    """Open a channel to ``address``, call Hello, and check the worker holds the shared token."""
    channel = credentials.channel(address)
    proof = caller_proof(credentials.token, HELLO_METHOD) if credentials.token else ""
    metadata = [(AUTH_METADATA, proof)] if proof else None
    try:
        hello = await draft_pb2_grpc.DraftWorkerStub(channel).Hello(
            pb.HelloRequest(), timeout=timeout, metadata=metadata
        )
    except grpc.RpcError as err:
        await channel.close()
        raise remote_error(err, address, "saying hello") from err
    try:
        _check_worker_proof(address, hello, credentials, proof)
    except AuthenticationError:
        await channel.close()
        raise
    return WorkerConnection(address, channel, hello, credentials)


def _check_worker_proof(address: str, hello: pb.HelloReply, credentials: Credentials, proof: str) -> None:
    name = hello.identity.name or address
    if credentials.token is None:
        return
    if not hello.auth_proof:
        raise AuthenticationError(
            f"worker {name} at {address} does not use the shared token (it runs --insecure); "
            "not used: pass --insecure to allow it"
        )
    if not check_worker_proof(credentials.token, proof, hello.auth_proof):
        raise AuthenticationError(
            f"worker {name} at {address} could not prove it holds the shared token "
            "(a spoofed advertisement, or another token); not used"
        )


async def refresh_hello(connection: WorkerConnection, timeout: float = HELLO_TIMEOUT_S) -> pb.HelloReply:
    """Ask the worker for its Hello again (fresh counters and memory figures)."""
    try:
        hello = await draft_pb2_grpc.DraftWorkerStub(connection.channel).Hello(
            pb.HelloRequest(), timeout=timeout, metadata=connection.credentials.metadata(HELLO_METHOD)
        )
    except grpc.RpcError as err:
        raise remote_error(err, connection.name, "saying hello") from err
    connection.hello = hello
    return hello


def incompatibility(
    advert: WorkerAdvert, fingerprint: str, backend: str, credentials: Credentials | None = None
) -> str | None:
    """Why ``advert`` cannot draft for this target, or None when it can."""
    auth, tls = advert.extra.get("auth", "none"), advert.extra.get("tls", "0")
    if credentials is not None and not credentials.insecure and auth != "token":
        return "advertises no authentication (possibly spoofed); pass --insecure to allow it"
    if credentials is not None and credentials.tls_ca is not None and tls != "1":
        return "does not serve TLS"
    if advert.protocol_version != PROTOCOL_VERSION:
        return f"protocol version {advert.protocol_version}, need {PROTOCOL_VERSION}"
    if backend not in advert.backends:
        return f"does not offer the {backend} backend (offers {', '.join(advert.backends) or 'none'})"
    if advert.fingerprint != fingerprint:
        return f"vocabulary {advert.fingerprint} differs from the target's {fingerprint}"
    if not advert.addresses:
        return "advertises no IPv4 address"
    return None


def choose(
    adverts: list[WorkerAdvert],
    fingerprint: str,
    backend: str,
    name: str | None = None,
    credentials: Credentials | None = None,
) -> WorkerAdvert:
    """The fastest compatible worker (or the one named), else ``NoWorkerError`` with every reason."""
    pool = [a for a in adverts if name is None or a.name == name]
    usable = [a for a in pool if incompatibility(a, fingerprint, backend, credentials) is None]
    if usable:
        return max(usable, key=lambda a: a.draft_tps)
    if name is not None and not pool:
        raise NoWorkerError(f"no worker named {name!r} answered on Bonjour")
    reasons = "; ".join(f"{a.name}: {incompatibility(a, fingerprint, backend, credentials)}" for a in pool)
    raise NoWorkerError(
        "no compatible worker found" + (f" ({reasons})" if reasons else " (none answered on Bonjour)")
    )


def is_address(selector: str) -> bool:
    """True for ``HOST:PORT`` selectors, which skip discovery."""
    return bool(_HOST_PORT.match(selector))


async def find_worker(
    selector: str | None,
    fingerprint: str,
    backend: str,
    interfaces: InterfaceChoice | list[str],
    timeout: float,
    credentials: Credentials | None = None,
) -> str:
    """The address to use: ``selector`` itself if it is HOST:PORT, else a discovered worker's."""
    if selector and is_address(selector):
        return selector

    def found(workers: list[WorkerAdvert]) -> bool:
        return any(
            (selector is None or w.name == selector)
            and incompatibility(w, fingerprint, backend, credentials) is None
            for w in workers
        )

    async with WorkerDirectory(interfaces) as directory:
        if await directory.wait_until(found, timeout) and selector is None:
            await anyio.sleep(SETTLE_S)  # let the other workers' answers arrive before choosing
        return choose(directory.workers(), fingerprint, backend, selector, credentials).address


async def find_addresses(
    selectors: list[str],
    fingerprint: str,
    interfaces: InterfaceChoice | list[str],
    timeout: float,
    credentials: Credentials,
) -> list[str]:
    """Addresses of the workers to bench: HOST:PORT as given, names (or ``all``) through Bonjour."""
    addresses = [s for s in selectors if is_address(s)]
    names = [s for s in selectors if not is_address(s)]
    if not names:
        return addresses
    async with WorkerDirectory(interfaces) as directory:
        if "all" in names:
            await directory.wait_until(
                lambda ws: False, timeout
            )  # collect every answer for the whole timeout
        else:
            await directory.wait_until(lambda ws: set(names) <= {w.name for w in ws}, timeout)
        found = directory.workers()
    chosen = [w for w in found if "all" in names or w.name in names]
    missing = [n for n in names if n != "all" and n not in {w.name for w in found}]
    if missing:
        raise NoWorkerError(f"no worker named {', '.join(missing)} answered on Bonjour")
    usable = [w for w in chosen if incompatibility(w, fingerprint, BACKEND_STREAM, credentials) is None]
    if not usable and not addresses:
        reasons = "; ".join(
            f"{w.name}: {incompatibility(w, fingerprint, BACKEND_STREAM, credentials)}" for w in chosen
        )
        raise NoWorkerError("no compatible worker found" + (f" ({reasons})" if reasons else ""))
    return addresses + [w.address for w in usable]
