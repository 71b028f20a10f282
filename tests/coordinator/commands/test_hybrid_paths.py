"""Hybrid models (Qwen3.5's layout) on every path: bench, plan, serve, failover and several workers.

Two real workers serve ``tiny-hybrid-draft``; the target is ``tiny-hybrid``
(it accepts some of those drafts, so both sides roll recurrent state back),
and the llama ``tiny`` worker pairs with it across architectures. At T = 0
every output must be the target's own.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator

import pytest

from specwire.models.loading import LoadedModel, load_model
from tests.coordinator.drafting.test_worker_loss import PROMPT, generate_through
from tests.support.processes.cli import run_cli
from tests.support.processes.servers import running_server
from tests.support.processes.workers import WorkerProcess, running_worker, unique_name
from tests.support.prompts import ar_tokens, text_ar_tokens
from tests.support.rounding import assert_lossless

pytestmark = pytest.mark.anyio
HYBRID_WORKER = ("--model", "tiny-hybrid-draft")


@pytest.fixture(scope="module")
def hybrid() -> LoadedModel:
    return load_model("tiny-hybrid")


@pytest.fixture(scope="module")
def hybrid_workers() -> Iterator[tuple[WorkerProcess, WorkerProcess]]:
    with (
        running_worker(*HYBRID_WORKER, "--name", unique_name("hybrid-a"), "--no-advertise") as a,
        running_worker(*HYBRID_WORKER, "--name", unique_name("hybrid-b")) as b,
    ):
        yield a, b


@pytest.fixture(scope="module")
def bench(
    hybrid_workers: tuple[WorkerProcess, WorkerProcess], tmp_path_factory: pytest.TempPathFactory
) -> dict:
    tmp = tmp_path_factory.mktemp("hybrid-bench")
    (tmp / "prompts.txt").write_text("The lighthouse keeper\n")
    a, b = hybrid_workers
    out = run_cli(
        "coordinator",
        "bench",
        "--target",
        "tiny-hybrid",
        "--local-draft",
        "tiny-hybrid-draft",
        "--workers",
        f"{a.address},{b.address}",
        "--backend",
        "auto,stream,ggml-rpc",
        "--granularity",
        "op",
        "--max-tokens",
        "16",
        "--k",
        "3",
        "--prompts",
        str(tmp / "prompts.txt"),
        "--no-chat",
        "--json",
        str(tmp / "bench.json"),
        timeout=900,
    )
    assert out.returncode == 0, out.stderr
    return {
        "data": json.loads((tmp / "bench.json").read_text()),
        "stdout": out.stdout,
        "path": tmp / "bench.json",
    }


def test_bench_rows_with_hybrid_models_are_lossless_and_verified(bench: dict) -> None:
    data = bench["data"]
    assert data["lossless"] is True
    kinds = {(r["kind"], r["backend"], r["granularity"], r["mode"]) for r in data["rows"]}
    assert ("remote", "ggml-rpc", "op", "") in kinds and ("remote", "stream", "", "stream") in kinds
    assert ("auto", "", "", "") in kinds
    for row in data["rows"]:
        assert row["lossless"] is True, row["label"]
        if row["kind"] in ("remote", "auto"):
            assert row["verified"] is True and row["identity"]["session_identities_match"] is True
        if row["kind"] not in ("ar", "auto"):  # the target rolled its recurrent state back in one pass
            assert row["rollback"]["strategy"] == "states" and row["rollback"]["rounds"] > 0
            assert row["rollback"]["replayed"] == 0
    assert all(w["ops_per_pass"] == 13 + 15 + 5 for w in data["workers"])  # Gated DeltaNet + gated attention
    assert "rolled back" in bench["stdout"]
    run = data["runs"][1]
    assert run["rollback"]["strategy"] == "states" and len(run["rounds"]["rollback_ns"]) == len(
        run["rounds"]["k"]
    )


def test_plan_predicts_the_hybrid_bench(bench: dict) -> None:
    out = run_cli("coordinator", "plan", "--from-bench", str(bench["path"]))
    assert out.returncode == 0, out.stderr
    assert "error" in out.stdout


@pytest.mark.parametrize("backend", ["stream", "ggml-rpc"])
def test_serve_with_a_hybrid_target_and_hybrid_worker_is_the_target_alone(
    hybrid_workers: tuple[WorkerProcess, WorkerProcess], backend: str
) -> None:
    prompt, tokens = "Name three colors of the rainbow.", 16
    alone = run_cli(
        "coordinator", "generate", "--target", "tiny-hybrid", "--draft", "none", "--prompt", prompt,
        "--max-tokens", str(tokens), "--json",
    )  # fmt: skip
    assert alone.returncode == 0, alone.stderr
    expected = json.loads(alone.stdout)["text"]
    worker = hybrid_workers[0]
    args = ["--target", "tiny-hybrid", "--model-name", "hybrid", "--interface", "127.0.0.1"]
    with running_server(
        *args, "--draft", "remote", "--worker", worker.address, "--backend", backend
    ) as server:
        completion = server.client().completions.create(
            model="hybrid", prompt=prompt, max_tokens=tokens, temperature=0
        )
    assert completion.choices[0].text == expected
    figures = completion.model_extra["specwire"]  # type: ignore[attr-defined]
    assert figures["drafted"] > 0 and figures["worker"]["pid"] == worker.pid


def test_a_llama_target_drafted_by_a_hybrid_worker(
    hybrid_workers: tuple[WorkerProcess, WorkerProcess], tiny: LoadedModel
) -> None:
    args = ["--target", "tiny", "--prompt", "Once upon a time", "--max-tokens", "16", "--json"]
    remote = run_cli(
        "coordinator", "generate", "--draft", "remote", "--worker", hybrid_workers[1].address, *args
    )
    assert remote.returncode == 0, remote.stderr
    assert json.loads(remote.stdout)["token_ids"] == text_ar_tokens(tiny, "Once upon a time", 16)


@pytest.mark.parametrize("mode", ["tree", "tree-verify"])
def test_a_hybrid_worker_drafts_trees_losslessly(
    hybrid_workers: tuple[WorkerProcess, WorkerProcess], hybrid: LoadedModel, mode: str
) -> None:
    # Each node of the worker's tree keeps its own recurrent state; the hybrid target verifies the
    # worker's chain (tree) or its whole tree in one pass (tree-verify).
    worker = hybrid_workers[0]
    out = run_cli(
        "coordinator", "generate", "--target", "tiny-hybrid", "--local-draft", "tiny-hybrid-draft",
        "--draft", f"remote:{mode}", "--worker", worker.address, "--prompt", "Hello",
        "--max-tokens", "16", "--json",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["token_ids"] == text_ar_tokens(hybrid, "Hello", 16)
    stats = json.loads(out.stdout)["stats"]
    assert stats["worker"]["pid"] == worker.pid


@pytest.mark.parametrize("mode", ["stream"])
async def test_a_killed_hybrid_worker_fails_over_losslessly(
    hybrid_workers: tuple[WorkerProcess, WorkerProcess], hybrid: LoadedModel, mode: str
) -> None:
    # The whole accepted context is replayed into a new session on a worker found by Bonjour (the
    # advertised hybrid worker, or another), whose drafter builds its recurrent state from scratch.
    with running_worker("--model", "tiny-hybrid-draft", "--name", unique_name("doomed-hybrid")) as doomed:
        result, source, _ = await generate_through(
            doomed.address,
            hybrid,
            "failover",
            4,
            lambda: os.kill(doomed.pid, signal.SIGKILL),
            mode=mode,
        )
    prompt = hybrid.tokenizer.encode(PROMPT)
    assert_lossless(hybrid, prompt, ar_tokens(hybrid, prompt, len(result.tokens)), result.tokens)
    assert len(result.tokens) == 16
    (loss,) = source.losses
    assert loss.worker == doomed.name and "drafting continues on stream" in loss.action
    assert any(r.drafted for r in result.rounds[-3:]), "drafting resumed on another worker"
