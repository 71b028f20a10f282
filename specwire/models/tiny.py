"""``tiny``: a model for measuring protocol and orchestration cost, whose text is meaningless.

On the machines this project is for, a draft forward pass takes about 10 ms
and a verification 20–30 ms, so a millisecond of protocol per round decides
the result. The default 135M model takes about 140 ms a pass on a CPU, which
hides any protocol cost. ``tiny`` makes compute small enough that it cannot.

It is a llama-architecture model (mlx-lm's ``llama.Model``) of two blocks and
width 8, with random weights drawn from a fixed seed by NumPy's PCG64
generator, so every process on every machine builds the same weights: a
coordinator's ``--target tiny`` and a worker's ``--model tiny`` agree
exactly, and acceptance at T = 0 is 100%. Its tokenizer and vocabulary are
the default model's (read from the bundled GGUF file's metadata, no weights),
so token ids, chat templates and the vocabulary fingerprint are real.

It reads every token of the vocabulary but speaks only the first
``OUTPUT_TOKENS`` (2,048) of them: its output layer, and so its logits, cover
those ids, as if every later token's logit were minus infinity. Why this
shape rather than a slice of the real model: the cost of a pass on MLX's CPU
backend is set by the output layer and the work on each row of logits, and by
per-operation dispatch, not by depth. The real model's width of 576 makes its
output layer alone about 12 ms here. Width 8 over the whole 49,152-token
vocabulary made a pass about 1.5 ms, but 0.13 ms more for every row of a
batched pass (a 64-row tree pass overran the M1 Max's 20.8 ms on this 2-core
machine); over 2,048 tokens a row costs a twentieth of that
(docs/measurements.md, "Making the emulation cheap enough").
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.models import llama

TINY_MODEL = "tiny"
OUTPUT_TOKENS = 2048  # the ids an emulation model speaks (it reads them all): the first of the vocabulary
TINY_DRAFT_MODEL = "tiny-draft"
SEED = 20260323  # the paper's month; any fixed value gives every process the same weights
# tiny-draft: tiny's weights, each tensor perturbed by Gaussian noise of DRAFT_NOISE times its own
# spread, drawn from DRAFT_SEED. Calibrated (scripts/measure/pair_agreement.py) so that at k = 4, T = 0 on
# the built-in prompts it accepts 1.65 drafts a round in 64 tokens, 1.80 in 128 (2026-11-26, its output
# over 2,048 ids): the paper's 1.78 (Table 7) within 10%.
DRAFT_NOISE = 0.07
DRAFT_SEED = 4
# tiny-draft-specinfer: tiny-draft with its first choice kept (so the same drafts are accepted) and
# every other token's logit moved by CHOICES_NOISE times a fixed N(0, 1) draw per token
# (CHOICES_SEED), so the target's token is less often among its second to fourth choices: calibrated
# (scripts/measure/pair_agreement.py) to SpecInfer's LLaMA-68M/7B top-2 and top-4 agreement
# (docs/measurements.md, "The emulation's pair").
TINY_SPECINFER_DRAFT_MODEL = "tiny-draft-specinfer"
CHOICES_NOISE = 0.9
CHOICES_SEED = 68
ARGS: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 8,
    "num_hidden_layers": 2,
    "intermediate_size": 16,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 4,
    "rms_norm_eps": 1e-5,
    "vocab_size": 49152,
    "rope_theta": 100000.0,
    "max_position_embeddings": 16384,  # an agent's 10,000-token prefix and turns (scripts/agent_session.py)
    "tie_word_embeddings": False,
    "attention_bias": False,
}


def build_tiny(vocab_size: int, draft: bool = False) -> tuple[nn.Module, dict[str, Any]]:
    """The ``tiny`` model (or with ``draft``, ``tiny-draft``) for ``vocab_size`` tokens, and its args.

    Weights: the embedding and the (untied) output layer N(0, 1), so the
    logits spread widely (the top two of a row lie far apart, and batched and
    single-token passes pick the same argmax); other linear layers
    N(0, 1/fan_in); norms one. Tied embeddings would make every token its
    own most likely successor, and greedy text one token repeated.

    ``tiny-draft`` is a model of its own: every tensor of ``tiny`` plus noise
    (``DRAFT_NOISE``, ``DRAFT_SEED``), so it agrees with ``tiny``'s next
    token about as often as a real draft model agrees with its target, and
    verification rejects its drafts for real.
    """
    args = {**ARGS, "vocab_size": vocab_size}
    model = llama.Model(llama.ModelArgs.from_dict(args))
    model.lm_head = OutputLayer(args["hidden_size"], min(OUTPUT_TOKENS, vocab_size), bias=False)
    rng = np.random.default_rng(SEED)
    params: list[tuple[str, mx.array]] = tree_flatten(model.parameters())  # type: ignore[assignment]
    weights = []
    for name, value in params:
        shape = tuple(value.shape)
        if name.endswith("norm.weight"):
            array = np.ones(shape, np.float32)
        elif "embed_tokens" in name or "lm_head" in name:
            array = rng.standard_normal(shape, np.float32)
        else:
            array = rng.standard_normal(shape, np.float32) / np.float32(np.sqrt(shape[-1]))
        weights.append((name, array))
    load_weights(model, weights, DRAFT_SEED if draft else None)
    return model, args


class OutputLayer(nn.Linear):
    """``nn.Linear`` (same weight, same result) that multiplies by a contiguous copy of the transposed
    weight, made once per weight. MLX's CPU backend multiplies by the transposed view (what
    ``nn.Linear`` does) about 1.8 times slower (over 49,152 tokens, 0.24 against 0.13 ms a row here).
    Its rows are the ids the model speaks (``OUTPUT_TOKENS``)."""

    def __call__(self, x: mx.array) -> mx.array:
        weight = self["weight"]
        held = self.get("_by_column")
        if held is None or held[0] is not weight:
            held = (weight, mx.contiguous(weight.T))
            self["_by_column"] = held
        return x @ held[1]


def build_tiny_specinfer(vocab_size: int, draft: bool = True) -> tuple[nn.Module, dict[str, Any]]:
    """``tiny-draft-specinfer``: ``tiny-draft`` whose choices after the first are shuffled by a fixed
    noise per token (``CHOICES_NOISE``), its first choice and that choice's lead over the next kept."""
    model, args = build_tiny(vocab_size, draft=True)
    outputs = model.lm_head.weight.shape[0]
    head = ChoicesNoiseOutputLayer(args["hidden_size"], outputs, bias=False)
    head.weight = model.lm_head.weight
    head.noise = mx.array(np.random.default_rng(CHOICES_SEED).standard_normal(outputs, np.float32))
    head.noise = head.noise * CHOICES_NOISE
    model.lm_head = head
    mx.eval(model.parameters())
    return model, args


