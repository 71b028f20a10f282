"""The prompt cache across requests, through ``coordinator serve`` with a real worker (tiny models).

A long shared prefix is prefilled once: the next request that starts with it
takes it from the cache on the target and on the worker's session (usage's
``prompt_tokens_details.cached_tokens``; the worker's ``Opened.cached_tokens``)
and its output at T = 0 is still the target's own. A second server drawing its
own key never reuses the first one's prefix on the shared worker. ``/v1/status``
shows the caches.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator

import pytest

from specwire.models.loading import LoadedModel
from tests.support.processes.servers import ServerProcess, running_server
from tests.support.processes.workers import WorkerProcess
from tests.support.prompts import text_ar_tokens

TINY = ["--target", "tiny", "--model-name", "tiny", "--interface", "127.0.0.1"]
PREFIX = " ".join(
    f"Rule {i}: a tool named tool_{i} takes a path and returns the lines that match a pattern."
    for i in range(24)
)
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def server(tiny_worker: WorkerProcess) -> Iterator[ServerProcess]:
    with running_server(*TINY, "--draft", "remote", "--worker", tiny_worker.address) as s:
        yield s


def complete(server: ServerProcess, prompt: str, **extra: object) -> object:
    client = server.client()
    return client.completions.create(
        model="tiny", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, **extra
    )  # type: ignore[call-overload]


def status(server: ServerProcess) -> dict:
    with urllib.request.urlopen(server.root + "/v1/status", timeout=10) as reply:
        return dict(json.loads(reply.read()))


def test_a_shared_prefix_is_prefilled_once_on_the_target_and_the_worker(
    server: ServerProcess, tiny: LoadedModel
) -> None:
    prefix_tokens = len(tiny.tokenizer.encode(PREFIX))
    first = complete(server, PREFIX + " Turn one.")
    assert first.usage.prompt_tokens_details.cached_tokens == 0  # type: ignore[attr-defined]
    for turn in ("Turn two.", "Turn three, a little longer than the others."):
        prompt = f"{PREFIX} {turn}"
        reply = complete(server, prompt)
        cached = reply.usage.prompt_tokens_details.cached_tokens  # type: ignore[attr-defined]
        assert cached >= 0.95 * prefix_tokens, (cached, prefix_tokens)
        figures = reply.model_extra["specwire"]  # type: ignore[attr-defined]
        assert figures["cached_tokens"] == cached
        assert figures["worker_cached_tokens"] >= 0.95 * prefix_tokens  # the worker's session too
        assert figures["token_ids"] == text_ar_tokens(tiny, prompt, MAX_TOKENS)  # the target's own output
    caches = status(server)["prompt_cache"]
    (target,) = [c for name, c in caches.items() if name.startswith("target:")]
    assert target["hits"] >= 2 and target["entries"] >= 1 and target["bytes"] <= target["max_bytes"]


def test_streamed_usage_reports_cached_tokens(server: ServerProcess) -> None:
    prompt = PREFIX + " A streamed turn."
    complete(server, prompt)
    chunks = list(complete(server, prompt, stream=True, stream_options={"include_usage": True}))  # type: ignore[call-overload]
    usage = chunks[-1].usage
    assert usage.prompt_tokens_details.cached_tokens >= usage.prompt_tokens - 2


def test_another_server_never_reuses_this_ones_prefix_on_the_shared_worker(
    server: ServerProcess, tiny_worker: WorkerProcess
) -> None:
    prompt = PREFIX + " A turn both servers are asked."
    complete(server, prompt)
    assert complete(server, prompt).model_extra["specwire"]["worker_cached_tokens"] > 0  # type: ignore[attr-defined]
    with running_server(*TINY, "--draft", "remote", "--worker", tiny_worker.address) as other:
        reply = complete(other, prompt)
        figures = reply.model_extra["specwire"]  # type: ignore[attr-defined]
        assert figures["worker"]["pid"] == tiny_worker.pid
        assert figures["worker_cached_tokens"] == 0 and figures["cached_tokens"] == 0


def test_status_lists_requests_and_the_caches(server: ServerProcess) -> None:
    body = status(server)
    assert body["requests"] == []  # nothing running between requests
    assert body["model"] == "tiny" and "workers" in body
