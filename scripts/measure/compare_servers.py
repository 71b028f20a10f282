"""``coordinator serve`` against ``mlx_lm.server``: one model directory, one machine, one run.

Both servers load the same mlx-lm model directory (by default the default
model's weights in float32, written to ``--dir`` first) and listen on
127.0.0.1 at once; the requests go to one server at a time, the two taking
turns within each repeat, so that both see the same machine. Measured, at
T = 0 on ``/v1/completions``:

1. aggregate tok/s with 1, 4 and 8 requests at once (``--tokens`` each; the
   completion tokens over the time from the first request sent to the last
   answered), each ``coordinator serve`` set-up (``--drafts``: ``none`` and
   ``auto`` by default) beside ``mlx_lm.server``;
2. time to first token of a second request that shares a long prefix
   (``--prefix-tokens``) with the one before it (each repeat a new prefix).

Medians over ``--repeats``; the ratio column is the set-up's over
mlx_lm.server's. Each request's text must be the same from both servers (the
target's greedy output); the run says where it is not.

    python scripts/measure/compare_servers.py --json docs/runs/compare-servers-cpu-DATE.json

Its figures are in ``docs/serving.md#measured-an-agent-loop-and-serve-beside-mlx_lmserver``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

PROMPTS = [
    "Explain how a hash map handles collisions.",
    "Write a short story about a lighthouse keeper.",
    "List the planets of the solar system and one fact about each.",
    "Describe how to make bread at home.",
    "What makes a good unit test?",
    "Summarize the water cycle.",
    "Give three tips for writing clear emails.",
    "How does a bicycle stay upright?",
]
WORDS = ["river", "stone", "cloud", "market", "garden", "signal", "window", "ladder", "copper", "meadow"]


def export_default(directory: Path) -> Path:
    """The default model's weights in float32 as an mlx-lm model directory (written once)."""
    if (directory / "config.json").exists():
        return directory
    from mlx_lm.utils import save_config, save_model

    from specwire.models.loading import load_model

    loaded = load_model("default@float32")
    directory.mkdir(parents=True, exist_ok=True)
    save_model(directory, loaded.model)
    save_config(dict(loaded.args), config_path=directory / "config.json")
    loaded.tokenizer.save_pretrained(str(directory))
    return directory


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(command: list[str], port: int) -> subprocess.Popen[bytes]:
    """Start a server and wait until it lists its models."""
    env = {**os.environ, "SPECWIRE_MDNS_INTERFACES": "127.0.0.1"}
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{' '.join(command[:4])} exited with {process.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5):
                return process
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.5)
    process.terminate()
    raise RuntimeError(f"{' '.join(command[:4])} did not answer in 600 s")


MODEL = {"name": ""}  # the model directory: both servers answer to it (mlx_lm.server loads by that name)


