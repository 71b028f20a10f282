"""Building the draft source a command line asks for: none, local:SPEC, or remote."""

from __future__ import annotations

import argparse
from contextlib import AsyncExitStack

from coordinator.drafting.base import DraftSource
from coordinator.drafting.ggml_rpc.model import GRANULARITIES
from coordinator.drafting.ggml_rpc.source import PerOpDraftSource
from coordinator.drafting.local import LocalDraftSource
from coordinator.drafting.stream import StreamDraftSource
from coordinator.runtime import Runtime
from coordinator.workers import WorkerConnection, connect, find_worker
from specwire.bonjour import mdns_interfaces
from specwire.errors import BackendUnavailableError, InvalidArgumentError, ProtocolVersionError
from specwire.models import LoadedModel, load_model
from specwire.protocol import BACKEND_PER_OP, BACKEND_STREAM, PROTOCOL_VERSION
from specwire.vocab import ensure_same_vocabulary

DEFAULT_DISCOVER_TIMEOUT_S = 3.0


def add_worker_arguments(p: argparse.ArgumentParser) -> None:
    """Flags that choose and reach a worker, and the drafting backend to use on it."""
    p.add_argument(
        "--backend",
        default=BACKEND_STREAM,
        choices=[BACKEND_STREAM, BACKEND_PER_OP],
        help="remote drafting backend: the stream protocol, or the GGML_RPC-style per-op baseline",
    )
    p.add_argument(
        "--granularity",
        default="op",
        choices=GRANULARITIES,
        help="ggml-rpc backend only: operations per call (one op, one block, one forward pass, one round)",
    )
    p.add_argument(
        "--worker",
        help="worker to use: its Bonjour name, or HOST:PORT (default: the best one discovered)",
    )
    p.add_argument(
        "--interface",
        help="mDNS interfaces: 'all' or comma-separated IPv4 addresses (env SPECWIRE_MDNS_INTERFACES)",
    )
    p.add_argument(
        "--discover-timeout",
        type=float,
        default=DEFAULT_DISCOVER_TIMEOUT_S,
        help="seconds to wait for workers to answer on Bonjour",
    )


async def connect_worker(
    args: argparse.Namespace, target: LoadedModel, stack: AsyncExitStack, backend: str
) -> WorkerConnection:
    """Find (or take) a worker, connect, and check it can draft for ``target``."""
    interfaces = mdns_interfaces(args.interface)
    address = await find_worker(args.worker, target.fingerprint, backend, interfaces, args.discover_timeout)
    connection = await connect(address)
    stack.push_async_callback(connection.close)
    hello = connection.hello
    if hello.protocol_version != PROTOCOL_VERSION:
        raise ProtocolVersionError(
            f"worker {connection.name} speaks protocol version {hello.protocol_version}; "
            f"this coordinator speaks {PROTOCOL_VERSION}"
        )
    if backend not in hello.backends:
        raise BackendUnavailableError(
            f"worker {connection.name} does not offer the {backend} backend "
            f"(it offers {', '.join(hello.backends) or 'none'})"
        )
    ensure_same_vocabulary(
        target.fingerprint,
        hello.model.fingerprint,
        target.spec,
        f"{hello.model.spec} on worker {connection.name}",
    )
    return connection


async def open_draft_source(
    args: argparse.Namespace, target: LoadedModel, runtime: Runtime, stack: AsyncExitStack
) -> DraftSource | None:
    """The draft source ``args.draft`` names (``none``, ``local:SPEC`` or ``remote``)."""
    spec = args.draft
    if spec == "none":
        return None
    if spec == "remote":
        connection = await connect_worker(args, target, stack, args.backend)
        if args.backend == BACKEND_PER_OP:
            return PerOpDraftSource(runtime.portal, connection, target.fingerprint, args.granularity)
        return StreamDraftSource(runtime.portal, connection, target.fingerprint)
    kind, _, rest = spec.partition(":")
    if kind == "local" and rest:
        draft = await runtime.compute.run(load_model, rest)
        ensure_same_vocabulary(target.fingerprint, draft.fingerprint, target.spec, draft.spec)
        return LocalDraftSource(draft)
    raise InvalidArgumentError(f"--draft {spec!r}: expected local:SPEC, remote, or none")
