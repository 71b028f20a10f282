"""One source for each figure: every figure the README, docs/ and the CHANGELOG quote from the recorded
headline run is computed here from that run's JSON (``docs/runs/``) and must appear, rounded as quoted, in
each place that quotes it. A figure edited in one place only, or a run replaced without its quotes, fails.

The convention: a quote is a piece of a page's text with ``{}`` fields (``str.format``), filled from the
run's JSON. Pages are compared with ``**`` dropped and runs of whitespace as one space, so line wrapping
and bold do not matter. A ratio is always computed from the same run's rows, never typed in."""

from __future__ import annotations

import functools
import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "docs" / "runs" / "testbed-paper-2026-11-26.json"
# The speculation cache's bound on the paper's Macs: two M1 Max passes a round of 25.5 ms (the M2 Ultra's
# verification and the protocol; docs/tree-verification.md), a figure of the profile, not of the run.
BOUND_TOK_S = 2 / 25.5e-3


@functools.cache
def run() -> dict[str, Any]:
    """The recorded run (``coordinator bench --json`` less its per-run token lists)."""
    return dict(json.loads(RUN.read_text()))


def row(label: str) -> dict[str, Any]:
    """The run's row named ``label`` (the bench's label up to its pace tag)."""
    rows = [r for r in run()["rows"] if r["label"].split(" [paced")[0] == label]
    assert len(rows) == 1, f"{label}: {len(rows)} rows in {RUN.name}"
    return dict(rows[0])


def tok(label: str) -> float:
    return float(row(label)["decode_tok_s"])


def planned(label: str) -> float:
    return float(next(r for r in run()["planned"]["rows"] if r["label"].startswith(label))["predicted_tok_s"])


def share(label: str, setup: str) -> float:
    """The share of an auto row's rounds that ``setup`` served."""
    by_setup = row(label)["counters"]["rounds_by_setup"]
    return float(by_setup[setup] / sum(by_setup.values()))


def pct(x: float) -> str:
    """A signed percentage as the tables print it: +37.5%, −8.4% (a minus sign, not a hyphen)."""
    return f"{'+' if x >= 0 else '−'}{abs(x):.1%}"


def headroom(label: str) -> str:
    """A row's p99 headroom column: the coordinator's draft passes; the worker's ('–' where none)."""
    pace = row(label)["pace"]
    draft = pace["coordinator"].get("draft")
    workers = list(pace.get("workers", {}).values())
    text = f"{draft['headroom_p99']:.2f}" if draft else "–"
    return text + (f"; {workers[0]['headroom_p99']:.2f}" if workers else "")


AR, LOCAL, LOCAL4, TREE, AUTO = "AR (target only)", "local SD", "local SD k=4", "local tree SD", "auto"
VERIFY16, VERIFY64 = "stream+tree-verify ×16 → M1 Max", "stream+tree-verify ×64 → M1 Max"
PRO16, OP = "stream+tree-verify ×16 → M2 Pro", "ggml-rpc/op → M1 Max"
ON_WORKER = "tree-verify → M1 Max"  # auto's set-up on the worker, as its counters name it
NAMES = {LOCAL: "local SD, k = 2", LOCAL4: "local SD, k = 4"}


def table_name(label: str) -> str:
    """A row's name in measurements.md's headline table."""
    if label == AUTO:
        return f"auto ({ON_WORKER} {share(AUTO, ON_WORKER):.0%}, local tree SD {share(AUTO, TREE):.0%})"
    short = label.replace("stream+prespec+fill+tree", "tree").replace("stream+tree-verify", "tree-verify")
    return NAMES.get(label, short)


def table_quotes() -> list[str]:
    """measurements.md's headline table, row by row: measured, vs AR, vs local SD; planned, error, p99."""
    quotes = []
    for r in run()["rows"]:
        label = r["label"].split(" [paced")[0]
        t = tok(label)
        vs_ar = "–" if label == AR else pct(t / tok(AR) - 1)
        vs_local = "–" if label in (AR, LOCAL) else pct(t / tok(LOCAL) - 1)
        quotes.append(f"| {table_name(label)} | {t:.2f} | {vs_ar} | {vs_local} |")
        p = planned(label)
        tail = " – |" if label == AR else f" {headroom(label)} |"
        quotes.append(f"| {p:.2f}{' ³' if label == AUTO else ''} | {pct(p / t - 1)} |{tail}")
    return quotes


