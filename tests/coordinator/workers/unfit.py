"""Real workers that cannot draft for the tiny target, each for its own reason (discover, serve)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.models.gguf_models import write_llama_gguf
from tests.support.models.tiny_models import tiny_llama
from tests.support.processes.workers import WorkerProcess, running_worker, unique_name

OTHER_TOKEN = "another-token-" + "y" * 24


@contextmanager
def other_vocabulary_worker(tmp_path: Path, base: str = "other-vocab") -> Iterator[WorkerProcess]:
    """A worker serving a llama GGUF of an 8-token vocabulary: not the tiny target's."""
    path = tmp_path / "other_vocab.gguf"
    model, args = tiny_llama(0)
    write_llama_gguf(model, args, path)
    with running_worker("--model", str(path), "--name", unique_name(base)) as worker:
        yield worker


@contextmanager
def other_token_worker(tmp_path: Path, base: str = "other-token") -> Iterator[WorkerProcess]:
    """A worker serving the tiny model that holds another token than this test session's."""
    token = tmp_path / "other-token"
    token.write_text(OTHER_TOKEN)
    with running_worker("--model", "tiny", "--name", unique_name(base), "--token-file", str(token)) as worker:
        yield worker
