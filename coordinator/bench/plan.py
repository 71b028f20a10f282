"""Which rows a bench measures, and the workers behind the remote ones.

Rows: AR with the target only, local SD with the local draft model, ``auto``
(the drafting policy over every chosen worker: what a user gets by
default), then for every chosen worker one row per backend (and per
granularity of the per-op backend; ``stream+prespec+fill+tree`` is the
stream protocol's tree mode, ``STREAM_MODES``).
Each worker's link is probed first (raw TCP echo), so attribution has this
path's network floor. A row a worker cannot serve (a backend it does not
offer, a tree its model cannot branch, or the worker itself unusable) is
not run: it is kept as a ``SkippedRow`` with its reason, which the bench
prints, reports and writes to its JSON, and the other rows run.
``row_draft`` says what each row drafts with; the draft-source factory
(``coordinator.drafting.factory``) opens it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from coordinator.drafting.factory import DraftSources
from coordinator.drafting.spec import DraftSpec
from coordinator.workers.connection import WorkerConnection
from coordinator.workers.netprobe import DEFAULT_SIZES, NetworkFloor, RttSummary, probe_tcp
from specwire.errors import BackendUnavailableError, InvalidArgumentError, NoWorkerError, SpecwireError
from specwire.wire.protocol import BACKEND_PER_OP, BACKEND_STREAM

PROBE_COUNT = 60
BACKEND_AUTO = "auto"  # the drafting policy's row: every worker of the bench, the set-up it chooses
BACKEND_LOCAL_TREE = "local-tree"  # local tree SD: the local draft model drafts a tree, verified in one pass
# A bench row kind, not a backend a worker offers: the worker drafts a tree of continuations ahead, kept
# across rounds, and the target's machine drafts what is not ready (T = 0).
BACKEND_PRESPEC_TREE = f"{BACKEND_STREAM}+prespec+fill+tree"
# The same worker tree, sent as a tree and verified in one pass (T = 0; at T > 0 it fills as above).
BACKEND_TREE_VERIFY = f"{BACKEND_STREAM}+tree-verify"
# Bench backend -> the stream protocol's mode (coordinator.drafting.spec.DraftSpec.mode).
STREAM_MODES = {BACKEND_STREAM: "stream", BACKEND_PRESPEC_TREE: "tree", BACKEND_TREE_VERIFY: "tree-verify"}
PROBE_BUDGET_S = 1.0


@dataclass(frozen=True)
class RowSpec:
    """One configuration the bench measures."""

    label: str
    kind: str  # "ar", "local", "local-tree", "auto" or "remote"
    backend: str = ""  # remote: stream or ggml-rpc
    granularity: str = ""
    worker: str = ""
    mode: str = ""  # remote stream rows: stream, tree or tree-verify
    k: int = 0  # drafts per round (0: the bench's --k)
    rows: int = 0  # tree rows: nodes the worker expands a pass (0: the bench's remote setting)

    @property
    def prespec(self) -> bool:
        """The worker drafts ahead (a tree)."""
        return self.mode in ("tree", "tree-verify")

    @property
    def fill(self) -> bool:
        """The local draft model drafts what the worker has not (coordinator.drafting.fill)."""
        return self.mode in ("tree", "tree-verify")

    @property
    def tree(self) -> bool:
        """The worker drafts a tree of continuations across rounds (T = 0)."""
        return self.mode in ("tree", "tree-verify")


@dataclass(frozen=True)
class SkippedRow:
    """A row the bench did not run, because its worker cannot serve it, and why."""

    label: str
    worker: str
    backend: str
    reason: str
    granularity: str = ""
    mode: str = ""

    def line(self) -> str:
        """The one line the bench prints for it."""
        return f"skipped {self.label}: {self.reason}"


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
    return (
        BACKEND_STREAM
        if backend in STREAM_MODES or backend in (BACKEND_AUTO, BACKEND_LOCAL_TREE)
        else backend
    )


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
    local_ks: Sequence[int] = (),
    tree_rows: Sequence[int] = (0,),
) -> tuple[list[RowSpec], list[SkippedRow]]:
    """AR, local SD (at the bench's k, the baseline, then at each of ``local_ks``), auto (the drafting
    policy over every worker), then every worker × backend (× granularity for the per-op backend, × each
    of ``tree_rows`` for a worker's tree, labelled by its rows when there are several); and the rows a
    worker cannot serve, skipped with the reason."""
    rows = [RowSpec("AR (target only)", "ar")]
    if with_local:
        rows.append(RowSpec("local SD", "local"))
        rows += [RowSpec(f"local SD k={k}", "local", k=k) for k in local_ks]
        if BACKEND_LOCAL_TREE in backends:
            rows.append(RowSpec("local tree SD", "local-tree"))
    if BACKEND_AUTO in backends:
        rows.append(RowSpec("auto", "auto"))
    skipped: list[SkippedRow] = []
    for worker in workers:
        for row in worker_rows(worker, backends, granularities, tree_rows):
            reason = cannot_serve(worker, row)
            if reason is None:
                rows.append(row)
            else:
                skipped.append(
                    SkippedRow(row.label, row.worker, row.backend, reason, row.granularity, row.mode)
                )
    return rows, skipped


def worker_rows(
    worker: RemoteWorker, backends: list[str], granularities: list[str], tree_rows: Sequence[int] = (0,)
) -> list[RowSpec]:
    """Every row the bench asks of one worker."""
    label = worker_label(worker)
    rows = []
    for backend in backends:
        if backend == BACKEND_PER_OP:
            rows += [
                RowSpec(f"{backend}/{g} → {label}", "remote", backend, g, worker.name) for g in granularities
            ]
        elif backend in STREAM_MODES:
            mode = STREAM_MODES[backend]
            sizes = tree_rows if mode in ("tree", "tree-verify") else (0,)
            for n in sizes:
                named = f"{backend} ×{n}" if len(sizes) > 1 else backend
                rows.append(
                    RowSpec(f"{named} → {label}", "remote", BACKEND_STREAM, "", worker.name, mode, rows=n)
                )
    return rows


def cannot_serve(worker: RemoteWorker, row: RowSpec) -> str | None:
    """Why ``worker`` cannot serve ``row`` (None: it can): a backend it does not offer, or a tree its
    model cannot branch."""
    hello = worker.connection.hello
    if row.backend not in hello.backends:
        offers = ", ".join(hello.backends) or "none"
        return f"worker {worker.name} does not offer the {row.backend} backend (it offers {offers})"
    if row.tree and not hello.pass_curve:
        return (
            f"worker {worker.name} cannot draft a tree: its model {hello.model.spec} has layers a tree "
            "cannot branch (a sliding window)"
        )
    return None


async def connect_workers(
    addresses: list[str], backends: list[str], sources: DraftSources
) -> tuple[list[RemoteWorker], list[tuple[str, str]]]:
    """Connect, check compatibility, and probe each worker's link; and every worker that could not be
    used, with the reason (its address and why)."""
    workers: list[RemoteWorker] = []
    unusable: list[tuple[str, str]] = []
    wire = sorted({wire_backend(b) for b in backends}, key=lambda b: b != BACKEND_STREAM)
    for address in addresses:
        try:
            connection = await _connection(address, wire, sources)
        except SpecwireError as err:
            unusable.append((address, str(err)))
            continue
        if not connection.hello.echo_port:
            raise NoWorkerError(f"worker {connection.name} serves no echo port, so its link cannot be probed")
        host = address.rsplit(":", 1)[0]
        token = sources.access.credentials.token
        probe = await probe_tcp(
            host, connection.hello.echo_port, DEFAULT_SIZES, PROBE_COUNT, PROBE_BUDGET_S, token
        )
        workers.append(RemoteWorker(connection, probe))
    return workers, unusable


async def _connection(address: str, wire: list[str], sources: DraftSources) -> WorkerConnection:
    """A checked connection on the first of the ``wire`` backends the worker offers (its rows on the
    others are skipped by ``cannot_serve``)."""
    for backend in wire[:-1]:
        try:
            return await sources.connection(address, backend)
        except BackendUnavailableError:
            continue
    return await sources.connection(address, wire[-1])


def skipped_worker(address: str, reason: str, backends: list[str]) -> SkippedRow:
    """The rows of a worker the bench could not use at all, as one skipped entry."""
    remote = [b for b in backends if b not in (BACKEND_AUTO, BACKEND_LOCAL_TREE)]
    return SkippedRow(f"{', '.join(remote) or 'every row'} → {address}", address, ",".join(remote), reason)


def row_draft(row: RowSpec, workers: dict[str, RemoteWorker], remote: DraftSpec, local: str) -> DraftSpec:
    """What a row drafts with. ``remote`` holds the bench-wide remote settings (rows a pass, worker-loss
    policy); ``local`` is the local draft model's spec."""
    if row.kind == "ar":
        return DraftSpec("none")
    if row.kind in ("local", "local-tree"):
        return DraftSpec(row.kind, local=local)
    addresses = tuple(w.connection.address for w in workers.values())
    if row.kind == "auto":
        return replace(remote, kind="auto", local=local, workers=addresses or ("none",))
    if row.fill and not local:
        raise InvalidArgumentError(
            f"{BACKEND_PRESPEC_TREE} drafts on the local draft model: --draft none leaves none"
        )
    return replace(
        remote,
        kind="remote",
        rows=row.rows or remote.rows,
        local=local,
        workers=(workers[row.worker].connection.address,),
        backend=row.backend,
        granularity=row.granularity or "op",
        mode=row.mode or "stream",
    )
