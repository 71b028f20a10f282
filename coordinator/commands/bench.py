"""``coordinator bench``: the table users quote, measured in one run.

One run measures AR with the target alone, local SD, and remote SD over each
chosen backend and worker, interleaved on the same prompts; prints the
paper's Table 11 layout, the attribution of drafting time to network,
protocol and compute, and latency and memory; and fails (exit 1) when an
output differs from AR at T = 0, a worker's counters do not match, or a row
was not measured as set up (a worker lost or refused: the row prints no figure).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from coordinator.bench.plan import (
    BACKEND_AUTO,
    BACKEND_LOCAL_TREE,
    BACKEND_PRESPEC_TREE,
    STREAM_MODES,
    RemoteWorker,
    SkippedRow,
    connect_workers,
    plan_rows,
    row_draft,
    skipped_worker,
)
from coordinator.bench.plot import write_plot
from coordinator.bench.record import bench_record
from coordinator.bench.report import render, report_sections
from coordinator.bench.runner import Settings, excuse_ties, run_bench
from coordinator.bench.summary import RowSummary, summarize
from coordinator.commands.options import (
    add_credential_arguments,
    add_discover_timeout_argument,
    add_interface_argument,
    add_local_draft_argument,
    add_pace_argument,
    add_rollback_argument,
    add_target_argument,
    add_worker_loss_arguments,
    pace_of,
    worker_access,
)
from coordinator.decoding.engine import SpeculativeDecoder
from coordinator.drafting.auto.policy import AUTO_K
from coordinator.drafting.factory import DraftSources
from coordinator.drafting.ggml_rpc.model import GRANULARITIES
from coordinator.drafting.spec import DraftSpec
from coordinator.prompts import Prompt, encode_prompt, load_prompts
from coordinator.runtime import coordinator_runtime
from coordinator.workers.connection import refresh_hello
from coordinator.workers.selection import find_addresses
from specwire.drafting.ahead.prespec_config import MAX_BATCH, TREE_ROWS
from specwire.drafting.sampling import SamplingParams
from specwire.errors import BenchFailure, InvalidArgumentError, SpecwireError
from specwire.models.loading import load_model
from specwire.process.memory import peak_rss_bytes
from specwire.wire.protocol import BACKEND_PER_OP, BACKEND_STREAM

NAME = "bench"
HELP = "Measure AR, local SD and remote SD per backend and worker in one run, with latency attribution."


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of ``coordinator bench``."""
    p.add_argument(
        "--backend",
        default=f"{BACKEND_AUTO},{BACKEND_STREAM},{BACKEND_PER_OP}",
        help="rows beside AR and local SD, comma-separated: auto (the set-up the drafting policy chooses, "
        "over every worker), local-tree (local tree SD: the local draft model drafts a tree, sized to "
        "the target's measured verification curve, verified in one pass), and per worker stream, "
        "stream+prespec+fill+tree (the worker drafts a tree of likely continuations ahead while the "
        "target verifies and answers at once with what it has ready; the local draft model drafts the "
        "rest; temperature 0), ggml-rpc (the per-op baseline)",
    )
    p.add_argument(
        "--granularity",
        default="op",
        help="ggml-rpc granularities to measure (comma-separated: op,layer,token,round)",
    )
    p.add_argument(
        "--workers",
        "--worker",
        metavar="NAMES",
        default="all",
        help="worker names or HOST:PORT (comma-separated), all discovered, or none (AR and local SD only)",
    )
    add_interface_argument(p)
    add_discover_timeout_argument(p)
    add_target_argument(p)
    add_local_draft_argument(p)
    p.add_argument("--k", type=int, default=4, help="draft tokens per round of the hand-picked rows")
    p.add_argument(
        "--local-k",
        default="",
        help="more local SD rows, at each of these k (comma-separated); the first local SD row, at --k, "
        "stays the baseline",
    )
    p.add_argument(
        "--max-tokens", type=int, default=200, help="tokens generated per prompt (the paper's 200)"
    )
    p.add_argument(
        "--temperature", type=float, default=0.0, help="sampling temperature (0 = greedy, lossless check on)"
    )
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus threshold of the target")
    p.add_argument("--seed", type=int, default=0, help="random seed for sampling")
    p.add_argument("--repeats", type=int, default=1, help="times every row runs every prompt")
    p.add_argument(
        "--prompts", type=Path, help="prompts file (one per line, or JSON lines with category and text)"
    )
    p.add_argument(
        "--no-chat", action="store_true", help="use prompts as raw text, without the chat template"
    )
    p.add_argument("--json", type=Path, help="write every raw figure here")
    p.add_argument("--plot", type=Path, help="write a PNG of the attribution and throughput here")
    p.add_argument("--markdown", type=Path, help="write the tables in Markdown here")
    add_credential_arguments(p)
    add_rollback_argument(p)
    add_pace_argument(p)
    p.add_argument(
        "--allow-overruns",
        action="store_true",
        help="with paced compute: report a row whose pace was not held instead of failing the bench",
    )
    advanced = p.add_argument_group("advanced (the hand-picked rows; auto chooses its own)")
    advanced.add_argument(
        "--rows",
        default="0",
        help="the tree rows: nodes a worker expands side by side in a pass (0: the worker's --tree-rows); "
        "several, comma-separated, give each tree row once for each",
    )
    add_worker_loss_arguments(advanced)


