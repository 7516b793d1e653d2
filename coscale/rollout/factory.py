"""Choosing a rollout backend by name (``rollout_backend: hf | vllm`` in YAML) or passing one.

The vLLM backend is imported only when chosen, and without vllm installed the choice itself
fails with "install coscale[vllm] to use the vLLM rollout backend". `close_backend` frees what a
backend holds outside Python's reach (a vLLM engine's GPU memory) when its stage ends, and
accepts a backend never built.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from coscale.rollout.base import RolloutBackend
from coscale.rollout.hf import HFGenerateBackend

BACKENDS = ("hf", "vllm")
"""Backend names `build_backend` accepts."""


def build_backend(
    kind: str | RolloutBackend,
    policy: nn.Module | None,
    tokenizer: Any,
    model_path: str | os.PathLike | None = None,
    **options: Any,
) -> RolloutBackend:
    """The rollout backend `kind`, sampling from `policy`.

    Args:
        kind: ``hf`` (HF ``generate`` on the policy), ``vllm`` (a colocated engine loading
            `model_path`, then following ``update_weights``) or a `RolloutBackend` (kept).
        policy: The trainer's model (None only for a vLLM engine used for evaluation).
        tokenizer: The policy's tokenizer.
        model_path: Hub name or folder of the policy's current weights (``builtin:`` specs are
            resolved); the vLLM engine starts from it.
        **options: Arguments of the backend's class (`HFGenerateBackend` or `VLLMBackend`);
            a vLLM engine without ``dtype`` computes in the policy's (`engine_dtype`).

    Raises:
        ValueError: For an unknown `kind`, or ``vllm`` without `model_path`.
        ImportError: For ``vllm`` when vllm is not installed.
    """
    if isinstance(kind, RolloutBackend):
        return kind
    if kind == "hf":
        if policy is None:
            raise ValueError("rollout_backend='hf' samples from the policy: policy must be given")
        return HFGenerateBackend(policy, tokenizer, **options)
    if kind == "vllm":
        if model_path is None:
            raise ValueError(
                "rollout_backend='vllm' needs model_path, the folder or hub name the engine "
                "loads (export the policy with save_pretrained first)"
            )
        from coscale.models.policy import resolve_model_path
        from coscale.rollout.vllm import VLLMBackend

        path = resolve_model_path(os.fspath(model_path))
        if policy is not None and "dtype" not in options:
            options["dtype"] = engine_dtype(policy)
        return VLLMBackend(path, tokenizer=tokenizer, policy=policy, **options)
    raise ValueError(f"rollout_backend must be one of {', '.join(BACKENDS)}, got {kind!r}")


def engine_dtype(policy: nn.Module) -> str:
    """The policy's parameter dtype as a vLLM ``dtype``: an engine that computes in the trainer's
    precision samples what the trainer scores (vLLM's ``auto`` may run a float32 checkpoint in
    16 bits, which on a CPU without native bf16 is also slow)."""
    dtype = next(policy.parameters()).dtype
    return {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}.get(
        dtype, "auto"
    )


def close_backend(backend: RolloutBackend | None) -> None:
    """`RolloutBackend.close` on `backend`, or nothing for None (a backend never built).

    Under torch.distributed every rank calls it at the same point.
    """
    if backend is not None:
        backend.close()
