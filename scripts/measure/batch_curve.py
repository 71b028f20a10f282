"""How a verification pass's time grows with the sequences it verifies together, against the profile's curve.

The paced profile prices a pass over B sequences of n positions as a pass
over B x n positions of one sequence (``specwire.emulation.profile``): flat
while the weights' reads bind, then growing at the prompt rate. ``serve``
verifies concurrent requests in one such pass (``coordinator.decoding.batch``),
so this measures it on the machine at hand, through the same ragged KV
cache: for each model, the median time of a pass over B rows of n new
positions after ``--context`` cached positions each, beside one row of
B x n positions.

    python scripts/measure/batch_curve.py --models default,qwen3-8b --json batch-curve.json

``qwen3-8b`` and ``qwen3-0.6b`` are random weights in those models' shapes
(bfloat16): their speed is the real model's, their tokens are not.

Its figures are in ``docs/serving.md#several-requests-at-once``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from specwire.models.loading import load_model
from specwire.models.ragged_cache import ragged_cache

SHAPES = {  # Qwen3's published configs (config.json on the Hugging Face hub)
    "qwen3-0.6b": {
        "hidden_size": 1024,
        "num_hidden_layers": 28,
        "intermediate_size": 3072,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
    },
    "qwen3-8b": {
        "hidden_size": 4096,
        "num_hidden_layers": 36,
        "intermediate_size": 12288,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
    },
}


def shaped_model(name: str) -> Any:
    """Random bfloat16 weights in a Qwen3 shape."""
    from mlx_lm.models import qwen3

    args = qwen3.ModelArgs(
        model_type="qwen3",
        vocab_size=151936,
        rms_norm_eps=1e-6,
        rope_theta=1e6,
        max_position_embeddings=40960,
        tie_word_embeddings=False,
        **SHAPES[name],
    )
    model = qwen3.Model(args)
    model.set_dtype(mx.bfloat16)
    mx.eval(model.parameters())
    return model


def pass_ms(model: Any, rows: int, positions: int, context: int, repeats: int) -> float:
    """Median ms of a pass over ``rows`` rows of ``positions`` new positions after ``context`` each."""
    layout, cache = ragged_cache(model)
    for _ in range(rows):
        layout.add(None)  # a row with no positions yet
    rng = np.random.default_rng(0)
    layout.begin(context)
    model(mx.array(rng.integers(0, 1000, (rows, context))), cache=cache)
    mx.eval([c.state for c in cache])
    layout.commit(context, [context] * rows)
    times = []
    inputs = mx.array(rng.integers(0, 1000, (rows, positions)))
    for i in range(repeats + 2):  # two to warm the kernels up
        layout.begin(positions)
        started = time.perf_counter()
        mx.eval(model(inputs, cache=cache))
        elapsed = time.perf_counter() - started
        layout.commit(positions, [0] * rows)  # nothing kept: every pass sees the same context,
        layout.size -= positions  # and writes the same slots (one shape: no kernel built anew)
        if i >= 2:
            times.append(elapsed * 1e3)
    return statistics.median(times)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="default,qwen3-8b", help="comma-separated: a model spec or a shape")
    p.add_argument("--rows", default="1,2,4,8")
    p.add_argument("--positions", default="1,3,5")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    rows = [int(r) for r in args.rows.split(",")]
    positions = [int(n) for n in args.positions.split(",")]
    out: dict[str, Any] = {"device": str(mx.default_device()), "context": args.context, "models": {}}
    for name in args.models.split(","):
        model = shaped_model(name) if name in SHAPES else load_model(name).model
        table = []
        for n in positions:
            for b in rows:
                batched = pass_ms(model, b, n, args.context, args.repeats)
                one_row = pass_ms(model, 1, b * n, args.context, args.repeats)
                table.append({"rows": b, "positions": n, "batched_ms": batched, "one_row_ms": one_row})
                print(
                    f"{name:12} B={b} n={n}: {batched:7.2f} ms  one row of {b * n}: {one_row:7.2f} ms",
                    flush=True,
                )
        out["models"][name] = table
        del model
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
