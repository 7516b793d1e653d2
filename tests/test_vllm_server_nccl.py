"""``rollout.options.server.transfer: nccl`` without a GPU: its settings and refusals, the flag a
started server gets, and one sync's steps on a fake server, with vLLM's trainer engine replaced
by a fake that plays its part of the handshake (the NCCL broadcast itself needs GPUs:
benchmarks/gpu_check.py ``vllm-server`` runs it)."""

from __future__ import annotations

import importlib.util
import json
import socket
import threading
from http.server import ThreadingHTTPServer
from typing import ClassVar
from urllib.parse import urlparse

import pytest
import torch
from test_vllm_server_logic import _FakeServer, fake_server  # noqa: F401  (the fixture)

from coscale.rollout.vllm.server.client import ServerClient
from coscale.rollout.vllm.server.engine import ServerEngine, check_extension
from coscale.rollout.vllm.server.launch import (
    WORKER_EXTENSION,
    ServerError,
    serve_argv,
    server_module,
)
from coscale.rollout.vllm.server.settings import ServerSettings, server_errors

FLAG = "--weight-transfer-config"
"""vLLM's engine argument that gives a server its weight transfer engine."""
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
    from coscale.rollout.vllm.server import backend as server_backend

    model = build_tiny_model(char_tokenizer, num_heads=2)  # head size 32 for vLLM's CPU
    tiny_model_dir = model_folder("tiny32_nccl", model, char_tokenizer)
    argvs = []

    def start(args, settings, ready):  # the command line start_server would run
        argvs.append(serve_argv(args, settings.host, 8011))
        raise ServerError("stopped here")

    monkeypatch.setattr(server_backend, "start_server", start)
    monkeypatch.setattr(server_backend.torch.cuda, "is_available", lambda: True)
    for transfer in ("files", "nccl"):
        backend = server_backend.VLLMServerBackend(
            str(tiny_model_dir), server={"transfer": transfer}
        )
        with pytest.raises(ServerError, match="stopped here"):
            backend._open(model=str(tiny_model_dir))
    files, nccl = argvs
    assert FLAG not in files
    assert nccl[nccl.index(FLAG) + 1] == '{"backend": "nccl"}'
    assert [a for a in nccl if a not in (FLAG, '{"backend": "nccl"}')] == files  # nothing else


@needs_vllm
def test_vllm_s_own_server_parser_reads_the_flag_as_its_nccl_weight_transfer():
    from vllm.config.weight_transfer import WeightTransferConfig
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    args = {"model": "m", "weight_transfer_config": {"backend": "nccl"}, "enforce_eager": True}
    argv = serve_argv(args, "127.0.0.1", 8011)
    assert argv[1:3] == ["-m", server_module()]
    parsed = make_arg_parser(FlexibleArgumentParser()).parse_args(argv[3:])
    assert parsed.weight_transfer_config == WeightTransferConfig(backend="nccl")
    assert parsed.worker_extension_cls == WORKER_EXTENSION and parsed.port == 8011
    unset = make_arg_parser(FlexibleArgumentParser()).parse_args(
        serve_argv({"model": "m"}, "h", 1)[3:]
    )
    assert unset.weight_transfer_config is None


@needs_vllm
def test_the_rendezvous_address_is_local_for_a_started_server_else_this_host():
    from coscale.rollout.vllm.server.nccl import rendezvous_address

    assert rendezvous_address(ServerSettings(transfer="nccl"), started_here=True) == "127.0.0.1"
    assert (
        rendezvous_address(ServerSettings(transfer="nccl"), started_here=False)
        == socket.gethostname()
    )
    given = ServerSettings(transfer="nccl", transfer_address="10.0.0.2")
    assert rendezvous_address(given, started_here=True) == "10.0.0.2"


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
    settings = ServerSettings(transfer="nccl", transfer_port=29555)
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


# --------------------------------------------------------------- vLLM's own trainer engine
WEIGHT_ROUTES = (
    "/init_weight_transfer_engine", "/start_weight_update", "/update_weights",
    "/finish_weight_update", "/shutdown_weight_transfer_engine",
)  # fmt: skip
"""The routes of vLLM's RL router that its HTTP sync client calls."""


class _WeightServer(_FakeServer):
    """The fake server, with vLLM's weight transfer routes recorded with their bodies; the route
    in `fail` answers 500."""

    bodies: ClassVar[dict[str, list]] = {}
    fail: ClassVar[str | None] = None

    def do_POST(self) -> None:
        path = urlparse(self.path).path
        if path not in WEIGHT_ROUTES:
            return super().do_POST()
        raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.calls.append(path)
        self.bodies.setdefault(path, []).append(json.loads(raw) if raw else None)
        if path == type(self).fail:
            self.send_response(500)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        return self._answer({"message": "ok"})


@pytest.fixture
def weight_server():
    _FakeServer.calls, _WeightServer.version = [], "0"
    _WeightServer.bodies, _WeightServer.fail = {}, None
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _WeightServer)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


