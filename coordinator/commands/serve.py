"""``coordinator serve``: an OpenAI-compatible HTTP endpoint over the speculative decoding engine.

The target is loaded once; each request gets a draft source built the way
``generate`` builds one (``--draft``, by default auto: the set-up predicted
fastest for the request's temperature, re-decided as it runs), from a
Bonjour directory kept open for the server's life, so workers that appear
later are used. Requests are
served one at a time, in order, from a bounded queue
(``coordinator.serving.scheduler``). uvicorn runs in this process's event
loop, next to the gRPC channels; model compute stays on the compute thread.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import ipaddress
import json
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anyio
import uvicorn

from coordinator.commands.options import (
    add_drafting_arguments,
    add_pace_argument,
    add_target_argument,
    draft_spec,
    pace_of,
    worker_access,
)
from coordinator.decoding.engine import MAX_K, SpeculativeDecoder
from coordinator.drafting.auto.policy import AUTO_K
from coordinator.drafting.factory import DraftSources, WorkerAccess
from coordinator.drafting.spec import FILLED
from coordinator.pacing import CoordinatorPace
from coordinator.runtime import coordinator_runtime
from coordinator.serving.app import Api, ServedModel, created_now
from coordinator.serving.body import DEFAULT_MAX_BODY
from coordinator.serving.chat import ChatTemplate
from coordinator.serving.drafting_status import DraftingStatus
from coordinator.serving.generation import Drafting
from coordinator.serving.scheduler import DEFAULT_CONCURRENCY, Scheduler
from coordinator.workers.discovery import WorkerDirectory
from specwire.drafting.prefix_cache import PromptCaches
from specwire.drafting.prompt_cache_flags import add_prompt_cache_arguments
from specwire.drafting.sampling import SamplingParams
from specwire.errors import InvalidArgumentError
from specwire.models.loading import load_model
from specwire.process.memory import settle_heap

NAME = "serve"
HELP = "Serve the target over an OpenAI-compatible HTTP API, drafting on workers (or locally)."
API_KEY_ENV = "SPECWIRE_API_KEY"
DEFAULT_PORT = 8080


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of ``coordinator serve``."""
    add_target_argument(p)
    p.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (beyond loopback needs --api-key)"
    )
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="port to listen on (0: any free port)")
    p.add_argument(
        "--api-key",
        default=os.environ.get(API_KEY_ENV),
        help=f"key clients send as 'Authorization: Bearer KEY' (env {API_KEY_ENV})",
    )
    p.add_argument("--model-name", help="the model id clients name (default: the --target spec)")
    p.add_argument(
        "--decode-concurrency",
        type=int,
        default=DEFAULT_CONCURRENCY,
        help="requests generated at once, decoded together where the pair batches, else a round each in turn "
        "(a short one need not wait for a long one)",
    )
    p.add_argument(
        "--max-queue", type=int, default=8, help="requests that may wait beyond those; more get 429"
    )
    p.add_argument(
        "--default-max-tokens", type=int, default=512, help="tokens per completion when a request sets none"
    )
    p.add_argument(
        "--max-body",
        type=int,
        default=DEFAULT_MAX_BODY,
        help="largest request body in bytes; a larger one gets HTTP 413 before it is read whole",
    )
    p.add_argument("--json", action="store_true", help="print the ready line as JSON")
    chat = p.add_argument_group("chat")
    chat.add_argument(
        "--chat-template", type=Path, help="a Jinja chat template file to use instead of the model's own"
    )
    chat.add_argument(
        "--chat-template-args",
        type=json.loads,
        default={},
        help="JSON of template options every request gets (e.g. '{\"enable_thinking\": false}'); "
        "a request's chat_template_kwargs override them",
    )
    chat.add_argument(
        "--cors-origin",
        action="append",
        default=[],
        help="a browser origin allowed to call the API (http://localhost:3000, or * for any); repeatable",
    )
    add_prompt_cache_arguments(
        p.add_argument_group("prompt cache (each model's, and each worker's for this server)")
    )
    add_drafting_arguments(p)
    add_pace_argument(p)


def check_exposure(host: str, api_key: str | None) -> None:
    """Refuse to listen beyond loopback without an API key."""
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback and not api_key:
        raise InvalidArgumentError(
            f"--host {host} lets anyone who can reach this machine use the model and its workers; "
            f"pass --api-key KEY (or set {API_KEY_ENV}), or listen on 127.0.0.1"
        )


