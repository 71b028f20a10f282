"""The bench's tables (text and Markdown) and its JSON.

Table 1 follows the paper's Table 11: decode tok/s, Δ vs AR, Δ vs local SD,
and the effective draft tok/s including transport next to the drafter's own
speed; then acceptance, TTFT and the lossless check, and under it the proof
of remote execution for every remote row. Table 2 attributes the drafting
time to network, protocol and compute. Table 3 gives latency and memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from coordinator.bench.pacing import pace_lines
from coordinator.bench.summary import RowSummary

Table = tuple[list[str], list[list[str]]]


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value:+.1%}"


def _num(value: float | None, fmt: str = ".2f") -> str:
    return "–" if value is None else format(value, fmt)


def _lossless(s: RowSummary) -> str:
    if s.spec.kind == "ar":
        return "reference"
    if s.lossless and s.ties:
        return f"yes ({len(s.ties)} tie{'s' if len(s.ties) > 1 else ''})"
    return {True: "yes", False: "NO", None: "n/a (T>0)"}[s.lossless]


def _tps(s: RowSummary) -> str:
    """A row's decode tok/s, or what it is instead when a worker was lost or refused (no figure)."""
    if s.measured:
        return f"{s.decode_tps:.2f}"
    return "NOT MEASURED" if s.measured_share == 0 else f"PARTLY ({s.measured_share:.0%})"


def not_measured_lines(rows: Sequence[RowSummary]) -> list[str]:
    """Why each row without a figure has none: its workers were lost or refused for part of its run."""
    return [
        f"{s.spec.label}: {s.measured_share:.0%} of its tokens decoded as set up; {s.not_measured}. "
        "No figure, ratio or comparison uses this row, and Tables 2-4 leave it out."
        for s in rows
        if not s.measured
    ]


def throughput_table(rows: Sequence[RowSummary]) -> Table:
    """The paper's Table 11 layout, extended (with a Pace column when any row is paced)."""
    head = [
        "Draft backend",
        "Avg TPS",
        "Δ AR",
        "Δ Local",
        "Draft tok/s†",
        "Local draft tok/s",
        "Accept",
        "Mean acc",
        "TTFT s",
        "Lossless",
    ]
    body = [
        [
            s.spec.label,
            _tps(s),
            _pct(s.delta_vs_ar),
            _pct(s.delta_vs_local)
            if s.spec.kind in ("remote", "auto", "local-tree")
            else ("baseline" if s.spec.kind == "local" else "–"),
            _num(s.effective_draft_tps if s.measured else None),
            _num(s.local_draft_tps),
            "–" if s.acceptance_rate is None else f"{s.acceptance_rate:.1%}",
            _num(s.mean_accepted),
            f"{s.ttft_s:.2f}" if s.measured else "–",
            _lossless(s),
        ]
        for s in rows
    ]
    if any(s.pace is not None for s in rows):
        head.append("Pace")
        for s, line in zip(rows, body, strict=True):
            line.append("–" if s.pace is None else ("held" if s.pace.held else "NOT HELD"))
    return head, body


def _counts(c: dict[str, Any]) -> str:
    """Client and worker counts of one session, side by side."""
    if "client_ops" in c:
        return f"calls {c['client_calls']}/{c['worker_graphs']}, ops {c['client_ops']}/{c['worker_ops']}"
    return (
        f"messages {c.get('client_messages_sent')}/{c.get('worker_messages_received')} up, "
        f"{c.get('client_messages_received')}/{c.get('worker_messages_sent')} down, "
        f"draft tokens {c.get('client_draft_tokens')}/{c.get('worker_draft_tokens')}, "
        f"forward passes {c.get('worker_forward_passes')}"
    )


def proof_lines(rows: Sequence[RowSummary]) -> list[str]:
    """For every remote row: which process drafted, and whether its counters match the client's; for
    the drafting policy's row, the workers its sessions ran on and whether each matched."""
    lines = []
    for s in rows:
        if s.spec.kind not in ("remote", "auto"):
            continue
        ident, c = s.identity, s.counters
        verdict = "verified" if s.verified and ident.get("session_identities_match") else "NOT VERIFIED"
        if s.pace is not None and s.pace.workers:
            verdict += "; paced " + ", ".join(f"{n}: {t.text()}" for n, t in s.pace.workers.items())
        if s.worker_losses:
            verdict += f"; {s.worker_losses} worker loss(es), see the JSON"
        if not s.measured:
            verdict += f"; NOT MEASURED ({s.measured_share:.0%} of its tokens as set up)"
        if s.spec.kind == "auto":
            workers = ", ".join(ident.get("workers", [])) or "none (it drafted here)"
            lines.append(
                f"{s.spec.label}: {ident.get('sessions', 0)} worker sessions on {workers}: {verdict}"
            )
            continue
        lines.append(
            f"{s.spec.label}: worker {ident.get('name')} at {ident.get('address')} "
            f"on host {ident.get('host')}, pid {ident.get('pid')}, boot {ident.get('boot_id')}; "
            f"client/worker {_counts(c)}: {verdict}"
        )
    return lines