def hit(label: str) -> float:
    return float(row(label)["drafting"]["hit_rate"])


def p99_workers(labels: Iterable[str]) -> float:
    return max(next(iter(row(x)["pace"]["workers"].values()))["headroom_p99"] for x in labels)


@dataclass(frozen=True)
class Headline:
    """The run's figures that several pages quote."""

    auto: float = field(default_factory=lambda: tok(AUTO))
    ar: float = field(default_factory=lambda: tok(AR))
    local: float = field(default_factory=lambda: tok(LOCAL))
    tree: float = field(default_factory=lambda: tok(TREE))
    verify16: float = field(default_factory=lambda: tok(VERIFY16))
    verify64: float = field(default_factory=lambda: tok(VERIFY64))
    on: float = field(default_factory=lambda: share(AUTO, ON_WORKER))  # auto's rounds on the M1 Max
    off: float = field(default_factory=lambda: share(AUTO, TREE))
    switches: int = field(default_factory=lambda: int(row(AUTO)["switches"]))
    hits: float = field(default_factory=lambda: hit(AUTO))


def readme(h: Headline) -> list[str]:
    return [
        f"2026-11-26, commit {run()['recorded']['commit']}",
        f"`auto` makes {h.auto:.1f} tok/s: {h.auto / h.tree:.2f}× local tree SD ({h.tree:.1f}), the best "
        f"set-up without a worker, {h.auto / h.ar:.2f}× the target alone ({h.ar:.1f}) and "
        f"{h.auto / h.local:.2f}× local speculative decoding ({h.local:.1f}), drafting on the M1 Max for "
        f"{h.on:.0%} of its rounds",
        f"in one pass (found in {h.hits:.0%} of lookups). The paper's GGML_RPC set-up makes 11.2 and "
        f"specwire's per-op re-creation of it {tok(OP):.1f}.",
        f"two tokens a round, {BOUND_TOK_S:.1f} tok/s or {BOUND_TOK_S / h.tree:.2f}× local tree SD",
        f"made {h.tree / h.local:.2f}× local SD on the emulated M2 Ultra, and `remote:tree-verify` with the "
        f"M1 Max {h.verify16 / h.local:.2f}× too; `auto`, switching between the two, made the headline's "
        f"{h.auto / h.local:.2f}×",
    ]


def measurements(h: Headline) -> list[str]:
    paced = [r["label"].split(" [paced")[0] for r in run()["rows"] if r["pace"].get("workers")]
    drafts = max(r["pace"]["coordinator"].get("draft", {}).get("headroom_p99", 0) for r in run()["rows"])
    stream = [-row(f"stream → {m}")["delta_vs_local"] for m in ("M1 Max", "M2 Pro")]
    return [
        *table_quotes(),
        f"for {h.on:.0%} of its rounds and local tree SD for the rest ({h.switches} switches), and "
        f"{h.hits:.1%} of its M1 Max rounds were served from the worker's speculation cache. It made "
        f"{h.auto / h.tree:.2f}× local tree SD and {h.auto / h.local:.2f}× local SD",
        f"AR is within {1 - h.ar / 42.4:.1%} of the paper's 42.4 tok/s and local SD at k = 4 within "
        f"{1 - tok(LOCAL4) / 53.8:.1%} of its 53.8. The pair accepted "
        f"{row(LOCAL4)['mean_accepted']:.2f} drafts",
        f"Every worker pass stayed at or under {p99_workers(x for x in paced if 'ggml' not in x):.2f} of "
        f"its paced time at p99, the per-op baseline's aside ({p99_workers([OP]):.2f} and "
        f"{p99_workers(['ggml-rpc/op → M2 Pro']):.2f}:",
        f"7.13 ms, reached {drafts:.2f} at most",
        f"The plain stream protocol was {stream[0]:.0%} below local SD on the M1 Max and {stream[1]:.0%} "
        "below on the M2 Pro",
        *speculation_cache(h),
    ]


