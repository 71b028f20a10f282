#!/usr/bin/env python3
"""What ``coordinator serve`` adds per request and per streamed token, against ``coordinator generate``.

One interleaved run: each repetition runs ``coordinator generate --json`` on
the prompt, then sends the same prompt to one long-running server as a
streamed chat completion through the ``openai`` client, in turn, so load on
the machine falls on both alike. Reported, as medians:

* TTFT and decode tok/s of ``generate`` (the engine's own figures);
* the same figures of the engine inside the server (the ``specwire`` object);
* TTFT as the client sees it, from sending the request to the first text;
* the server's overhead per request (client TTFT − engine TTFT) and per
  streamed token (client time from first to last text, minus the engine's,
  over the tokens).

Each request's output is checked against ``generate``'s (T = 0).

    python scripts/measure/serve_overhead.py [--target tiny] [--draft local:tiny] [--reps 7] [--json FILE]

Its figures are in ``docs/measurements.md#what-coordinator-serve-adds``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import openai

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="tiny", help="target model spec")
    p.add_argument("--draft", default="local:tiny", help="draft source (as generate and serve take it)")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per generation")
    p.add_argument("--reps", type=int, default=7, help="repetitions of each, interleaved")
    p.add_argument("--json", type=Path, help="write every sample and the medians to this file")
    return p.parse_args()


def run_generate(args: argparse.Namespace) -> dict:
    command = [sys.executable, "-m", "coordinator.cli", "generate", "--target", args.target, "--draft"]
    command += [args.draft, "--chat", "--prompt", PROMPT, "--max-tokens", str(args.max_tokens), "--json"]
    out = subprocess.run(command, capture_output=True, text=True, check=True)
    reply = json.loads(out.stdout)
    return {
        "text": reply["text"],
        "ttft_s": reply["stats"]["ttft_s"],
        "tok_s": reply["stats"]["decode_tok_s"],
    }


def run_served(client: openai.OpenAI, args: argparse.Namespace) -> dict:
    sent = time.perf_counter()
    first = last = 0.0
    pieces, figures, tokens = [], {}, 0
    stream = client.chat.completions.create(
        model=args.target,
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=args.max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            last = time.perf_counter()
            first = first or last
            pieces.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            figures, tokens = chunk.model_extra["specwire"], chunk.usage.completion_tokens
    engine_stream_s = figures["generation_s"] - figures["ttft_s"]
    return {
        "text": "".join(pieces),
        "ttft_s": figures["ttft_s"],
        "tok_s": figures["decode_tok_s"],
        "client_ttft_s": first - sent,
        "request_overhead_s": (first - sent) - figures["ttft_s"],
        "token_overhead_s": ((last - first) - engine_stream_s) / max(tokens - 1, 1),
    }


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen[str], str]:
    command = [
        sys.executable,
        "-m",
        "coordinator.cli",
        "serve",
        "--target",
        args.target,
        "--draft",
        args.draft,
    ]
    command += ["--model-name", args.target, "--port", "0", "--json"]
    env = {**os.environ, "SPECWIRE_MDNS_INTERFACES": os.environ.get("SPECWIRE_MDNS_INTERFACES", "127.0.0.1")}
    server = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
    assert server.stdout is not None
    for line in server.stdout:
        if line.startswith("{") and json.loads(line).get("event") == "ready":
            return server, json.loads(line)["url"]
    raise SystemExit("the server did not start")


def main() -> int:
    args = parse_args()
    server, url = start_server(args)
    try:
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
        run_served(client, args)  # warm-up: first request compiles and fills caches
        samples: dict[str, list[dict]] = {"generate": [], "serve": []}
        for rep in range(args.reps):
            samples["generate"].append(run_generate(args))
            samples["serve"].append(run_served(client, args))
            same = samples["serve"][-1]["text"] == samples["generate"][-1]["text"]
            print(f"rep {rep + 1}/{args.reps}: served text equals generate's: {same}", file=sys.stderr)
            if not same:
                raise SystemExit("the served text differs from generate's: not a valid comparison")
    finally:
        server.terminate()
        server.wait(60)
    medians = {
        kind: {key: statistics.median(s[key] for s in rows) for key in rows[0] if key != "text"}
        for kind, rows in samples.items()
    }
    gen, srv = medians["generate"], medians["serve"]
    print(
        f"{args.target}, draft {args.draft}, {args.max_tokens} tokens, {args.reps} interleaved reps (medians)"
    )
    print(
        f"  generate (engine):        TTFT {gen['ttft_s'] * 1e3:8.1f} ms   decode {gen['tok_s']:7.1f} tok/s"
    )
    print(
        f"  serve (engine in server): TTFT {srv['ttft_s'] * 1e3:8.1f} ms   decode {srv['tok_s']:7.1f} tok/s"
    )
    print(f"  serve (client sees):      TTFT {srv['client_ttft_s'] * 1e3:8.1f} ms")
    print(
        f"  server overhead: {srv['request_overhead_s'] * 1e3:.2f} ms per request, "
        f"{srv['token_overhead_s'] * 1e3:.3f} ms per streamed token"
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {"args": vars(args) | {"json": str(args.json)}, "samples": samples, "medians": medians},
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
