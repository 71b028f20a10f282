"""The HTTP side of ``coordinator serve``: the OpenAI-compatible routes, on Starlette.

Routes: ``POST /v1/chat/completions`` and ``POST /v1/completions`` (whole,
or streamed as server-sent events ending in ``data: [DONE]``), ``GET
/v1/models``, ``GET /v1/models/{id}`` and ``GET /health``. With an API key,
every route but ``/health`` needs ``Authorization: Bearer KEY``.

Errors are OpenAI-shaped (``{"error": {"message", "type", "param",
"code"}}``), and ``status_of`` is the one place that maps this project's
errors to HTTP statuses. An error after a stream has started is sent as one
last event with an ``error`` object, as OpenAI does.
"""

from __future__ import annotations

import contextlib
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
from sse_starlette import EventSourceResponse
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from coordinator.pacing import CoordinatorPace
from coordinator.serving import responses
from coordinator.serving.body import DEFAULT_MAX_BODY, excerpt, parse_json, read_body
from coordinator.serving.chat import ChatTemplate
from coordinator.serving.chat_output import ChatOutput, Split, splits
from coordinator.serving.drafting_status import DraftingStatus
from coordinator.serving.requests import CHAT, TEXT, CompletionRequest, read_request
from coordinator.serving.responses import Envelope
from coordinator.serving.scheduler import Scheduler
from coordinator.serving.text import CompletionText
from coordinator.serving.tools import openai_call
from specwire.emulation.pace import headroom_quantile
from specwire.errors import (
    ApiKeyError,
    AuthenticationError,
    BodyTooLargeError,
    CapacityError,
    InvalidArgumentError,
    NoWorkerError,
    QueueFullError,
    RemoteWorkerError,
    SpecwireError,
    UnknownModelError,
    UnsupportedParameterError,
)

log = logging.getLogger(__name__)
MAX_MESSAGE = 600  # characters of an error message

# Error class -> (HTTP status, OpenAI error type, code); the first match in order wins.
STATUSES: tuple[tuple[type[Exception], int, str, str | None], ...] = (
    (ApiKeyError, 401, "authentication_error", "invalid_api_key"),
    (UnknownModelError, 404, "invalid_request_error", "model_not_found"),
    (BodyTooLargeError, 413, "invalid_request_error", "request_too_large"),
    (UnsupportedParameterError, 400, "invalid_request_error", "unsupported_parameter"),
    (InvalidArgumentError, 400, "invalid_request_error", None),
    (QueueFullError, 429, "rate_limit_error", "queue_full"),
    (NoWorkerError, 503, "server_error", "no_worker"),
    (RemoteWorkerError, 503, "server_error", "worker_failed"),
    (CapacityError, 503, "server_error", "worker_busy"),
    (AuthenticationError, 503, "server_error", "worker_authentication"),
    (SpecwireError, 500, "server_error", None),
)


def status_of(err: Exception) -> tuple[int, dict[str, Any]]:
    """The HTTP status and OpenAI-shaped body for ``err``; a message is never longer than MAX_MESSAGE."""
    for kind, status, error_type, code in STATUSES:
        if isinstance(err, kind):
            param = getattr(err, "param", None)
            return status, responses.error(_clipped(str(err)), error_type, code, param)
    log.exception("internal error while serving a request", exc_info=err)
    return 500, responses.error(f"internal error: {type(err).__name__}", "server_error")


def _clipped(message: str) -> str:
    """The last guard on what a message echoes: messages quote with ``excerpt``; none grows past this."""
    return message if len(message) <= MAX_MESSAGE else message[:MAX_MESSAGE] + "…"


@dataclass
class ServedModel:
    """What the routes serve: the target's name and tokenizer, and limits."""

    name: str
    target: Any  # specwire.models.LoadedModel
    default_max_tokens: int
    created: int
    max_body: int = DEFAULT_MAX_BODY
    template: ChatTemplate | None = None  # the chat template and its tool format (None: the model's own)


