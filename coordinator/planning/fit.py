"""Whether a profile's passes fit this machine: the emulation pair's real time for each, against its pace.

Paced compute (``specwire.emulation.pace``) holds a pass to the profile's
time only if the real pass took less. On a machine much slower than the
emulated Macs, or with three hosts sharing two cores, it may not: a row
whose passes overran does not hold its pace, and the bench refuses it. This
measures, before any bench, the real (unpaced) time of each kind of pass the
paced set-ups run, with the emulation pair (``specwire.emulation.paper.PAIRS``)
on this machine, and sets it beside each machine's paced time for it:

* the target on the target machine: verifying a chain of k + 1 positions
  (k = 2 and the profile's k), and a tree of 16 and of 64 nodes in one pass;
* the draft model on the target machine (local SD and local tree SD): a pass
  of one position, and a level of the local tree (4 nodes);
* the draft model on each drafting machine: a pass of one position, and a
  worker's tree pass of 16 and of 64 rows.

A share (real over paced) above ``FITS`` leaves too little room for the
other hosts' work and the scheduler: ``coordinator plan --profile`` warns.
Each pass is timed after an idle spell (``IDLE_S``), as a paced hold leaves
the machine: a pass after one runs cold, about twice its back-to-back time
on this project's 2-core VM. The medians come from an otherwise idle
machine; a bench shares it, so its headroom report (p99) is the figure that
decides.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import KVCache, make_prompt_cache

from coordinator.decoding.recurrent_pass import keeps_states
from coordinator.decoding.recurrent_tree import forward_tree_keeping_states
from specwire.drafting.ahead.draft_tree import DraftTree, tree_batchable
from specwire.drafting.ahead.prespec_config import DEFAULT_FANOUT, PrespecConfig
from specwire.drafting.drafter import Drafter
from specwire.drafting.sampling import SamplingParams
from specwire.emulation.paper import PAIRS
from specwire.emulation.profile import PassCurve, Profile
from specwire.models.loading import LoadedModel, load_model
from specwire.models.tree_pass import forward_at

FITS = 0.5  # the most real time a pass may take of its paced time, measured idle
CONTEXT = 160  # tokens before the measured passes: about a bench prompt
REPEATS = 7
IDLE_S = 0.02  # before each timed pass: about the target's paced pass, the hold a draft pass follows
TREES = (16, 64)  # nodes of a verified tree, rows of a worker's tree pass
LOCAL_LEVEL = 4  # nodes of a local tree level (coordinator.drafting.local_tree's width)


@dataclass(frozen=True)
class PassFit:
    """One kind of pass on one machine: its real time here, its paced time there, and the share."""

    machine: str
    model: str  # "target" or "draft"
    shape: str
    positions: int
    real_s: float
    paced_s: float

    @property
    def share(self) -> float:
        """Real over paced."""
        return self.real_s / self.paced_s

    @property
    def fits(self) -> bool:
        """At most ``FITS`` of the paced time."""
        return self.share <= FITS


def emulation_fit(profile: Profile, family: str = "llama") -> list[PassFit]:
    """Every kind of pass ``profile``'s paced set-ups run, with ``family``'s emulation pair, measured here
    (module docstring), on the calling thread."""
    target_spec, draft_spec = PAIRS[family]
    target, draft = load_model(target_spec), load_model(draft_spec)
    prompt = (np.arange(CONTEXT) * 7 % 1000 + 20).tolist()
    verify = {(f"verify {n} positions", n): _chain_s(target, prompt, n) for n in sorted({3, profile.k + 1})}
    verify |= {(f"verify a {n}-node tree", n): _tree_s(target, prompt, n) for n in TREES}
    local = {("1 position", 1): _chain_s(draft, prompt, 1)}
    local[(f"a {LOCAL_LEVEL}-node tree level", LOCAL_LEVEL)] = _tree_s(draft, prompt, LOCAL_LEVEL, levels=1)
    worker = {("1 position", 1): local[("1 position", 1)]}
    if tree_batchable(make_prompt_cache(draft.model)):
        worker |= {(f"a {n}-row tree pass", n): _worker_tree_s(draft, prompt, n) for n in TREES}

    def fits(
        machine: str, model: str, curve: PassCurve, passes: dict[tuple[str, int], float]
    ) -> list[PassFit]:
        return [PassFit(machine, model, s, n, real, curve.pass_s(n)) for (s, n), real in passes.items()]

    out = fits(profile.target_machine.name, "target", profile.target, verify)
    if profile.local_draft is not None:
        out += fits(profile.target_machine.name, "draft", profile.local_draft, local)
    for machine in profile.workers:
        assert machine.draft is not None
        out += fits(machine.name, "draft", machine.draft, worker)
    return out


def _median_s(run: Callable[[], Any]) -> float:
    run()  # kernels compiled, caches made
    times = []
    for _ in range(REPEATS):
        time.sleep(IDLE_S)
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _prefilled(model: LoadedModel, prompt: list[int]) -> list[Any]:
    cache = make_prompt_cache(model.model)
    model.model(mx.array([prompt]), cache=cache)
    mx.eval([c.state for c in cache])
    return cache


def _rewound(cache: list[Any], length: int) -> list[Any]:
    """The KV layers back to ``length`` positions (a recurrent layer's state simply runs on)."""
    for layer in cache:
        if isinstance(layer, KVCache):
            layer.offset = length
    return cache


def _chain_s(model: LoadedModel, prompt: list[int], positions: int) -> float:
    """A pass over ``positions`` positions after ``prompt``, its logits' argmax computed."""
    cache = _prefilled(model, prompt)
    tokens = mx.array([list(range(5, 5 + positions))])

    def run() -> None:
        out = model.model(tokens, cache=_rewound(cache, len(prompt)))
        mx.eval(mx.argmax(out[0], axis=-1), [c.state for c in cache])

    return _median_s(run)


def _tree_s(model: LoadedModel, prompt: list[int], nodes: int, levels: int = 2) -> float:
    """One pass over a tree of ``nodes`` nodes after ``prompt`` (two levels: a quarter under its root),
    as a target verifies a tree and a local tree grows a level."""
    cache = _prefilled(model, prompt)
    first = nodes if levels == 1 else max(1, nodes // 4)
    parents = [-1] * first + [i % first for i in range(nodes - first)]
    positions = [len(prompt) + (p >= 0) for p in parents]
    visible = np.zeros((nodes, len(prompt) + nodes), bool)
    visible[:, : len(prompt)] = True
    for i, p in enumerate(parents):
        visible[i, len(prompt) + i] = True
        if p >= 0:
            visible[i, len(prompt) + p] = True
    tokens = list(range(5, 5 + nodes))

    def run() -> None:
        _rewound(cache, len(prompt))
        if keeps_states(model.model, cache):
            logits, _ = forward_tree_keeping_states(model.model, cache, tokens, parents, positions, visible)
        else:
            logits = forward_at(model.model, cache, tokens, positions, visible)
        mx.eval(mx.argmax(logits[0], axis=-1), [c.state for c in cache])

    return _median_s(run)


def _worker_tree_s(model: LoadedModel, prompt: list[int], rows: int) -> float:
    """A worker's tree pass of ``rows`` rows (``DraftTree.step``), a few passes into its tree."""
    drafter = Drafter(model.model, SamplingParams())
    drafter.start(prompt)
    config = PrespecConfig(fanout=DEFAULT_FANOUT, batch=rows, fill=True, tree=True, budget=64)
    first = drafter.drafting(2, config.alternatives)
    first.advance()
    drafter.adopt(first)
    tree = DraftTree(drafter, config, model.context_length)
    tree.plant(first.tokens, first.candidates)
    tree.step()

    def run() -> None:
        tree.step()
        mx.synchronize()

    return _median_s(run)
