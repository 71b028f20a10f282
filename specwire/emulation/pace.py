"""Paced compute: every forward pass runs for real, then is held until a profiled Mac would be done.

``--pace PROFILE:MACHINE`` (``worker serve``, and the coordinator's commands
that compute) makes this process one machine of a hardware profile
(``specwire.emulation.profile``): each forward pass computes its real logits and
tokens, and the thread that computes is then held until the profile's time
for a pass of that shape has passed (``PassCurve.pass_s``: positions and
sequences). The device is busy exactly as long as that machine's GPU would
be, and everything around it (threads, sessions, protocol, network) is real.

A pass whose real compute takes longer than its paced time is an overrun:
it cannot be held back to the profile, so the emulation is slower than the
Mac there. Every ``Pacer`` counts its passes and overruns; the bench shows
them and refuses a row where more than ``MAX_OVERRUN_SHARE`` of the passes
overran ("pace not held").

Every pacer also keeps each pass's *headroom*, its real compute as a share of
its paced time, in a histogram of ``HEADROOM_BUCKET``-wide buckets
(``PaceCounts.headroom``): the median and p99 say how close a row came to not
being held, which an overrun count alone does not.

Holding sleeps until just before the deadline (the sleep's measured
overshoot is learnt and subtracted) and spins the rest, so a pass ends within
tens of microseconds of its paced time without burning a core for it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import mlx.core as mx

from specwire.emulation.paper import load_profile
from specwire.emulation.profile import Machine, PassCurve, Profile
from specwire.errors import InvalidArgumentError

if TYPE_CHECKING:  # loading brings in mlx-lm, which a worker's flags (--pace) must not pay for
    from specwire.models.loading import LoadedModel

MAX_OVERRUN_SHARE = 0.01
HEADROOM_BUCKET = 0.02  # of the paced time: a pass's real share is counted to this resolution
HEADROOM_BUCKETS = 100  # up to twice the paced time; the last bucket also holds every share beyond
ROUND_POSITIONS = 33  # the most positions a round's pass has: k + 1 at the protocol's largest k
_OVERSHOOT_WEIGHT = 0.1  # of the newest sample, in the running estimate of the sleep's overshoot


def headroom_bucket(real_s: float, paced_s: float) -> int:
    """The headroom bucket of a pass whose real compute took ``real_s`` of its ``paced_s``."""
    share = real_s / paced_s if paced_s > 0 else float("inf")
    return min(HEADROOM_BUCKETS - 1, int(share / HEADROOM_BUCKET))


def headroom_quantile(counts: Sequence[int], q: float) -> float | None:
    """The ``q`` quantile of a headroom histogram, as a share of the paced time: the upper edge of the
    bucket that holds it (so never below the true value); None for no passes."""
    total = sum(counts)
    if not total:
        return None
    rank = q * total
    seen = 0
    for i, n in enumerate(counts):
        seen += n
        if n and seen >= rank:
            return (i + 1) * HEADROOM_BUCKET
    return len(counts) * HEADROOM_BUCKET


def counted(histogram: Sequence[int], buckets: Sequence[int]) -> list[int]:
    """``histogram`` with one more pass in each of ``buckets`` (bucket indices, as a worker sends them)."""
    out = list(histogram)
    for bucket in buckets:
        if bucket >= len(out):
            out.extend([0] * (bucket + 1 - len(out)))
        out[bucket] += 1
    return out


def buckets_of(histogram: Sequence[int]) -> list[int]:
    """The bucket of each pass a histogram counts (the inverse of ``counted`` from nothing)."""
    return [i for i, n in enumerate(histogram) for _ in range(n)]


def add_headroom(a: Sequence[int], b: Sequence[int], sign: int = 1) -> list[int]:
    """Two headroom histograms added (``sign`` -1: ``b`` taken from ``a``), trailing zeros dropped."""
    n = max(len(a), len(b))
    out = [(a[i] if i < len(a) else 0) + sign * (b[i] if i < len(b) else 0) for i in range(n)]
    while out and not out[-1]:
        out.pop()
    return out


@dataclass
class PaceCounts:
    """A pacer's tally: passes held, passes that overran, their real and paced seconds, and the
    histogram of their headroom (real over paced, by ``HEADROOM_BUCKET``)."""

    passes: int = 0
    overruns: int = 0
    real_s: float = 0.0
    paced_s: float = 0.0
    worst_overrun_s: float = 0.0
    headroom: list[int] = field(default_factory=list)

    def since(self, earlier: PaceCounts) -> PaceCounts:
        """What was counted after ``earlier`` (a copy taken before)."""
        return PaceCounts(
            self.passes - earlier.passes,
            self.overruns - earlier.overruns,
            self.real_s - earlier.real_s,
            self.paced_s - earlier.paced_s,
            self.worst_overrun_s,
            add_headroom(self.headroom, earlier.headroom, -1),
        )


class Pacer:
    """Holds the passes of one model on one machine to that machine's curve, and counts them."""

    def __init__(self, curve: PassCurve, label: str) -> None:
        self.curve = curve
        self.label = label
        self.counts = PaceCounts()
        self._overshoot_s = 1e-4
        self._lock = threading.Lock()

    def snapshot(self) -> PaceCounts:
        """A copy of the counts now."""
        with self._lock:
            return replace(self.counts, headroom=list(self.counts.headroom))

    def hold(self, started: float, paced_s: float) -> bool:
        """Wait until ``started + paced_s`` (``time.perf_counter`` seconds); True if that had passed."""
        now = time.perf_counter()
        deadline = started + paced_s
        if now >= deadline:
            return now > deadline
        sleep_s = deadline - now - self._overshoot_s
        if sleep_s > 0:
            time.sleep(sleep_s)
            woke = time.perf_counter()
            late = woke - (now + sleep_s)
            self._overshoot_s += _OVERSHOOT_WEIGHT * (late - self._overshoot_s)
        while time.perf_counter() < deadline:
            pass
        return False

    def record(self, real_s: float, paced_s: float, overran: bool) -> None:
        """Count one pass."""
        with self._lock:
            c = self.counts
            c.passes += 1
            c.real_s += real_s
            c.paced_s += paced_s
            c.headroom = counted(c.headroom, [headroom_bucket(real_s, paced_s)])
            if overran:
                c.overruns += 1
                c.worst_overrun_s = max(c.worst_overrun_s, real_s - paced_s)

    def run_pass(self, started: float, positions: int, sequences: int = 1) -> None:
        """Hold a pass that began at ``started`` and has just computed, then count it."""
        paced = self.curve.pass_s(positions, sequences)
        real = time.perf_counter() - started
        self.record(real, paced, self.hold(started, paced))


