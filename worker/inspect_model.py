"""``worker inspect``: load a model and print what a worker serving it would advertise."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from specwire.models import DEFAULT_MODEL

if TYPE_CHECKING:
    from specwire.models.loading import LoadedModel

NAME = "inspect"
HELP = "Load a draft model and print its identity: architecture, precision, vocabulary fingerprint."


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of ``worker inspect``."""
    p.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help="model spec: default, FILE.gguf, DIR or HF id, optionally @float32",
    )
    p.add_argument("--json", action="store_true", help="print JSON")


def describe(model: LoadedModel) -> dict[str, Any]:
    """The identity of a loaded model, as plain data."""
    return {
        "spec": model.spec,
        "path": model.path,
        "architecture": model.args.get("model_type"),
        "precision": model.precision,
        "layers": model.args.get("num_hidden_layers"),
        "hidden_size": model.args.get("hidden_size"),
        "vocab_size": model.vocab_size,
        "context_length": model.context_length,
        "fingerprint": model.fingerprint,
        "eos_token_ids": sorted(model.eos_token_ids),
    }


def run(args: argparse.Namespace) -> int:
    """Run ``worker inspect``."""
    from specwire.models.loading import load_model  # mlx-lm: loaded when this command runs, not for others

    info = describe(load_model(args.model))
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        width = max(len(k) for k in info)
        for key, value in info.items():
            print(f"{key:<{width}}  {value}")
    return 0
