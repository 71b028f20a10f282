"""What a hybrid draft model's tree holds on a worker: bytes a node, and the tree's memory pass by pass.

A worker's tree (``specwire.drafting.ahead.draft_tree``) keeps, for each node it
expanded, every Gated DeltaNet layer's state after that node's path. This
builds random weights in Qwen3.5's shape (``rollback_cost.SHAPES``; the
paper's draft by default), prefills ``--context`` tokens, plants a tree as a
worker session does, and runs tree passes of ``--rows`` nodes. After each
pass: the nodes holding states, the memory in use beyond what the model and
the prefilled cache took (MLX's active memory), and the peak. Then the same
under ``--bound-mib`` (the worker's ``--tree-memory``, which charges each node
its recurrent states and its K/V position): the tree must stop growing at the bound.

    python scripts/measure/tree_memory.py                          # Qwen3.5-0.8B's shape, float32 (the CPU)
    python scripts/measure/tree_memory.py --dtype bfloat16 --passes 16     # a GPU
    python scripts/measure/tree_memory.py --shape tiny --json out.json

Its figures are in ``docs/measurements.md#a-hybrid-workers-tree-memory``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models import qwen3_5

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from scripts.measure.rollback_cost import COMMON, SHAPES, add_shape_arguments, parameters
from specwire.drafting.ahead.draft_tree import DraftTree, TreeMemory
from specwire.drafting.ahead.prespec_config import DEFAULT_FANOUT, PrespecConfig
from specwire.drafting.drafter import Drafter
from specwire.drafting.sampling import SamplingParams

MIB = 2**20


def build(shape: dict[str, Any], dtype: mx.Dtype) -> nn.Module:
    """The hybrid model, random weights in ``dtype``."""
    model = qwen3_5.Model(qwen3_5.ModelArgs.from_dict({**COMMON, **shape}))
    model.set_dtype(dtype)
    mx.eval(model.parameters())
    return model


def grow(model: nn.Module, context: int, rows: int, passes: int, bound: int) -> dict[str, Any]:
    """Plant a tree after ``context`` random tokens and run up to ``passes`` passes of ``rows`` rows."""
    vocab = model.language_model.args.vocab_size
    prompt = np.random.default_rng(0).integers(0, vocab, context).tolist()
    drafter = Drafter(model, SamplingParams())
    drafter.start(prompt)
    config = PrespecConfig(fanout=DEFAULT_FANOUT, batch=rows, fill=True, tree=True, budget=passes)
    first = drafter.drafting(2, config.alternatives)
    first.advance()
    drafter.adopt(first)
    mx.synchronize()
    mx.clear_cache()
    start = mx.get_active_memory()
    mx.reset_peak_memory()
    tree = DraftTree(drafter, config, context + 4096, TreeMemory(bound))
    tree.plant(first.tokens, first.candidates)
    steps = []
    while True:
        t0 = time.perf_counter()
        grew = tree.step()
        mx.eval(tree.arena.arrays())
        mx.synchronize()
        if not grew:
            break
        steps.append(
            {
                "held": tree.held,
                "charged_mib": tree.held_bytes / MIB,
                "active_mib": (mx.get_active_memory() - start) / MIB,
                "peak_mib": (mx.get_peak_memory() - start) / MIB,
                "pass_ms": (time.perf_counter() - t0) * 1e3,
            }
        )
    states = tree.state_bytes
    return {
        "node_states_mib": states / MIB,
        "node_charged_mib": tree.held_bytes / max(1, tree.held) / MIB,
        "steps": steps,
        "stopped_by_bound": tree.passes < passes,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_shape_arguments(parser)
    parser.add_argument("--context", type=int, default=128, help="tokens prefilled before the tree")
    parser.add_argument(
        "--rows", type=int, default=16, help="nodes a pass expands (the worker's --tree-rows)"
    )
    parser.add_argument("--passes", type=int, default=8)
    parser.add_argument("--bound-mib", type=float, default=512.0, help="the bound of the second run")
    parser.add_argument("--json", type=Path, help="write the figures here too")
    args = parser.parse_args()
    model = build(SHAPES[args.shape], getattr(mx, args.dtype))
    runs = {
        "unbounded": grow(model, args.context, args.rows, args.passes, 0),
        f"bound {args.bound_mib:g} MiB": grow(
            model, args.context, args.rows, args.passes, int(args.bound_mib * MIB)
        ),
    }
    print(
        f"a worker's tree, {args.shape} shape ({parameters(model) / 1e9:.2f} B parameters), {args.dtype}, "
        f"{args.rows} rows a pass, {args.context} tokens of context, "
        f"{mx.default_device()}, {platform.machine()}"
    )
    for name, run in runs.items():
        print(
            f"{name}: {run['node_states_mib']:.3f} MiB of recurrent states a node; the bound charges a "
            f"node {run['node_charged_mib']:.3f} MiB on average (its K/V position too)"
        )
        heads = ("pass", "nodes", "charged MiB", "active MiB", "MiB a node", "peak MiB", "pass ms")
        print("  " + " ".join(f"{h:>{max(len(h), 4)}}" for h in heads))
        for i, s in enumerate(run["steps"], 1):
            per = s["active_mib"] / s["held"] if s["held"] else 0.0
            figures = f"{s['active_mib']:10.1f} {per:10.2f} {s['peak_mib']:9.1f} {s['pass_ms']:8.1f}"
            print(f"  {i:4} {s['held']:5} {s['charged_mib']:11.1f} {figures}")
        if run["stopped_by_bound"]:
            print("  stopped by the bound")
    if args.json:
        record = {"shape": args.shape, "dtype": args.dtype, "rows": args.rows, "context": args.context}
        args.json.write_text(
            json.dumps({**record, "device": str(mx.default_device()), "runs": runs}, indent=2)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
