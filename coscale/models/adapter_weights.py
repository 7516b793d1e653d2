"""The merged weights of a LoRA policy under the base model's Hugging Face names, for an engine.

An inference engine that loaded the base model (vLLM) takes the policy's weights as the base's
checkpoint names (``model.layers.0.self_attn.q_proj.weight``). Under a PEFT LoRA adapter those
names carry PEFT's wrappers (``base_model.model.``, ``.base_layer``, ``.modules_to_save.<name>``)
and the weight of a wrapped layer is its base weight plus the adapter's delta.
:func:`merged_named_weights` gives every weight under its base name; a wrapped layer's weight is
a :class:`MergedWeight`, computed (base + ``get_delta_weight``, PEFT's own merge arithmetic) only
when the sync reads it, so a sync streams one merged tensor at a time and never merges into the
live model: its base stays bit for bit the initial model (a merge and unmerge in place would
not give it back exactly).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from coscale.models.full_state import is_sharded


class MergedWeight:
    """The weight of a LoRA-wrapped layer with its adapter merged, read by ``full_tensor``.

    ``numel`` and ``element_size`` describe the tensor without computing it (sync buckets).
    """

    def __init__(self, layer: Any, adapter: str) -> None:
        self.layer, self.adapter = layer, adapter
        self.base: Tensor = layer.get_base_layer().weight

    def numel(self) -> int:
        return self.base.numel()

    def element_size(self) -> int:
        return self.base.element_size()

    def full_tensor(self) -> Tensor:
        """base + delta, in the base's dtype; a new tensor (the live weights are left as they are)."""
        with torch.no_grad():
            delta = self.layer.get_delta_weight(self.adapter)  # [out, in], scaling applied
            return (self.base + delta.to(self.base.dtype)).detach()


def adapter_sync_errors(model: nn.Module) -> list[str]:
    """What keeps the merged-weight sync from serving ``model``: another PEFT method than LoRA,
    DoRA (its merge rescales the whole weight), several adapters, a sharded (FSDP2) policy."""
    config = model.peft_config[model.active_adapter]
    errors = []
    if str(getattr(config, "peft_type", "")).upper().rsplit(".", 1)[-1] != "LORA":
        errors.append(f"peft: the vLLM sync merges LoRA adapters; got {config.peft_type}")
    if getattr(config, "use_dora", False):
        errors.append("peft.use_dora: the vLLM sync merges plain LoRA, not DoRA")
    if len(model.peft_config) != 1:
        errors.append(f"peft: one adapter to sync, the model has {sorted(model.peft_config)}")
    if is_sharded(model):
        errors.append("peft with the vLLM backend runs unsharded (one device or DDP), not FSDP2")
    if untied := _untied_copies(model, config):
        errors.append(
            f"peft.modules_to_save={sorted(untied)} trains its own copy of the model's tied "
            "embeddings / output head, which a vLLM engine of this model holds as one tensor "
            "(tie_word_embeddings): leave them out of modules_to_save, or untie them first"
        )
    return errors


def _untied_copies(model: nn.Module, config: Any) -> set[str]:
    """The ``modules_to_save`` entries that name a tied input embedding or output head."""
    base = model.get_base_model()
    saved = set(getattr(config, "modules_to_save", None) or ())
    if not saved or not getattr(getattr(base, "config", None), "tie_word_embeddings", False):
        return set()
    tied = [base.get_input_embeddings(), base.get_output_embeddings()]
    names = {n.rpartition(".")[2] for n, m in base.named_modules() if any(m is t for t in tied)}
    return saved & names


def merged_named_weights(model: nn.Module) -> list[tuple[str, Any]]:
    """``(base HF name, tensor or MergedWeight)`` for every weight of the LoRA ``model``.

    Raises:
        ValueError: what :func:`adapter_sync_errors` finds.
    """
    if errors := adapter_sync_errors(model):
        raise ValueError("; ".join(errors))
    from peft.tuners.lora import LoraLayer

    adapter = model.active_adapter
    base = model.get_base_model()
    wrapped = {name: m for name, m in base.named_modules() if isinstance(m, LoraLayer)}
    saved_copy = f".modules_to_save.{adapter}."
    named: list[tuple[str, Any]] = []
    for name, param in base.named_parameters():
        other_copy = ".modules_to_save." in name and saved_copy not in name
        if "lora_" in name or ".original_module." in name or other_copy:
            continue  # the adapter's own factors, the frozen copies behind modules_to_save
        owner, _, leaf = name.rpartition(".")
        layer = wrapped.get(owner.removesuffix(".base_layer"))
        value = MergedWeight(layer, adapter) if layer is not None and leaf == "weight" else param
        named.append((name.replace(saved_copy, ".").replace(".base_layer.", "."), value))
    return named
