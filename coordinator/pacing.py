"""Paced compute on the coordinator: the target and local draft models held to one machine's curves.

``--pace PROFILE:MACHINE`` on ``generate``, ``bench``, ``serve`` and ``plan``
makes the coordinator that machine (``specwire.emulation.pace``): its target model's
passes take the machine's target curve, a local draft model's the machine's
draft curve. Each has a pacer that counts passes and overruns, which the
bench reports per row.
"""

from __future__ import annotations

from dataclasses import dataclass

from specwire.emulation.pace import Pace, PaceCounts, Pacer, pace_model
from specwire.errors import InvalidArgumentError
from specwire.models.loading import LoadedModel


@dataclass
class CoordinatorPace:
    """The machine this coordinator emulates, and a pacer for each role its models play."""

    pace: Pace
    target: Pacer
    draft: Pacer | None

    @classmethod
    def of(cls, pace: Pace) -> CoordinatorPace:
        """Pacers for ``pace``'s machine; it must be one that runs the target."""
        draft = pace.machine.draft
        return cls(
            pace,
            Pacer(pace.target_curve(), f"{pace.label} target"),
            Pacer(draft, f"{pace.label} draft") if draft is not None else None,
        )

    @property
    def label(self) -> str:
        """``PROFILE:MACHINE``."""
        return self.pace.label

    def target_model(self, model: LoadedModel) -> LoadedModel:
        """``model`` paced as the target on this machine."""
        return pace_model(model, self.target)

    def draft_model(self, model: LoadedModel) -> LoadedModel:
        """``model`` paced as the draft model on this machine, or a clear error if it has no draft speed."""
        if self.draft is None:
            raise InvalidArgumentError(
                f"--pace {self.label}: the profile gives no draft-model speed for {self.pace.machine.name}, "
                "so a local draft model cannot be paced there"
            )
        return pace_model(model, self.draft)

    def snapshot(self) -> dict[str, PaceCounts]:
        """Each pacer's counts now, by role."""
        counts = {"target": self.target.snapshot()}
        if self.draft is not None:
            counts["draft"] = self.draft.snapshot()
        return counts
