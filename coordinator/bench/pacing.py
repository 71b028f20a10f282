"""Paced rows (``--pace``, and workers serving with ``--pace``): passes, overruns, and whether the pace held.

A row's passes are counted where they ran: the coordinator's pacers (target,
local draft) over the row's runs, and each paced worker's, from the session
counters it sent back. A side whose overruns exceed ``MAX_OVERRUN_SHARE`` of
its passes did not hold the pace: its figures are slower than the machine it
emulates, and the bench says so and fails unless told to allow it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from specwire.emulation.pace import MAX_OVERRUN_SHARE

NOT_HELD = f"PACE NOT HELD (over {MAX_OVERRUN_SHARE:.0%} of a side's passes overran)"


@dataclass(frozen=True)
class Tally:
    """Paced passes and the passes among them that overran."""

    passes: int = 0
    overruns: int = 0

    @property
    def held(self) -> bool:
        """At most ``MAX_OVERRUN_SHARE`` of the passes overran."""
        return self.overruns <= MAX_OVERRUN_SHARE * self.passes

    def text(self) -> str:
        """``123 passes, 0 overruns``."""
        return f"{self.passes} passes, {self.overruns} overrun{'s' if self.overruns != 1 else ''}"


@dataclass(frozen=True)
class PaceFigures:
    """One row's paced passes: the coordinator's by role, and the workers' by worker."""

    coordinator: dict[str, Tally] = field(default_factory=dict)
    workers: dict[str, Tally] = field(default_factory=dict)

    @property
    def held(self) -> bool:
        """Every side held its pace."""
        return all(t.held for t in [*self.coordinator.values(), *self.workers.values()])

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
            t = coordinator.get(role, Tally())
            coordinator[role] = Tally(t.passes + int(counts["passes"]), t.overruns + int(counts["overruns"]))
    coordinator = {role: t for role, t in coordinator.items() if t.passes}
    workers = {
        name: Tally(c["worker_paced_passes"], c.get("worker_pace_overruns", 0))
        for name, c in per_worker.items()
        if c.get("worker_paced_passes")
    }
    if not coordinator and not workers:
        return None
    return PaceFigures(coordinator, workers)


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
