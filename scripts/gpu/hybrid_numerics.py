#!/usr/bin/env python3
"""Hybrid models' numerics on this backend, beside a llama model's: how passes round, and where from.

For ``tiny`` (llama) and ``tiny-hybrid`` (Qwen3.5's layout), over AR's own
tokens after a prompt:

* **batched vs single**: the largest logit difference between one pass over
  the last k + 1 positions (as verification runs them) and one position per
  pass (as AR does), and the smallest top-2 gap AR meets there;
* **device vs CPU**: one pass computed on this device and on the CPU;
* for the hybrid, the same two comparisons for its Gated DeltaNet layer's
  own steps: the depthwise convolution over kept rows and new positions, and
  the delta rule.

Zero everywhere on the CPU. Prints one JSON object.

    scripts/gpu/check.sh -- python3 scripts/gpu/hybrid_numerics.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.models.gated_delta import gated_delta_update

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from coordinator.decoding.engine import SpeculativeDecoder
from specwire.drafting.sampling import SamplingParams
from specwire.models.loading import LoadedModel, load_model

K = 4
PROMPT = "Once upon a time, a lighthouse keeper"


def passes(model: LoadedModel, tokens: list[int]) -> dict:
    """Batched vs single rows over every window of k + 1 of ``tokens``'s last 20, and top-2 gaps."""
    single, rows, gaps = make_prompt_cache(model.model), [], []
    for t in tokens:
        row = model.model(mx.array([[t]]), cache=single)[0, -1].astype(mx.float32)
        rows.append(np.array(row))
        top = np.sort(rows[-1])[-2:]
        gaps.append(float(top[1] - top[0]))
    worst = 0.0
    for end in range(len(tokens) - 20 + K + 1, len(tokens) + 1, K + 1):
        cache = make_prompt_cache(model.model)
        for t in tokens[: end - K - 1]:
            model.model(mx.array([[t]]), cache=cache)
        batched = np.array(
            model.model(mx.array([tokens[end - K - 1 : end]]), cache=cache)[0].astype(mx.float32)
        )
        worst = max(worst, float(np.abs(batched - np.stack(rows[end - K - 1 : end])).max()))
    whole = model.model(mx.array([tokens]))[0].astype(mx.float32)
    with mx.stream(mx.cpu):
        on_cpu = model.model(mx.array([tokens]))[0].astype(mx.float32)
    return {
        "batched_vs_single": worst,
        "device_vs_cpu": float(mx.abs(whole - on_cpu).max().item()),
        "min_top2_gap": min(gaps[-20:]),
        "logit_scale": float(np.abs(np.stack(rows)).max()),
    }


def gated_delta_steps(model: LoadedModel) -> dict:
    """The first Gated DeltaNet layer's convolution and delta rule: batched vs single, device vs CPU."""
    module = model.model.language_model.model.layers[0].linear_attn
    rng = np.random.default_rng(0)
    x = mx.array(rng.standard_normal((1, 3 + K + 1, module.conv_dim)).astype(np.float32))
    conv = module.conv1d(x)
    singles = mx.concatenate([module.conv1d(x[:, i : i + 4]) for i in range(K + 1)], axis=1)
    with mx.stream(mx.cpu):
        conv_cpu = module.conv1d(x)
    h, d = module.num_v_heads, module.head_k_dim
    q, k = (
        mx.array(rng.standard_normal((1, K + 1, module.num_k_heads, d)).astype(np.float32)) for _ in range(2)
    )
    v = mx.array(rng.standard_normal((1, K + 1, h, module.head_v_dim)).astype(np.float32))
    a, b = (mx.array(rng.standard_normal((1, K + 1, h)).astype(np.float32)) for _ in range(2))
    args = (module.A_log, module.dt_bias)
    out, _ = gated_delta_update(q, k, v, a, b, *args)
    state, steps = None, []
    for t in range(K + 1):
        step, state = gated_delta_update(
            q[:, t : t + 1], k[:, t : t + 1], v[:, t : t + 1], a[:, t : t + 1], b[:, t : t + 1], *args, state
        )
        steps.append(step)
    with mx.stream(mx.cpu):
        out_cpu, _ = gated_delta_update(q, k, v, a, b, *args)
    return {
        "conv_batched_vs_single": float(mx.abs(conv - singles).max().item()),
        "conv_device_vs_cpu": float(mx.abs(conv - conv_cpu).max().item()),
        "delta_batched_vs_single": float(mx.abs(out - mx.concatenate(steps, axis=1)).max().item()),
        "delta_device_vs_cpu": float(mx.abs(out - out_cpu).max().item()),
    }


def main() -> None:
    out: dict = {"device": str(mx.default_device())}
    for spec in ("tiny", "tiny-hybrid"):
        model = load_model(spec)
        prompt = model.tokenizer.encode(PROMPT)
        ar = SpeculativeDecoder(model).generate(prompt, max_tokens=24, k=0, params=SamplingParams()).tokens
        out[spec] = passes(model, prompt + ar)
        if spec == "tiny-hybrid":
            out[spec]["gated_delta_net"] = gated_delta_steps(model)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