def run(args: argparse.Namespace) -> int:
    """Run ``coordinator serve`` until SIGINT or SIGTERM."""
    check_exposure(args.host, args.api_key)
    if args.decode_concurrency < 1:
        raise InvalidArgumentError("--decode-concurrency must be >= 1")
    if args.prompt_cache_size < 0:
        raise InvalidArgumentError("--prompt-cache-size must be >= 0 (0: no prompt cache)")
    if args.max_queue < 0 or args.default_max_tokens < 1 or not 0 <= args.k <= MAX_K or args.max_body < 1:
        raise InvalidArgumentError(
            f"--max-queue must be >= 0, --default-max-tokens >= 1, --max-body >= 1 and --k within 0..{MAX_K}"
        )
    if args.chat_template is not None and not args.chat_template.is_file():
        raise InvalidArgumentError(f"--chat-template {args.chat_template}: no such file")
    # Checked before the model loads.
    drafting = Drafting(draft_spec(args), args.k)
    return anyio.run(_serve, args, drafting, worker_access(args), pace_of(args))


async def _serve(
    args: argparse.Namespace, drafting: Drafting, access: WorkerAccess, pace: CoordinatorPace | None
) -> int:
    remote = drafting.spec.kind in ("remote", "auto")
    async with coordinator_runtime() as runtime, _directory(access, remote) as live:
        target = await runtime.compute.run(load_model, args.target)
        if pace is not None:
            target = pace.target_model(target)
        access = dataclasses.replace(access, live=live)
        async with DraftSources(runtime, target, access, pace) as sources:
            if args.prompt_cache_size > 0:
                sources.caches = PromptCaches(args.prompt_cache_size, args.prompt_cache_bytes)
            spec = drafting.spec
            if live is not None:  # every worker that answers within --discover-timeout is planned with
                await anyio.sleep(live.wait_budget(access.discover_timeout))
            planner = None
            if spec.kind == "auto":  # this machine measured, and the workers found, before any request
                planner, _ = await sources.auto(spec)
            elif spec.local and (spec.kind == "local" or spec.mode in FILLED):
                await sources.local_model(spec.local)
            # Requests may be greedy or sampled: warm both paths before the first one is timed.
            k = AUTO_K if spec.kind == "auto" else args.k
            warmup_s = await runtime.compute.run(
                SpeculativeDecoder(target).warm_up, k, SamplingParams(temperature=1.0), sources.local_models
            )
            settle_heap()  # warm: no collector pause inside a request's rounds
            scheduler = Scheduler(runtime, sources, drafting, args.max_queue, args.decode_concurrency)
            scheduler.planner = planner
            status = DraftingStatus(scheduler, live)
            for line in await status.lines(access.discover_timeout):
                print(f"serve: {line}", file=sys.stderr, flush=True)
            template = ChatTemplate.of(target.tokenizer, args.chat_template)
            if not isinstance(args.chat_template_args, dict):
                raise InvalidArgumentError("--chat-template-args must be a JSON object")
            template = dataclasses.replace(template, defaults=args.chat_template_args)
            served = ServedModel(
                args.model_name or args.target,
                target,
                args.default_max_tokens,
                created_now(),
                args.max_body,
                template,
            )
            app = Api(served, scheduler, args.api_key, status, cors=args.cors_origin).app()
            config = uvicorn.Config(app, lifespan="off", log_level=args.log_level, access_log=False)
            server = uvicorn.Server(config)
            sock = _listen(args.host, args.port)
            _announce(args, sock, served.name, warmup_s)
            async with scheduler.running():
                with _quiet_sigterm():
                    await server.serve(sockets=[sock])
    return 0


@contextlib.asynccontextmanager
async def _directory(access: WorkerAccess, remote: bool) -> AsyncIterator[WorkerDirectory | None]:
    """A Bonjour directory for the server's life when drafting is remote."""
    if not remote:
        yield None
        return
    async with WorkerDirectory(access.interfaces) as live:  # type: ignore[arg-type]
        yield live


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket: bound before the ready line, so the port it names already accepts."""
    try:
        sock = socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
    except OSError as err:
        raise InvalidArgumentError(f"cannot listen on {host}:{port}: {err.strerror}") from err
    sock.setblocking(False)
    return sock


def _announce(args: argparse.Namespace, sock: socket.socket, model: str, warmup_s: float) -> None:
    host, port = sock.getsockname()[:2]
    url = f"http://{host if ':' not in host else f'[{host}]'}:{port}/v1"
    if args.json:
        ready = {"event": "ready", "url": url, "port": port, "model": model, "pid": os.getpid()}
        print(json.dumps({**ready, "warmup_s": round(warmup_s, 3)}), flush=True)
    else:
        print(
            f"serving {model} at {url} (OpenAI-compatible; Ctrl-C stops; warm-up took {warmup_s:.2f} s)",
            file=sys.stderr,
            flush=True,
        )


@contextlib.contextmanager
def _quiet_sigterm() -> Iterator[None]:
    """uvicorn stops on SIGTERM and then raises it again: let that second one pass, so we exit 0."""
    previous = signal.signal(signal.SIGTERM, lambda *_: None)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