def checked(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """The backends and granularities the flags name, once every flag is checked."""
    backends = [b.strip() for b in args.backend.split(",") if b.strip()]
    granularities = [g.strip() for g in args.granularity.split(",") if g.strip()]
    known = (BACKEND_AUTO, BACKEND_LOCAL_TREE, *STREAM_MODES, BACKEND_PER_OP)
    if not backends or set(backends) - set(known):
        raise InvalidArgumentError(f"--backend {args.backend!r}: use any of {', '.join(known)}")
    if set(granularities) - set(GRANULARITIES) or not granularities:
        raise InvalidArgumentError(
            f"--granularity {args.granularity!r}: use any of {', '.join(GRANULARITIES)}"
        )
    if BACKEND_PRESPEC_TREE in backends and args.temperature > 0:
        raise InvalidArgumentError(f"{BACKEND_PRESPEC_TREE} drafts first choices: it needs --temperature 0")
    pace_of(args)  # a bad --pace is refused before any model loads
    if args.repeats < 1 or args.max_tokens < 1 or not 1 <= args.k <= 32:
        raise InvalidArgumentError("--repeats and --max-tokens must be >= 1, --k within 1..32")
    tree_rows(args)
    return backends, granularities


def tree_rows(args: argparse.Namespace) -> list[int]:
    """``--rows`` as numbers, or a clear error."""
    try:
        rows = [int(n) for n in str(args.rows).split(",") if n.strip()]
    except ValueError:
        rows = []
    if not rows or any(n < 0 or n > MAX_BATCH for n in rows):
        raise InvalidArgumentError(f"--rows {args.rows!r}: one or more of 0..{MAX_BATCH}, comma-separated")
    return rows


def run(args: argparse.Namespace) -> int:
    """Run ``coordinator bench``."""
    backends, granularities = checked(args)
    return anyio.run(_bench, args, backends, granularities)


@dataclass
class Measured:
    """Everything one bench run measured, before it is reported."""

    summaries: list[RowSummary]
    settings: dict[str, Any]
    runs: list
    workers: list[RemoteWorker]
    worker_rss: dict[str, int]
    coordinator_rss: int  # peak, read once when the last row ended
    skipped: list[SkippedRow] = field(default_factory=list)  # rows a worker could not serve, with why

    def record(self) -> dict[str, Any]:
        """The bench JSON (schema specwire.bench/1)."""
        return bench_record(
            self.settings,
            self.summaries,
            self.runs,
            self.workers,
            self.worker_rss,
            self.coordinator_rss,
            self.skipped,
        )


async def _bench(args: argparse.Namespace, backends: list[str], granularities: list[str]) -> int:
    measured = await measure(args, backends, granularities)
    _write(args, measured)
    return _verdict(measured.summaries, args.allow_overruns)


async def measure(
    args: argparse.Namespace, backends: list[str], granularities: list[str], raw_prompt: str | None = None
) -> Measured:
    """Run every row the flags ask for; ``raw_prompt`` replaces the prompts (one, no chat template)."""
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, seed=args.seed)
    access = worker_access(args)
    local = "" if args.local_draft == "none" else args.local_draft
    sizes = tree_rows(args)
    remote = DraftSpec("remote", local=local, rows=sizes[0], on_loss=args.on_worker_loss)
    pace = pace_of(args)
    async with coordinator_runtime() as runtime:
        target = await runtime.compute.run(load_model, args.target)
        if pace is not None:
            target = pace.target_model(target)
        async with DraftSources(runtime, target, access, pace) as sources:
            if local:
                await sources.local_model(local)
            selectors = [s.strip() for s in args.workers.split(",") if s.strip()]
            addresses = (
                []
                if selectors == ["none"]  # AR and local SD only
                else await find_addresses(
                    selectors,
                    target.fingerprint,
                    access.interfaces,  # type: ignore[arg-type]  # mdns_interfaces() output
                    access.discover_timeout,
                    access.credentials,
                )
            )
            workers, unusable = await connect_workers(addresses, backends, sources)
            local_ks = [int(k) for k in args.local_k.split(",") if k.strip()]
            rows, skipped = plan_rows(workers, backends, granularities, bool(local), local_ks, sizes)
            skipped = [skipped_worker(a, why, backends) for a, why in unusable] + skipped
            for s in skipped:
                print(f"bench: {s.line()}", file=sys.stderr, flush=True)
            if raw_prompt is not None:
                prompts = [(Prompt("text", raw_prompt), encode_prompt(target, raw_prompt, chat=False))]
            else:
                chat = not args.no_chat
                prompts = [(p, encode_prompt(target, p.text, chat)) for p in load_prompts(args.prompts)]
            by_name = {w.name: w for w in workers}
            drafts = [row_draft(row, by_name, remote, local) for row in rows]
            run_settings = Settings(args.k, args.max_tokens, params, args.rollback)
            local_drafts = [await sources.local_model(local)] if local else []
            warmup_s = await runtime.compute.run(
                SpeculativeDecoder(target).warm_up, max(args.k, AUTO_K), params, local_drafts
            )
            print(
                f"bench: warm-up {warmup_s:.2f} s (every pass a round uses, before any row)", file=sys.stderr
            )
            runs = await run_bench(runtime, rows, drafts, prompts, args.repeats, run_settings, sources, pace)
            if params.greedy:
                ar_row = next(i for i, r in enumerate(rows) if r.kind == "ar")
                await runtime.compute.run(excuse_ties, target, runs, prompts, ar_row)
            worker_rss = await _peak_rss(workers)
    summaries = summarize(rows, runs, params.greedy, by_name)
    settings = _settings(args, backends, granularities, prompts)
    settings["chat_template"] = settings["chat_template"] and raw_prompt is None
    settings["warmup_s"] = warmup_s
    settings["pace"] = pace.label if pace is not None else None
    return Measured(summaries, settings, runs, workers, worker_rss, peak_rss_bytes(), skipped)


