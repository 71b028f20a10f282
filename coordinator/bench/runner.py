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
from coordinator.decoding.engine import GenerationResult, SpeculativeDecoder
from coordinator.decoding.fallback import FallbackSettings
from coordinator.decoding.ties import tie_at
from coordinator.drafting.base import DraftSource
from coordinator.drafting.factory import DraftSources, DraftSpec
from coordinator.drafting.failover import FailoverDraftSource
from coordinator.drafting.fill import FilledDraftSource
from coordinator.drafting.ggml_rpc.source import PerOpDraftSource
from coordinator.drafting.multi import MultiWorkerDraftSource
from coordinator.drafting.stream import StreamDraftSource
from coordinator.pacing import CoordinatorPace
from coordinator.prompts import Prompt
from coordinator.runtime import Runtime
from specwire.models import LoadedModel
from specwire.pace import PaceCounts
from specwire.sampling import SamplingParams


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
    fallback: FallbackSettings | None = None
    adaptive_k: bool = False
    rollback: str = "auto"
    prespec_k: int = 0  # k of the pre-speculation rows (0: k)

    def row_k(self, prespec: bool) -> int:
        """The k a row drafts with."""
        return self.prespec_k if prespec and self.prespec_k else self.k


def verify(
    source: DraftSource | None, result: GenerationResult, own_tallies: bool = False
) -> tuple[bool, dict[str, Any], dict[str, Any]]:
    """Compare the worker's counters with the client's; returns (match, counters, session identity).

    After a worker loss only the session that finished can be checked: the
    lost one's last messages never arrived; the run records the loss. With
    several workers racing (``own_tallies``), each worker is checked against
    what its own session received, not against the rounds the engine used:
    a worker that lost a round may have drafted a different number of
    tokens for it, and which worker hit is not the engine's business.
    """
    if isinstance(source, FilledDraftSource):
        ok, counters, identity = verify(source.remote, result, own_tallies)
        return ok, {**counters, "coordinator_filled": source.filled}, identity
    if isinstance(source, FailoverDraftSource):
        if source.losses:
            inner = source.current
            rounds = [r for r in result.rounds if r.end_ns > source.losses[-1].at_ns]
            if inner is None:
                return True, {"worker_losses": len(source.losses)}, {}
            ok, counters, identity = verify(inner, GenerationResult(0, [], "", 0, 0, 0, rounds=rounds))
            return ok, {**counters, "worker_losses": len(source.losses)}, identity
        return verify(source.current, result)
    if isinstance(source, MultiWorkerDraftSource):
        checks = [verify(s, result, own_tallies=True) for s in source.live]
        hellos = [s.connection.hello.identity for s in source.live]
        same = all(
            c[2].get("pid") == h.pid and c[2].get("boot_id") == h.boot_id
            for c, h in zip(checks, hellos, strict=True)
        )
        ok = bool(checks) and all(c[0] for c in checks) and same  # every live worker, counters and process
        counters = {s.worker: c[1] for s, c in zip(source.live, checks, strict=True)}
        counters["winners"] = {w: source.winners.count(w) for w in set(source.winners)}
        counters["dropped"] = source.dropped
        return ok, counters, checks[0][2] if checks else {}
    if isinstance(source, StreamDraftSource):
        w = source.worker_counters
        drafted = sum(r.drafted - r.draft.filled for r in result.rounds)  # filled: drafted here
        asked = sum(1 for r in result.rounds if r.draft.calls)  # the last round may not ask the worker
        if own_tallies:
            drafted, asked = source.drafts_received, source.rounds_received
        reported = source.sent - source.unreported  # a Filled after the last reply is in no reply's counts
        counters = {
            "client_messages_sent": reported,
            "worker_messages_received": w.messages_received,
            "client_messages_received": source.received,
            "worker_messages_sent": w.messages_sent + 1,
            "client_rounds": asked,
            "worker_rounds": w.rounds,
            "client_draft_tokens": drafted,
            "worker_draft_tokens": w.draft_tokens,
            "worker_forward_passes": w.forward_passes,
            **_paced(w),
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
            if source.prespec.fill:
                filled = source.filled_sent - source.unreported
                counters |= {"client_filled": filled, "worker_filled_rounds": w.filled_rounds}
        ok = (
            reported == w.messages_received
            and source.received == w.messages_sent + 1
            and asked == w.rounds
            and drafted == w.draft_tokens
            and source.filled_sent - source.unreported == w.filled_rounds
            and (
                own_tallies
                or (served.count("hit") == w.prespec_hits and served.count("miss") == w.prespec_misses)
            )
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
            **_paced(w),
        }
        ok = c.calls == w.graphs and c.ops == w.ops and w.messages_received == c.calls + 1
        ident = source.connection.hello.identity
    else:
        return True, {}, {}
    identity = (
        {"name": ident.name, "host": ident.host, "pid": ident.pid, "boot_id": ident.boot_id} if ident else {}
    )
    return ok, counters, identity


def _paced(counters: Any) -> dict[str, int]:
    """A paced worker's pass and overrun counts of one session (nothing for an unpaced one)."""
    if not counters.paced_passes:
        return {}
    return {"worker_paced_passes": counters.paced_passes, "worker_pace_overruns": counters.pace_overruns}


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
                    decoder = SpeculativeDecoder(
                        target, source, settings.fallback, settings.adaptive_k, settings.rollback
                    )
                    k = settings.row_k(row.prespec) if source is not None else 0
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
