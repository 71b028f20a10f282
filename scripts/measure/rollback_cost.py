"""What rolling back rejected drafts costs a hybrid target, per round, against a trimmable model of its size.

Builds, with random weights, a Qwen3.5-shaped hybrid model (Gated DeltaNet
layers, full attention every fourth) and a llama model with as many
parameters (its MLP widened to match), then runs verification rounds as the
engine does (``coordinator.decoding.rollback``): a pass over k + 1
positions, then the first a + 1 kept, a cycling over 0..k. Three ways:

* ``trim``   the llama model (every layer a KV cache);
* ``states`` the hybrid, its verification pass keeping each position's state;
* ``replay`` the hybrid, feeding the accepted positions again after a rejection.

Rounds interleave the three, so load on the machine hits each alike. Per
way: the verification pass (median ms), the rollback of a round that
rejected drafts (median ms), their sum per round on average over a, and
the memory a round takes beyond what was live before it (peak, MiB).

    python scripts/measure/rollback_cost.py              # Qwen3.5-0.8B's shape, float32 (the CPU)
    python scripts/measure/rollback_cost.py --shape qwen3.5-9b --dtype bfloat16   # the paper's target (a GPU)
    python scripts/measure/rollback_cost.py --shape tiny --rounds 60 --json out.json

Its figures are in ``docs/measurements.md#rolling-back-a-hybrid-target``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten
from mlx_lm.models import llama, qwen3_5
from mlx_lm.models.cache import make_prompt_cache

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from coordinator.decoding.rollback import Rollback
from specwire.drafting.drafter import prefill

# Published shapes (Qwen's model cards and configs); tiny is specwire's tiny-hybrid.
SHAPES: dict[str, dict[str, Any]] = {
    "qwen3.5-0.8b": {
        "hidden_size": 1024, "num_hidden_layers": 24, "intermediate_size": 3584,
        "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 256,
        "linear_num_key_heads": 16, "linear_num_value_heads": 16,
        "linear_key_head_dim": 128, "linear_value_head_dim": 128,
        "vocab_size": 248320, "tie_word_embeddings": True,
    },
    "qwen3.5-9b": {
        "hidden_size": 4096, "num_hidden_layers": 32, "intermediate_size": 12288,
        "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 256,
        "linear_num_key_heads": 16, "linear_num_value_heads": 32,
        "linear_key_head_dim": 128, "linear_value_head_dim": 128,
        "vocab_size": 248320, "tie_word_embeddings": False,
    },
    "tiny": {
        "hidden_size": 16, "num_hidden_layers": 4, "intermediate_size": 32,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
        "linear_num_key_heads": 1, "linear_num_value_heads": 2,
        "linear_key_head_dim": 8, "linear_value_head_dim": 8,
        "vocab_size": 49152, "tie_word_embeddings": False,
    },
}  # fmt: skip
COMMON = {
    "model_type": "qwen3_5",
    "full_attention_interval": 4,
    "linear_conv_kernel_dim": 4,
    "rms_norm_eps": 1e-6,
}
WAYS = ("trim", "states", "replay")


def add_shape_arguments(parser: argparse.ArgumentParser) -> None:
    """``--shape`` and ``--dtype``: the random-weight model these scripts build."""
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen3.5-0.8b")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")


def parameters(model: nn.Module) -> int:
    """Parameter count."""
    return sum(int(v.size) for _, v in tree_flatten(model.parameters()))


def build(shape: dict[str, Any], dtype: mx.Dtype) -> tuple[nn.Module, nn.Module]:
    """The hybrid and a llama model with as many parameters (random weights, lazily cast to ``dtype``)."""
    hybrid = qwen3_5.Model(qwen3_5.ModelArgs.from_dict({**COMMON, **shape}))
    base = {k: shape[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")}
    base |= {"num_key_value_heads": shape["num_key_value_heads"], "head_dim": shape["head_dim"]}
    base |= {"rms_norm_eps": 1e-6, "tie_word_embeddings": shape["tie_word_embeddings"], "model_type": "llama"}
    narrow = llama.Model(llama.ModelArgs.from_dict({**base, "intermediate_size": shape["intermediate_size"]}))
    per_unit = 3 * shape["hidden_size"] * shape["num_hidden_layers"]  # MLP parameters per unit of width
    extra = (parameters(hybrid) - parameters(narrow)) // per_unit
    trimmable = llama.Model(
        llama.ModelArgs.from_dict({**base, "intermediate_size": shape["intermediate_size"] + extra})
    )
    for model in (hybrid, trimmable):
        model.set_dtype(dtype)
        mx.eval(model.parameters())
    return hybrid, trimmable


def one_round(
    rollback: Rollback, tokens: list[int], accepted: int, memory_before: int
) -> tuple[float, float, float]:
    """Verify ``tokens``, keep ``accepted`` + 1 of them: (pass ms, rollback ms, peak MiB beyond the start)."""
    mx.reset_peak_memory()
    t0 = time.perf_counter()
    mx.eval(rollback.verify(tokens))
    t1 = time.perf_counter()
    rollback_ns = rollback.keep_first(accepted + 1)
    peak = (mx.get_peak_memory() - memory_before) / 2**20
    return (t1 - t0) * 1e3, rollback_ns / 1e6, peak


def measure(hybrid: nn.Module, trimmable: nn.Module, k: int, rounds: int, context: int) -> dict[str, Any]:
    """Interleaved rounds of the three ways; their per-round figures."""
    rng = np.random.default_rng(0)
    vocab = hybrid.language_model.args.vocab_size
    runs: dict[str, Rollback] = {}
    for way, model in (("trim", trimmable), ("states", hybrid), ("replay", hybrid)):
        cache = make_prompt_cache(model)
        prefill(model, cache, rng.integers(0, vocab, context).tolist())
        runs[way] = Rollback(model, cache, context, "replay" if way == "replay" else "auto")
        assert runs[way].strategy == way, (way, runs[way].strategy)
    samples: dict[str, list[tuple[int, float, float, float]]] = {way: [] for way in WAYS}
    for r in range(rounds + 3):  # three warm-up rounds, not kept
        accepted = r % (k + 1)
        tokens = rng.integers(0, vocab, k + 1).tolist()
        for way in WAYS[r % 3 :] + WAYS[: r % 3]:
            mx.synchronize()
            before = mx.get_active_memory()
            figures = one_round(runs[way], tokens, accepted, before)
            if r >= 3:
                samples[way].append((accepted, *figures))
    out = {}
    for way, rows in samples.items():
        rejected = [s for s in rows if s[0] < k]
        out[way] = {
            "pass_ms": statistics.median(s[1] for s in rows),
            "rollback_ms": statistics.median(s[2] for s in rejected) if rejected else 0.0,
            "round_ms": statistics.mean(s[1] + s[2] for s in rows),
            "peak_mib": statistics.median(s[3] for s in rows),
            "state_mib": runs[way].stats.state_bytes / 2**20,
            "replayed": runs[way].stats.replayed,
            "rounds": len(rows),
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_shape_arguments(parser)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--context", type=int, default=64, help="tokens prefilled before the rounds")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()
    hybrid, trimmable = build(SHAPES[args.shape], getattr(mx, args.dtype))
    figures = measure(hybrid, trimmable, args.k, args.rounds, args.context)
    device = str(mx.default_device())
    print(
        f"rollback per round, {args.shape} shape ({parameters(hybrid) / 1e9:.2f} B parameters; the trimmable "
        f"llama {parameters(trimmable) / 1e9:.2f} B), {args.dtype}, k = {args.k}, {args.rounds} rounds "
        f"(accepted cycling 0..{args.k}), {device}, {platform.machine()}"
    )
    print(f"{'way':8} {'pass ms':>9} {'rollback ms':>12} {'round ms':>9} {'peak MiB':>9} {'states MiB':>10}")
    for way, f in figures.items():
        print(
            f"{way:8} {f['pass_ms']:9.2f} {f['rollback_ms']:12.2f} {f['round_ms']:9.2f} "
            f"{f['peak_mib']:9.1f} {f['state_mib']:10.1f}"
        )
    if args.json:
        record = {"shape": args.shape, "dtype": args.dtype, "k": args.k, "device": device, "figures": figures}
        record["parameters"] = {"hybrid": parameters(hybrid), "trimmable": parameters(trimmable)}
        args.json.write_text(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
