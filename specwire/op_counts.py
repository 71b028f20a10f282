"""How many operations the per-op baseline's walk of one forward pass takes, by architecture.

The coordinator's graph walker builds these operations and the worker's
tensor executor runs them; both count a pass the same way, so the worker can
spread a paced pass's time over its operations (``specwire.pace``) and the
planner can cost a pass in calls.

llama (mlx-lm's ``llama.Model``): per block RMSNorm, the q/k/v matmuls, RoPE
for q and k, the KV-cache write, attention, the output matmul, the residual
add, RMSNorm, the gate/up matmuls, SiLU, the multiply, the down matmul and
the residual add (17); around the blocks the token upload, the embedding,
the final norm, the LM head and the logits download (5).
"""

from __future__ import annotations

from typing import Any

from specwire.errors import UnsupportedModelError

LLAMA_OPS_PER_BLOCK = 17
LLAMA_OPS_OUTSIDE_BLOCKS = 5
WALKED = ("llama",)


def llama_ops(layers: int) -> int:
    """Operations in one forward pass of a llama model with ``layers`` blocks."""
    return LLAMA_OPS_PER_BLOCK * layers + LLAMA_OPS_OUTSIDE_BLOCKS


def ops_per_pass(config: dict[str, Any]) -> int:
    """Operations of one walked pass of the model mlx-lm's ``config`` (its model arguments) describes."""
    model_type = config.get("model_type")
    if model_type == "llama":
        return llama_ops(int(config["num_hidden_layers"]))
    raise UnsupportedModelError(
        f"the per-op backend walks {', '.join(WALKED)} models; this model is {model_type!r}"
    )