def speculation_cache(h: Headline) -> list[str]:
    """measurements.md's section on the speculation cache: the headline run's tree rows."""
    errors = [pct(planned(x) / tok(x) - 1) for x in (VERIFY16, VERIFY64, AUTO)]
    return [
        f"AR {h.ar:.2f}, local SD {h.local:.2f}, local tree SD {h.tree:.2f}, auto {h.auto:.2f} (tree "
        f"verification → M1 Max for {h.on:.0%} of its rounds, local tree SD for {h.off:.0%}, {h.hits:.1%} of "
        f"its worker rounds served from the cache), tree verification → M1 Max {h.verify16:.2f} at 16 rows "
        f"a pass ({hit(VERIFY16):.1%} served, {row(VERIFY16)['drafting']['critical_ms']:.1f} ms from a "
        f"verdict to the next verification) and {h.verify64:.2f} at 64 ({hit(VERIFY64):.1%}), → M2 Pro "
        f"{tok(PRO16):.2f} ({hit(PRO16):.1%}:",
        f"(tree verification → M1 Max {errors[0]} and {errors[1]}, auto {errors[2]})",
    ]


def tree_verification(h: Headline) -> list[str]:
    """tree-verification.md's bound and status, which need the run's figures for their argument."""
    return [
        f"{BOUND_TOK_S:.1f} tok/s, {BOUND_TOK_S / h.tree:.2f}× local tree SD ({h.tree:.2f}) at most",
        f"tree verification → M1 Max made {h.verify16 / h.local:.2f}× local SD, {h.verify16:.2f} tok/s "
        f"against {h.local:.2f}, and auto with it {h.auto / h.local:.2f}×, {h.auto:.2f};",
    ]


def planner(h: Headline) -> list[str]:
    return [
        f"auto made {h.auto:.2f} tok/s, {h.auto / h.ar:.2f}× AR ({h.ar:.2f}) and {h.auto / h.local:.2f}× "
        f"local SD at k = 2 ({h.local:.2f}). It ran tree verification → M1 Max for {h.on:.0%} of its "
        f"rounds and local tree SD for {h.off:.0%}, with {h.switches} switches, and beat the best fixed row "
        f"(tree verification → M1 Max, {h.verify16:.2f}; local tree SD {h.tree:.2f}). The profile alone "
        f"predicts local tree SD for it, {planned(AUTO):.2f} ({pct(planned(AUTO) / h.auto - 1)}).",
        f'"auto chose {ON_WORKER} and made {h.auto:.1f} tok/s, {h.auto / h.ar:.2f}× AR ({h.ar:.1f}) and '
        f'{h.auto / h.local:.2f}× local SD ({h.local:.1f}); the workers pay."',
    ]


def changelog(h: Headline) -> list[str]:
    return [
        f"auto {h.auto:.2f} tok/s drafting on the M1 Max ({h.auto / h.tree:.2f}× local tree SD's "
        f"{h.tree:.2f}; {h.hits:.1%} of its worker rounds from the cache), tree verification → M1 Max "
        f"{h.verify16:.2f} at 16 rows and {h.verify64:.2f} at 64",
        f"bounds it at {BOUND_TOK_S:.1f} tok/s ({BOUND_TOK_S / h.tree:.2f}× local tree SD)",
    ]


RUN_27B = ROOT / "docs" / "runs" / "testbed-m2-ultra-27b-2026-11-29-d8e71c8.json"
VERIFY32, PRO32 = "stream+tree-verify ×32 → M1 Max", "stream+tree-verify ×32 → M2 Pro"


@functools.cache
def run_27b() -> dict[str, Any]:
    """The 27B target's recorded run (profile m2-ultra-27b)."""
    return dict(json.loads(RUN_27B.read_text()))


def big_target_tok(label: str) -> float:
    """A row of the 27B target's run, by its label up to the pace tag."""
    rows = [r for r in run_27b()["rows"] if r["label"].split(" [paced")[0] == label]
    assert len(rows) == 1, f"{label}: {len(rows)} rows in {RUN_27B.name}"
    return float(rows[0]["decode_tok_s"])


