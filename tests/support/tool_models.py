"""A small random-weight Qwen3 pair saved as mlx-lm saves models, for tool calls and structured output.

Both use the default model's tokenizer (its whole vocabulary, so any
grammar's tokens can be emitted), in float32; the draft is the target with
every weight perturbed, so they agree often but not always. Served with
``tests/data/chatml_tools.jinja``, a chat template that takes tools (calls as
JSON between ``<tool_call>`` tags).
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.models import qwen3
from mlx_lm.utils import save_config, save_model

from specwire.models.loading import load_tokenizer
from tests.support.hub import DRAFT_NOISE, qwen3_args

TOOLS_TEMPLATE = Path(__file__).resolve().parent.parent / "data" / "chatml_tools.jinja"


def write_tool_pair(directory: Path, seed: int = 0) -> tuple[Path, Path]:
    """Write the target and the draft under ``directory``; returns their model directories."""
    tokenizer = load_tokenizer("default")
    args = qwen3_args(len(tokenizer))
    mx.random.seed(seed)
    target = qwen3.Model(qwen3.ModelArgs.from_dict(args))
    mx.eval(target.parameters())
    draft = qwen3.Model(qwen3.ModelArgs.from_dict(args))
    noise = DRAFT_NOISE * 3  # the draft agrees with the target on about 85% of its drafts at T = 0
    noisy = [(k, v + noise * mx.random.normal(v.shape)) for k, v in tree_flatten(target.parameters())]
    draft.update(tree_unflatten(noisy))
    mx.eval(draft.parameters())
    out = []
    for name, model in (("target", target), ("draft", draft)):
        path = directory / name
        path.mkdir(parents=True)
        save_model(path, model)
        save_config(dict(args), config_path=path / "config.json")
        tokenizer.save_pretrained(str(path))
        out.append(path)
    return out[0], out[1]
