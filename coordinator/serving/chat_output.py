"""A chat completion's output, split as it streams: reasoning, answer text, and tool calls.

The reasoning (``coordinator.serving.reasoning``) is split off first; the
answer is then read for tool calls (``coordinator.serving.tools``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from coordinator.serving.reasoning import ReasoningSplitter
from coordinator.serving.requests import CompletionRequest
from coordinator.serving.tools import CallSplitter


@dataclass
class Split:
    """A piece of output, split."""

    reasoning: str = ""
    content: str = ""
    calls: list[dict[str, Any]] = field(default_factory=list)


class ChatOutput:
    """Splits one request's output (``feed`` each piece, then ``finish``)."""

    def __init__(self, request: CompletionRequest) -> None:
        think = request.think
        self.reasoning = ReasoningSplitter(think, request.thinking) if think is not None else None
        tools, fmt = request.tools, request.tool_format
        self.calls = CallSplitter(fmt, tools.functions) if tools is not None and fmt is not None else None

    @property
    def called(self) -> bool:
        """Whether any tool call was read."""
        return bool(self.calls and self.calls.calls)

    def feed(self, piece: str) -> Split:
        """What ``piece`` releases."""
        reasoning, content = self.reasoning.feed(piece) if self.reasoning else ("", piece)
        return self._answer(reasoning, content)

    def finish(self) -> Split:
        """What is still held at the end."""
        reasoning, content = self.reasoning.finish() if self.reasoning else ("", "")
        split = self._answer(reasoning, content)
        if self.calls is not None:
            split.content += self.calls.finish()
        return split

    def _answer(self, reasoning: str, content: str) -> Split:
        if self.calls is None or not content:
            return Split(reasoning, content)
        text, calls = self.calls.feed(content)
        return Split(reasoning, text, calls)


def splits(request: CompletionRequest) -> bool:
    """Whether a request's output needs splitting at all."""
    return request.think is not None or (request.tools is not None and request.tool_format is not None)
