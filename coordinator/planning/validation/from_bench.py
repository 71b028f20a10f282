"""The model's inputs as one bench run measured them, and its prediction for every row of that run.

Measured once for the whole run: the target's verification pass (a least-
squares line of verify time against positions, over every round of every
row, shifted per row to that row's own mean verification, since workers on
the same machine slow it) and the engine's own time per round outside
drafting and verifying (AR row: decode time minus verification, per round). Measured per row: drafts
accepted per round; the draft pass (local rows: the coordinator's drafting
time per draft; remote rows: the worker's compute per draft); for remote
rows the link (the bench's raw-TCP probe at the call's bytes), the
protocol (per call: wall + the coordinator's hops - compute - that floor,
mean; the per-op source records no hops, so its share of the engine's
drafting time outside its calls is spread over them), calls per draft
(per-op), and for pre-speculation the wait for a pass in flight.

The prediction then composes them with the model's formulas, so a row
that the model predicts well is one whose time is accounted for by those
parts, and a miss names the part the model leaves out.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from coordinator.bench.summary import mean_of_medians
from coordinator.planning.model import Acceptance, Link, Target, Transport, ar_tok_s, predict
from coordinator.workers.netprobe import NetworkFloor, RttSummary


@dataclass(frozen=True)
class RowCheck:
    """One bench row: measured and predicted decode tok/s."""

    label: str
    measured_tok_s: float
    predicted_tok_s: float
    parts_ms: dict[str, float]

    @property
    def error(self) -> float:
        """Relative error of the prediction."""
        return self.predicted_tok_s / self.measured_tok_s - 1


def _rounds(runs: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    keys = ("k", "drafted", "accepted", "draft_ns", "verify_ns")
    return {k: np.concatenate([np.asarray(r["rounds"][k], dtype=float) for r in runs]) for k in keys}


def fit_target(runs: list[dict[str, Any]]) -> Target:
    """verify(n) = verify_1 + (n - 1) * per_position, least squares over every round."""
    rounds = _rounds(runs)
    positions, verify = rounds["drafted"] + 1, rounds["verify_ns"] / 1e9
    if len(set(positions.tolist())) < 2:
        return Target(float(np.median(verify)))
    slope, intercept = np.polyfit(positions - 1, verify, 1)
    if slope < 0:  # noise: verification does not get faster with more positions
        return Target(float(np.median(verify)))
    return Target(float(intercept), float(slope))


def row_target(fitted: Target, runs: list[dict[str, Any]]) -> Target:
    """``fitted``, shifted so that verifying this row's k + 1 positions takes what it took in this row.

    Verification is timed per row because the workers share the machine:
    a worker drafting ahead while the target verifies slows verification.
    """
    rounds = _rounds(runs)
    drafting = rounds["drafted"] > 0
    n = int(np.median(rounds["drafted"][drafting])) if drafting.any() else 0
    same = rounds["drafted"] == n
    if not same.any():
        return fitted
    measured = float(rounds["verify_ns"][same].mean()) / 1e9
    return replace(fitted, verify_1_s=measured - n * fitted.per_position_s)


def engine_overhead_s(ar_runs: list[dict[str, Any]]) -> float:
    """The engine's time per round outside verifying (AR: no drafting), from the AR row."""
    decode = sum(r["total_s"] - r["prefill_s"] for r in ar_runs)
    rounds = _rounds(ar_runs)
    return max(0.0, (decode - rounds["verify_ns"].sum() / 1e9) / len(rounds["verify_ns"]))


