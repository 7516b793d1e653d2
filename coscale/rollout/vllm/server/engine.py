"""A vLLM server seen through the engine calls `VLLMBackend` makes (`ServerEngine`), so the
backend's sync guard, parity check and log-prob rules hold unchanged for a server.

A weight sync: every rank meets (`begin_load`); rank 0 pauses the server once the requests in
flight are done (``/pause?mode=wait``), opens a load on every worker, writes each bucket to a
safetensors file in the sync folder and has the workers load it (``/collective_rpc``: the same
layerwise reload as the colocated engine), closes the load, drops cached prompts, sets the
server's weight version to the sync's number and resumes it; then every rank meets again
(`end_load`), so none samples from half-loaded weights. That file path works wherever the
server sees the trainer's files, the CPU build included. With ``server.transfer: nccl`` the
same steps carry the buckets over vLLM's NCCL weight transfer instead of files
(`coscale.rollout.vllm.server.nccl`): a server on other GPUs or machines.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from safetensors.torch import save_file
from torch import Tensor

from coscale.distributed import barrier, is_writer
from coscale.rollout.vllm.engine import VLLMEngine
from coscale.rollout.vllm.requests import Request
from coscale.rollout.vllm.server.client import UNREACHABLE, ServerClient
from coscale.rollout.vllm.server.launch import ServerError, ServerProcess
from coscale.rollout.vllm.server.worker import PING

T = TypeVar("T")
DEATH_WAIT_S = 5.0
"""How long a failed call waits for a started server to show it died (its exit code, its log)
before the error says only that the call failed."""


def sync_folder(sync_dir: str | None) -> str:
    """Where sync files go: `sync_dir`, else ``/dev/shm`` (memory) where it exists."""
    if sync_dir:
        os.makedirs(sync_dir, exist_ok=True)
        return sync_dir
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def per_worker(results: Sequence[Any]) -> list[int | None]:
    """``/collective_rpc`` results (ints come back as strings) as counts per worker."""
    return [None if r in (None, "None") else int(r) for r in results]


class ServerEngine:
    """A running vLLM server: sampling, weight loads, facts about it.

    Args:
        client: Its routes.
        model: The name it serves the model under.
        process: The server when this process started it (stopped by `shutdown`); None when
            attached or on another rank.
        sync_dir: Folder for sync files (`sync_folder`).
        transport: Rank 0's NCCL link (`coscale.rollout.vllm.server.nccl.NcclTransport`);
            None: files.
    """

    def __init__(
        self,
        client: ServerClient,
        model: str,
        process: ServerProcess | None = None,
        sync_dir: str | None = None,
        transport: Any = None,
    ) -> None:
        self.client, self.model, self.process = client, model, process
        self.transport = transport
        self.sync_dir, self.syncs, self.files = sync_folder(sync_dir), 0, 0
        self.version = client.version()
        mode = (client.config().get("model_config") or {}).get("logprobs_mode")
        self.logprobs_mode = None if mode is None else str(mode)
        self.weight_version: str | None = client.weight_version()

    # --------------------------------------------------------------- sampling
    def generate(self, requests: Sequence[Request], lora: Any = None) -> list[Any]:
        """One engine-shaped output per request, in request order (`ServerClient.complete`)."""
        if lora is not None:
            raise ValueError(
                "rollout.options.sync.adapter=lora is not available with backend vllm-server; "
                "use sync.adapter: merged"
            )
        return self._checked("sampling", lambda: self.client.complete(self.model, requests))

    # --------------------------------------------------------------- weight loads
    def begin_load(self) -> None:
        barrier()
        self.syncs += 1
        if is_writer():
            self._checked("pausing for a weight sync", self.client.pause)
            if self.transport is not None:
                self._checked("opening a weight load", self.transport.begin)
            else:
                open_load = lambda: self.client.rpc("coscale_begin_load")  # noqa: E731
                self._checked("opening a weight load", open_load)

    def load_weights(self, weights: Iterable[tuple[str, Tensor]]) -> list[int | None]:
        """Rank 0 sends one bucket: a file the workers load (their counts), or over NCCL ([None]:
        vLLM's workers do not count); other ranks report None."""
        if not is_writer():
            return [None]
        if self.transport is not None:  # the workers do not count what they took
            self._checked("sending weights over NCCL", lambda: self.transport.send(list(weights)))
            return [None]
        self.files += 1
        path = os.path.join(self.sync_dir, f"coscale-sync-{os.getpid()}-{self.files}.safetensors")
        save_file({name: t.detach().contiguous().cpu() for name, t in weights}, path)
        try:
            load = lambda: self.client.rpc("coscale_load_file", path)  # noqa: E731
            return per_worker(self._checked(f"loading {path}", load))
        finally:
            os.remove(path)

    def end_load(self) -> None:
        """Rank 0 closes the load and resumes the server at weight version `syncs`; then every
        rank meets."""
        self.weight_version = str(self.syncs)
        if is_writer():
            if self.transport is not None:
                self._checked("closing a weight load", self.transport.finish)
            else:
                close = lambda: self.client.rpc("coscale_end_load")  # noqa: E731
                self._checked("closing a weight load", close)
            self._checked("resetting the prefix cache", self.client.reset_prefix_cache)
            self._checked(
                "setting the weight version",
                lambda: self.client.set_weight_version(str(self.weight_version)),
            )
            self._checked("resuming after a weight sync", self.client.resume)
        barrier()

    def reset_prefix_cache(self) -> None:
        """Nothing: `end_load` reset it before the server resumed."""

    # --------------------------------------------------------------- facts
    logprobs_match = VLLMEngine.logprobs_match  # by the server's version and logprobs_mode

    def shutdown(self) -> None:
        """Stops the server if this process started it; idempotent."""
        process, self.process = self.process, None
        transport, self.transport = self.transport, None
        if transport is not None:
            transport.close()
        self.client.close()
        if process is not None:
            process.stop()

    def _checked(self, doing: str, call: Callable[[], T]) -> T:
        """`call()`, with a failure turned into a `ServerError` that says what happened to the
        server (its exit code and log, when this process started it)."""
        try:
            return call()
        except UNREACHABLE as err:
            if self.process is not None:
                self.process.check_alive(doing, wait_s=DEATH_WAIT_S)
            raise ServerError(
                f"the vLLM server at {self.client.url} failed while {doing}: "
                f"{type(err).__name__}: {err}"
            ) from err


def check_extension(client: ServerClient) -> int:
    """How many workers the server runs; raises `ServerError` unless every one runs coscale's
    extension."""
    try:
        answers = client.rpc("coscale_ping", timeout_s=60.0)
    except UNREACHABLE as err:
        answers = [f"{type(err).__name__}: {err}"]
    if not answers or any(a != PING for a in answers):
        raise ServerError(
            f"the vLLM server at {client.url} does not run coscale's worker extension "
            f"(answers {answers!r}); start it with VLLM_SERVER_DEV_MODE=1 and "
            "--worker-extension-cls coscale.rollout.vllm.server.worker.WorkerExtension"
        )
    return len(answers)
