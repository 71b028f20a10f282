"""A Hugging Face cache holding small random-weight stand-ins for the models the README names.

The README's commands name ``mlx-community/Qwen3-8B-4bit`` (the target) and
``mlx-community/Qwen3-0.6B-4bit`` (the draft). Nothing can be downloaded
here, so a test writes Qwen3 models of mlx-lm's own class, quantized to 4
bits as those are, into a cache directory laid out as the hub lays it out
(``models--OWNER--NAME/refs/main`` and ``snapshots/REVISION/``); with
``HF_HOME`` pointing at it and ``HF_HUB_OFFLINE=1``, the README's commands
load them by those very ids. Both use the default model's tokenizer, so
they share a vocabulary; the draft is the target with every weight
perturbed, so it agrees with the target often but not always.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.models import qwen3
from mlx_lm.utils import save_config, save_model

from specwire.models.loading import load_tokenizer

TARGET_ID = "mlx-community/Qwen3-8B-4bit"
DRAFT_ID = "mlx-community/Qwen3-0.6B-4bit"
REVISION = "0" * 40
QUANTIZATION = {"group_size": 64, "bits": 4}
DRAFT_NOISE = 0.003


def qwen3_args(vocab_size: int) -> dict[str, Any]:
    """A one-block Qwen3 as small as a 4-bit group allows (the README bench walks it per op)."""
    return {
        "model_type": "qwen3", "hidden_size": 64, "num_hidden_layers": 1, "intermediate_size": 128,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-6,
        "vocab_size": vocab_size, "max_position_embeddings": 4096, "rope_theta": 1000000.0,
        "tie_word_embeddings": True,
    }  # fmt: skip


def _save(hub: Path, repo_id: str, model: nn.Module, args: dict[str, Any], tokenizer: Any) -> Path:
    owner, name = repo_id.split("/")
    repo = hub / f"models--{owner}--{name}"
    snapshot = repo / "snapshots" / REVISION
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    nn.quantize(model, **QUANTIZATION)
    save_model(snapshot, model)
    save_config({**args, "quantization": QUANTIZATION}, config_path=snapshot / "config.json")
    tokenizer.save_pretrained(str(snapshot))
    return snapshot


def random_pair(args: dict[str, Any], seed: int, noise: float) -> tuple[nn.Module, nn.Module]:
    """A random Qwen3 target drawn from ``seed``, and a draft that is the target with every weight
    perturbed by normal noise of scale ``noise``."""
    mx.random.seed(seed)
    target = qwen3.Model(qwen3.ModelArgs.from_dict(args))
    mx.eval(target.parameters())
    draft = qwen3.Model(qwen3.ModelArgs.from_dict(args))
    noisy = [(k, v + noise * mx.random.normal(v.shape)) for k, v in tree_flatten(target.parameters())]
    draft.update(tree_unflatten(noisy))
    mx.eval(draft.parameters())
    return target, draft


def write_readme_pair(hf_home: Path, seed: int = 0) -> dict[str, Path]:
    """Write the target and the draft into ``hf_home``'s hub cache; returns each id's snapshot."""
    tokenizer = load_tokenizer("default")
    args = qwen3_args(len(tokenizer))
    target, draft = random_pair(args, seed, DRAFT_NOISE)
    hub = hf_home / "hub"
    return {
        TARGET_ID: _save(hub, TARGET_ID, target, args, tokenizer),
        DRAFT_ID: _save(hub, DRAFT_ID, draft, args, tokenizer),
    }
