"""A hardware profile (``specwire.emulation.profile``) as the performance model takes it.

The profile is shared with ``--pace`` and lives in ``specwire``; here its
numbers become the model's inputs: the target's verification, acceptance,
the link, and each backend's transport.
"""

from __future__ import annotations

from dataclasses import replace

from coordinator.planning.ahead.ceiling import Ceiling, Worker, ceiling
from coordinator.planning.ahead.prespec import Outcomes, fill_schedule, schedule
from coordinator.planning.model import Acceptance, Link, Target, Transport
from specwire.drafting.ahead.prespec_config import DEFAULT_FANOUT
from specwire.emulation.profile import Machine, PassCurve, Profile


def target(profile: Profile) -> Target:
    """The target's verification pass on the target machine."""
    curve = profile.target
    return Target(1 / curve.decode_tok_s, curve.per_position_s)


def acceptance(profile: Profile) -> Acceptance:
    """A constant per-draft rate with the profile's mean accepted per round at its k."""
    return Acceptance.constant_for(profile.mean_accepted, profile.k)


def link(profile: Profile) -> Link:
    """The network between the machines."""
    return Link(profile.link_rtt_s, profile.link_bandwidth_Bps)


def per_op(
    profile: Profile, calls_per_pass: float | None = None, bytes_per_pass: float | None = None
) -> Transport:
    """The per-op baseline: a call per operation by default."""
    calls = profile.ops_per_pass if calls_per_pass is None else calls_per_pass
    nbytes = calls * profile.bytes_per_call if bytes_per_pass is None else bytes_per_pass
    return Transport("ggml-rpc", per_call_s=profile.per_call_s, calls_per_pass=calls, bytes_per_pass=nbytes)


def stream(profile: Profile, hit: float = 0.0, partial: float = 0.0) -> Transport:
    """The stream protocol (with pre-speculation when ``hit`` or ``partial`` is set)."""
    return Transport(
        "stream+prespec" if hit or partial else "stream",
        per_round_s=profile.stream_per_round_s,
        bytes_per_round=profile.stream_bytes_per_round,
        hit=hit,
        partial=partial,
    )


def prespec(
    profile: Profile,
    draft_s: float,
    k: int | None = None,
    batch: int = 1,
    batch_draft_s: float | None = None,
    fanout: int = 0,
) -> Transport:
    """The stream protocol with pre-speculation: what a worker drafting a pass in ``draft_s`` gets
    done before each verdict comes back (``planning.ahead.prespec``), from the profile's acceptance and
    agreement (the worker computes on a thread of its own, so it answers a hit mid-pass). ``batch``:
    branches drafted side by side, a pass of them taking ``batch_draft_s``."""
    k = profile.k if k is None else k
    ahead_s = draft_s if batch_draft_s is None else batch_draft_s
    s = schedule(
        _outcomes(profile),
        k,
        ahead_s,
        window(profile, k),
        fanout=fanout or DEFAULT_FANOUT,
        batch=batch,
    )
    return replace(
        stream(profile),
        backend="stream+prespec",
        hit=s.hit,
        partial=s.partial,
        in_flight_s=s.in_flight_s,
        on_demand_passes=s.on_demand_passes,
    )


def fill(
    profile: Profile,
    draft_s: float,
    k: int | None = None,
    batch: int = 1,
    batch_draft_s: float | None = None,
    fanout: int = 0,
) -> Transport:
    """Fill mode: a worker drafting a pass in ``draft_s`` answers with what is ready, and the target
    machine's own draft model drafts the rest (``planning.ahead.prespec.fill_schedule``). The worker
    computes on a thread of its own, so it answers a Round without waiting for the pass in flight."""
    k = profile.k if k is None else k
    if profile.local_draft is None:
        raise ValueError(f"profile {profile.name} gives the target machine no draft model to fill with")
    local_s = 1 / profile.local_draft.decode_tok_s
    ahead_s = draft_s if batch_draft_s is None else batch_draft_s
    s = fill_schedule(
        _outcomes(profile),
        k,
        draft_s,
        ahead_s,
        local_s,
        window(profile, k),
        fanout=fanout or DEFAULT_FANOUT,
        batch=batch,
    )
    return replace(
        stream(profile),
        backend="stream+prespec+fill",
        hit=s.hit,
        partial=s.partial,
        fill_passes=s.filled,
        fill_draft_s=local_s,
        in_flight_s=0.0,
    )


def tree(profile: Profile, machine: Machine, k: int, batch: int, rounds: int, seed: int = 0) -> Ceiling:
    """Tree pre-speculation as built (``specwire.drafting.ahead.draft_tree``): ``machine`` expands the
    likeliest nodes of one tree, ``batch`` a pass, at any depth; each round verifies k drafts, the target
    machine's own draft model drafting those not ready; a worker learns a draft only by expanding the node
    before it. The ceiling's Monte Carlo with those two restrictions (``planning.ahead.ceiling``)."""
    if profile.local_draft is None:
        raise ValueError(f"profile {profile.name} gives the target machine no draft model to fill with")
    return ceiling(
        _outcomes(profile),
        [Worker(_curve(machine).pass_s, batch)],
        k,
        lambda kk: window(profile, kk),
        1 / profile.local_draft.decode_tok_s,
        rounds=rounds,
        seed=seed,
        choose_k=False,
        push=False,
    )


def window(profile: Profile, k: int) -> float:
    """From a worker's answer to the next verdict reaching it, drafting aside: verification, the
    engine, the link and the protocol."""
    t = target(profile)
    return t.verify_s(k + 1) + t.engine_s + link(profile).rtt_s + profile.stream_per_round_s


def _outcomes(profile: Profile) -> Outcomes:
    """The verdicts' probabilities: the profile's acceptance and the pair's agreement."""
    return Outcomes(acceptance(profile).profile[0], profile.agreement)


def ceilings(profile: Profile, rows: int, k_max: int = 8, rounds: int = 2000) -> list[dict[str, object]]:
    """The most drafting off the critical path can give (``planning.ahead.ceiling``): each worker alone and
    all together, at ``rows`` rows a pass and at the widest pass that costs no more than one row; then a
    worker as fast as the target machine's own draft model, for scale."""
    if profile.local_draft is None:
        return []
    local = profile.local_draft
    machines = [m for m in profile.workers if m.draft is not None]
    sets: list[tuple[str, list[PassCurve]]] = [(m.name, [_curve(m)]) for m in machines]
    if len(machines) > 1:
        sets.append((" + ".join(m.name for m in machines), [_curve(m) for m in machines]))
    sets.append((f"one as fast as the {profile.target_machine.name}'s draft", [local]))
    out: list[dict[str, object]] = []
    for name, curves in sets:
        for wide in (False, True):
            workers = [Worker(curve.pass_s, _widest(curve) if wide else rows) for curve in curves]
            c = ceiling(
                _outcomes(profile),
                workers,
                k_max,
                lambda k: window(profile, k),
                1 / local.decode_tok_s,
                rounds=rounds,
            )
            out.append(
                {"workers": name, "rows": [w.rows for w in workers], "tok_s": c.tok_s, "mean_k": c.mean_k}
                | {"ready": {str(r): f for r, f in c.ready.items()}}
            )
    return out


def _curve(machine: Machine) -> PassCurve:
    assert machine.draft is not None
    return machine.draft


def _widest(curve: PassCurve, most: int = 256) -> int:
    """The most rows a pass can hold at the cost of one (the curve's flat part)."""
    one = curve.pass_s(1, 1)
    return max(n for n in range(1, most + 1) if curve.pass_s(1, n) <= one * (1 + 1e-9))