def readme_27b() -> list[str]:
    tree, m1 = big_target_tok(TREE), big_target_tok(VERIFY32)
    pro, auto = big_target_tok(PRO32), big_target_tok(AUTO)
    best = max(big_target_tok(label) for label in (TREE, VERIFY16, VERIFY32, PRO16, PRO32))
    return [
        f"tree verification → M1 Max, at 32 rows a pass (as wide as costs no more than 16), makes "
        f"{m1:.1f} tok/s, {m1 / tree:.2f}× local tree SD ({tree:.1f}), → M2 Pro {pro:.1f} "
        f"({pro / tree:.2f}×), and the target alone {big_target_tok(AR):.1f}. `auto` made {auto:.1f} "
        f"there, {auto / best:.2f} of the best row",
        f"2026-11-29, commit {run_27b()['recorded']['commit']}, the same VM",
    ]


def test_the_27b_figures_are_that_runs_and_every_row_held_lossless_and_verified() -> None:
    data = run_27b()
    assert data["settings"]["pace"].startswith("m2-ultra-27b")
    assert all(r["lossless"] and r["pace"]["held"] and r["measured"] for r in data["rows"])
    assert all(r["verified"] for r in data["rows"] if r["kind"] in ("remote", "auto"))
    assert missing([("README.md", quote) for quote in readme_27b()], read_page) == []


PAGES = {
    "README.md": readme,
    "docs/measurements.md": measurements,
    "docs/tree-verification.md": tree_verification,
    "docs/planner.md": planner,
    "CHANGELOG.md": changelog,
}


def quotes() -> list[tuple[str, str]]:
    """(page, quoted text) for every figure quoted from the run."""
    h = Headline()
    return [(page, quote) for page, quoted in PAGES.items() for quote in quoted(h)]


def flat(text: str) -> str:
    """A page as quotes are matched: bold dropped, whitespace runs as one space."""
    return re.sub(r"\s+", " ", text.replace("**", ""))


def missing(pairs: Iterable[tuple[str, str]], read: Callable[[str], str]) -> list[str]:
    """The quotes that their page does not hold."""
    return [f"{page}: {quote!r}" for page, quote in pairs if flat(quote) not in flat(read(page))]


def read_page(page: str) -> str:
    return (ROOT / page).read_text()


def test_every_figure_quoted_from_the_headline_run_is_that_runs() -> None:
    assert missing(quotes(), read_page) == []


def test_a_figure_edited_in_one_place_only_fails() -> None:
    a = f"{tok(AUTO):.1f}"
    edited = f"{float(a) + 0.1:.1f}"

    def readme_edited(page: str) -> str:
        text = read_page(page)
        return text.replace(f"makes **{a} tok/s", f"makes **{edited} tok/s") if page == "README.md" else text

    assert readme_edited("README.md") != read_page("README.md")  # the edit took
    assert len(missing(quotes(), readme_edited)) == 1


def test_the_run_is_the_one_the_headline_names_and_every_row_held() -> None:
    recorded = run()["recorded"]
    assert recorded["commit"] == "c295e6a" and recorded["date"] == "2026-11-26"
    assert all(r["lossless"] and r["pace"]["held"] for r in run()["rows"])
    assert {r["label"] for r in run()["rows"]} == {r["label"] for r in run()["planned"]["rows"]}


def test_the_readmes_test_count_is_within_15_percent_of_the_suite(suite_size: int | None) -> None:
    claimed = re.search(r"about (\d+) tests", read_page("README.md"))
    assert claimed is not None
    # The session's own count where it collected the whole suite (make test); else a fresh collection.
    collected = suite_size if suite_size is not None else collected_suite()
    assert abs(int(claimed.group(1)) / collected - 1) <= 0.15


def collected_suite() -> int:
    """How many tests ``pytest --collect-only`` finds from the project root."""
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    ).stdout
    collected = re.search(r"(\d+) tests? collected", out)
    assert collected is not None, out[-2000:]
    return int(collected.group(1))
