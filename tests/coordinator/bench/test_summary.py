"""The bench's proof of remote execution, on hand-made runs: which process served each session."""

from __future__ import annotations

from coordinator.bench.plan import RemoteWorker
from coordinator.bench.runner import Run
from coordinator.bench.summary import _same_process
from coordinator.decoding.results import GenerationResult
from coordinator.workers.connection import WorkerConnection
from coordinator.workers.credentials import Credentials
from specwire.v1 import draft_pb2 as pb


def worker(name: str, pid: int, boot_id: str) -> RemoteWorker:
    hello = pb.HelloReply(identity=pb.WorkerIdentity(name=name, pid=pid, boot_id=boot_id))
    return RemoteWorker(WorkerConnection(f"127.0.0.1:{pid}", None, hello, Credentials()))  # type: ignore[arg-type]


def run(identity: dict) -> Run:
    return Run(0, 0, "text", 0, GenerationResult(0, [], "length", 0, 0, 0), identity=identity)


def test_each_session_is_matched_with_its_own_workers_hello() -> None:
    workers = {"a": worker("a", 11, "x"), "b": worker("b", 22, "y")}
    # Several workers at once: the session that finished may be the second worker's.
    assert _same_process(
        [run({"name": "a", "pid": 11, "boot_id": "x"}), run({"name": "b", "pid": 22, "boot_id": "y"})],
        workers,
    )
    assert not _same_process(
        [run({"name": "b", "pid": 11, "boot_id": "x"})], workers
    )  # a's process under b's name
    assert not _same_process([run({"name": "a", "pid": 11, "boot_id": "restarted"})], workers)
    assert not _same_process([run({"name": "c", "pid": 33, "boot_id": "z"})], workers)
    assert not _same_process([run({})], workers)  # no proof is no match
