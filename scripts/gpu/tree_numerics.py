#!/usr/bin/env python3
"""A tree pass against a chain pass over its kept path, on this backend: what the tests allow and see.

For the trees of ``tests/specwire/models/test_tree_pass.py`` (the default
target's 12-node tree, and tiny-hybrid's six random trees), prints:

* **allowed**: ``TIE_FACTOR`` times the rounding measured for passes as wide
  as the tree's and the chain's against one position per pass
  (``tests.support.rounding.pass_rounding``): logits absolute, cache arrays
  relative to their largest magnitude;
* **seen**: how far the tree pass's rows and kept cache lie from the chain
  pass's;
* **wrong token**: the same against a chain whose last token differs, what a
  tree pass that kept a wrong row would show. A check is meaningful only
  where this lies far above what it allows.

Zero rounding and zero differences on the CPU (but for the wrong token).
Prints one JSON object.

    scripts/gpu/check.sh -- python3 scripts/gpu/tree_numerics.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import mlx.core as mx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from coordinator.decoding.ties import TIE_FACTOR
from specwire.drafting.token_tree import TokenTree
from specwire.models.loading import LoadedModel, load_model
from tests.specwire.models.test_tree_pass import PROMPT, random_tree, verified
from tests.support.rounding import cache_arrays, pass_rounding, relative_difference


def differences(model: LoadedModel, tree: TokenTree, path: list[int], chain: list[int]) -> dict:
    """How far the tree pass keeping ``path`` lies from a chain pass over ``chain`` (as many tokens)."""
    rows, cache = verified(model, PROMPT, tree, path)
    chain_rows, chain_cache = verified(model, PROMPT, None, chain)
    logits = float(mx.abs(rows.astype(mx.float32) - chain_rows.astype(mx.float32)).max().item())
    arrays = [
        relative_difference(a, b)
        for x, y in zip(cache, chain_cache, strict=True)
        for a, b in zip(cache_arrays(x), cache_arrays(y), strict=True)
    ]
    return {"logits": logits, "cache": max(arrays)}


def case(model: LoadedModel, tree: TokenTree, node: int) -> dict:
    path = tree.path(node)
    tokens = [tree.tokens[i] for i in path]
    measured = [
        pass_rounding(model, PROMPT + list(tree.tokens), len(tree) + 1),
        pass_rounding(model, PROMPT + tokens, len(tokens) + 1),
    ]
    return {
        "nodes": len(tree),
        "path": len(path),
        "allowed": {
            "logits": TIE_FACTOR * max(m.logits for m in measured),
            "cache": TIE_FACTOR * max(m.cache for m in measured),
        },
        "seen": differences(model, tree, path, tokens),
        "wrong_token": differences(model, tree, path, [*tokens[:-1], (tokens[-1] + 1) % model.vocab_size])
        if path
        else None,
    }


def main() -> None:
    out: dict = {"device": str(mx.default_device())}
    real = load_model("default@float32")
    tree = TokenTree(
        (11, 22, 33, 44, 55, 66, 77, 88, 99, 111, 122, 133), (-1, -1, -1, 0, 0, 1, 3, 3, 6, 5, 2, 8)
    )
    out["default@float32"] = case(real, tree, 8)
    hybrid = load_model("tiny-hybrid")
    out["tiny-hybrid"] = []
    for seed in range(6):
        rng = np.random.default_rng(100 + seed)
        tree = random_tree(rng, int(rng.integers(1, 24)), hybrid.vocab_size)
        out["tiny-hybrid"].append(case(hybrid, tree, int(rng.integers(-1, len(tree)))))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
