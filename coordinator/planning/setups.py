"""Every set-up a coordinator can decode with, and the performance model's tok/s for each.

A set-up is a way of decoding: autoregressive (``ar``), local SD (``local``,
the target machine's own draft model), or drafting on one worker in one of
the stream protocol's modes (``stream``: each round drafted on demand;
``tree``: the worker keeps a tree of the likely continuations across rounds
and drafts its likeliest nodes while the target verifies, answers each
round at once with the drafts it has ready, and the local draft model drafts
the rest; greedy only), each at a k; and the tree-verifying set-ups
(``local-tree``: the target machine's draft model drafts a tree, which the
target checks in one pass; ``tree-verify``: a worker's tree is checked in
one pass, a local tree where it has none ready; greedy only; their k is
the deepest a tree may be, ``TREE_DEPTH``; ``planning.ahead.tree_verify``).
``fill`` (the same without the tree, one round ahead) is no set-up of its
own any more; the model keeps it, as what a tree's prediction moves with
(``coordinator.drafting.auto``).

``ranked`` predicts every set-up from a hardware profile (``specwire.emulation.profile``:
the paper's, a file, or this machine's measured one,
``coordinator.planning.measured``) and orders them, fastest first. The
drafting policy (``coordinator.drafting.auto``) takes the first and
re-decides as rounds are measured; ``coordinator plan`` prints them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from coordinator.planning import profile as planned
from coordinator.planning.ahead.tree_verify import curve_tree_rows, local_tree, remote_tree
from coordinator.planning.model import Acceptance, Transport, ar_tok_s, predict
from specwire.drafting.ahead.prespec_config import TREE_ROWS
from specwire.emulation.profile import Machine, Profile

MODES = ("ar", "local", "local-tree", "stream", "tree", "tree-verify")  # simplest first
REMOTE_MODES = ("stream", "tree", "tree-verify")
CHAIN_KS = tuple(range(1, 9))  # k a chain set-up is predicted at
TREE_DEPTH = max(CHAIN_KS)  # the deepest tree a tree-verifying round may send (auto's most drafts a round)
TREE_KS = (1, 2, 3, 4)  # the tree's Monte Carlo per k costs more: a shorter range
FILL_ROWS, FILL_FANOUT = 8, 3  # fill's branches: eight a pass, three candidates a position
TREE_ROUNDS = 400  # the trees' Monte Carlos (planning.ahead.ceiling, planning.ahead.tree_verify), seeded


@dataclass(frozen=True)
class Setup:
    """One way of decoding: a mode, its k, and for a remote mode the worker (a profile machine's name)."""

    mode: str
    k: int = 0
    worker: str = ""

    @property
    def remote(self) -> bool:
        """Whether a worker drafts."""
        return self.mode in REMOTE_MODES

    @property
    def label(self) -> str:
        """How tables and logs name it: ``AR``, ``local SD k=2``, ``tree → M1 Max k=2``."""
        if self.mode == "ar":
            return "AR"
        if self.mode == "local":
            return f"local SD k={self.k}"
        if self.mode == "local-tree":
            return "local tree SD"
        if self.mode == "tree-verify":
            return f"tree-verify → {self.worker}"
        return f"{self.mode} → {self.worker} k={self.k}"


@dataclass(frozen=True)
class Predicted:
    """A set-up and the model's decode tok/s for it."""

    setup: Setup
    tok_s: float


def at_k(profile: Profile, k: int, mean_accepted: float | None = None) -> Profile:
    """``profile`` with its acceptance stated at ``k`` (the same per-draft rate)."""
    if k == profile.k and mean_accepted is None:
        return profile
    alpha = planned.acceptance(profile).profile[0]
    return replace(profile, k=k, mean_accepted=Acceptance((alpha,)).expected_accepted(k))


def predict_setup(profile: Profile, setup: Setup) -> float:
    """Decode tok/s of ``setup`` on ``profile``'s machines (module docstring)."""
    target = planned.target(profile)
    if setup.mode == "ar":
        return ar_tok_s(target)
    if setup.mode == "local-tree":
        return local_tree(profile, setup.k).tok_s
    p = at_k(profile, setup.k)
    acceptance, link = planned.acceptance(p), planned.link(p)
    if setup.mode == "local":
        assert profile.local_draft is not None
        return predict(
            target, 1 / profile.local_draft.decode_tok_s, acceptance, setup.k, link, Transport("local")
        ).tok_s
    machine = profile.machine(setup.worker)
    assert machine.draft is not None
    draft_s = 1 / machine.draft.decode_tok_s
    if setup.mode == "tree":
        return planned.tree(p, machine, setup.k, TREE_ROWS, TREE_ROUNDS).tok_s
    if setup.mode == "tree-verify":
        return remote_tree(profile, [machine], setup.k, curve_tree_rows(machine.draft), TREE_ROUNDS).tok_s
    if setup.mode == "stream":
        transport = planned.stream(p)
    elif setup.mode == "fill":
        rows_s = machine.draft.pass_s(1, FILL_ROWS)
        transport = planned.fill(
            p, draft_s, setup.k, batch=FILL_ROWS, batch_draft_s=rows_s, fanout=FILL_FANOUT
        )
    else:
        raise ValueError(f"unknown mode {setup.mode!r}; expected one of {', '.join(MODES)} or fill")
    return predict(target, draft_s, acceptance, setup.k, link, transport).tok_s


def candidates(
    profile: Profile,
    greedy: bool = True,
    modes: Iterable[str] = MODES,
    no_tree: Iterable[str] = (),
    trees: bool = True,
) -> list[Setup]:
    """Every set-up ``profile``'s machines can run in ``modes``: local modes need the target machine's
    draft model, a worker's tree a worker not in ``no_tree`` (windowed layers); a chain of its first
    choices greedy decoding, and tree verification ``trees`` (the target and the local draft can pass
    over a tree), at any temperature."""
    modes, no_tree = set(modes), set(no_tree)
    has_local = profile.local_draft is not None
    out = [Setup("ar")] if "ar" in modes else []
    if has_local and "local" in modes:
        out += [Setup("local", k) for k in CHAIN_KS]
    if has_local and greedy and trees and "local-tree" in modes:
        out.append(Setup("local-tree", TREE_DEPTH))
    for machine in _drafting(profile.workers):
        for mode in REMOTE_MODES:
            if mode not in modes or (mode != "stream" and not has_local):
                continue
            if mode != "stream" and machine.name in no_tree:
                continue
            if mode == "tree-verify":  # verified by the target's draws at T > 0
                if trees:
                    out.append(Setup(mode, TREE_DEPTH, machine.name))
                continue
            if mode == "tree" and not greedy:  # a chain of the tree's first choices
                continue
            out += [Setup(mode, k, machine.name) for k in (TREE_KS if mode == "tree" else CHAIN_KS)]
    return out


def ranked(profile: Profile, setups: Iterable[Setup]) -> list[Predicted]:
    """``setups`` predicted on ``profile``, fastest first (a tie goes to the simpler set-up)."""
    predicted = [Predicted(s, predict_setup(profile, s)) for s in setups]
    return sorted(predicted, key=lambda p: (-round(p.tok_s, 6), MODES.index(p.setup.mode), p.setup.k))


def best_per_mode(predictions: Iterable[Predicted]) -> list[Predicted]:
    """The fastest k of each (mode, worker), fastest first."""
    best: dict[tuple[str, str], Predicted] = {}
    for p in predictions:
        key = (p.setup.mode, p.setup.worker)
        if key not in best or p.tok_s > best[key].tok_s:
            best[key] = p
    return sorted(best.values(), key=lambda p: -p.tok_s)


def _drafting(machines: Iterable[Machine]) -> list[Machine]:
    return [m for m in machines if m.draft is not None]
