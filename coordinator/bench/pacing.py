"""Paced rows (``--pace``, and workers serving with ``--pace``): passes, overruns, and whether the pace held.

A row's passes are counted where they ran: the coordinator's pacers (target,
local draft) over the row's runs, and each paced worker's, from the session
counters it sent back. A side whose overruns exceed ``MAX_OVERRUN_SHARE`` of
its passes did not hold the pace: its figures are slower than the machine it
emulates, and the bench says so and fails unless told to allow it. Beside the
counts, each side's headroom (a pass's real compute over its paced time,
median and p99) says how close a held row came to not being held.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from specwire.emulation.pace import MAX_OVERRUN_SHARE, add_headroom, headroom_quantile

NOT_HELD = f"PACE NOT HELD (over {MAX_OVERRUN_SHARE:.0%} of a side's passes overran)"


@dataclass(frozen=True)
class Tally:
    """Paced passes, the passes among them that overran, and their headroom histogram
    (``specwire.emulation.pace.PaceCounts.headroom``: passes by real over paced time)."""

    passes: int = 0
    overruns: int = 0
    headroom: tuple[int, ...] = ()

    @property
    def held(self) -> bool:
        """At most ``MAX_OVERRUN_SHARE`` of the passes overran."""
        return self.overruns <= MAX_OVERRUN_SHARE * self.passes

    @property
    def median(self) -> float | None:
        """The median pass's real compute over its paced time (None: no histogram)."""
        return headroom_quantile(self.headroom, 0.5)

    @property
    def p99(self) -> float | None:
        """The 99th percentile of real compute over paced time (None: no histogram)."""
        return headroom_quantile(self.headroom, 0.99)

    def add(self, passes: int, overruns: int, headroom: Sequence[int]) -> Tally:
        """This tally and more passes."""
        return Tally(
            self.passes + passes, self.overruns + overruns, tuple(add_headroom(self.headroom, headroom))
        )

    def text(self) -> str:
        """``123 passes, 0 overruns, real/paced median 0.32, p99 0.48``."""
        text = f"{self.passes} passes, {self.overruns} overrun{'s' if self.overruns != 1 else ''}"
        if self.median is not None and self.p99 is not None:
            text += f", real/paced median {self.median:.2f}, p99 {self.p99:.2f}"
        return text


@dataclass(frozen=True)
class PaceFigures:
    """One row's paced passes: the coordinator's by role, and the workers' by worker."""

    coordinator: dict[str, Tally] = field(default_factory=dict)
    workers: dict[str, Tally] = field(default_factory=dict)

    @property
    def held(self) -> bool:
        """Every side held its pace."""
        return all(t.held for t in [*self.coordinator.values(), *self.workers.values()])

    def to_dict(self) -> dict[str, Any]:
        """Plain data for the bench JSON: each side's counts, headroom histogram, median and p99."""

        def side(t: Tally) -> dict[str, Any]:
            return {**asdict(t), "headroom_median": t.median, "headroom_p99": t.p99, "held": t.held}

        return {
            "coordinator": {role: side(t) for role, t in self.coordinator.items()},
            "workers": {name: side(t) for name, t in self.workers.items()},
            "held": self.held,
        }

    def why_not_held(self) -> str:
        """Which sides overran, and by how much: ``9 of 9 coordinator target passes overran``."""
        sides = [(f"coordinator {role}", t) for role, t in self.coordinator.items()]
        sides += [(f"worker {name}", t) for name, t in self.workers.items()]
        return "; ".join(
            f"{t.overruns} of {t.passes} {side} passes overran" for side, t in sides if not t.held
        )


def pace_figures(runs: Sequence[Any], per_worker: dict[str, dict[str, Any]]) -> PaceFigures | None:
    """A row's figures from its runs (``Run.pace``) and its summed session counters by worker; None if
    unpaced."""
    coordinator: dict[str, Tally] = {}
    for run in runs:
        for role, counts in run.pace.items():
            coordinator[role] = coordinator.get(role, Tally()).add(
                int(counts["passes"]), int(counts["overruns"]), counts.get("headroom", [])
            )
    coordinator = {role: t for role, t in coordinator.items() if t.passes}
    workers = {
        name: Tally().add(
            c["worker_paced_passes"],
            c.get("worker_pace_overruns", 0),
            _histogram(c.get("worker_pace_headroom")),
        )
        for name, c in per_worker.items()
        if c.get("worker_paced_passes")
    }
    if not coordinator and not workers:
        return None
    return PaceFigures(coordinator, workers)


def _histogram(by_bucket: dict[str, int] | None) -> list[int]:
    """A headroom histogram from its buckets by index (as the bench's counters hold it)."""
    if not by_bucket:
        return []
    counts = [0] * (1 + max(int(i) for i in by_bucket))
    for i, n in by_bucket.items():
        counts[int(i)] += n
    return counts


def pace_lines(rows: Sequence[Any]) -> list[str]:
    """One line per paced row: each side's passes and overruns, and whether the pace held."""
    lines = []
    for s in rows:
        p: PaceFigures | None = s.pace
        if p is None:
            continue
        sides = [f"coordinator {role}: {t.text()}" for role, t in p.coordinator.items()]
        sides += [f"worker {name}: {t.text()}" for name, t in p.workers.items()]
        verdict = (
            "held" if p.held else f"PACE NOT HELD (over {MAX_OVERRUN_SHARE:.0%} of a side's passes overran)"
        )
        lines.append(f"{s.spec.label}: {'; '.join(sides)}: {verdict}")
    return lines
