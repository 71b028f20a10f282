"""Splitting streamed output into reasoning, text and tool calls, whatever the pieces' boundaries."""

from __future__ import annotations

import pytest

from coordinator.serving.reasoning import ReasoningSplitter, ThinkMarkers, opens_thinking
from coordinator.serving.tools import CallSplitter, format_named

THINK = ThinkMarkers("<think>", "</think>")
OUTPUT = 'Let me see.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\nDone <tool'


def pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


@pytest.mark.parametrize("size", [1, 3, 7, 1000])
def test_calls_are_read_whole_across_any_split(size: int) -> None:
    splitter = CallSplitter(format_named("json_tools"), [])
    text, calls = "", []
    for piece in pieces(OUTPUT, size):
        out, found = splitter.feed(piece)
        text += out
        calls += found
    text += splitter.finish()
    assert calls == [{"name": "add", "arguments": {"a": 1, "b": 2}}]
    assert text == "Let me see.\n\nDone <tool"  # an unclosed marker at the end is text


def test_a_call_that_does_not_parse_stays_text() -> None:
    splitter = CallSplitter(format_named("json_tools"), [])
    text, calls = splitter.feed("<tool_call>not json</tool_call>")
    assert calls == [] and text == "<tool_call>not json</tool_call>"


@pytest.mark.parametrize("size", [1, 4, 1000])
@pytest.mark.parametrize("opened", [False, True])
def test_reasoning_is_split_off_across_any_split(size: int, opened: bool) -> None:
    output = ("" if opened else "\n<think>") + "I should add.\n</think>\n\nThe sum is 3."
    splitter = ReasoningSplitter(THINK, thinking=opened)
    reasoning, content = "", ""
    for piece in pieces(output, size):
        r, c = splitter.feed(piece)
        reasoning, content = reasoning + r, content + c
    r, c = splitter.finish()
    assert (reasoning + r, content + c) == ("I should add.\n", "The sum is 3.")


def test_thinking_opens_only_before_the_answer() -> None:
    splitter = ReasoningSplitter(THINK, thinking=False)
    assert splitter.feed("Answer: <think> is a tag") == ("", "Answer: <think> is a tag")
    assert opens_thinking("<|im_start|>assistant\n<think>\n", THINK)
    assert not opens_thinking("<think>\n\n</think>\n\n", THINK)
