"""Completion prompts for behaviour tests, and the target's own greedy output for each."""

from __future__ import annotations

from coordinator.decoding.engine import SpeculativeDecoder
from coordinator.decoding.results import GenerationResult
from coordinator.drafting.local import LocalDraftSource
from coordinator.prompts import encode_prompt
from specwire.drafting.sampling import SamplingParams
from specwire.models.loading import LoadedModel

MAX_TOKENS = 12
# Completion-style prompts: short (prefill is slow on the CPU backend) and
# each continues for all MAX_TOKENS tokens rather than stopping at EOS.
PROMPTS = [
    "def factorial(n):\n    ",
    "import numpy as np\n\ndef mean(xs):\n",
    "Question: What is 17 multiplied by 23?\nAnswer:",
    "To solve 3x + 7 = 22, we",
    "Once upon a time, a lighthouse keeper",
    "The sky is blue because",
]

_AR: dict[tuple[str, str, int], list[int]] = {}
_SD: dict[tuple[str, str, str, int, int], GenerationResult] = {}


def ar_tokens(target: LoadedModel, prompt: list[int], max_tokens: int = MAX_TOKENS) -> list[int]:
    """The target's own greedy output (k = 0), computed once per target, prompt and length."""
    key = (target.spec, str(prompt), max_tokens)
    if key not in _AR:
        result = SpeculativeDecoder(target).generate(
            prompt, max_tokens=max_tokens, k=0, params=SamplingParams()
        )
        assert result.drafted == 0
        _AR[key] = result.tokens
    return _AR[key]


def local_sd(
    target: LoadedModel, draft: LoadedModel, prompt: list[int], k: int, max_tokens: int = MAX_TOKENS
) -> GenerationResult:
    """Greedy local SD of ``target`` drafted by ``draft`` (deterministic at T = 0), run once per pair,
    prompt, k and length: the lossless test checks it against AR, the remote backends against it."""
    key = (target.spec, draft.spec, str(prompt), k, max_tokens)
    if key not in _SD:
        decoder = SpeculativeDecoder(target, LocalDraftSource(draft))
        _SD[key] = decoder.generate(prompt, max_tokens=max_tokens, k=k, params=SamplingParams())
    return _SD[key]


def text_ar_tokens(target: LoadedModel, text: str, max_tokens: int) -> list[int]:
    """What ``coordinator generate --draft none`` gives for ``text`` without ``--chat``, in this process."""
    return ar_tokens(target, encode_prompt(target, text, chat=False), max_tokens)
