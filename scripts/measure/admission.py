"""What admitting B requests at once costs ``serve``'s batch: each prompt alone then joined, or together.

For each B in ``--rows``, taking turns ``--turns`` times in one process on
one model: B prompts (``compare_servers``'s lengths) begun and prefilled one
at a time, then joined one at a time (``DecodingBatch.join``), against the
same prompts begun without a prefill and admitted together
(``DecodingBatch.admit``: one prefill pass, one join). Then both batches
decode one round, and the texts must agree.

    python scripts/measure/admission.py --model default@float32 --rows 4,8

Its figures are in ``docs/serving.md#prompts-admitted-together``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from coordinator.decoding.batch import DecodingBatch
from coordinator.decoding.engine import Decoding, SpeculativeDecoder
from specwire.drafting.sampling import SamplingParams
from specwire.models.loading import LoadedModel, load_model

GREEDY = SamplingParams()


def one_by_one(target: LoadedModel, asked: list[list[int]]) -> tuple[float, list[Decoding]]:
    decoder = SpeculativeDecoder(target)
    started = time.perf_counter()
    batch = DecodingBatch(target, None)
    rows = []
    for prompt in asked:
        decoding = decoder.begin(prompt, max_tokens=4, k=0, params=GREEDY)
        batch.join(decoding, 0)
        rows.append(decoding)
    seconds = time.perf_counter() - started
    batch.round()
    return seconds, rows


def together(target: LoadedModel, asked: list[list[int]]) -> tuple[float, list[Decoding]]:
    decoder = SpeculativeDecoder(target)
    started = time.perf_counter()
    batch = DecodingBatch(target, None)
    rows = [decoder.begin(p, max_tokens=4, k=0, params=GREEDY, prefill=False) for p in asked]
    batch.admit(rows, [0] * len(rows))
    seconds = time.perf_counter() - started
    batch.round()
    return seconds, rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="default@float32")
    p.add_argument("--rows", default="4,8")
    p.add_argument("--prompt-tokens", type=int, default=12, help="the shortest prompt; the others longer")
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    target = load_model(args.model)
    record: dict[str, Any] = {"model": args.model, "rows": {}}
    rng = np.random.default_rng(0)
    for rows in [int(n) for n in args.rows.split(",")]:
        asked = [rng.integers(100, 2000, size=args.prompt_tokens + b).tolist() for b in range(rows)]
        one_by_one(target, asked), together(target, asked)  # warm every shape
        times: dict[str, list[float]] = {"one_by_one_ms": [], "together_ms": []}
        for _ in range(args.turns):
            a, alone_rows = one_by_one(target, asked)
            b, joined_rows = together(target, asked)
            times["one_by_one_ms"].append(1000 * a)
            times["together_ms"].append(1000 * b)
            same = [x.result.tokens for x in alone_rows] == [x.result.tokens for x in joined_rows]
        medians = {k: statistics.median(v) for k, v in times.items()}
        record["rows"][rows] = {**medians, "turns": times, "first_tokens_agree": same}
        print(
            f"B={rows}: one by one {medians['one_by_one_ms']:.1f} ms, "
            f"together {medians['together_ms']:.1f} ms (first tokens agree: {same})"
        )
    if args.json:
        args.json.write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
