"""A chat request's prompt: its messages, tools and template options, through the model's chat template.

Messages may be ``system``, ``developer`` (as a system message), ``user``,
``assistant`` (its ``content`` may be null beside ``tool_calls``) and
``tool`` (a tool's result, with its ``tool_call_id``). ``chat_template_kwargs``
go to the template as they are (``enable_thinking: false`` turns a Qwen3
model's thinking off); the server's ``--chat-template FILE`` replaces the
model's own template.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coordinator.serving.body import excerpt
from coordinator.serving.tools import ToolChoice, ToolFormat, format_named, history_calls, tool_format
from specwire.errors import InvalidArgumentError, UnsupportedParameterError

ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass(frozen=True)
class ChatTemplate:
    """The chat template a server renders with: the model's own, or ``--chat-template``'s; and the
    tool-call format it implies (None: the template takes no tools that mlx-lm can read back)."""

    source: str | None = None  # Jinja text replacing the model's template; None: the model's
    tools: ToolFormat | None = None
    defaults: dict[str, Any] = field(default_factory=dict)  # template kwargs every request gets

    @classmethod
    def of(cls, tokenizer: Any, path: Path | None = None) -> ChatTemplate:
        """The model's template, or the one in ``path``, with its tool-call format."""
        if path is None:
            return cls(None, tool_format(tokenizer) if tokenizer is not None else None)
        try:
            source = path.read_text()
        except OSError as err:
            raise InvalidArgumentError(f"--chat-template {path}: {err.strerror or err}") from err
        return cls(source, _inferred_format(tokenizer, source))


def _inferred_format(tokenizer: Any, source: str) -> ToolFormat | None:
    """The tool-call format mlx-lm infers from a template's text (its markers)."""
    from mlx_lm.tokenizer_utils import _infer_tool_parser

    class Probe:  # what mlx-lm's inference reads: the template, and the vocabulary as a fallback
        chat_template = source

        @staticmethod
        def get_vocab() -> dict[str, int]:
            hf = getattr(tokenizer, "_tokenizer", tokenizer)
            return dict(hf.get_vocab()) if hf is not None else {}

    name = _infer_tool_parser(Probe())
    return format_named(name) if name else None


def chat_prompt(
    body: dict[str, Any], tokenizer: Any, template: ChatTemplate, tools: ToolChoice | None
) -> list[int]:
    """The prompt's token ids: the messages and tools through the chat template."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidArgumentError("messages must be a non-empty list of {role, content} objects")
    plain = [_message(message, f"messages[{i}]") for i, message in enumerate(messages)]
    if template.source is None and not getattr(tokenizer, "has_chat_template", False):
        raise InvalidArgumentError("this model has no chat template; use /v1/completions or --chat-template")
    kwargs = dict(template.defaults)
    extra = body.get("chat_template_kwargs")
    if extra is not None:
        if not isinstance(extra, dict):
            raise InvalidArgumentError("chat_template_kwargs must be an object")
        kwargs.update(extra)
    if template.source is not None:
        kwargs["chat_template"] = template.source
    if tools is not None:
        kwargs["tools"] = tools.tools
    try:
        return list(tokenizer.apply_chat_template(plain, add_generation_prompt=True, **kwargs))
    except Exception as err:  # a template's own refusal (jinja2's raise_exception) or a bad kwarg
        raise InvalidArgumentError(
            f"the chat template refused the messages: {excerpt(str(err), 200)}"
        ) from err


def _message(message: object, where: str) -> dict[str, Any]:
    if not isinstance(message, dict):
        raise InvalidArgumentError(f"{where} must be an object with role and content")
    role = message.get("role")
    if role not in ROLES:
        raise UnsupportedParameterError(
            f"{where}: role {excerpt(role)} is not supported (use {ROLES})", "messages"
        )
    content = message.get("content")
    out: dict[str, Any] = {"role": "system" if role == "developer" else role}
    if role == "assistant" and message.get("tool_calls"):
        out["tool_calls"] = history_calls(message["tool_calls"], where)
        out["content"] = "" if content is None else _text_of(content, where)
    else:
        out["content"] = _text_of(content, where)
    if role == "tool":
        for name in ("tool_call_id", "name"):
            if isinstance(message.get(name), str):
                out[name] = message[name]
    return out


def _text_of(content: object, where: str) -> str:
    """A message's text: a string, or a list of text parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not (
                isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
            ):
                raise UnsupportedParameterError(f"{where}: only text content parts are supported", "messages")
            parts.append(part["text"])
        return "".join(parts)
    raise InvalidArgumentError(f"{where}: content must be a string or a list of text parts")
