"""Reading OpenAI-style request bodies into what the engine takes, or a clear error naming the field.

``read_request`` checks a ``/v1/chat/completions`` or ``/v1/completions``
body against the served target: the model's name, the messages and tools
(through the chat template: ``coordinator.serving.chat``) or the prompt, the
token budget against the context, the sampling parameters and penalties,
``logprobs``, the grammar of ``response_format`` or a forced tool call, and
stop sequences. Parameters this server
does not implement are refused by name rather than silently ignored; fields
it has no use for that change nothing about the output (``user``,
``metadata``) are accepted.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, field
from typing import Any

from coordinator.serving.body import excerpt
from coordinator.serving.chat import ChatTemplate, chat_prompt
from coordinator.serving.reasoning import ThinkMarkers, opens_thinking, think_markers
from coordinator.serving.tools import ToolChoice, ToolFormat, forced_grammar, read_tools
from specwire.drafting.sampling import SamplingParams
from specwire.errors import (
    ContextLengthError,
    InvalidArgumentError,
    UnknownModelError,
    UnsupportedParameterError,
)
from specwire.logits.grammar import GrammarSpec, grammar_tokenizer, json_schema_grammar
from specwire.logits.processors import Penalties, Processing
from specwire.models.loading import LoadedModel

CHAT, TEXT = "chat", "text"
MAX_STOPS = 4
MAX_LOGIT_BIAS = 300  # OpenAI's limit on tokens a logit_bias names
MAX_REPETITION_PENALTY = 10.0
MAX_TOP_LOGPROBS = 20  # OpenAI's bounds: top_logprobs in chat, logprobs in completions
MAX_TEXT_LOGPROBS = 5
THINK_TAIL = 64  # prompt tokens read for an opened thinking (a template opens it at the very end)
DEFAULT_TEMPERATURE = 1.0  # OpenAI's default; send 0 for greedy output, token-identical to the target's

# A parameter and the value that means "not used"; any other value is refused by name.
UNSUPPORTED: dict[str, object] = {
    "n": 1,
    "best_of": 1,
    "functions": None,
    "function_call": None,
    "echo": False,
    "suffix": None,
    "audio": None,
    "prediction": None,
}


@dataclass(frozen=True)
class CompletionRequest:
    """One request, checked: prompt token ids, how many tokens, how to sample, when to stop."""

    kind: str  # CHAT or TEXT
    prompt: list[int]
    max_tokens: int
    params: SamplingParams
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    penalties: Penalties = field(default_factory=Penalties)
    ignore_eos: bool = False  # generate to max_tokens past the end-of-sequence token (vLLM's, llama.cpp's)
    logprobs: int | None = None  # None: none; else each token's, and this many top alternatives
    grammar: GrammarSpec | None = None  # response_format's or a forced tool call's
    tools: ToolChoice | None = None  # the tools whose calls are read back from the output
    tool_format: ToolFormat | None = None  # how the model writes them
    think: ThinkMarkers | None = None  # a thinking model's markers (chat): its reasoning is split off
    thinking: bool = False  # the prompt leaves the model inside its thinking

    def processing(self) -> Processing | None:
        """A fresh logits processing for one run of this request; None when it neither changes a logit
        nor reports log-probabilities."""
        if not self.penalties.active and self.logprobs is None and self.grammar is None:
            return None
        constraint = self.grammar.matcher() if self.grammar is not None else None
        return Processing(self.penalties, self.prompt, constraint, self.logprobs)


def read_request(
    body: object,
    kind: str,
    served: str,
    target: LoadedModel,
    default_max_tokens: int,
    template: ChatTemplate | None = None,
) -> CompletionRequest:
    """The request ``body`` asks for, or a ``SpecwireError`` naming what is wrong with it. ``template``:
    the chat template served (default: the model's own)."""
    if not isinstance(body, dict):
        raise InvalidArgumentError("the request body must be a JSON object")
    model = body.get("model")
    if model is not None and model != served:
        raise UnknownModelError(f"model {excerpt(model)} is not served here; this server serves {served!r}")
    _refuse_unsupported(body)
    template = template or ChatTemplate.of(target.tokenizer)
    if kind == CHAT:
        tools = read_tools(body)
        if tools is not None and template.tools is None:
            raise UnsupportedParameterError(
                "tools: this model's chat template writes no tool calls that can be read back "
                "(serve it with --chat-template FILE, a template that takes tools)",
                "tools",
            )
        prompt = chat_prompt(body, target.tokenizer, template, tools)
    else:
        _no_tools(body)
        tools, prompt = None, _text_prompt(body, target)
    grammar = _grammar(body, target, tools, template)
    stream = _optional(body, "stream", bool, False)
    options = body.get("stream_options")
    if options is not None and not (stream and isinstance(options, dict)):
        raise InvalidArgumentError("stream_options is an object, and only allowed with stream: true")
    return CompletionRequest(
        kind=kind,
        prompt=prompt,
        max_tokens=_max_tokens(body, len(prompt), target.context_length, default_max_tokens),
        params=_sampling(body),
        stop=_stops(body),
        stream=stream,
        include_usage=bool(options and options.get("include_usage")),
        penalties=_penalties(body, target.vocab_size),
        ignore_eos=_optional(body, "ignore_eos", bool, False),
        logprobs=_logprobs(body, kind),
        grammar=grammar,
        tools=tools if tools is not None and tools.mode != "none" else None,
        tool_format=template.tools,
        **_thinking(kind, prompt, target.tokenizer),
    )


def _refuse_unsupported(body: dict[str, Any]) -> None:
    for name, unused in UNSUPPORTED.items():
        value = body.get(name)
        if value is None or value == unused or (unused is None and value in ({}, [], False, 0)):
            continue  # absent, or a client's way of saying "not used"
        raise UnsupportedParameterError(f"{name}={excerpt(value)} is not supported by this server", name)


def _optional(body: dict[str, Any], name: str, kind: type, default: Any) -> Any:
    value = body.get(name)
    if value is None:
        return default
    if kind in (int, float) and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise InvalidArgumentError(f"{name} must be a number, got {excerpt(value)}")
    if kind in (int, float) and not math.isfinite(value):
        raise InvalidArgumentError(f"{name} must be finite, got {excerpt(value)}")
    if kind is int and value != int(value):
        raise InvalidArgumentError(f"{name} must be an integer, got {excerpt(value)}")
    if kind in (bool, str) and not isinstance(value, kind):
        raise InvalidArgumentError(f"{name} must be a {kind.__name__}, got {excerpt(value)}")
    return kind(value)


def _text_prompt(body: dict[str, Any], target: LoadedModel) -> list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        ids = list(target.tokenizer.encode(prompt))
    elif isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        ids = prompt
        vocab = target.vocab_size
        if not all(0 <= t < vocab for t in ids):
            raise InvalidArgumentError(f"prompt token ids must lie in 0..{vocab - 1}")
    elif isinstance(prompt, list) and len(prompt) > 1:
        raise UnsupportedParameterError("several prompts in one request are not supported", "prompt")
    else:
        raise InvalidArgumentError("prompt must be a string or a list of token ids")
    if not ids:
        raise InvalidArgumentError("the prompt is empty")
    return ids


def _max_tokens(body: dict[str, Any], prompt_tokens: int, context: int, default: int) -> int:
    # The newer name wins; a null one counts as absent, as in OpenAI's API.
    name = next((n for n in ("max_completion_tokens", "max_tokens") if body.get(n) is not None), None)
    room = context - prompt_tokens
    if room < 1:
        raise ContextLengthError(
            f"the prompt has {prompt_tokens} tokens; the model's context holds {context}, "
            "with room for at least one more"
        )
    if name is None:
        return min(default, room)
    value = _optional(body, name, int, default)
    if value < 1:
        raise InvalidArgumentError(f"{name} must be >= 1, got {value}")
    if value > room:
        raise ContextLengthError(
            f"the model's context holds {context} tokens; the prompt has {prompt_tokens} "
            f"and {name} asks for {value} more (at most {room})"
        )
    return int(value)


def _sampling(body: dict[str, Any]) -> SamplingParams:
    temperature = _optional(body, "temperature", float, DEFAULT_TEMPERATURE)
    if not (math.isfinite(temperature) and 0.0 <= temperature <= 2.0):
        raise InvalidArgumentError(f"temperature must be within 0..2, got {temperature}")
    top_p = _optional(body, "top_p", float, 1.0)
    if not 0.0 < top_p <= 1.0:
        raise InvalidArgumentError(f"top_p must be within (0, 1], got {top_p}")
    top_k = _optional(body, "top_k", int, 0)
    if top_k < 0:
        raise InvalidArgumentError(f"top_k must be >= 0 (0: off), got {top_k}")
    min_p = _optional(body, "min_p", float, 0.0)
    if not 0.0 <= min_p <= 1.0:
        raise InvalidArgumentError(f"min_p must be within 0..1, got {min_p}")
    seed = _optional(body, "seed", int, None)
    if seed is None:
        seed = secrets.randbits(63)
    elif not 0 <= seed < 2**63:
        raise InvalidArgumentError(f"seed must be within 0..2**63 - 1, got {seed}")
    return SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed, min_p=min_p)


