"""The gated delta rule as a scan (``specwire.models.delta_scan``): the loop's result, for long runs only."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models import qwen3_5
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.models.gated_delta import gated_delta_ops

from specwire.emulation.pace import ROUND_POSITIONS
from specwire.models.delta_scan import MIN_POSITIONS, scan_delta_rule
from specwire.models.loading import load_model


@pytest.mark.parametrize("length", [MIN_POSITIONS, 64, 65, 167])
def test_the_scan_is_the_loop_within_float32_rounding(length: int) -> None:
    keys = iter(mx.random.split(mx.random.key(length), 7))
    shape = (2, length, 3)
    k = mx.random.normal((*shape, 8), key=next(keys))
    k = k / mx.linalg.norm(k, axis=-1, keepdims=True)  # normalize_qk's keys
    q, v = mx.random.normal((*shape, 8), key=next(keys)), mx.random.normal((*shape, 4), key=next(keys))
    g = mx.random.uniform(0.3, 1.0, shape, key=next(keys))
    beta = mx.random.uniform(0.0, 1.0, shape, key=next(keys))
    state = mx.random.normal((2, 3, 4, 8), key=next(keys))
    y, after = scan_delta_rule(q, k, v, g, beta, state)
    want_y, want_after = gated_delta_ops(q, k, v, g, beta, state)
    assert y.shape == want_y.shape and after.shape == want_after.shape
    assert mx.allclose(y, want_y, atol=1e-5).item() and mx.allclose(after, want_after, atol=1e-5).item()


def test_only_runs_longer_than_any_round_take_the_scan() -> None:
    assert MIN_POSITIONS > ROUND_POSITIONS
    model = load_model("tiny-hybrid").model
    layer = model.language_model.model.layers[0].linear_attn
    scanned = type(layer)

    def logits_and_state(tokens: list[int], cls: type) -> tuple[mx.array, mx.array]:
        layer.__class__ = cls
        cache = make_prompt_cache(model)
        return model(mx.array([tokens]), cache=cache), cache[0][1]

    try:  # mlx-lm's own layer, without the scan, for comparison
        short = list(range(100, 100 + ROUND_POSITIONS))
        a, b = logits_and_state(short, scanned), logits_and_state(short, qwen3_5.GatedDeltaNet)
        assert (
            mx.array_equal(a[0], b[0]).item() and mx.array_equal(a[1], b[1]).item()
        )  # the loop, bit for bit
        long = list(range(100, 260))
        a, b = logits_and_state(long, scanned), logits_and_state(long, qwen3_5.GatedDeltaNet)
        if mx.default_device() == mx.cpu:  # the scan ran (a GPU takes mlx-lm's own path): it rounds apart
            assert not mx.array_equal(a[1], b[1]).item()
        assert mx.allclose(a[0], b[0], atol=1e-4).item() and mx.allclose(a[1], b[1], atol=1e-5).item()
    finally:
        layer.__class__ = scanned
