"""`VLLMServerBackend`: the run's rollouts from one vLLM server, started by coscale or attached.

It is `VLLMBackend` with the engine swapped: the same requests, seeds, sync guard, parity check
and log-prob rules, while the engine is a server every rank shares (`ServerEngine`). Under
torch.distributed rank 0 starts the server (or every rank attaches to ``server.url``) and the
others learn its URL from rank 0; a failed start stops every rank with the server's log.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import nn

from coscale.distributed import all_gather_objects, barrier, is_writer
from coscale.log import EVERY_RANK, logger
from coscale.rollout.base import Rollouts, SampleCall, SamplingParams
from coscale.rollout.vllm.backend import VLLMBackend
from coscale.rollout.vllm.server.client import ServerClient
from coscale.rollout.vllm.server.engine import ServerEngine, check_extension
from coscale.rollout.vllm.server.launch import ServerError, ServerProcess, start_server
from coscale.rollout.vllm.server.settings import ServerSettings, as_server
from coscale.rollout.vllm.settings import (
    EngineSettings,
    ParitySettings,
    SyncSettings,
    check_settings,
)

NCCL_TRANSFER = {"backend": "nccl"}
"""A started server's ``weight_transfer_config`` with ``server.transfer: nccl``."""


@dataclass
class PendingRollouts:
    """Rollouts being sampled: `result` waits for them (and fills their log-probs)."""

    future: Future
    finish: Callable[[Rollouts], Rollouts]
    version: int  # the sync whose weights sample them

    def result(self) -> Rollouts:
        return self.finish(self.future.result())


