"""``coordinator generate``: generate text with speculative decoding and print its stats."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from typing import Any

import anyio
import numpy as np

from coordinator.commands.options import (
    add_drafting_arguments,
    add_pace_argument,
    add_rollback_argument,
    add_target_argument,
    draft_spec,
    pace_of,
    worker_access,
)
from coordinator.decoding.engine import GenerationResult, SpeculativeDecoder, check_k
from coordinator.detokenizer import TextDecoder
from coordinator.drafting.auto.policy import AUTO_K, AutoDraftSource
from coordinator.drafting.base import DraftSource
from coordinator.drafting.factory import DraftSources
from coordinator.drafting.provenance import drafted_by
from coordinator.pacing import CoordinatorPace
from coordinator.prompts import encode_prompt
from coordinator.runtime import Runtime, coordinator_runtime
from coordinator.strict_json import strict_json
from specwire.drafting.sampling import DEFAULT_DRAFT_TOP_K, SamplingParams
from specwire.emulation.pace import PaceCounts
from specwire.errors import InvalidArgumentError
from specwire.models.loading import LoadedModel, load_model

NAME = "generate"
HELP = "Generate text from a prompt with speculative decoding, and print tok/s, acceptance and the set-up."


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of ``coordinator generate``."""
    p.add_argument("--prompt", help="prompt text (read from stdin when omitted)")
    add_target_argument(p)
    p.add_argument("--max-tokens", type=int, default=128, help="most tokens to generate")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0 = greedy)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling threshold of the target")
    p.add_argument("--top-k", type=int, default=0, help="top-k truncation of the target (0 = off)")
    p.add_argument(
        "--draft-top-k",
        type=int,
        default=DEFAULT_DRAFT_TOP_K,
        help="support size of the draft distribution at T > 0",
    )
    p.add_argument("--seed", type=int, default=0, help="random seed for sampling")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    add_drafting_arguments(p)
    add_rollback_argument(p)
    add_pace_argument(p)


def read_prompt(args: argparse.Namespace) -> str:
    """The prompt from --prompt or stdin."""
    if args.prompt is not None:
        return str(args.prompt)
    if sys.stdin.isatty():
        raise InvalidArgumentError("no prompt: pass --prompt TEXT or pipe text on stdin")
    return sys.stdin.read()


def call_stats(result: GenerationResult) -> dict[str, Any]:
    """Round-trip figures of remote rounds (client wall time; worker compute share of it)."""
    calls = [c for r in result.rounds for c in r.draft.calls if c.kind == "round"]
    if not calls:
        return {}
    wall = np.array([c.wall_ns for c in calls]) / 1e6
    compute = np.array([c.server.compute_ns for c in calls]) / 1e6
    return {
        "round_trips": len(calls),
        "round_trip_ms_mean": float(wall.mean()),
        "round_trip_ms_p95": float(np.percentile(wall, 95)),
        "worker_compute_share": float(compute.sum() / wall.sum()),
        "round_trip_ms_beyond_compute_mean": float((wall - compute).mean()),
    }


def stats_of(result: GenerationResult, k: int) -> dict[str, Any]:
    """The figures the stats line and --json report."""
    stats = {
        "tokens": len(result.tokens),
        "prompt_tokens": result.prompt_tokens,
        "decode_tok_s": result.decode_tps,
        "ttft_s": result.ttft_s,
        "acceptance_rate": result.acceptance_rate,
        "mean_accepted": result.mean_accepted,
        "rounds": len(result.rounds),
        "k": k,
        "finish_reason": result.finish_reason,
    }
    stats.update(call_stats(result))
    if result.rollback is not None and result.rollback.strategy != "trim":
        stats["rollback"] = asdict(result.rollback)
    return stats


def stats_line(stats: dict[str, Any]) -> str:
    """One human-readable line of stats."""
    acc = stats["acceptance_rate"]
    acc_text = "n/a (no drafts)" if acc != acc else f"{acc:.1%}"
    pace = stats.get("pace")
    paced = ""
    if pace:
        overruns = sum(c["overruns"] for c in pace["roles"].values())
        paced = f", PACED as {pace['machine']} ({overruns} overruns)"
    rollback = stats.get("rollback")
    rolled = ""
    if rollback and rollback["rounds"]:
        spent = rollback["rollback_ns"] / 1e6
        rolled = f", {rollback['rounds']} rollbacks ({rollback['strategy']}, {spent:.1f} ms)"
    drafting = stats.get("drafting")
    k_text = f" (k={stats['k']})" if not drafting else ""
    line = (
        f"[specwire] {stats['tokens']} tokens, {stats['decode_tok_s']:.2f} tok/s, "
        f"acceptance {acc_text}{k_text}, TTFT {stats['ttft_s']:.3f} s, "
        f"finish={stats['finish_reason']}{paced}{rolled}"
    )
    return line + ("\n" + drafting_line(drafting) if drafting else "")


