"""Building the draft source a command line asks for: none, local:SPEC, or remote.

A remote source is wrapped for worker loss (``--on-worker-loss``): the
``WorkerPool`` finds the next compatible worker on Bonjour when the current
one fails, and a local draft model is loaded on demand for the ``local``
policy.
"""

from __future__ import annotations

import argparse
from contextlib import AsyncExitStack
from dataclasses import dataclass, field

from coordinator.credentials import Credentials, add_credential_arguments
from coordinator.discovery import WorkerDirectory
from coordinator.drafting.base import DraftSource
from coordinator.drafting.failover import POLICIES, FailoverDraftSource
from coordinator.drafting.ggml_rpc.model import GRANULARITIES
from coordinator.drafting.ggml_rpc.source import PerOpDraftSource
from coordinator.drafting.local import LocalDraftSource
from coordinator.drafting.multi import DEFAULT_MODE, MODES, MultiWorkerDraftSource
from coordinator.drafting.stream import ROUND_TIMEOUT_S, StreamDraftSource
from coordinator.runtime import Runtime
from coordinator.workers import WorkerConnection, connect, find_addresses, find_worker, incompatibility
from specwire.bonjour import mdns_interfaces
from specwire.errors import BackendUnavailableError, InvalidArgumentError, NoWorkerError, ProtocolVersionError
from specwire.models import LoadedModel, load_model
from specwire.protocol import BACKEND_PER_OP, BACKEND_STREAM, PROTOCOL_VERSION
from specwire.speculation import ALLOCATIONS
from specwire.v1 import draft_pb2 as pb
from specwire.vocab import ensure_same_vocabulary

DEFAULT_DISCOVER_TIMEOUT_S = 3.0
FALLBACK_DRAFT = "default"


def add_worker_arguments(p: argparse.ArgumentParser) -> None:
    """Flags that choose and reach a worker, the drafting backend, and what to do if it is lost."""
    add_credential_arguments(p)
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
        "--worker", help="worker to use: its Bonjour name, or HOST:PORT (default: the best discovered)"
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
    add_worker_loss_arguments(p)
    p.add_argument("--local-draft", default=FALLBACK_DRAFT, help="draft model for --on-worker-loss local")
    p.add_argument(
        "--prespec",
        action="store_true",
        help="stream backend: the worker drafts the next round ahead while the target verifies",
    )
    add_prespec_arguments(p)
    p.add_argument(
        "--multi-worker",
        nargs="?",
        const=DEFAULT_MODE,
        choices=MODES,
        help=f"draft on several workers at once (--worker a,b or all discovered), first reply wins: "
        f"race them on the same branches (the default, {DEFAULT_MODE}) or split the pre-speculation "
        "fan-out over them",
    )


def add_prespec_arguments(p: argparse.ArgumentParser) -> None:
    """Per-session overrides of a worker's pre-speculation settings (unset: the worker's own)."""
    p.add_argument("--prespec-budget", type=int, default=0, help="speculative forward passes per round")
    p.add_argument("--prespec-fanout", type=int, default=0, help="candidate tokens per position")
    p.add_argument(
        "--prespec-min-drafts",
        type=int,
        default=0,
        help="take a branch's drafts at once when this many are ready, even if fewer than k",
    )
    p.add_argument(
        "--prespec-allocation",
        default="",
        choices=["", *ALLOCATIONS],
        help="how the budget is split over outcomes",
    )


def prespec_request(args: argparse.Namespace, min_drafts: int = 0) -> pb.PreSpeculation:
    """The PreSpeculation message of the command line's overrides (enabled); ``min_drafts`` wins if set."""
    return pb.PreSpeculation(
        enabled=True,
        budget=args.prespec_budget,
        fanout=args.prespec_fanout,
        allocation=args.prespec_allocation,
        min_drafts=min_drafts or args.prespec_min_drafts,
    )


def add_worker_loss_arguments(p: argparse.ArgumentParser) -> None:
    """Flags for how long to wait for a worker, and what to do when it is lost."""
    p.add_argument(
        "--on-worker-loss",
        default="failover",
        choices=POLICIES,
        help="when a worker dies or stalls: next worker (then AR), local drafting, AR, or stop",
    )
    p.add_argument(
        "--round-timeout", type=float, default=ROUND_TIMEOUT_S, help="seconds to wait for a worker's reply"
    )


def check_worker(connection: WorkerConnection, target: LoadedModel, backend: str) -> None:
    """Raise unless the connected worker can draft for ``target`` over ``backend``."""
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


@dataclass
class RemoteSettings:
    """How remote sources are built: backend, granularity, credentials, deadlines."""

    backend: str
    granularity: str
    credentials: Credentials
    round_timeout: float
    interfaces: object = None
    discover_timeout: float = DEFAULT_DISCOVER_TIMEOUT_S
    prespec: pb.PreSpeculation | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RemoteSettings:
        """From the command line's worker flags."""
        return cls(
            backend=args.backend,
            granularity=args.granularity,
            credentials=Credentials.from_args(args),
            round_timeout=args.round_timeout,
            interfaces=mdns_interfaces(args.interface),
            discover_timeout=args.discover_timeout,
            prespec=prespec_request(args) if args.prespec else None,
        )


