"""Real ``coordinator serve`` subprocesses on 127.0.0.1 (port 0), with mDNS bound to 127.0.0.1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import openai

from tests.support.processes import zygote
from tests.support.processes.workers import read_ready


@dataclass
class ServerProcess:
    """A running server and what its ready line said."""

    process: subprocess.Popen[str]
    ready: dict

    @property
    def url(self) -> str:
        """The API's base URL (ends in /v1)."""
        return str(self.ready["url"])

    @property
    def root(self) -> str:
        """The server's root URL (for /health)."""
        return self.url.removesuffix("/v1")

    def client(self, api_key: str = "none", **options: object) -> openai.OpenAI:
        """An OpenAI client for this server (no retries unless asked: a test sees every answer)."""
        options.setdefault("max_retries", 0)
        options.setdefault("timeout", 120.0)
        return openai.OpenAI(base_url=self.url, api_key=api_key, **options)  # type: ignore[arg-type]

    def health(self, api_key: str | None = None) -> dict:
        """GET /health (with the API key: the workers, and how the last request was drafted)."""
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        request = urllib.request.Request(self.root + "/health", headers=headers)
        with urllib.request.urlopen(request, timeout=10) as reply:
            return dict(json.loads(reply.read()))


@contextmanager
def running_server(*args: str) -> Iterator[ServerProcess]:
    """Start ``coordinator serve`` with ``args``; stop it with SIGTERM (it must exit 0)."""
    env = {**os.environ, "SPECWIRE_MDNS_INTERFACES": "127.0.0.1"}
    command = [sys.executable, "-m", "coordinator.cli", "serve", "--port", "0", "--json", *args]
    process = zygote.popen(command, env=env)
    server = ServerProcess(process, read_ready(process, "server"))
    try:
        yield server
    finally:
        process.terminate()
        try:
            _, stderr = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            _, stderr = process.communicate()
        assert process.returncode == 0, f"the server exited {process.returncode}:\n{stderr}"
