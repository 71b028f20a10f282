"""Measuring the rows: every (repeat, prompt) runs every row back to back.

Interleaving the rows, rather than running each row's prompts in a block,
means every row sees the same machine state (thermal, caches, background
load), so the ratios between rows compare like with like.

After each remote generation the runner checks the worker's own counters
against the client's: the stream backend's messages each way, rounds and
draft tokens; the per-op backend's calls and operations. A run that does not
match is marked unverified, and so is its row.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from coordinator.bench.plan import RowSpec
from coordinator.bench.progress import Progress
from coordinator.decoding.engine import GenerationResult, RoundRecord, SpeculativeDecoder
from coordinator.decoding.ties import tie_at
from coordinator.drafting.auto.policy import AUTO_K, AutoDraftSource
from coordinator.drafting.base import DraftSource
from coordinator.drafting.factory import DraftSources
from coordinator.drafting.failover import FailoverDraftSource
from coordinator.drafting.fill import FilledDraftSource
from coordinator.drafting.ggml_rpc.source import PerOpDraftSource
from coordinator.drafting.remote_tree import RemoteTreeDraftSource
from coordinator.drafting.spec import DraftSpec
from coordinator.drafting.stream import StreamDraftSource
from coordinator.pacing import CoordinatorPace
from coordinator.prompts import Prompt
from coordinator.runtime import Runtime
from specwire.drafting.sampling import SamplingParams
from specwire.emulation.pace import PaceCounts
from specwire.models.loading import LoadedModel
from specwire.process.memory import settle_heap


@dataclass
class Run:
    """One generation of one row."""

    row: int
    prompt: int
    category: str
    repeat: int
    result: GenerationResult
    counters: dict[str, Any] = field(default_factory=dict)
    verified: bool = True
    identity: dict[str, Any] = field(default_factory=dict)
    worker_losses: list[dict[str, Any]] = field(default_factory=list)
    pace: dict[str, dict[str, float]] = field(default_factory=dict)  # the coordinator's pacers, by role
    tie: str = ""  # T = 0, a GPU: where the output parts from AR at a tie within rounding (decoding.ties)


@dataclass
class Settings:
    """What every generation of the bench uses."""

    k: int
    max_tokens: int
    params: SamplingParams
    rollback: str = "auto"


def verify(
    source: DraftSource | None, result: GenerationResult
) -> tuple[bool, dict[str, Any], dict[str, Any]]:
    """Compare the worker's counters with the client's; returns (match, counters, session identity).

    After a worker loss only the session that finished can be checked: the
    lost one's last messages never arrived; the run records the loss. The
    drafting policy's sessions are each checked against the rounds they
    served (``verify_auto``).
    """
    if isinstance(source, AutoDraftSource):
        return verify_auto(source, result)
    if isinstance(source, FilledDraftSource):
        ok, counters, identity = verify(source.remote, result)
        return ok, {**counters, "coordinator_filled": source.filled}, identity
    if isinstance(source, RemoteTreeDraftSource):
        ok, counters, identity = verify(source.remote, result)
        extra = {"coordinator_tree_rounds": source.filled, "trimmed_nodes": source.trimmed}
        return ok, {**counters, **extra}, identity
    if isinstance(source, FailoverDraftSource):
        if source.losses:
            inner = source.current
            rounds = [r for r in result.rounds if r.end_ns > source.losses[-1].at_ns]
            if inner is None:  # no worker drafted to the end: nothing to check, nothing measured
                return False, {"worker_losses": len(source.losses)}, {}
            ok, counters, identity = verify(inner, _served(rounds))
            return ok, {**counters, "worker_losses": len(source.losses)}, identity
        return verify(source.current, result)
    if isinstance(source, StreamDraftSource):
        w = source.worker_counters
        # filled: drafted here; trimmed: sent by the worker, left out of verification
        drafted = sum(r.drafted - r.draft.filled + r.draft.trimmed for r in result.rounds)
        asked = sum(1 for r in result.rounds if r.draft.calls)  # the last round may not ask the worker
        counters = {
            "client_messages_sent": source.sent_by_reply,  # by the worker's last reply
            "worker_messages_received": w.messages_received,
            "client_messages_received": source.received,
            "worker_messages_sent": w.messages_sent + 1,
            "client_rounds": asked,
            "worker_rounds": w.rounds,
            "client_draft_tokens": drafted,
            "worker_draft_tokens": w.draft_tokens,
            "worker_forward_passes": w.forward_passes,
            **_paced(w, source.pace_headroom),
        }
        served = [r.draft.speculation for r in result.rounds if r.draft.calls]
        if source.prespec is not None:
            counters |= {
                "client_prespec_hits": served.count("hit"),
                "worker_prespec_hits": w.prespec_hits,
                "client_prespec_misses": served.count("miss"),
                "worker_prespec_misses": w.prespec_misses,
                "worker_prespec_partial": w.prespec_partial,
                "worker_speculative_passes": w.speculative_passes,
            }
        ok = (
            source.sent_by_reply == w.messages_received
            and source.received == w.messages_sent + 1
            and asked == w.rounds
            and drafted == w.draft_tokens
            and served.count("hit") == w.prespec_hits
            and served.count("miss") == w.prespec_misses
        )
        ident = source.opened.identity if source.opened is not None else None
    elif isinstance(source, PerOpDraftSource) and source.client is not None:
        c, w = source.client, source.client.worker_counters
        counters = {
            "client_calls": c.calls,
            "worker_graphs": w.graphs,
            "client_ops": c.ops,
            "worker_ops": w.ops,
            "worker_messages_received": w.messages_received,
            "worker_tensor_bytes": w.tensor_bytes,
            **_paced(w, c.pace_headroom),
        }
        ok = c.calls == w.graphs and c.ops == w.ops and w.messages_received == c.calls + 1
        ident = source.connection.hello.identity
    else:
        return True, {}, {}
    identity = (
        {"name": ident.name, "host": ident.host, "pid": ident.pid, "boot_id": ident.boot_id} if ident else {}
    )
    return ok, counters, identity


def verify_auto(
    source: AutoDraftSource, result: GenerationResult
) -> tuple[bool, dict[str, Any], dict[str, Any]]:
    """Each of the drafting policy's sessions against the rounds it served; a lost one is counted, not
    checked, and one that served no round (opened as the generation ended) is marked unused. Counters
    and identities by session, with the rounds each set-up served."""
    ok, sessions = True, []
    rounds_by_setup: dict[str, int] = {}
    by_worker: dict[str, dict[str, Any]] = {}
    for segment in source.segments:
        served = result.rounds[segment.first_round : segment.last_round + 1]
        label = segment.setup.label
        rounds_by_setup[label] = rounds_by_setup.get(label, 0) + len(served)
        if not segment.setup.remote:
            continue
        if segment.lost:
            sessions.append({"setup": label, "lost": True, "rounds": len(served)})
            continue
        if not served:  # opened as the generation ended: it drafted nothing, so there is nothing to check
            sessions.append({"setup": label, "rounds": 0, "unused": True})
            continue
        if segment.opened is not None:  # the Open's drafts, superseded by the catch-up: asked, never verified
            served = [RoundRecord(0, 0, [], 0, 0, 0, segment.opened), *served]
        good, counters, identity = verify(segment.source, _served(served))
        ok = ok and good and bool(identity)
        _add(by_worker.setdefault(identity.get("name", "?"), {}), counters)
        sessions.append({"setup": label, "rounds": len(served), "counters": counters, "identity": identity})
    counters = {
        "rounds_by_setup": rounds_by_setup,
        "switches": len(source.switches) - 1,
        "workers": by_worker,
    }
    return ok, counters, {"sessions": sessions}


def _add(total: dict[str, Any], counters: dict[str, Any]) -> None:
    for key, value in counters.items():
        if isinstance(value, dict):
            _add(total.setdefault(key, {}), value)
        elif isinstance(value, (int, float)):
            total[key] = total.get(key, 0) + value


def _served(rounds: list[RoundRecord]) -> GenerationResult:
    """A result holding only ``rounds`` (the ones one session served)."""
    return GenerationResult(0, [], "", 0, 0, 0, rounds=rounds)


def _paced(counters: Any, headroom: list[int]) -> dict[str, Any]:
    """A paced worker's pass and overrun counts of one session, and its passes by headroom bucket
    (nothing for an unpaced worker)."""
    if not counters.paced_passes:
        return {}
    return {
        "worker_paced_passes": counters.paced_passes,
        "worker_pace_overruns": counters.pace_overruns,
        # by bucket, so that summing a row's sessions adds each bucket's passes
        "worker_pace_headroom": {str(i): n for i, n in enumerate(headroom) if n},
    }


def excuse_ties(
    target: LoadedModel, runs: list[Run], prompts: list[tuple[Prompt, list[int]]], ar_row: int
) -> None:
    """Mark every T = 0 run that parts from AR's output (row ``ar_row``) at a tie of the target's logits
    within this backend's rounding (``coordinator.decoding.ties``: a GPU's batched and single passes
    round apart; the CPU's do not, so nothing is excused there). Compute thread."""
    ar = {(r.prompt, r.repeat): r.result.tokens for r in runs if r.row == ar_row}
    for run in runs:
        expected = ar.get((run.prompt, run.repeat))
        if run.row == ar_row or expected is None or run.result.tokens == expected:
            continue
        tie = tie_at(target, prompts[run.prompt][1], expected, run.result.tokens)
        run.tie = str(tie) if tie is not None else ""


