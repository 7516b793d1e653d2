"""Weights to a vLLM server on other GPUs through vLLM's own NCCL weight transfer
(``rollout.options.server.transfer: nccl``).

vLLM (``vllm/distributed/weight_transfer/``) ships both sides: the server's workers receive
into a layerwise reload (``/init_weight_transfer_engine``, ``/start_weight_update``,
``/update_weights``, ``/finish_weight_update``), and `NCCLTrainerWeightTransferEngine` on the
trainer opens the rendezvous and broadcasts a `WeightSource` while the server receives. coscale
drives one update per sync across the sync's buckets, as the file path does: the update is
started once (`NcclTransport.begin`), each bucket is one ``/update_weights`` with its broadcast
(`NcclTransport.send`, vLLM's ``send_weights`` with a client whose start and finish wait for
the sync's ends), and the update finished once (`NcclTransport.finish`). Only the trainer's
rank 0 sends; the weights it sends are already gathered (`coscale.rollout.vllm.sync`).

This module imports vLLM; it is loaded only when a server syncs over NCCL.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import Tensor
from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource
from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient
from vllm.distributed.weight_transfer.nccl_engine import (
    NCCLTrainerInitInfo,
    NCCLTrainerWeightTransferEngine,
)

from coscale.rollout.vllm.server.launch import free_port
from coscale.rollout.vllm.server.settings import ServerSettings


class BucketSource(WeightSource):
    """One bucket of gathered weights as vLLM's `WeightSource`."""

    def __init__(self, weights: Sequence[tuple[str, Tensor]]) -> None:
        self.weights = list(weights)

    def metadata(self) -> list[ParamMeta]:
        return [ParamMeta(name, t.dtype, tuple(t.shape)) for name, t in self.weights]

    def __iter__(self) -> Iterator[tuple[str, Tensor]]:
        yield from self.weights


class OneUpdateClient:
    """vLLM's HTTP sync client whose start and finish are left to the sync's own ends, so the
    buckets of one sync go into one update."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self.client.init_weight_transfer_engine(init_info)

    def shutdown_weight_transfer_engine(self) -> None:
        self.client.shutdown_weight_transfer_engine()

    def start_weight_update(self) -> None:
        """Nothing: `NcclTransport.begin` started the update."""

    def update_weights(self, update_info: Any) -> None:
        self.client.update_weights(update_info)

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        """Nothing: `NcclTransport.finish` finishes the update."""


def rendezvous_address(settings: ServerSettings, started_here: bool) -> str:
    """Where the server's workers reach this process (`ServerSettings.transfer_address`)."""
    if settings.transfer_address:
        return settings.transfer_address
    return "127.0.0.1" if started_here else socket.gethostname()


class NcclTransport:
    """Rank 0's NCCL link to the server's workers, opened at the first sync.

    Args:
        url: The server's URL.
        settings: The server group (address, port, timeout of the rendezvous).
        workers: How many workers the server runs (the NCCL group is they and this rank).
        started_here: Whether this process started the server (it then runs on this machine).
        client: The HTTP sync client (tests pass fakes); None: vLLM's.
        engine_class: The trainer engine class (tests pass fakes); None: vLLM's NCCL one.
        device: Where the tensors are broadcast from (NCCL: a CUDA device).
    """

    def __init__(
        self,
        url: str,
        settings: ServerSettings,
        workers: int,
        started_here: bool,
        client: Any = None,
        engine_class: Any = None,
        device: str = "cuda",
    ) -> None:
        self.client = client or HTTPVLLMWeightSyncClient(url, settings.request_timeout_s)
        self.engine_class = engine_class or NCCLTrainerWeightTransferEngine
        self.address = rendezvous_address(settings, started_here)
        self.port = settings.transfer_port or free_port("0.0.0.0")
        self.world_size = 1 + workers  # this rank (the sender, NCCL rank 0) + the workers
        self.trainer: Any = None
        self.device = torch.device(device)

    def begin(self) -> None:
        """Opens the link on first use, then starts one update on the server."""
        if self.trainer is None:
            info = NCCLTrainerInitInfo(
                master_address=self.address,
                master_port=self.port,
                world_size=self.world_size,
                rank=0,
            )
            self.trainer = self.engine_class.trainer_init(
                info, client=OneUpdateClient(self.client), source=BucketSource([])
            )
        self.client.start_weight_update()

    def send(self, weights: Sequence[tuple[str, Tensor]]) -> None:
        """One bucket: its metadata to the server, its tensors broadcast as they receive."""
        on_device = [(name, t.detach().to(self.device)) for name, t in weights]
        self.trainer.source = BucketSource(on_device)
        self.trainer.send_weights()

    def finish(self) -> None:
        self.client.finish_weight_update()

    def close(self) -> None:
        if self.trainer is not None:
            self.trainer.shutdown()
            self.trainer = None