def _calls(runs: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    keys = (
        "wall_ns",
        "worker_compute_ns",
        "worker_receive_to_start_ns",
        "bytes_sent",
        "bytes_received",
        "coordinator_hops_ns",
    )
    kinds = np.concatenate([np.asarray(r["calls"]["kind"]) for r in runs]) if runs else np.array([])
    keep = kinds != "open"
    columns = {
        k: [np.asarray(r["calls"].get(k, [0] * len(r["calls"]["kind"])), dtype=float) for r in runs]
        for k in keys
    }
    return {k: np.concatenate(v)[keep] for k, v in columns.items()}


def row_inputs(
    row: dict[str, Any], runs: list[dict[str, Any]], floor: NetworkFloor | None
) -> tuple[float, Acceptance, Link, Transport]:
    """(draft pass s, acceptance, link, transport) of one row, from its own runs.

    Raises ``ValueError`` when the row has too little to measure (no drafting
    round, or no call after a session's Open).
    """
    rounds = _rounds(runs)
    drafting = rounds["drafted"] > 0
    if not drafting.any():
        raise ValueError(f"{row['label']}: no drafting round")
    k = int(np.median(rounds["k"][drafting]))
    full = drafting & (rounds["k"] == k)  # the last rounds of a generation ask for fewer
    mean_accepted = float(rounds["accepted"][full if full.any() else drafting].mean())
    acceptance = Acceptance.constant_for(mean_accepted, k)
    drafted = rounds["drafted"].sum()
    if row["kind"] == "local":
        return float(rounds["draft_ns"].sum() / 1e9 / drafted), acceptance, Link(), Transport("local")
    calls = _calls(runs)
    if floor is None or not len(calls["wall_ns"]):
        raise ValueError(f"{row['label']}: no call after the Open, or no link probe")
    floors = np.array(
        [floor.call_ns(s, r) for s, r in zip(calls["bytes_sent"], calls["bytes_received"], strict=True)]
    )
    beyond = calls["wall_ns"] + calls["coordinator_hops_ns"] - calls["worker_compute_ns"] - floors
    if row["backend"] == "ggml-rpc":  # its calls record no hops: the engine's drafting time beyond them
        outside = rounds["draft_ns"].sum() - calls["wall_ns"].sum()
        beyond = beyond + max(float(outside), 0.0) / len(calls["wall_ns"])
    protocol_s = float(np.mean(beyond)) / 1e9  # throughput pays the mean, spikes included
    if row["backend"] == "stream":  # a session's first round rides on its Open, with the prefill: not counted
        drafted = sum(sum(r["rounds"]["drafted"][1:]) for r in runs)
    draft_s = float(calls["worker_compute_ns"].sum() / 1e9 / max(drafted, 1))
    rtt_s = float(np.median(floors)) / 1e9
    link = Link(rtt_s=rtt_s)  # the probe's floor already includes the bytes of a call
    if row["backend"] == "ggml-rpc":  # calls per draft pass; at `round` granularity one per round, whatever k
        n = len(calls["wall_ns"])
        per_round = row["granularity"] == "round"
        transport = Transport(
            "ggml-rpc",
            per_call_s=protocol_s,
            calls_per_pass=0.0 if per_round else n / drafted,
            calls_per_round=n / max(int(drafting.sum()), 1) if per_round else 0.0,
        )
        return draft_s, acceptance, link, transport
    if row["prespec"]:
        # The worker's compute per round is already only what was drafted on demand (a hit or a
        # partial hit made the rest while the target verified), so drafting enters as measured; the
        # wait for a speculative pass in flight is the worker's receive-to-start beyond its least.
        waits = calls["worker_receive_to_start_ns"] - calls["worker_receive_to_start_ns"].min()
        protocol_s = float(np.mean(beyond - waits)) / 1e9
        in_flight_s = float(np.mean(waits)) / 1e9
        transport = Transport("stream+prespec", per_round_s=protocol_s, in_flight_s=in_flight_s)
        return draft_s, acceptance, link, transport
    return draft_s, acceptance, link, Transport("stream", per_round_s=protocol_s)


def runs_by_row(bench: dict[str, Any]) -> dict[int, list[dict[str, Any]]]:
    """Each row's runs, by row index."""
    return {i: [r for r in bench["runs"] if r["row"] == i] for i in range(len(bench["rows"]))}


def worker_floors(bench: dict[str, Any]) -> dict[str, NetworkFloor]:
    """Each worker's bare-TCP floor, from the probe the bench ran."""
    return {w["name"]: NetworkFloor([RttSummary(**s) for s in w["probe_tcp"]]) for w in bench["workers"]}


def prespec_outcomes(runs: list[dict[str, Any]]) -> tuple[float, float]:
    """Fractions of drafting rounds served whole (hit) and in part (partial) by pre-speculation."""
    served = [  # after each session's first round, which its Open serves
        s
        for r in runs
        for s, d in zip(r["rounds"]["speculation"][1:], r["rounds"]["drafted"][1:], strict=True)
        if d
    ]
    n = max(len(served), 1)
    return served.count("hit") / n, served.count("partial") / n


@dataclass(frozen=True)
class CalibratedRow:
    """One bench row's model inputs (None for AR) and its own target (verification as this row timed it)."""

    row: dict[str, Any]
    runs: list[dict[str, Any]]
    target: Target
    inputs: tuple[float, Acceptance, Link, Transport] | None  # draft pass, acceptance, link, transport


@dataclass(frozen=True)
class Calibration:
    """What one bench run says about its machines, row by row, and the target alone.

    ``fitted`` is the target's verification over the whole run, and
    ``floors`` each worker's network floor; a row's inputs are refined from
    them per row (``rows``) or per run (``predict_run``).
    """

    ar_target: Target
    rows: list[CalibratedRow]
    fitted: Target
    floors: dict[str, NetworkFloor]

    @property
    def ar_tok_s(self) -> float:
        """AR decode tok/s on this target (the AR row's own verification, when the run has one)."""
        return ar_tok_s(self.ar_target)


def unmodelled(row: dict[str, Any]) -> bool:
    """Whether ``--from-bench`` leaves this row out (``calibrate``)."""
    return bool(row.get("multi") or row.get("tree") or row.get("fill") or row["kind"] == "auto")


def calibrate(bench: dict[str, Any]) -> Calibration:
    """Every row's inputs, once. Left out (``unmodelled``): auto (it switches set-ups), tree rows (their
    rounds mix a worker's drafts with the local model's fill, which these inputs do not separate: the
    profile's tree model, ``plan --profile --check-bench``, predicts them), rows of several workers at
    once (retired races) and rows too short to measure (a calibration that ended in its first round)."""
    by_row = runs_by_row(bench)
    fitted = fit_target(bench["runs"])
    ar = [i for i, row in enumerate(bench["rows"]) if row["kind"] == "ar"]
    if ar:
        fitted = replace(fitted, engine_s=engine_overhead_s(by_row[ar[0]]))
    floors = worker_floors(bench)
    rows = []
    for i, row in enumerate(bench["rows"]):
        if not by_row[i] or unmodelled(row) or row.get("measured") is False:  # no figure: a worker failed
            continue
        inputs = None
        if row["kind"] != "ar":
            try:
                inputs = row_inputs(row, by_row[i], floors.get(row["worker"]))
            except ValueError:
                continue
        rows.append(CalibratedRow(row, by_row[i], row_target(fitted, by_row[i]), inputs))
    ar_target = next((c.target for c in rows if c.inputs is None), fitted)
    return Calibration(ar_target, rows, fitted, floors)


def predict_run(calibration: Calibration, row: CalibratedRow, run: dict[str, Any]) -> float:
    """Decode tok/s of one run from that run's own inputs (the row's, where the run is too short)."""
    target = row_target(calibration.fitted, [run])
    if row.inputs is None:  # AR
        return ar_tok_s(target)
    try:
        draft_s, acceptance, link, transport = row_inputs(
            row.row, [run], calibration.floors.get(row.row["worker"])
        )
    except ValueError:
        draft_s, acceptance, link, transport = row.inputs
    return predict(target, draft_s, acceptance, acceptance.at_k, link, transport).tok_s


def check_bench(bench: dict[str, Any]) -> list[RowCheck]:
    """Predicted against measured decode tok/s for every row of one bench run.

    Each run is predicted from its own inputs, and the predictions are
    averaged as the bench averages its measurements (the median over repeats
    of each prompt, then the mean over prompts), so one slow run (a cold
    kernel cache, a disturbed machine) weighs the same in both.
    """
    calibration = calibrate(bench)
    checks = []
    for c in calibration.rows:
        measured = c.row["decode_tok_s"]
        per_run = [(r["prompt"], r["category"], predict_run(calibration, c, r)) for r in c.runs]
        predicted = mean_of_medians(per_run)[0]
        if c.inputs is None:  # AR
            parts = {"verify": c.target.verify_s(1), "engine": c.target.engine_s}
        else:
            draft_s, acceptance, link, transport = c.inputs
            parts = predict(c.target, draft_s, acceptance, acceptance.at_k, link, transport).parts_s
        checks.append(RowCheck(c.row["label"], measured, predicted, _ms(parts)))
    return checks


def _ms(parts_s: dict[str, float]) -> dict[str, float]:
    return {name: v * 1e3 for name, v in parts_s.items()}
