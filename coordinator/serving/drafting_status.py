"""What ``coordinator serve`` drafts with: each worker found (used, or skipped and why) and auto's choice.

``serve`` prints it at start (stderr) and ``/health`` returns it (JSON, to
callers with the API key), so a worker is never dropped without a word.

A worker is *used* when the drafting policy plans with it (``--draft
auto``: the workers of its current planner, which each request re-reads from
the Bonjour directory) or when ``--draft remote`` drafts on it (the named
worker, else the fastest compatible one). Every other worker found is
*skipped*, and the reason is the first that holds: ``--worker`` leaves it
out; its advertisement says it cannot draft (protocol, backend, vocabulary,
no token; ``selection.incompatibility``, the same filter drafting applies);
its Hello says so (it rejects the token, cannot prove its own, serves
another vocabulary, or does not answer: ``workers.survey``, asked once per
worker process and kept); or it is compatible and waits (``remote``: on
standby for a lost worker; ``auto``: found after the policy last planned).

Auto's choice is the set-up a request at T = 0 and at T = 1 starts on, with
the tok/s the performance model predicts for it (``auto.predicted_start``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from coordinator.drafting.auto.policy import predicted_start
from coordinator.drafting.spec import DraftSpec
from coordinator.planning.planner import Planner
from coordinator.serving.scheduler import Scheduler
from coordinator.workers.discovery import WorkerDirectory
from coordinator.workers.selection import incompatibility, is_address
from coordinator.workers.survey import WorkerCheck, check
from specwire.wire.bonjour import WorkerAdvert
from specwire.wire.protocol import BACKEND_STREAM

TEMPERATURES = (0.0, 1.0)  # auto's choice is shown for a greedy request and for OpenAI's default


@dataclass(frozen=True)
class WorkerUse:
    """One worker found on Bonjour: used, or skipped and why."""

    name: str
    address: str
    used: bool
    reason: str  # used: what for; skipped: why

    def to_dict(self) -> dict[str, Any]:
        """As ``/health`` lists it."""
        status = "used" if self.used else "skipped"
        return {"name": self.name, "address": self.address, "status": status, "reason": self.reason}

    def line(self) -> str:
        """As ``serve`` prints it."""
        return f"worker {self.name} at {self.address}: {'used' if self.used else 'skipped'}, {self.reason}"


class DraftingStatus:
    """The workers found and auto's choice, as they stand now, for one server."""

    def __init__(self, scheduler: Scheduler, directory: WorkerDirectory | None) -> None:
        self.scheduler = scheduler
        self.directory = directory
        self._checks: dict[tuple[str, str, int], WorkerCheck] = {}  # by name, address and process

    @property
    def spec(self) -> DraftSpec:
        """What the server drafts with."""
        return self.scheduler.drafting.spec

    async def workers(self) -> list[WorkerUse]:
        """Every worker the Bonjour directory knows now, used or skipped with the reason."""
        if self.directory is None:
            return []
        adverts = self.directory.workers()
        chosen = self._remote_choice(adverts)
        return [await self._use(a, chosen) for a in adverts]

    def auto_choices(self) -> list[dict[str, Any]]:
        """Auto's set-up at T = 0 and T = 1 with its predicted tok/s (empty: not drafting with auto)."""
        planner = self.scheduler.planner
        if self.spec.kind != "auto" or planner is None:
            return []
        out = []
        for t in TEMPERATURES:
            p = predicted_start(planner, t)
            out.append({"temperature": t, "setup": p.setup.label, "predicted_tok_s": round(p.tok_s, 2)})
        return out

    async def to_dict(self) -> dict[str, Any]:
        """What ``/health`` adds: ``workers``, and with auto ``auto`` (its choices)."""
        body: dict[str, Any] = {"workers": [w.to_dict() for w in await self.workers()]}
        choices = self.auto_choices()
        if choices:
            body["auto"] = {"choices": choices}
        return body

    async def lines(self, discover_timeout: float) -> list[str]:
        """What ``serve`` prints at start."""
        spec = self.spec
        if self.directory is None:
            return [f"drafting {spec.kind}: no worker is used"]
        uses = await self.workers()
        lines = [u.line() for u in uses]
        if not uses:
            lines.append(f"no worker answered on Bonjour within {discover_timeout:g} s")
        for c in self.auto_choices():
            lines.append(
                f"auto at T = {c['temperature']:g}: {c['setup']}, predicted {c['predicted_tok_s']:.1f} tok/s"
            )
        return lines

    # Each worker.

    async def _use(self, advert: WorkerAdvert, chosen: WorkerAdvert | None) -> WorkerUse:
        def skipped(reason: str) -> WorkerUse:
            return WorkerUse(advert.name, advert.address, False, reason)

        spec = self.spec
        if spec.workers == ("none",):
            return skipped("--worker none")
        if spec.workers and not _named(advert, spec.workers):
            return skipped(f"not named in --worker ({', '.join(spec.workers)})")
        sources = self.scheduler.sources
        fingerprint, credentials = sources.target.fingerprint, sources.access.credentials
        why = incompatibility(advert, fingerprint, self._backend, credentials)
        if why is not None:
            return skipped(why)
        if spec.kind == "auto" and self._planned(advert):
            return WorkerUse(advert.name, advert.address, True, "auto plans with it")
        found = await self._check(advert)
        if found.why_not is not None:
            return skipped(found.why_not if found.answered else f"token {found.token}: {found.why_not}")
        if spec.kind == "remote" and chosen is not None and chosen.name == advert.name:
            return WorkerUse(
                advert.name, advert.address, True, f"--draft remote drafts on it ({spec.backend})"
            )
        if spec.kind == "remote":
            lead = chosen.name if chosen is not None else "another"
            return skipped(
                f"standby: --draft remote drafts on one worker ({lead}); this one is next if it is lost"
            )
        return skipped("found after auto last planned; the next request plans with it")

    @property
    def _backend(self) -> str:
        return self.spec.backend if self.spec.kind == "remote" else BACKEND_STREAM

    def _planned(self, advert: WorkerAdvert) -> bool:
        """Whether auto's current planner plans with ``advert``'s worker."""
        planner: Planner | None = self.scheduler.planner
        return planner is not None and any(w.address == advert.address for w in planner.measured.workers)

    def _remote_choice(self, adverts: list[WorkerAdvert]) -> WorkerAdvert | None:
        """The worker ``--draft remote`` drafts on: the named one, else the fastest compatible one
        (``selection.choose``'s rule)."""
        if self.spec.kind != "remote":
            return None
        sources = self.scheduler.sources
        fingerprint, credentials = sources.target.fingerprint, sources.access.credentials
        pool = [a for a in adverts if not self.spec.workers or _named(a, self.spec.workers)]
        usable = [a for a in pool if incompatibility(a, fingerprint, self._backend, credentials) is None]
        return max(usable, key=lambda a: a.draft_tps) if usable else None

    async def _check(self, advert: WorkerAdvert) -> WorkerCheck:
        """The worker contacted with a Hello, once per worker process."""
        key = (advert.name, advert.address, advert.pid)
        if key not in self._checks:
            sources = self.scheduler.sources
            target = sources.target
            self._checks[key] = await check(
                advert, target.fingerprint, target.spec, sources.access.credentials
            )
        return self._checks[key]


def _named(advert: WorkerAdvert, selectors: tuple[str, ...]) -> bool:
    """Whether ``--worker`` names ``advert``, by Bonjour name or HOST:PORT."""
    return any(s == advert.name or (is_address(s) and s == advert.address) for s in selectors)
