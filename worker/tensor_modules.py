"""The modules of a model the per-op executor can walk, under fixed handles shared by all sessions.

Names follow the model's own parameter paths (``model.layers.3.self_attn``),
which the coordinator's walker uses to build operations. Two families:

* llama (mlx-lm's ``llama.Model``): per block the input norm, the attention
  module and its q/k/v/o projections, the post-attention norm and the MLP's
  gate/up/down projections;
* Qwen3.5 (``qwen3_5.Model``, dense): blocks whose mixer is a Gated
  DeltaNet (``linear_attn``: its in_proj_qkv/z/b/a and out_proj, and the
  module itself, which holds the convolution, the decay parameters and the
  gated norm) or a gated full attention (``self_attn``: q/k/v/o projections,
  per-head q/k norms), then the same MLP. Mixture-of-experts blocks and
  other layouts (Qwen3-Next's fused projections) are refused by name.

Around the blocks: the token embedding, the final norm and the LM head.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import mlx.core as mx
import mlx.nn as nn

from specwire.errors import UnsupportedModelError
from specwire.v1 import draft_pb2 as pb

_ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
_GATED_DELTA = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj")
_MLP = ("gate_proj", "up_proj", "down_proj")


@dataclass
class ModuleTable:
    """Fixed handles for the modules a forward pass uses, and the layer each belongs to."""

    modules: dict[int, nn.Module]
    names: dict[str, int]
    layer_of: dict[int, int]

    @classmethod
    def of(cls, model: nn.Module) -> ModuleTable:
        """Number the modules of ``model``'s forward pass, in a stable order."""
        text = model.model  # the decoder stack (a property on multimodal Qwen3.5)
        named: list[tuple[str, nn.Module, int | None]] = [("model.embed_tokens", text.embed_tokens, None)]
        for i, layer in enumerate(model.layers):
            named += _block(f"model.layers.{i}", layer, i)
        named.append(("model.norm", text.norm, None))
        head = _lm_head(model)
        if head is not None:
            named.append(("lm_head", head, None))
        table = cls({}, {}, {})
        for handle, (name, module, layer_index) in enumerate(named, start=1):
            table.modules[handle] = module
            table.names[name] = handle
            if layer_index is not None:
                table.layer_of[handle] = layer_index
        return table


def _block(prefix: str, layer: nn.Module, i: int) -> list[tuple[str, nn.Module, int | None]]:
    named: list[tuple[str, nn.Module, int | None]] = [(f"{prefix}.input_layernorm", layer.input_layernorm, i)]
    parts: tuple[str, ...]
    if hasattr(layer, "linear_attn"):
        mixer, parts = "linear_attn", _GATED_DELTA
    elif hasattr(layer, "self_attn"):
        mixer, parts = "self_attn", _ATTENTION
    else:
        raise UnsupportedModelError(f"block {i} has neither attention nor a Gated DeltaNet")
    module = getattr(layer, mixer)
    named.append((f"{prefix}.{mixer}", module, i))
    named += [(f"{prefix}.{mixer}.{part}", getattr(module, part), i) for part in parts]
    for norm in ("q_norm", "k_norm"):
        if hasattr(module, norm):
            named.append((f"{prefix}.{mixer}.{norm}", getattr(module, norm), i))
    named.append((f"{prefix}.post_attention_layernorm", layer.post_attention_layernorm, i))
    if not all(hasattr(layer.mlp, proj) for proj in _MLP):
        raise UnsupportedModelError(
            f"block {i}'s MLP is not a gated MLP (mixture-of-experts blocks are not walked)"
        )
    named += [(f"{prefix}.mlp.{proj}", getattr(layer.mlp, proj), i) for proj in _MLP]
    return named


def _lm_head(model: nn.Module) -> nn.Module | None:
    """The separate LM head, or None when the embedding is tied."""
    head: nn.Module | None = getattr(getattr(model, "language_model", model), "lm_head", None)
    return head


class OpContext(Protocol):
    """What an operation's handler sees of its session (``worker.tensor_session.TensorSession``): the
    module table, the session's cache, its tensors by handle, and its checks."""

    table: ModuleTable
    cache: list[Any]

    def get(self, handle: int) -> mx.array:
        """The tensor a handle names."""
        ...

    def put(self, handle: int, value: mx.array) -> None:
        """Keep ``value`` under ``handle``."""
        ...

    def module(self, handle: int, kinds: tuple[type, ...], what: str) -> nn.Module:
        """The module behind ``handle``, checked to be one of ``kinds``."""
        ...

    def layer(self, handle: int) -> int:
        """The layer the module behind ``handle`` belongs to."""
        ...

    @staticmethod
    def shape(op: pb.Op, outputs: int, inputs: int, args: int) -> None:
        """Raise unless ``op`` has these many outputs, inputs and arguments."""
        ...

    def check_offset(self, layer: int, offset: int) -> None:
        """Raise unless ``layer``'s KV cache holds ``offset`` positions."""
        ...

    def check_recurrent_offset(self, layer: int, offset: int) -> None:
        """Raise unless ``layer``'s recurrent state is at ``offset``."""
        ...

    def advance_recurrent(self, layer: int, n: int) -> None:
        """Count ``n`` positions fed into ``layer``'s recurrent state."""
        ...
