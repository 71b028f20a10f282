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

from coordinator.planning.from_bench import calibrate, prespec_outcomes
from coordinator.planning.model import Acceptance, Link, Target, Transport, best_k, predict

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


def _option(
    worker: str,
    backend: str,
    k: int,
    inputs: tuple[float, Acceptance, Link, Transport],
    target: Target,
    assumed: bool = False,
) -> Option:
    draft_s, acceptance, link, transport = inputs
    best = best_k(target, draft_s, acceptance, link, transport, KS)
    at_k = predict(target, draft_s, acceptance, k, link, transport)
    return Option(worker, backend, k, at_k.tok_s, best.k, best.tok_s, assumed)


def project(
    record: dict[str, Any], hit_rate: float | None = None, acceptance: float | None = None
) -> dict[str, Any]:
    """AR, local SD and every remote backend per worker, predicted from ``record`` (a bench JSON).

    Pre-speculation is projected as its own row measured it (on-demand
    drafting, and the wait for a speculative pass in flight); with
    ``hit_rate``, or for a worker without such a row, also from its stream
    row at ``hit_rate`` (or ``ASSUMED_HIT_RATE``), labelled as assumed.
    """
    calibration = calibrate(record)
    k = int(record["settings"]["k"])
    options: list[Option] = []
    stream_rows: dict[str, tuple[tuple[float, Acceptance, Link, Transport], Target]] = {}
    for c in calibration.rows:
        row = c.row
        if c.inputs is None:
            continue  # AR
        draft_s, measured, link, transport = c.inputs
        alpha = measured if acceptance is None else Acceptance((acceptance,))
        inputs = (draft_s, alpha, link, transport)
        if row["kind"] == "local":
            options.append(_option("", "local SD", k, inputs, c.target))
        elif row["backend"] == "ggml-rpc":
            options.append(_option(row["worker"], f"ggml-rpc/{row['granularity']}", k, inputs, c.target))
        elif row["prespec"]:  # as measured: on-demand drafting and the wait for a pass in flight
            if _rounds_after_open(c.runs) < MIN_PRESPEC_ROUNDS:
                continue  # too few to say: projected from the stream row below, at an assumed rate
            hit, partial = prespec_outcomes(c.runs)
            name = f"stream+prespec (measured: {hit:.0%} hits, {partial:.0%} partial)"
            options.append(_option(row["worker"], name, k, inputs, c.target))
        else:
            options.append(_option(row["worker"], "stream", k, inputs, c.target))
            stream_rows[row["worker"]] = (inputs, c.target)
    measured_prespec = {o.worker for o in options if o.backend.startswith("stream+prespec")}
    for worker, ((draft_s, alpha, link, transport), target) in stream_rows.items():
        if worker not in measured_prespec or hit_rate is not None:  # the stream row's, at a given rate
            assumed = ASSUMED_HIT_RATE if hit_rate is None else hit_rate
            prespec = replace(transport, backend="stream+prespec", hit=assumed, partial=0.0)
            name = f"stream+prespec ({assumed:.0%} hits, assumed)"
            options.append(_option(worker, name, k, (draft_s, alpha, link, prespec), target, assumed=True))
    ar = calibration.ar_tok_s
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
