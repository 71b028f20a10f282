"""The running worker (``worker serve``): load a draft model, serve it over gRPC, announce it over Bonjour.

Start-up loads the model, runs every kind of draft pass once (so no session
pays for compiling kernels, ``specwire.drafting.warmup``), measures the local draft
speed over a short greedy run (published in Hello and in the TXT record), starts a grpc.aio server
with the DraftWorker service (and the per-op TensorWorker unless turned off),
the standard health service and reflection, starts the raw TCP echo service
the LAN probe uses, prints one ready line on stdout, and registers on
Bonjour. SIGINT or SIGTERM stops it cleanly: the Bonjour goodbye goes out
first, open sessions end with UNAVAILABLE, then the servers stop.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import socket
import sys
from contextlib import AsyncExitStack
from dataclasses import replace

import anyio
import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from specwire.drafting.ahead.prespec_config import PrespecConfig
from specwire.drafting.prefix_cache import PrefixCache
from specwire.drafting.warmup import warm_drafter
from specwire.emulation.pace import Pace, Pacer, pace_model, parse_pace
from specwire.errors import InvalidArgumentError
from specwire.models.loading import LoadedModel, load_model
from specwire.process.compute import ComputeThread, compute_thread
from specwire.process.memory import settle_heap
from specwire.wire.auth import ProofChecker, create_token, default_token_path, find_token
from specwire.wire.bonjour import WorkerAdvert, mdns_interfaces
from specwire.wire.protocol import (
    BACKEND_PER_OP,
    PROTOCOL_VERSION,
    SERVICE_NAME,
    TENSOR_SERVICE_NAME,
)
from worker.per_op.op_walk import Walk
from worker.per_op.tensor_service import TensorService, walk_of
from worker.server.advertise import Advertiser, advertised_addresses
from worker.server.auth import AuthInterceptor
from worker.server.echo import EchoServer
from worker.server.hosting import SessionHost, WorkerCounters, WorkerInfo
from worker.server.speed import draft_speed, pass_curve
from worker.stream.stream_service import DraftService

SHUTDOWN_GRACE_S = 2.0
MAX_RECEIVE_BYTES = 16 << 20  # the largest request: a round-granularity graph of 32 passes
MAX_SEND_BYTES = 64 << 20  # the largest reply: 32 float32 logits rows of a large vocabulary
SERVER_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_RECEIVE_BYTES),
    ("grpc.max_send_message_length", MAX_SEND_BYTES),
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 5_000),
    ("grpc.http2.max_ping_strikes", 0),
]

log = logging.getLogger(__name__)


def prompt_cache_of(args: argparse.Namespace) -> PrefixCache | None:
    """The prompt cache the flags ask for (None: --prompt-cache-size 0)."""
    if args.prompt_cache_size < 0:
        raise InvalidArgumentError("--prompt-cache-size must be >= 0")
    return PrefixCache(args.prompt_cache_size, args.prompt_cache_bytes) if args.prompt_cache_size else None


def prespec_defaults(args: argparse.Namespace) -> PrespecConfig:
    """The worker's pre-speculation defaults from its flags (a session's Open may ask for others)."""
    return PrespecConfig(tree_rows=args.tree_rows, tree_memory=int(args.tree_memory * 2**30))


def run(args: argparse.Namespace, backends: tuple[str, ...]) -> int:
    """Run ``worker serve`` (its flags checked, ``backends`` those it offers) until SIGINT or SIGTERM."""
    interfaces = mdns_interfaces(args.interface)
    prespec_defaults(args)  # checked before the model loads
    pace = parse_pace(args.pace) if args.pace else None
    if pace is not None:
        pace.draft_curve()  # a machine with no draft speed is refused before the model loads
    token = _token(args)
    anyio.run(_serve, args, backends, interfaces, token, pace)
    return 0


def _token(args: argparse.Namespace) -> str | None:
    """The shared token (created on first start when none is given); None with --insecure."""
    if args.insecure:
        print("warning: --insecure: this worker accepts calls from anyone who can reach it", file=sys.stderr)
        return None
    token = find_token(args.token_file)
    if token is None:
        path = default_token_path()
        token = create_token(path)
        print(
            f"created a new shared token in {path} (mode 0600): every Mac of this set-up needs the same one; "
            "if another already has one, run `worker token set TOKEN` here with it and restart",
            file=sys.stderr,
        )
    return token


def _echo_server(args: argparse.Namespace, checker: ProofChecker | None) -> EchoServer:
    """The echo service, started: on --echo-port, else the port after --port (any free one with --port 0)."""
    port = args.echo_port if args.echo_port is not None else (args.port + 1 if args.port else 0)
    try:
        return EchoServer(args.host, port, checker).start()
    except OSError as err:
        raise InvalidArgumentError(
            f"cannot listen on {args.host}:{port} for the echo service: {err.strerror} (another worker on "
            "this machine?); stop it, or give --port or --echo-port"
        ) from err


def _credentials(args: argparse.Namespace) -> grpc.ServerCredentials | None:
    if args.tls_cert is None:
        return None
    try:
        pair = (args.tls_key.read_bytes(), args.tls_cert.read_bytes())
    except OSError as err:
        raise InvalidArgumentError(f"cannot read the TLS certificate or key: {err}") from err
    return grpc.ssl_server_credentials([pair])


def _grpc_server(
    model: LoadedModel,
    raw: LoadedModel,
    host: SessionHost,
    compute: ComputeThread,
    token: str | None,
    prespec: PrespecConfig,
    pace: Pace | None,
    pacer: Pacer | None,
    walk: Walk | None = None,
    prompt_cache: PrefixCache | None = None,
) -> tuple[grpc.aio.Server, health.aio.HealthServicer, list[str]]:
    """The gRPC server with every service this worker offers (not started).

    The stream service drafts with ``model`` (paced, when the worker is); the
    per-op executor runs ``raw``'s modules and holds each call itself.
    """
    interceptors = [AuthInterceptor(ProofChecker(token))] if token else []
    server = grpc.aio.server(interceptors=interceptors, options=SERVER_OPTIONS)
    services = [SERVICE_NAME]
    drafting = DraftService(model, host, compute, token, prespec, pace, pacer, prompt_cache)
    server.add_generic_rpc_handlers([drafting.handler()])
    if BACKEND_PER_OP in host.info.backends:
        server.add_generic_rpc_handlers([TensorService(raw, walk, host, compute, pacer).handler()])
        services.append(TENSOR_SERVICE_NAME)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection([*services, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
    return server, health_servicer, services


async def _serve(
    args: argparse.Namespace,
    backends: tuple[str, ...],
    interfaces: object,
    token: str | None,
    pace: Pace | None,
) -> None:
    compute = compute_thread()
    raw = await compute.run(load_model, args.model)
    walk, refusal = await compute.run(walk_of, raw) if BACKEND_PER_OP in backends else (None, "")
    if BACKEND_PER_OP in backends and refusal:
        log.warning("model %s: the %s backend is off (%s)", raw.spec, BACKEND_PER_OP, refusal)
        backends = tuple(b for b in backends if b != BACKEND_PER_OP)
    warmup_s = await compute.run(warm_drafter, raw.model, True)
    pacer = Pacer(pace.draft_curve(), pace.label) if pace is not None else None
    model = pace_model(raw, pacer) if pacer is not None else raw
    tps = await compute.run(draft_speed, model, args.warmup_tokens)
    curve = await compute.run(pass_curve, model)
    settle_heap()  # warm: no collector pause inside a session's passes
    echo = _echo_server(args, ProofChecker(token) if token else None)
    label = args.label or (pace.machine.name if pace is not None else "")
    try:
        advertised_echo = args.advertise_echo_port or echo.port
        info = WorkerInfo(
            "",
            label,
            backends,
            tps,
            args.max_sessions,
            echo_port=advertised_echo,
            pass_curve=tuple(curve),
            walked_ops=walk.ops_per_pass if walk is not None else 0,
            unwalked=refusal,
        )
        host = SessionHost(info, WorkerCounters(), idle_timeout_s=args.idle_timeout)
        prespec = prespec_defaults(args)
        server, health_servicer, services = _grpc_server(
            model, raw, host, compute, token, prespec, pace, pacer, walk, prompt_cache_of(args)
        )
        credentials = _credentials(args)
        address = f"{args.host}:{args.port}"
        port = (
            server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
        )
        if port == 0:
            raise InvalidArgumentError(
                f"cannot listen on {args.host}:{args.port}: the port is in use (another worker on this "
                "machine?); stop it, or give --port"
            )
        host.info = replace(info, name=args.name or socket.gethostname().split(".")[0])
        await server.start()
        for svc in ("", *services):
            await health_servicer.set(svc, health_pb2.HealthCheckResponse.SERVING)
        advert = WorkerAdvert(
            name=host.info.name,
            addresses=tuple(advertised_addresses(args.advertise_host, interfaces, args.host)),  # type: ignore[arg-type]
            port=args.advertise_port or port,
            protocol_version=PROTOCOL_VERSION,
            backends=backends,
            model=model.spec,
            fingerprint=model.fingerprint,
            label=label,
            draft_tps=tps,
            host=host.info.host,
            pid=host.info.pid,
            extra={
                "echo": str(advertised_echo),
                "auth": "token" if token else "none",
                "tls": "1" if credentials else "0",
                **({"pace": pace.label} if pace is not None else {}),
            },
        )
        await _run_until_signal(args, advert, port, model, interfaces, host, warmup_s)
        await health_servicer.enter_graceful_shutdown()
        await host.shutdown()
        await server.stop(SHUTDOWN_GRACE_S)
    finally:
        echo.close()


async def _run_until_signal(
    args: argparse.Namespace,
    advert: WorkerAdvert,
    port: int,
    model: LoadedModel,
    interfaces: object,
    host: SessionHost,
    warmup_s: float,
) -> None:
    """Advertise, print the ready line, and wait for SIGINT/SIGTERM; the goodbye goes out on the way out."""
    async with AsyncExitStack() as stack:
        if not args.no_advertise:
            advertiser = await stack.enter_async_context(Advertiser(advert, interfaces))  # type: ignore[arg-type]
            advert = replace(advert, name=advertiser.name)  # Bonjour renames on a conflict
            host.info = replace(host.info, name=advertiser.name)
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            _print_ready(args, advert, port, model, warmup_s)
            async for signum in signals:
                name = signal.Signals(signum).name
                log.info("received %s; stopping: Bonjour goodbye, then sessions, then the server", name)
                break


def _print_ready(
    args: argparse.Namespace, advert: WorkerAdvert, port: int, model: LoadedModel, warmup_s: float
) -> None:
    ready = {
        "event": "ready",
        "name": advert.name,
        "host": args.host,
        "port": port,
        "echo_port": int(advert.extra["echo"]),
        "advertised": advert.address if not args.no_advertise else None,
        "model": model.spec,
        "fingerprint": model.fingerprint,
        "draft_tok_s": round(advert.draft_tps, 2),
        "backends": list(advert.backends),
        "pid": advert.pid,
        "warmup_s": round(warmup_s, 3),
        "pace": advert.extra.get("pace"),
    }
    if args.json:
        print(json.dumps(ready), flush=True)
    else:
        paced_as = f", PACED as {ready['pace']} (an emulated machine)" if ready["pace"] else ""
        print(
            f"worker {advert.name}{paced_as} listening on {args.host}:{port} "
            f"(model {model.spec}, vocabulary {model.fingerprint}, {advert.draft_tps:.1f} draft tok/s, "
            f"echo port {advert.extra['echo']}; warm-up {warmup_s:.2f} s)",
            flush=True,
        )
