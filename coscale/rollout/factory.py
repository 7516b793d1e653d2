"""Choosing a rollout backend (``rollout: {backend: cached | hf | vllm | vllm-server, options: {...}}`` in YAML).

The vLLM backend is imported only when chosen, and without vllm installed the choice itself
fails with "install coscale[vllm] to use the vLLM rollout backend". `close_backend` frees what a
backend holds outside Python's reach (a vLLM engine's GPU memory) when its stage ends, and
accepts a backend never built.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
from dataclasses import dataclass, field
from typing import Any, Literal

from torch import nn

from coscale.renamed import old_names
from coscale.rollout.base import RolloutBackend
from coscale.rollout.cached import CachedDecodeBackend
from coscale.rollout.hf import HFGenerateBackend

BACKENDS = ("auto", "cached", "hf", "vllm", "vllm-server")
"""Backend names `build_backend` accepts (``auto``: `resolve_backend` picks one)."""

_BUILT_BY_US = {"model", "tokenizer", "policy"}  # arguments the factory passes itself


@dataclass(frozen=True)
class RolloutSettings:
    """Where the rollouts come from: one backend, with its own options.

    Attributes:
        backend: ``cached`` (coscale's decode loop on the policy: shared prompt prefill,
            finished rows dropped, a preallocated KV cache; the default), ``hf`` (HF
            ``generate`` on the policy: the same distribution, slower), ``vllm`` (a colocated
            engine that gets the policy's weights after every optimiser step; needs
            ``coscale[vllm]``, or vLLM's CPU build as ``./run.sh`` installs it),
            ``vllm-server`` (one ``vllm serve`` for every rank, started by coscale or attached
            by URL; the weights reach it through vLLM's RL routes) or ``auto``
            (`resolve_backend`: vLLM where it is installed and the policy is on a CUDA device,
            else ``cached``).
        options: The backend's own arguments: ``cached``: ``compile`` (each decode step one
            ``torch.compile``d forward; full-attention models), ``batch_size``, ...; ``hf``:
            ``batch_size``; ``vllm``: ``VLLMBackend``'s groups and switches (``engine:
            {gpu_memory_utilization, kv_cache_gib, max_model_len, sleep_level, kwargs, ...}``,
            ``sync: {timeout_s, ...}``, ``parity: {every, atol, ...}``, ``logprobs``, ...);
            ``vllm-server``: the same and ``server: {url, port, cores, log, ...}``.
    """

    backend: Literal["auto", "cached", "hf", "vllm", "vllm-server"] = "cached"
    options: dict[str, Any] = field(default_factory=dict)

    def errors(self) -> list[str]:
        if self.backend not in BACKENDS:
            return [f"backend must be one of {', '.join(BACKENDS)}; got {self.backend!r}"]
        if self.backend == "auto":  # its options are those of the backend it resolves to
            return []
        takes = set(inspect.signature(backend_class(self.backend)).parameters) - _BUILT_BY_US
        errors = [
            f"options.{key} is not an option of the {self.backend} backend (it takes: "
            f"{', '.join(sorted(takes))}){_grouped_as(self.backend, key)}"
            for key in sorted(set(self.options) - takes)
        ]
        if self.backend in ("vllm", "vllm-server"):  # its groups' values, without an engine
            from coscale.rollout.vllm.settings import settings_errors

            errors += [f"options.{e}" for e in settings_errors(self.options)]
        if self.backend == "vllm-server":
            from coscale.rollout.vllm.server.settings import server_errors

            errors += [f"options.{e}" for e in server_errors(self.options.get("server"))]
        return errors


def _grouped_as(kind: str, key: str) -> str:
    """``; set options.engine.max_model_len`` for a vLLM setting given outside its group."""
    if kind not in ("vllm", "vllm-server"):
        return ""
    from coscale.rollout.vllm.settings import group_of

    where = group_of(key)
    return "" if where is None else f"; set options.{where}"


def backend_class(kind: str) -> type:
    if kind == "vllm":  # by its module's name: importing it needs no vllm, building it does
        from coscale.rollout.vllm.backend import VLLMBackend

        return VLLMBackend
    if kind == "vllm-server":
        from coscale.rollout.vllm.server.backend import VLLMServerBackend

        return VLLMServerBackend
    return CachedDecodeBackend if kind == "cached" else HFGenerateBackend


def resolve_backend(kind: str, cuda: bool) -> tuple[str, str]:
    """``kind``, or for ``auto`` the backend this machine samples fastest with, and why.

    vLLM where it is installed and the policy is on a CUDA device (continuous batching, paged
    KV cache). Elsewhere the cached decode, which samples faster than HF ``generate``; vLLM's
    CPU build is faster again, but its start and second copy of the weights do not pay back on
    a short run, so on CPU it is chosen only when asked for (the measurements: docs/results.md).
    """
    if kind != "auto":
        return kind, f"rollout.backend={kind}"
    if cuda and importlib.util.find_spec("vllm") is not None:
        return "vllm", "rollout auto -> vllm: vLLM is installed and the policy is on CUDA"
    why = "no CUDA device" if not cuda else "vllm is not installed (pip install coscale[vllm])"
    return "cached", (
        f"rollout auto -> cached ({why}): the cached decode samples faster than HF generate "
        "here; set rollout.backend: vllm to use vLLM's CPU build"
    )


def build_backend(
    kind: str | RolloutBackend,
    policy: nn.Module | None,
    tokenizer: Any,
    model_path: str | os.PathLike | None = None,
    dtype: str | None = None,
    **options: Any,
) -> RolloutBackend:
    """The rollout backend `kind`, sampling from `policy`.

    Args:
        kind: ``cached`` (coscale's decode loop on the policy), ``hf`` (HF ``generate`` on the
            policy), ``vllm`` (a colocated engine loading `model_path`, then following
            ``update_weights``), ``vllm-server`` (a vLLM server, started or attached, synced the
            same way), ``auto`` (:func:`resolve_backend`) or a `RolloutBackend` (kept).
        policy: The trainer's model (None only for a vLLM engine used for evaluation).
        tokenizer: The policy's tokenizer.
        model_path: Hub name or folder of the policy's current weights (``builtin:`` specs are
            resolved); the vLLM engine starts from it.
        dtype: The compute dtype of an engine with its own weights (vLLM) where its options
            leave ``engine.dtype`` unset (`coscale.rollout.dtype.engine_dtype`: the trainer's
            precision); None: the policy's parameter dtype.
        **options: Arguments of the backend's class (:func:`backend_class` of `kind`:
            `CachedDecodeBackend`, `HFGenerateBackend`, `VLLMBackend` or `VLLMServerBackend`).

    Raises:
        ValueError: For an unknown `kind`, or ``vllm`` / ``vllm-server`` without `model_path`.
        ImportError: For ``vllm`` when vllm is not installed.
    """
    if isinstance(kind, RolloutBackend):
        return kind
    if kind == "auto":
        on_cuda = policy is not None and next(policy.parameters()).device.type == "cuda"
        kind = resolve_backend(kind, on_cuda)[0]
    if kind in ("cached", "hf"):
        if policy is None:
            raise ValueError(f"rollout.backend={kind!r} samples from the policy: give the policy")
        return backend_class(kind)(policy, tokenizer, **options)
    if kind in ("vllm", "vllm-server"):
        if model_path is None:
            raise ValueError(
                f"rollout.backend={kind!r} needs model_path, the folder or hub name the engine "
                "loads (export the policy with save_pretrained first)"
            )
        from coscale.models.policy import resolve_model_path
        from coscale.rollout.vllm.settings import with_dtype

        path = resolve_model_path(os.fspath(model_path))
        options = with_dtype(options, dtype)
        return backend_class(kind)(path, tokenizer=tokenizer, policy=policy, **options)
    raise ValueError(f"rollout.backend must be one of {', '.join(BACKENDS)}, got {kind!r}")


def close_backend(backend: RolloutBackend | None) -> None:
    """`RolloutBackend.close` on `backend`, or nothing for None (a backend never built).

    Under torch.distributed every rank calls it at the same point.
    """
    if backend is not None:
        backend.close()


# the classes' earlier names, for one release
__getattr__ = old_names(__name__, {"Rollout": RolloutSettings})
