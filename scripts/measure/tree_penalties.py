"""Ranking a draft tree's rows under penalties and a logit bias: where the logits are, and on the host.

Feeds docs/serving.md#constrained-output-and-why-it-stays-lossless. A pass of a worker's (or a local) tree
gives one logits row a node; under a request's penalties each row is ranked after them
(``specwire.drafting.choices.processed_choices``). Since 7dda961 only the ids the bias and the last 20
tokens name are read and written where the logits are (``Processing.penalised``); before, every row
came to the host in float64 (``host``, below, as it ran). Qwen3.5's vocabulary of 248,320 tokens, random
logits, 1, 4 and 16 rows, the median of 15 runs each, both ways interleaved.

    python scripts/measure/tree_penalties.py
"""

from __future__ import annotations

import statistics
import time

import mlx.core as mx
import numpy as np

from specwire.drafting.choices import likeliest, processed_choices, top_choices_now
from specwire.logits.processors import Penalties, Processing

VOCAB = 248_320
WIDTH = 8
RUNS = 15


def host(rows: mx.array, suffixes: list[list[int]], processing: Processing, width: int) -> list[list[int]]:
    """The rows ranked on the host, as before 7dda961: each processed in float64 by ``Processing.row``."""
    rows_on_host = np.array(rows.astype(mx.float32))
    processed = np.stack([processing.row(row, s) for row, s in zip(rows_on_host, suffixes, strict=True)])
    return [c.ids.tolist() for c in likeliest(processed, width)]


def compare(rows: mx.array, suffixes: list[list[int]], processing: Processing) -> str:
    """The median time of each way over RUNS, interleaved, and whether both ways chose the same nodes."""
    ways = {
        "where the logits are": lambda: processed_choices(rows, suffixes, processing, WIDTH)[0],
        "on the host (before)": lambda: host(rows, suffixes, processing, WIDTH),
        "unprocessed": lambda: top_choices_now(rows, WIDTH)[0].tolist(),
    }
    times: dict[str, list[float]] = {name: [] for name in ways}
    chosen = {}
    for _ in range(RUNS):
        for name, way in ways.items():
            started = time.perf_counter()
            chosen[name] = way()
            times[name].append((time.perf_counter() - started) * 1000)
    same = chosen["where the logits are"] == chosen["on the host (before)"]
    medians = ", ".join(f"{name} {statistics.median(t):.2f}" for name, t in times.items())
    return f"{medians}; the same nodes both ways: {same}"


def main() -> None:
    rng = np.random.default_rng(0)
    history = rng.integers(0, VOCAB, 200).tolist()
    penalties = Penalties(logit_bias=((11, 2.0),), repetition_penalty=1.1, presence_penalty=0.5)
    print(f"device {mx.default_device()}, vocabulary {VOCAB}, width {WIDTH}, median of {RUNS} (ms)")
    for n in (1, 4, 16):
        rows = mx.array(rng.normal(size=(n, VOCAB)).astype(np.float32))
        mx.eval(rows)
        suffixes = [rng.integers(0, VOCAB, 3).tolist() for _ in range(n)]
        print(f"{n:2d} rows: {compare(rows, suffixes, Processing(penalties, history))}")


if __name__ == "__main__":
    main()
