"""Which rows a bench measures, and the workers behind the remote ones.

Rows: AR with the target only, local SD with the local draft model, then for
every chosen worker one row per backend (and per granularity of the per-op
backend; ``stream+prespec`` is the stream backend with pre-speculation).
Each worker's link is probed first (raw TCP echo), so attribution has this
path's network floor.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field, replace

from coordinator.credentials import Credentials
from coordinator.drafting.base import DraftSource
from coordinator.drafting.failover import FailoverDraftSource
from coordinator.drafting.ggml_rpc.source import PerOpDraftSource
from coordinator.drafting.local import LocalDraftSource
from coordinator.drafting.multi import MultiWorkerDraftSource
from coordinator.drafting.stream import StreamDraftSource
from coordinator.netprobe import DEFAULT_SIZES, NetworkFloor, RttSummary, probe_tcp
from coordinator.runtime import Runtime
from coordinator.sources import WorkerPool, remote_source
from coordinator.workers import WorkerConnection, connect
from specwire.errors import BackendUnavailableError, NoWorkerError
from specwire.models import LoadedModel
from specwire.protocol import BACKEND_PER_OP, BACKEND_STREAM
from specwire.v1 import draft_pb2 as pb
from specwire.vocab import ensure_same_vocabulary

PROBE_COUNT = 60
BACKEND_PRESPEC = f"{BACKEND_STREAM}+prespec"  # bench row kinds, not backends a worker offers
BACKEND_PRESPEC_READY = f"{BACKEND_PRESPEC}+ready"  # takes a branch's ready drafts at once (min_drafts 1)
PROBE_BUDGET_S = 1.0


@dataclass(frozen=True)
class RowSpec:
    """One configuration the bench measures."""

    label: str
    kind: str  # "ar", "local" or "remote"
    backend: str = ""
    granularity: str = ""
    worker: str = ""
    prespec: bool = False
    multi: str = ""  # "split" or "race": every bench worker at once (coordinator.drafting.multi)
    min_drafts: int = 0  # pre-speculation: take a branch's ready drafts at once from this many


@dataclass
class RemoteWorker:
    """A connected worker, and the network floor of the path to it."""

    connection: WorkerConnection
    probe: list[RttSummary] = field(default_factory=list)

    @property
    def name(self) -> str:
        """The worker's instance name."""
        return self.connection.name

    @property
    def floor(self) -> NetworkFloor:
        """Bare-TCP cost by payload size on this path."""
        return NetworkFloor(self.probe)


def wire_backend(backend: str) -> str:
    """The worker backend a bench backend runs on."""
    return BACKEND_STREAM if backend in (BACKEND_PRESPEC, BACKEND_PRESPEC_READY) else backend


def plan_rows(
    workers: list[RemoteWorker],
    backends: list[str],
    granularities: list[str],
    with_local: bool,
    multi_modes: Sequence[str] = (),
) -> list[RowSpec]:
    """AR, local SD, every worker × backend (× granularity for the per-op backend), then multi-worker rows."""
    rows = [RowSpec("AR (target only)", "ar")]
    if with_local:
        rows.append(RowSpec("local SD", "local"))
    for worker in workers:
        label = worker.connection.hello.identity.label or worker.name
        for backend in backends:
            if backend == BACKEND_PER_OP:
                rows += [
                    RowSpec(f"{backend}/{g} → {label}", "remote", backend, g, worker.name)
                    for g in granularities
                ]
            elif backend in (BACKEND_PRESPEC, BACKEND_PRESPEC_READY):
                ready = int(backend == BACKEND_PRESPEC_READY)
                row = RowSpec(f"{backend} → {label}", "remote", BACKEND_STREAM, "", worker.name, True)
                rows.append(replace(row, min_drafts=ready))
            else:
                rows.append(RowSpec(f"{backend} → {label}", "remote", backend, "", worker.name))
    if len(workers) >= 2:
        rows += [
            RowSpec(
                f"{BACKEND_PRESPEC} ×{len(workers)} ({mode})",
                "remote",
                BACKEND_STREAM,
                "",
                workers[0].name,
                True,
                mode,
            )
            for mode in multi_modes
        ]
    return rows


