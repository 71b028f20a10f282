"""Tool calls and structured output through ``coordinator serve`` and the real ``openai`` client.

A random-weight Qwen3 pair on disk (``tests.support.models.tool_models``) served
with a chat template that takes tools: a forced call (``required``, a named
function) and ``response_format`` come out valid for their schemas even
from random weights, because the output is constrained by their grammar
(``specwire.logits.grammar``). In process, speculative decoding under a
grammar is lossless: token for token the constrained target's at T = 0, and
distributed as the masked target at T = 1 (chi-square).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Literal

import jsonschema
import mlx.core as mx
import numpy as np
import openai
import pytest
from pydantic import BaseModel, Field
from pydantic_ai import Agent
from pydantic_ai.messages import ToolReturnPart
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from coordinator.decoding.engine import SpeculativeDecoder
from coordinator.drafting.base import DraftSource
from coordinator.drafting.local import LocalDraftSource
from coordinator.drafting.local_tree import LocalTreeDraftSource
from coordinator.drafting.remote_tree import RemoteTreeDraftSource
from specwire.drafting.sampling import SamplingParams, target_distribution
from specwire.logits.grammar import grammar_tokenizer, json_schema_grammar
from specwire.logits.processors import Penalties, Processing
from specwire.models.loading import LoadedModel, load_model
from specwire.v1 import draft_pb2 as pb
from tests.coordinator.decoding.test_rejection_sampling import FREE, P_VALUE_FLOOR, chi_square_p
from tests.support.models.tool_models import TOOLS_TEMPLATE, write_tool_pair
from tests.support.processes.servers import ServerProcess, running_server
from tests.support.session_source import SessionSource

SMALL = {"type": "integer", "minimum": 0, "maximum": 999}  # a random model writes digits forever otherwise
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 16}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {
        "type": "function",
        "function": {
            "name": "add",
            "parameters": {
                "type": "object",
                "properties": {"a": SMALL, "b": SMALL},
                "required": ["a", "b"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {"name": "now", "parameters": {"type": "object", "additionalProperties": False}},
    },
]
SCHEMAS = {
    "nested": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "address": {
                "type": "object",
                "properties": {"street": {"type": "string", "maxLength": 12}, "number": SMALL},
                "required": ["street", "number"],
                "additionalProperties": False,
            },
        },
        "required": ["name", "address"],
        "additionalProperties": False,
    },
    "enum": {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"}},
        "required": ["color", "ok"],
        "additionalProperties": False,
    },
    "array": {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"n": SMALL},
                    "required": ["n"],
                    "additionalProperties": False,
                },
                "minItems": 1,
                "maxItems": 3,
            }
        },
        "required": ["items"],
        "additionalProperties": False,
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
ORIGIN = "http://localhost:3000"  # a browser client's (Open WebUI's) origin, allowed by --cors-origin


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_tool_pair(tmp_path_factory.mktemp("tool-pair"))


@pytest.fixture(scope="module")
def server(pair: tuple[Path, Path]) -> Iterator[ServerProcess]:
    target, draft = pair
    args = ["--target", str(target), "--draft", f"local:{draft}", "--k", "3", "--model-name", "m"]
    template = ["--chat-template", str(TOOLS_TEMPLATE), "--cors-origin", ORIGIN]
    with running_server(*args, *template, "--interface", "127.0.0.1") as s:
        yield s


def ask(server: ServerProcess, **extra: object) -> object:
    options = {"model": "m", "messages": ASK, "max_tokens": 160, "temperature": 0, **extra}
    return server.client().chat.completions.create(**options)  # type: ignore[call-overload]


def check_calls(calls: list, names: tuple[str, ...]) -> None:
    assert calls, "no tool call"
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for call in calls:
        assert call.function.name in names and call.id.startswith("call_") and call.type == "function"
        jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])


@pytest.mark.parametrize("temperature", [0, 1])
def test_a_required_call_parses_and_its_arguments_validate(server: ServerProcess, temperature: float) -> None:
    reply = ask(
        server,
        tools=TOOLS,
        tool_choice="required",
        temperature=temperature,
        seed=1,
        parallel_tool_calls=False,
    )
    choice = reply.choices[0]  # type: ignore[attr-defined]
    assert choice.finish_reason == "tool_calls"
    check_calls(choice.message.tool_calls, ("get_weather", "add", "now"))


def test_a_named_function_is_the_one_called_and_streams_as_delta_tool_calls(server: ServerProcess) -> None:
    named = {"type": "function", "function": {"name": "add"}}
    whole = ask(server, tools=TOOLS, tool_choice=named, parallel_tool_calls=False)
    calls = whole.choices[0].message.tool_calls  # type: ignore[attr-defined]
    check_calls(calls, ("add",))
    assert len(calls) == 1
    chunks = list(ask(server, tools=TOOLS, tool_choice=named, parallel_tool_calls=False, stream=True))  # type: ignore[call-overload]
    streamed = [c for chunk in chunks if chunk.choices for c in chunk.choices[0].delta.tool_calls or []]
    assert [(c.index, c.function.name, c.function.arguments) for c in streamed] == [
        (0, "add", calls[0].function.arguments)
    ]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_a_history_of_calls_and_results_goes_through_the_template(server: ServerProcess) -> None:
    arguments = '{"city": "Paris", "unit": "celsius"}'
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
    history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call]}]
    history.append({"role": "tool", "tool_call_id": "call_1", "content": "18 degrees"})
    reply = ask(server, messages=history, tools=TOOLS, tool_choice="auto", max_tokens=8)
    assert reply.usage.prompt_tokens > 100  # type: ignore[attr-defined]  # the tools and the call are in it
    none = ask(server, tools=TOOLS, tool_choice="none", max_tokens=8).choices[0]  # type: ignore[attr-defined]
    assert none.message.tool_calls is None and isinstance(none.message.content, str)


def test_a_browser_client_allowed_by_cors_origin_may_call_the_api(server: ServerProcess) -> None:
    def preflight(origin: str) -> dict[str, str]:
        headers = {"Origin": origin, "Access-Control-Request-Method": "POST"}
        headers["Access-Control-Request-Headers"] = "authorization,content-type"
        request = urllib.request.Request(server.url + "/chat/completions", method="OPTIONS", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30) as reply:
                return dict(reply.headers)
        except urllib.error.HTTPError as err:  # a preflight from an origin not allowed: 400
            return dict(err.headers)

    allowed = preflight(ORIGIN)
    assert allowed.get("access-control-allow-origin") == ORIGIN
    assert "POST" in allowed.get("access-control-allow-methods", "")
    assert "access-control-allow-origin" not in preflight("http://elsewhere.example")


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_structured_output_validates_at_every_temperature(server: ServerProcess, name: str) -> None:
    schema = SCHEMAS[name]
    response_format = {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}
    prompts = ["Describe a person.", "Pick a color.", "List some numbers.", "Say anything."]
    for temperature in (0, 1):
        for i, prompt in enumerate(prompts):
            messages = [{"role": "user", "content": prompt}]
            reply = ask(
                server, messages=messages, response_format=response_format, temperature=temperature, seed=i
            )
            jsonschema.validate(json.loads(reply.choices[0].message.content), schema)  # type: ignore[attr-defined]
    reply = ask(server, response_format={"type": "json_object"})
    assert isinstance(json.loads(reply.choices[0].message.content), dict)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "x"}}}}, "cannot be"),
        ({"response_format": {"type": "yaml"}}, "response_format type 'yaml' is not supported"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "no"}}}, "not among"),
        ({"tools": [{"type": "retrieval"}]}, "only function tools"),
    ],
)  # fmt: skip
def test_bad_formats_and_tools_are_refused_by_name(server: ServerProcess, extra: dict, words: str) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        ask(server, **extra)
    assert words in refused.value.message


class Weather(BaseModel):
    """The agent's answer (bounded, as a schema for a random model must be)."""

    city: str = Field(max_length=16)
    unit: Literal["celsius", "fahrenheit"]
    degrees: int = Field(ge=-50, le=60)


