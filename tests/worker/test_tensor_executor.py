"""The per-op tensor executor refuses bad operations precisely and keeps serving (tiny model)."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import mlx.core as mx
import pytest
from mlx_lm.models import qwen3
from mlx_lm.utils import save_config, save_model

from specwire.models import LoadedModel
from specwire.v1 import draft_pb2 as pb
from specwire.wire.protocol import EXECUTE_METHOD, PROTOCOL_VERSION
from tests.support.cli import one_error_line, run_cli
from tests.support.credentials import channel as worker_channel
from tests.support.prompts import text_ar_tokens
from tests.support.workers import WorkerProcess, running_worker, unique_name

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


def set_tokens(handle: int, ids: list[int]) -> pb.Op:
    return pb.Op(
        code=pb.SET_TENSOR,
        outputs=[handle],
        args=[len(ids)],
        data=b"".join(i.to_bytes(4, "little") for i in ids),
    )


async def test_unknown_op_bad_handle_and_foreign_handle(
    tiny_worker: WorkerProcess, tiny: LoadedModel
) -> None:
    fp = tiny.fingerprint
    async with worker_channel(tiny_worker.address) as channel:
        a, b = Session(channel), Session(channel)
        tag_a = (await a.open(fp)).session_tag
        opened_b = await b.open(fp)
        mine = tag_a << 32 | 1
        assert (await a.run(1, set_tokens(mine, [1, 2, 3]))).counters.ops == 1

        err = await b.refused(1, pb.Op(code=pb.GET_TENSOR, inputs=[mine]))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "belongs to another session" in (err.details() or "")

        embed = {m.name: m.handle for m in opened_b.modules}["model.embed_tokens"]
        c = Session(channel)
        tag_c = (await c.open(fp)).session_tag
        err = await c.refused(
            1, pb.Op(code=pb.EMBED, outputs=[tag_c << 32 | 2], inputs=[tag_c << 32 | 9, embed])
        )
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "holds no tensor in this session" in (err.details() or "")

        d = Session(channel)
        await d.open(fp)
        err = await d.refused(1, pb.Op(code=99))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "unknown op code 99" in (err.details() or "")

        # Session a was never disturbed, and new sessions still open.
        result = await a.run(2, pb.Op(code=pb.EMBED, outputs=[tag_a << 32 | 2], inputs=[mine, embed]))
        assert result.counters.graphs == 2
        assert (await Session(channel).open(fp)).session_tag > 0


async def test_module_of_wrong_kind_and_bad_arity(tiny_worker: WorkerProcess, tiny: LoadedModel) -> None:
    async with worker_channel(tiny_worker.address) as channel:
        s = Session(channel)
        opened = await s.open(tiny.fingerprint)
        modules = {m.name: m.handle for m in opened.modules}
        tag = opened.session_tag
        await s.run(1, set_tokens(tag << 32 | 1, [5]))
        err = await s.refused(
            2, pb.Op(code=pb.MATMUL, outputs=[tag << 32 | 2], inputs=[tag << 32 | 1, modules["model.norm"]])
        )
        assert "is not a linear layer of this model" in (err.details() or "")
        s2 = Session(channel)
        await s2.open(tiny.fingerprint)
        err = await s2.refused(1, pb.Op(code=pb.KV_TRIM))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "takes 0 outputs, 0 inputs and 1 args" in (
            err.details() or ""
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


def test_an_architecture_the_walker_does_not_know_is_served_by_the_stream_backend_only(
    tmp_path: Path, default_q4: LoadedModel, tiny: LoadedModel
) -> None:
    # A qwen3 model (per-head q/k norms, no gate: not a layout the walker knows), saved as mlx-lm saves.
    args = {
        "model_type": "qwen3", "hidden_size": 32, "num_hidden_layers": 2, "intermediate_size": 64,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "rms_norm_eps": 1e-6,
        "vocab_size": default_q4.vocab_size, "max_position_embeddings": 4096, "rope_theta": 10000.0,
        "tie_word_embeddings": True,
    }  # fmt: skip
    model = qwen3.Model(qwen3.ModelArgs.from_dict(args))
    mx.eval(model.parameters())
    save_model(tmp_path, model)
    save_config(args, config_path=tmp_path / "config.json")
    default_q4.tokenizer.save_pretrained(str(tmp_path))
    with running_worker("--model", str(tmp_path), "--name", unique_name("qwen3")) as w:
        assert w.ready["backends"] == ["stream"]
        common = ["--prompt", "hi", "--target", "tiny", "--draft", "remote", "--worker", w.address]
        refused = run_cli("coordinator", "generate", *common, "--backend", "ggml-rpc")
        assert refused.returncode == 1
        assert "walks llama, qwen3_5 models; this model is 'qwen3'" in one_error_line(refused.stderr)
        streamed = run_cli("coordinator", "generate", *common, "--max-tokens", "8", "--json")
        assert streamed.returncode == 0, streamed.stderr
        assert json.loads(streamed.stdout)["token_ids"] == text_ar_tokens(tiny, "hi", 8)
