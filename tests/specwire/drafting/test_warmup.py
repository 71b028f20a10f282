"""The warm-up runs the shapes a round uses: every verify size, and both kinds of draft feed."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import pytest

from specwire.drafting.warmup import target_sizes, warm_drafter, warm_target
from specwire.models.loading import LoadedModel


class Recording:
    """A model that records how many positions each call feeds, and runs the real one."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.fed: list[int] = []

    def __call__(self, inputs: mx.array, cache: Any = None) -> mx.array:
        self.fed.append(int(inputs.shape[1]))
        return self.model(inputs, cache=cache)

    @property
    def layers(self) -> Any:  # mlx-lm's make_prompt_cache reads the layers
        return self.model.layers


@pytest.mark.parametrize("k", [1, 4, 8])
def test_the_target_is_run_at_every_size_a_round_verifies(tiny: LoadedModel, k: int) -> None:
    model = Recording(tiny.model)
    warm_target(model, k)
    assert model.fed[1:] == target_sizes(k)  # after the one-token prefill
    assert 1 in model.fed[1:] and k + 1 in model.fed[1:]
    if mx.default_device() == mx.gpu:
        assert target_sizes(k) == list(range(1, k + 2))


def test_a_drafter_feeds_one_token_and_two(tiny: LoadedModel) -> None:
    model = Recording(tiny.model)
    warm_drafter(model, sampled=True)
    assert {1, 2} <= set(model.fed)
