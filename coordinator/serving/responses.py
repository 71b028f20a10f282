"""The OpenAI-shaped bodies this server sends: completions, stream chunks, usage, models and errors.

Every completion carries ``usage`` as OpenAI gives it, and a ``specwire``
object with this project's figures (drafting, acceptance, the worker that
drafted, speed); OpenAI clients ignore fields they do not know.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from coordinator.serving.requests import CHAT
from specwire.logits.processors import TokenLogprob

EXTENSION = "specwire"


@dataclass(frozen=True)
class Envelope:
    """What every body of one completion shares: its id, creation time, model, and kind."""

    kind: str
    model: str
    id: str = field(default_factory=lambda: secrets.token_hex(12))
    created: int = field(default_factory=lambda: int(time.time()))

    def _head(self, chunk: bool) -> dict[str, Any]:
        if self.kind == CHAT:
            prefix, obj = "chatcmpl-", "chat.completion.chunk" if chunk else "chat.completion"
        else:
            prefix, obj = "cmpl-", "text_completion"
        return {"id": prefix + self.id, "object": obj, "created": self.created, "model": self.model}

    def completion(
        self,
        text: str,
        finish_reason: str,
        usage: dict[str, Any],
        stats: dict[str, Any],
        logprobs: dict[str, Any] | None = None,
    ) -> dict:
        """A whole (non-streamed) completion."""
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish_reason, "logprobs": logprobs}
        if self.kind == CHAT:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return {**self._head(False), "choices": [choice], "usage": usage, EXTENSION: stats}

    def chunk(
        self,
        text: str | None = None,
        finish_reason: str | None = None,
        first: bool = False,
        stats: dict[str, Any] | None = None,
        logprobs: dict[str, Any] | None = None,
        tool_calls: list[dict[str, Any]] | None = None,
        reasoning: str | None = None,
    ) -> dict:
        """One streamed chunk: a piece of text, tool calls, or the finish reason (with the figures)."""
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish_reason, "logprobs": logprobs}
        if self.kind == CHAT:
            delta: dict[str, Any] = {"role": "assistant"} if first else {}
            if text is not None:
                delta["content"] = text
            if tool_calls is not None:
                delta["tool_calls"] = tool_calls
            if reasoning is not None:
                delta["reasoning_content"] = reasoning
            choice["delta"] = delta
        else:
            choice["text"] = text or ""
        body = {**self._head(True), "choices": [choice]}
        if stats is not None:
            body[EXTENSION] = stats
        return body

    def usage_chunk(self, usage: dict[str, Any], stats: dict[str, Any]) -> dict:
        """The chunk after the finish reason when usage is asked for: no choices, usage, the figures."""
        return {**self._head(True), "choices": [], "usage": usage, EXTENSION: stats}


def logprobs(
    kind: str, entries: list[TokenLogprob] | None, piece: Callable[[int], str], offset: int = 0
) -> dict[str, Any] | None:
    """Log-probabilities as OpenAI shapes them: chat's ``content`` list, or the legacy completions'
    parallel lists (``text_offset`` counted from ``offset`` characters)."""
    if entries is None:
        return None
    if kind == CHAT:
        return {"content": [_chat_logprob(e, piece) for e in entries]}
    tokens = [piece(e.token) for e in entries]
    offsets = [offset + sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
    return {
        "tokens": tokens,
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [{piece(t): lp for t, lp in e.top} for e in entries],
        "text_offset": offsets,
    }


def _chat_logprob(entry: TokenLogprob, piece: Callable[[int], str]) -> dict[str, Any]:
    def one(token: int, logprob: float) -> dict[str, Any]:
        text = piece(token)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    return {**one(entry.token, entry.logprob), "top_logprobs": [one(t, lp) for t, lp in entry.top]}


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    """Token counts, as OpenAI reports them (the prompt's tokens taken from the prompt cache among them)."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def models(model: str, created: int) -> dict[str, Any]:
    """The one model this server serves, as ``GET /v1/models`` lists it."""
    return {"object": "list", "data": [model_card(model, created)]}


def model_card(model: str, created: int) -> dict[str, Any]:
    """One model, as ``GET /v1/models/{id}`` gives it."""
    return {"id": model, "object": "model", "created": created, "owned_by": "specwire"}


def error(message: str, kind: str, code: str | None = None, param: str | None = None) -> dict[str, Any]:
    """An OpenAI-shaped error body."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
