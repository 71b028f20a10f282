"""Hardware profiles: how fast each machine of a set-up runs a forward pass, and what joins them.

One format serves ``coordinator plan --profile`` (predicting a set-up) and
``--pace PROFILE:MACHINE`` (emulating one of its machines, ``specwire.emulation.pace``).
``paper`` is built in (the paper's three Macs, ``specwire.emulation.paper``), and so are
``m2-ultra-27b`` and ``m2-ultra-70b`` (the same Macs with a 27B or 70B target,
``specwire.emulation.big_targets``); any other is a JSON file:

    {
      "name": "my Macs",
      "target_machine": "M2 Ultra",        # the coordinator's machine (default "target")
      "target_tok_s": 42.4,                # the target's decode tok/s there (one position a pass)
      "target_prefill_tok_s": 1163.9,      # its prompt tok/s, once a pass is compute-bound (optional)
      "verify_per_position_ms": 0.0,       # extra time per position (optional; Metal: about 0)
      "local_draft_tok_s": 140.2,          # the draft model on the target machine (optional)
      "local_draft_prefill_tok_s": 7410.7, # (optional)
      "workers": {"M1 Max": 86.6,          # draft tok/s on each drafting machine, or an object
                  "M2 Pro": {"draft_tok_s": 62.9, "prefill_tok_s": 2045.7}},
      "mean_accepted": 1.78, "k": 4,       # drafts accepted per round, at k
      "agreement": {"top1": 0.70, "top2": 0.85, "top4": 0.93},  # optional, see below
      "link": {"rtt_ms": 0.3, "bandwidth_MBps": 125},
      "per_op": {"ops_per_pass": 1737, "per_call_ms": 0.55, "bytes_per_call": 471, "logits_bytes": 993280},
      "stream": {"per_round_ms": 2.07, "bytes_per_round": 87}
    }

A pass over ``n`` positions of ``B`` sequences takes (``PassCurve``)

    max(1 / decode_tok_s + (n B - 1) * per_position, n B / prefill_tok_s)

Decoding is bound by reading the weights, once per pass whatever it
computes, until the pass has enough positions to be bound by compute, at
the prompt-processing rate: a roofline. The paper (seeds/000) measured both
ends on its Macs (Tables 5, 6 and 11) and says that verifying k + 1
positions costs about one on Metal (section 4.5.1). A pass over B sequences
computes B positions as a pass over B positions of one sequence does (the
attention over B caches aside), so the same curve gives it; MLX on an M3
Ultra decodes 4 sequences of a 0.9B model in the time of one (mlx-vlm pull
request 2153: 5.94, 5.74 and 5.96 ms a step at B = 1, 2 and 4).

``agreement`` is how often the target's next token is the draft's first
choice, within its two and within its four most likely (at T = 0, along the
target's own output): what pre-speculation's branches are guessed from.
Optional ``top8`` (within its eight: a worker's tree keeps eight choices a
node) and ``draw1`` (at T > 0, how often the target's draw is the draft's
first choice: a tree is verified by the target's draws) refine the tree
predictions where they were measured.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from specwire.errors import InvalidArgumentError

# This project's protocol costs, measured on loopback (docs/per-op-baseline.md, docs/protocol.md);
# a profile file may replace them.
PER_CALL_S = 0.55e-3
BYTES_PER_CALL = 471
STREAM_PER_ROUND_S = 2.07e-3
STREAM_BYTES_PER_ROUND = 87
DEFAULT_TARGET_MACHINE = "target"


SAME_COST = 1.05  # a measured pass within this of another's costs the same (the measuring noise)


def non_decreasing(points: Sequence[tuple[int, float]]) -> list[tuple[int, float]]:
    """Measured (rows, seconds) of passes, smallest first, each no slower than a wider one's: a pass over
    fewer positions does not cost more, and a cold first measurement can (a paced M1 Max's 1-row pass
    read 16.4 ms against 12.1 at 16 rows)."""
    out: list[tuple[int, float]] = []
    for rows, seconds in sorted(points, reverse=True):
        out.append((rows, min(seconds, out[-1][1]) if out else seconds))
    return out[::-1]


def measured_pass_s(points: Sequence[tuple[int, float]], rows: int) -> float:
    """A pass over ``rows`` rows by measured, non-decreasing ``points`` (smallest first): interpolated,
    and past the last in proportion to it (0 without points)."""
    if not points:
        return 0.0
    last_rows, last_s = points[-1]
    if rows > last_rows:
        return last_s * rows / last_rows
    return float(np.interp(rows, [r for r, _ in points], [s for _, s in points]))


@dataclass(frozen=True)
class PassCurve:
    """How long one forward pass of one model takes on one machine, by its shape (module docstring)."""

    decode_tok_s: float
    prefill_tok_s: float | None = None
    per_position_s: float = 0.0

    def pass_s(self, positions: int = 1, sequences: int = 1) -> float:
        """Seconds of a pass over ``positions`` positions of each of ``sequences`` sequences."""
        n = max(1, positions * sequences)
        seconds = 1 / self.decode_tok_s + (n - 1) * self.per_position_s
        if self.prefill_tok_s:
            seconds = max(seconds, n / self.prefill_tok_s)
        return seconds


@dataclass(frozen=True)
class Machine:
    """One machine of a set-up: the draft model's curve there, and the target's on the target machine."""

    name: str
    draft: PassCurve | None
    target: PassCurve | None = None

    @property
    def key(self) -> str:
        """The name as ``--pace`` takes it: ``M1 Max`` -> ``m1-max``."""
        return slug(self.name)


def slug(name: str) -> str:
    """Lower case, runs of anything but letters and digits as one hyphen."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


