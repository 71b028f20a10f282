"""A worker's speed as the drafting policy plans with it: its advertised pass curve and its link.

The curve comes from Hello (``pass_curve``: a tree pass by its rows, measured
at the worker's start); the link is measured now, with gRPC echoes on one
stream (``netprobe.probe_grpc``): the network and gRPC's own cost per
message, which every round pays. A worker on this very host, computing at
its own speed, is co-located: it shares this machine's processors (a paced
worker emulates a machine of its own, and is not).
"""

from __future__ import annotations

import socket

from coordinator.planning.measured import WorkerSpeed, fit_curve
from coordinator.workers.connection import WorkerConnection
from coordinator.workers.netprobe import probe_grpc
from specwire.emulation.profile import PassCurve, measured_pass_s, non_decreasing

LINK_ECHOES = 20
LINK_BUDGET_S = 0.5


def worker_curve(connection: WorkerConnection) -> PassCurve:
    """The worker's pass curve from its Hello: fitted to the advertised tree passes
    (``planning.measured.fit_curve``: flat and then rising for a Mac's), else its draft speed."""
    points = pass_points(connection)
    if points:
        return fit_curve(non_decreasing(points))
    return PassCurve(connection.hello.draft_tokens_per_second or 1.0)


def pass_points(connection: WorkerConnection) -> list[tuple[int, float]]:
    """The worker's measured tree passes, (rows, seconds), from its Hello (none measured: NaN)."""
    return [(p.rows, p.seconds) for p in connection.hello.pass_curve if p.seconds == p.seconds]


def pass_seconds(connection: WorkerConnection, rows: int) -> float:
    """A tree pass over ``rows`` rows as the worker measured it (Hello's points), else as its draft
    speed says."""
    points = non_decreasing(pass_points(connection))
    return measured_pass_s(points, rows) if points else worker_curve(connection).pass_s(rows)


async def worker_speed(connection: WorkerConnection) -> WorkerSpeed:
    """What the model needs of one worker: its advertised curve and its link, measured now."""
    _, streamed = await probe_grpc(connection, (64,), LINK_ECHOES, LINK_BUDGET_S)
    rtt_s = streamed[0].p50_us / 1e6 if streamed else 0.0
    hello = connection.hello
    return WorkerSpeed(
        connection.name,
        hello.identity.label,
        connection.address,
        worker_curve(connection),
        rtt_s,
        bool(hello.pass_curve),
        hello.model.spec,
        colocated=hello.identity.host == socket.gethostname() and not hello.HasField("pace"),
    )
