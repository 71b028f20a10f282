"""The draft-source factory: what each DraftSpec opens, and clear errors for specs that do not fit.

Remote specs open against the session's tiny-model worker: which source is
built and which connection it uses is the point, not the model's text.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace
from pathlib import Path

import pytest

from coordinator.decoding.engine import SpeculativeDecoder
from coordinator.drafting.factory import DraftSources, WorkerAccess
from coordinator.drafting.failover import FailoverDraftSource
from coordinator.drafting.ggml_rpc.source import PerOpDraftSource
from coordinator.drafting.local import LocalDraftSource
from coordinator.drafting.spec import DraftSpec, prespec_for
from coordinator.drafting.stream import StreamDraftSource
from coordinator.runtime import coordinator_runtime
from coordinator.workers.discovery import WorkerDirectory
from specwire.drafting.sampling import SamplingParams
from specwire.errors import InvalidArgumentError, NoWorkerError, VocabularyMismatchError
from specwire.models.loading import LoadedModel
from specwire.wire.bonjour import WorkerAdvert
from specwire.wire.protocol import BACKEND_STREAM, PROTOCOL_VERSION
from tests.coordinator.workers.unfit import other_token_worker
from tests.support.credentials import credentials
from tests.support.models.tiny_models import disagreeing_pair
from tests.support.processes.relay import free_port
from tests.support.processes.workers import WorkerProcess, unique_name
from tests.support.prompts import PROMPTS, ar_tokens
from worker.server.advertise import Advertiser


def access() -> WorkerAccess:
    return WorkerAccess(credentials(), ["127.0.0.1"], discover_timeout=1.0, round_timeout=20.0)


def test_parse_names_every_kind() -> None:
    assert DraftSpec.parse("none") == DraftSpec("none")
    assert DraftSpec.parse("auto", local="tiny") == DraftSpec("auto", local="tiny")
    assert DraftSpec.parse("local:default@float16") == DraftSpec("local", local="default@float16")
    assert DraftSpec.parse("local", local="tiny") == DraftSpec("local", local="tiny")
    remote = DraftSpec.parse("remote", workers=("m1-max",), backend="ggml-rpc", granularity="layer")
    assert (remote.kind, remote.mode, remote.workers, remote.backend, remote.granularity) == (
        "remote",
        "stream",
        ("m1-max",),
        "ggml-rpc",
        "layer",
    )
    tree = DraftSpec.parse("remote:tree", local="tiny")
    assert tree.mode == "tree" and tree.prespec == prespec_for("tree")
    assert tree.prespec is not None and tree.prespec.fill and tree.prespec.tree
    assert DraftSpec.parse("remote:tree", local="tiny", rows=4).prespec.batch == 4  # type: ignore[union-attr]
    assert DraftSpec.parse("remote").prespec is None


@pytest.mark.parametrize(
    ("text", "remote", "message"),
    [
        ("local", {}, "needs a draft model"),
        ("worker", {}, "expected auto, local"),
        ("remote:race", {}, "remote mode 'race'"),
        ("remote:tree", {"backend": "ggml-rpc", "local": "tiny"}, "a mode of the stream backend"),
        ("remote:fill", {"local": "tiny"}, "remote mode 'fill'"),
        ("remote:prespec", {}, "remote mode 'prespec'"),
        ("remote", {"backend": "grpc"}, "backend 'grpc'"),
        ("remote", {"granularity": "block"}, "granularity 'block'"),
        ("remote", {"on_loss": "retry"}, "--on-worker-loss 'retry'"),
        ("remote:tree", {}, "drafts what the worker has not on --local-draft"),
        ("remote", {"workers": ("a", "b")}, "with several, --draft auto picks"),
    ],
)
def test_specs_that_do_not_fit_are_refused_with_a_clear_message(
    text: str, remote: dict, message: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        DraftSpec.parse(text, **remote)


@pytest.mark.anyio
async def test_every_kind_opens_and_a_worker_has_one_connection(
    tiny_worker: WorkerProcess, tiny: LoadedModel
) -> None:
    address = tiny_worker.address
    prompt = tiny.tokenizer.encode(PROMPTS[4])
    async with coordinator_runtime() as runtime:
        async with DraftSources(runtime, tiny, access()) as sources:
            assert await sources.open(DraftSpec("none")) is None
            assert isinstance(await sources.open(DraftSpec("local", local="tiny")), LocalDraftSource)
            stream = await sources.open(DraftSpec("remote", workers=(address,), on_loss="fail"))
            per_op = await sources.open(
                DraftSpec("remote", workers=(address,), backend="ggml-rpc", granularity="layer")
            )
            assert isinstance(stream, FailoverDraftSource) and isinstance(per_op, FailoverDraftSource)
            assert isinstance(stream.current, StreamDraftSource) and stream.policy == "fail"
            assert isinstance(per_op.current, PerOpDraftSource) and per_op.current.granularity == "layer"
            assert stream.current.connection is per_op.current.connection
            assert list(sources.connections) == [address]
            result = await runtime.compute.run(
                SpeculativeDecoder(tiny, stream).generate, prompt, max_tokens=8, k=3, params=SamplingParams()
            )
            assert result.tokens == ar_tokens(tiny, prompt, 8)
            assert stream.current.worker_counters.draft_tokens == result.drafted > 0  # the worker drafted
            connection = stream.current.connection
        assert not sources.connections
    assert connection.channel.get_state() == connection.channel.get_state().SHUTDOWN


@pytest.mark.anyio
@pytest.mark.parametrize("why", ["its advert outlived it", "it holds another token"])
async def test_the_fastest_worker_that_cannot_draft_is_passed_over(
    tiny_worker: WorkerProcess, tiny: LoadedModel, tmp_path: Path, caplog: pytest.LogCaptureFixture, why: str
) -> None:
    """An advert ranked above every worker (a million tokens a second) at a dead port, as a worker that
    died without its goodbye leaves in browsers' caches for two minutes, or at a live worker holding
    another token: ``--draft remote`` says why it left it out and drafts on the next fastest. A directory
    kept open (as ``serve`` keeps one) holds both adverts first, so the ranking is known."""
    prompt = tiny.tokenizer.encode(PROMPTS[4])
    with contextlib.ExitStack() as stack:
        refusing = stack.enter_context(other_token_worker(tmp_path)) if why.endswith("token") else None
        port = refusing.port if refusing is not None else free_port()
        fastest = WorkerAdvert(
            unique_name("fastest"),
            ("127.0.0.1",),
            port,
            PROTOCOL_VERSION,
            (BACKEND_STREAM,),
            "tiny",
            tiny.fingerprint,
            draft_tps=1e6,
            extra={"auth": "token"},
        )
        async with Advertiser(fastest, ["127.0.0.1"]), WorkerDirectory(["127.0.0.1"]) as live:
            names = {fastest.name, tiny_worker.name}
            assert await live.wait_until(lambda ws: names <= {w.name for w in ws}, 20.0)
            async with (
                coordinator_runtime() as runtime,
                DraftSources(runtime, tiny, replace(access(), live=live)) as sources,
            ):
                source = await sources.open(DraftSpec("remote", on_loss="fail"))
                assert isinstance(source, FailoverDraftSource)
                result = await runtime.compute.run(
                    SpeculativeDecoder(tiny, source).generate,
                    prompt,
                    max_tokens=8,
                    k=3,
                    params=SamplingParams(),
                )
                assert isinstance(source.current, StreamDraftSource)
                used = source.current.connection.address
                drafted = source.current.worker_counters.draft_tokens
    assert f"leaving out the worker at 127.0.0.1:{port}, trying the next fastest" in caplog.text
    assert used != f"127.0.0.1:{port}" and result.tokens == ar_tokens(tiny, prompt, 8)
    assert drafted == result.drafted > 0  # the worker it moved on to drafted


@pytest.mark.anyio
async def test_a_local_draft_of_another_vocabulary_is_refused(tiny: LoadedModel) -> None:
    target = disagreeing_pair()[0]  # a vocabulary of 8 tokens
    async with coordinator_runtime() as runtime, DraftSources(runtime, target, access()) as sources:
        with pytest.raises(VocabularyMismatchError, match="tokenize differently"):
            await sources.open(DraftSpec("local", local="tiny"))


@pytest.mark.anyio
async def test_a_named_worker_that_does_not_answer_is_a_clear_error(tiny: LoadedModel) -> None:
    async with coordinator_runtime() as runtime, DraftSources(runtime, tiny, access()) as sources:
        with pytest.raises(NoWorkerError, match="no worker named 'nobody-here'"):
            await sources.open(DraftSpec("remote", workers=("nobody-here",)))
