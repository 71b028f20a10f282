"""The figures of each bench row, from its raw runs.

* decode tok/s: the median over repeats for each prompt, averaged over the
  prompts (the paper averages code, math and text prompts);
* Δ vs AR and Δ vs local SD: ratios of those averages, minus one;
* acceptance rate: accepted over proposed drafts; mean accepted length:
  accepted drafts per drafting round;
* TTFT: the median; inter-token latency: percentiles over every gap between
  emitted tokens (tokens of one round arrive together, so gaps of zero count);
* effective draft tok/s: drafts over the time the engine waited for them,
  transport included, next to the drafter's own speed without transport;
* lossless (T = 0): every output equals AR's for the same prompt;
* measured share (rows drafted on workers): the share of the row's tokens
  decoded before any of its workers was lost, refused a call or fell back.
  A row below 1 is not a measurement of its set-up: the tables print no
  figure for it, and it enters no ratio, no comparison and no planner check.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from coordinator.attribution import EXCLUDED_KINDS, Attribution, attribute
from coordinator.bench.pacing import PaceFigures, pace_figures
from coordinator.bench.plan import RemoteWorker, RowSpec
from coordinator.bench.runner import Run


@dataclass
class RowSummary:
    """Everything the tables show about one row."""

    spec: RowSpec
    decode_tps: float
    tps_by_category: dict[str, float]
    acceptance_rate: float | None
    mean_accepted: float | None
    ttft_s: float
    itl_ms: dict[str, float]
    effective_draft_tps: float | None
    local_draft_tps: float | None
    lossless: bool | None
    mismatches: list[str] = field(default_factory=list)
    ties: list[str] = field(default_factory=list)  # outputs that part from AR only at a tie (a GPU)
    verified: bool | None = None
    counters: dict[str, Any] = field(default_factory=dict)
    identity: dict[str, Any] = field(default_factory=dict)
    attribution: Attribution | None = None
    delta_vs_ar: float | None = None
    delta_vs_local: float | None = None
    worker_losses: int = 0
    switches: int = 0  # the drafting policy's moves (auto rows), over every run
    drafting: DraftingFigures | None = None
    pace: PaceFigures | None = None
    rollback: RollbackFigures | None = None
    measured_share: float = 1.0  # of the row's tokens, decoded before a worker was lost or refused
    not_measured: str = ""  # why the row's figure is not its set-up's (empty: it is)

    @property
    def measured(self) -> bool:
        """The row's figure is what its set-up did, start to end (module docstring)."""
        return not self.not_measured


@dataclass(frozen=True)
class DraftingFigures:
    """Per drafting round: what the engine waited for drafts, and what pre-speculation did.

    ``critical_ms`` is the time the engine waited for each round's drafts
    (the drafting on its critical path, transport included). ``hit_rate`` and
    ``partial_rate`` are shares of the rounds a pre-speculating worker was
    asked for after the first; ``saved_ms`` is the compute those rounds got
    done ahead, off the critical path. ``k_mean`` is the mean k asked, and
    ``k_counts`` how many rounds asked for each k (the drafting policy varies it).
    """

    rounds: int
    critical_ms: float
    k_mean: float
    k_counts: dict[int, int]
    hit_rate: float | None = None
    partial_rate: float | None = None
    saved_ms: float | None = None


def drafting_figures(runs: list[Run]) -> DraftingFigures | None:
    """The per-round drafting figures of a row's runs (None without drafting rounds)."""
    rounds = [r for run in runs for r in run.result.rounds if r.k]
    if not rounds:
        return None
    critical = float(np.mean([r.draft_ns for r in rounds])) / 1e6
    k_mean = float(np.mean([r.k for r in rounds]))
    k_counts: dict[int, int] = {}
    for r in rounds:
        k_counts[r.k] = k_counts.get(r.k, 0) + 1
    speculated = [r for r in rounds if r.draft.speculation]
    if not speculated:
        return DraftingFigures(len(rounds), critical, k_mean, k_counts)
    outcomes = [r.draft.speculation for r in speculated]
    return DraftingFigures(
        len(rounds),
        critical,
        k_mean,
        k_counts,
        hit_rate=outcomes.count("hit") / len(outcomes),
        partial_rate=outcomes.count("partial") / len(outcomes),
        saved_ms=float(np.mean([r.draft.saved_ns for r in speculated])) / 1e6,
    )


@dataclass(frozen=True)
class RollbackFigures:
    """What rolling the target's cache back after rejected drafts cost a row.

    ``share`` is the drafting rounds that rejected some drafts; ``ms`` the
    mean time one of those spent restoring, trimming or replaying;
    ``replayed`` the mean positions fed again per such round (replay only);
    ``state_mib`` the most per-position state held at once (states only).
    """

    strategy: str
    rounds: int
    share: float
    ms: float
    replayed: float
    state_mib: float


