"""A worker dies (SIGKILL), stalls, or restarts mid-generation: the output is still the target's own.

Recovery is orchestration, so workers and target serve the tiny model.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import time
from collections.abc import Iterator

import pytest

from coordinator.decoding.engine import GenerationResult, SpeculativeDecoder
from coordinator.drafting.factory import DraftSources, WorkerAccess
from coordinator.drafting.failover import FailoverDraftSource
from coordinator.drafting.fill import FilledDraftSource
from coordinator.drafting.remote_tree import RemoteTreeDraftSource
from coordinator.drafting.spec import DraftSpec
from coordinator.runtime import coordinator_runtime
from specwire.drafting.sampling import SamplingParams
from specwire.models.loading import LoadedModel
from tests.support.credentials import credentials
from tests.support.processes.cli import run_cli
from tests.support.processes.relay import delay_relay, free_port
from tests.support.processes.workers import WorkerProcess, running_worker, unique_name
from tests.support.prompts import ar_tokens

pytestmark = pytest.mark.anyio
PROMPT = "Once upon a time, a lighthouse keeper"
MAX_TOKENS = 16
KILL_AFTER_TOKENS = 4


async def generate_through(
    address: str,
    target: LoadedModel,
    policy: str,
    on_tokens_after: int,
    harm: object,
    round_timeout: float = 20.0,
    mode: str = "stream",
) -> tuple[GenerationResult, FailoverDraftSource, int]:
    """Generate via the worker at ``address``; call ``harm()`` once enough tokens are out."""
    prompt = target.tokenizer.encode(PROMPT)
    harmed_at = [0]
    emitted = [0]

    def on_tokens(tokens: list[int]) -> None:
        emitted[0] += len(tokens)
        if not harmed_at[0] and emitted[0] >= on_tokens_after:
            harm()  # type: ignore[operator]
            harmed_at[0] = time.perf_counter_ns()

    access = WorkerAccess(credentials(), ["127.0.0.1"], 3.0, round_timeout)
    local = target.spec if mode != "stream" else ""  # a tree's rest is drafted on the target itself
    spec = DraftSpec("remote", local=local, workers=(address,), mode=mode, on_loss=policy)
    async with coordinator_runtime() as runtime, DraftSources(runtime, target, access) as sources:
        opened = await sources.open(spec)
        source = opened.remote if isinstance(opened, (FilledDraftSource, RemoteTreeDraftSource)) else opened
        assert isinstance(source, FailoverDraftSource)
        result = await runtime.compute.run(
            SpeculativeDecoder(target, opened).generate,
            prompt,
            max_tokens=MAX_TOKENS,
            k=3,
            params=SamplingParams(),
            on_tokens=on_tokens,
        )
    return result, source, harmed_at[0]


def longest_wait_ms(result: GenerationResult, harmed_at: int) -> float:
    """The longest wait for a token after the harm (a round already answered may still emit just after it)."""
    after = [harmed_at, *(t for t in result.token_ns if t > harmed_at)]
    return max(b - a for a, b in itertools.pairwise(after)) / 1e6


def recovery_ms(result: GenerationResult, harmed_at: int) -> float:
    """Time from the harm to the next accepted token."""
    after = [t for t in result.token_ns if t > harmed_at]
    assert after, "no token came after the worker was lost"
    return (after[0] - harmed_at) / 1e6


@pytest.fixture
def doomed() -> Iterator[WorkerProcess]:
    with running_worker("--model", "tiny", "--name", unique_name("doomed")) as w:
        yield w


async def test_sigkill_fails_over_to_another_worker(
    doomed: WorkerProcess, tiny_worker: WorkerProcess, tiny: LoadedModel
) -> None:
    result, source, killed_at = await generate_through(
        doomed.address,
        tiny,
        "failover",
        KILL_AFTER_TOKENS,
        lambda: os.kill(doomed.pid, signal.SIGKILL),
    )
    assert result.tokens == ar_tokens(tiny, tiny.tokenizer.encode(PROMPT), MAX_TOKENS)
    (loss,) = source.losses
    assert loss.worker == doomed.name and f"continues on stream:{tiny_worker.name}" in loss.action
    assert result.drafted > 0 and any(
        r.drafted for r in result.rounds[-3:]
    )  # drafting resumed on the other worker
    print(f"failover: next accepted token {recovery_ms(result, killed_at):.0f} ms after SIGKILL")


@pytest.mark.parametrize("mode", ["tree", "tree-verify"])
async def test_sigkill_of_a_prespeculating_worker_fails_over_losslessly(
    doomed: WorkerProcess, tiny_worker: WorkerProcess, tiny: LoadedModel, mode: str
) -> None:
    result, source, _ = await generate_through(
        doomed.address,
        tiny,
        "failover",
        KILL_AFTER_TOKENS,
        lambda: os.kill(doomed.pid, signal.SIGKILL),
        mode=mode,
    )
    assert result.tokens == ar_tokens(tiny, tiny.tokenizer.encode(PROMPT), MAX_TOKENS)
    assert [loss.worker for loss in source.losses] == [doomed.name]
    served = [r.draft.speculation for r in result.rounds if r.draft.calls]
    assert {"hit", "partial", "miss"} & set(served), "the new session pre-speculates as well"


async def test_sigkill_falls_back_to_autoregressive(doomed: WorkerProcess, tiny: LoadedModel) -> None:
    result, source, killed_at = await generate_through(
        doomed.address, tiny, "ar", KILL_AFTER_TOKENS, lambda: os.kill(doomed.pid, signal.SIGKILL)
    )
    assert result.tokens == ar_tokens(tiny, tiny.tokenizer.encode(PROMPT), MAX_TOKENS)
    (loss,) = source.losses
    assert loss.action == "continuing autoregressively"
    after = [r for r in result.rounds if r.end_ns > killed_at]
    assert after and all(r.drafted == 0 for r in after[1:])
    print(f"AR fallback: next accepted token {recovery_ms(result, killed_at):.0f} ms after SIGKILL")


@pytest.mark.parametrize("mode", ["stream", "tree-verify"])
async def test_stall_hits_the_deadline_and_fails_over(
    tiny_worker: WorkerProcess, tiny: LoadedModel, mode: str
) -> None:
    grpc_port, echo_port, relay_port = free_port(), free_port(), free_port()
    args = [
        "--model",
        "tiny",
        "--name",
        unique_name("stalls"),
        "--port",
        str(grpc_port),
        "--echo-port",
        str(echo_port),
        "--no-advertise",
    ]
    with running_worker(*args), delay_relay(0.0, [(relay_port, grpc_port)]) as relay:
        result, source, stalled_at = await generate_through(
            f"127.0.0.1:{relay_port}",
            tiny,
            "failover",
            KILL_AFTER_TOKENS,
            lambda: relay.send_signal(signal.SIGUSR1),  # black hole: nothing passes any more
            round_timeout=3.0,
            mode=mode,
        )
    assert result.tokens == ar_tokens(tiny, tiny.tokenizer.encode(PROMPT), MAX_TOKENS)
    (loss,) = source.losses
    # It goes on with another compatible worker: the tiny one, or the session's default-model worker when
    # this process started it and it measured faster (both speak the same vocabulary).
    continued = loss.action.rpartition(":")[2]
    assert loss.code == "DEADLINE_EXCEEDED" and loss.action.startswith("drafting continues on")
    assert continued != loss.worker and (continued == tiny_worker.name or continued.startswith("test-worker"))
    assert longest_wait_ms(result, stalled_at) >= 3000  # the deadline, then the new session


def test_restarted_worker_is_rediscovered_for_new_sessions() -> None:
    name = unique_name("phoenix")
    args = ["generate", "--prompt", PROMPT, "--target", "tiny", "--max-tokens", "3", "--draft", "remote"]
    args += ["--worker", name, "--interface", "127.0.0.1", "--json"]
    with running_worker("--model", "tiny", "--name", name) as first:
        out = run_cli("coordinator", *args)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["stats"]["worker"]["pid"] == first.pid
        first.stop(signal.SIGKILL)  # no Bonjour goodbye
    with running_worker("--model", "tiny", "--name", name) as second:
        out = run_cli("coordinator", *args)
        assert out.returncode == 0, out.stderr
        identity = json.loads(out.stdout)["stats"]["worker"]
        assert identity["pid"] == second.pid and identity["pid"] != first.pid
