"""From a generation's tokens to the text a client gets: detokenized as it streams, cut at stop sequences."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from coordinator.detokenizer import TextDecoder
from coordinator.serving.generation import Generation
from coordinator.serving.stops import StopMatcher
from coordinator.strict_json import strict_json
from specwire.logits.processors import TokenLogprob


class CompletionText:
    """The text of one generation, a piece per round, and how it ended.

    Tokens are decoded as they come (``coordinator.detokenizer``: a character
    split over tokens is sent whole) and passed through the stop sequences.
    On a match the generation is halted; what the engine made after it is
    dropped. When ``pieces`` is exhausted, ``finish_reason``,
    ``completion_tokens`` and ``stats`` hold the ending.
    """

    def __init__(self, generation: Generation, tokenizer: Any) -> None:
        self.generation = generation
        self._text = TextDecoder(tokenizer)
        self._stops = StopMatcher(generation.request.stop)
        self._used = 0  # tokens whose text went into the output, up to a stop match
        self._reported = 0  # tokens whose log-probabilities were handed out (streamed)

    async def pieces(self) -> AsyncGenerator[str, None]:
        """Text as it is made; raises the generation's error, if it failed."""
        generation = self.generation
        try:
            async with generation.tokens:
                async for tokens in generation.tokens:
                    if piece := self._take(tokens):  # one piece per round: one event, not one per token
                        yield piece
                    if self._stops.stopped:
                        generation.halt.set()
                        break
            if not self._stops.stopped and (
                piece := self._stops.feed(self._text.finish()) + self._stops.flush()
            ):
                yield piece
            await generation.done.wait()
        finally:
            generation.halt.set()  # a no-op once it ended; else its client left, so it stops
        if generation.error is not None:
            raise generation.error

    def _take(self, tokens: list[int]) -> str:
        """The text ``tokens`` add, up to a stop sequence."""
        text = []
        for token in tokens:
            self._used += 1
            text.append(self._stops.feed(self._text.add(token)))
            if self._stops.stopped:
                break
        return "".join(text)

    @property
    def finish_reason(self) -> str:
        """``stop`` (a stop sequence or the end-of-sequence token) or ``length``."""
        result = self.generation.result
        if self._stops.stopped or (result is not None and result.finish_reason == "eos"):
            return "stop"
        return "length"

    @property
    def completion_tokens(self) -> int:
        """Tokens the output is made of (through the one that completed a stop sequence)."""
        result = self.generation.result
        if self._stops.stopped or result is None:
            return self._used
        return len(result.tokens)

    def logprobs(self, since: int = 0) -> list[TokenLogprob] | None:
        """The output's tokens' log-probabilities from token ``since`` on (None: not asked for)."""
        processing = self.generation.processing
        if processing is None or processing.logprobs is None:
            return None
        return processing.logprobs_out[since : self.completion_tokens]

    def new_logprobs(self) -> list[TokenLogprob] | None:
        """Those of the tokens since the last call (streaming: a chunk's)."""
        out = self.logprobs(self._reported)
        if out is not None:
            self._reported += len(out)
        return out

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens the target took from the prompt cache."""
        result = self.generation.result
        return result.cached_tokens if result is not None else 0

    def stats(self) -> dict[str, Any]:
        """The figures this project exists for: drafting, acceptance, which worker, and speed."""
        generation, result = self.generation, self.generation.result
        stats: dict[str, Any] = {**generation.source, "queued_s": generation.queued_s}
        if result is not None:
            stats.update(
                drafted=result.drafted,
                accepted=result.accepted,
                acceptance_rate=result.acceptance_rate,
                rounds=len(result.rounds),
                ttft_s=result.ttft_s,
                generation_s=(result.end_ns - result.start_ns) / 1e9,
                decode_tok_s=result.decode_tps,
                tokens_generated=len(result.tokens),
                token_ids=result.tokens[: self.completion_tokens],
                cached_tokens=result.cached_tokens,
            )
            if result.cache_note:
                stats["prompt_cache_note"] = result.cache_note
            processing = generation.processing
            if processing is not None:  # penalties and grammar: rows processed, and what they cost
                stats.update(processed_rows=processing.rows, processing_s=processing.ns / 1e9)
        return strict_json(stats)
