"""``coordinator serve`` driven by the real ``openai`` client: real processes and workers, tiny model.

The served text at T = 0 must equal ``coordinator generate --draft none``
(the target alone) with local drafting and with a remote worker on both
backends (on a GPU: up to a tie within its rounding, checked on the token
ids the server reports). The tiny model keeps every generation to milliseconds, so the
tests are about the server: streaming, usage and figures, stop sequences,
the queue, disconnects, worker loss and bad input.
"""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

import mlx.core as mx
import numpy as np
import openai
import pytest

from coordinator.prompts import encode_prompt
from specwire.models.loading import LoadedModel
from tests.support.processes.cli import one_error_line, run_cli
from tests.support.processes.servers import ServerProcess, running_server
from tests.support.processes.workers import WorkerProcess, running_worker, unique_name
from tests.support.remote import sessions_active, sessions_drained
from tests.support.rounding import assert_lossless

PROMPT = "Name three colors of the rainbow."
MAX_TOKENS = 24
LONG = 4000  # tokens: a generation that lasts seconds, to be interrupted
TINY = ["--target", "tiny", "--model-name", "tiny", "--interface", "127.0.0.1"]


def target_alone(chat: bool, max_tokens: int = MAX_TOKENS) -> str:
    """The text ``coordinator generate --draft none`` makes for PROMPT."""
    return str(target_alone_json(chat, max_tokens)["text"])


def target_alone_json(chat: bool, max_tokens: int = MAX_TOKENS) -> dict:
    """What ``coordinator generate --draft none --json`` says for PROMPT (text and token ids)."""
    args = [
        "--target",
        "tiny",
        "--draft",
        "none",
        "--prompt",
        PROMPT,
        "--max-tokens",
        str(max_tokens),
        "--json",
    ]
    out = run_cli("coordinator", "generate", *args, *(["--chat"] if chat else []))
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout))


@pytest.fixture(scope="module")
def alone() -> dict[str, dict]:
    """The target alone's output for the chat and the plain prompt (text and token ids)."""
    return {"chat": target_alone_json(chat=True), "text": target_alone_json(chat=False)}


@pytest.fixture(scope="module")
def expected(alone: dict[str, dict]) -> dict[str, str]:
    return {kind: str(out["text"]) for kind, out in alone.items()}


def assert_target_alone(tiny: LoadedModel, alone: dict[str, dict], kind: str, reply: object) -> None:
    """The served text is the target alone's, or parts from it only at a tie of the target's logits
    within this backend's rounding (a GPU: ``coordinator.decoding.ties``; never on the CPU)."""
    figures = reply.model_extra["specwire"]  # type: ignore[attr-defined]
    choice = reply.choices[0]  # type: ignore[attr-defined]
    text = choice.message.content if kind == "chat" else choice.text
    if text == alone[kind]["text"]:
        return
    prompt = encode_prompt(tiny, PROMPT, chat=kind == "chat")
    assert_lossless(tiny, prompt, alone[kind]["token_ids"], figures["token_ids"])


@pytest.fixture(scope="module")
def local_server() -> Iterator[ServerProcess]:
    with running_server(
        *TINY, "--draft", "local:tiny", "--decode-concurrency", "1", "--max-queue", "1"
    ) as server:
        yield server


