"""Request bodies: what strict parsing refuses, and how errors quote what they received."""

from __future__ import annotations

import re

import pytest

from coordinator.serving.body import MAX_DEPTH, excerpt, parse_json
from specwire.errors import InvalidArgumentError


def test_nesting_up_to_the_limit_is_accepted_and_one_more_level_is_refused() -> None:
    assert parse_json(b"[" * MAX_DEPTH + b"]" * MAX_DEPTH) is not None
    with pytest.raises(InvalidArgumentError, match=f"{MAX_DEPTH + 1} or more levels"):
        parse_json(b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1))


@pytest.mark.parametrize(
    ("data", "where"),
    [
        (b'{"prompt": "ok \\ud83d\\ude00 ok"}', None),  # a surrogate pair is one character: fine
        (b'{"prompt": "\\ud83d"}', "prompt holds a lone"),
        (b'{"stop": ["a", "\\udfff"]}', "stop[1] holds a lone"),
        (b'{"\\udfff": 1}', "a key of body holds a lone"),
        (b'"\\udfff"', "body holds a lone"),
    ],
)
def test_lone_surrogates_are_refused_where_they_are(data: bytes, where: str | None) -> None:
    if where is None:
        assert parse_json(data) == {"prompt": "ok \U0001f600 ok"}
        return
    with pytest.raises(InvalidArgumentError, match=re.escape(where)):
        parse_json(data)


def test_an_excerpt_is_short_and_says_how_long_the_value_was() -> None:
    assert excerpt("gpt-4o") == "'gpt-4o'"
    quoted = excerpt("m" * 60_000_000)
    assert len(quoted) < 80 and quoted.endswith("(60,000,002 characters)")
