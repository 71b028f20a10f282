"""An agent loop with tools against ``coordinator serve`` on the paper's emulated Macs, every drafting mode.

The ``openai`` client plays five turns of a tool-using conversation: each a
request with ``tool_choice: "required"`` (the calls it makes are checked:
each parses, names one of three tools, and its arguments validate against
that function's JSON schema), the tools' results sent back, then a request
with ``tool_choice: "auto"`` for the answer. The server is paced as the
M2 Ultra, with two workers paced as the M1 Max and the M2 Pro; the model
pair is a small random-weight Qwen3 pair with the default model's
vocabulary (``tests.support.models.tool_models``: the emulation's tiny models speak
only the vocabulary's first 2,048 ids, where no tool call can be written),
served with a chat template that takes tools. Random weights write
meaningless arguments, which the grammar still keeps valid.

The same conversation runs once per ``--draft`` set-up (the target alone
first), at T = 0: every response must equal the target alone's, token for
token. Each row says who drafted (the worker's name when a worker did), and
whether every paced side held.

    python scripts/measure/agent_tools.py --json docs/runs/agent-tools-DATE.json

Its figures are in ``docs/serving.md#measured-an-agent-loop-and-serve-beside-mlx_lmserver``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import anyio
import jsonschema
import openai
from agent_session import start
from concurrent_requests import held, pinned, server_status, since, start_workers, worker_pace

from tests.support.models.tool_models import TOOLS_TEMPLATE, write_tool_pair

MODES = ["none", "local", "local-tree", "remote:stream", "remote:tree", "remote:tree-verify", "auto"]
SMALL = {"type": "integer", "minimum": 0, "maximum": 999}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 20},
                    "unit": {"enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city", "unit"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "The sum of two numbers.",
            "parameters": {
                "type": "object",
                "properties": {"a": SMALL, "b": SMALL},
                "required": ["a", "b"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search notes for words.",
            "parameters": {
                "type": "object",
                "properties": {
                    "words": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3}
                },
                "required": ["words"],
                "additionalProperties": False,
            },
        },
    },
]  # fmt: skip
QUESTIONS = [
    "What is the weather in Paris?",
    "Add 17 and 25.",
    "Find my notes about the lighthouse.",
    "Is it warmer in Oslo or in Rome?",
    "What is 120 plus 33, and the weather in Tokyo?",
]


def run_tool(call: Any) -> str:
    """A deterministic stand-in for each tool's result."""
    arguments = json.loads(call.function.arguments)
    if call.function.name == "add":
        return str(arguments["a"] + arguments["b"])
    if call.function.name == "get_weather":
        return f"18 degrees {arguments['unit']}, light rain"
    return f"{len(arguments['words'])} notes found"


def check_calls(calls: list[Any]) -> int:
    """Each call parses and its arguments validate against its function's schema; returns how many."""
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    for call in calls:
        jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
    return len(calls)


def drafted_by(figures: dict[str, Any]) -> str:
    """Who drafted a response: the worker's name and pid (its proof), or the set-up."""
    worker = figures.get("worker")
    if isinstance(worker, dict):
        return f"{worker['name']} (pid {worker['pid']})"
    return str(figures.get("draft"))