def _settings(
    args: argparse.Namespace, backends: list[str], granularities: list[str], prompts: list
) -> dict[str, Any]:
    return {
        "target": args.target,
        "draft": args.local_draft,
        "k": args.k,
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "seed": args.seed,
        "repeats": args.repeats,
        "rollback": args.rollback,
        "prespec": {"tree_rows": tree_rows(args)[0] or TREE_ROWS, "k": args.k},
        "backends": backends,
        "granularities": granularities,
        "chat_template": not args.no_chat,
        "prompts": len(prompts),
        "prompt_list": [{"category": p.category, "text": p.text, "tokens": len(ids)} for p, ids in prompts],
    }


def _write(args: argparse.Namespace, measured: Measured) -> None:
    m = measured
    sections = report_sections(m.summaries, m.coordinator_rss, m.worker_rss, m.settings)
    if m.skipped:
        sections.append(("Rows skipped (a worker could not serve them)", [s.line() for s in m.skipped]))
    print(render(sections, markdown=False))
    if args.markdown:
        args.markdown.write_text(render(sections, markdown=True))
    if args.json:
        args.json.write_text(json.dumps(measured.record()))
    if args.plot:
        write_plot(measured.summaries, args.plot)


async def _peak_rss(workers: list[RemoteWorker]) -> dict[str, int]:
    """Each worker's peak memory, asked once the rows are done; a worker gone by then is left out (its
    rows say so already), so the measured rows are still reported."""
    rss = {}
    for w in workers:
        try:
            rss[w.name] = (await refresh_hello(w.connection)).counters.peak_rss_bytes
        except SpecwireError as err:
            print(f"bench: {w.name}'s peak memory is unknown: {err}", file=sys.stderr)
    return rss


def _verdict(summaries: list[RowSummary], allow_overruns: bool = False) -> int:
    """Exit code: a lossless mismatch, a row not measured as set up (a worker lost or refused, or its
    counters or identity not matching the client's: ``bench.summary.measured_share``) or (unless allowed) a
    pace not held."""
    broken = [s for s in summaries if s.lossless is False]
    problems = [f"{s.spec.label}: output differs from AR ({'; '.join(s.mismatches[:3])})" for s in broken]
    problems += [f"{s.spec.label}: not measured, {s.not_measured}" for s in summaries if s.not_measured]
    if not allow_overruns:
        problems += [
            f"{s.spec.label}: pace not held, {s.pace.why_not_held()} (this machine computes more slowly "
            "than the one it emulates; --allow-overruns reports it instead)"
            for s in summaries
            if s.pace is not None and not s.pace.held
        ]
    if problems:
        raise BenchFailure("; ".join(problems))
    return 0
