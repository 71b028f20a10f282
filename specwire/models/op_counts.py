"""How many operations the per-op baseline's walk of one forward pass takes, by architecture.

The coordinator's graph walker builds these operations and the worker's
tensor executor runs them; both count a pass the same way, so the worker can
spread a paced pass's time over its operations (``specwire.emulation.pace``) and the
planner can cost a pass in calls.

llama (mlx-lm's ``llama.Model``): per block RMSNorm, the q/k/v matmuls, RoPE
for q and k, the KV-cache write, attention, the output matmul, the residual
add, RMSNorm, the gate/up matmuls, SiLU, the multiply, the down matmul and
the residual add (17).

Qwen3.5 (``qwen3_5.Model``, dense): every ``full_attention_interval``-th
block is gated attention, the others Gated DeltaNet. A Gated DeltaNet block:
RMSNorm, the qkv/z/b/a matmuls, the convolution, the q/k/v split, the delta
rule, the gated norm, the output matmul and the residual add, then the same
seven MLP operations (18). A gated-attention block: RMSNorm, the q/k/v
matmuls, the query/gate split, the q and k head norms, RoPE for q and k, the
KV-cache write, attention, the sigmoid gate, the output matmul and the
residual add, then the MLP (21).

Around the blocks, for both: the token upload, the embedding, the final
norm, the LM head and the logits download (5).
"""

from __future__ import annotations

from typing import Any

from specwire.errors import UnsupportedModelError

OPS_PER_BLOCK = {"attention": 17, "gated_attention": 21, "gated_delta": 18}
OPS_OUTSIDE_BLOCKS = 5
WALKED = ("llama", "qwen3_5")


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The language model's arguments (a multimodal config, as Qwen3.5's, nests them in ``text_config``)."""
    nested = config.get("text_config")
    return {**config, **nested} if isinstance(nested, dict) else config


def block_kinds(config: dict[str, Any]) -> list[str]:
    """The kind of each block of a walked model: attention, gated_attention or gated_delta."""
    config = text_config(config)
    model_type = config.get("model_type")
    layers = int(config["num_hidden_layers"])
    if model_type == "llama":
        return ["attention"] * layers
    if model_type == "qwen3_5":
        if int(config.get("num_experts") or 0) > 0:
            raise UnsupportedModelError(
                "the per-op backend does not walk mixture-of-experts blocks; this Qwen3.5 model has "
                f"{config['num_experts']} experts"
            )
        interval = int(config.get("full_attention_interval") or 4)
        return ["gated_delta" if (i + 1) % interval else "gated_attention" for i in range(layers)]
    raise UnsupportedModelError(
        f"the per-op backend walks {', '.join(WALKED)} models; this model is {model_type!r}"
    )


def ops_per_pass(config: dict[str, Any]) -> int:
    """Operations of one walked pass of the model mlx-lm's ``config`` (its model arguments) describes."""
    return sum(OPS_PER_BLOCK[kind] for kind in block_kinds(config)) + OPS_OUTSIDE_BLOCKS
