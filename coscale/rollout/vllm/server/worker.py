"""coscale's extension of vLLM's workers (``--worker-extension-cls``), called through the
server's ``/collective_rpc``: a weight load in three steps, the same steps the colocated engine
runs in-process (`coscale.rollout.vllm.reload`), with each bucket read from a safetensors file
the trainer wrote (arguments over HTTP are strings).

This module is imported inside vLLM's worker process, never by the trainer.
"""

from __future__ import annotations

from safetensors.torch import load_file

from coscale.rollout.vllm.reload import finish_load, load_bucket, start_load

PING = "coscale-worker-extension"
"""What `WorkerExtension.coscale_ping` answers: proof that a server loaded this extension."""


class WorkerExtension:
    """Mixed into vLLM's worker class by vLLM; ``self`` is the worker."""

    def coscale_ping(self) -> str:
        return PING

    def coscale_begin_load(self) -> bool:
        return start_load(self)

    def coscale_load_file(self, path: str) -> int | None:
        """Loads every tensor of the safetensors file `path`; how many the model took."""
        return load_bucket(self, list(load_file(path).items()))

    def coscale_end_load(self) -> int:
        return finish_load(self)
