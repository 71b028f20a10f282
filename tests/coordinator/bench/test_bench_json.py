"""``coordinator bench`` end to end: tables, JSON schema, lossless, proof of remote execution.

The bench runs the tiny model (target, local draft and worker): the
machinery is the point, and every row, the per-op one included, takes well
under a second.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from coordinator.planning.planner import START_MARGIN
from coordinator.planning.setups import MODES
from tests.support.processes.cli import run_cli
from tests.support.processes.workers import WorkerProcess

# A run recorded in docs/runs: its per-run records are left out.
RECORDED_RUN = Path(__file__).parents[3] / "docs" / "runs" / "testbed-paper-2026-11-28-run1.json"
ROW_FIELDS = {
    "label": str,
    "kind": str,
    "backend": str,
    "granularity": str,
    "worker": str,
    "decode_tok_s": float,
    "measured": bool,
    "measured_share": float,
    "not_measured": type(None),
    "decode_tok_s_as_run": float,
    "tok_s_by_category": dict,
    "delta_vs_ar": (float, type(None)),
    "delta_vs_local": (float, type(None)),
    "acceptance_rate": (float, type(None)),
    "mean_accepted": (float, type(None)),
    "ttft_s": float,
    "itl_ms": dict,
    "effective_draft_tok_s": (float, type(None)),
    "local_draft_tok_s": (float, type(None)),
    "lossless": (bool, type(None)),
    "mismatches": list,
    "verified": (bool, type(None)),
    "counters": dict,
    "identity": dict,
    "attribution": (dict, type(None)),
    "prespec": bool,
    "drafting": (dict, type(None)),
}
RUN_FIELDS = {
    "row": int,
    "prompt": int,
    "category": str,
    "repeat": int,
    "tokens": list,
    "finish_reason": str,
    "decode_tok_s": float,
    "ttft_s": float,
    "prefill_s": float,
    "total_s": float,
    "token_offsets_ns": list,
    "rounds": dict,
    "calls": dict,
    "counters": dict,
    "verified": bool,
    "worker_identity": dict,
}
CALL_COLUMNS = {
    "kind",
    "wall_ns",
    "serialize_ns",
    "deserialize_ns",
    "bytes_sent",
    "bytes_received",
    "worker_deserialize_ns",
    "worker_receive_to_start_ns",
    "worker_compute_ns",
    "worker_compute_to_reply_ns",
    "worker_serialize_ns",
    "coordinator_hops_ns",
}


def check_fields(record: dict[str, Any], fields: dict[str, Any]) -> None:
    assert set(fields) <= set(record), set(fields) - set(record)
    for key, kind in fields.items():
        value = record[key]
        if kind is float or (isinstance(kind, tuple) and float in kind):
            kind = (*(kind if isinstance(kind, tuple) else (kind,)), int)
        assert isinstance(value, kind), f"{key}={value!r} is not {kind}"


@pytest.fixture(scope="module")
def bench(tiny_worker: WorkerProcess, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str, Path]:
    tmp = tmp_path_factory.mktemp("bench")
    prompts = tmp / "prompts.jsonl"
    lines = [
        {"category": "code", "text": "def add(a, b):\n"},
        {"category": "text", "text": "The sky is blue because"},
    ]
    prompts.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = run_cli(
        "coordinator",
        "bench",
        "--workers",
        tiny_worker.address,
        "--backend",
        "auto,stream,stream+prespec+fill+tree,ggml-rpc",
        "--granularity",
        "op,round",
        "--target",
        "tiny",
        "--local-draft",
        "tiny",
        "--max-tokens",
        "16",
        "--k",
        "2",
        "--rows",
        "2,4",
        "--prompts",
        str(prompts),
        "--no-chat",
        "--json",
        str(tmp / "bench.json"),
        "--markdown",
        str(tmp / "bench.md"),
        "--plot",
        str(tmp / "bench.png"),
        timeout=900,
    )
    assert out.returncode == 0, out.stderr
    return json.loads((tmp / "bench.json").read_text()), out.stdout, tmp


def test_schema(bench: tuple[dict, str, Path]) -> None:
    data, _, _ = bench
    assert data["schema"] == "specwire.bench/1"
    assert {"settings", "coordinator", "workers", "rows", "runs", "lossless", "skipped"} <= set(data)
    assert data["skipped"] == []  # the worker serves every row asked of it
    assert data["settings"]["max_tokens"] == 16 and data["settings"]["prompts"] == 2
    assert data["coordinator"]["peak_rss_bytes"] > 0
    (w,) = data["workers"]
    assert {
        "name",
        "identity",
        "model",
        "backends",
        "local_draft_tok_s",
        "probe_tcp",
        "peak_rss_bytes",
    } <= set(w)
    assert w["peak_rss_bytes"] > 0 and len(w["probe_tcp"]) == 5
    kinds = [r["kind"] for r in data["rows"]]
    assert kinds == ["ar", "local", "auto", "remote", "remote", "remote", "remote", "remote"]
    trees = [r for r in data["rows"] if r["tree"]]  # the worker's tree at each --rows
    assert [(r["rows"], r["label"].split(" → ")[0]) for r in trees] == [
        (2, "stream+prespec+fill+tree ×2"),
        (4, "stream+prespec+fill+tree ×4"),
    ]
    for row in data["rows"]:
        check_fields(row, ROW_FIELDS)
    assert len(data["runs"]) == 2 * len(data["rows"])
    for run in data["runs"]:
        check_fields(run, RUN_FIELDS)
        assert set(run["calls"]) == CALL_COLUMNS
        assert len({len(v) for v in run["calls"].values()}) == 1


def test_lossless_for_both_backends_and_counters_match(
    bench: tuple[dict, str, Path], tiny_worker: WorkerProcess
) -> None:
    worker = tiny_worker
    data, _, _ = bench
    assert data["lossless"] is True
    remote = [r for r in data["rows"] if r["kind"] == "remote"]
    assert {r["backend"] for r in remote} == {"stream", "ggml-rpc"}
    for row in remote:
        assert row["lossless"] is True and row["verified"] is True
        assert row["measured"] is True and row["measured_share"] == 1.0 and row["decode_tok_s"] > 0
        assert row["acceptance_rate"] == 1.0  # the fast pair drafts for itself: every draft is the target's
        assert row["identity"]["pid"] == worker.pid and row["identity"]["session_identities_match"] is True
        c = row["counters"]
        if row["backend"] == "stream":
            assert c["client_messages_sent"] == c["worker_messages_received"] > 0
            assert c["client_messages_received"] == c["worker_messages_sent"]
            assert c["client_draft_tokens"] == c["worker_draft_tokens"] > 0
            if row["prespec"]:
                assert c["client_prespec_hits"] == c["worker_prespec_hits"]
                assert c["client_prespec_misses"] == c["worker_prespec_misses"]
                assert c["worker_speculative_passes"] > 0
                assert row["drafting"]["hit_rate"] is not None and row["drafting"]["saved_ms"] is not None
        else:
            assert c["client_calls"] == c["worker_graphs"] > 0 and c["client_ops"] == c["worker_ops"]
        attribution = row["attribution"]
        assert attribution["calls"] > 0
        # Worker compute on the critical path: none for a tree, which answers with what is ready.
        assert (attribution["per_draft_token"]["compute_ms"] > 0) != row["fill"]
    index = {r["label"]: i for i, r in enumerate(data["rows"])}
    round_row = index[next(r["label"] for r in remote if r["granularity"] == "round")]
    stream_row = index[next(r["label"] for r in remote if r["backend"] == "stream")]

    def calls(row: int) -> int:
        return sum(len(run["calls"]["kind"]) for run in data["runs"] if run["row"] == row)

    # One call per draft round at `round` granularity, as on the stream backend.
    assert calls(round_row) == calls(stream_row) > 0


def test_the_auto_row_is_lossless_says_what_it_ran_and_comes_first_in_the_report(
    bench: tuple[dict, str, Path],
) -> None:
    data, stdout, _ = bench
    (auto,) = [r for r in data["rows"] if r["kind"] == "auto"]
    assert auto["lossless"] is True and auto["verified"] is True
    assert auto["identity"]["session_identities_match"] is True
    by_setup = auto["counters"]["rounds_by_setup"]
    assert sum(by_setup.values()) == sum(len(run["rounds"]["k"]) for run in data["runs"] if run["row"] == 2)
    runs = [run for run in data["runs"] if run["row"] == 2]
    assert all(run["switches"][0]["reason"].startswith("predicted") for run in runs)
    chosen = max(by_setup, key=by_setup.get)
    assert stdout.splitlines()[0].startswith(f"auto chose {chosen} and made ")
    local = next(r for r in data["rows"] if r["kind"] == "local")  # the only row without a worker here
    ratio = auto["decode_tok_s"] / local["decode_tok_s"]
    assert f"{ratio:.2f}× local SD ({local['decode_tok_s']:.1f}), the best row without a worker" in stdout
    assert "The drafting policy (auto)" in stdout


def test_tables_markdown_and_plot(bench: tuple[dict, str, Path]) -> None:
    _, stdout, tmp = bench
    assert "Table 1." in stdout and "Table 2." in stdout and "Table 3." in stdout and "Table 4." in stdout
    assert "Proof of remote execution" in stdout and "NOT VERIFIED" not in stdout and ": verified" in stdout
    assert "| Draft backend | Avg TPS |" in (tmp / "bench.md").read_text()
    assert (tmp / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plan_predicts_every_row_of_the_bench_but_auto_and_trees(bench: tuple[dict, str, Path]) -> None:
    data, _, tmp = bench
    out = run_cli(
        "coordinator", "plan", "--from-bench", str(tmp / "bench.json"), "--json", str(tmp / "plan.json")
    )
    assert out.returncode == 0, out.stderr
    rows = json.loads((tmp / "plan.json").read_text())["rows"]
    # auto's set-up varies from round to round; a tree round mixes the worker's drafts and the local fill
    fixed = [r for r in data["rows"] if r["kind"] != "auto" and not r.get("tree")]
    left_out = [r["label"] for r in data["rows"] if r not in fixed]
    assert left_out and all(label in out.stdout.split("not modelled")[-1] for label in left_out)
    assert [r["label"] for r in rows] == [r["label"] for r in fixed]
    for row, measured in zip(rows, fixed, strict=True):
        assert row["measured_tok_s"] == measured["decode_tok_s"]
        assert row["predicted_tok_s"] > 0 and row["parts_ms"]["verify"] > 0
    assert "error" in out.stdout


def test_plan_refuses_a_file_that_is_not_a_bench(tmp_path: Path) -> None:
    path = tmp_path / "other.json"
    path.write_text('{"schema": "something/else"}')
    out = run_cli("coordinator", "plan", "--from-bench", str(path))
    assert out.returncode == 1 and "is not a coordinator bench JSON" in out.stderr
    missing = run_cli("coordinator", "plan", "--from-bench", str(tmp_path / "missing.json"))
    assert missing.returncode == 1 and "cannot read the bench JSON" in missing.stderr
    recorded = run_cli("coordinator", "plan", "--from-bench", str(RECORDED_RUN))
    assert recorded.returncode == 1 and "holds no per-run records" in recorded.stderr
    assert "Traceback" not in recorded.stderr


def test_plan_measures_this_set_up_and_predicts_what_auto_chooses_from(
    tiny_worker: WorkerProcess, tmp_path: Path
) -> None:
    args = ["plan", "--target", "tiny", "--local-draft", "tiny", "--workers", tiny_worker.address]
    out = run_cli("coordinator", *args, "--json", str(tmp_path / "plan.json"))
    assert out.returncode == 0, out.stderr
    plan = json.loads((tmp_path / "plan.json").read_text())
    (worker,) = plan["measured"]["workers"]
    assert worker["name"] == tiny_worker.name and worker["tree"] is True
    assert worker["curve"]["pass_ms"] > 0 and worker["link_rtt_ms"] > 0
    modes = {(r["mode"], r["worker"]) for r in plan["rows"]}
    title = worker["title"]
    # On this very machine, unpaced, the worker shares its processors: only drafting on demand is planned.
    assert worker["colocated"] is True
    assert {("ar", ""), ("local", ""), ("local-tree", ""), ("stream", title)} == modes
    best = max(plan["rows"], key=lambda r: r["tok_s"])
    # auto takes the simplest set-up predicted within START_MARGIN of the fastest
    assert plan["auto"]["tok_s"] >= best["tok_s"] * (1 - START_MARGIN)
    simplest = min(
        (r for r in plan["rows"] if r["tok_s"] >= best["tok_s"] * (1 - START_MARGIN)),
        key=lambda r: MODES.index(r["mode"]),
    )
    assert plan["auto"]["setup"].startswith(simplest["setup"])
    assert f"auto would choose {plan['auto']['setup']}" in out.stdout