def rollback_figures(runs: list[Run]) -> RollbackFigures | None:
    """The row's rollback figures (None for a target whose layers all trim, or without drafting)."""
    stats = [run.result.rollback for run in runs if run.result.rollback is not None]
    drafting = [r for run in runs for r in run.result.rounds if r.drafted]
    if not stats or stats[0].strategy == "trim" or not drafting:
        return None
    rolled = sum(s.rounds for s in stats)
    return RollbackFigures(
        strategy=stats[0].strategy,
        rounds=rolled,
        share=rolled / len(drafting),
        ms=sum(s.rollback_ns for s in stats) / rolled / 1e6 if rolled else 0.0,
        replayed=sum(s.replayed for s in stats) / rolled if rolled else 0.0,
        state_mib=max(s.state_bytes for s in stats) / 2**20,
    )


def mean_of_medians(values: list[tuple[int, str, float]]) -> tuple[float, dict[str, float]]:
    """A row's figure from (prompt, category, value) per run: the median over repeats of each
    prompt, averaged over prompts, and that average per category."""
    by_prompt: dict[int, list[float]] = {}
    categories: dict[int, str] = {}
    for prompt, category, value in values:
        by_prompt.setdefault(prompt, []).append(value)
        categories[prompt] = category
    medians = {p: float(np.median(v)) for p, v in by_prompt.items()}
    by_category: dict[str, list[float]] = {}
    for p, value in medians.items():
        by_category.setdefault(categories[p], []).append(value)
    return float(np.mean(list(medians.values()))), {c: float(np.mean(v)) for c, v in by_category.items()}


def _mean_of_medians(runs: list[Run]) -> tuple[float, dict[str, float]]:
    return mean_of_medians([(run.prompt, run.category, run.result.decode_tps) for run in runs])


def _draft_figures(runs: list[Run]) -> tuple[float | None, float | None, float | None]:
    rounds = [r for run in runs for r in run.result.rounds if r.drafted]
    if not rounds:
        return None, None, None
    drafted = sum(r.drafted for r in rounds)
    accepted = sum(r.accepted for r in rounds)
    waited = sum(r.draft_ns for r in rounds) / 1e9
    return accepted / drafted, accepted / len(rounds), drafted / waited if waited > 0 else None


def _lossless(runs: list[Run], ar: dict[tuple[int, int], list[int]]) -> tuple[bool, list[str]]:
    """Whether every run equals AR's output (or parts from it only at a tie, ``Run.tie``), and where not."""
    mismatches = []
    for run in runs:
        expected = ar.get((run.prompt, run.repeat))
        if expected is not None and run.result.tokens != expected and not run.tie:
            at = next(
                (i for i, (a, b) in enumerate(zip(expected, run.result.tokens, strict=False)) if a != b), None
            )
            mismatches.append(
                f"prompt {run.prompt + 1} repeat {run.repeat + 1}: differs from AR at token {at}"
            )
    return not mismatches, mismatches


def _sum_counters(runs: list[Run]) -> dict[str, Any]:
    total: dict[str, Any] = {}
    for run in runs:
        _add_counters(total, run.counters)
    return total


def _add_counters(total: dict[str, Any], counters: dict[str, Any]) -> None:
    """Add ``counters`` into ``total``: numbers add, nested dicts add per key, lists concatenate."""
    for key, value in counters.items():
        if isinstance(value, dict):
            _add_counters(total.setdefault(key, {}), value)
        elif isinstance(value, list):
            total[key] = [*total.get(key, []), *value]
        else:
            total[key] = total.get(key, 0) + value