async def run_bench(
    runtime: Runtime,
    rows: list[RowSpec],
    drafts: list[DraftSpec],
    prompts: list[tuple[Prompt, list[int]]],
    repeats: int,
    settings: Settings,
    sources: DraftSources,
    pace: CoordinatorPace | None = None,
) -> list[Run]:
    """Run every row (drafting with ``drafts[row]``) on every prompt, ``repeats`` times, interleaved.

    With ``pace``, each run records what the coordinator's pacers counted during it.
    """
    target = sources.target
    runs: list[Run] = []
    with Progress(repeats * len(prompts) * len(rows)) as progress:
        for repeat in range(repeats):
            for p, (prompt, ids) in enumerate(prompts):
                for r, row in enumerate(rows):
                    progress.step(f"{row.label} · {prompt.category} #{p + 1} · repeat {repeat + 1}")
                    source = await sources.open(drafts[r])
                    decoder = SpeculativeDecoder(target, source, settings.rollback)
                    # auto and trees choose their own depth each round, up to AUTO_K
                    own_k = row.kind in ("auto", "local-tree") or row.mode == "tree-verify"
                    k = 0 if source is None else AUTO_K if own_k else row.k or settings.k
                    await runtime.compute.run(settle_heap)  # no collector pause inside the run
                    before = pace.snapshot() if pace is not None else {}
                    result = await runtime.compute.run(
                        decoder.generate, ids, max_tokens=settings.max_tokens, k=k, params=settings.params
                    )
                    paced = {} if pace is None else _since(pace.snapshot(), before)
                    ok, counters, identity = verify(source, result)
                    losses = [asdict(loss) for loss in getattr(source, "losses", [])]
                    runs.append(
                        Run(r, p, prompt.category, repeat, result, counters, ok, identity, losses, paced)
                    )
    return runs


def _since(now: dict[str, PaceCounts], before: dict[str, PaceCounts]) -> dict[str, dict[str, float]]:
    return {role: asdict(counts.since(before[role])) for role, counts in now.items()}
