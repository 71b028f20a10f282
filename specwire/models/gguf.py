"""Loads a llama-architecture GGUF file into mlx-lm's ``llama.Model``.

MLX's own GGUF reader (``mx.load``) decodes the tensors: Q4_0, Q4_1 and Q8_0
arrive as MLX quantized triples (packed weight, scales, biases; group size 32)
and stay quantized; F16 and F32 arrive as they are. This module checks the
tensor table first, maps GGUF names to mlx-lm names, undoes the Q/K row
permutation that llama.cpp's converter applies, and quantizes exactly the
modules whose tensors were stored quantized, each at its own bit width.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models import llama

from specwire.errors import ModelFormatError, UnsupportedModelError
from specwire.models.gguf_header import read_tensor_table

SUPPORTED_ARCHITECTURES = ("llama",)
SUPPORTED_TENSOR_TYPES = ("F32", "F16", "Q4_0", "Q4_1", "Q8_0")
GROUP_SIZE = 32

_BLOCK_TENSORS = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_TOP_TENSORS = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}


def _scalar(metadata: dict[str, Any], key: str, default: Any = None) -> Any:
    value = metadata.get(key, default)
    return value.item() if isinstance(value, mx.array) else value


def check_tensor_types(path: Path) -> None:
    """Raise ``UnsupportedModelError`` naming the first tensor whose type MLX cannot load."""
    for info in read_tensor_table(path):
        if info.type_name not in SUPPORTED_TENSOR_TYPES:
            raise UnsupportedModelError(
                f"{path}: tensor {info.name!r} has type {info.type_name}, which specwire "
                f"cannot load; supported tensor types: {', '.join(SUPPORTED_TENSOR_TYPES)}"
            )


def model_args(metadata: dict[str, Any], weights: dict[str, mx.array], path: Path) -> dict[str, Any]:
    """Translate GGUF llama metadata into mlx-lm ``ModelArgs`` fields."""
    arch = _scalar(metadata, "general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedModelError(
            f"{path}: architecture {arch!r} is not supported; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    if _scalar(metadata, "llama.expert_count"):
        raise UnsupportedModelError(f"{path}: mixture-of-experts llama models are not supported")

    def need(key: str) -> Any:
        value = _scalar(metadata, f"llama.{key}")
        if value is None:
            raise ModelFormatError(f"{path}: GGUF metadata lacks llama.{key}")
        return value

    n_heads = int(need("attention.head_count"))
    hidden = int(need("embedding_length"))
    head_dim = int(_scalar(metadata, "llama.attention.key_length", hidden // n_heads))
    rope_dims = int(_scalar(metadata, "llama.rope.dimension_count", head_dim))
    if rope_dims != head_dim:
        raise UnsupportedModelError(
            f"{path}: partial rotary embeddings ({rope_dims} of {head_dim}) are not supported"
        )
    args: dict[str, Any] = {
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": int(need("block_count")),
        "intermediate_size": int(need("feed_forward_length")),
        "num_attention_heads": n_heads,
        "num_key_value_heads": int(_scalar(metadata, "llama.attention.head_count_kv", n_heads)),
        "head_dim": head_dim,
        "rms_norm_eps": float(need("attention.layer_norm_rms_epsilon")),
        "vocab_size": int(weights["token_embd.weight"].shape[0]),
        "rope_theta": float(_scalar(metadata, "llama.rope.freq_base", 10000.0)),
        "max_position_embeddings": int(_scalar(metadata, "llama.context_length", 2048)),
        "tie_word_embeddings": "output.weight" not in weights,
        "attention_bias": "blk.0.attn_q.bias" in weights,
    }
    scaling = _scalar(metadata, "llama.rope.scaling.type")
    if scaling == "linear":
        args["rope_scaling"] = {
            "type": "linear",
            "factor": float(_scalar(metadata, "llama.rope.scaling.factor")),
        }
    elif scaling not in (None, "none"):
        raise UnsupportedModelError(f"{path}: rope scaling {scaling!r} is not supported; supported: linear")
    return args


def unpermute_rows(w: mx.array, n_heads: int) -> mx.array:
    """Undo llama.cpp's Q/K row permutation (interleaved rotary pairs back to halves).

    The converter reshapes each head's rows as (2, head_dim/2) and swaps the
    two axes; this applies the inverse. Rows carry whole quantization groups,
    so the same reordering is valid for packed weights, scales and biases.
    """
    shape = w.shape
    return w.reshape(n_heads, shape[0] // n_heads // 2, 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def _mlx_name(gguf_name: str, path: Path) -> str:
    parts = gguf_name.split(".")
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in _BLOCK_TENSORS:
        return f"model.layers.{parts[1]}.{_BLOCK_TENSORS[parts[2]]}.{parts[3]}"
    if len(parts) == 2 and parts[0] in _TOP_TENSORS:
        return f"{_TOP_TENSORS[parts[0]]}.{parts[1]}"
    raise UnsupportedModelError(f"{path}: tensor {gguf_name!r} has no place in the llama architecture")


def translate_weights(weights: dict[str, mx.array], args: dict[str, Any], path: Path) -> dict[str, mx.array]:
    """Rename GGUF tensors to mlx-lm names and undo the Q/K permutation."""
    heads = {"attn_q": args["num_attention_heads"], "attn_k": args["num_key_value_heads"]}
    out = {}
    for name, w in weights.items():
        kind = name.split(".")[2] if name.startswith("blk.") else None
        if kind in heads:
            w = unpermute_rows(w, heads[kind])
        out[_mlx_name(name, path)] = w
    return out


def quantized_bits(weights: dict[str, mx.array]) -> dict[str, int]:
    """Bit width of every module stored quantized, from its packed and scale shapes."""
    bits = {}
    for name, scales in weights.items():
        if name.endswith(".scales"):
            module = name[: -len(".scales")]
            packed = weights[f"{module}.weight"].shape[-1]
            bits[module] = packed // scales.shape[-1]
    return bits


def load_gguf(path: Path) -> tuple[nn.Module, dict[str, Any], dict[str, Any]]:
    """Load a GGUF file: returns (mlx-lm model, model args, raw GGUF metadata)."""
    check_tensor_types(path)
    try:
        raw, metadata = mx.load(str(path), return_metadata=True)
    except (RuntimeError, ValueError) as err:
        raise ModelFormatError(f"{path}: MLX could not read this GGUF file ({err})") from err
    assert isinstance(raw, dict) and isinstance(metadata, dict)
    args = model_args(metadata, raw, path)
    weights = translate_weights(raw, args, path)
    bits = quantized_bits(weights)
    model = llama.Model(llama.ModelArgs.from_dict(args))
    if bits:
        nn.quantize(
            model,
            class_predicate=lambda p, m: {"group_size": GROUP_SIZE, "bits": bits[p]} if p in bits else False,
        )
    try:
        model.load_weights(list(weights.items()), strict=True)
    except ValueError as err:
        raise ModelFormatError(f"{path}: tensors do not fit the llama architecture ({err})") from err
    mx.eval(model.parameters())
    return model, args, metadata