def chat(client: openai.OpenAI, **extra: object) -> object:
    messages = [{"role": "user", "content": PROMPT}]
    options = {"model": "tiny", "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0, **extra}
    return client.chat.completions.create(**options)  # type: ignore[call-overload]


def streamed_chat(client: openai.OpenAI, **extra: object) -> tuple[str, list]:
    chunks = list(chat(client, stream=True, **extra))  # type: ignore[call-overload]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return text, chunks


@pytest.mark.parametrize("draft", ["local", "stream", "ggml-rpc"])
def test_served_text_is_the_target_alone(
    draft: str,
    alone: dict[str, dict],
    local_server: ServerProcess,
    tiny_worker: WorkerProcess,
    tiny: LoadedModel,
) -> None:
    if draft == "local":
        checks(local_server, alone, tiny, draft="local:tiny", worker_pid=None)
        return
    remote = ["--draft", "remote", "--worker", tiny_worker.name, "--backend", draft]
    with running_server(*TINY, *remote) as server:
        checks(server, alone, tiny, draft="remote", worker_pid=tiny_worker.pid)


def checks(
    server: ServerProcess, alone: dict[str, dict], tiny: LoadedModel, draft: str, worker_pid: int | None
) -> None:
    client = server.client()
    whole = chat(client)
    assert_target_alone(tiny, alone, "chat", whole)
    whole_text = whole.choices[0].message.content  # type: ignore[attr-defined]
    figures = whole.model_extra["specwire"]  # type: ignore[attr-defined]
    assert figures["draft"] == draft and figures["drafted"] > 0 and figures["accepted"] > 0
    assert figures["acceptance_rate"] == 1.0  # tiny drafts for tiny: every draft is the target's token
    assert figures["rounds"] < MAX_TOKENS and figures["decode_tok_s"] > 0
    if worker_pid is not None:
        assert figures["worker"]["pid"] == worker_pid and figures["worker_losses"] == []
    usage = whole.usage  # type: ignore[attr-defined]
    assert usage.completion_tokens == MAX_TOKENS and whole.choices[0].finish_reason == "length"  # type: ignore[attr-defined]
    assert usage.total_tokens == usage.prompt_tokens + MAX_TOKENS

    text, chunks = streamed_chat(client, stream_options={"include_usage": True})
    assert text == whole_text  # streamed or whole, the same passes: the same text on any backend
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1  # really streamed
    assert chunks[-1].usage.completion_tokens == MAX_TOKENS and chunks[-1].choices == []
    assert chunks[-2].choices[0].finish_reason == "length"
    assert chunks[-2].model_extra["specwire"]["drafted"] > 0

    completion = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0)
    assert_target_alone(tiny, alone, "text", completion)
    pieces = client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in pieces if c.choices) == completion.choices[0].text


def test_models_and_health(local_server: ServerProcess) -> None:
    assert [m.id for m in local_server.client().models.list()] == ["tiny"]
    health = local_server.health()
    assert health["status"] == "ok" and health["model"] == "tiny" and health["pending_requests"] == 0


def test_stop_sequences_cut_the_text_where_they_first_occur(
    local_server: ServerProcess, expected: dict[str, str]
) -> None:
    full = expected["chat"]
    stop = full[len(full) // 2 : len(full) // 2 + 3]  # spans tokens: must be found across pieces
    cut = full[: full.index(stop)]
    client = local_server.client()
    whole = chat(client, stop=[stop, "\u2603 never"])
    assert whole.choices[0].message.content == cut and whole.choices[0].finish_reason == "stop"  # type: ignore[attr-defined]
    assert 0 < whole.usage.completion_tokens < MAX_TOKENS  # type: ignore[attr-defined]
    text, chunks = streamed_chat(client, stop=stop)
    assert text == cut and chunks[-1].choices[0].finish_reason == "stop"


def test_concurrent_clients_each_get_their_own_text(local_server: ServerProcess) -> None:
    client = local_server.client()
    solo = {
        "chat": streamed_chat(client)[0],
        "text": client.completions.create(model="tiny", prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0)
        .choices[0]
        .text,
    }
    results: dict[str, str] = {}

    def run(kind: str) -> None:
        client = local_server.client()
        if kind == "chat":
            results[kind] = streamed_chat(client)[0]
        else:
            reply = client.completions.create(
                model="tiny", prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0
            )
            results[kind] = reply.choices[0].text

    threads = [threading.Thread(target=run, args=(kind,)) for kind in ("chat", "text")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert results == solo  # each request is its own generation: what it gets alone (the target's: above)


def test_a_full_queue_answers_429_with_retry_after(local_server: ServerProcess) -> None:
    client = local_server.client()
    running = chat(client, stream=True, max_tokens=LONG)  # type: ignore[call-overload]
    waiting = chat(client, stream=True, max_tokens=LONG)  # type: ignore[call-overload]
    try:
        next(iter(running))  # admitted and generating
        next(iter(waiting))  # admitted (its first chunk is the role), waiting: the queue (1) is full
        with pytest.raises(openai.RateLimitError) as refused:
            chat(client)
        assert int(refused.value.response.headers["retry-after"]) >= 1
        assert "already waiting" in refused.value.message
    finally:
        running.close()  # type: ignore[attr-defined]
        waiting.close()  # type: ignore[attr-defined]
    # Both clients left: the running generation halts at its next round, the waiting one never starts.
    assert eventually(lambda: local_server.health()["pending_requests"] == 0, timeout=30)
    assert chat(client).choices[0].finish_reason == "length"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (b"{not json", 400, "not valid JSON"),
        ({"model": "gpt-4o", "prompt": "x"}, 404, "'gpt-4o' is not served"),
        ({"prompt": "x", "max_tokens": 0}, 400, "max_tokens must be >= 1"),
        ({"prompt": "x", "max_tokens": 17000}, 400, "context holds 16384"),
        ({"prompt": "hello " * 17000}, 400, "context holds 16384"),
        ({"prompt": "x", "n": 2}, 400, "n=2 is not supported"),
        ({"prompt": "x", "logprobs": 6}, 400, "logprobs must be within 0..5"),
        ({"prompt": "x", "temperature": 7}, 400, "temperature must be within 0..2"),
        ({"prompt": "x", "stop": [""]}, 400, "stop must be"),
        ({"prompt": 17}, 400, "prompt must be"),
        ({"prompt": "x", "stream": "yes"}, 400, "stream must be a bool"),
        (b'{"prompt": "x", "max_tokens": NaN}', 400, "not valid JSON"),
        ({"prompt": "x", "seed": 2**64}, 400, "seed must be within"),
    ],
)
def test_bad_requests_get_a_4xx_with_a_message(
    local_server: ServerProcess, body: object, status: int, words: str
) -> None:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    code, reply = post(local_server.url + "/completions", data)
    assert code == status and words in reply["error"]["message"], reply
    assert local_server.health()["status"] == "ok"


