"""Adapter-only weight sync: a LoRA policy reaches the vLLM engine as a LoRA request.

With ``rollout.options.sync.adapter: lora`` the engine keeps the base model it loaded at start
and serves the policy's adapter through vLLM's own LoRA support (``enable_lora``): each sync
saves the adapter alone (PEFT's ``save_pretrained``: its config and its factors, megabytes where
the merged sync sends the whole model), loads it into the engine under a new id, and every
rollout request names it. The base in the engine is never touched, no merged tensor is ever
computed, and a sync costs the adapter's size, whatever the model's.

What the engine cannot serve is refused up front, naming the setting: an adapter vLLM cannot
load (another PEFT method than LoRA, DoRA, ``modules_to_save``, several adapters, a rank above
vLLM's largest), a sharded (FSDP2) policy, and a policy without an adapter. The merged sync
(``sync.adapter: merged``, the default) serves all but the last two.

Each sync gets a new id (1, 2, ...) rather than reloading one id in place: a prompt's cached KV
in the engine is keyed by the id, so a new id can never reuse KV computed under the old adapter
(the prefix cache is reset anyway, as after a merged sync).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import weakref
from dataclasses import dataclass
from typing import Any

from torch import nn

from coscale.models.adapter_weights import adapter_sync_errors
from coscale.models.adapters import has_adapter
from coscale.rollout.vllm.sync import SyncBook, SyncRecord, engine_step

SETTING = "rollout.options.sync.adapter"
VLLM_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The values vLLM accepts as ``max_lora_rank`` (its ``LoRAConfig``, 0.10-0.33)."""


@dataclass(frozen=True)
class LoraSlot:
    """The adapter the engine serves now: what each rollout request names."""

    name: str
    id: int
    path: str


def lora_policy(model: nn.Module, policy: nn.Module | None) -> nn.Module:
    """The PEFT model to sync: ``model`` when it is one, else the backend's ``policy``
    (``update_weights`` may be handed a container such as the LightningModule)."""
    for candidate in (model, getattr(model, "module", None), policy):
        if candidate is not None and has_adapter(candidate):
            return candidate
    raise ValueError(f"{SETTING}=lora syncs a PEFT adapter, and the policy has none (peft: null)")


def lora_errors(policy: nn.Module) -> list[str]:
    """What keeps vLLM from serving ``policy``'s adapter as a LoRA request."""
    if not has_adapter(policy):
        return ["the policy has no adapter (peft: null): use sync.adapter=merged"]
    errors = adapter_sync_errors(policy)
    config = policy.peft_config[policy.active_adapter]
    if getattr(config, "modules_to_save", None):
        errors.append(
            f"peft.modules_to_save={list(config.modules_to_save)}: vLLM's LoRA requests carry "
            "low-rank factors only; use sync.adapter=merged"
        )
    if int(getattr(config, "r", 0)) > VLLM_RANKS[-1]:
        errors.append(f"peft.r={config.r}: vLLM serves LoRA ranks up to {VLLM_RANKS[-1]}")
    return errors


def check_lora_policy(policy: nn.Module | None) -> nn.Module:
    """``policy`` if vLLM can serve its adapter; raises one ValueError naming every reason."""
    if policy is None:
        raise ValueError(f"{SETTING}=lora needs the trainer's policy: pass policy=...")
    if errors := lora_errors(policy):
        raise ValueError(f"{SETTING}=lora: " + "; ".join(errors))
    return policy


def lora_engine_kwargs(policy: nn.Module) -> dict[str, Any]:
    """`vllm.LLM` arguments that let the engine serve ``policy``'s adapter: LoRA on, one adapter
    at a time, the smallest rank slot vLLM has that holds the adapter's rank."""
    rank = int(policy.peft_config[policy.active_adapter].r)
    return {
        "enable_lora": True,
        "max_loras": 1,
        "max_lora_rank": next(r for r in VLLM_RANKS if r >= rank),
    }


class AdapterSync:
    """Saves the policy's adapter and loads it into the engine as a new LoRA request.

    The adapters live in a temporary folder of this process (one per rank under DDP); each sync
    replaces the previous one's files after the engine took the new ones.
    """

    def __init__(self) -> None:
        self.folder = tempfile.mkdtemp(prefix="coscale-lora-")
        self.slot: LoraSlot | None = None
        self._next_id = 1
        weakref.finalize(self, shutil.rmtree, self.folder, True)  # at exit, or when dropped

    def push(
        self, engine: Any, policy: nn.Module, book: SyncBook, deadline: float | None
    ) -> SyncRecord:
        """One sync: save, load under a new id, drop the old one, reset the prefix cache."""
        start = time.monotonic()
        what = f"sync #{book.version + 1} (adapter)"
        path = os.path.join(self.folder, f"v{self._next_id}")
        slot = LoraSlot(f"coscale-policy-{self._next_id}", self._next_id, path)
        policy.save_pretrained(slot.path, selected_adapters=[policy.active_adapter])
        names, nbytes = _saved_tensors(slot.path)
        book.begin(names)
        engine_step(lambda: engine.add_lora(slot), deadline, f"loading the adapter ({what})")
        old, self.slot, self._next_id = self.slot, slot, self._next_id + 1
        if old is not None:
            engine_step(lambda: engine.remove_lora(old.id), deadline, f"dropping adapter {old.id}")
            shutil.rmtree(old.path, ignore_errors=True)
        engine_step(engine.reset_prefix_cache, deadline, "resetting the engine's prefix cache")
        return book.finish(len(names), nbytes, time.monotonic() - start, [])

    def forget_engine(self) -> None:
        """The engine was shut down: its adapter is gone with it (the next sync loads anew)."""
        if self.slot is not None:
            shutil.rmtree(self.slot.path, ignore_errors=True)
        self.slot = None


def _saved_tensors(path: str) -> tuple[list[str], int]:
    """Names and total bytes of the tensors PEFT saved in ``path`` (the adapter: small)."""
    from safetensors.torch import load_file

    tensors = load_file(os.path.join(path, "adapter_model.safetensors"))
    return list(tensors), sum(t.numel() * t.element_size() for t in tensors.values())
