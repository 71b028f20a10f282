"""One generation session on a worker: its drafter, its checks and its counters.

The stream service calls ``open_session`` with the session's Open message and
then ``round`` once per Round message. Both validate their input against the
model (vocabulary, context length, k) before touching the KV cache, so a bad
message never leaves a session half-updated. Methods that run the model must
run on the worker's compute thread.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from specwire.drafter import DraftBlock, Drafter
from specwire.errors import InvalidArgumentError, ProtocolVersionError, VocabularyMismatchError
from specwire.models import LoadedModel
from specwire.protocol import MAX_K, PROTOCOL_VERSION, sampling_from_pb
from specwire.v1 import draft_pb2 as pb
from worker.hosting import WorkerCounters


@dataclass(frozen=True)
class Computed:
    """A block of drafts, and when its compute started and ended (worker clock, ns)."""

    block: DraftBlock
    started_ns: int
    finished_ns: int


class DraftSession:
    """A draft model's state for one coordinator's generation."""

    def __init__(self, model: LoadedModel, open_msg: pb.Open, totals: WorkerCounters) -> None:
        check_open(model, open_msg)
        self.model = model
        self.totals = totals
        self.k = open_msg.k
        self.prompt = list(open_msg.prompt_tokens)
        self.drafter = Drafter(model.model, sampling_from_pb(open_msg.sampling))
        self.next_seq = 0
        self.rounds = 0
        self.draft_tokens = 0

    @property
    def forward_passes(self) -> int:
        """Draft-model forward passes of this session, prefill included."""
        return self.drafter.forward_passes

    def prefill(self) -> int:
        """Prefill the prompt; returns compute ns. Compute thread only."""
        before = self.drafter.forward_passes
        elapsed = self.drafter.start(self.prompt)
        self.totals.forward_passes += self.drafter.forward_passes - before
        return elapsed

    def first_drafts(self) -> Computed:
        """Draft round 0 (the k of the Open message). Compute thread only."""
        started = time.perf_counter_ns()
        return Computed(self._draft(self.k), started, time.perf_counter_ns())

    def check_round(self, msg: pb.Round) -> None:
        """Raise ``InvalidArgumentError`` unless ``msg`` is the next valid round."""
        if msg.seq != self.next_seq:
            raise InvalidArgumentError(f"round seq {msg.seq} out of order; expected {self.next_seq}")
        if msg.accepted > len(self.drafter.last_drafts):
            raise InvalidArgumentError(
                f"round {msg.seq}: accepted {msg.accepted} exceeds the "
                f"{len(self.drafter.last_drafts)} drafts sent"
            )
        check_token(self.model, msg.token, f"round {msg.seq} token")
        check_k(msg.k)
        room = self.model.context_length - len(self.drafter.context) - msg.accepted - 1
        if msg.k > room:
            raise InvalidArgumentError(
                f"round {msg.seq}: k={msg.k} would run past the model's context "
                f"of {self.model.context_length}"
            )

    def round(self, msg: pb.Round) -> Computed:
        """Apply the target's verdict, then draft the next k tokens. Compute thread only."""
        started = time.perf_counter_ns()
        self.check_round(msg)
        self.drafter.apply(msg.accepted, msg.token)
        return Computed(self._draft(msg.k), started, time.perf_counter_ns())

    def _draft(self, k: int) -> DraftBlock:
        block = self.drafter.draft(k)
        self.next_seq += 1
        self.rounds += 1
        self.draft_tokens += len(block.tokens)
        self.totals.forward_passes += block.forward_passes
        self.totals.draft_tokens += len(block.tokens)
        return block


def check_k(k: int) -> None:
    """Raise unless ``k`` is a draft count the protocol allows (1..MAX_K)."""
    if not 1 <= k <= MAX_K:
        raise InvalidArgumentError(f"k={k} is outside 1..{MAX_K}")


def check_token(model: LoadedModel, token: int, what: str) -> None:
    """Raise unless ``token`` is an id of the model's vocabulary."""
    if token >= model.vocab_size:
        raise InvalidArgumentError(f"{what} {token} is outside the vocabulary (size {model.vocab_size})")


def check_peer(model: LoadedModel, protocol_version: int, fingerprint: str) -> None:
    """Raise unless a coordinator with this protocol version and vocabulary can use this worker."""
    if protocol_version != PROTOCOL_VERSION:
        raise ProtocolVersionError(
            f"coordinator speaks protocol version {protocol_version}; this worker speaks {PROTOCOL_VERSION}"
        )
    if fingerprint != model.fingerprint:
        raise VocabularyMismatchError(
            f"coordinator vocabulary {fingerprint or '(none)'} does not match this worker's "
            f"{model.fingerprint} (model {model.spec}); draft and target must share one tokenizer"
        )


def check_open(model: LoadedModel, msg: pb.Open) -> None:
    """Raise the precise error for an Open message this worker cannot serve."""
    check_peer(model, msg.protocol_version, msg.vocab_fingerprint)
    if not msg.prompt_tokens:
        raise InvalidArgumentError("the prompt must hold at least one token")
    if len(msg.prompt_tokens) + msg.k >= model.context_length:
        raise InvalidArgumentError(
            f"a prompt of {len(msg.prompt_tokens)} tokens plus k={msg.k} does not fit the "
            f"model's context of {model.context_length}"
        )
    bad = max(msg.prompt_tokens)
    check_token(model, bad, "prompt token")
    check_k(msg.k)
    sampling_from_pb(msg.sampling)
