"""The one way to build a draft source: what to draft with, and ``DraftSources``, which opens it.

A ``DraftSpec`` says what to draft with: nothing (autoregressive), a local
draft model, or remote workers over a backend (granularity, pre-speculation,
several workers at once, what to do when a worker is lost). ``DraftSources``
opens specs against one target: it keeps the connections to workers and the
local draft models it has loaded, so a command that opens many sources
(the bench, one per row and prompt; the server, one per request) connects
and loads once. Every remote source is wrapped for worker loss
(``FailoverDraftSource``): the next compatible worker is found on Bonjour,
or a local draft model is loaded on demand.

Every command (generate, bench, serve) builds its draft sources here and
nowhere else.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace

from coordinator.drafting.base import DraftSource
from coordinator.drafting.failover import POLICIES, FailoverDraftSource
from coordinator.drafting.fill import FilledDraftSource
from coordinator.drafting.ggml_rpc.model import GRANULARITIES
from coordinator.drafting.ggml_rpc.source import PerOpDraftSource
from coordinator.drafting.local import LocalDraftSource
from coordinator.drafting.multi import MODES, MultiWorkerDraftSource
from coordinator.drafting.stream import ROUND_TIMEOUT_S, StreamDraftSource
from coordinator.pacing import CoordinatorPace
from coordinator.runtime import Runtime
from coordinator.workers.connection import WorkerConnection, connect, refresh_hello
from coordinator.workers.credentials import Credentials
from coordinator.workers.discovery import WorkerDirectory
from coordinator.workers.selection import check_worker, find_addresses, find_worker, ranked_workers
from specwire.errors import InvalidArgumentError, NoWorkerError, RemoteWorkerError
from specwire.models import LoadedModel, load_model
from specwire.protocol import BACKEND_PER_OP, BACKEND_STREAM
from specwire.v1 import draft_pb2 as pb
from specwire.vocab import ensure_same_vocabulary

DEFAULT_DISCOVER_TIMEOUT_S = 3.0
KINDS = ("none", "local", "remote")


@dataclass(frozen=True)
class DraftSpec:
    """What to draft with.

    ``workers`` selects remote workers: Bonjour names or HOST:PORT; empty
    means the fastest compatible worker discovered (with ``multi``: every
    one). ``prespec`` (stream backend only) is the PreSpeculation message to
    open sessions with; ``multi`` ("race" or "split") drafts on all chosen
    workers at once. ``fallback_draft`` is the local model used when a
    worker is lost under the ``local`` policy. ``fill`` (with ``prespec``)
    names a local draft model that drafts whatever the workers have not
    drafted ahead (``coordinator.drafting.fill``).
    """

    kind: str = "none"
    local: str = ""
    workers: tuple[str, ...] = ()
    backend: str = BACKEND_STREAM
    granularity: str = "op"
    prespec: pb.PreSpeculation | None = None
    multi: str = ""
    on_loss: str = "failover"
    fallback_draft: str = ""
    fill: str = ""

    @classmethod
    def parse(cls, text: str, **remote: object) -> DraftSpec:
        """The spec a ``--draft`` value names: ``none``, ``local:SPEC``, or ``remote`` with ``remote``."""
        kind, _, rest = text.partition(":")
        if text == "none":
            return cls("none")
        if kind == "local" and rest:
            return cls("local", local=rest)
        if text == "remote":
            return cls("remote", **remote).checked()  # type: ignore[arg-type]
        raise InvalidArgumentError(f"--draft {text!r}: expected local:SPEC, remote, or none")

    def checked(self) -> DraftSpec:
        """This spec, or ``InvalidArgumentError`` naming what does not fit together."""
        if self.kind not in KINDS:
            raise InvalidArgumentError(f"draft kind {self.kind!r}: expected one of {', '.join(KINDS)}")
        if self.backend not in (BACKEND_STREAM, BACKEND_PER_OP):
            raise InvalidArgumentError(
                f"backend {self.backend!r}: expected {BACKEND_STREAM} or {BACKEND_PER_OP}"
            )
        if self.granularity not in GRANULARITIES:
            raise InvalidArgumentError(
                f"granularity {self.granularity!r}: expected one of {', '.join(GRANULARITIES)}"
            )
        if (self.prespec is not None or self.multi) and self.backend != BACKEND_STREAM:
            raise InvalidArgumentError("--prespec and --multi-worker need the stream backend")
        if self.fill and self.prespec is None:
            raise InvalidArgumentError("--fill drafts what pre-speculation has not: it needs --prespec")
        if self.prespec is not None and self.prespec.push and not (self.fill or self.prespec.fill):
            raise InvalidArgumentError("--fill-push sends the drafts --fill makes: it needs --fill")
        if self.prespec is not None and self.prespec.tree and not (self.fill or self.prespec.fill):
            raise InvalidArgumentError("--fill-tree answers with what the tree has ready: it needs --fill")
        if self.prespec is not None and self.prespec.tree and self.multi == "split":
            raise InvalidArgumentError("--fill-tree is not split over workers: use --multi-worker race")
        if self.prespec is not None and self.prespec.tree and self.prespec.push:
            raise InvalidArgumentError("--fill-tree learns the drafts made here itself: drop --fill-push")
        if self.multi and self.multi not in MODES:
            raise InvalidArgumentError(
                f"multi-worker mode {self.multi!r}: expected one of {', '.join(MODES)}"
            )
        if self.on_loss not in POLICIES:
            raise InvalidArgumentError(
                f"--on-worker-loss {self.on_loss!r}: expected one of {', '.join(POLICIES)}"
            )
        return self


@dataclass(frozen=True)
class WorkerAccess:
    """How workers are found and reached: credentials, mDNS interfaces, deadlines.

    ``live`` is a Bonjour directory kept open by a long-running process (the
    server): lookups read it instead of browsing afresh, so a request does not
    wait seconds for answers, and workers that appear later are picked up.
    """

    credentials: Credentials = field(default_factory=Credentials)
    interfaces: object = None  # specwire.bonjour.mdns_interfaces() output
    discover_timeout: float = DEFAULT_DISCOVER_TIMEOUT_S
    round_timeout: float = ROUND_TIMEOUT_S
    live: WorkerDirectory | None = None


class DraftSources:
    """Opens draft sources for one target; owns the worker connections and local models it made."""

    def __init__(
        self,
        runtime: Runtime,
        target: LoadedModel,
        access: WorkerAccess,
        pace: CoordinatorPace | None = None,
    ) -> None:
        self.runtime = runtime
        self.target = target
        self.access = access
        self.pace = pace  # local draft models are paced as this machine's
        self.connections: dict[str, WorkerConnection] = {}
        self._replacements: list[WorkerConnection] = []  # opened after a loss, never shared
        self._models: dict[str, LoadedModel] = {}

    async def __aenter__(self) -> DraftSources:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close every connection opened."""
        connections = [*self.connections.values(), *self._replacements]
        self.connections, self._replacements = {}, []
        for connection in connections:
            await connection.close()

    # Opening.

    async def open(self, spec: DraftSpec) -> DraftSource | None:
        """The draft source ``spec`` describes (None for autoregressive decoding)."""
        spec = spec.checked()
        if spec.kind == "none":
            return None
        if spec.kind == "local":
            return LocalDraftSource(await self.local_model(spec.local))
        if spec.fill:
            filler = await self.local_model(spec.fill)
            prespec = pb.PreSpeculation()
            prespec.CopyFrom(spec.prespec)
            prespec.fill = True  # push: as the spec says (generate and serve --fill push)
            remote = await self.open(replace(spec, prespec=prespec, fill=""))
            assert remote is not None
            return FilledDraftSource(remote, filler)
        first: DraftSource
        if spec.multi:
            addresses = await find_addresses(
                list(spec.workers or ("all",)),
                self.target.fingerprint,
                self.access.interfaces,  # type: ignore[arg-type]
                self.access.discover_timeout,
                self.access.credentials,
                live=self.access.live,
            )
            first = await self._multi([await self.connection(a, spec.backend) for a in addresses], spec)
        else:
            if len(spec.workers) > 1:
                raise InvalidArgumentError("several workers draft together only with --multi-worker")
            address = await find_worker(
                spec.workers[0] if spec.workers else None,
                self.target.fingerprint,
                spec.backend,
                self.access.interfaces,  # type: ignore[arg-type]
                self.access.discover_timeout,
                self.access.credentials,
                live=self.access.live,
            )
            first = self._remote(await self.connection(address, spec.backend), spec, spec.prespec)
        local = functools.partial(self._local_now, spec.fallback_draft) if spec.fallback_draft else None
        return FailoverDraftSource(first, spec.on_loss, functools.partial(self._replacement, spec), local)

    async def connection(self, address: str, backend: str = BACKEND_STREAM) -> WorkerConnection:
        """An open connection to the worker at ``address``, checked for this target and ``backend``."""
        connection = self.connections.get(address)
        if connection is not None and self.access.live is not None:  # the worker may have restarted since
            connection = await self._refreshed(address, connection)
        if connection is None:
            connection = await connect(address, self.access.credentials)
            try:
                check_worker(connection, self.target, backend)
            except Exception:
                await connection.close()
                raise
            self.connections[address] = connection
        else:
            check_worker(connection, self.target, backend)
        return connection

    async def _refreshed(self, address: str, connection: WorkerConnection) -> WorkerConnection | None:
        """``connection`` with a fresh Hello (current process identity); None, once set aside, if it broke."""
        try:
            await refresh_hello(connection)
            return connection
        except RemoteWorkerError:
            del self.connections[address]
            self._replacements.append(connection)  # closed with the rest
            return None

    async def local_model(self, spec: str) -> LoadedModel:
        """The local draft model ``spec`` names (loaded once), checked against the target's vocabulary."""
        return await self.runtime.compute.run(self._load_local, spec)

    def _load_local(self, spec: str) -> LoadedModel:
        """Load (once) and check a local draft model; runs on the compute thread."""
        if spec not in self._models:
            model = load_model(spec)
            ensure_same_vocabulary(self.target.fingerprint, model.fingerprint, self.target.spec, model.spec)
            self._models[spec] = self.pace.draft_model(model) if self.pace is not None else model
        return self._models[spec]

    # The builders: the only place remote draft sources are constructed.

    def _remote(
        self, connection: WorkerConnection, spec: DraftSpec, prespec: pb.PreSpeculation | None
    ) -> DraftSource:
        if spec.backend == BACKEND_PER_OP:
            fp, timeout = self.target.fingerprint, self.access.round_timeout
            return PerOpDraftSource(self.runtime.portal, connection, fp, spec.granularity, timeout)
        return self._stream(connection, prespec)

    def _stream(self, connection: WorkerConnection, prespec: pb.PreSpeculation | None) -> StreamDraftSource:
        fp, timeout = self.target.fingerprint, self.access.round_timeout
        return StreamDraftSource(self.runtime.portal, connection, fp, timeout, prespec)

    async def _multi(self, connections: list[WorkerConnection], spec: DraftSpec) -> MultiWorkerDraftSource:
        """Stream sessions on every connection, raced; in ``split`` mode each pre-speculates its shard."""
        shards = len(connections) if spec.multi == "split" else 1
        sources = []
        for i, connection in enumerate(connections):
            prespec = None
            if spec.prespec is not None:
                prespec = pb.PreSpeculation()
                prespec.CopyFrom(spec.prespec)
                prespec.shard, prespec.shards = i % shards, shards
            sources.append(self._stream(connection, prespec))
        fill = spec.prespec is not None and spec.prespec.fill
        return MultiWorkerDraftSource(self.runtime.portal, sources, spec.multi, fill)

    # Recovery from worker loss; called from the compute thread.

    def _local_now(self, spec: str) -> DraftSource:
        return LocalDraftSource(self._load_local(spec))  # already on the compute thread

    def _replacement(self, spec: DraftSpec, lost: set[str]) -> DraftSource | None:
        """A source on the fastest compatible worker not already lost."""
        return self.runtime.portal.call(self._next_worker, spec, lost)

    async def _next_worker(self, spec: DraftSpec, lost: set[str]) -> DraftSource | None:
        access, creds = self.access, self.access.credentials
        candidates, _ = await ranked_workers(
            self.target.fingerprint,
            spec.backend,
            access.interfaces,  # type: ignore[arg-type]  # mdns_interfaces() output
            access.discover_timeout,
            creds,
            exclude=lost,
            live=access.live,
        )
        for advert in candidates:  # a fresh connection: the worker may have restarted on a known address
            try:
                connection = await connect(advert.address, creds)
            except Exception:  # unreachable: try the next one
                lost.add(advert.name)
                continue
            self._replacements.append(connection)
            try:
                check_worker(connection, self.target, spec.backend)
            except Exception:  # unfit: try the next one
                lost.add(advert.name)
                continue
            return self._remote(connection, spec, spec.prespec)
        raise NoWorkerError("no other compatible worker answered on Bonjour")
