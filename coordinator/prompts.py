"""The built-in prompt set: one code, one math and one text prompt, as in the paper's benchmarks."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from specwire.errors import InvalidArgumentError
from specwire.models.loading import LoadedModel


@dataclass(frozen=True)
class Prompt:
    """One benchmark prompt and its category (code, math or text)."""

    category: str
    text: str


BUILTIN_PROMPTS = (
    Prompt("code", "Write a Python function that checks whether a number is prime, with a docstring."),
    Prompt("math", "What is 17 multiplied by 23? Show your steps."),
    Prompt("text", "Write a short story about a lighthouse keeper who finds a message in a bottle."),
)


def load_prompts(path: Path | None) -> tuple[Prompt, ...]:
    """The built-in set, or prompts from a file.

    The file holds one prompt per line: plain text, or a JSON object with
    ``text`` and optionally ``category``.
    """
    if path is None:
        return BUILTIN_PROMPTS
    try:
        lines = [line for line in path.read_text().splitlines() if line.strip()]
    except OSError as err:
        raise InvalidArgumentError(f"cannot read prompts file {path}: {err.strerror}") from err
    prompts = []
    for n, line in enumerate(lines, 1):
        if line.lstrip().startswith("{"):
            try:
                item = json.loads(line)
                prompts.append(Prompt(str(item.get("category", "text")), str(item["text"])))
            except (json.JSONDecodeError, KeyError, AttributeError) as err:
                raise InvalidArgumentError(f"{path}:{n}: expected a JSON object with a 'text' field") from err
        else:
            prompts.append(Prompt("text", line))
    if not prompts:
        raise InvalidArgumentError(f"{path} holds no prompts")
    return tuple(prompts)


def encode_prompt(model: LoadedModel, text: str, chat: bool) -> list[int]:
    """Token ids of the prompt, through the chat template when asked."""
    tok = model.tokenizer
    if chat:
        if not tok.has_chat_template:
            raise InvalidArgumentError(f"{model.spec} has no chat template; drop --chat")
        return list(tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True))
    ids = list(tok.encode(text))
    if not ids:
        raise InvalidArgumentError("the prompt is empty")
    return ids
