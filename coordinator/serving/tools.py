"""Tool calls, OpenAI-shaped: the tools a request offers, how the model writes a call, and reading calls back.

The model's chat template renders the tools and the history (``tool``
messages, assistant ``tool_calls``); the model writes a call in its own
format, between the start and end markers its tokenizer names, and mlx-lm's
parser for that format reads it (``mlx_lm.tool_parsers``: the tokenizer of
an mlx-lm model directory knows its parser; a template given with
``--chat-template`` is matched as mlx-lm matches it).

``tool_choice``:

* ``auto`` (the default with tools): calls the model writes are returned as
  ``tool_calls``, with ``finish_reason: "tool_calls"``;
* ``none``: the model sees the tools, and its text is returned as text;
* ``required`` or a named function: the output is constrained to calls
  (``forced_grammar``), each one's arguments valid JSON for its function's
  parameters, even from a weak model. The constraint is written for the
  JSON-in-tags format (``<tool_call>{"name": ..., "arguments": ...}</tool_call>``,
  mlx-lm's ``json_tools``: Qwen 2.5/3, Hermes and their kin); other formats
  take ``auto`` and ``none`` only.
"""

from __future__ import annotations

import importlib
import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from coordinator.serving.body import excerpt
from coordinator.serving.stops import partial_tail
from specwire.errors import InvalidArgumentError, UnsupportedParameterError
from specwire.logits.grammar import JSON_LAYOUT, GrammarSpec, lark_grammar

FORCEABLE = "json_tools"  # the format forced_grammar writes


@dataclass(frozen=True)
class ToolFormat:
    """How a model writes a tool call: between ``start`` and ``end``, read by ``parse``."""

    name: str  # mlx-lm's parser module
    start: str
    end: str
    parse: Callable[..., Any]


def tool_format(tokenizer: Any) -> ToolFormat | None:
    """The model's tool-call format (None: its template does not take tools, as far as mlx-lm can tell)."""
    parser = getattr(tokenizer, "tool_parser", None)
    start, end = getattr(tokenizer, "tool_call_start", None), getattr(tokenizer, "tool_call_end", None)
    if parser is not None and start and end:
        name = getattr(parser, "__module__", "").rsplit(".", 1)[-1]
        return ToolFormat(name, start, end, parser)
    return None


def format_named(name: str) -> ToolFormat:
    """mlx-lm's tool-call format ``name`` (a module of ``mlx_lm.tool_parsers``)."""
    module = importlib.import_module(f"mlx_lm.tool_parsers.{name}")
    return ToolFormat(name, module.tool_call_start, module.tool_call_end, module.parse_tool_call)


@dataclass(frozen=True)
class ToolChoice:
    """A request's tools and what it asks of them: ``mode`` auto, none or required (a named function:
    required, with ``names`` that one)."""

    tools: list[dict[str, Any]]
    mode: str
    names: tuple[str, ...]
    parallel: bool

    @property
    def functions(self) -> list[dict[str, Any]]:
        """The tools' function objects, as chat templates take them."""
        return [tool["function"] for tool in self.tools]