@dataclass(frozen=True)
class Profile:
    """A set-up's machines, the pair's acceptance, the link between machines and the protocol's costs."""

    name: str
    target_machine: Machine
    workers: tuple[Machine, ...]
    mean_accepted: float
    k: int
    link_rtt_s: float = 0.0
    link_bandwidth_Bps: float = float("inf")
    ops_per_pass: float = 0.0
    per_call_s: float = PER_CALL_S
    bytes_per_call: float = BYTES_PER_CALL
    logits_bytes: float = 0.0
    stream_per_round_s: float = STREAM_PER_ROUND_S
    stream_bytes_per_round: float = STREAM_BYTES_PER_ROUND
    agreement: dict[str, float] = field(default_factory=dict)

    @property
    def target(self) -> PassCurve:
        """The target model's curve on the target machine."""
        assert self.target_machine.target is not None
        return self.target_machine.target

    @property
    def local_draft(self) -> PassCurve | None:
        """The draft model's curve on the target machine, if the profile gives one."""
        return self.target_machine.draft

    @property
    def machines(self) -> tuple[Machine, ...]:
        """Every machine: the target machine first."""
        return (self.target_machine, *self.workers)

    def hosts(self, machines: Sequence[str] = ()) -> list[tuple[str, Machine]]:
        """The drafting hosts of an emulated set-up, as (host name, machine): each of ``machines`` (this
        profile's drafting machines, by name or key; repeats allowed; none: each drafting machine once),
        a host named after its machine, its second ``-2``, and so on."""
        chosen = [self.machine(key) for key in machines] or list(self.workers)
        for machine in chosen:
            if machine not in self.workers:
                raise InvalidArgumentError(
                    f"{machine.name} is profile {self.name}'s target machine; its drafting machines are "
                    + ", ".join(m.key for m in self.workers)
                )
        seen: dict[str, int] = {}
        hosts = []
        for machine in chosen:
            seen[machine.key] = seen.get(machine.key, 0) + 1
            count = seen[machine.key]
            hosts.append((machine.key if count == 1 else f"{machine.key}-{count}", machine))
        return hosts

    @staticmethod
    def host_label(host: str, machine: Machine) -> str:
        """How a host of ``hosts`` names itself: its machine's name, and a second one's "M1 Max 2"."""
        return machine.name if host == machine.key else f"{machine.name} {host.rsplit('-', 1)[-1]}"

    def machine(self, key: str) -> Machine:
        """The machine ``key`` names (``m1-max`` or ``M1 Max``), or a clear error listing them."""
        for machine in self.machines:
            if machine.key == slug(key):
                return machine
        known = ", ".join(m.key for m in self.machines)
        raise InvalidArgumentError(f"profile {self.name} has no machine {key!r}; it has {known}")

    @classmethod
    def load(cls, path: Path) -> Profile:
        """A profile from a JSON file (see the module docstring), or a one-line error naming the field."""
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise InvalidArgumentError(f"cannot read the profile {path}: {err}") from err
        if not isinstance(data, dict):
            raise InvalidArgumentError(f"profile {path}: expected a JSON object")
        try:
            return from_json(data, path.stem)
        except _FieldError as err:
            raise InvalidArgumentError(f"profile {path}: {err}") from None


