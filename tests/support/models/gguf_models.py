"""Builds llama GGUF files from tiny mlx-lm models, laid out as llama.cpp's converter does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

from tests.support.models.gguf_writer import encode_tensor, write_gguf

_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}

TINY_TOKENS = ["<s>", "</s>", "a", "b", "ab", "c", "d", "e"]


def gguf_name(mlx_name: str) -> str:
    """The GGUF tensor name of an mlx-lm parameter name."""
    if mlx_name.startswith("model.layers."):
        _, _, layer, *module, leaf = mlx_name.split(".")
        return f"blk.{layer}.{_NAMES['.'.join(module)]}.{leaf}"
    return {
        "model.embed_tokens.weight": "token_embd.weight",
        "model.norm.weight": "output_norm.weight",
        "lm_head.weight": "output.weight",
    }[mlx_name]


def converter_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's Q/K permutation: rotary halves to interleaved pairs, per head."""
    rows = w.shape[0]
    return w.reshape(n_heads, 2, rows // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama_metadata(args: dict[str, Any], tokens: list[str], arch: str = "llama") -> dict[str, Any]:
    """GGUF metadata for a llama model with a byte-level BPE tokenizer over ``tokens``."""
    return {
        "general.architecture": arch,
        "general.name": "tiny",
        f"{arch}.context_length": int(args["max_position_embeddings"]),
        f"{arch}.embedding_length": int(args["hidden_size"]),
        f"{arch}.block_count": int(args["num_hidden_layers"]),
        f"{arch}.feed_forward_length": int(args["intermediate_size"]),
        f"{arch}.attention.head_count": int(args["num_attention_heads"]),
        f"{arch}.attention.head_count_kv": int(args["num_key_value_heads"]),
        f"{arch}.attention.layer_norm_rms_epsilon": float(args["rms_norm_eps"]),
        f"{arch}.rope.freq_base": 10000.0,
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": ["a b"] if "ab" in tokens else [],
        "tokenizer.ggml.token_type": np.array([3, 3] + [1] * (len(tokens) - 2), dtype=np.int32),
        "tokenizer.ggml.bos_token_id": 0,
        "tokenizer.ggml.eos_token_id": 1,
    }


def _encode(w: np.ndarray, kind: str) -> tuple[bytes, np.ndarray]:
    if kind == "Q4_K":  # declared only, to test the loader's refusal; never decoded
        return b"\0" * 144 * max(1, w.size // 256), w
    return encode_tensor(w, kind)


def write_llama_gguf(
    model: nn.Module,
    args: dict[str, Any],
    path: Path,
    matrix_type: str = "F32",
    tokens: list[str] | None = None,
    arch: str = "llama",
    type_overrides: dict[str, str] | None = None,
) -> dict[str, mx.array]:
    """Write ``model`` to ``path``; returns the weights (mlx-lm names) a reader decodes to."""
    tensors, decoded = {}, {}
    for name, value in tree_flatten(model.parameters()):
        w = np.array(value.astype(mx.float32))
        target = gguf_name(name)
        kind = (type_overrides or {}).get(target, "F32" if w.ndim == 1 else matrix_type)
        stored = w
        if ".attn_q." in target or ".attn_k." in target:
            heads = args["num_attention_heads"] if ".attn_q." in target else args["num_key_value_heads"]
            stored = converter_permute(w, heads)
        data, _ = _encode(stored, kind)
        tensors[target] = (data, w.shape, kind)
        # Block quantization works row by row, so decoding commutes with the row permutation.
        decoded[name] = mx.array(_encode(w, kind)[1])
    metadata = llama_metadata(args, tokens or TINY_TOKENS, arch)
    write_gguf(path, metadata, tensors)
    return decoded