def read_tools(body: dict[str, Any]) -> ToolChoice | None:
    """The request's ``tools``, ``tool_choice`` and ``parallel_tool_calls``, checked; None without tools."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if not tools:
        if choice not in (None, "none", "auto"):
            raise InvalidArgumentError("tool_choice names a tool, but the request offers no tools")
        return None
    if not isinstance(tools, list):
        raise InvalidArgumentError("tools must be a list of {type: function, function: {...}} objects")
    names = []
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not (isinstance(tool, dict) and tool.get("type") == "function" and isinstance(function, dict)):
            raise UnsupportedParameterError(f"tools[{i}]: only function tools are supported", "tools")
        name = function.get("name")
        if not (isinstance(name, str) and name):
            raise InvalidArgumentError(f"tools[{i}].function.name must be a non-empty string")
        parameters = function.get("parameters", {"type": "object"})
        if not isinstance(parameters, dict):
            raise InvalidArgumentError(f"tools[{i}].function.parameters must be a JSON schema object")
        names.append(name)
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise InvalidArgumentError("parallel_tool_calls must be a bool")
    mode, chosen = _choice(choice, names)
    return ToolChoice(tools, mode, chosen, parallel)


def _choice(choice: object, names: list[str]) -> tuple[str, tuple[str, ...]]:
    if choice is None or choice in ("auto", "none", "required"):
        return str(choice or "auto"), tuple(names)
    if isinstance(choice, dict) and choice.get("type") == "function":
        name = (choice.get("function") or {}).get("name")
        if name not in names:
            raise InvalidArgumentError(f"tool_choice names {excerpt(name)}, which is not among the tools")
        return "required", (str(name),)
    if isinstance(choice, dict) and choice.get("type") == "allowed_tools":
        allowed = choice.get("allowed_tools") or {}
        listed = [t.get("function", {}).get("name") for t in allowed.get("tools", []) if isinstance(t, dict)]
        unknown = [n for n in listed if n not in names]
        if unknown or not listed:
            raise InvalidArgumentError(
                f"tool_choice allows {excerpt(unknown or listed)}, not among the tools"
            )
        mode = allowed.get("mode", "auto")
        if mode not in ("auto", "required"):
            raise InvalidArgumentError(
                f"tool_choice.allowed_tools.mode must be auto or required, got {mode!r}"
            )
        return str(mode), tuple(str(n) for n in listed)
    raise InvalidArgumentError(f"tool_choice {excerpt(choice)} is not auto, none, required or a function")


def forced_grammar(choice: ToolChoice, fmt: ToolFormat | None, lltokenizer: Any) -> GrammarSpec | None:
    """The grammar of a forced call (``required`` or a named function): one call, or with
    ``parallel_tool_calls`` one or more, each ``{"name", "arguments"}`` valid for its function. None
    unless forced; ``UnsupportedParameterError`` for a model whose format it is not written for."""
    if choice.mode != "required":
        return None
    if fmt is None or fmt.name != FORCEABLE:
        written = fmt.name if fmt else "none that mlx-lm recognizes"
        raise UnsupportedParameterError(
            f"tool_choice {choice.mode!r} is enforced for models that write calls as JSON in "
            f"<tool_call> tags (mlx-lm's {FORCEABLE}); this model's format is {written}",
            "tool_choice",
        )
    calls = []
    for function in choice.functions:
        if function["name"] in choice.names:
            parameters = function.get("parameters") or {"type": "object"}
            calls.append(
                {
                    "type": "object",
                    "properties": {"name": {"const": function["name"]}, "arguments": parameters},
                    "required": ["name", "arguments"],
                    "additionalProperties": False,
                }
            )
    call = {**(calls[0] if len(calls) == 1 else {"anyOf": calls}), "x-guidance": JSON_LAYOUT}
    block = f'{json.dumps(fmt.start)} "\\n" call "\\n" {json.dumps(fmt.end)}'
    more = ' ("\\n" block)*' if choice.parallel else ""
    lark = f"start: block{more}\nblock: {block}\ncall: %json {json.dumps(call)}\n"
    return lark_grammar(lark, "tool_choice", lltokenizer)


def history_calls(calls: object, where: str) -> list[dict[str, Any]]:
    """An assistant message's ``tool_calls`` as chat templates take them (arguments as objects)."""
    if not isinstance(calls, list):
        raise InvalidArgumentError(f"{where}.tool_calls must be a list")
    out = []
    for i, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not (isinstance(function, dict) and isinstance(function.get("name"), str)):
            raise InvalidArgumentError(f"{where}.tool_calls[{i}] must hold function.name and arguments")
        arguments = function.get("arguments", "{}")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError as err:
                raise InvalidArgumentError(f"{where}.tool_calls[{i}].function.arguments is not JSON") from err
        out.append({**call, "function": {"name": function["name"], "arguments": arguments}})
    return out


def openai_call(parsed: dict[str, Any], index: int | None = None) -> dict[str, Any]:
    """One parsed call (``{"name", "arguments"}``) as OpenAI returns it; with ``index`` when streamed."""
    arguments = parsed.get("arguments", {})
    call: dict[str, Any] = {
        "id": f"call_{secrets.token_hex(12)}",
        "type": "function",
        "function": {
            "name": str(parsed.get("name", "")),
            "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
        },
    }
    return call if index is None else {"index": index, **call}


class CallSplitter:
    """Splits a model's output, as it streams, into text and the tool calls it writes (``ToolFormat``).

    Text from a call's start marker is held until its end marker arrives; the
    call is then parsed. What cannot be parsed, or a call never closed, is
    returned as text.
    """

    def __init__(self, fmt: ToolFormat, tools: list[dict[str, Any]]) -> None:
        self.fmt = fmt
        self.tools = tools
        self.calls: list[dict[str, Any]] = []
        self._held = ""

    def feed(self, piece: str) -> tuple[str, list[dict[str, Any]]]:
        """The text ``piece`` releases and the calls it completes (each ``{"name", "arguments"}``)."""
        self._held += piece
        text, calls = [], []
        start, end = self.fmt.start, self.fmt.end
        while True:
            at = self._held.find(start)
            if at < 0:
                keep = partial_tail(self._held, (start,))  # a marker may be arriving
                text.append(self._held[: len(self._held) - keep])
                self._held = self._held[len(self._held) - keep :]
                break
            text.append(self._held[:at])
            close = self._held.find(end, at + len(start))
            if close < 0:
                self._held = self._held[at:]
                break
            found = self._parse(self._held[at + len(start) : close])
            if found is None:
                text.append(self._held[: close + len(end)][at:])
            calls.extend(found or [])
            self._held = self._held[close + len(end) :]
        self.calls.extend(calls)
        return "".join(text), calls

    def finish(self) -> str:
        """What is still held at the end, as text."""
        held, self._held = self._held, ""
        return held

    def _parse(self, inner: str) -> list[dict[str, Any]] | None:
        try:
            parsed = self.fmt.parse(inner, self.tools)
        except Exception:  # the model wrote no valid call: its text is returned as written
            return None
        found = parsed if isinstance(parsed, list) else [parsed]
        return [c for c in found if isinstance(c, dict)] or None