def weather_agent(model: OpenAIChatModel, seed: int) -> tuple[Agent[None, Weather], list[str]]:
    """An agent with a function tool and a structured answer; the cities its tool was asked about."""
    agent = Agent(model, output_type=Weather, model_settings={"seed": seed, "max_tokens": 400})
    asked: list[str] = []

    @agent.tool_plain
    def temperature(city: Annotated[str, Field(max_length=16)]) -> int:
        """The temperature in a city, in degrees Celsius."""
        asked.append(city)
        return 18

    return agent, asked


def test_an_agent_framework_runs_a_tool_using_task_unmodified(server: ServerProcess) -> None:
    # pydantic-ai as its users run it: a function tool, a structured answer (its final_result tool, which
    # it forces with tool_choice "required"), the tool's results sent back until the answer comes.
    model = OpenAIChatModel("m", provider=OpenAIProvider(base_url=server.url, api_key="unused"))
    for seed in range(8):  # a random model: the first seed whose run calls the function tool
        agent, asked = weather_agent(model, seed)
        result = agent.run_sync("What is the weather in Paris?")
        assert isinstance(result.output, Weather)
        if asked:
            returns = [p for m in result.all_messages() for p in m.parts if isinstance(p, ToolReturnPart)]
            assert [r.content for r in returns if r.tool_name == "temperature"] == [18] * len(asked)
            return
    pytest.fail("in 8 runs the agent never called its function tool")


# In process: lossless under a grammar.


@pytest.fixture(scope="module")
def loaded(pair: tuple[Path, Path]) -> tuple[LoadedModel, LoadedModel]:
    return load_model(str(pair[0])), load_model(str(pair[1]))


