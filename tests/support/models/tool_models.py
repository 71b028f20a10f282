"""A small random-weight Qwen3 pair saved as mlx-lm saves models, for tool calls and structured output.

Both use the default model's tokenizer (its whole vocabulary, so any
grammar's tokens can be emitted), in float32; the draft is the target with
every weight perturbed, so they agree often but not always. Served with
``tests/data/chatml_tools.jinja``, a chat template that takes tools (calls as
JSON between ``<tool_call>`` tags).
"""

from __future__ import annotations

from pathlib import Path

from mlx_lm.utils import save_config, save_model

from specwire.models.loading import load_tokenizer
from tests.support.models.hub import DRAFT_NOISE, qwen3_args, random_pair

TOOLS_TEMPLATE = Path(__file__).resolve().parents[2] / "data" / "chatml_tools.jinja"


def write_tool_pair(directory: Path, seed: int = 0) -> tuple[Path, Path]:
    """Write the target and the draft under ``directory``; returns their model directories."""
    tokenizer = load_tokenizer("default")
    args = qwen3_args(len(tokenizer))
    # The draft agrees with the target on about 85% of its drafts at T = 0 (3x the README pair's noise).
    target, draft = random_pair(args, seed, DRAFT_NOISE * 3)
    out = []
    for name, model in (("target", target), ("draft", draft)):
        path = directory / name
        path.mkdir(parents=True)
        save_model(path, model)
        save_config(dict(args), config_path=path / "config.json")
        tokenizer.save_pretrained(str(path))
        out.append(path)
    return out[0], out[1]
