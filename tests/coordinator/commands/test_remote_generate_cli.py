"""``coordinator generate --draft remote`` against real workers, on the tiny model."""

from __future__ import annotations

import json
import sys

import pytest

from specwire.drafting.sampling import SamplingParams
from specwire.models.loading import LoadedModel
from tests.support.processes import zygote
from tests.support.processes.cli import one_error_line, run_cli
from tests.support.processes.workers import WorkerProcess
from tests.support.prompts import PROMPTS, text_ar_tokens
from tests.support.remote import generate_remote

MAX_TOKENS = 32


def _refused(*args: str) -> str:
    """The one error line of ``coordinator generate --prompt hi --target tiny --draft remote ARGS``,
    which must exit 1."""
    out = run_cli("coordinator", "generate", "--prompt", "hi", "--target", "tiny", "--draft", "remote", *args)
    assert out.returncode == 1
    return one_error_line(out.stderr)


def test_remote_picks_discovered_worker_and_is_lossless(
    tiny_worker: WorkerProcess, tiny: LoadedModel
) -> None:
    args = ["--prompt", PROMPTS[5], "--target", "tiny", "--max-tokens", str(MAX_TOKENS), "--json"]
    remote = run_cli("coordinator", "generate", "--draft", "remote", "--interface", "127.0.0.1", *args)
    assert remote.returncode == 0, remote.stderr
    assert json.loads(remote.stdout)["token_ids"] == text_ar_tokens(tiny, PROMPTS[5], MAX_TOKENS)
    stats = json.loads(remote.stdout)["stats"]
    assert stats["acceptance_rate"] == 1.0 and stats["worker"]["pid"] == tiny_worker.pid, (
        stats,
        remote.stderr,
    )


def test_named_worker_that_does_not_exist() -> None:
    args = ["--worker", "no-such-worker", "--interface", "127.0.0.1", "--discover-timeout", "1"]
    assert "no worker named 'no-such-worker'" in _refused(*args)


def test_dead_address_is_a_clear_error() -> None:
    assert "unreachable" in _refused("--worker", "127.0.0.1:1")


@pytest.mark.anyio
async def test_four_concurrent_sessions_match_their_solo_runs(
    tiny_worker: WorkerProcess, tiny: LoadedModel
) -> None:
    worker, prompts = tiny_worker, PROMPTS[:4]
    params = SamplingParams(temperature=0.8, seed=3)  # sampled: sessions must not share random streams
    solo = await generate_remote(
        worker.address, tiny, [tiny.tokenizer.encode(p) for p in prompts], 3, MAX_TOKENS, params
    )
    command = [
        sys.executable,
        "-m",
        "coordinator.cli",
        "generate",
        "--draft",
        "remote",
        "--worker",
        worker.address,
    ]
    command += ["--target", "tiny", "--k", "3", "--max-tokens", str(MAX_TOKENS), "--temperature", "0.8"]
    command += ["--seed", "3", "--json", "--prompt"]
    processes = [zygote.popen([*command, p]) for p in prompts]  # four real processes at once
    outputs = [p.communicate(timeout=600) for p in processes]
    for process, (stdout, stderr), alone in zip(processes, outputs, solo, strict=True):
        assert process.returncode == 0, stderr
        assert json.loads(stdout)["token_ids"] == alone.result.tokens


def test_a_stream_mode_needs_the_stream_backend() -> None:
    out = run_cli(
        "coordinator", "generate", "--prompt", "hi", "--target", "tiny", "--draft", "remote:tree",
        "--backend", "ggml-rpc",
    )  # fmt: skip
    assert out.returncode == 1 and "remote:tree is a mode of the stream backend" in one_error_line(out.stderr)


@pytest.mark.parametrize(("mode", "prompt"), [("tree", 1)])
def test_a_tree_is_lossless(tiny_worker: WorkerProcess, tiny: LoadedModel, mode: str, prompt: int) -> None:
    args = ["--prompt", PROMPTS[prompt], "--target", "tiny", "--max-tokens", str(MAX_TOKENS), "--json"]
    args += ["--worker", tiny_worker.address, "--local-draft", "tiny", "--rows", "4"]
    out = run_cli("coordinator", "generate", "--draft", f"remote:{mode}", *args)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["token_ids"] == text_ar_tokens(tiny, PROMPTS[prompt], MAX_TOKENS)
