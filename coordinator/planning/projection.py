"""From one measured run to a recommendation: every backend on every worker, at its best k.

A short calibration bench measures, on this target and these workers, what
the model needs (``from_bench.row_inputs``): the target's verification
line, the engine's own time per round, and per worker the draft pass, the
link's floor, the protocol cost per round (stream) or per call (ggml-rpc, at
each granularity measured) and acceptance. The projection then predicts
each backend at every k in ``KS``, pre-speculation at the hit rate its
calibration row measured, and names the fastest. ``acceptance`` replaces the measured rate everywhere (a model
pair's acceptance on the user's own prompts may differ from the
calibration prompt's).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from coordinator.planning.from_bench import (
    engine_overhead_s,
    fit_target,
    prespec_outcomes,
    row_inputs,
    row_target,
    runs_by_row,
    worker_floors,
)
from coordinator.planning.model import Acceptance, Link, Target, Transport, predict

KS = range(1, 9)
ASSUMED_HIT_RATE = 0.5
MIN_PRESPEC_ROUNDS = 5  # drafting rounds after each session's first, before a measured hit rate is used


def _rounds_after_open(runs: list[dict[str, Any]]) -> int:
    return sum(sum(1 for d in r["rounds"]["drafted"][1:] if d) for r in runs)


@dataclass(frozen=True)
class Option:
    """One way to draft: predicted decode tok/s at the calibration's k and at its best k."""

    worker: str  # "" for local SD and AR
    backend: str
    k: int
    tok_s: float
    best_k: int
    best_tok_s: float
    assumed: bool = False  # rests on an assumed hit rate, not on a measurement


def _tok_s(
    target: Target,
    draft_s: float,
    acceptance: Acceptance,
    k: int,
    link: Link,
    transport: Transport,
    overhead: float,
) -> float:
    p = predict(target, draft_s, acceptance, k, link, transport)
    return p.tokens_per_round / (p.round_s + overhead)


def _option(
    worker: str,
    backend: str,
    k: int,
    inputs: tuple[float, Acceptance, Link, Transport],
    target: Target,
    overhead: float,
    assumed: bool = False,
) -> Option:
    draft_s, acceptance, link, transport = inputs
    by_k = {j: _tok_s(target, draft_s, acceptance, j, link, transport, overhead) for j in KS}
    best = max(by_k, key=lambda j: by_k[j])
    at_k = by_k[k] if k in by_k else _tok_s(target, draft_s, acceptance, k, link, transport, overhead)
    return Option(worker, backend, k, at_k, best, by_k[best], assumed)


def project(
    record: dict[str, Any], hit_rate: float | None = None, acceptance: float | None = None
) -> dict[str, Any]:
    """AR, local SD and every remote backend per worker, predicted from ``record`` (a bench JSON).

    Pre-speculation is projected as its own row measured it (on-demand
    drafting, and the wait for a speculative pass in flight); with
    ``hit_rate``, or for a worker without such a row, also from its stream
    row at ``hit_rate`` (or ``ASSUMED_HIT_RATE``), labelled as assumed.
    """
    by_row = runs_by_row(record)
    target = fit_target(record["runs"])
    ar_rows = [i for i, row in enumerate(record["rows"]) if row["kind"] == "ar"]
    overhead = engine_overhead_s(by_row[ar_rows[0]]) if ar_rows else 0.0
    floors = worker_floors(record)
    k = int(record["settings"]["k"])
    ar_target = row_target(target, by_row[ar_rows[0]]) if ar_rows else target
    ar = 1 / (ar_target.verify_s(1) + overhead)
    options: list[Option] = []
    stream_inputs: dict[str, tuple[tuple[float, Acceptance, Link, Transport], Target]] = {}
    for i, row in enumerate(record["rows"]):
        if row["kind"] == "ar" or row["multi"] or not by_row[i]:
            continue
        try:
            draft_s, measured, link, transport = row_inputs(row, by_row[i], floors.get(row["worker"]))
        except ValueError:
            continue  # too short to measure
        own = row_target(target, by_row[i])  # as check_bench: this row's own verification
        alpha = measured if acceptance is None else Acceptance((acceptance,))
        inputs = (draft_s, alpha, link, transport)
        if row["kind"] == "local":
            options.append(_option("", "local SD", k, inputs, own, overhead))
        elif row["backend"] == "ggml-rpc":
            options.append(_option(row["worker"], f"ggml-rpc/{row['granularity']}", k, inputs, own, overhead))
        elif row["prespec"]:  # as measured: on-demand drafting and the wait for a pass in flight
            if _rounds_after_open(by_row[i]) < MIN_PRESPEC_ROUNDS:
                continue  # too few to say: projected from the stream row below, at an assumed rate
            hit, partial = prespec_outcomes(by_row[i])
            name = f"stream+prespec (measured: {hit:.0%} hits, {partial:.0%} partial)"
            options.append(_option(row["worker"], name, k, inputs, own, overhead))
        else:
            options.append(_option(row["worker"], "stream", k, inputs, own, overhead))
            stream_inputs[row["worker"]] = (inputs, own)
    measured_prespec = {o.worker for o in options if o.backend.startswith("stream+prespec")}
    for worker, ((draft_s, alpha, link, transport), own) in stream_inputs.items():
        if worker not in measured_prespec or hit_rate is not None:  # the stream row's, at a given rate
            assumed = ASSUMED_HIT_RATE if hit_rate is None else hit_rate
            prespec = replace(transport, backend="stream+prespec", hit=assumed, partial=0.0)
            name = f"stream+prespec ({assumed:.0%} hits, assumed)"
            options.append(
                _option(worker, name, k, (draft_s, alpha, link, prespec), own, overhead, assumed=True)
            )
    local = next((o.tok_s for o in options if o.backend == "local SD"), None)
    workers = sorted({o.worker for o in options if o.worker})
    # Advice rests on what was measured: an assumed hit rate is shown, never recommended.
    advisable = [o for o in options if not o.assumed]
    best = {w: max((o for o in advisable if o.worker == w), key=lambda o: o.best_tok_s) for w in workers}
    rows: list[dict[str, Any]] = []
    for o in options:
        rows.append(
            {
                "worker": o.worker,
                "backend": o.backend,
                "k": o.k,
                "tok_s": o.tok_s,
                "best_k": o.best_k,
                "best_tok_s": o.best_tok_s,
                "delta_vs_ar": o.best_tok_s / ar - 1,
                "delta_vs_local": None if local is None else o.best_tok_s / local - 1,
                "assumed": o.assumed,
            }
        )
    choice = {w: {"backend": o.backend, "k": o.best_k, "tok_s": o.best_tok_s} for w, o in best.items()}
    return {"ar_tok_s": ar, "local_sd_tok_s": local, "rows": rows, "best": choice}
