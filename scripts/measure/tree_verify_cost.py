"""What a verification round costs a hybrid target with a tree against a chain, beside a llama of its size.

Builds random weights in Qwen3.5's shape and a llama model with as many
parameters (``rollback_cost.build``), prefills ``--context`` tokens, then runs
verification rounds as the engine does (``coordinator.decoding.rollback``):

* ``chain``: one pass over ``--nodes`` + 1 positions, then the first a + 1
  kept (a cycling over 0..nodes);
* ``tree``: one pass over a tree of ``--nodes`` nodes (``--width`` children of
  the verified token, the rest children of those, best first), then one of
  its paths kept (cycling over every node, the root's pending token first).

Rounds interleave the four (two models, two ways), so load on the machine
hits each alike. Per model and way: the pass (median ms), the rollback
(median ms), and the memory a round takes beyond what was live before it
(peak, MiB).

    python scripts/measure/tree_verify_cost.py               # Qwen3.5-0.8B's shape, float32 (the CPU)
    python scripts/measure/tree_verify_cost.py --shape qwen3.5-9b --dtype bfloat16   # the paper's
                                                                                   # target (a GPU)

Its figures are in ``docs/measurements.md#verification-per-round-a-tree-against-a-chain``.
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
import numpy as np
from mlx_lm.models.cache import make_prompt_cache

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from coordinator.decoding.rollback import Rollback
from scripts.measure.rollback_cost import SHAPES, add_shape_arguments, build, parameters
from specwire.drafting.drafter import prefill
from specwire.drafting.token_tree import TokenTree

MIB = 2**20


def tree_of(nodes: int, width: int, tokens: list[int]) -> TokenTree:
    """``width`` children of the verified token, then children of those in turn."""
    parents = [-1] * min(width, nodes)
    while len(parents) < nodes:
        parents.append((len(parents) - width) // width)
    return TokenTree(tuple(tokens[:nodes]), tuple(parents))


def measure(models: dict[str, Any], nodes: int, width: int, rounds: int, context: int) -> dict[str, Any]:
    """Interleaved rounds of each model's chain and tree; their medians."""
    rng = np.random.default_rng(0)
    runs: dict[str, Rollback] = {}
    for name, model in models.items():
        for way in ("chain", "tree"):
            cache = make_prompt_cache(model)
            prefill(model, cache, rng.integers(0, 1000, context).tolist())
            runs[f"{name} {way}"] = Rollback(model, cache, context, "auto")
    samples: dict[str, list[tuple[float, float, float]]] = {key: [] for key in runs}
    keys = list(runs)
    for r in range(rounds + 3):  # three warm-up rounds, not kept
        tokens = rng.integers(0, 1000, nodes + 1).tolist()
        for key in keys[r % 4 :] + keys[: r % 4]:
            rollback = runs[key]
            mx.synchronize()
            before = mx.get_active_memory()
            mx.reset_peak_memory()
            t0 = time.perf_counter()
            if key.endswith("chain"):
                mx.eval(rollback.verify(tokens))
                t1 = time.perf_counter()
                spent = rollback.keep_first(r % (nodes + 1) + 1)
            else:
                tree = tree_of(nodes, width, tokens[1:])
                mx.eval(rollback.verify_tree(tokens[0], tree))
                t1 = time.perf_counter()
                last = r % (nodes + 1) - 1
                spent = rollback.keep_path(tree.path(last) if last >= 0 else [])
            mx.synchronize()
            peak = (mx.get_peak_memory() - before) / MIB
            if r >= 3:
                samples[key].append(((t1 - t0) * 1e3, spent / 1e6, peak))
    return {
        key: {
            "pass_ms": statistics.median(s[0] for s in rows),
            "rollback_ms": statistics.median(s[1] for s in rows),
            "peak_mib": statistics.median(s[2] for s in rows),
            "rounds": len(rows),
        }
        for key, rows in samples.items()
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_shape_arguments(parser)
    parser.add_argument("--nodes", type=int, default=16, help="drafts a round verifies")
    parser.add_argument("--width", type=int, default=4, help="the tree's first level")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--context", type=int, default=64, help="tokens prefilled before the rounds")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()
    hybrid, llama = build(SHAPES[args.shape], getattr(mx, args.dtype))
    figures = measure({"llama": llama, "hybrid": hybrid}, args.nodes, args.width, args.rounds, args.context)
    print(
        f"a verification round, {args.shape} shape ({parameters(hybrid) / 1e9:.2f} B parameters; the llama "
        f"{parameters(llama) / 1e9:.2f} B), {args.dtype}, {args.nodes} drafts (tree: {args.width} wide), "
        f"{args.rounds} rounds, {mx.default_device()}, {platform.machine()}"
    )
    print(f"{'model, way':14} {'pass ms':>9} {'rollback ms':>12} {'peak MiB':>9}")
    for key, f in figures.items():
        print(f"{key:14} {f['pass_ms']:9.2f} {f['rollback_ms']:12.3f} {f['peak_mib']:9.1f}")
    if args.json:
        record = {"shape": args.shape, "dtype": args.dtype, "nodes": args.nodes, "width": args.width}
        args.json.write_text(json.dumps({**record, "device": str(mx.default_device()), "figures": figures}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
