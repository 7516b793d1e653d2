"""A checkpoint of an adapter fit holds the adapter and its optimizer state, not the frozen base.

The base under an adapter never changes during a fit, and a resumed fit builds it again from the
same ``model`` setting, so a checkpoint that saved it would hold a second copy of the initial
model every step. :func:`drop_frozen_base` removes the frozen parameters from a checkpoint's
``state_dict`` and stores a fingerprint of them (SHA-256 of names, shapes, dtypes and bytes);
:func:`restore_frozen_base` puts the live module's own base back before Lightning loads the
weights, after checking the fingerprint, so a resume on another base (another ``model``, another
random seed) fails with a message instead of training a mismatched adapter. Loading stays strict.

A sharded (FSDP2) policy keeps its whole checkpoint: Lightning loads those shards straight into
the model through ``torch.distributed.checkpoint``, which refuses a partial state.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch
from torch import nn

from coscale.models.adapters import has_adapter
from coscale.models.full_state import is_sharded

FINGERPRINT_KEY = "coscale_frozen_base"
"""Checkpoint entry: the fingerprint of the base weights left out, and how many they are."""


def frozen_keys(module: nn.Module) -> list[str]:
    """The ``state_dict`` names of ``module``'s frozen parameters (tied ones under each name)."""
    return sorted(
        name for name, p in module.named_parameters(remove_duplicate=False) if not p.requires_grad
    )


def fingerprint(module: nn.Module, keys: list[str]) -> str:
    """SHA-256 over the name, shape, dtype and bytes of each of ``keys`` in ``module``."""
    state = module.state_dict(keep_vars=True)
    digest = hashlib.sha256()
    for key in keys:
        t = state[key].detach().cpu().contiguous()
        digest.update(f"{key}:{tuple(t.shape)}:{t.dtype};".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())  # any dtype, bf16 too
    return digest.hexdigest()


def applies(module: nn.Module) -> bool:
    """Whether ``module``'s policy trains an adapter on an unsharded base."""
    policy = getattr(module, "policy", None)
    return policy is not None and has_adapter(policy) and not is_sharded(policy)


def drop_frozen_base(checkpoint: dict[str, Any], module: nn.Module) -> None:
    """Removes ``module``'s frozen parameters from ``checkpoint["state_dict"]`` and stores
    their fingerprint; a module without an adapter (or sharded) leaves it as it is."""
    if not applies(module):
        return
    keys = frozen_keys(module)
    state = checkpoint["state_dict"]
    for key in keys:
        state.pop(key, None)
    checkpoint[FINGERPRINT_KEY] = {"sha256": _cached(module, keys), "tensors": len(keys)}


def restore_frozen_base(checkpoint: dict[str, Any], module: nn.Module) -> None:
    """Puts ``module``'s own frozen base into a checkpoint :func:`drop_frozen_base` wrote.

    Raises:
        ValueError: the live base is not the one the checkpoint was trained on.
    """
    saved = checkpoint.get(FINGERPRINT_KEY)
    if saved is None:  # a whole checkpoint (or none of ours): nothing left out
        return
    if not applies(module):
        raise ValueError(
            "the checkpoint holds an adapter without its frozen base; load it into a module "
            "with the same peft setting and model"
        )
    keys = frozen_keys(module)
    if len(keys) != saved["tensors"] or _cached(module, keys) != saved["sha256"]:
        raise ValueError(
            f"the checkpoint's adapter was trained on another base model: the frozen weights "
            f"of model={getattr(module, 'model_source', None)!r} differ from those it was "
            "saved with (another model, dtype or random seed); resume with the same model"
        )
    live = module.state_dict()
    checkpoint["state_dict"].update({key: live[key] for key in keys})


def _cached(module: nn.Module, keys: list[str]) -> str:
    """The fingerprint of the frozen base, computed once per module (it does not change)."""
    cached = getattr(module, "_frozen_base_sha256", None)
    if cached is None:
        cached = fingerprint(module, keys)
        module._frozen_base_sha256 = cached
    return cached