def conversation(client: openai.OpenAI, turns: int) -> list[dict[str, Any]]:
    """Five turns of call, result, answer; every response's figures."""
    messages: list[Any] = [{"role": "system", "content": "You are a helpful assistant with tools."}]
    out = []
    for question in QUESTIONS[:turns]:
        messages.append({"role": "user", "content": question})
        for choice in ("required", "auto"):
            started = time.perf_counter()
            reply = client.chat.completions.create(
                model="m",
                messages=messages,
                tools=TOOLS,
                tool_choice=choice,
                max_tokens=96,
                temperature=0,  # type: ignore[arg-type]
            )
            seconds = time.perf_counter() - started
            message = reply.choices[0].message
            calls = message.tool_calls or []
            figures = reply.model_extra["specwire"]  # type: ignore[index]
            out.append(
                {
                    "tool_choice": choice,
                    "finish_reason": reply.choices[0].finish_reason,
                    "calls": check_calls(calls),
                    "token_ids": figures["token_ids"],
                    "tok_s": len(figures["token_ids"]) / seconds,
                    "drafted_by": drafted_by(figures),
                    "accepted": figures.get("accepted"),
                    "drafted": figures.get("drafted"),
                    "processing_s": figures.get("processing_s", 0.0),
                    "generation_s": figures.get("generation_s"),
                    "rounds": figures.get("rounds"),
                }
            )
            if choice == "required" and not calls:
                raise SystemExit(f"tool_choice required gave no call: {message.content!r}")
            messages.append(message.model_dump(exclude_none=True))
            for call in calls:
                messages.append({"role": "tool", "tool_call_id": call.id, "content": run_tool(call)})
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modes", default=",".join(MODES), help="the --draft set-ups, the target alone first")
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--unpaced", dest="paced", action="store_false", help="this machine's own speed")
    p.add_argument("--json", type=Path, help="write every figure here")
    args = p.parse_args()
    target, draft = write_tool_pair(Path(tempfile.mkdtemp(prefix="agent-tools-")))
    processes: list[Any] = []
    rows: dict[str, Any] = {}
    try:
        addresses = start_workers(str(draft), args.paced, processes)
        start_up: dict[str, Any] = anyio.run(worker_pace, addresses) if args.paced else {}
        for mode in args.modes.split(","):
            rows[mode] = serve_conversation(args, mode, target, draft, addresses)
        workers = anyio.run(worker_pace, addresses, start_up) if args.paced else {}
    finally:
        for process in processes:
            process.terminate()
            process.wait(60)
    return report(rows, workers, start_up, args)


def serve_conversation(
    args: argparse.Namespace, mode: str, target: Path, draft: Path, addresses: list[str]
) -> dict[str, Any]:
    """The conversation on a fresh server drafting as ``mode``."""
    command = [
        sys.executable,
        "-m",
        "coordinator.cli",
        "serve",
        "--port",
        "0",
        "--json",
        "--target",
        str(target),
    ]
    command += ["--model-name", "m", "--draft", mode, "--local-draft", str(draft), "--interface", "127.0.0.1"]
    command += ["--worker", addresses[0] if mode.startswith("remote") else ",".join(addresses)]
    command += ["--chat-template", str(TOOLS_TEMPLATE), "--prompt-cache-size", "0"]
    command += ["--pace", "paper:m2-ultra"] if args.paced else []
    server, ready = start(pinned(command, 0))
    try:
        start_up = server_status(ready["url"]).get("pace")  # its warm-up's, before it serves
        turns = conversation(openai.OpenAI(base_url=ready["url"], api_key="unused"), args.turns)
        pace = since(server_status(ready["url"]).get("pace"), start_up)  # the conversation's passes
    finally:
        server.terminate()
        server.wait(60)
    return {"turns": turns, "pace": pace, "pace_start_up": start_up}


def report(
    rows: dict[str, Any], workers: dict[str, Any], start_up: dict[str, Any], args: argparse.Namespace
) -> int:
    """Print the table; ``workers``' paced passes are the run's, ``start_up`` those before it."""
    alone = next(iter(rows.values()))["turns"]
    print(f"{'--draft':20}{'calls':>7}{'lossless':>10}{'tok/s':>8}{'accepted':>10}{'mask %':>8}  drafted by")
    ok = True
    for mode, row in rows.items():
        turns = row["turns"]
        same = all(t["token_ids"] == a["token_ids"] for t, a in zip(turns, alone, strict=True))
        calls = sum(t["calls"] for t in turns)
        drafted = sum(t["drafted"] or 0 for t in turns)
        accepted = f"{sum(t['accepted'] or 0 for t in turns) / drafted:.2f}" if drafted else "-"
        mask = 100 * sum(t["processing_s"] for t in turns) / sum(t["generation_s"] for t in turns)
        who = sorted({str(t["drafted_by"]) for t in turns})
        tok_s = statistics.median(t["tok_s"] for t in turns)
        print(
            f"{mode:20}{calls:>7}{'yes' if same else 'NO':>10}{tok_s:>8.1f}{accepted:>10}{mask:>8.1f}  {who}"
        )
        row.update(lossless=same, calls=calls)
        ok &= same
    pace_held = all(held(row["pace"], workers) for row in rows.values()) if args.paced else None
    print(f"every paced side held: {pace_held}")
    if args.json:
        settings = {k: str(v) for k, v in vars(args).items()}
        args.json.write_text(
            json.dumps(
                {
                    "settings": settings,
                    "rows": rows,
                    "workers": workers,
                    "workers_start_up": start_up,
                    "held": pace_held,
                }
            )
        )
    return 0 if ok and pace_held is not False else 1


if __name__ == "__main__":
    sys.exit(main())
