"""The ``server`` group of `VLLMServerBackend`: where the server runs and how it is reached.

In YAML it sits beside the colocated engine's groups::

    rollout:
      backend: vllm-server
      options:
        server: {port: 8011, cores: [1], log: runs/x/vllm-server.log}
        engine: {max_model_len: 1024, kwargs: {enforce_eager: true}}

or attaches to a server started by hand (``vllm serve MODEL --worker-extension-cls
coscale.rollout.vllm.server.worker.WorkerExtension`` with ``VLLM_SERVER_DEV_MODE=1``)::

        server: {url: http://gpu-node-3:8000}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from coscale.checks import as_group, at_least, group_errors
from coscale.renamed import old_names

TRANSFERS = ("files", "nccl")
"""Ways a weight sync reaches the server (`ServerSettings.transfer`)."""


@dataclass(frozen=True)
class ServerSettings:
    """Where the rollout server runs and how coscale talks to it.

    Attributes:
        url: A running server to attach to (``http://host:port``); None: coscale starts one
            (rank 0 under torch.distributed; every rank samples from it).
        host: Interface a started server listens on.
        port: Its port; None: a free one.
        cores: CPU ids a started server runs on (its OpenMP threads, one per core); None: the
            machine's, shared with the trainer.
        devices: GPU ids a started server runs on (its ``CUDA_VISIBLE_DEVICES``); None: the
            ones this process sees. Give it GPUs the trainer does not use for ``transfer: nccl``
            (NCCL links two processes on two GPUs, not one).
        log: File a started server writes its output to; None: ``vllm-server-<port>.log`` in
            the system's temporary folder. Its last lines are in every error about it.
        start_timeout_s: Longest wait for a started server to answer ``/health``.
        request_timeout_s: Longest wait for one HTTP call (a completion of max_new_tokens).
        concurrency: Requests in flight from one rank (vLLM batches them continuously).
        sync_dir: Folder for the weight files of a sync on a server without a transfer engine
            (its CPU build): it must be visible to the server (same machine); None:
            ``/dev/shm`` where it exists, else the temporary folder.
        transfer: How a sync reaches the server: ``files`` (safetensors files in `sync_dir`,
            loaded through ``/collective_rpc``; any build, same machine) or ``nccl`` (vLLM's
            NCCL weight transfer, GPU to GPU: a started server gets
            ``--weight-transfer-config {"backend": "nccl"}``, one you attach to must have it;
            needs CUDA on the trainer).
        transfer_address: Address of the trainer's rank 0 that the server's workers reach for
            the NCCL rendezvous; None: 127.0.0.1 for a server coscale started, else this
            machine's host name.
        transfer_port: Port of that rendezvous; None: a free one.
    """

    url: str | None = None
    host: str = "127.0.0.1"
    port: int | None = None
    cores: tuple[int, ...] | None = None
    devices: tuple[int, ...] | None = None
    log: str | None = None
    start_timeout_s: float = 900.0
    request_timeout_s: float = 3600.0
    concurrency: int = 64
    sync_dir: str | None = None
    transfer: str = "files"
    transfer_address: str | None = None
    transfer_port: int | None = None

    def errors(self) -> list[str]:
        errors: list[str] = []
        if self.url is not None and not str(self.url).startswith(("http://", "https://")):
            errors.append(f"url must start with http:// or https://, got {self.url!r}")
        errors += at_least(1, optional=True, port=self.port)
        errors += at_least(1, optional=True, transfer_port=self.transfer_port)
        if self.transfer not in TRANSFERS:
            errors.append(f"transfer must be one of {', '.join(TRANSFERS)}, got {self.transfer!r}")
        errors += at_least(0, float, strict=True, start_timeout_s=self.start_timeout_s)
        errors += at_least(0, float, strict=True, request_timeout_s=self.request_timeout_s)
        errors += at_least(1, concurrency=self.concurrency)
        for name, ids, what in (("cores", self.cores, "CPU"), ("devices", self.devices, "GPU")):
            valid = isinstance(ids, list | tuple) and ids and all(_core(c) for c in ids)
            if ids is not None and not valid:
                errors.append(
                    f"{name} must be a non-empty list of {what} ids (ints >= 0), got {ids!r}"
                )
        return errors


def _core(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def server_errors(value: Any) -> list[str]:
    """Every bad value of a ``server`` group given as a mapping, a `ServerSettings` or None, each
    named ``server.<key> ...``."""
    if value is None or isinstance(value, ServerSettings):
        return [] if value is None else [f"server.{e}" for e in value.errors()]
    if not isinstance(value, dict):
        return [f"server must be a mapping or a ServerSettings, got {value!r}"]
    takes = set(ServerSettings.__dataclass_fields__)
    unknown = sorted(set(value) - takes)
    if unknown:
        return [
            f"server.{k} is not a server setting (it takes: {', '.join(sorted(takes))})"
            for k in unknown
        ]
    return group_errors(server=as_group(ServerSettings, value))


def as_server(value: ServerSettings | dict | None) -> ServerSettings:
    """`value` as a `ServerSettings` (defaults for None); raises ValueError naming every bad
    value."""
    if errors := server_errors(value):
        raise ValueError("VLLMServerBackend: " + "; ".join(f"rollout.options.{e}" for e in errors))
    return as_group(ServerSettings, value) or ServerSettings()


# the classes' earlier names, for one release
__getattr__ = old_names(__name__, {"Server": ServerSettings})
