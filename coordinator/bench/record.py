"""The bench's JSON: every raw figure, plus the row summaries the tables show.

Schema ``specwire.bench/1``: ``settings``, ``coordinator``, ``workers`` (with
their probes), ``rows`` (summaries, attribution, counters, identities),
``skipped`` (the rows a worker could not serve, each with its reason),
``runs`` (every generation's tokens and rounds, and every remote call's
record in columns), and ``lossless`` (null at T > 0; ``ties`` lists outputs that part from AR
only at a tie of the target's logits within a GPU's rounding).
"""

from __future__ import annotations

import os
import platform
import socket
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from coordinator.bench.plan import RemoteWorker, SkippedRow
from coordinator.bench.runner import Run
from coordinator.bench.summary import RowSummary
from coordinator.strict_json import strict_json
from specwire.wire.timing import CallRecord

SCHEMA = "specwire.bench/1"


def _calls(calls: list[CallRecord]) -> dict[str, list[Any]]:
    """Call records in columns (a bench can make hundreds of thousands of calls)."""
    return {
        "kind": [c.kind for c in calls],
        "wall_ns": [c.wall_ns for c in calls],
        "serialize_ns": [c.serialize_ns for c in calls],
        "deserialize_ns": [c.deserialize_ns for c in calls],
        "bytes_sent": [c.bytes_sent for c in calls],
        "bytes_received": [c.bytes_received for c in calls],
        "worker_deserialize_ns": [c.server.deserialize_ns for c in calls],
        "worker_receive_to_start_ns": [c.server.receive_to_start_ns for c in calls],
        "worker_compute_ns": [c.server.compute_ns for c in calls],
        "worker_compute_to_reply_ns": [c.server.compute_to_reply_ns for c in calls],
        "worker_serialize_ns": [c.server.serialize_ns for c in calls],
        # The compute thread's hops to the event loop and back, outside wall_ns (0: not measured).
        "coordinator_hops_ns": [
            (c.entered_ns - c.requested_ns) + (c.returned_ns - c.receive_ns) if c.entered_ns else 0
            for c in calls
        ],
    }


def run_record(run: Run) -> dict[str, Any]:
    """One generation, raw."""
    result = run.result
    return {
        "row": run.row,
        "prompt": run.prompt,
        "category": run.category,
        "repeat": run.repeat,
        "tokens": result.tokens,
        "finish_reason": result.finish_reason,
        "decode_tok_s": result.decode_tps,
        "ttft_s": result.ttft_s,
        "prefill_s": (result.prefill_end_ns - result.start_ns) / 1e9,
        "total_s": (result.end_ns - result.start_ns) / 1e9,
        "token_offsets_ns": [t - result.start_ns for t in result.token_ns],
        "rounds": {
            "k": [r.k for r in result.rounds],
            "drafted": [r.drafted for r in result.rounds],
            "accepted": [r.accepted for r in result.rounds],
            "draft_ns": [r.draft_ns for r in result.rounds],
            "verify_ns": [r.verify_ns for r in result.rounds],
            "speculation": [r.draft.speculation for r in result.rounds],
            "saved_ns": [r.draft.saved_ns for r in result.rounds],
            "rollback_ns": [r.rollback_ns for r in result.rounds],
        },
        "rollback": asdict(result.rollback) if result.rollback is not None else None,
        "calls": _calls([c for r in result.rounds for c in r.draft.calls]),
        "counters": run.counters,
        "verified": run.verified,
        "worker_identity": run.identity,
        "worker_losses": run.worker_losses,
        "switches": [asdict(t) for t in result.transitions],
        "pace": run.pace,
    }


def row_record(s: RowSummary) -> dict[str, Any]:
    """One row's summary."""
    return {
        **asdict(s.spec),
        "prespec": s.spec.prespec,
        "fill": s.spec.fill,
        "tree": s.spec.tree,
        "decode_tok_s": s.decode_tps if s.measured else None,  # no figure for a row a worker failed
        "measured": s.measured,
        "measured_share": s.measured_share,
        "not_measured": s.not_measured or None,
        "decode_tok_s_as_run": s.decode_tps,  # what the row made, fallback included: not its set-up's
        "tok_s_by_category": s.tps_by_category,
        "delta_vs_ar": s.delta_vs_ar,
        "delta_vs_local": s.delta_vs_local,
        "acceptance_rate": s.acceptance_rate,
        "mean_accepted": s.mean_accepted,
        "ttft_s": s.ttft_s,
        "itl_ms": s.itl_ms,
        "effective_draft_tok_s": s.effective_draft_tps,
        "local_draft_tok_s": s.local_draft_tps,
        "lossless": s.lossless,
        "mismatches": s.mismatches,
        "ties": s.ties,
        "verified": s.verified,
        "counters": s.counters,
        "identity": s.identity,
        "attribution": s.attribution.to_dict() if s.attribution is not None else None,
        "worker_losses": s.worker_losses,
        "switches": s.switches,
        "drafting": asdict(s.drafting) if s.drafting is not None else None,
        "pace": None if s.pace is None else s.pace.to_dict(),
        "rollback": asdict(s.rollback) if s.rollback is not None else None,
    }


def worker_record(worker: RemoteWorker, peak_rss: int | None) -> dict[str, Any]:
    """What a worker said about itself, and the probe of the path to it."""
    hello = worker.connection.hello
    return {
        "name": worker.name,
        "identity": worker.connection.identity(),
        "model": {
            "spec": hello.model.spec,
            "fingerprint": hello.model.fingerprint,
            "precision": hello.model.precision,
        },
        "backends": list(hello.backends),
        "local_draft_tok_s": hello.draft_tokens_per_second,
        "pace": pace_of_hello(hello),
        "compute": hello.compute or None,
        "vocab_size": hello.model.vocab_size,
        "ops_per_pass": walked_ops(hello),
        "probe_tcp": [asdict(s) for s in worker.probe],
        "peak_rss_bytes": peak_rss,
    }


def walked_ops(hello: Any) -> int | None:
    """Operations of one pass of the worker's model as the per-op baseline walks it (None: not walked)."""
    return int(hello.model.walked_ops) or None


def pace_of_hello(hello: Any) -> dict[str, Any] | None:
    """A paced worker's Pace message as plain data (None for a worker at its own speed)."""
    if not hello.HasField("pace"):
        return None
    p = hello.pace
    return {
        "profile": p.profile,
        "machine": p.machine,
        "machine_name": p.machine_name,
        "draft_tok_s": p.draft_tokens_per_second,
    }


def bench_record(
    settings: dict[str, Any],
    rows: list[RowSummary],
    runs: list[Run],
    workers: list[RemoteWorker],
    worker_rss: dict[str, int],
    coordinator_rss: int,
    skipped: Sequence[SkippedRow] = (),
) -> dict[str, Any]:
    """The whole bench as plain data."""
    checked = [s.lossless for s in rows if s.lossless is not None]
    return strict_json(
        {
            "schema": SCHEMA,
            "settings": settings,
            "coordinator": {
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "platform": platform.platform(),
                "peak_rss_bytes": coordinator_rss,
            },
            "workers": [worker_record(w, worker_rss.get(w.name)) for w in workers],
            "rows": [row_record(s) for s in rows],
            "skipped": [asdict(s) for s in skipped],
            "runs": [run_record(r) for r in runs],
            "lossless": all(checked) if checked and settings["temperature"] == 0 else None,
        }
    )
