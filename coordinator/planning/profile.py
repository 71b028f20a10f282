"""A hardware profile: a set-up's speeds as the model takes them, built in (the paper's) or from JSON.

``coordinator plan --profile FILE`` reads a JSON object; only the target's
speed, the drafting machines' speeds and acceptance are required, and the
protocol's costs default to this project's loopback measurements (as the
paper's profile uses them):

    {
      "name": "my Macs",
      "target_tok_s": 42.4,              # AR decode tok/s of the target
      "verify_per_position_ms": 0.0,     # extra verify time per position (Metal: ~0)
      "local_draft_tok_s": 140.2,        # draft model on the target machine (optional)
      "workers": {"M1 Max": 86.6},       # draft model tok/s on each drafting machine
      "mean_accepted": 1.78, "k": 4,     # drafts accepted per round, at k
      "link": {"rtt_ms": 0.3, "bandwidth_MBps": 125},
      "per_op": {"ops_per_pass": 1737, "per_call_ms": 0.55, "bytes_per_call": 471, "logits_bytes": 993280},
      "stream": {"per_round_ms": 2.07, "bytes_per_round": 87}
    }
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from coordinator.planning.model import Acceptance, Link, Target, Transport
from specwire.errors import InvalidArgumentError

# This project's protocol costs, measured on loopback (README: "The per-op baseline",
# "One stream round, part by part"); a profile file may replace them.
PER_CALL_S = 0.55e-3
BYTES_PER_CALL = 471
STREAM_PER_ROUND_S = 2.07e-3
STREAM_BYTES_PER_ROUND = 87


@dataclass(frozen=True)
class Profile:
    """Speeds of one set-up: the target machine, the drafting machines, the link, and the protocol."""

    name: str
    target_tok_s: float
    workers: dict[str, float]
    mean_accepted: float
    k: int
    verify_per_position_s: float = 0.0
    local_draft_tok_s: float | None = None
    link: Link = field(default_factory=Link)
    ops_per_pass: float = 0.0
    per_call_s: float = PER_CALL_S
    bytes_per_call: float = BYTES_PER_CALL
    logits_bytes: float = 0.0
    stream_per_round_s: float = STREAM_PER_ROUND_S
    stream_bytes_per_round: float = STREAM_BYTES_PER_ROUND

    def target(self) -> Target:
        """The target's verification pass."""
        return Target(1 / self.target_tok_s, self.verify_per_position_s)

    def acceptance(self) -> Acceptance:
        """A constant per-draft rate with the profile's mean accepted per round at its k."""
        return Acceptance.constant_for(self.mean_accepted, self.k)

    def per_op(self, calls_per_pass: float | None = None, bytes_per_pass: float | None = None) -> Transport:
        """The per-op baseline: a call per operation by default."""
        calls = self.ops_per_pass if calls_per_pass is None else calls_per_pass
        nbytes = calls * self.bytes_per_call if bytes_per_pass is None else bytes_per_pass
        return Transport("ggml-rpc", per_call_s=self.per_call_s, calls_per_pass=calls, bytes_per_pass=nbytes)

    def stream(self, hit: float = 0.0, partial: float = 0.0) -> Transport:
        """The stream protocol (with pre-speculation when ``hit`` or ``partial`` is set)."""
        return Transport(
            "stream+prespec" if hit or partial else "stream",
            per_round_s=self.stream_per_round_s,
            bytes_per_round=self.stream_bytes_per_round,
            hit=hit,
            partial=partial,
        )

    @classmethod
    def load(cls, path: Path) -> Profile:
        """A profile from a JSON file (see the module docstring), or a clear error."""
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise InvalidArgumentError(f"cannot read the profile {path}: {err}") from err
        try:
            return cls._from_json(data, path.stem)
        except (KeyError, TypeError, ValueError, ZeroDivisionError, AttributeError) as err:
            raise InvalidArgumentError(
                f"{path}: not a usable profile ({type(err).__name__}: {err}); "
                "it needs target_tok_s, workers {name: draft tok/s}, mean_accepted and k"
            ) from err

    @classmethod
    def _from_json(cls, data: dict[str, Any], default_name: str) -> Profile:
        link, per_op, stream = data.get("link", {}), data.get("per_op", {}), data.get("stream", {})
        profile = cls(
            name=str(data.get("name", default_name)),
            target_tok_s=float(data["target_tok_s"]),
            workers={str(k): float(v) for k, v in dict(data["workers"]).items()},
            mean_accepted=float(data["mean_accepted"]),
            k=int(data["k"]),
            verify_per_position_s=float(data.get("verify_per_position_ms", 0.0)) / 1e3,
            local_draft_tok_s=float(data["local_draft_tok_s"]) if data.get("local_draft_tok_s") else None,
            link=Link(float(link.get("rtt_ms", 0.3)) / 1e3, float(link.get("bandwidth_MBps", 125.0)) * 1e6),
            ops_per_pass=float(per_op.get("ops_per_pass", 0.0)),
            per_call_s=float(per_op.get("per_call_ms", PER_CALL_S * 1e3)) / 1e3,
            bytes_per_call=float(per_op.get("bytes_per_call", BYTES_PER_CALL)),
            logits_bytes=float(per_op.get("logits_bytes", 0.0)),
            stream_per_round_s=float(stream.get("per_round_ms", STREAM_PER_ROUND_S * 1e3)) / 1e3,
            stream_bytes_per_round=float(stream.get("bytes_per_round", STREAM_BYTES_PER_ROUND)),
        )
        if profile.target_tok_s <= 0 or not profile.workers or min(profile.workers.values()) <= 0:
            raise ValueError("speeds must be > 0, with at least one worker")
        if profile.link.bandwidth_Bps <= 0 or profile.link.rtt_s < 0:
            raise ValueError("the link needs bandwidth_MBps > 0 and rtt_ms >= 0")
        if not 0 <= profile.mean_accepted <= profile.k or profile.k < 1:
            raise ValueError(f"mean_accepted must be within 0..k (k = {profile.k} >= 1)")
        return profile
