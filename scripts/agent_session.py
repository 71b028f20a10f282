"""An agent-like session against ``coordinator serve``: a long shared prefix, then short turns, streamed.

A coding agent re-sends its system prompt, tools and history on every turn.
This script plays one: a system prompt of ``--prefix-tokens`` tokens, then
``--turns`` short user messages, each turn's reply appended to the history,
every request streamed with usage. It runs the session twice on fresh
servers drafting on one worker, with the prompt cache and without it
(``--prompt-cache-size 0``), and prints per turn: the time to the first
token as the client sees it, the prompt tokens the target and the worker's
session took from their caches, the worker's prefill, and whether the
output equals the run without the cache. Paced (the default) the target
runs as the paper's M2 Ultra and the worker as its M1 Max, on 127.0.0.1.

    python scripts/agent_session.py --json agent-session.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from specwire.models.loading import load_tokenizer  # noqa: E402

TOOL = (
    "Tool {i}: search_{i}(path: str, pattern: str, context: int = 2) -> list[Match]. Searches every file "
    "under path for lines that match the regular expression pattern and returns each match with its file, "
    "line number and the lines around it. Use it before editing code you have not read."
)


def prefix_of(tokens: int) -> str:
    """A system prompt of about ``tokens`` tokens: tool descriptions, as an agent's are."""
    tokenizer = load_tokenizer("default")
    parts: list[str] = ["You are a coding agent. These are your tools."]
    while len(tokenizer.encode(" ".join(parts))) < tokens:
        parts.append(TOOL.format(i=len(parts)))
    return " ".join(parts)


def start(command: list[str]) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    """Start a process that prints a JSON ready line; return it and the line."""
    env = {**os.environ, "SPECWIRE_MDNS_INTERFACES": "127.0.0.1"}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith("{") and json.loads(line).get("event") == "ready":
            return process, json.loads(line)
    raise RuntimeError(f"{command[2:4]} did not start")


def events(reply: Any) -> Iterator[dict[str, Any]]:
    """The JSON chunks of a server-sent event stream, ``[DONE]`` left out."""
    for raw in reply:
        line = raw.decode().strip()
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[6:])


def turn(url: str, messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    """One streamed chat request: its text, time to the first token, and the usage chunk's figures."""
    body = {
        "model": "tiny",
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    headers = {"Content-Type": "application/json"}
    request = urllib.request.Request(
        f"{url}/chat/completions", data=json.dumps(body).encode(), headers=headers
    )
    started = time.perf_counter()
    ttft, text, last = None, [], {}
    with urllib.request.urlopen(request, timeout=600) as reply:
        for chunk in events(reply):
            for choice in chunk.get("choices", []):
                piece = choice.get("delta", {}).get("content")
                if piece:
                    ttft = ttft if ttft is not None else time.perf_counter() - started
                    text.append(piece)
            if chunk.get("usage"):
                last = chunk
    figures = last.get("specwire", {})
    return {
        "ttft_s": ttft,
        "text": "".join(text),
        "prompt_tokens": last["usage"]["prompt_tokens"],
        "cached_tokens": last["usage"]["prompt_tokens_details"]["cached_tokens"],
        "worker_cached_tokens": figures.get("worker_cached_tokens"),
        "worker_prefill_s": figures.get("worker_prefill_s"),
        "token_ids": figures.get("token_ids"),
    }


def session(args: argparse.Namespace, worker: str, prefix: str, cache: bool) -> dict[str, Any]:
    """The whole session on a fresh server; with or without the prompt cache."""
    command = [sys.executable, "-m", "coordinator.cli", "serve", "--port", "0", "--json", "--target", "tiny"]
    command += ["--model-name", "tiny", "--draft", "remote", "--worker", worker, "--interface", "127.0.0.1"]
    command += ["--prompt-cache-size", "10" if cache else "0"]
    command += ["--pace", "paper:m2-ultra"] if args.paced else []
    server, ready = start(command)
    try:
        messages = [{"role": "system", "content": prefix}]
        turns = []
        for i in range(args.turns):
            messages.append({"role": "user", "content": f"Turn {i + 1}: which tool finds the word 'cache'?"})
            result = turn(ready["url"], messages, args.max_tokens)
            messages.append({"role": "assistant", "content": result["text"]})
            turns.append(result)
        with urllib.request.urlopen(ready["url"].removesuffix("/v1") + "/v1/status", timeout=30) as reply:
            status = json.loads(reply.read())
        return {"turns": turns, "prompt_cache": status.get("prompt_cache")}
    finally:
        server.terminate()
        server.wait(60)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prefix-tokens", type=int, default=10_000, help="tokens of the shared system prompt")
    p.add_argument("--turns", type=int, default=8, help="user turns")
    p.add_argument("--max-tokens", type=int, default=32, help="tokens each reply may take")
    p.add_argument("--unpaced", dest="paced", action="store_false", help="this machine's own speed")
    p.add_argument("--json", type=Path, help="write every figure here")
    args = p.parse_args()
    prefix = prefix_of(args.prefix_tokens)
    worker_command = [sys.executable, "-m", "worker.cli", "serve", "--model", "tiny-draft", "--port", "0"]
    worker_command += ["--echo-port", "0", "--name", f"agent-session-{os.getpid()}", "--no-advertise"]
    worker_command += ["--json"]
    worker_command += ["--pace", "paper:m1-max"] if args.paced else []
    worker, ready = start(worker_command)
    try:
        address = f"127.0.0.1:{ready['port']}"
        cached, plain = session(args, address, prefix, True), session(args, address, prefix, False)
    finally:
        worker.terminate()
        worker.wait(60)
    print(f"agent session: {args.turns} turns after a {args.prefix_tokens:,}-token prefix, streamed, T = 0")
    print("turn  prompt  cached  worker cached  TTFT s  (no cache)  worker prefill s  (no cache)  same")
    for i, (a, b) in enumerate(zip(cached["turns"], plain["turns"], strict=True)):
        same = a["token_ids"] == b["token_ids"]
        print(
            f"{i + 1:>4}  {a['prompt_tokens']:>6}  {a['cached_tokens']:>6}  {a['worker_cached_tokens']:>13}  "
            f"{a['ttft_s']:>6.3f}  {b['ttft_s']:>10.3f}  {a['worker_prefill_s']:>16.3f}  "
            f"{b['worker_prefill_s']:>10.3f}  {'yes' if same else 'NO'}"
        )
    print(f"prompt cache at the end: {json.dumps(cached['prompt_cache'])}")
    if args.json:
        args.json.write_text(json.dumps({"settings": vars(args) | {"json": str(args.json)}, "cached": cached,
                                         "plain": plain}, indent=1))  # fmt: skip
    same = all(a["token_ids"] == b["token_ids"] for a, b in zip(cached["turns"], plain["turns"], strict=True))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
