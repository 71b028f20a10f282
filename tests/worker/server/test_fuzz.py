"""Property-based fuzzing of both backends' methods against a real worker.

Hypothesis sends malformed and adversarial messages: random bytes, random
field values of the right types, out-of-range ids and k, operations with
handles of other sessions, and streams cut mid-session. Every call must end
with a gRPC status of its own (never a hang, never INTERNAL or UNKNOWN), the
worker must stay up, and a well-behaved session running alongside the whole
time must produce exactly the target's greedy output. The worker and the
target serve the tiny model (the same vocabulary as the default model), so
the messages, not the model, set the pace.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from typing import Any

import anyio
import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specwire.drafting.sampling import SamplingParams
from specwire.models.loading import LoadedModel
from specwire.v1 import draft_pb2 as pb
from specwire.wire.auth import AUTH_METADATA, TOKEN_ENV, caller_proof
from specwire.wire.protocol import DRAFT_METHOD, EXECUTE_METHOD, HELLO_METHOD, PROTOCOL_VERSION
from tests.support.processes.workers import WorkerProcess, running_worker, unique_name
from tests.support.prompts import ar_tokens
from tests.support.remote import generate_remote

EXAMPLES = 420  # per property; five properties: over 2,000 messages in all
FP = "v1:828729b754d5d82c"
ALLOWED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.CANCELLED,
}
SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
sent = {"messages": 0, "calls": 0}

u32 = st.integers(0, 2**32 - 1)
small = st.integers(0, 40)
floats = st.floats(allow_nan=True, allow_infinity=True)


class Fuzzed:
    """The worker under fuzz, a sync channel to it, and the well-behaved session alongside."""

    def __init__(self, worker: WorkerProcess) -> None:
        self.worker = worker
        self.channel = grpc.insecure_channel(worker.address)
        self.good_outputs: list[bool] = []
        self.stop = threading.Event()

    def call(self, method: str, messages: list[bytes], cut: bool = False) -> grpc.StatusCode:
        """Send ``messages`` on one stream; return the status it ended with."""
        sent["messages"] += len(messages)
        sent["calls"] += 1
        metadata = [(AUTH_METADATA, caller_proof(os.environ[TOKEN_ENV], method))]
        responses = self.channel.stream_stream(method)(iter(messages), timeout=60, metadata=metadata)
        try:
            for _ in responses:
                if cut:
                    responses.cancel()
        except grpc.RpcError:
            pass
        return responses.code()


@pytest.fixture(scope="module")
def fuzzed(tiny: LoadedModel) -> Iterator[Fuzzed]:
    with running_worker("--model", "tiny", "--name", unique_name("fuzzed"), "--max-sessions", "8") as w:
        state = Fuzzed(w)
        prompt = tiny.tokenizer.encode("The sky is blue because")
        expected = ar_tokens(tiny, prompt, 10)

        def well_behaved() -> None:
            while not state.stop.is_set():
                (run,) = anyio.run(generate_remote, w.address, tiny, [prompt], 3, 10, SamplingParams())
                state.good_outputs.append(run.result.tokens == expected)

        thread = threading.Thread(target=well_behaved, daemon=True)
        thread.start()
        yield state
        state.stop.set()
        thread.join(timeout=300)
        state.channel.close()


def check(status: grpc.StatusCode, fuzzed: Fuzzed) -> None:
    assert status in ALLOWED, status
    assert fuzzed.worker.process.poll() is None, "the worker died"


def open_message(
    draw_fp: str,
    prompt: list[int],
    sampling: dict[str, Any],
    k: int,
    version: int,
    prespec: pb.PreSpeculation | None = None,
) -> bytes:
    return pb.DraftRequest(
        open=pb.Open(
            protocol_version=version,
            prompt_tokens=prompt,
            sampling=pb.SamplingParams(**sampling),
            k=k,
            vocab_fingerprint=draw_fp,
            prespec=prespec,
        )
    ).SerializeToString()


# Sessions with pre-speculation, fill mode (answers at once, appended required), trees (and what is
# verified of them) and batched branches too.
prespecs = st.sampled_from(
    [
        None,
        pb.PreSpeculation(enabled=True),
        pb.PreSpeculation(enabled=True, fill=True),
        pb.PreSpeculation(enabled=True, fill=True, batch=4),
        pb.PreSpeculation(enabled=True, fill=True, tree=True, batch=4),
    ]
)


sampling_fields = st.fixed_dictionaries(
    {
        "temperature": floats,
        "top_p": floats,
        "top_k": u32,
        "draft_top_k": u32,
        "seed": st.integers(0, 2**64 - 1),
    }
)
valid_sampling = st.fixed_dictionaries(
    {
        "temperature": st.sampled_from([0.0, 0.7]),
        "top_p": st.just(1.0),
        "top_k": st.just(0),
        "draft_top_k": st.just(8),
        "seed": st.integers(0, 9),
    }
)
tokens = st.one_of(st.integers(0, 49151), u32)
rounds = st.builds(
    lambda seq, acc, tok, k, appended, nodes: pb.DraftRequest(
        round=pb.Round(seq=seq, accepted=acc, token=tok, k=k, appended=appended, tree_nodes=nodes)
    ).SerializeToString(),
    small,
    small,
    tokens,
    small,
    st.lists(tokens, max_size=6),
    st.one_of(st.just(0), small, u32),
)
# What the target verifies (a tree session's): the reply's first nodes, then the coordinator's own.
verifyings = st.builds(
    lambda seq, reply_nodes, drafted, parents, after: pb.DraftRequest(
        verifying=pb.Verifying(
            seq=seq, reply_nodes=reply_nodes, tokens=drafted, parents=parents, started_after_ns=after
        )
    ).SerializeToString(),
    small,
    st.one_of(small, u32),
    st.lists(tokens, max_size=6),
    st.lists(st.integers(-(2**31), 2**31 - 1), max_size=6),
    st.integers(0, 2**64 - 1),
)


@SETTINGS
@given(st.lists(st.binary(max_size=64), min_size=1, max_size=3))
def test_draft_stream_random_bytes(fuzzed: Fuzzed, messages: list[bytes]) -> None:
    check(fuzzed.call(DRAFT_METHOD, messages), fuzzed)


@SETTINGS
@given(
    st.sampled_from([FP, "v1:0000000000000000", ""]),
    st.lists(st.one_of(st.integers(0, 49151), u32), min_size=0, max_size=6),
    st.one_of(valid_sampling, sampling_fields),
    st.one_of(st.integers(1, 4), u32),
    st.sampled_from([PROTOCOL_VERSION, 0, 2]),
    st.lists(st.one_of(rounds, verifyings), max_size=3),
    st.booleans(),
    prespecs,
)
def test_draft_stream_adversarial_fields(
    fuzzed: Fuzzed,
    fp: str,
    prompt: list[int],
    sampling: dict,
    k: int,
    version: int,
    then: list[bytes],
    cut: bool,
    prespec: pb.PreSpeculation | None,
) -> None:
    messages = [open_message(fp, prompt, sampling, k, version, prespec), *then]
    check(fuzzed.call(DRAFT_METHOD, messages, cut=cut), fuzzed)


@SETTINGS
@given(st.lists(st.binary(max_size=96), min_size=1, max_size=3))
def test_tensor_stream_random_bytes(fuzzed: Fuzzed, messages: list[bytes]) -> None:
    check(fuzzed.call(EXECUTE_METHOD, messages), fuzzed)


handles = st.one_of(
    st.integers(1, 700),  # module handles and beyond
    st.builds(
        lambda tag, slot: tag << 32 | slot, st.integers(1, 2**31), st.integers(0, 300)
    ),  # other sessions
    st.integers(0, 2**64 - 1),
)
ops = st.builds(
    lambda code, outs, ins, args, data: pb.Op(code=code, outputs=outs, inputs=ins, args=args, data=data),
    st.one_of(st.integers(0, 24), st.integers(25, 2**31 - 1)),
    st.lists(handles, max_size=3),
    st.lists(handles, max_size=4),
    st.lists(st.integers(-(2**63), 2**63 - 1), max_size=4),
    st.binary(max_size=32),
)


@SETTINGS
@given(
    st.sampled_from([FP, "v1:bad"]),
    st.lists(st.lists(ops, min_size=1, max_size=6), min_size=1, max_size=3),
    st.booleans(),
)
def test_tensor_stream_adversarial_ops(fuzzed: Fuzzed, fp: str, graphs: list[list[pb.Op]], cut: bool) -> None:
    opening = pb.TensorRequest(open=pb.TensorOpen(protocol_version=PROTOCOL_VERSION, vocab_fingerprint=fp))
    messages = [opening.SerializeToString()]
    messages += [
        pb.TensorRequest(graph=pb.Graph(seq=i + 1, ops=g)).SerializeToString() for i, g in enumerate(graphs)
    ]
    check(fuzzed.call(EXECUTE_METHOD, messages, cut=cut), fuzzed)


@SETTINGS
@given(st.integers(0, 3), st.booleans())
def test_streams_cut_mid_session(fuzzed: Fuzzed, rounds_before_cut: int, tensor: bool) -> None:
    # A valid session, cancelled after a few replies (or before any).
    if tensor:
        opening = pb.TensorRequest(
            open=pb.TensorOpen(protocol_version=PROTOCOL_VERSION, vocab_fingerprint=FP)
        )
        messages = [opening.SerializeToString()]
        method = EXECUTE_METHOD
    else:
        messages = [open_message(FP, [1, 2, 3], {"temperature": 0.0, "top_p": 1.0, "draft_top_k": 8}, 1, 1)]
        method = DRAFT_METHOD
    messages += [b""] * rounds_before_cut
    check(fuzzed.call(method, messages, cut=True), fuzzed)


def test_worker_survived_and_the_concurrent_session_stayed_lossless(fuzzed: Fuzzed) -> None:
    print(
        f"fuzz: {sent['calls']} calls, {sent['messages']} messages; "
        f"well-behaved runs: {len(fuzzed.good_outputs)}"
    )
    assert sent["messages"] >= 2000, sent
    fuzzed.stop.set()
    metadata = [(AUTH_METADATA, caller_proof(os.environ[TOKEN_ENV], HELLO_METHOD))]
    hello = pb.HelloReply.FromString(
        fuzzed.channel.unary_unary(HELLO_METHOD)(
            pb.HelloRequest().SerializeToString(), timeout=10, metadata=metadata
        )
    )
    assert hello.identity.pid == fuzzed.worker.pid
    assert fuzzed.good_outputs and all(fuzzed.good_outputs)