def attribution_table(rows: Sequence[RowSummary]) -> Table:
    """Network, protocol and compute per draft token and per generated token."""
    head = [
        "Backend → worker",
        "Calls/draft tok",
        "Bytes/draft tok",
        "Network ms",
        "Protocol ms",
        "Compute ms",
        "Net ms/tok",
        "Proto ms/tok",
        "Comp ms/tok",
    ]
    body = []
    for s in rows:
        if s.attribution is None:
            continue
        d, t = s.attribution.per("draft"), s.attribution.per("token")
        body.append(
            [
                s.spec.label,
                _num(d.get("calls"), ".2f"),
                _num(d.get("bytes"), ",.0f"),
                _num(d.get("network_ms"), ".3f"),
                _num(d.get("protocol_ms"), ".3f"),
                _num(d.get("compute_ms"), ".2f"),
                _num(t.get("network_ms"), ".3f"),
                _num(t.get("protocol_ms"), ".3f"),
                _num(t.get("compute_ms"), ".2f"),
            ]
        )
    return head, body


def latency_table(rows: Sequence[RowSummary], coordinator_rss: int, worker_rss: dict[str, int]) -> Table:
    """TTFT, inter-token latency and peak memory."""
    head = [
        "Row",
        "TTFT s",
        "ITL p50 ms",
        "ITL p95 ms",
        "ITL p99 ms",
        "Coordinator peak RSS MB",
        "Worker peak RSS MB",
    ]
    body = [
        [
            s.spec.label,
            f"{s.ttft_s:.2f}",
            _num(s.itl_ms.get("p50"), ".1f"),
            _num(s.itl_ms.get("p95"), ".1f"),
            _num(s.itl_ms.get("p99"), ".1f"),
            f"{coordinator_rss / 2**20:.0f}",
            f"{worker_rss[s.spec.worker] / 2**20:.0f}" if s.spec.worker in worker_rss else "–",
        ]
        for s in rows
    ]
    return head, body


def render_text(table: Table) -> str:
    """Aligned columns: text left, numbers right."""
    head, body = table
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body, strict=True)]
    lines = []
    for i, row in enumerate([head, *body]):
        cells = [
            c.ljust(w) if j == 0 else c.rjust(w) for j, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def render_markdown(table: Table) -> str:
    """A Markdown table."""
    head, body = table
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join("---" for _ in head) + " |"]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    return "\n".join(lines)


def report_sections(
    rows: Sequence[RowSummary], coordinator_rss: int, worker_rss: dict[str, int], settings: dict[str, Any]
) -> list[tuple[str, Table | list[str]]]:
    """The report as titled sections: tables, or lines of text."""
    paced = f" (paced as {settings['pace']})" if settings.get("pace") else ""
    title = (
        f"Table 1. Speculative decoding, target {settings['target']}{paced}, k = {settings['k']}, "
        f"{settings['max_tokens']} tokens, T = {settings['temperature']}, {settings['prompts']} prompts × "
        f"{settings['repeats']} repeats (decode tok/s: median over repeats, mean over prompts)"
    )
    answer = headline(rows)
    shown = [s for s in rows if s.measured]  # Tables 2-4: a row a worker failed has no figures
    return [
        *([(answer, [])] if answer else []),
        (title, throughput_table(rows)),
        ("† effective draft tok/s including transport (drafts over the engine's wait for them)", []),
        *(
            [("Rows not measured (a worker lost or refused)", missing)]
            if (missing := not_measured_lines(rows))
            else []
        ),
        ("Proof of remote execution", proof_lines(rows)),
        *_pace_section(rows, settings),
        (
            "Table 2. Where drafting time goes, per draft token (and per generated token)",
            attribution_table(shown),
        ),
        ("Table 3. Latency and memory", latency_table(shown, coordinator_rss, worker_rss)),
        (
            "Table 4. Drafting on the critical path, per round, and pre-speculation "
            "(hit: drafts served from a branch drafted ahead)",
            critical_path_table(shown),
        ),
        *auto_section(rows),
        *rollback_section(shown),
    ]


def _pace_section(
    rows: Sequence[RowSummary], settings: dict[str, Any]
) -> list[tuple[str, Table | list[str]]]:
    lines = pace_lines(rows)
    if not lines:
        return []
    machine = settings.get("pace")
    who = f"the coordinator emulates {machine}" if machine else "the coordinator computes at its own speed"
    return [(f"Paced compute ({who}; emulated machines, not real ones): passes held, overruns", lines)]


