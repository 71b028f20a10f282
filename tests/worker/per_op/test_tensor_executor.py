"""The per-op tensor executor refuses bad operations precisely and keeps serving (tiny model)."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import mlx.core as mx
import pytest
from mlx_lm.models import qwen3
from mlx_lm.utils import save_config, save_model

from specwire.models.loading import LoadedModel
from specwire.v1 import draft_pb2 as pb
from specwire.wire.protocol import EXECUTE_METHOD, PROTOCOL_VERSION
from tests.support.credentials import channel as worker_channel
from tests.support.processes.cli import one_error_line, run_cli
from tests.support.processes.workers import WorkerProcess, running_worker, unique_name
from tests.support.prompts import text_ar_tokens

pytestmark = pytest.mark.anyio


def _open(fingerprint: str) -> bytes:
    return pb.TensorRequest(
        open=pb.TensorOpen(protocol_version=PROTOCOL_VERSION, vocab_fingerprint=fingerprint)
    ).SerializeToString()


def _graph(seq: int, *ops: pb.Op) -> bytes:
    return pb.TensorRequest(graph=pb.Graph(seq=seq, ops=list(ops))).SerializeToString()


class Session:
    """A raw Execute stream."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.call = channel.stream_stream(EXECUTE_METHOD)(timeout=60)

    async def open(self, fingerprint: str) -> pb.TensorOpened:
        await self.call.write(_open(fingerprint))
        return pb.TensorReply.FromString(await self.call.read()).opened

    async def run(self, seq: int, *ops: pb.Op) -> pb.GraphResult:
        await self.call.write(_graph(seq, *ops))
        return pb.TensorReply.FromString(await self.call.read()).result

    async def refused(self, seq: int, *ops: pb.Op) -> grpc.aio.AioRpcError:
        await self.call.write(_graph(seq, *ops))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await self.call.read()
        return err.value


def set_tokens(ids: list[int], offset: int = 0) -> pb.Op:
    return pb.Op(
        code=pb.SET_TENSOR, args=[len(ids), offset], data=b"".join(i.to_bytes(4, "little") for i in ids)
    )


def steps(opened: pb.TensorOpened) -> list[pb.Op]:
    """The STEPs of one pass, in the order the worker announced."""
    return [pb.Op(code=pb.STEP, inputs=[h]) for h in opened.walk]


async def test_refused_operations_end_only_their_own_session(
    tiny_worker: WorkerProcess, tiny: LoadedModel
) -> None:
    fp = tiny.fingerprint
    async with worker_channel(tiny_worker.address) as channel:
        a = Session(channel)
        opened = await a.open(fp)
        walk = steps(opened)
        assert (await a.run(1, set_tokens([1, 2, 3]), *walk[:4])).counters.ops == 5  # a pass half walked

        b = Session(channel)
        await b.open(fp)
        err = await b.refused(1, set_tokens([4]), pb.Op(code=pb.STEP, inputs=[10_000]))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "handle 0x2710 names no operation of this model" in (err.details() or "")

        c = Session(channel)
        await c.open(fp)
        err = await c.refused(1, set_tokens([4]), walk[1])
        names = {m.handle: m.name for m in opened.modules}
        first, second = names[opened.walk[0]], names[opened.walk[1]]
        assert f"the pass reaches {first} next, not {second}" in (err.details() or "")

        d = Session(channel)
        await d.open(fp)
        err = await d.refused(1, pb.Op(code=99))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "unknown op code 99" in (err.details() or "")

        # Session a was never disturbed: its pass ends and returns the logits row; new sessions still open.
        result = await a.run(2, *walk[4:], pb.Op(code=pb.GET_TENSOR))
        assert result.counters.graphs == 2 and len(result.tensors) == 1
        assert len(result.tensors[0]) == 4 * tiny.vocab_size
        assert (await Session(channel).open(fp)).walk == opened.walk


async def test_bad_arity_position_and_order_are_refused(
    tiny_worker: WorkerProcess, tiny: LoadedModel
) -> None:
    async with worker_channel(tiny_worker.address) as channel:
        refusals = [
            ([pb.Op(code=pb.KV_TRIM)], "takes 0 outputs, 0 inputs and 1 args; got 0, 0 and 0"),
            ([set_tokens([5], offset=3)], "position 3 does not match the session's (0)"),
            ([pb.Op(code=pb.GET_TENSOR)], "no pass has ended yet"),
            ([pb.Op(code=pb.ARGMAX, args=[0])], "no pass has ended yet, so there is no token to chain"),
        ]
        for ops, message in refusals:
            s = Session(channel)
            await s.open(tiny.fingerprint)
            err = await s.refused(1, *ops)
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and message in (err.details() or ""), (
                message
            )


def test_backend_can_be_switched_off() -> None:
    with running_worker("--model", "tiny", "--name", unique_name("stream-only"), "--backends", "stream") as w:
        assert w.ready["backends"] == ["stream"]
        out = run_cli(
            "coordinator",
            "generate",
            "--prompt",
            "hi",
            "--target",
            "tiny",
            "--draft",
            "remote",
            "--worker",
            w.address,
            "--backend",
            "ggml-rpc",
        )
        assert out.returncode == 1
        assert "does not offer the ggml-rpc backend" in one_error_line(out.stderr)


def test_a_qwen3_model_saved_to_disk_drafts_per_op_losslessly(tmp_path: Path, tiny: LoadedModel) -> None:
    # A qwen3 model (per-head q/k norms, tied head), saved as mlx-lm saves: walked from its own modules.
    args = {
        "model_type": "qwen3", "hidden_size": 32, "num_hidden_layers": 2, "intermediate_size": 64,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "rms_norm_eps": 1e-6,
        "vocab_size": tiny.vocab_size, "max_position_embeddings": 4096, "rope_theta": 10000.0,
        "tie_word_embeddings": True,
    }  # fmt: skip
    model = qwen3.Model(qwen3.ModelArgs.from_dict(args))
    mx.eval(model.parameters())
    save_model(tmp_path, model)
    save_config(args, config_path=tmp_path / "config.json")
    tiny.tokenizer.save_pretrained(str(tmp_path))
    with running_worker("--model", str(tmp_path), "--name", unique_name("qwen3")) as w:
        assert w.ready["backends"] == ["stream", "ggml-rpc"]
        common = ["--prompt", "hi", "--target", "tiny", "--draft", "remote", "--worker", w.address]
        for backend in ("ggml-rpc", "stream"):
            out = run_cli(
                "coordinator", "generate", *common, "--backend", backend, "--max-tokens", "8", "--json"
            )
            assert out.returncode == 0, out.stderr
            assert json.loads(out.stdout)["token_ids"] == text_ar_tokens(tiny, "hi", 8), backend
