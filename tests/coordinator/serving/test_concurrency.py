"""Several requests at once: each keeps its own output, and a short one does not wait for a long one.

``coordinator serve`` (tiny target, drafting locally) decodes its active
requests together (``--decode-concurrency``, default 8): one draft pass a
draft and one target pass for all of them (``coordinator.decoding.batch``).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Iterator

import mlx.core as mx
import openai
import pytest

from tests.support.processes.servers import ServerProcess, running_server

TINY = ["--target", "tiny", "--model-name", "tiny", "--interface", "127.0.0.1", "--draft", "local:tiny-draft"]
PROMPTS = ["Name three colors of the rainbow.", "Count from one to ten.", "Write a haiku about rain."]
SHORT, LONG = 16, 3000


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with running_server(*TINY, "--k", "3") as s:
        yield s


def ids(server: ServerProcess, prompt: str, max_tokens: int, **extra: object) -> list[int]:
    reply = server.client().completions.create(model="tiny", prompt=prompt, max_tokens=max_tokens, **extra)  # type: ignore[call-overload]
    return list(reply.model_extra["specwire"]["token_ids"])


def status(server: ServerProcess) -> dict:
    with urllib.request.urlopen(server.root + "/v1/status", timeout=10) as reply:
        return dict(json.loads(reply.read()))


@pytest.mark.skipif(
    mx.default_device() != mx.cpu,
    reason="a GPU may round a batch's row apart from it alone (the engine's batch test allows ties there)",
)
@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 0.8, "seed": 7}])
def test_requests_run_together_each_get_what_they_get_alone(server: ServerProcess, sampling: dict) -> None:
    solo = [ids(server, p, SHORT, **sampling) for p in PROMPTS]
    together: list[list[int] | None] = [None] * len(PROMPTS)

    def run(i: int) -> None:
        together[i] = ids(server, PROMPTS[i], SHORT, **sampling)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert together == solo


def test_a_short_request_behind_a_long_one_is_answered_while_the_long_one_runs(server: ServerProcess) -> None:
    client: openai.OpenAI = server.client()
    long = client.completions.create(
        model="tiny", prompt=PROMPTS[0], max_tokens=LONG, temperature=0, stream=True
    )
    try:
        chunks = iter(long)
        next(chunks)  # the long one is generating
        short = ids(server, PROMPTS[1], SHORT, temperature=0)
        assert len(short) == SHORT
        running = [r for r in status(server)["requests"] if r["state"] == "running"]
        assert [r["max_tokens"] for r in running] == [LONG]  # still going, the short one already answered
        assert running[0]["generated"] < LONG and running[0]["rounds"] > 0
        assert running[0]["batched"]  # it ran alone, then joined the short one's batch
        assert status(server)["batching"]["widest"] >= 2
    finally:
        long.close()
    deadline = time.monotonic() + 30
    while status(server)["requests"] and time.monotonic() < deadline:  # its client left: its slot frees
        time.sleep(0.1)
    assert status(server)["requests"] == []


@pytest.mark.skipif(mx.default_device() != mx.cpu, reason="as above: a GPU may round a batch's row apart")
def test_requests_with_no_draft_are_decoded_together_each_as_alone() -> None:
    # --draft none: the target alone, one pass a token for every request at once.
    args = [a for a in TINY if a not in ("--draft", "local:tiny-draft")]
    with running_server(*args, "--draft", "none") as server:
        solo = [ids(server, p, SHORT, temperature=0) for p in PROMPTS]
        replies: list[dict] = [{}] * len(PROMPTS)

        def run(i: int) -> None:
            reply = server.client().completions.create(
                model="tiny", prompt=PROMPTS[i], max_tokens=SHORT, temperature=0
            )
            replies[i] = dict(reply.model_extra["specwire"])  # type: ignore[index]

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(PROMPTS))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert [r["token_ids"] for r in replies] == solo
        # Batched to its end, or for a while: the last row left goes on alone (its reply says where).
        assert any(r.get("batched") or "left_batch_at" in r for r in replies)
        assert status(server)["batching"]["widest"] >= 2
