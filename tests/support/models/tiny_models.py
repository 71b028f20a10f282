"""Tiny random-weight models (llama, and hybrids in Qwen3.5's layout), for fast unit and statistical tests."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import llama

from specwire.models.loading import LoadedModel
from specwire.models.tiny_hybrid import build_tiny_hybrid

TINY_ARGS = {
    "model_type": "llama",
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "intermediate_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-5,
    "vocab_size": 8,
    "max_position_embeddings": 256,
    "tie_word_embeddings": True,
}


def tiny_llama(seed: int, **overrides: object) -> tuple[nn.Module, dict]:
    """A llama model with random weights drawn from ``seed``; returns (model, args)."""
    args = {**TINY_ARGS, **overrides}
    mx.random.seed(seed)
    model = llama.Model(llama.ModelArgs.from_dict(args))
    mx.eval(model.parameters())
    return model, args


def as_loaded(model: nn.Module, args: dict, name: str, eos: frozenset[int] = frozenset()) -> LoadedModel:
    """Wrap a tokenizer-less tiny model the way ``load_model`` wraps real ones."""
    return LoadedModel(
        model=model,
        tokenizer=None,
        args=args,
        spec=name,
        path=name,
        fingerprint="tiny",
        precision="float32",
        eos_token_ids=eos,
    )


def sampling_pair() -> tuple[LoadedModel, LoadedModel]:
    """The statistical tests' target and draft: one layer each, since a sample's cost is its passes'
    dispatch (about 1 ms a layer on this CPU), from seeds whose distributions are as spread as the
    two-layer models' (the target's likeliest token after [2, 5, 1]: 0.74 at T = 1)."""
    target, args = tiny_llama(8, num_hidden_layers=1)
    draft, _ = tiny_llama(7, num_hidden_layers=1)
    return as_loaded(target, args, "tiny-target"), as_loaded(draft, args, "tiny-draft")


def disagreeing_pair() -> tuple[LoadedModel, LoadedModel]:
    """A tiny target and a tiny draft that often disagree.

    After the prompt [2, 5, 1] the draft's next-token distribution differs
    from the target's by 0.68 in total variation at T = 1, and greedy drafts
    are rejected after every number of accepted tokens, so every rejection
    path of the engine and of pre-speculation is taken within a few runs.
    """
    target, args = tiny_llama(0)
    draft, _ = tiny_llama(3)
    return as_loaded(target, args, "tiny-target"), as_loaded(draft, args, "tiny-draft")


def hybrid_pair() -> tuple[LoadedModel, LoadedModel]:
    """``tiny-hybrid`` and its perturbed draft over a vocabulary of 8 (Gated DeltaNet layers: no trim)."""
    target, args = build_tiny_hybrid(8)
    draft, _ = build_tiny_hybrid(8, draft=True)
    return as_loaded(target, args, "hybrid-target"), as_loaded(draft, args, "hybrid-draft")
