"""``rollout.options.server.transfer: nccl`` without a GPU: its settings and refusals, the flag a
started server gets, and one sync's steps on a fake server, with vLLM's trainer engine replaced
by a fake that plays its part of the handshake (the NCCL broadcast itself needs GPUs:
benchmarks/gpu_check.py ``vllm-server`` runs it)."""

from __future__ import annotations

import importlib.util
from typing import ClassVar

import pytest
import torch
from test_vllm_server_logic import _FakeServer, fake_server  # noqa: F401  (the fixture)

from coscale.rollout.vllm.server.client import ServerClient
from coscale.rollout.vllm.server.engine import ServerEngine, check_extension
from coscale.rollout.vllm.server.launch import ServerError
from coscale.rollout.vllm.server.settings import Server, server_errors

needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vllm is not installed: ./run.sh setup installs vLLM's CPU build (x86_64 Linux)",
)


def test_transfer_settings_name_their_bad_values():
    assert server_errors({"transfer": "gloo", "transfer_port": 0}) == [
        "server.transfer_port must be an int >= 1 or None, got 0",
        "server.transfer must be one of files, nccl, got 'gloo'",
    ]
    assert server_errors({"transfer": "nccl", "transfer_address": "10.0.0.2"}) == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for a trainer without CUDA")
def test_nccl_without_cuda_is_refused_naming_the_setting(tiny_model_dir):
    from coscale.rollout.vllm.server.backend import VLLMServerBackend

    with pytest.raises(ValueError, match=r"rollout\.options\.server\.transfer=nccl needs CUDA"):
        VLLMServerBackend(str(tiny_model_dir), server={"transfer": "nccl"})


def test_a_started_server_gets_nccl_weight_transfer_only_when_asked(
    monkeypatch, model_folder, char_tokenizer
):
    from coscale.models.tiny import build_tiny_model

    model = build_tiny_model(char_tokenizer, num_heads=2)  # head size 32 for vLLM's CPU
    tiny_model_dir = model_folder("tiny32_nccl", model, char_tokenizer)
    from coscale.rollout.vllm.server import backend as server_backend

    asked = []

    def start(args, settings, ready):
        asked.append(args.get("weight_transfer_config"))
        raise ServerError("stopped here")

    monkeypatch.setattr(server_backend, "start_server", start)
    monkeypatch.setattr(server_backend.torch.cuda, "is_available", lambda: True)
    for transfer in ("files", "nccl"):
        backend = server_backend.VLLMServerBackend(
            str(tiny_model_dir), server={"transfer": transfer}
        )
        with pytest.raises(ServerError, match="stopped here"):
            backend._open(model=str(tiny_model_dir))
    assert asked == [None, {"backend": "nccl"}]
    from coscale.rollout.vllm.server.launch import serve_argv

    argv = serve_argv({"model": "m", "weight_transfer_config": {"backend": "nccl"}}, "h", 1)
    assert argv[argv.index("--weight-transfer-config") + 1] == '{"backend": "nccl"}'


class _SyncClient:
    """vLLM's HTTP sync client's methods, recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def init_weight_transfer_engine(self, init_info):
        self.calls.append(("init", init_info))

    def start_weight_update(self):
        self.calls.append(("start",))

    def update_weights(self, update_info):
        self.calls.append(("update", update_info))

    def finish_weight_update(self, weight_version=None):
        self.calls.append(("finish",))

    def shutdown_weight_transfer_engine(self):
        self.calls.append(("shutdown",))


class _Trainer:
    """vLLM's trainer engine's part: the rendezvous at init; per send, start, the metadata,
    the tensors broadcast, finish (as `NCCLTrainerWeightTransferEngine.send_weights`)."""

    sent: ClassVar[list[tuple[str, torch.Tensor]]] = []

    def __init__(self, client, source, info) -> None:
        self.client, self.source, self.info = client, source, info

    @classmethod
    def trainer_init(cls, info, *, client, source):
        client.init_weight_transfer_engine(
            {"world_size": info.world_size, "port": info.master_port}
        )
        return cls(client, source, info)

    def send_weights(self):
        meta = self.source.metadata()
        self.client.start_weight_update()
        names = [m.name for m in meta]
        shapes = [list(m.shape) for m in meta]
        self.client.update_weights({"names": names, "shapes": shapes})
        _Trainer.sent += list(self.source)
        self.client.finish_weight_update()

    def shutdown(self):
        self.client.shutdown_weight_transfer_engine()


@needs_vllm
def test_a_sync_over_nccl_sends_every_bucket_in_one_update_between_pause_and_resume(fake_server):  # noqa: F811
    from coscale.rollout.vllm.server.nccl import NcclTransport

    client, sync = ServerClient(fake_server), _SyncClient()
    workers = check_extension(client)
    settings = Server(transfer="nccl", transfer_port=29555)
    transport = NcclTransport(
        fake_server, settings, workers, True, client=sync, engine_class=_Trainer, device="cpu"
    )
    engine = ServerEngine(client, "tiny", transport=transport)
    _Trainer.sent, _FakeServer.calls[:] = [], []
    for _ in range(2):  # the first sync opens the link, the second reuses it
        engine.begin_load()
        counts = engine.load_weights([("w", torch.ones(2, 3))])
        engine.load_weights([("b", torch.zeros(1))])
        engine.end_load()
    assert counts == [None]
    assert [c[0] for c in sync.calls] == ["init"] + ["start", "update", "update", "finish"] * 2
    assert sync.calls[0][1] == {"world_size": 1 + workers, "port": 29555}
    assert sync.calls[1:3] == [("start",), ("update", {"names": ["w"], "shapes": [[2, 3]]})]
    assert [name for name, _ in _Trainer.sent] == ["w", "b", "w", "b"]
    assert torch.equal(_Trainer.sent[0][1], torch.ones(2, 3))
    # the server side is the file path's, less its load calls
    assert _FakeServer.calls == [
        "/pause?mode=wait", "/reset_prefix_cache", "/update_weight_version", "/resume"
    ] * 2  # fmt: skip
    assert client.weight_version() == engine.weight_version == "2"
    engine.shutdown()
    assert sync.calls[-1] == ("shutdown",)