def _penalties(body: dict[str, Any], vocab_size: int) -> Penalties:
    repetition = _optional(body, "repetition_penalty", float, 1.0)
    if not 0.0 < repetition <= MAX_REPETITION_PENALTY:
        raise InvalidArgumentError(
            f"repetition_penalty must be within (0, {MAX_REPETITION_PENALTY}] (1: off), got {repetition}"
        )
    penalties = {}
    for name in ("presence_penalty", "frequency_penalty"):
        value = penalties[name] = _optional(body, name, float, 0.0)
        if not -2.0 <= value <= 2.0:
            raise InvalidArgumentError(f"{name} must be within -2..2, got {value}")
    return Penalties(
        logit_bias=_logit_bias(body.get("logit_bias"), vocab_size),
        repetition_penalty=repetition,
        **penalties,
    )


def _thinking(kind: str, prompt: list[int], tokenizer: Any) -> dict[str, Any]:
    """A chat request's thinking markers, and whether its prompt opens the thinking."""
    markers = think_markers(tokenizer) if kind == CHAT else None
    if markers is None:
        return {}
    tail = tokenizer.decode(prompt[-THINK_TAIL:])
    return {"think": markers, "thinking": opens_thinking(tail, markers)}


def _no_tools(body: dict[str, Any]) -> None:
    if body.get("tools") or body.get("tool_choice") not in (None, "none", "auto"):
        raise InvalidArgumentError("tools are a chat parameter; use /v1/chat/completions")