class _Nccl:
    """What vLLM's trainer engine asks of NCCL: its endpoint opened, buckets broadcast."""

    def __init__(self) -> None:
        self.opened: list = []
        self.sent: list[tuple[str, torch.Tensor]] = []
        self.destroyed = 0

    def open_endpoint(self, init_info):  # nccl_common.trainer_init
        self.opened.append(init_info)
        return self

    def broadcast(self, iterator, group, src, post_iter_func, **buffers):  # the packed producer
        assert group is self and src == 0
        self.sent += [(name, post_iter_func((name, t))) for name, t in iterator]

    def destroy(self) -> None:
        self.destroyed += 1


@pytest.fixture
def nccl(monkeypatch):
    """vLLM's NCCLTrainerWeightTransferEngine, real but for its NCCL calls (`_Nccl`)."""
    pytest.importorskip("vllm")
    from vllm.distributed.weight_transfer import nccl_engine

    fake = _Nccl()
    monkeypatch.setattr(nccl_engine, "open_trainer_endpoint", fake.open_endpoint)
    monkeypatch.setattr(nccl_engine, "packed_nccl_broadcast_producer", fake.broadcast)
    return fake


def _engine(url: str) -> ServerEngine:
    """A server engine whose syncs go through vLLM's trainer engine and HTTP sync client."""
    from coscale.rollout.vllm.server.nccl import NcclTransport

    client = ServerClient(url)
    workers = check_extension(client)
    settings = ServerSettings(transfer="nccl", transfer_port=29555)
    transport = NcclTransport(url, settings, workers, started_here=True, device="cpu")
    return ServerEngine(client, "tiny", transport=transport)


def test_vllm_s_trainer_engine_drives_the_sync_s_routes_and_broadcasts_every_bucket(
    weight_server, nccl
):
    engine = _engine(weight_server)
    w, v, b = torch.ones(2, 3), torch.full((3,), 2.0), torch.zeros(4, dtype=torch.bfloat16)
    _FakeServer.calls.clear()
    for _ in range(2):  # the first sync opens the link, the second reuses it
        engine.begin_load()
        assert engine.load_weights([("w", w), ("v", v)]) == [None]
        engine.load_weights(iter([("b", b)]))
        engine.end_load()
    one = ["/start_weight_update", "/update_weights", "/update_weights", "/finish_weight_update",
           "/reset_prefix_cache", "/update_weight_version", "/resume"]  # fmt: skip
    assert _FakeServer.calls == (
        ["/pause?mode=wait", "/init_weight_transfer_engine", *one, "/pause?mode=wait", *one]
    )
    # the rendezvous: the trainer is NCCL rank 0 of 1 + the server's one worker
    (opened,) = nccl.opened
    assert (opened.master_address, opened.master_port, opened.world_size, opened.rank) == (
        "127.0.0.1", 29555, 2, 0
    )  # fmt: skip
    (init,) = _WeightServer.bodies["/init_weight_transfer_engine"]
    info = init["init_info"]
    assert {k: info[k] for k in ("master_address", "master_port", "rank_offset", "world_size")} == {
        "master_address": "127.0.0.1", "master_port": 29555, "rank_offset": 1, "world_size": 2
    }  # fmt: skip
    assert info["packed"] is opened.packed  # the workers unpack as the trainer packs
    # one update per sync: each bucket's metadata, its tensors broadcast
    assert (
        _WeightServer.bodies["/update_weights"]
        == [
            {
                "update_info": {
                    "names": ["w", "v"],
                    "dtype_names": ["float32"] * 2,
                    "shapes": [[2, 3], [3]],
                }
            },
            {"update_info": {"names": ["b"], "dtype_names": ["bfloat16"], "shapes": [[4]]}},
        ]
        * 2
    )
    assert _WeightServer.bodies["/start_weight_update"] == [None, None]
    assert _WeightServer.bodies["/finish_weight_update"] == [None, None]
    assert [name for name, _ in nccl.sent] == ["w", "v", "b"] * 2
    assert torch.equal(nccl.sent[1][1], v) and nccl.sent[2][1].dtype == torch.bfloat16
    assert ServerClient(weight_server).weight_version() == engine.weight_version == "2"
    engine.shutdown()
    assert nccl.destroyed == 1


def test_a_bucket_the_server_refuses_is_a_server_error_saying_what_failed(weight_server, nccl):
    engine = _engine(weight_server)
    _WeightServer.fail = "/update_weights"
    engine.begin_load()
    with pytest.raises(ServerError, match=r"failed while sending weights over NCCL: HTTPError"):
        engine.load_weights([("w", torch.ones(2))])
    # the server's refusal may come back before or after the broadcast went out (two threads)
    assert [name for name, _ in nccl.sent] in ([], ["w"])
    _WeightServer.fail = "/init_weight_transfer_engine"
    fresh = _engine(weight_server)
    with pytest.raises(ServerError, match=r"failed while opening a weight load: HTTPError"):
        fresh.begin_load()