@pytest.mark.parametrize(
    ("data", "status", "words"),
    [
        (b"[" * 100_000, 400, "nests arrays and objects too deeply"),
        (b'{"messages": [{"role": "user", "content": "\\udfff"}]}', 400, "messages[0].content holds a lone"),
        (b'{"prompt": "caf\xe9"}', 400, "not valid UTF-8 (byte 0xe9 at offset 15)"),
        (b'{"model": "' + b"m" * (5 << 20) + b'"}', 413, "over the server's limit of 4,194,304 bytes"),
    ],
)
def test_hostile_bodies_get_a_4xx_and_the_server_goes_on(
    local_server: ServerProcess, data: bytes, status: int, words: str
) -> None:
    code, reply = post(local_server.url + "/chat/completions", data)
    assert code == status and words in reply["error"]["message"], reply
    assert reply["error"]["type"] == "invalid_request_error"
    assert len(reply["error"]["message"]) < 300, "an error never echoes the body"
    assert chat(local_server.client()).choices[0].finish_reason == "length"  # type: ignore[attr-defined]


def test_a_long_model_name_is_quoted_by_a_prefix_only(local_server: ServerProcess) -> None:
    code, reply = post(local_server.url + "/completions", json.dumps({"model": "m" * 100_000}).encode())
    assert code == 404 and "(100,002 characters)" in reply["error"]["message"], reply
    assert len(reply["error"]["message"]) < 200


def test_a_body_over_max_body_is_refused_before_it_is_sent_whole() -> None:
    with running_server(*TINY, "--draft", "none", "--max-body", "1000") as server:
        host, port = server.url.removeprefix("http://").removesuffix("/v1").split(":")
        with socket.create_connection((host, int(port)), timeout=30) as conn:
            # Declares 60 MB and sends none of it: the answer must come without the body.
            conn.sendall(
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
                b"content-length: 60000000\r\n\r\n"
            )
            answer = b""
            while not answer.endswith(b"}}"):  # the whole JSON error, though the body was never sent
                answer += conn.recv(65536)
        assert answer.startswith(b"HTTP/1.1 413"), answer
        assert b"over the server's limit of 1,000 bytes (it declares 60,000,000 bytes)" in answer
        # Chunked, with no length: refused once more than the limit arrived.
        code, reply = post(server.url + "/completions", iter([b'{"prompt": "', b"x" * 2000, b'"}']))
        assert code == 413 and "more than that arrived" in reply["error"]["message"], reply
        code, reply = post(server.url + "/completions", b'{"prompt": "x", "max_tokens": 2}')
        assert code == 200 and reply["usage"]["completion_tokens"] == 2


def test_a_client_that_leaves_a_whole_completion_halts_it(local_server: ServerProcess) -> None:
    # 8,000 tokens take the tiny pair 20 s or more here; a client that gives up after one
    # second must free the target well before that (/health counts clients still waiting).
    impatient = local_server.client(timeout=1.0)
    with pytest.raises(openai.APITimeoutError):
        chat(impatient, max_tokens=8000)
    assert eventually(lambda: local_server.health()["pending_requests"] == 0, timeout=10)
    assert chat(local_server.client(), logprobs=False, tools=[]).choices[0].finish_reason == "length"  # type: ignore[attr-defined]


