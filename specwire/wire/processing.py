"""A request's logits processing on the wire: the penalties and grammar a worker drafts under.

The coordinator sends them in the Open (``LogitsProcessing``), with how many
of the prompt's tokens are output already; the worker rebuilds them against
its own model's tokenizer (the vocabulary is the same, checked by
fingerprint), so each of its drafts is chosen from logits processed as the
target's verdict will be, and stays acceptable under a grammar.
"""

from __future__ import annotations

from collections.abc import Sequence

from specwire.errors import InvalidArgumentError
from specwire.logits.grammar import GrammarSpec, checked_grammar, grammar_tokenizer
from specwire.logits.processors import Penalties, Processing
from specwire.models.loading import LoadedModel
from specwire.v1 import draft_pb2 as pb


def processing_to_pb(processing: Processing | None) -> pb.LogitsProcessing | None:
    """``processing``'s penalties and grammar, and the output so far (None: nothing to send)."""
    if processing is None:
        return None
    p = processing.penalties
    spec: GrammarSpec | None = getattr(processing.constraint, "spec", None)
    if not p.active and spec is None:
        return None
    return pb.LogitsProcessing(
        logit_bias=dict(p.logit_bias),
        repetition_penalty=p.repetition_penalty,
        presence_penalty=p.presence_penalty,
        frequency_penalty=p.frequency_penalty,
        grammar=spec.grammar if spec is not None else "",
        grammar_source=spec.what if spec is not None else "",
        output_tokens=processing.output,
    )


def processing_from_pb(
    msg: pb.LogitsProcessing, model: LoadedModel, prompt: Sequence[int]
) -> Processing | None:
    """The Open's processing for ``model``'s drafts after ``prompt``; ``InvalidArgumentError`` naming the
    field for a token outside the vocabulary, a penalty out of range or a grammar the model cannot take."""
    if msg.output_tokens > len(prompt):
        raise InvalidArgumentError(
            f"processing.output_tokens {msg.output_tokens} exceeds the prompt's {len(prompt)} tokens"
        )
    outside = sorted(t for t in msg.logit_bias if t >= model.vocab_size)
    if outside:
        raise InvalidArgumentError(
            f"processing.logit_bias names token {outside[0]}, outside the vocabulary of {model.vocab_size}"
        )
    repetition = msg.repetition_penalty or 1.0
    if repetition < 0:
        raise InvalidArgumentError(f"processing.repetition_penalty must be positive, not {repetition}")
    penalties = Penalties(
        tuple(sorted(msg.logit_bias.items())), repetition, msg.presence_penalty, msg.frequency_penalty
    )
    constraint = None
    if msg.grammar:
        what = msg.grammar_source or "processing.grammar"
        lltokenizer = grammar_tokenizer(model.tokenizer, model.vocab_size, sorted(model.eos_token_ids))
        constraint = checked_grammar(msg.grammar, what, lltokenizer).matcher()
        constraint.accept(prompt[len(prompt) - msg.output_tokens :])  # the output so far
    if not penalties.active and constraint is None:
        return None
    return Processing(penalties, prompt, constraint)
