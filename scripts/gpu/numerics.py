#!/usr/bin/env python3
"""What differs between MLX backends: rounding of batched against single passes, and compilation at first use.

Run on any backend (``scripts/gpu/check.sh -- python3 scripts/gpu/numerics.py`` on a GPU machine):

* **rounding**: the target's logits for the last k + 1 positions of a context,
  from one batched pass (as verification computes them) and from single-position
  passes over a cache built one token at a time (as AR computes them): the largest
  difference, and the smallest top-2 gap AR meets on the same tokens. Where the
  difference is zero (MLX's CPU backend), speculative decoding's greedy output is
  AR's bit for bit; where it is not, the two can differ only at a position whose
  top-2 gap is within it;
* **the walked pass** of the per-op baseline against the model's own pass;
* **a quantized model against its dequantized copy**;
* **warm-up**: a fresh process's first generations, with the warm-up run first.

It prints one JSON object.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from coordinator.decoding.engine import SpeculativeDecoder
from coordinator.drafting.ggml_rpc.graph import ForwardGraph, Walk
from coordinator.drafting.local import LocalDraftSource
from coordinator.prompts import BUILTIN_PROMPTS, encode_prompt
from specwire.drafting.sampling import SamplingParams
from specwire.models.loading import LoadedModel, load_model
from worker.per_op.op_walk import trace
from worker.per_op.tensor_session import TensorSession

K = 4
MAX_TOKENS = int(sys.argv[1]) if len(sys.argv) > 1 else 64


COMPLETIONS = (
    "def factorial(n):\n    ",
    "Question: What is 17 multiplied by 23?\nAnswer:",
    "Once upon a time, a lighthouse keeper",
)


def rounding(target: LoadedModel, texts: tuple[str, ...], max_tokens: int = 24) -> dict:
    """Largest batched-vs-single logit difference, and the smallest top-2 gap, over AR's own tokens.

    The cache is built one position at a time, as AR builds it, recording each
    position's logits; then, window by window from the end, it is cut back to
    a window's start and the window's k + 1 positions run as one pass, as
    verification runs them.
    """
    worst, gaps, flips, rows = 0.0, [], 0, 0
    for text in texts:
        prompt = target.tokenizer.encode(text)
        ar = SpeculativeDecoder(target).generate(prompt, max_tokens=max_tokens, k=0, params=SamplingParams())
        tokens = prompt + ar.tokens
        cache = make_prompt_cache(target.model)
        single = []
        for t in tokens:
            single.append(np.array(target.model(mx.array([[t]]), cache=cache)[0, -1].astype(mx.float32)))
        length = len(tokens)
        for start in reversed(range(len(prompt), len(tokens) - K, K + 1)):
            trim_prompt_cache(cache, length - start)
            batched = np.array(target.model(mx.array([tokens[start : start + K + 1]]), cache=cache)[0])
            length = start + K + 1
            reference = np.stack(single[start : start + K + 1])
            worst = max(worst, float(np.abs(reference - batched.astype(np.float32)).max()))
            flips += int((reference.argmax(-1) != batched.argmax(-1)).sum())
            top = np.sort(reference, axis=-1)[:, -2:]
            gaps += (top[:, 1] - top[:, 0]).tolist()
            rows += K + 1
    return {"max_abs_logit_diff": worst, "min_top2_gap": min(gaps), "argmax_flips": flips, "rows": rows}


def walked_pass(draft: LoadedModel, text: str) -> dict:
    """The per-op walk of one pass against the model's own pass over the same tokens."""
    tokens = draft.tokenizer.encode(text)
    walk = trace(draft.model)
    session = TensorSession(draft, walk)
    graph = ForwardGraph(Walk.of(walk.announce()))
    ops = [op for group in graph.forward(0, tokens) for op in group]
    walked = np.frombuffer(session.execute(ops).tensors[-1], dtype=np.float32)
    whole = np.array(draft.model(mx.array([tokens]))[0, -1].astype(mx.float32))
    return {
        "max_abs_logit_diff": float(np.abs(walked - whole).max()),
        "logit_scale": float(np.abs(whole).max()),
        "same_argmax": bool(walked.argmax() == whole.argmax()),
    }


def quantized(q4: LoadedModel, f32: LoadedModel, text: str) -> dict:
    """The default Q4_1 model against its float32 dequantization, on one context."""
    x = mx.array([q4.tokenizer.encode(text)])
    a, b = np.array(q4.model(x).astype(mx.float32)), np.array(f32.model(x).astype(mx.float32))
    return {"max_abs_logit_diff": float(np.abs(a - b).max()), "logit_scale": float(np.abs(b).max())}


def warm_generations(target: LoadedModel, draft: LoadedModel, texts: list[str]) -> dict:
    """Warm-up seconds, then local SD's decode tok/s over the prompts, twice in a row."""
    decoder = SpeculativeDecoder(target, LocalDraftSource(draft))
    warmup_s = decoder.warm_up(K, SamplingParams(), [draft])
    passes = []
    for _ in range(2):
        rates = []
        for text in texts:
            prompt = encode_prompt(target, text, chat=True)
            result = decoder.generate(prompt, max_tokens=MAX_TOKENS, k=K, params=SamplingParams())
            rates.append(result.decode_tps)
        passes.append(rates)
    return {"warmup_s": warmup_s, "first_pass_tok_s": passes[0], "second_pass_tok_s": passes[1]}


def main() -> None:
    started = time.perf_counter()
    target, draft = load_model("default@float32"), load_model("default")
    texts = [p.text for p in BUILTIN_PROMPTS]
    out = {"device": str(mx.default_device()), "mlx": mx.__version__}
    out["warm_generations"] = warm_generations(target, draft, texts)
    out["rounding_f32_target"] = rounding(target, COMPLETIONS)
    out["rounding_q4_draft"] = rounding(draft, COMPLETIONS[:1])
    out["walked_pass"] = walked_pass(draft, texts[0])
    out["quantized_vs_dequantized"] = quantized(draft, target, texts[1])
    out["seconds"] = time.perf_counter() - started
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