def critical_path_table(rows: Sequence[RowSummary]) -> Table:
    """Per drafting round: the engine's wait for drafts, mean k, and what pre-speculation did."""
    head = [
        "Draft backend",
        "Rounds",
        "Mean k",
        "k chosen (rounds)",
        "Draft wait ms/round",
        "Hit rate",
        "Partial",
        "Saved ms/round",
    ]
    body = []
    for s in rows:
        d = s.drafting
        if d is None:
            continue
        body.append(
            [
                s.spec.label,
                str(d.rounds),
                f"{d.k_mean:.2f}",
                " ".join(f"{k}×{n}" for k, n in sorted(d.k_counts.items(), reverse=True)),
                f"{d.critical_ms:.1f}",
                "–" if d.hit_rate is None else f"{d.hit_rate:.1%}",
                "–" if d.partial_rate is None else f"{d.partial_rate:.1%}",
                _num(d.saved_ms, ".1f"),
            ]
        )
    return head, body


def auto_section(rows: Sequence[RowSummary]) -> list[tuple[str, Table | list[str]]]:
    """What the drafting policy ran, by set-up, and how often it moved (each reason is in the JSON)."""
    lines = []
    for s in rows:
        if s.spec.kind != "auto":
            continue
        by_setup = s.counters.get("rounds_by_setup", {})
        total = sum(by_setup.values()) or 1
        ran = ", ".join(
            f"{name} {n / total:.0%}" for name, n in sorted(by_setup.items(), key=lambda i: -i[1])
        )
        lines.append(f"{s.spec.label}: rounds on {ran}; {s.switches} switch(es) after the start")
    return [("The drafting policy (auto): the set-ups it ran, by share of rounds", lines)] if lines else []


def headline(rows: Sequence[RowSummary]) -> str | None:
    """One sentence before the tables: what auto chose, at how many tok/s against AR and against the best
    row without a worker (local SD or local tree SD), and whether the workers pay (None without an auto
    row)."""
    auto = next((s for s in rows if s.spec.kind == "auto"), None)
    if auto is None:
        return None
    if not auto.measured:
        return f"auto was not measured: {auto.not_measured}."
    by_setup = auto.counters.get("rounds_by_setup", {})
    chosen = max(by_setup, key=by_setup.get) if by_setup else "?"
    ar = next(s for s in rows if s.spec.kind == "ar")
    alone = [s for s in rows if s.spec.kind in ("local", "local-tree")]
    best = max(alone, key=lambda s: s.decode_tps, default=None)  # the best set-up without a worker
    versus = f"{auto.decode_tps / ar.decode_tps:.2f}× AR ({ar.decode_tps:.1f})"
    if best is not None:
        versus += f" and {auto.decode_tps / best.decode_tps:.2f}× {best.spec.label} ({best.decode_tps:.1f})"
        versus += ", the best row without a worker"
    remote = "→" in chosen
    pays = (
        "the workers pay"
        if remote and (best is None or auto.decode_tps > best.decode_tps)
        else "the workers do not pay on this set-up: it decodes on this machine alone"
        if not remote
        else "drafting on a worker did not beat the best row without one here"
    )
    return f"auto chose {chosen} and made {auto.decode_tps:.1f} tok/s, {versus}; {pays}."


def rollback_section(rows: Sequence[RowSummary]) -> list[tuple[str, Table | list[str]]]:
    """What rolling back a target with recurrent layers cost, when it has them."""
    lines = []
    for s in rows:
        r = s.rollback
        if r is None:
            continue
        cost = f"{r.ms:.2f} ms each"
        cost += f", {r.replayed:.1f} positions replayed" if r.strategy == "replay" else ""
        if r.strategy == "states":
            cost += f", at most {r.state_mib:.2f} MiB of per-position states held"
        lines.append(f"{s.spec.label}: {r.strategy}; {r.rounds} rounds rolled back ({r.share:.0%}), {cost}")
    title = "The target's recurrent state rolled back after rejected drafts (per round; in the verify time)"
    return [(title, lines)] if lines else []


def render(sections: list[tuple[str, Table | list[str]]], markdown: bool) -> str:
    """All sections as text or Markdown."""
    out = []
    for title, content in sections:
        out.append(f"**{title}**" if markdown else title)
        if isinstance(content, tuple):
            out.append(render_markdown(content) if markdown else render_text(content))
        else:
            out.extend(f"- {line}" if markdown else f"  {line}" for line in content)
        out.append("")
    return "\n".join(out)
