"""A thinking model's reasoning, apart from its answer: ``reasoning_content`` beside ``content``.

A model thinks between the markers its tokenizer names (mlx-lm's
``think_start`` and ``think_end``: ``<think>`` and ``</think>`` for Qwen3).
Its chat template may open the thinking in the prompt (the output then
starts inside it) or leave the model to open it. What lies between the
markers goes out as ``reasoning_content`` (the field DeepSeek's and vLLM's
OpenAI-compatible servers use, which Open WebUI and LiteLLM read); the rest
as ``content``. ``chat_template_kwargs: {"enable_thinking": false}`` turns
thinking off where the template takes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from coordinator.serving.stops import partial_tail


@dataclass(frozen=True)
class ThinkMarkers:
    """Where a model's thinking starts and ends, as text."""

    start: str
    end: str


def think_markers(tokenizer: Any) -> ThinkMarkers | None:
    """The model's thinking markers (None: it does not think, as far as mlx-lm can tell)."""
    if not getattr(tokenizer, "has_thinking", False):
        return None
    start, end = getattr(tokenizer, "think_start", None), getattr(tokenizer, "think_end", None)
    return ThinkMarkers(start, end) if start and end else None


def opens_thinking(prompt_text: str, markers: ThinkMarkers) -> bool:
    """Whether the prompt leaves the model inside its thinking (its last start after its last end)."""
    return prompt_text.rfind(markers.start) > prompt_text.rfind(markers.end)


class ReasoningSplitter:
    """Splits streamed output into (reasoning, content) pieces at the thinking markers."""

    def __init__(self, markers: ThinkMarkers, thinking: bool) -> None:
        self.markers = markers
        self.thinking = thinking  # inside the thinking now
        self._seen_content = False  # thinking opens only before any answer text
        self._after_end = False  # just past the end marker
        self._held = ""

    def feed(self, piece: str) -> tuple[str, str]:
        """The reasoning and the content ``piece`` releases."""
        self._held += piece
        reasoning, content = [], []
        while self._held:
            if self.thinking:
                at = self._held.find(self.markers.end)
                if at < 0:
                    keep = partial_tail(self._held, (self.markers.end,))
                    reasoning.append(self._held[: len(self._held) - keep])
                    self._held = self._held[len(self._held) - keep :]
                    break
                reasoning.append(self._held[:at])
                self._held = self._held[at + len(self.markers.end) :]
                self.thinking, self._after_end = False, True
                continue
            if self._after_end:  # the blank lines a model writes after its thinking are neither
                self._held = self._held.lstrip("\n")
                if not self._held:
                    break
                self._after_end = False
            if not self._seen_content:
                stripped = self._held.lstrip()
                if stripped.startswith(self.markers.start):
                    self._held = stripped[len(self.markers.start) :]
                    self.thinking = True
                    continue
                if self.markers.start.startswith(stripped):  # the marker may be arriving
                    break
            self._seen_content = True
            content.append(self._held)
            self._held = ""
        return "".join(reasoning), "".join(content)

    def finish(self) -> tuple[str, str]:
        """What is still held at the end."""
        held, self._held = self._held, ""
        return (held, "") if self.thinking else ("", held)
