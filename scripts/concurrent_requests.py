"""Requests at once against ``coordinator serve``: aggregate speed, and a short request behind a long one.

Starts two workers and a server on 127.0.0.1 (paced, by default, as the
paper's M1 Max, M2 Pro and M2 Ultra; the server drafting with ``--draft``,
auto by default, with both workers and its own draft model; each process
pinned to a CPU where there are two) and measures, at T = 0 with streamed
requests:

1. each request of ``--tokens`` tokens alone: its tok/s, sent to end (the
   median of the requests), and after its first token (the server's figure);
2. ``--concurrent`` such requests at once: their aggregate tok/s, and whether
   each output equals its solo run;
3. a short request (16 tokens) sent while a long one runs: its time to first
   token against the same request alone.

``--sampling`` adds fields to every request (penalties, a logit bias):
outputs are then compared with the solo runs under the same fields.

It ends with the server's ``/v1/status``: how the requests were batched,
and its paced passes while it served them, its start-up's apart, as each
worker's are (a side held when at most 1% of its passes overran).

    python scripts/concurrent_requests.py --json concurrent.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import anyio
from agent_session import events, start

from specwire.emulation.paper import PAIRS

PROMPTS = [
    "Explain how a hash map handles collisions.",
    "Write a short story about a lighthouse keeper.",
    "List the planets of the solar system and one fact about each.",
    "Describe how to make bread at home.",
]
SHORT = 16


def request(url: str, prompt: str, max_tokens: int, sampling: dict[str, Any]) -> dict[str, Any]:
    """One streamed completion, with ``sampling``'s fields too: its tokens, time to first token and end
    (perf_counter seconds)."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    body.update(sampling)
    headers = {"Content-Type": "application/json"}
    req = urllib.request.Request(f"{url}/completions", data=json.dumps(body).encode(), headers=headers)
    started = time.perf_counter()
    first, ids, stats = None, None, {}
    with urllib.request.urlopen(req, timeout=600) as reply:
        for chunk in events(reply):
            if first is None and any(c.get("text") for c in chunk.get("choices", [])):
                first = time.perf_counter()
            if "specwire" in chunk and "token_ids" in chunk["specwire"]:
                stats = dict(chunk["specwire"])
                ids = stats.pop("token_ids")
    end = time.perf_counter()
    return {
        "started": started,
        "ttft_s": (first or end) - started,
        "end": end,
        "token_ids": ids,
        "stats": stats,
    }


def at_once(
    url: str, jobs: list[tuple[str, int]], delays: list[float], sampling: dict[str, Any]
) -> list[dict[str, Any]]:
    """Run ``jobs`` (prompt, max tokens) in threads, each started after its delay."""
    out: list[dict[str, Any]] = [{} for _ in jobs]

    def run(i: int) -> None:
        time.sleep(delays[i])
        out[i] = request(url, *jobs[i], sampling)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=256, help="tokens of each long request")
    p.add_argument("--concurrent", type=int, default=4, help="requests at once")
    p.add_argument("--unpaced", dest="paced", action="store_false", help="this machine's own speed")
    p.add_argument("--draft", default="auto", help="the server's --draft (default: auto)")
    p.add_argument(
        "--family", choices=sorted(PAIRS), default="llama", help="the emulation pair (default: llama)"
    )
    p.add_argument(
        "--sampling",
        type=json.loads,
        default={},
        help="JSON fields every request also sends, e.g. '{\"repetition_penalty\": 1.3}'",
    )
    p.add_argument("--json", type=Path, help="write every figure here")
    args = p.parse_args()
    target, draft = PAIRS[args.family]
    processes: list[Any] = []
    try:
        addresses = start_workers(draft, args.paced, processes)
        start_up = anyio.run(worker_pace, addresses) if args.paced else {}
        command = [
            sys.executable,
            "-m",
            "coordinator.cli",
            "serve",
            "--port",
            "0",
            "--json",
            "--target",
            target,
        ]
        command += ["--model-name", "tiny", "--draft", args.draft, "--local-draft", draft]
        command += ["--worker", addresses[0] if args.draft.startswith("remote") else ",".join(addresses)]
        command += ["--interface", "127.0.0.1", "--prompt-cache-size", "0"]
        command += ["--decode-concurrency", str(args.concurrent)]
        command += ["--pace", "paper:m2-ultra"] if args.paced else []
        server, served = start(pinned(command, 0))
        processes.append(server)
        url = served["url"]
        server_start_up = server_status(url).get("pace")  # its warm-up's passes, before it serves
        jobs = [(PROMPTS[i % len(PROMPTS)], args.tokens) for i in range(args.concurrent)]
        solo = [request(url, *job, args.sampling) for job in jobs]
        together = at_once(url, jobs, [0.0] * len(jobs), args.sampling)
        short_alone = request(url, PROMPTS[1], SHORT, args.sampling)
        behind = at_once(url, [(PROMPTS[0], args.tokens), (PROMPTS[1], SHORT)], [0.0, 0.5], args.sampling)
        status = server_status(url)
        workers = anyio.run(worker_pace, addresses, start_up) if args.paced else {}
    finally:
        for process in processes:
            process.terminate()
            process.wait(60)
    pace = since(status.get("pace"), server_start_up)  # the run's passes: those of the requests
    # Each request alone, sent to end (its time to first token in): the median of the solo runs.
    one_tok_s = statistics.median(args.tokens / (r["end"] - r["started"]) for r in solo)
    wall = max(r["end"] for r in together) - min(r["started"] for r in together)
    aggregate = args.tokens * len(together) / wall
    same = [a["token_ids"] == b["token_ids"] for a, b in zip(solo, together, strict=True)]
    figures = {
        "one_request_tok_s": one_tok_s,
        "aggregate_tok_s": aggregate,
        "aggregate_over_one": aggregate / one_tok_s,
        "one_request_decode_tok_s": statistics.median(r["stats"].get("decode_tok_s", 0.0) for r in solo),
        "outputs_equal_solo": same,
        "short_ttft_alone_s": short_alone["ttft_s"],
        "short_ttft_behind_long_s": behind[1]["ttft_s"],
        "short_behind_over_alone": behind[1]["ttft_s"] / short_alone["ttft_s"],
        "short_answered_before_long_ended": behind[1]["end"] < behind[0]["end"],
        "batching": status.get("batching"),
        "pace": pace,
        "pace_start_up": server_start_up,
        "worker_pace": workers,
        "worker_start_up_pace": start_up,
        "pace_held": held(pace, workers),
    }
    for name, value in figures.items():
        print(f"{name:36} {value:.3f}" if isinstance(value, float) else f"{name:36} {value}")
    if args.json:  # with how each request was drafted (the server's figures for it)
        drafted = {"alone": [r["stats"] for r in solo], "together": [r["stats"] for r in together]}
        drafted["long_behind"] = behind[0]["stats"]
        record = {"settings": {k: str(v) for k, v in vars(args).items()}, **figures, "drafted": drafted}
        args.json.write_text(json.dumps(record))
    return 0 if all(same) and figures["pace_held"] is not False else 1


