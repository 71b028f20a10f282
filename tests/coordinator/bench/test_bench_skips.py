"""``coordinator bench`` skips the rows a worker cannot serve, says why, and runs the rest (exit 0);
a row whose worker is lost while it runs prints no figure (exit 1).

Real workers on 127.0.0.1 serving the tiny model: one that offers only the
stream protocol (``worker serve --backends stream``), one holding another
token, so the bench cannot use it at all, and one killed (SIGKILL) as the
bench starts its per-op row, so that row fails over to the target alone.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.coordinator.workers.unfit import other_token_worker
from tests.support.processes import zygote
from tests.support.processes.cli import run_cli
from tests.support.processes.workers import running_worker, unique_name


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


def test_a_row_whose_worker_was_lost_prints_no_figure_and_the_bench_fails(tmp_path: Path) -> None:
    """The paper's trap (section 4.5.4): a run that fell back to local decoding must not read as remote."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The sky is blue because\n")
    report = tmp_path / "bench.json"
    bench = [sys.executable, "-m", "coordinator.cli", "bench", "--backend", "ggml-rpc", "--granularity", "op"]
    bench += ["--target", "tiny", "--local-draft", "tiny", "--max-tokens", "24", "--repeats", "2"]
    bench += ["--prompts", str(prompts), "--no-chat", "--json", str(report)]
    with running_worker("--model", "tiny", "--name", unique_name("lost-bench")) as worker:
        process = zygote.popen([*bench, "--workers", worker.address])
        assert process.stderr is not None
        err = []
        for line in process.stderr:  # the progress line names each run before it starts
            err.append(line)
            if "ggml-rpc/op" in line and worker.process.poll() is None:
                worker.process.kill()
        stdout = process.stdout.read() if process.stdout else ""
        code = process.wait(60)
    stderr = "".join(err)
    assert code == 1, stderr
    assert "not measured, " in stderr and "worker loss" in stderr and "Traceback" not in stderr
    data = json.loads(report.read_text())
    (ar, local, per_op) = data["rows"]
    assert ar["measured"] and local["measured"] and local["decode_tok_s"] > 0
    assert per_op["measured"] is False and per_op["decode_tok_s"] is None
    assert 0 <= per_op["measured_share"] < 1 and per_op["delta_vs_ar"] is None
    assert per_op["lossless"] is True  # what it produced is still the target's own output
    assert "worker loss" in per_op["not_measured"] and per_op["decode_tok_s_as_run"] > 0
    table = next(line for line in stdout.splitlines() if line.startswith("ggml-rpc/op"))
    assert "NOT MEASURED" in table or "PARTLY" in table
    assert f"{per_op['decode_tok_s_as_run']:.2f}" not in stdout  # the fallback's speed is printed nowhere
    assert "Rows not measured" in stdout