def summarize_row(
    spec: RowSpec,
    runs: list[Run],
    greedy: bool,
    ar: dict[tuple[int, int], list[int]],
    workers: dict[str, RemoteWorker],
) -> RowSummary:
    """The figures of one row."""
    worker = workers.get(spec.worker)
    tps, by_category = _mean_of_medians(runs)
    acceptance, mean_accepted, effective = _draft_figures(runs)
    gaps = np.concatenate([run.result.inter_token_s() for run in runs]) * 1e3
    itl = {f"p{q}": float(np.percentile(gaps, q)) for q in (50, 95, 99)} if gaps.size else {}
    lossless, mismatches = _lossless(runs, ar) if greedy and spec.kind != "ar" else (None, [])
    ties = [f"prompt {run.prompt + 1} repeat {run.repeat + 1}: {run.tie}" for run in runs if run.tie]
    summary = RowSummary(
        spec=spec,
        decode_tps=tps,
        tps_by_category=by_category,
        acceptance_rate=acceptance,
        mean_accepted=mean_accepted,
        ttft_s=float(np.median([run.result.ttft_s for run in runs])),
        itl_ms=itl,
        effective_draft_tps=effective,
        local_draft_tps=effective if spec.kind == "local" else None,
        lossless=lossless if spec.kind != "ar" else True if greedy else None,
        mismatches=mismatches,
        ties=ties,
        worker_losses=sum(len(run.worker_losses) for run in runs),
        switches=sum(max(0, len(run.result.transitions) - 1) for run in runs),
        drafting=drafting_figures(runs),
        rollback=rollback_figures(runs),
    )
    counters = _sum_counters(runs)
    per_worker = counters.get("workers", {}) if spec.kind == "auto" else {spec.worker: counters}
    summary.pace = pace_figures(runs, per_worker)
    if spec.kind == "auto":
        sessions = [
            s["identity"] for run in runs for s in run.identity.get("sessions", []) if "identity" in s
        ]
        summary.verified = all(run.verified for run in runs)
        summary.counters = counters
        summary.identity = {
            "workers": sorted({s.get("name", "") for s in sessions}),
            "sessions": len(sessions),
            "session_identities_match": all(_served_by_hello(s, workers) for s in sessions),
        }
    if worker is not None:
        summary.local_draft_tps = worker.connection.hello.draft_tokens_per_second
        summary.verified = all(run.verified for run in runs)
        summary.counters = counters
        summary.identity = {
            **worker.connection.identity(),
            "session_identities_match": _same_process(runs, workers),
        }
        calls = [c for run in runs for r in run.result.rounds for c in r.draft.calls]
        attributed_rounds = [
            r
            for run in runs
            for r in run.result.rounds
            if any(c.kind not in EXCLUDED_KINDS for c in r.draft.calls)
        ]
        summary.attribution = attribute(
            calls,
            worker.floor,
            draft_tokens=sum(r.drafted for r in attributed_rounds),
            generated_tokens=sum(len(run.result.tokens) for run in runs),
        )
    if spec.kind in ("remote", "auto"):
        summary.measured_share, summary.not_measured = measured_share(runs, summary)
    return summary


def measured_share(runs: list[Run], summary: RowSummary) -> tuple[float, str]:
    """The share of a worker row's tokens decoded before its first worker loss, and why it is below 1.

    A loss is any failure the row's failover handled: the worker died,
    stalled, restarted, or refused a call (the per-op walk diverging, no
    session free). What came after it (another worker, local drafts, the
    target alone) is not the row's set-up. A row whose counters or identity
    do not match the client's measured nothing that can be shown either.
    """
    total = sum(len(run.result.tokens) for run in runs)
    before = 0
    first_error = ""
    for run in runs:
        if not run.worker_losses:
            before += len(run.result.tokens)
            continue
        first = min(run.worker_losses, key=lambda loss: loss["at_ns"])
        first_error = first_error or f"{first['worker']}: {first['error']} ({first['action']})"
        before += sum(len(r.tokens) for r in run.result.rounds if r.end_ns <= first["at_ns"])
    if first_error:
        losses = summary.worker_losses
        return before / total if total else 0.0, (
            f"{losses} worker loss{'es' if losses > 1 else ''}, the first {first_error}"
        )
    if summary.verified is False or not summary.identity.get("session_identities_match", True):
        return 0.0, "the worker's counters or identity do not match the client's"
    return 1.0, ""


def _same_process(runs: list[Run], workers: dict[str, RemoteWorker]) -> bool:
    """Every session was served by the process its worker's Hello described (same pid and boot id).

    A run's session identity names its worker: after a loss, whichever was
    still drafting at the end, not necessarily the row's first worker.
    """

    return all(_served_by_hello(run.identity, workers) for run in runs)


def _served_by_hello(identity: dict[str, Any], workers: dict[str, RemoteWorker]) -> bool:
    """The session was served by the process its worker's Hello described (same pid and boot id)."""
    worker = workers.get(identity.get("name", ""))
    if worker is None:
        return False
    hello = worker.connection.hello.identity
    return identity.get("pid") == hello.pid and identity.get("boot_id") == hello.boot_id


def summarize(
    rows: list[RowSpec], runs: list[Run], greedy: bool, workers: dict[str, RemoteWorker]
) -> list[RowSummary]:
    """Every row's figures, with Δ vs AR and Δ vs local SD."""
    ar_index = next(i for i, r in enumerate(rows) if r.kind == "ar")
    ar = {(run.prompt, run.repeat): run.result.tokens for run in runs if run.row == ar_index}
    out = [
        summarize_row(row, [run for run in runs if run.row == i], greedy, ar, workers)
        for i, row in enumerate(rows)
    ]
    ar_tps = out[ar_index].decode_tps
    local = next((s for s in out if s.spec.kind == "local"), None)  # the first: at the bench's k
    for s in out:
        if not s.measured:
            continue
        s.delta_vs_ar = s.decode_tps / ar_tps - 1 if s.spec.kind != "ar" else None
        if local is not None and s.spec.kind in ("remote", "auto", "local-tree"):
            s.delta_vs_local = s.decode_tps / local.decode_tps - 1
    return out
