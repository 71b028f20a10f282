"""``coordinator bench`` skips the rows a worker cannot serve, says why, and runs the rest (exit 0).

Real workers on 127.0.0.1 serving the tiny model: one that offers only the
stream protocol (``worker serve --backends stream``), and one holding
another token, so the bench cannot use it at all.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.coordinator.workers.unfit import other_token_worker
from tests.support.cli import run_cli
from tests.support.workers import running_worker, unique_name


def test_rows_a_worker_cannot_serve_are_skipped_with_the_reason_and_the_rest_run(tmp_path: Path) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The sky is blue because\n")
    report = tmp_path / "bench.json"
    stream_only = ("--model", "tiny", "--name", unique_name("stream-only-bench"), "--backends", "stream")
    with running_worker(*stream_only) as worker, other_token_worker(tmp_path, "bench-other-token") as refused:
        out = run_cli(
            "coordinator",
            "bench",
            *("--workers", f"{worker.address},{refused.address}"),
            *("--backend", "stream,ggml-rpc", "--granularity", "op,token"),
            *("--target", "tiny", "--local-draft", "none", "--max-tokens", "8"),
            *("--prompts", str(prompts), "--json", str(report)),
        )
    assert out.returncode == 0, out.stderr
    data = json.loads(report.read_text())
    assert [(r["kind"], r["backend"]) for r in data["rows"]] == [("ar", ""), ("remote", "stream")]
    assert data["rows"][1]["worker"] == worker.name and data["rows"][1]["verified"] is True

    skipped = data["skipped"]
    per_op = [s for s in skipped if s["worker"] == worker.name]
    assert [(s["backend"], s["granularity"]) for s in per_op] == [("ggml-rpc", "op"), ("ggml-rpc", "token")]
    assert all("does not offer the ggml-rpc backend (it offers stream)" in s["reason"] for s in per_op)
    (whole,) = [s for s in skipped if s["worker"] == refused.address]
    assert whole["backend"] == "stream,ggml-rpc" and "another token" in whole["reason"]

    said = [line for line in out.stderr.splitlines() if line.startswith("bench: skipped ")]
    assert len(said) == len(skipped) == 3  # one line each
    assert all(any(s["label"] in line and s["reason"] in line for line in said) for s in skipped)
    assert "Rows skipped" in out.stdout and out.stdout.count("skipped ggml-rpc/") == 2