def _grammar(
    body: dict[str, Any], target: LoadedModel, tools: ToolChoice | None, template: ChatTemplate
) -> GrammarSpec | None:
    """The grammar the output must follow: ``response_format``'s, or a forced tool call's."""
    response_format = body.get("response_format")
    kind = response_format.get("type") if isinstance(response_format, dict) else response_format
    forced = tools is not None and tools.mode == "required"
    if kind in (None, "text") and not forced:
        return None
    if body.get("ignore_eos"):
        raise InvalidArgumentError("ignore_eos cannot be combined with a grammar: the output ends with it")
    lltokenizer = grammar_tokenizer(target.tokenizer, target.vocab_size, sorted(target.eos_token_ids))
    if forced:
        if kind not in (None, "text"):
            raise InvalidArgumentError("response_format cannot be combined with a forced tool call")
        assert tools is not None
        return forced_grammar(tools, template.tools, lltokenizer)
    assert isinstance(response_format, dict)
    if kind == "json_object":
        return json_schema_grammar({"type": "object"}, "response_format", lltokenizer)
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
            raise InvalidArgumentError("response_format.json_schema must be {name, schema, strict}")
        schema = spec.get("schema", {})
        return json_schema_grammar(schema, "response_format.json_schema.schema", lltokenizer)
    raise UnsupportedParameterError(
        f"response_format type {excerpt(kind)} is not supported (text, json_object, json_schema)",
        "response_format",
    )


def _logprobs(body: dict[str, Any], kind: str) -> int | None:
    """Chat: ``logprobs`` true, with ``top_logprobs`` 0..20 alternatives; text: ``logprobs`` 0..5."""
    if kind == CHAT:
        wanted = _optional(body, "logprobs", bool, False)
        top = _optional(body, "top_logprobs", int, None)
        if top is not None and not wanted:
            raise InvalidArgumentError("top_logprobs needs logprobs: true")
        if top is not None and not 0 <= top <= MAX_TOP_LOGPROBS:
            raise InvalidArgumentError(f"top_logprobs must be within 0..{MAX_TOP_LOGPROBS}, got {top}")
        return (top or 0) if wanted else None
    if body.get("top_logprobs") is not None:
        raise InvalidArgumentError("top_logprobs is a chat parameter; /v1/completions takes logprobs: N")
    top = _optional(body, "logprobs", int, None)
    if top is not None and not 0 <= top <= MAX_TEXT_LOGPROBS:
        raise InvalidArgumentError(f"logprobs must be within 0..{MAX_TEXT_LOGPROBS}, got {top}")
    return top


def _logit_bias(value: object, vocab_size: int) -> tuple[tuple[int, float], ...]:
    """OpenAI's ``{"token id": bias}``, each bias within -100..100."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise InvalidArgumentError(f"logit_bias must be an object of token id -> bias, got {excerpt(value)}")
    if len(value) > MAX_LOGIT_BIAS:
        raise InvalidArgumentError(f"logit_bias names {len(value)} tokens; at most {MAX_LOGIT_BIAS}")
    out = []
    for key, bias in value.items():
        if not (isinstance(key, str) and key.isdigit() and int(key) < vocab_size):
            raise InvalidArgumentError(
                f"logit_bias: {excerpt(key)} is not a token id of this model (0..{vocab_size - 1})"
            )
        if isinstance(bias, bool) or not isinstance(bias, (int, float)) or not -100 <= bias <= 100:
            raise InvalidArgumentError(f"logit_bias[{key}] must be a number within -100..100")
        out.append((int(key), float(bias)))
    return tuple(sorted(out))


def _stops(body: dict[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not (isinstance(stops, list) and all(isinstance(s, str) and s for s in stops)):
        raise InvalidArgumentError("stop must be a non-empty string or a list of them")
    if len(stops) > MAX_STOPS:
        raise InvalidArgumentError(f"stop holds {len(stops)} sequences; at most {MAX_STOPS}")
    return tuple(stops)
