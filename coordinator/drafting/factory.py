"""The one way to build a draft source: ``DraftSources``, which opens what a ``DraftSpec`` names.

A ``DraftSpec`` (``coordinator.drafting.spec``) says what to draft with: nothing (autoregressive), a local
draft model, a worker in one of the stream protocol's modes or over the
per-op backend (and what to do when it is lost), or ``auto``: the drafting
policy, which chooses among all of these (``coordinator.drafting.auto``).
``DraftSources`` opens specs against one target: it keeps the connections
to workers, the local draft models it has loaded and, for auto, this
machine's measurements, so a command that opens many sources (the bench, one
per row and prompt; the server, one per request) connects, loads and
measures once. A remote source of one mode is wrapped for worker loss
(``FailoverDraftSource``): the next compatible worker is found on Bonjour,
or a local draft model is loaded on demand; auto recovers by itself.

Every command (generate, bench, serve) builds its draft sources here and
nowhere else.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace

from coordinator.drafting.auto.policy import AutoDraftSource
from coordinator.drafting.base import DraftSource
from coordinator.drafting.failover import FailoverDraftSource
from coordinator.drafting.fill import FilledDraftSource
from coordinator.drafting.ggml_rpc.source import PerOpDraftSource
from coordinator.drafting.local import LocalDraftSource
from coordinator.drafting.local_tree import LocalTreeDraftSource, VerifyCurve, measure_verify_curve
from coordinator.drafting.remote_tree import RemoteTreeDraftSource
from coordinator.drafting.spec import FILLED, TREE_VERIFY, DraftSpec, prespec_for
from coordinator.drafting.stream import ROUND_TIMEOUT_S, StreamDraftSource
from coordinator.pacing import CoordinatorPace
from coordinator.planning.ahead.tree_verify import miss_round_s, miss_shape, tree_rows
from coordinator.planning.measured import MeasuredSetup, measure_here, titled
from coordinator.planning.planner import Planner
from coordinator.planning.setups import Setup
from coordinator.runtime import Runtime
from coordinator.workers.connection import WorkerConnection, connect, refresh_hello
from coordinator.workers.credentials import Credentials
from coordinator.workers.discovery import WorkerDirectory
from coordinator.workers.selection import check_worker, find_addresses, find_workers, ranked_workers
from coordinator.workers.speed import pass_points, pass_seconds, worker_speed
from specwire.drafting.ahead.prespec_config import TREE_ROWS
from specwire.drafting.prefix_cache import PrefixCache, PromptCaches
from specwire.emulation.profile import STREAM_PER_ROUND_S
from specwire.errors import (
    BackendUnavailableError,
    NoWorkerError,
    RemoteWorkerError,
    SpecwireError,
)
from specwire.models.loading import LoadedModel, load_model
from specwire.models.vocab import ensure_same_vocabulary
from specwire.v1 import draft_pb2 as pb
from specwire.wire.protocol import BACKEND_PER_OP, BACKEND_STREAM

log = logging.getLogger(__name__)
DEFAULT_DISCOVER_TIMEOUT_S = 3.0
TREE_REPLY_NODES = 64  # the most nodes a tree-verifying round asks for (the curve then sizes it)
HANDOVER_ENTRIES = 4  # a generation's local draft contexts kept for auto's moves (outside serve)


@dataclass(frozen=True)
class WorkerAccess:
    """How workers are found and reached: credentials, mDNS interfaces, deadlines.

    ``live`` is a Bonjour directory kept open by a long-running process (the
    server): lookups read it instead of browsing afresh, so a request does not
    wait seconds for answers, and workers that appear later are picked up.
    """

    credentials: Credentials = field(default_factory=Credentials)
    interfaces: object = None  # specwire.wire.bonjour.mdns_interfaces() output
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
        self._measured: MeasuredSetup | None = None  # this machine, measured once (auto)
        self._planner: tuple[tuple[str, ...], Planner] | None = None  # auto's, for the workers it knows
        self._curve: VerifyCurve | None = None
        self.caches: PromptCaches | None = None  # serve's prompt caches: each local draft's, the workers' key

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
            local = await self.local_model(spec.local)
            return LocalDraftSource(local, self._prefix_cache(local))
        if spec.kind == "local-tree":
            local = await self.local_model(spec.local)
            return LocalTreeDraftSource(
                local, await self.verify_curve(), prefix_cache=self._prefix_cache(local)
            )
        if spec.kind == "auto":
            planner, build = await self.auto(spec)
            return AutoDraftSource(planner, build)
        if spec.mode in FILLED:
            filler = await self.local_model(spec.local)
            remote = await self._failover(spec)
            if spec.mode == TREE_VERIFY:
                curve = await self.verify_curve()
                miss = _miss_shape(remote, curve)
                return RemoteTreeDraftSource(remote, filler, curve, miss, self._prefix_cache(filler))
            return FilledDraftSource(remote, filler)
        return await self._failover(spec)

    async def _failover(self, spec: DraftSpec) -> FailoverDraftSource:
        """A remote source on the fastest compatible worker that takes this machine's token and passes its
        Hello (or the one named), wrapped for its loss."""
        addresses = await find_workers(
            spec.workers[0] if spec.workers else None,
            self.target.fingerprint,
            spec.backend,
            self.access.interfaces,  # type: ignore[arg-type]
            self.access.discover_timeout,
            self.access.credentials,
            live=self.access.live,
        )
        first = self._remote(
            await _first_to_open(addresses, lambda a: self.connection(a, spec.backend)), spec
        )
        local = functools.partial(self._local_now, spec.local) if spec.local else None
        return FailoverDraftSource(first, spec.on_loss, functools.partial(self._replacement, spec), local)

    async def auto(self, spec: DraftSpec) -> tuple[Planner, Callable[[Setup], DraftSource | None]]:
        """The drafting policy's planner for this machine and the workers ``spec`` allows, and the
        builder of each set-up's source. This machine is measured once; the workers each time they
        change (a server's directory may gain or lose some)."""
        local = await self.local_model(spec.local) if spec.local else None
        connections = await self._auto_workers(spec)
        key = tuple(sorted(c.address for c in connections))
        if self._planner is None or self._planner[0] != key:
            if self._measured is None:
                self._measured = await self.runtime.compute.run(measure_here, self.target, local)
            speeds = [await worker_speed(c) for c in connections]
            measured = replace(self._measured, workers=tuple(titled(speeds)))
            self._planner = (key, Planner(measured))
        planner = self._planner[1]
        by_title = dict(zip((w.title for w in planner.measured.workers), connections, strict=True))
        # Every set-up drafting on the local model shares its prompt cache, through which a move hands the
        # draft's context over (``keep_context``): serve's, else one of this generation's own.
        handover = None
        if local is not None:  # (a PrefixCache with no entries is falsy: no ``or`` here)
            handover = self._prefix_cache(local)
            handover = PrefixCache(HANDOVER_ENTRIES) if handover is None else handover
        return planner, functools.partial(self._build, by_title, local, handover)

    async def _auto_workers(self, spec: DraftSpec) -> list[WorkerConnection]:
        """Connections to the workers auto may draft on: those named, else every compatible one found
        (none is no error: auto then chooses between this machine's own set-ups)."""
        access = self.access
        if spec.workers == ("none",):  # this machine's own set-ups only
            return []
        if spec.workers:
            addresses = await find_addresses(
                list(spec.workers),
                self.target.fingerprint,
                access.interfaces,  # type: ignore[arg-type]
                access.discover_timeout,
                access.credentials,
                live=access.live,
            )
        else:
            found, _ = await ranked_workers(
                self.target.fingerprint,
                BACKEND_STREAM,
                access.interfaces,  # type: ignore[arg-type]
                access.discover_timeout,
                access.credentials,
                live=access.live,
            )
            addresses = [w.address for w in found]
        connections = []
        for address in addresses:
            try:
                connections.append(await self.connection(address))
            except SpecwireError as err:  # unreachable or unfit: auto plans without it
                log.warning("auto: leaving out the worker at %s: %s", address, err)
        return connections

    def _build(
        self,
        by_title: dict[str, WorkerConnection],
        local: LoadedModel | None,
        handover: PrefixCache | None,
        setup: Setup,
    ) -> DraftSource | None:
        """The source of one of auto's set-ups (None: AR); compute thread, no network until started. A
        tree set-up measures the target's verification curve the first time one is built (a CPU's
        target takes seconds over 32 positions, which a set-up without trees should not wait for)."""
        if setup.mode == "ar":
            return None
        if setup.mode == "local":
            assert local is not None
            return LocalDraftSource(local, handover)
        if setup.mode == "local-tree":
            assert local is not None
            return LocalTreeDraftSource(local, self._curve_here(), prefix_cache=handover)
        connection = by_title[setup.worker]
        if setup.mode == TREE_VERIFY:  # as wide a pass as costs no more (``tree_verify.tree_rows``)
            prespec = prespec_for(setup.mode, tree_rows(pass_points(connection)))
        else:
            prespec = prespec_for(setup.mode)
        nodes = TREE_REPLY_NODES if setup.mode == TREE_VERIFY else 0
        stream = self._stream(connection, prespec, nodes)
        if setup.mode == TREE_VERIFY:
            assert local is not None
            curve = self._curve_here()
            miss = _miss_shape(stream, curve)
            return RemoteTreeDraftSource(stream, local, curve, miss, handover)
        if setup.mode in FILLED:
            assert local is not None
            return FilledDraftSource(stream, local, handover)
        return stream

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

    @property
    def local_models(self) -> list[LoadedModel]:
        """The local draft models loaded so far (to warm before timing)."""
        return list(self._models.values())

    async def verify_curve(self) -> VerifyCurve:
        """The target's verification time by positions, measured once (local tree SD sizes trees by it)."""
        return await self.runtime.compute.run(self._curve_here)

    def _curve_here(self) -> VerifyCurve:
        """``verify_curve`` on the compute thread."""
        if self._curve is None:
            self._curve = measure_verify_curve(self.target)
            log.info("the target's verification curve: %s", self._curve)
        return self._curve

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

    def _remote(self, connection: WorkerConnection, spec: DraftSpec) -> DraftSource:
        if spec.mode in FILLED and not connection.hello.pass_curve:  # no tree passes: windowed layers
            raise BackendUnavailableError(
                f"worker {connection.name} cannot draft a tree: its model {connection.hello.model.spec} "
                "has layers a tree cannot branch (a sliding window); "
                "use --draft remote:stream, or --draft auto, which knows"
            )
        if spec.backend == BACKEND_PER_OP:
            fp, timeout = self.target.fingerprint, self.access.round_timeout
            return PerOpDraftSource(self.runtime.portal, connection, fp, spec.granularity, timeout)
        nodes = TREE_REPLY_NODES if spec.mode == TREE_VERIFY else 0
        return self._stream(connection, spec.prespec, nodes)

    def _stream(
        self, connection: WorkerConnection, prespec: pb.PreSpeculation | None, tree_nodes: int = 0
    ) -> StreamDraftSource:
        fp, timeout = self.target.fingerprint, self.access.round_timeout
        key = self.caches.key if self.caches is not None else ""
        return StreamDraftSource(self.runtime.portal, connection, fp, timeout, prespec, tree_nodes, key)

    def _prefix_cache(self, local: LoadedModel) -> PrefixCache | None:
        """The prompt cache of a local draft model (serve keeps them; other commands do not)."""
        return self.caches.of(f"draft:{local.spec}") if self.caches is not None else None

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
        names: dict[str, list[str]] = {}  # the adverts at each address, fastest first
        for advert in candidates:
            names.setdefault(advert.address, []).append(advert.name)
        if not names:
            raise NoWorkerError("no other compatible worker answered on Bonjour")

        async def fresh(address: str) -> WorkerConnection:
            """A fresh connection: the worker may have restarted on a known address."""
            try:
                connection = await connect(address, creds)
                self._replacements.append(connection)
                check_worker(connection, self.target, spec.backend)
            except SpecwireError:
                lost.update(names[address])
                raise
            return connection

        try:
            return self._remote(await _first_to_open(list(names), fresh), spec)
        except SpecwireError as err:
            raise NoWorkerError(f"no other compatible worker could draft (the last: {err})") from err


async def _first_to_open(
    addresses: Sequence[str], open_one: Callable[[str], Awaitable[WorkerConnection]]
) -> WorkerConnection:
    """The connection ``open_one`` makes to the first of ``addresses`` (fastest first) it can open: each
    one before it that it cannot (unreachable, an advert that outlived its worker, another token, an
    unfit Hello) is logged with why; if none opens, the last one's error is raised."""
    for address in addresses[:-1]:
        try:
            return await open_one(address)
        except SpecwireError as err:
            log.warning("leaving out the worker at %s, trying the next fastest: %s", address, err)
    return await open_one(addresses[-1])


def _miss_shape(remote: DraftSource, curve: VerifyCurve) -> str:
    """What a tree-verifying round verifies when the worker has nothing ready (``tree_verify.miss_shape``),
    from the worker's advertised pass at its tree rows (at most 16: it sizes a pass to the window) and a
    round verifying one position here (``tree_verify.miss_round_s``)."""
    stream = getattr(remote, "current", remote)  # a failover source: the worker it drafts on
    connection = getattr(stream, "connection", None)
    if connection is None:
        return "tree"
    prespec = getattr(stream, "prespec", None)
    rows = min(prespec.batch, TREE_ROWS) if prespec is not None and prespec.batch else TREE_ROWS
    return miss_shape(pass_seconds(connection, rows), miss_round_s(curve.at(1), STREAM_PER_ROUND_S))