def test_every_sampler_sent_is_honoured(local_server: ServerProcess, expected: dict[str, str]) -> None:
    client = local_server.client()
    text = lambda reply: reply.choices[0].message.content  # noqa: E731
    top_1 = chat(client, temperature=1.5, seed=3, extra_body={"top_k": 1})
    assert text(top_1) == expected["chat"]  # top-1 is greedy
    assert text(chat(client, temperature=1.5, seed=3, extra_body={"min_p": 1.0})) == expected["chat"]
    penalized = text(chat(client, extra_body={"repetition_penalty": 5.0}))
    assert penalized != expected["chat"] and penalized == text(
        chat(client, extra_body={"repetition_penalty": 5.0})
    )
    assert text(chat(client, frequency_penalty=2.0, presence_penalty=2.0)) != expected["chat"]
    token = local_server.client().completions.create(model="tiny", prompt="x", max_tokens=1, temperature=0)
    forced = int(token.model_extra["specwire"]["token_ids"][0]) + 1  # type: ignore[index]
    reply = chat(client, logit_bias={str(forced): 100}, max_tokens=4)
    assert reply.model_extra["specwire"]["token_ids"] == [forced] * 4  # type: ignore[attr-defined]


def test_logprobs_are_the_targets_own(local_server: ServerProcess, tiny: LoadedModel) -> None:
    client = local_server.client()
    reply = chat(client, logprobs=True, top_logprobs=3, max_tokens=6)
    entries = reply.choices[0].logprobs.content  # type: ignore[attr-defined]
    ids = reply.model_extra["specwire"]["token_ids"]  # type: ignore[attr-defined]
    assert len(entries) == len(ids) == 6
    context = encode_prompt(tiny, PROMPT, chat=True)
    logits = tiny.model(mx.array([[*context, *ids[:-1]]]))[0, len(context) - 1 :].astype(mx.float32)
    expected = np.array(logits - mx.logsumexp(logits, axis=-1, keepdims=True))
    for i, (entry, token) in enumerate(zip(entries, ids, strict=True)):
        assert entry.logprob == pytest.approx(float(expected[i, token]), abs=1e-4)
        assert [t.logprob for t in entry.top_logprobs] == sorted(
            (t.logprob for t in entry.top_logprobs), reverse=True
        )
        assert entry.top_logprobs[0].token == entry.token  # T = 0: the target's first choice
    streamed = [
        c.choices[0].logprobs.content
        for c in chat(client, logprobs=True, max_tokens=6, stream=True)
        if c.choices and c.choices[0].logprobs
    ]  # type: ignore[attr-defined]
    assert [e.logprob for chunk in streamed for e in chunk] == [e.logprob for e in entries]
    text = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=4, temperature=0, logprobs=2)
    assert len(text.choices[0].logprobs.token_logprobs) == 4  # type: ignore[union-attr,arg-type]
    assert all(len(top) == 2 for top in text.choices[0].logprobs.top_logprobs)  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ({"top_k": -1}, "top_k must be >= 0"),
        ({"min_p": 1.5}, "min_p must be within 0..1"),
        ({"repetition_penalty": 0}, "repetition_penalty must be within (0, 10.0]"),
        ({"presence_penalty": 3}, "presence_penalty must be within -2..2"),
        ({"logit_bias": {"999999": 1}}, "is not a token id of this model"),
        ({"logit_bias": {"5": 101}}, "logit_bias[5] must be a number within -100..100"),
        ({"ignore_eos": "yes"}, "ignore_eos must be a bool"),
    ],
)
def test_a_sampler_out_of_range_is_refused_by_name(
    local_server: ServerProcess, extra: dict, words: str
) -> None:
    code, reply = post(local_server.url + "/completions", json.dumps({"prompt": "x", **extra}).encode())
    assert code == 400 and words in reply["error"]["message"], reply


def test_unsupported_chat_features_are_named(local_server: ServerProcess) -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    with pytest.raises(openai.BadRequestError) as refused:
        chat(local_server.client(), tools=tools)
    assert (
        refused.value.code == "unsupported_parameter" and "tools: this model's chat" in refused.value.message
    )
    code, reply = post(local_server.url + "/nowhere", b"{}")
    assert code == 404 and "/v1/nowhere" in reply["error"]["message"]


def post(url: str, data: object, headers: dict[str, str] | None = None) -> tuple[int, dict]:
    """POST ``data`` (bytes, or an iterable of chunks: sent chunked); returns the status and JSON reply."""
    request = urllib.request.Request(url, data, {"content-type": "application/json", **(headers or {})})  # type: ignore[arg-type]
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_the_api_key_guards_every_route_but_health() -> None:
    with running_server(*TINY, "--draft", "none", "--api-key", "s3cret") as server:
        with pytest.raises(openai.AuthenticationError):
            server.client(api_key="wrong").models.list()
        assert [m.id for m in server.client(api_key="s3cret").models.list()] == ["tiny"]
        code, _ = post(server.url + "/completions", b'{"prompt": "x", "max_tokens": 1}')
        assert code == 401
        assert server.health()["status"] == "ok"


