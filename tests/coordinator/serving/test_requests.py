"""Reading OpenAI request bodies (in process, on the tiny model's real tokenizer)."""

from __future__ import annotations

import pytest

from coordinator.serving.requests import TEXT, read_request
from specwire.errors import InvalidArgumentError
from specwire.models.loading import LoadedModel


@pytest.mark.parametrize(
    ("lengths", "expected"),
    [
        ({}, 16),
        ({"max_tokens": 5}, 5),
        ({"max_completion_tokens": 7, "max_tokens": 5}, 7),
        ({"max_completion_tokens": None, "max_tokens": 5}, 5),  # a null newer name does not hide the older
    ],
)
def test_max_tokens_takes_the_newer_name_first_and_a_null_as_absent(
    tiny: LoadedModel, lengths: dict, expected: int
) -> None:
    request = read_request({"prompt": "Hello", **lengths}, TEXT, "tiny", tiny, 16)
    assert request.max_tokens == expected


def test_max_tokens_below_one_is_refused_by_name(tiny: LoadedModel) -> None:
    with pytest.raises(InvalidArgumentError, match="max_completion_tokens must be >= 1"):
        read_request({"prompt": "Hello", "max_completion_tokens": 0}, TEXT, "tiny", tiny, 16)