def drafting_line(report: dict[str, Any]) -> str:
    """What auto chose and why, and every switch with its reason, in a few lines."""
    chosen = report["chosen"]
    best, *rest = chosen["predicted"]
    nexts = ", ".join(f"{p['setup']} {p['tok_s']:.1f}" for p in rest)
    lines = [
        f"[specwire] drafting: {chosen['setup']}, predicted {best['tok_s']:.1f} tok/s"
        + (f" (next: {nexts})" if nexts else "")
    ]
    for switch in report["switches"][1:]:
        lines.append(
            f"[specwire]   round {switch['round']}: {switch['from_setup']} -> {switch['to_setup']}: "
            f"{switch['reason']}"
        )
    return "\n".join(lines)


def pace_stats(pace: CoordinatorPace, before: dict[str, PaceCounts]) -> dict[str, Any]:
    """What the coordinator's pacers counted since ``before``, by role."""
    now = pace.snapshot()
    return {
        "machine": pace.label,
        "roles": {role: asdict(counts.since(before[role])) for role, counts in now.items()},
    }


def run(args: argparse.Namespace) -> int:
    """Run ``coordinator generate``."""
    params = SamplingParams(args.temperature, args.top_p, args.top_k, args.draft_top_k, args.seed)
    if args.max_tokens < 1:
        raise InvalidArgumentError(f"--max-tokens must be >= 1, got {args.max_tokens}")
    check_k(args.k)  # before any model loads
    text = read_prompt(args)
    pace = pace_of(args)
    return anyio.run(_generate, args, params, text, pace)


async def _generate(
    args: argparse.Namespace, params: SamplingParams, text: str, pace: CoordinatorPace | None
) -> int:
    spec = draft_spec(args)
    async with coordinator_runtime() as runtime:
        target = await runtime.compute.run(load_model, args.target)
        if pace is not None:
            target = pace.target_model(target)
        async with DraftSources(runtime, target, worker_access(args), pace) as sources:
            source = await sources.open(spec)
            local = sources.local_models
            return await _generate_with(args, params, text, runtime, target, source, local, pace)


async def _generate_with(
    args: argparse.Namespace,
    params: SamplingParams,
    text: str,
    runtime: Runtime,
    target: LoadedModel,
    source: DraftSource | None,
    local: list[LoadedModel],
    pace: CoordinatorPace | None = None,
) -> int:
    """Generate with ``source`` and print the text (streamed) or JSON, and the stats."""
    prompt = encode_prompt(target, text, args.chat)
    k = (AUTO_K if isinstance(source, AutoDraftSource) else args.k) if source is not None else 0
    text_out = TextDecoder(target.tokenizer)

    def stream(tokens: list[int]) -> None:
        sys.stdout.write("".join(text_out.add(t) for t in tokens))
        sys.stdout.flush()

    decoder = SpeculativeDecoder(target, source, args.rollback)
    warmup_s = await runtime.compute.run(decoder.warm_up, k, params, local)
    if not args.json:
        print(f"[specwire] warm-up: {warmup_s:.2f} s (kernels of every pass a round uses)", file=sys.stderr)
    before = pace.snapshot() if pace is not None else {}
    result = await runtime.compute.run(
        decoder.generate,
        prompt,
        max_tokens=args.max_tokens,
        k=k,
        params=params,
        on_tokens=None if args.json else stream,
    )
    final_k = source.current.k if isinstance(source, AutoDraftSource) else k
    stats = {**stats_of(result, final_k), **drafted_by(source), "warmup_s": warmup_s}
    if pace is not None:
        stats["pace"] = pace_stats(pace, before)
    if isinstance(source, AutoDraftSource):
        stats["drafting"] = source.report()
    if args.json:
        clean = strict_json(stats)
        out = {
            "text": target.tokenizer.decode(result.tokens),
            "token_ids": result.tokens,
            "stats": clean,
        }
        print(json.dumps(out, indent=2))
    else:
        sys.stdout.write(text_out.finish() + "\n")
        print(stats_line(stats), file=sys.stderr)
    return 0