class VLLMServerBackend(VLLMBackend):
    """Rollouts from a vLLM server (``rollout.backend: vllm-server``).

    Args:
        model: Hub name or folder the server starts from (and the tokenizer's, unless given).
        tokenizer: A tokenizer object, or its name / folder.
        policy: The trainer's model: the parity reference and the log-prob recompute.
        server: Where the server runs (`coscale.rollout.vllm.server.settings.ServerSettings`:
            ``url`` to attach, else port, cores, log, timeouts of one coscale starts).
        engine: How a started server is built (`coscale.rollout.vllm.settings.EngineSettings`, as
            for the colocated engine; ``sleep_level`` must stay 0: the server keeps its memory).
        sync, parity, logprobs, honor_seed: As `VLLMBackend`'s (``sync.adapter`` must stay
            ``merged``).
        engine_factory: Builds the engine from `vllm.LLM` keyword arguments (tests pass fakes);
            None: start or attach to the server.
    """

    name = "vllm-server"
    replica = False  # one server for every rank
    _rng_guard = staticmethod(contextlib.nullcontext)  # sampling leaves this process's RNGs alone

    def __init__(
        self,
        model: str,
        tokenizer: Any = None,
        policy: nn.Module | None = None,
        server: ServerSettings | dict | None = None,
        engine: EngineSettings = EngineSettings(),
        sync: SyncSettings = SyncSettings(),
        parity: ParitySettings = ParitySettings(),
        logprobs: str = "auto",
        honor_seed: bool = True,
        engine_factory: Callable[..., Any] | None = None,
    ) -> None:
        self.server_settings = as_server(server)
        engine_group, sync_group, _ = check_settings(engine=engine, sync=sync, parity=parity)
        refuse_colocated_only(engine_group, sync_group)
        if self.server_settings.transfer == "nccl" and not torch.cuda.is_available():
            raise ValueError(
                "rollout.options.server.transfer=nccl needs CUDA on the trainer (vLLM's NCCL "
                "weight transfer goes GPU to GPU); use transfer: files"
            )
        super().__init__(model, tokenizer, policy, engine, sync, parity, logprobs, honor_seed)
        if self.server_settings.url is not None and self.policy is not None:
            # a server attached to holds whatever its last trainer loaded: sync before sampling
            self._weights_valid = False
        self._factory = engine_factory or self._open
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="coscale-rollouts")

    def _open(self, **args: Any) -> ServerEngine:
        """Starts the server (rank 0) or attaches to ``server.url`` (every rank)."""
        settings = self.server_settings
        url, process, error = settings.url, None, None
        if settings.transfer == "nccl":
            args = {**args, "weight_transfer_config": NCCL_TRANSFER}
        if url is None and is_writer():
            try:
                process, url = start_server(args, settings, lambda u: ServerClient(u).healthy())
            except ServerError as err:
                error = str(err)
        url, error = all_gather_objects([(url, error)])[0]  # rank 0's word
        if error:
            raise ServerError(error)
        client = ServerClient(url, settings.request_timeout_s, settings.concurrency)
        try:
            return self._attach(client, process)
        except BaseException:
            if process is not None:
                process.stop()
            raise

    def _attach(self, client: ServerClient, process: ServerProcess | None) -> ServerEngine:
        if process is None and not client.healthy():
            raise ServerError(
                f"no vLLM server answers at {client.url} (rollout.options.server.url): "
                "start it first, or leave server.url unset and coscale starts one"
            )
        workers = check_extension(client)
        settings = self.server_settings
        transport = None
        if settings.transfer == "nccl" and is_writer():
            from coscale.rollout.vllm.server.nccl import NcclTransport

            transport = NcclTransport(client.url, settings, workers, process is not None)
        engine = ServerEngine(client, client.served_model(), process, settings.sync_dir, transport)
        how = "started" if process is not None else "attached"
        logger.info(
            f"vLLM server {how} at {client.url} (model {engine.model}, vLLM "
            f"{engine.version}, weight version {engine.weight_version})",
            extra=EVERY_RANK,  # each rank's own client
        )
        return engine

    def submit(
        self, prompts: list[str], n_per_prompt: list[int] | int, sampling: SamplingParams
    ) -> PendingRollouts:
        """`generate` in a background thread: the sync and parity check it may need run here,
        the requests go out at once, and `PendingRollouts.result` (on this thread: it may
        recompute log-probs with the policy) gives the rollouts. The weight version they are
        sampled with is the current sync's (`PendingRollouts.version`)."""
        [ids], [counts] = self._prepare([SampleCall(prompts, n_per_prompt, sampling)])
        self._probe = ids[: self.parity_settings.prompts]
        future = self._pool.submit(self._sample, ids, counts, sampling)
        return PendingRollouts(
            future, partial(self._fill_logprobs, sampling=sampling), self.book.version
        )

    def close(self) -> None:
        """`VLLMBackend.close` once every rank is done with the server: rank 0 stops the server
        it started, and another rank may still be talking to it (every rank calls this at the
        same point, e.g. its fit's end)."""
        if self._engine is not None:
            barrier()
        super().close()

    def update_weights(self, model: nn.Module) -> None:
        """`VLLMBackend.update_weights`, then the server's reported weight version checked
        against this sync's."""
        super().update_weights(model)
        engine = self.engine
        if is_writer() and isinstance(engine, ServerEngine):
            reported = engine.client.weight_version()
            if reported != engine.weight_version:
                raise ServerError(
                    f"after sync #{engine.syncs} the vLLM server at {engine.client.url} reports "
                    f"weight version {reported!r}, expected {engine.weight_version!r}: another "
                    "trainer loads weights into it"
                )


def refuse_colocated_only(engine: EngineSettings, sync: SyncSettings) -> None:
    """Refuses the settings that only a colocated engine has, naming them."""
    errors = []
    if engine.sleep_level:
        errors.append(
            "rollout.options.engine.sleep_level must be 0 with backend vllm-server (the server "
            f"keeps its own devices' memory), got {engine.sleep_level}"
        )
    if sync.adapter != "merged":
        errors.append(
            "rollout.options.sync.adapter must be 'merged' with backend vllm-server (LoRA "
            f"requests go to a colocated engine), got {sync.adapter!r}"
        )
    if errors:
        raise ValueError("VLLMServerBackend: " + "; ".join(errors))