def server_status(url: str) -> dict[str, Any]:
    """The server's ``/v1/status``: its batching and, paced, its passes and overruns so far."""
    with urllib.request.urlopen(f"{url}/status", timeout=60) as reply:
        return json.load(reply)


def since(pace: dict[str, Any] | None, before: dict[str, Any] | None) -> dict[str, Any] | None:
    """A server's ``pace`` (its ``/status``) less the passes and overruns it had ``before``, side by side."""
    if pace is None or before is None:
        return pace
    return {
        side: {**counts, **{key: counts[key] - before[side][key] for key in ("passes", "overruns")}}
        if isinstance(counts, dict) and isinstance(before.get(side), dict)
        else counts
        for side, counts in pace.items()
    }


def start_workers(draft: str, paced: bool, processes: list[Any]) -> list[str]:
    """Two workers serving ``draft`` on 127.0.0.1, paced (when ``paced``) as the paper's M1 Max and M2 Pro,
    on the second CPU; each is appended to ``processes``. Returns their addresses."""
    addresses = []
    for machine in ("m1-max", "m2-pro"):
        command = [sys.executable, "-m", "worker.cli", "serve", "--model", draft, "--port", "0"]
        command += ["--echo-port", "0", "--name", f"{machine}-{os.getpid()}", "--no-advertise", "--json"]
        command += ["--pace", f"paper:{machine}"] if paced else []
        worker, ready = start(pinned(command, 1))
        processes.append(worker)
        addresses.append(f"127.0.0.1:{ready['port']}")
    return addresses


def pinned(command: list[str], cpu: int) -> list[str]:
    """``command`` on CPU ``cpu`` alone where this machine has two or more and ``taskset`` (the paced
    preset's pinning: the server on one, the workers on the other)."""
    if (os.cpu_count() or 1) < 2 or shutil.which("taskset") is None:
        return command
    return ["taskset", "-c", str(cpu), *command]


async def worker_pace(
    addresses: list[str], before: dict[str, dict[str, int]] | None = None
) -> dict[str, dict[str, int]]:
    """Each worker's paced passes and overruns from its Hello: since it started, or since ``before``
    (the counts at the run's start: a worker's start-up passes, which measure its speed and curve
    before it serves, are no pass of the run)."""
    from coordinator.workers.connection import connect
    from coordinator.workers.credentials import Credentials, find_token

    out = {}
    for address in addresses:
        connection = await connect(address, Credentials(token=find_token(None)))
        try:
            c = connection.hello.counters
            start = (before or {}).get(address, {"passes": 0, "overruns": 0})
            out[address] = {
                "passes": c.paced_passes - start["passes"],
                "overruns": c.pace_overruns - start["overruns"],
            }
        finally:
            await connection.close()
    return out


def held(pace: dict[str, Any] | None, workers: dict[str, dict[str, int]]) -> bool | None:
    """Whether every paced side, the server's and each worker's, held (at most 1% of its passes
    overran); None unpaced."""
    if not pace:
        return None
    sides = [v for v in pace.values() if isinstance(v, dict)] + list(workers.values())
    return all(side["overruns"] <= 0.01 * side["passes"] for side in sides)


if __name__ == "__main__":
    sys.exit(main())