class PacedModel:
    """An mlx-lm model whose every call computes for real, then is held to its pacer's time.

    Attributes other than the call (``layers``, ``make_cache``, ``model``, ...)
    are the wrapped model's, so mlx-lm's helpers and the per-op executor see it
    as they see the model itself.

    A caller that derives more from a pass than its logits (a drafter's argmax
    and top candidates) calls with ``defer=True`` and then ``settle(arrays)``:
    those arrays are computed inside the pass's paced time, as a GPU would
    compute them with the pass, and the hold comes after them.
    """

    def __init__(self, model: Any, pacer: Pacer) -> None:
        self.inner = model
        self.pacer = pacer
        self._open: tuple[float, int, int] | None = None

    def __call__(self, inputs: mx.array, cache: Any = None, defer: bool = False, **kwargs: Any) -> mx.array:
        if self._open is not None:  # a deferred pass nobody settled: it ends before this one starts
            self.settle()
        started = time.perf_counter()
        out = self.inner(inputs, cache=cache, **kwargs)
        sequences, positions = inputs.shape[0], inputs.shape[1]
        if defer:
            self._open = (started, positions, sequences)
            return out
        # The pass's work is done inside its paced time: the cache it extends, and the logits of a
        # pass the size of a round (a draft, a verification); a prefill's are left lazy, as its
        # caller never reads them.
        mx.eval(*_arrays(cache), *([out] if positions <= ROUND_POSITIONS else []))
        self.pacer.run_pass(started, positions, sequences)
        return out

    def settle(self, *arrays: Any) -> None:
        """Compute ``arrays`` (derived from the deferred pass) and hold the pass to its paced time."""
        mx.eval(*arrays)
        if self._open is not None:
            started, positions, sequences = self._open
            self._open = None
            self.pacer.run_pass(started, positions, sequences)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def hold_pass(model: Any, started: float, positions: int, *computed: Any, sequences: int = 1) -> None:
    """A pass run over ``model``'s modules rather than through its call (a recurrent model's pass that
    keeps per-position states): compute ``computed`` (arrays, or caches and lists of them), and if
    ``model`` is paced, hold the pass over ``sequences`` of ``positions`` that began at ``started`` to its
    paced time, as its call would."""
    mx.eval(*_arrays(list(computed)))
    if isinstance(model, PacedModel):
        model.pacer.run_pass(started, positions, sequences)


def _arrays(tree: Any) -> list[mx.array]:
    """The arrays in a cache (a list of layer caches, whose ``state`` nests arrays, lists and None)."""
    if isinstance(tree, mx.array):
        return [tree]
    if isinstance(tree, (list, tuple)):
        return [a for item in tree for a in _arrays(item)]
    state = getattr(tree, "state", None)
    return _arrays(state) if state is not None else []


@dataclass(frozen=True)
class Pace:
    """One machine of a profile, to be emulated by this process."""

    profile: Profile
    machine: Machine

    @property
    def label(self) -> str:
        """``PROFILE:MACHINE`` as ``--pace`` names it, such as ``paper:m1-max``."""
        return f"{self.profile.name}:{self.machine.key}"

    def draft_curve(self) -> PassCurve:
        """The draft model's curve on this machine, or a clear error."""
        if self.machine.draft is None:
            raise InvalidArgumentError(
                f"--pace {self.label}: the profile gives no draft-model speed for {self.machine.name}"
            )
        return self.machine.draft

    def target_curve(self) -> PassCurve:
        """The target model's curve on this machine, or a clear error."""
        if self.machine.target is None:
            raise InvalidArgumentError(
                f"--pace {self.label}: {self.machine.name} is a drafting machine of profile "
                f"{self.profile.name}; the target runs on {self.profile.target_machine.key}"
            )
        return self.machine.target


def parse_pace(text: str) -> Pace:
    """``PROFILE:MACHINE`` (``paper:m1-max``, or ``my-macs.json:m1-max``), or a clear error."""
    name, sep, machine = text.rpartition(":")
    if not sep or not name or not machine:
        raise InvalidArgumentError(
            f"--pace {text!r}: expected PROFILE:MACHINE, such as paper:m1-max "
            "(PROFILE: paper, m2-ultra-27b, m2-ultra-70b or a file)"
        )
    profile = load_profile(name)
    return Pace(profile, profile.machine(machine))


def pace_model(model: LoadedModel, pacer: Pacer) -> LoadedModel:
    """``model`` with every forward pass held by ``pacer``."""
    return replace(model, model=PacedModel(model.model, pacer))  # type: ignore[arg-type]