class ChoicesNoiseOutputLayer(OutputLayer):
    """An output layer whose logits, but the largest, move by a fixed vector (``noise``); the largest
    stays the largest, as far ahead of the others as it was."""

    noise: mx.array

    def __call__(self, x: mx.array) -> mx.array:
        logits = super().__call__(x)
        first = mx.argmax(logits, axis=-1, keepdims=True)
        others = mx.put_along_axis(logits, first, mx.array(-mx.inf), axis=-1)
        lead = mx.take_along_axis(logits, first, axis=-1) - mx.max(others, axis=-1, keepdims=True)
        moved = others + self.noise
        return mx.put_along_axis(moved, first, mx.max(moved, axis=-1, keepdims=True) + lead, axis=-1)


def load_weights(
    model: nn.Module,
    weights: list[tuple[str, np.ndarray]],
    draft_seed: int | None,
    noise: float = DRAFT_NOISE,
) -> None:
    """Put ``weights`` in ``model``; with ``draft_seed``, each tensor first perturbed by Gaussian noise
    of ``noise`` times its own spread (a draft model of its own, drawn from that seed)."""
    if draft_seed is not None:
        rng = np.random.default_rng(draft_seed)
        weights = [
            (name, a + noise * a.std() * rng.standard_normal(a.shape).astype(np.float32))
            for name, a in weights
        ]
    model.update(tree_unflatten([(name, mx.array(a)) for name, a in weights]))
    mx.eval(model.parameters())
