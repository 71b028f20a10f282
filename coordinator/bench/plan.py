"""Which rows a bench measures, and the workers behind the remote ones.

Rows: AR with the target only, local SD with the local draft model, then for
every chosen worker one row per backend (and per granularity of the per-op
backend; ``stream+prespec`` is the stream backend with pre-speculation).
Each worker's link is probed first (raw TCP echo), so attribution has this
path's network floor. ``row_draft`` says what each row drafts with; the
draft-source factory (``coordinator.drafting.factory``) opens it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from coordinator.drafting.factory import DraftSources, DraftSpec
from coordinator.workers.connection import WorkerConnection
from coordinator.workers.netprobe import DEFAULT_SIZES, NetworkFloor, RttSummary, probe_tcp
from specwire.errors import BackendUnavailableError, InvalidArgumentError, NoWorkerError
from specwire.protocol import BACKEND_PER_OP, BACKEND_STREAM
from specwire.v1 import draft_pb2 as pb

PROBE_COUNT = 60
BACKEND_PRESPEC = f"{BACKEND_STREAM}+prespec"  # bench row kinds, not backends a worker offers
BACKEND_PRESPEC_READY = f"{BACKEND_PRESPEC}+ready"  # takes a branch's ready drafts at once (min_drafts 1)
BACKEND_PRESPEC_FILL = f"{BACKEND_PRESPEC}+fill"  # the target's machine drafts what is not ready
BACKEND_PRESPEC_PUSH = f"{BACKEND_PRESPEC_FILL}+push"  # ... and sends its drafts to the worker (Filled)
BACKEND_PRESPEC_TREE = f"{BACKEND_PRESPEC_FILL}+tree"  # ... from a tree kept across rounds (T = 0)
FILL_BACKENDS = (BACKEND_PRESPEC_FILL, BACKEND_PRESPEC_PUSH, BACKEND_PRESPEC_TREE)
PRESPEC_BACKENDS = (BACKEND_PRESPEC, BACKEND_PRESPEC_READY, *FILL_BACKENDS)
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
    fill: bool = False  # the local draft model drafts what the workers have not (coordinator.drafting.fill)
    push: bool = False  # fill: the local drafts are sent to the workers, which plan from them
    tree: bool = False  # fill: the workers draft a tree of continuations across rounds (T = 0)


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
    return BACKEND_STREAM if backend in PRESPEC_BACKENDS else backend


def worker_label(worker: RemoteWorker) -> str:
    """How rows name a worker: its label, and, if its compute is paced, the machine it emulates."""
    hello = worker.connection.hello
    label = hello.identity.label or worker.name
    if hello.HasField("pace"):
        label += f" [paced {hello.pace.profile}:{hello.pace.machine}]"
    return label


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
        label = worker_label(worker)
        for backend in backends:
            if backend == BACKEND_PER_OP:
                rows += [
                    RowSpec(f"{backend}/{g} → {label}", "remote", backend, g, worker.name)
                    for g in granularities
                ]
            elif backend in PRESPEC_BACKENDS:
                ready = int(backend == BACKEND_PRESPEC_READY)
                row = RowSpec(f"{backend} → {label}", "remote", BACKEND_STREAM, "", worker.name, True)
                fill, push = backend in FILL_BACKENDS, backend == BACKEND_PRESPEC_PUSH
                tree = backend == BACKEND_PRESPEC_TREE
                rows.append(replace(row, min_drafts=ready, fill=fill, push=push, tree=tree))
            else:
                rows.append(RowSpec(f"{backend} → {label}", "remote", backend, "", worker.name))
    if len(workers) >= 2:
        paced = " [paced]" if any(w.connection.hello.HasField("pace") for w in workers) else ""
        kinds = [b for b in (BACKEND_PRESPEC, *FILL_BACKENDS) if b in backends] or [BACKEND_PRESPEC]
        rows += [
            RowSpec(
                f"{kind} ×{len(workers)} ({mode}){paced}",
                "remote",
                BACKEND_STREAM,
                "",
                workers[0].name,
                True,
                mode,
                fill=kind in FILL_BACKENDS,
                push=kind == BACKEND_PRESPEC_PUSH,
                tree=kind == BACKEND_PRESPEC_TREE,
            )
            for kind in kinds
            for mode in multi_modes
            if not (kind == BACKEND_PRESPEC_TREE and mode == "split")  # a tree is not split over workers
        ]
    return rows


async def connect_workers(
    addresses: list[str], backends: list[str], sources: DraftSources
) -> list[RemoteWorker]:
    """Connect, check compatibility and backends, and probe each worker's link."""
    workers = []
    wire = sorted({wire_backend(b) for b in backends})
    for address in addresses:
        connection = await sources.connection(address, wire[0])
        missing = [b for b in wire if b not in connection.hello.backends]
        if missing:
            raise BackendUnavailableError(f"worker {connection.name} does not offer {', '.join(missing)}")
        if not connection.hello.echo_port:
            raise NoWorkerError(f"worker {connection.name} serves no echo port, so its link cannot be probed")
        host = address.rsplit(":", 1)[0]
        token = sources.access.credentials.token
        probe = await probe_tcp(
            host, connection.hello.echo_port, DEFAULT_SIZES, PROBE_COUNT, PROBE_BUDGET_S, token
        )
        workers.append(RemoteWorker(connection, probe))
    return workers


def row_draft(row: RowSpec, workers: dict[str, RemoteWorker], remote: DraftSpec, local: str) -> DraftSpec:
    """What a row drafts with. ``remote`` holds the bench-wide remote settings (pre-speculation
    overrides, worker-loss policy); ``local`` is the local draft model's spec."""
    if row.kind == "ar":
        return DraftSpec("none")
    if row.kind == "local":
        return DraftSpec("local", local=local)
    prespec = None
    if row.prespec:
        prespec = pb.PreSpeculation()
        prespec.CopyFrom(remote.prespec or pb.PreSpeculation(enabled=True))
        prespec.min_drafts = row.min_drafts or prespec.min_drafts
        prespec.push = row.push
        prespec.tree = row.tree
    chosen = (
        [w.connection.address for w in workers.values()]
        if row.multi
        else [workers[row.worker].connection.address]
    )
    if row.fill and not local:
        raise InvalidArgumentError(
            f"{BACKEND_PRESPEC_FILL} drafts on the local draft model: --draft none leaves none"
        )
    return replace(
        remote,
        workers=tuple(chosen),
        backend=row.backend,
        granularity=row.granularity or "op",
        prespec=prespec,
        multi=row.multi,
        fill=local if row.fill else "",
    )