class _FieldError(Exception):
    """A field of a profile that is missing or wrong; the message names it."""


def _number(
    data: dict[str, Any], name: str, default: float | None = None, *, positive: bool = False, where: str = ""
) -> float:
    """``data[name]`` as a number (> 0 when ``positive``, >= 0 otherwise); ``default`` when absent."""
    label = f"{where}{name}"
    if name not in data or data[name] is None:
        if default is None:
            raise _FieldError(f"{label} is missing")
        return default
    value = data[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _FieldError(f"{label} must be a number, got {value!r}")
    if value != value or value in (float("inf"), float("-inf")):
        raise _FieldError(f"{label} must be finite, got {value!r}")
    if positive and value <= 0:
        raise _FieldError(f"{label} must be > 0, got {value!r}")
    if value < 0:
        raise _FieldError(f"{label} must be >= 0, got {value!r}")
    return float(value)


def _section(data: dict[str, Any], name: str) -> dict[str, Any]:
    value = data.get(name, {})
    if not isinstance(value, dict):
        raise _FieldError(f"{name} must be an object, got {value!r}")
    return value


def _optional_rate(data: dict[str, Any], name: str, where: str = "") -> float | None:
    return _number(data, name, positive=True, where=where) if data.get(name) is not None else None


def _worker(name: str, value: Any) -> Machine:
    where = f"workers.{name}."
    if isinstance(value, dict):
        curve = PassCurve(
            _number(value, "draft_tok_s", positive=True, where=where),
            _optional_rate(value, "prefill_tok_s", where),
        )
    else:
        curve = PassCurve(_number({"draft_tok_s": value}, "draft_tok_s", positive=True, where=where))
    return Machine(str(name), curve)


def from_json(data: dict[str, Any], default_name: str) -> Profile:
    """A profile from parsed JSON; raises ``_FieldError`` naming the first bad field."""
    workers = data.get("workers")
    if not isinstance(workers, dict) or not workers:
        raise _FieldError("workers must be an object {machine name: draft tok/s}, with at least one")
    local = _optional_rate(data, "local_draft_tok_s")
    target = Machine(
        str(data.get("target_machine") or DEFAULT_TARGET_MACHINE),
        PassCurve(local, _optional_rate(data, "local_draft_prefill_tok_s")) if local else None,
        PassCurve(
            _number(data, "target_tok_s", positive=True),
            _optional_rate(data, "target_prefill_tok_s"),
            _number(data, "verify_per_position_ms", 0.0) / 1e3,
        ),
    )
    k = _number(data, "k", positive=True)
    if k != int(k):
        raise _FieldError(f"k must be a whole number, got {k}")
    mean_accepted = _number(data, "mean_accepted")
    if mean_accepted > k:
        raise _FieldError(f"mean_accepted ({mean_accepted}) cannot exceed k ({int(k)})")
    link, per_op, stream = _section(data, "link"), _section(data, "per_op"), _section(data, "stream")
    agreement = _section(data, "agreement")
    shares = {key: _number(agreement, key, where="agreement.") for key in agreement}
    if any(v > 1 for v in shares.values()):
        raise _FieldError("agreement rates must lie within 0..1")
    return Profile(
        name=str(data.get("name") or default_name),
        target_machine=target,
        workers=tuple(_worker(n, v) for n, v in workers.items()),
        mean_accepted=mean_accepted,
        k=int(k),
        link_rtt_s=_number(link, "rtt_ms", 0.3, where="link.") / 1e3,
        link_bandwidth_Bps=_number(link, "bandwidth_MBps", 125.0, positive=True, where="link.") * 1e6,
        ops_per_pass=_number(per_op, "ops_per_pass", 0.0, where="per_op."),
        per_call_s=_number(per_op, "per_call_ms", PER_CALL_S * 1e3, where="per_op.") / 1e3,
        bytes_per_call=_number(per_op, "bytes_per_call", BYTES_PER_CALL, where="per_op."),
        logits_bytes=_number(per_op, "logits_bytes", 0.0, where="per_op."),
        stream_per_round_s=_number(stream, "per_round_ms", STREAM_PER_ROUND_S * 1e3, where="stream.") / 1e3,
        stream_bytes_per_round=_number(stream, "bytes_per_round", STREAM_BYTES_PER_ROUND, where="stream."),
        agreement=shares,
    )
