"""``tiny-hybrid``: a hybrid model in Qwen3.5's layout, for tests and the fast regime (its text is noise).

Qwen3.5 (the paper's pair), Qwen3-Next and other current models mix
linear-attention layers, whose recurrent state cannot be trimmed, with a
full-attention layer every few. This is mlx-lm's own ``qwen3_5`` model at a
tiny size: two layers, a Gated DeltaNet layer, then full attention
(``full_attention_interval`` 2), width 16, with seeded random weights and
the default model's tokenizer and vocabulary, so it pairs with ``tiny`` and
the default model. Like ``tiny``, it speaks only the first ``OUTPUT_TOKENS``
ids of the vocabulary (its output layer covers those), and its Gated DeltaNet
layer runs a long run of positions on a CPU as a scan
(``specwire.models.delta_scan``).

Why two layers, where Qwen3.5 has three Gated DeltaNet layers to each full
attention: every kind of state a pass keeps or rolls back is there with one
of each, and a pass of this model is an emulated Mac's draft pass. On MLX's
CPU backend the cost of a pass this small is set by its operations, about
0.4 ms a layer: four layers made a one-token pass 3.2 ms after a paced hold
(p99 5.9 ms, this project's 2-core machine, pinned), most of the M2 Ultra's
7.1 ms, and its paced rows overran; two make it 1.8 ms (p99 3.3).

``tiny-hybrid-draft`` is ``tiny-hybrid`` with every tensor perturbed (as
``tiny-draft`` is ``tiny``): a hybrid draft model of its own that the hybrid
target accepts often, but not always.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten
from mlx_lm.models import qwen3_5

from specwire.models.delta_scan import forward_scanned, scans
from specwire.models.tiny import OUTPUT_TOKENS, OutputLayer, load_weights

TINY_HYBRID_MODEL = "tiny-hybrid"
TINY_HYBRID_DRAFT_MODEL = "tiny-hybrid-draft"
SEED = 20260324
# Calibrated (scripts/measure/pair_agreement.py --target tiny-hybrid --draft tiny-hybrid-draft) so that at
# k = 4, T = 0 on the built-in prompts it accepts 1.78 drafts a round (2026-11-26): the paper's 1.78, as
# tiny-draft does for tiny (top-1/2/4 agreement 68.8/80.7/90.6%; the four-layer model's 1.74 and
# 69.8/81.8/89.6%).
DRAFT_NOISE = 0.05
DRAFT_SEED = 6
ARGS: dict[str, Any] = {
    "model_type": "qwen3_5",
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 2,
    "full_attention_interval": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 8,
    "linear_num_value_heads": 2,
    "linear_num_key_heads": 1,
    "linear_key_head_dim": 8,
    "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 4,
    "rms_norm_eps": 1e-6,
    "vocab_size": 49152,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": False,
    "rope_parameters": {"type": "default", "rope_theta": 100000.0, "partial_rotary_factor": 0.5},
}


def build_tiny_hybrid(
    vocab_size: int, draft: bool = False, outputs: int = OUTPUT_TOKENS, layers: int = 0
) -> tuple[nn.Module, dict[str, Any]]:
    """``tiny-hybrid`` (or, with ``draft``, ``tiny-hybrid-draft``) for ``vocab_size`` tokens, and its args;
    it speaks the first ``outputs`` ids (``vocab_size``: all of them, as a checkpoint mlx-lm saves).
    ``layers`` (a multiple of 4) builds Qwen3.5's own ratio instead: three Gated DeltaNet layers to each
    full attention.

    Weights as ``tiny``'s: embedding and LM head N(0, 1), other matrices
    N(0, 1/fan_in), norms one; each Gated DeltaNet layer's decay (A_log) from
    log U(1, 16) and its time-step bias one, as the model initialises them.
    """
    args = {**ARGS, "vocab_size": vocab_size}
    if layers:
        args |= {"num_hidden_layers": layers, "full_attention_interval": 4}
    model = qwen3_5.Model(qwen3_5.ModelArgs.from_dict(args))
    if outputs < vocab_size:
        model.language_model.lm_head = OutputLayer(args["hidden_size"], outputs, bias=False)
    for layer in model.language_model.model.layers:
        if layer.is_linear:
            layer.linear_attn.__class__ = ScannedGatedDeltaNet
    rng = np.random.default_rng(SEED)
    weights = []
    params: list[tuple[str, mx.array]] = tree_flatten(model.parameters())  # type: ignore[assignment]
    for name, value in params:
        shape = tuple(value.shape)
        if name.endswith("A_log"):
            array = np.log(rng.uniform(1.0, 16.0, shape)).astype(np.float32)
        elif name.endswith(("norm.weight", "dt_bias")):
            array = np.ones(shape, np.float32)
        elif "embed_tokens" in name or "lm_head" in name:
            array = rng.standard_normal(shape).astype(np.float32)
        else:
            array = (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)
        weights.append((name, array))
    load_weights(model, weights, DRAFT_SEED if draft else None, DRAFT_NOISE)
    return model, args


class ScannedGatedDeltaNet(qwen3_5.GatedDeltaNet):
    """mlx-lm's Gated DeltaNet layer, whose long runs on a CPU take the scan (``specwire.models.delta_scan``:
    a catch-up of 150 tokens cost 10 ms in the per-position loop, more than its paced time)."""

    def __call__(self, inputs: mx.array, mask: mx.array | None = None, cache: Any | None = None) -> mx.array:
        if scans(inputs, mask, cache):
            return forward_scanned(self, inputs, cache)
        return super().__call__(inputs, mask, cache)