def remote_source(
    runtime: Runtime, connection: WorkerConnection, target: LoadedModel, s: RemoteSettings
) -> DraftSource:
    """A draft source on ``connection`` for the chosen backend."""
    if s.backend == BACKEND_PER_OP:
        return PerOpDraftSource(
            runtime.portal, connection, target.fingerprint, s.granularity, s.round_timeout
        )
    return StreamDraftSource(runtime.portal, connection, target.fingerprint, s.round_timeout, s.prespec)


@dataclass
class WorkerPool:
    """Finds the next compatible worker on Bonjour when one is lost; closes what it opened."""

    runtime: Runtime
    target: LoadedModel
    settings: RemoteSettings
    connections: list[WorkerConnection] = field(default_factory=list)

    def next_source(self, lost: set[str]) -> DraftSource | None:
        """A source on the fastest compatible worker not already lost (called from the compute thread)."""
        return self.runtime.portal.call(self._next, lost)

    async def _next(self, lost: set[str]) -> DraftSource | None:
        s = self.settings
        fp, backend, creds = self.target.fingerprint, s.backend, s.credentials

        def usable(ws: list) -> list:
            return [w for w in ws if w.name not in lost and incompatibility(w, fp, backend, creds) is None]

        async with WorkerDirectory(s.interfaces) as directory:  # type: ignore[arg-type]
            await directory.wait_until(lambda ws: bool(usable(ws)), s.discover_timeout)
            candidates = sorted(usable(directory.workers()), key=lambda w: -w.draft_tps)
        for advert in candidates:
            try:
                connection = await connect(advert.address, creds)
                check_worker(connection, self.target, backend)
            except Exception:  # unreachable or unfit: try the next one
                lost.add(advert.name)
                continue
            self.connections.append(connection)
            return remote_source(self.runtime, connection, self.target, s)
        raise NoWorkerError("no other compatible worker answered on Bonjour")

    async def aclose(self) -> None:
        """Close every connection the pool opened."""
        for connection in self.connections:
            await connection.close()


async def connect_worker(
    args: argparse.Namespace, target: LoadedModel, stack: AsyncExitStack, backend: str
) -> WorkerConnection:
    """Find (or take) a worker, connect, and check it can draft for ``target``."""
    interfaces = mdns_interfaces(args.interface)
    credentials = Credentials.from_args(args)
    address = await find_worker(
        args.worker, target.fingerprint, backend, interfaces, args.discover_timeout, credentials
    )
    connection = await connect(address, credentials)
    stack.push_async_callback(connection.close)
    check_worker(connection, target, backend)
    return connection


async def multi_worker_source(
    args: argparse.Namespace, target: LoadedModel, runtime: Runtime, stack: AsyncExitStack, s: RemoteSettings
) -> MultiWorkerDraftSource:
    """Stream sessions on every chosen worker (``--worker a,b`` or all discovered), raced."""
    if s.backend != BACKEND_STREAM:
        raise InvalidArgumentError("--multi-worker drafts over the stream backend only")
    selectors = [w.strip() for w in (args.worker or "all").split(",") if w.strip()]
    addresses = await find_addresses(
        selectors,
        target.fingerprint,
        s.interfaces,  # type: ignore[arg-type]  # mdns_interfaces() output
        s.discover_timeout,
        s.credentials,
    )
    sources = []
    shards = len(addresses) if args.multi_worker == "split" else 1
    for i, address in enumerate(addresses):
        connection = await connect(address, s.credentials)
        stack.push_async_callback(connection.close)
        check_worker(connection, target, BACKEND_STREAM)
        prespec = pb.PreSpeculation()
        if s.prespec is not None:
            prespec.CopyFrom(s.prespec)
            prespec.shard, prespec.shards = i % shards, shards
        sources.append(
            StreamDraftSource(
                runtime.portal,
                connection,
                target.fingerprint,
                s.round_timeout,
                prespec if s.prespec else None,
            )
        )
    return MultiWorkerDraftSource(runtime.portal, sources, args.multi_worker)


async def open_draft_source(
    args: argparse.Namespace, target: LoadedModel, runtime: Runtime, stack: AsyncExitStack
) -> DraftSource | None:
    """The draft source ``args.draft`` names (``none``, ``local:SPEC`` or ``remote``)."""
    spec = args.draft
    if spec == "none":
        return None
    if spec == "remote":
        if (args.prespec or args.multi_worker) and args.backend != BACKEND_STREAM:
            raise InvalidArgumentError("--prespec and --multi-worker need the stream backend")
        settings = RemoteSettings.from_args(args)
        pool = WorkerPool(runtime, target, settings)
        stack.push_async_callback(pool.aclose)

        def local() -> DraftSource:
            return LocalDraftSource(load_model(args.local_draft))  # runs on the compute thread

        first: DraftSource
        if args.multi_worker:
            first = await multi_worker_source(args, target, runtime, stack, settings)
        else:
            connection = await connect_worker(args, target, stack, args.backend)
            first = remote_source(runtime, connection, target, settings)
        return FailoverDraftSource(first, args.on_worker_loss, pool.next_source, local)
    kind, _, rest = spec.partition(":")
    if kind == "local" and rest:
        draft = await runtime.compute.run(load_model, rest)
        ensure_same_vocabulary(target.fingerprint, draft.fingerprint, target.spec, draft.spec)
        return LocalDraftSource(draft)
    raise InvalidArgumentError(f"--draft {spec!r}: expected local:SPEC, remote, or none")
