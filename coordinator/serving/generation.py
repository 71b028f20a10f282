"""One request as ``serve`` runs it (``Generation``), and how every request is drafted (``Drafting``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from coordinator.decoding.engine import Decoding, GenerationResult, SpeculativeDecoder
from coordinator.drafting.spec import DraftSpec
from coordinator.serving.requests import CompletionRequest
from specwire.logits.processors import Processing


@dataclass(eq=False)  # one per request: compared, and kept in sets, by identity
class Generation:
    """One admitted request as it runs: its token stream, and at the end its result or error."""

    request: CompletionRequest
    tokens: MemoryObjectReceiveStream[list[int]]
    halt: threading.Event = field(default_factory=threading.Event)
    done: anyio.Event = field(default_factory=anyio.Event)
    submitted_ns: int = field(default_factory=time.perf_counter_ns)
    started_ns: int = 0
    result: GenerationResult | None = None
    error: Exception | None = None
    source: dict[str, Any] = field(default_factory=dict)  # the draft source used, and its provenance
    generated: int = 0  # tokens delivered so far (the compute thread counts them)
    rounds: int = 0  # rounds that delivered tokens so far
    decoding: Decoding | None = None  # while active
    batched: bool = False  # decoded in the scheduler's batch (from joining it to its end)
    send: MemoryObjectSendStream[list[int]] | None = None
    processing: Processing | None = None  # its logits processing (and log-probabilities), once begun

    @property
    def queued_s(self) -> float:
        """Seconds spent waiting for the target."""
        return (self.started_ns - self.submitted_ns) / 1e9 if self.started_ns else float("nan")


def begin(
    decoder: SpeculativeDecoder,
    generation: Generation,
    k: int,
    deliver: Callable[[list[int]], None],
    prefill: bool = True,
) -> Decoding:
    """Start ``generation``'s request on ``decoder`` with up to ``k`` drafts a round (compute thread);
    ``prefill`` False leaves its prompt to a batch's ``admit``."""
    request = generation.request
    generation.processing = processing = request.processing()
    decoding = decoder.begin(
        request.prompt,
        max_tokens=request.max_tokens,
        k=k,
        params=request.params,
        on_tokens=deliver,
        halt=generation.halt,
        processing=processing,
        prefill=prefill,
    )
    if request.ignore_eos:
        decoding.stop_ids = frozenset()
    return decoding


@dataclass(frozen=True)
class Drafting:
    """How every request is drafted: the source, and for a fixed set-up its k (as ``generate`` has them)."""

    spec: DraftSpec
    k: int