def _processing(target: LoadedModel, prompt: list[int], schema: dict) -> Processing:
    lltok = grammar_tokenizer(target.tokenizer, target.vocab_size, sorted(target.eos_token_ids))
    return Processing(Penalties(), prompt, json_schema_grammar(schema, "test", lltok).matcher())


def _drafting(kind: str, draft: LoadedModel) -> DraftSource:
    """A local chain or tree, or a worker's session (in process: ``SessionSource``) drafting a chain with
    pre-speculated branches, or trees."""
    if kind == "local":
        return LocalDraftSource(draft)
    if kind == "local-tree":
        return LocalTreeDraftSource(draft, None, nodes=6, width=3)
    if kind == "worker-chain":
        return SessionSource(draft, pb.PreSpeculation(enabled=True, budget=6, fanout=2))
    prespec = pb.PreSpeculation(enabled=True, fill=True, tree=True, batch=3, fanout=3, budget=4)
    return RemoteTreeDraftSource(SessionSource(draft, prespec, tree_nodes=6), draft, FREE, "ar")


@pytest.mark.parametrize("kind", ["local", "local-tree", "worker-chain", "worker-tree"])
def test_sd_under_a_grammar_equals_the_constrained_target_alone(
    loaded: tuple[LoadedModel, LoadedModel], kind: str
) -> None:
    target, draft = loaded
    prompt = list(target.tokenizer.encode("Describe a person as JSON."))
    schema = SCHEMAS["nested"]
    alone = SpeculativeDecoder(target).generate(
        prompt, max_tokens=40, k=0, params=SamplingParams(), processing=_processing(target, prompt, schema)
    )
    sd = SpeculativeDecoder(target, _drafting(kind, draft)).generate(
        prompt, max_tokens=40, k=3, params=SamplingParams(), processing=_processing(target, prompt, schema)
    )
    assert sd.tokens == alone.tokens and sd.drafted > 0
    jsonschema.validate(json.loads(target.tokenizer.decode(alone.tokens)), schema)


def test_sampled_sd_under_a_grammar_is_distributed_as_the_masked_target(
    loaded: tuple[LoadedModel, LoadedModel],
) -> None:
    target, draft = loaded
    prompt = list(target.tokenizer.encode('Answer: {"color": "'))
    schema = {"enum": ["red", "green", "blue", "black", "gray"]}
    params = SamplingParams(temperature=1.0, draft_top_k=8)

    def p_next(suffix: list[int]) -> np.ndarray:
        logits = np.array(target.model(mx.array([[*prompt, *suffix]]))[0, -1].astype(mx.float32))
        return target_distribution(_processing(target, prompt, schema).row(logits, suffix), params)

    p1 = p_next([])
    support = np.flatnonzero(p1)
    expected = {
        (int(a), int(b)): p1[a] * pb for a in support for b, pb in enumerate(p_next([int(a)])) if pb > 0
    }
    cells = list(expected)
    counts = np.zeros(len(cells))
    decoder = SpeculativeDecoder(target, LocalDraftSource(draft))
    for seed in range(400):
        run = SamplingParams(temperature=1.0, draft_top_k=8, seed=seed)
        tokens = decoder.generate(
            prompt, max_tokens=2, k=2, params=run, processing=_processing(target, prompt, schema)
        ).tokens
        counts[cells.index((tokens[0], tokens[1]))] += 1
    assert chi_square_p(counts, np.array([expected[c] for c in cells])) >= P_VALUE_FLOOR


@pytest.mark.parametrize("kind", ["local", "local-tree", "worker-chain", "worker-tree"])
def test_drafts_follow_the_grammar_too(loaded: tuple[LoadedModel, LoadedModel], kind: str) -> None:
    # The draft is processed as the verdict will be, so no draft is rejected for breaking the grammar:
    # on a worker too (the Open carries the grammar; its session runs here, its code the worker's).
    target, draft = loaded
    prompt = list(target.tokenizer.encode("Describe a person as JSON."))
    schema = SCHEMAS["nested"]
    source = _drafting(kind, draft)
    result = SpeculativeDecoder(target, source).generate(
        prompt, max_tokens=40, k=3, params=SamplingParams(), processing=_processing(target, prompt, schema)
    )
    out: list[int] = []
    for record in result.rounds:
        check = _processing(target, prompt, schema).constraint
        assert check is not None
        check.accept(out)
        block = record.draft
        paths = (
            [block.tree.path(n) for n in range(len(block.tree))] if block.tree else [range(len(block.tokens))]
        )
        for path in paths:
            drafts = [block.tokens[n] for n in path]
            ends = [i for i, t in enumerate(drafts) if t in target.eos_token_ids]
            drafts = drafts[: ends[0] + 1] if ends else drafts  # nothing after the end is ever emitted
            assert all(check.allowed(drafts[:i]) is not None for i in range(len(drafts) + 1)), drafts
        out.extend(record.tokens)
    assert result.drafted > 0