def test_listening_beyond_loopback_needs_a_key() -> None:
    out = run_cli("coordinator", "serve", "--target", "tiny", "--host", "0.0.0.0", "--port", "0")
    assert out.returncode == 1 and "--api-key" in one_error_line(out.stderr)


def test_a_draft_the_server_cannot_build_is_refused_before_it_starts() -> None:
    out = run_cli("coordinator", "serve", "--target", "tiny", "--port", "0", "--draft", "remote:race")
    assert out.returncode == 1 and "remote mode 'race'" in one_error_line(out.stderr)


def test_auto_serves_the_target_alone_and_says_what_it_chose(
    alone: dict[str, dict], tiny_worker: WorkerProcess, tiny: LoadedModel
) -> None:
    with running_server(
        *TINY, "--local-draft", "tiny", "--worker", tiny_worker.name, "--api-key", "k"
    ) as server:
        client = server.client(api_key="k")
        whole = chat(client)
        assert_target_alone(tiny, alone, "chat", whole)
        figures = whole.model_extra["specwire"]  # type: ignore[attr-defined]
        assert figures["draft"] == "auto"
        chosen = figures["drafting"]["chosen"]
        assert len(chosen["predicted"]) == 3 and chosen["setup"] == chosen["predicted"][0]["setup"]
        assert figures["drafting"]["switches"][0]["reason"].startswith("predicted")
        assert server.health(api_key="k")["drafting"] == figures["drafting"]
        assert "drafting" not in server.health()  # not for callers without the key


@pytest.mark.anyio
async def test_a_client_that_leaves_mid_stream_frees_its_worker_session(tiny_worker: WorkerProcess) -> None:
    with running_server(*TINY, "--draft", "remote", "--worker", tiny_worker.name) as server:
        client = server.client()
        stream = chat(client, stream=True, max_tokens=LONG)  # type: ignore[call-overload]
        chunks = iter(stream)
        next(chunks), next(chunks)  # the role, then text: the generation is drafting on the worker
        assert await sessions_active(tiny_worker.address) == 1
        stream.close()  # type: ignore[attr-defined]
        await sessions_drained(tiny_worker.address)
        assert chat(client).choices[0].finish_reason == "length"  # type: ignore[attr-defined]


def eventually(condition: Callable[[], bool], timeout: float) -> bool:
    """Whether ``condition()`` holds within ``timeout`` seconds (asked every 50 ms)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_worker_that_appears_is_used_and_one_killed_mid_stream_changes_nothing(
    tiny_worker: WorkerProcess, tiny: LoadedModel
) -> None:
    name = unique_name("serve-late-worker")
    remote = ["--draft", "remote", "--worker", name, "--discover-timeout", "1"]
    with running_server(*TINY, *remote) as server:
        client = server.client()
        before = chat(client, max_tokens=LONG // 4)
        assert before.model_extra["specwire"]["draft"] == "none"  # type: ignore[attr-defined]
        assert name in before.model_extra["specwire"]["draft_unavailable"]  # type: ignore[attr-defined]
        with running_worker("--model", "tiny", "--name", name) as late:
            assert eventually(lambda: name in {w["name"] for w in server.health()["workers"]}, timeout=30)
            stream = chat(client, stream=True, max_tokens=LONG // 4, stream_options={"include_usage": True})  # type: ignore[call-overload]
            chunks = [next(iter(stream)), next(iter(stream))]
            late.stop(signal.SIGKILL)
            chunks += list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    figures = chunks[-1].model_extra["specwire"]
    if text != before.choices[0].message.content:  # type: ignore[attr-defined]
        # the target alone's text, but for a part at a tie within this backend's rounding (a GPU's)
        alone = before.model_extra["specwire"]["token_ids"]  # type: ignore[attr-defined]
        assert_lossless(tiny, encode_prompt(tiny, PROMPT, chat=True), alone, figures["token_ids"])
    assert [loss["worker"] for loss in figures["worker_losses"]] == [name]
    assert figures["worker"]["pid"] == tiny_worker.pid  # failed over to the other worker on Bonjour
    assert chunks[-1].usage.completion_tokens == LONG // 4
