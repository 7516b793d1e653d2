"""What a model can do, asked in one place: the dtype names coscale takes, which keywords its
``forward`` accepts (a cache, ``logits_to_keep``), whether it recomputes activations, whether
every layer attends to the whole prefix. The speed paths of SFT, GRPO and the cached decode
read these probes; none of them asks the model itself.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""The weights' dtype names a setting takes (``dtype:`` of the policy, reward model, engine)."""


def dtype_name(dtype: torch.dtype) -> str | None:
    """The name of ``dtype`` in :data:`DTYPES` (None: another dtype)."""
    return next((name for name, d in DTYPES.items() if d == dtype), None)


def unwrapped(model: nn.Module) -> nn.Module:
    """The model a PEFT wrapper runs (its ``get_base_model()``, adapter layers included), whose
    signature and class say which speed paths apply; any other `model` as it is."""
    base = getattr(model, "get_base_model", None)
    return base() if callable(base) else model


def accepts(model: nn.Module, name: str) -> bool:
    """Whether `model.forward` has a parameter `name` (a PEFT wrapper's base model's: the
    wrapper hands it every keyword it does not take itself)."""
    try:
        return name in inspect.signature(unwrapped(model).forward).parameters
    except (TypeError, ValueError):
        return False


def keep_last_logits(model: nn.Module, count: int) -> dict[str, int]:
    """`logits_to_keep=count` when `model.forward` takes it (skips the prompt's logits)."""
    return {"logits_to_keep": count} if accepts(model, "logits_to_keep") else {}


def cache_kwargs(model: nn.Module, cache: object) -> dict[str, Any]:
    """Keywords that make `model` read and extend `cache`: ``cache`` in transformers 5
    signatures, ``past_key_values`` before."""
    name = "cache" if accepts(model, "cache") else "past_key_values"
    return {name: cache, "use_cache": True}


def recomputes_activations(model: nn.Module) -> bool:
    """Activation checkpointing anywhere in `model`, HF's (a module's ``gradient_checkpointing``
    flag, what ``is_gradient_checkpointing`` reads; HF then runs without a cache) or torch's
    ``checkpoint_wrapper``. It runs every step, so it reads each module's own attributes
    (``nn.Module.__getattr__`` on a missing name raises, which made this walk ~0.4 ms on a
    111-module model)."""
    return any(
        m.__dict__.get("gradient_checkpointing", getattr(type(m), "gradient_checkpointing", False))
        or "_checkpoint_wrapped_module" in m._modules
        for m in model.modules()
    )


def full_attention_only(config: Any) -> bool:
    """Whether every layer attends to the whole prefix. Sliding-window or linear-attention layers
    need HF's own cache layers. A config without ``layer_types`` (Mistral) slides wherever it
    sets ``sliding_window``."""
    kinds = getattr(config, "layer_types", None)
    if kinds is None:
        kinds = ["full_attention" if getattr(config, "sliding_window", None) is None else "sliding"]
    return set(kinds) == {"full_attention"} and hasattr(config, "num_hidden_layers")
