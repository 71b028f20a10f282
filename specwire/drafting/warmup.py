"""Warming the kernels a round uses, so no measurement pays for their compilation.

On a GPU, MLX compiles a kernel the first time it meets an operation of a
new kind (Metal and CUDA alike); a fresh process's first speculative rounds
then take seconds instead of milliseconds, and any figure timed over them
is wrong. Each command that computes runs the shapes its rounds will use
once, on a scratch cache, before it times anything, and reports how long
that took:

* a target: one pass over each position count a round can verify, 1 (AR)
  to k + 1, after a short prefill (``target_sizes``);
* a drafter: drafting with the sampling in use, and the two feeds a verdict
  leads to (one token after a rejection, two after a bonus).

Not a prompt's prefill: on an H100 a quantized draft's first prefill of a
new prompt length compiled for 23 s once (cached on disk afterwards), and
warming a 32-position prefill took 57 s without covering a 46-position
prompt, so prefill shapes are left to the prefill. It lands in TTFT, never
in decode tok/s.

Nothing here keeps state: the caches are dropped afterwards. All MLX work
runs on the caller's thread (the process's compute thread).
"""

from __future__ import annotations

import time

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

from specwire.drafting.drafter import Drafter, LanguageModel, prefill
from specwire.drafting.sampling import SamplingParams

WARM_CONTEXT = (1,)  # a context before the passes: a prefill, and a cache to attend to
SAMPLED = SamplingParams(temperature=1.0, seed=0)


def target_sizes(k: int) -> list[int]:
    """Position counts a target pass is warmed at, for rounds of up to k drafts.

    On a GPU every count from 1 to k + 1 (a kernel may be chosen by shape, and
    the last rounds of a generation verify fewer); on the CPU, where MLX
    compiles nothing by shape and a pass costs its positions, one single and
    one full pass.
    """
    if mx.default_device() == mx.gpu:
        return list(range(1, k + 2))
    return sorted({1, k + 1})


def warm_target(model: LanguageModel, k: int) -> float:
    """Run the target once at each of ``target_sizes(k)``; returns the seconds it took."""
    started = time.perf_counter()
    cache = make_prompt_cache(model)  # type: ignore[arg-type]
    prefill(model, cache, WARM_CONTEXT)
    for positions in target_sizes(k):
        logits = model(mx.array([[0] * positions]), cache=cache)[0]
        mx.eval(mx.argmax(logits, axis=-1), logits.astype(mx.float32))  # greedy and sampled verdicts
        trim_prompt_cache(cache, positions)
    return time.perf_counter() - started


def warm_drafter(model: LanguageModel, sampled: bool = False) -> float:
    """Draft, and feed both kinds of verdict; returns the seconds it took.

    A draft pass feeds one token, or two after a round whose drafts were all
    accepted (the last draft and the bonus), whatever k is. With ``sampled``
    the last pass takes the sampling path (a float32 row to the host) instead
    of the greedy one (an argmax on the device).
    """
    started = time.perf_counter()
    drafter = Drafter(model, SamplingParams())
    drafter.start([3])
    first = drafter.draft(2).tokens[0]
    drafter.apply(0, 1 if first != 1 else 2)  # a rejection: the next pass feeds one token
    drafter.draft(1)
    drafter.apply(1, 4)  # every draft accepted: the next pass feeds two
    if sampled:
        drafter.params = SAMPLED
    drafter.draft(1)
    return time.perf_counter() - started