def complete(url: str, prompt: str, max_tokens: int, stream: bool = False) -> dict[str, Any]:
    """One completion at T = 0: its text, completion tokens, and times (perf_counter seconds)."""
    body = {"model": MODEL["name"], "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    if stream:
        body["stream"] = True
    req = urllib.request.Request(
        f"{url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    started = time.perf_counter()
    first, text = None, []
    with urllib.request.urlopen(req, timeout=900) as reply:
        if not stream:
            whole = json.load(reply)
            end = time.perf_counter()
            text_out = whole["choices"][0]["text"]
            return {
                "text": text_out,
                "tokens": whole["usage"]["completion_tokens"],
                "started": started,
                "end": end,
            }
        for raw in reply:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            piece = chunk["choices"][0].get("text", "") if chunk.get("choices") else ""
            if piece and first is None:
                first = time.perf_counter()
            text.append(piece)
    return {"text": "".join(text), "started": started, "first": first, "end": time.perf_counter()}


def at_once(url: str, prompts: list[str], max_tokens: int) -> tuple[float, list[str]]:
    """Aggregate tok/s of ``prompts`` sent together, and their texts."""
    out: list[dict[str, Any]] = [{}] * len(prompts)

    def run(i: int) -> None:
        out[i] = complete(url, prompts[i], max_tokens)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = max(r["end"] for r in out) - min(r["started"] for r in out)
    return sum(r["tokens"] for r in out) / wall, [r["text"] for r in out]


def prefix(tokens: int, seed: int) -> str:
    """About ``tokens`` tokens of words, different for each ``seed``."""
    words = [WORDS[(seed * 7 + i * (seed + 3)) % len(WORDS)] for i in range(tokens)]
    return "Notes: " + " ".join(words) + ".\n"


def second_ttft(url: str, tokens: int, seed: int) -> float:
    """Time to first token of a request sharing a ``tokens``-token prefix with the one just before it."""
    shared = prefix(tokens, seed)
    complete(url, shared + "Question: what is the first word?", 4)
    second = complete(url, shared + "Question: what is the last word?", 4, stream=True)
    return float(second["first"] - second["started"])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, help="an mlx-lm model directory (default: the default model, f32)")
    p.add_argument("--dir", type=Path, default=Path("/tmp/specwire-compare/smollm2-135m-f32"))
    p.add_argument("--drafts", default="none,auto", help="coordinator serve's --draft set-ups to compare")
    p.add_argument("--local-draft", default=None, help="coordinator serve's --local-draft (auto's draft)")
    p.add_argument("--concurrency", default="1,4,8", help="requests at once")
    p.add_argument("--tokens", type=int, default=32, help="tokens of each request")
    p.add_argument("--prefix-tokens", type=int, default=1000, help="the shared prefix of the TTFT check")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", type=Path, help="write every figure here")
    args = p.parse_args()
    model = args.model or export_default(args.dir)
    levels = [int(n) for n in args.concurrency.split(",")]
    servers: dict[str, str] = {}
    processes = []
    try:
        port = free_port()
        MODEL["name"] = str(model)
        command = [sys.executable, "-m", "mlx_lm", "server", "--model", str(model), "--port", str(port)]
        command += ["--host", "127.0.0.1", "--decode-concurrency", str(max(levels))]
        processes.append(start(command, port))
        servers["mlx_lm.server"] = f"http://127.0.0.1:{port}"
        for draft in args.drafts.split(","):
            port = free_port()
            command = [sys.executable, "-m", "coordinator.cli", "serve", "--target", str(model)]
            command += ["--model-name", str(model), "--port", str(port), "--draft", draft]
            command += ["--interface", "127.0.0.1", "--decode-concurrency", str(max(levels))]
            command += ["--local-draft", args.local_draft] if args.local_draft else []
            processes.append(start(command, port))
            servers[f"serve --draft {draft}"] = f"http://127.0.0.1:{port}"
        record = measure(servers, levels, args)
    finally:
        for process in processes:
            process.terminate()
            process.wait(60)
    report(record, servers)
    if args.json:
        record["settings"] = {**{k: str(v) for k, v in vars(args).items()}, "machine": platform.platform()}
        args.json.write_text(json.dumps(record, indent=1))
    return 0 if not record["texts_differ"] else 1


def measure(servers: dict[str, str], levels: list[int], args: argparse.Namespace) -> dict[str, Any]:
    """Every server at every level, taking turns within each repeat; then the second request's TTFT."""
    names = list(servers)
    for url in servers.values():  # warm each at every level: a batch's first rounds of a size pay
        for level in levels:  # compilation and allocation
            at_once(url, [PROMPTS[i % len(PROMPTS)] for i in range(level)], 8)
    tok_s: dict[str, dict[int, list[float]]] = {n: {c: [] for c in levels} for n in names}
    texts: dict[str, dict[int, list[str]]] = {n: {} for n in names}
    differ = []
    for repeat in range(args.repeats):
        for level in levels:
            order = names if repeat % 2 == 0 else names[::-1]
            prompts = [PROMPTS[i % len(PROMPTS)] for i in range(level)]
            for name in order:
                rate, outs = at_once(servers[name], prompts, args.tokens)
                tok_s[name][level].append(rate)
                texts[name][level] = outs
            base = texts["mlx_lm.server"][level]
            differ += [
                {"server": n, "level": level, "request": i}
                for n in names
                for i, t in enumerate(texts[n][level])
                if t != base[i]
            ]
    ttft: dict[str, list[float]] = {n: [] for n in names}
    for repeat in range(args.repeats):
        for name in names if repeat % 2 == 0 else names[::-1]:
            ttft[name].append(second_ttft(servers[name], args.prefix_tokens, repeat * 10 + names.index(name)))
    return {
        "tok_s": {n: {str(c): v for c, v in per.items()} for n, per in tok_s.items()},
        "median_tok_s": {
            n: {str(c): statistics.median(v) for c, v in per.items()} for n, per in tok_s.items()
        },
        "second_ttft_s": ttft,
        "median_second_ttft_s": {n: statistics.median(v) for n, v in ttft.items()},
        "texts_differ": differ,
    }


def report(record: dict[str, Any], servers: dict[str, str]) -> None:
    medians, base = record["median_tok_s"], record["median_tok_s"]["mlx_lm.server"]
    levels = list(base)
    print(f"{'server':24}" + "".join(f"{c + ' at once':>22}" for c in levels) + f"{'2nd TTFT s':>14}")
    for name in servers:
        cells = "".join(f"{medians[name][c]:>12.2f} ({medians[name][c] / base[c]:.2f}x)" for c in levels)
        print(f"{name:24}{cells}{record['median_second_ttft_s'][name]:>14.3f}")
    print(
        "tok/s: median of the repeats; (x): over mlx_lm.server's. Texts that differ:",
        record["texts_differ"] or "none",
    )


if __name__ == "__main__":
    sys.exit(main())
