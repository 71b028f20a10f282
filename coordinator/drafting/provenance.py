"""Which worker drafted a generation: the proof a remote result carries.

A remote draft source ends a generation on some worker (maybe not the one it
started on, after a loss). ``drafted_by`` reads that off the source: the
worker's name, address, host and process id (from its Hello), every worker
lost on the way, and for several workers at once, which rounds each won.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from coordinator.drafting.failover import FailoverDraftSource
from coordinator.drafting.fill import FilledDraftSource
from coordinator.drafting.remote_tree import RemoteTreeDraftSource


def drafted_by(source: object) -> dict[str, Any]:
    """The worker(s) that finished the generation, and every worker lost on the way ({} if local)."""
    if isinstance(source, FilledDraftSource | RemoteTreeDraftSource):
        return {**drafted_by(source.remote), "filled_here": source.filled}
    if not isinstance(source, FailoverDraftSource):
        return {}
    current = source.current
    report: dict[str, Any] = {"worker_losses": [asdict(loss) for loss in source.losses]}
    connection = getattr(current, "connection", None)
    opened = getattr(current, "opened", None)
    if opened is not None:  # the worker's session: its prefill, and what its prompt cache gave it
        report["worker_prefill_s"] = opened.prefill_ns / 1e9
        report["worker_cached_tokens"] = opened.cached_tokens
    return {"worker": connection.identity() if connection is not None else None, **report}