async def connect_workers(
    addresses: list[str],
    target: LoadedModel,
    backends: list[str],
    stack: AsyncExitStack,
    credentials: Credentials,
) -> list[RemoteWorker]:
    """Connect, check compatibility and backends, and probe each worker's link."""
    workers = []
    for address in addresses:
        connection = await connect(address, credentials)
        stack.push_async_callback(connection.close)
        hello = connection.hello
        ensure_same_vocabulary(
            target.fingerprint, hello.model.fingerprint, target.spec, f"worker {connection.name}"
        )
        missing = [b for b in {wire_backend(b) for b in backends} if b not in hello.backends]
        if missing:
            raise BackendUnavailableError(f"worker {connection.name} does not offer {', '.join(missing)}")
        if not hello.echo_port:
            raise NoWorkerError(f"worker {connection.name} serves no echo port, so its link cannot be probed")
        host = address.rsplit(":", 1)[0]
        probe = await probe_tcp(
            host, hello.echo_port, DEFAULT_SIZES, PROBE_COUNT, PROBE_BUDGET_S, credentials.token
        )
        workers.append(RemoteWorker(connection, probe))
    return workers


def make_source(
    row: RowSpec,
    runtime: Runtime,
    workers: dict[str, RemoteWorker],
    target: LoadedModel,
    draft: LoadedModel | None,
    on_loss: tuple[str, Callable[[RowSpec], WorkerPool]] | None = None,
) -> DraftSource | None:
    """The draft source of a row (None for AR); remote rows survive worker loss under ``on_loss``."""
    if row.kind == "ar":
        return None
    if row.kind == "local":
        assert draft is not None
        return LocalDraftSource(draft)
    if row.multi:
        if on_loss is None:
            return multi_source(row, runtime, workers, target, pb.PreSpeculation(enabled=True))
        policy, pool_for = on_loss
        pool = pool_for(row)
        multi = multi_source(
            row, runtime, workers, target, pool.settings.prespec or pb.PreSpeculation(enabled=True)
        )
        local = (lambda: LocalDraftSource(draft)) if draft is not None else None
        return FailoverDraftSource(multi, policy, pool.next_source, local)
    connection = workers[row.worker].connection
    if on_loss is None:
        if row.backend == BACKEND_PER_OP:
            return PerOpDraftSource(runtime.portal, connection, target.fingerprint, row.granularity)
        prespec = pb.PreSpeculation(enabled=True, min_drafts=row.min_drafts) if row.prespec else None
        return StreamDraftSource(runtime.portal, connection, target.fingerprint, prespec=prespec)
    policy, pool_for = on_loss
    pool = pool_for(row)
    source = remote_source(runtime, connection, target, pool.settings)
    local = (lambda: LocalDraftSource(draft)) if draft is not None else None
    return FailoverDraftSource(source, policy, pool.next_source, local)


def multi_source(
    row: RowSpec,
    runtime: Runtime,
    workers: dict[str, RemoteWorker],
    target: LoadedModel,
    prespec: pb.PreSpeculation,
) -> MultiWorkerDraftSource:
    """Every bench worker drafting for one row, pre-speculating (sharded in ``split`` mode)."""
    chosen = list(workers.values())
    shards = len(chosen) if row.multi == "split" else 1
    sources = []
    for i, w in enumerate(chosen):
        own = pb.PreSpeculation()
        own.CopyFrom(prespec)
        own.shard, own.shards = i % shards, shards
        sources.append(StreamDraftSource(runtime.portal, w.connection, target.fingerprint, prespec=own))
    return MultiWorkerDraftSource(runtime.portal, sources, row.multi)