class Api:
    """The route handlers, over one scheduler."""

    def __init__(
        self,
        served: ServedModel,
        scheduler: Scheduler,
        api_key: str | None,
        status: DraftingStatus | None = None,
        cors: Sequence[str] = (),
    ) -> None:
        self.served = served
        self.scheduler = scheduler
        self.api_key = api_key
        self.status = status
        self.cors = list(cors)

    def app(self) -> Starlette:
        """The Starlette application."""
        routes = [
            Route("/health", self.health, methods=["GET"]),
            Route("/v1/status", self.v1_status, methods=["GET"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/v1/models/{model:path}", self.model, methods=["GET"]),
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
        ]
        # SpecwireError: answered here; any other Exception: answered, and logged with its traceback.
        handlers = {HTTPException: self._http_error, SpecwireError: self._error, Exception: self._error}
        middleware = []
        if self.cors:  # browser clients (Open WebUI, ...): their preflight and the headers they may read
            options = {"allow_origins": self.cors, "allow_methods": ["GET", "POST"], "allow_headers": ["*"]}
            middleware.append(Middleware(CORSMiddleware, **options))  # type: ignore[arg-type]
        return Starlette(routes=routes, exception_handlers=handlers, middleware=middleware)

    # Routes.

    async def health(self, request: Request) -> Response:
        """Liveness, the model and the queue (no key needed); with the key, each worker known on Bonjour
        (used, or skipped and why), auto's choice at T = 0 and T = 1, and how the last request drafted."""
        body: dict[str, Any] = {
            "status": "ok",
            "model": self.served.name,
            "pending_requests": self.scheduler.pending,
        }
        if self._key_given(request):  # who drafts, and how, is not for strangers
            if self.status is not None:
                body.update(await self.status.to_dict())
            if self.scheduler.last_drafting is not None:
                body["drafting"] = self.scheduler.last_drafting
        return JSONResponse(body)

    async def v1_status(self, request: Request) -> Response:
        """What the server is doing: every request running or waiting (its set-up, rounds and tok/s),
        the prompt caches (entries, bytes, hits), the workers and auto's choices."""
        self._authorize(request)
        caches = self.scheduler.sources.caches
        body: dict[str, Any] = {
            "model": self.served.name,
            "requests": self.scheduler.status(),
            "batching": self.scheduler.batch_status(),
            "pace": _pace(self.scheduler.sources.pace),
            "prompt_cache": caches.stats() if caches is not None else None,
        }
        if self.status is not None:
            body.update(await self.status.to_dict())
        return JSONResponse(body)

    async def models(self, request: Request) -> Response:
        self._authorize(request)
        return JSONResponse(responses.models(self.served.name, self.served.created))

    async def model(self, request: Request) -> Response:
        self._authorize(request)
        name = request.path_params["model"]
        if name != self.served.name:
            raise UnknownModelError(
                f"model {excerpt(name)} is not served here; this server serves {self.served.name!r}"
            )
        return JSONResponse(responses.model_card(name, self.served.created))

    async def chat_completions(self, request: Request) -> Response:
        return await self._complete(request, CHAT)

    async def completions(self, request: Request) -> Response:
        return await self._complete(request, TEXT)

    # Completions.

    async def _complete(self, request: Request, kind: str) -> Response:
        self._authorize(request)
        served = self.served
        data = await read_body(request, served.max_body)
        # Parsing a large body, and templating and tokenizing a long prompt, would stall the event
        # loop, and with it every remote round in flight: a worker thread does them.
        asked = await anyio.to_thread.run_sync(
            lambda: read_request(
                parse_json(data), kind, served.name, served.target, served.default_max_tokens, served.template
            )
        )
        envelope = Envelope(kind, served.name)
        text = CompletionText(self.scheduler.submit(asked), served.target.tokenizer)
        split = ChatOutput(asked) if splits(asked) else None
        if asked.stream:
            return EventSourceResponse(self._events(asked, envelope, text, split))
        output = await self._whole(request, text)
        counts = responses.usage(len(asked.prompt), text.completion_tokens, text.cached_tokens)
        logprobs = responses.logprobs(kind, text.logprobs(), self._piece)
        finish = text.finish_reason
        if split is None:
            return JSONResponse(envelope.completion(output, finish, counts, text.stats(), logprobs))
        whole, rest = split.feed(output), split.finish()
        content = whole.content + rest.content
        body = envelope.completion(content, _finish(finish, split), counts, text.stats(), logprobs)
        message = body["choices"][0]["message"]
        if whole.reasoning or rest.reasoning:
            message["reasoning_content"] = whole.reasoning + rest.reasoning
        if split.called:
            message["tool_calls"] = [openai_call(call) for call in whole.calls]
            message["content"] = content or None
        return JSONResponse(body)

    def _piece(self, token: int) -> str:
        """One token's text, as log-probabilities name it."""
        return str(self.served.target.tokenizer.decode([token]))

    async def _whole(self, request: Request, text: CompletionText) -> str:
        """All of a non-streamed completion's text; if its client leaves first, the generation halts."""
        pieces: list[str] = []
        failed: list[Exception] = []

        async def collect() -> None:
            try:
                async with contextlib.aclosing(text.pieces()) as stream:
                    async for piece in stream:
                        pieces.append(piece)
            except Exception as err:  # answered by the route's error handler, not as a task-group error
                failed.append(err)
            tg.cancel_scope.cancel()

        async def watch() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass
            text.generation.halt.set()
            tg.cancel_scope.cancel()

        async with anyio.create_task_group() as tg:
            tg.start_soon(collect)
            tg.start_soon(watch)
        if failed:
            raise failed[0]
        return "".join(pieces)

    async def _events(
        self,
        asked: CompletionRequest,
        envelope: Envelope,
        text: CompletionText,
        split: ChatOutput | None,
    ) -> AsyncIterator[dict[str, str]]:
        """The server-sent events of one streamed completion (a tool call as one ``delta.tool_calls``
        chunk once it is whole)."""
        calls = 0
        try:
            if asked.kind == CHAT:
                yield _event(envelope.chunk(text="", first=True))
            async with contextlib.aclosing(
                text.pieces()
            ) as stream:  # closed (halting it) if the client leaves
                sent = 0
                async for piece in stream:
                    logprobs = responses.logprobs(asked.kind, text.new_logprobs(), self._piece, sent)
                    sent += len(piece)
                    if split is None:
                        yield _event(envelope.chunk(text=piece, logprobs=logprobs))
                        continue
                    for event in _split_chunks(envelope, split.feed(piece), logprobs, calls):
                        yield event
                    calls = len(split.calls.calls) if split.calls else 0
            if split is not None:
                for event in _split_chunks(envelope, split.finish(), None, calls):
                    yield event
        except Exception as err:  # the stream has started: the error is its last event
            yield _event(status_of(err)[1])
            return
        stats = text.stats()
        finish = _finish(text.finish_reason, split) if split is not None else text.finish_reason
        yield _event(envelope.chunk(finish_reason=finish, stats=stats))
        if asked.include_usage:
            counts = responses.usage(len(asked.prompt), text.completion_tokens, text.cached_tokens)
            yield _event(envelope.usage_chunk(counts, stats))
        yield {"data": "[DONE]"}

    # Access and errors.

    def _authorize(self, request: Request) -> None:
        if not self._key_given(request):
            raise ApiKeyError("missing or wrong API key: send 'Authorization: Bearer KEY'")

    def _key_given(self, request: Request) -> bool:
        if self.api_key is None:
            return True
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and secrets.compare_digest(
            given.strip().encode("utf-8", "surrogateescape"), self.api_key.encode()
        )

    async def _error(self, request: Request, err: Exception) -> Response:
        status, body = status_of(err)
        if isinstance(err, BodyTooLargeError):
            return RefusedBody(body, status_code=status)
        headers = {"Retry-After": str(err.retry_after_s)} if isinstance(err, QueueFullError) else None
        return JSONResponse(body, status_code=status, headers=headers)

    async def _http_error(self, request: Request, err: Exception) -> Response:
        assert isinstance(err, HTTPException)
        kind = "invalid_request_error" if err.status_code < 500 else "server_error"
        message = f"{request.method} {excerpt(request.url.path, 80)}: {err.detail}"
        return JSONResponse(responses.error(message, kind), status_code=err.status_code)


class RefusedBody(JSONResponse):
    """A 413 sent at once, while the rest of the refused body is read and dropped, then the connection closed.

    A client that sends a large body before it reads the answer (most do
    without ``Expect: 100-continue``) would otherwise meet a reset connection
    instead of the 413: closing a socket with unread data resets it. So the
    answer goes out first, whole, and the body that follows is discarded (never
    kept) for up to ``LINGER_S`` seconds, as a web server's lingering close does.
    """

    LINGER_S = 10.0

    def __init__(self, content: Any, status_code: int) -> None:
        super().__init__(content, status_code=status_code, headers={"connection": "close"})

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        await send({"type": "http.response.body", "body": self.body, "more_body": True})
        with anyio.move_on_after(self.LINGER_S):
            while True:
                message = await receive()
                if message["type"] == "http.disconnect" or not message.get("more_body"):
                    break
        await send({"type": "http.response.body", "body": b"", "more_body": False})


def _split_chunks(
    envelope: Envelope, split: Split, logprobs: dict[str, Any] | None, called: int
) -> Iterator[dict[str, str]]:
    """The chunks of one split piece: its reasoning, its text, and each tool call it completes (numbered
    after the ``called`` before it)."""
    if split.reasoning:
        yield _event(envelope.chunk(reasoning=split.reasoning))
    if split.content or logprobs:
        yield _event(envelope.chunk(text=split.content, logprobs=logprobs))
    for i, call in enumerate(split.calls):
        yield _event(envelope.chunk(tool_calls=[openai_call(call, called + i)]))


def _finish(reason: str, split: ChatOutput) -> str:
    """``tool_calls`` when the model stopped after writing calls."""
    return "tool_calls" if split.called and reason == "stop" else reason


def _event(body: dict[str, Any]) -> dict[str, str]:
    return {"data": json.dumps(body, separators=(",", ":"))}


def created_now() -> int:
    """Unix time, for the model card."""
    return int(time.time())


def _pace(pace: CoordinatorPace | None) -> dict[str, Any] | None:
    """This server's paced passes by role (None unpaced): passes, overruns, headroom median and p99."""
    if pace is None:
        return None
    out: dict[str, Any] = {"machine": pace.label}
    for role, counts in pace.snapshot().items():
        out[role] = {
            "passes": counts.passes,
            "overruns": counts.overruns,
            "headroom_p50": headroom_quantile(counts.headroom, 0.5),
            "headroom_p99": headroom_quantile(counts.headroom, 0.99),
        }
    return out
