"""Whole weights of a policy that may be sharded: gather them, load them, save them.

One code path for one process, DDP and FSDP2. Under FSDP2 (``fully_shard``) every parameter is
a ``DTensor`` holding this rank's shard: ``state_dict()`` returns shards, ``save_pretrained``
cannot write them and ``load_state_dict`` cannot copy plain tensors into them. Here the full
state dict is gathered to CPU on rank 0 (a collective: every rank calls), rank 0 writes, and a
full state dict is loaded by broadcasting it from rank 0 into each rank's shards. Callers wait
with :func:`coscale.distributed.barrier` before another rank reads what rank 0 wrote.
"""

from __future__ import annotations

import copy
import os
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from coscale.distributed import barrier, distributed, is_writer


def is_sharded(model: nn.Module) -> bool:
    """Whether ``model`` holds FSDP2 / tensor-parallel (DTensor) parameters or FSDP1 units:
    its forward is a collective and its ``state_dict`` holds shards."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    if any(hasattr(p, "full_tensor") for p in model.parameters()):
        return True
    return any(isinstance(m, FSDP) for m in model.modules())


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole weights on CPU: on rank 0 when sharded (other ranks get ``{}``), else on every
    rank. Every rank must call it when the model is sharded (it gathers)."""
    if is_sharded(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(model, options=options)
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}


def load_full_state_dict(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Loads whole weights into ``model``, in place. Sharded: rank 0's ``state`` is broadcast
    into every rank's shards (other ranks may pass ``{}``). Unsharded under DDP: rank 0's
    weights are broadcast after the load, so every rank holds the same."""
    if is_sharded(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        _reshard(model)
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_model_state_dict(model, state, options=options)
        return
    model.load_state_dict(state)
    if distributed():
        for tensor in model.state_dict().values():
            dist.broadcast(tensor.data, src=0)


def _reshard(model: nn.Module) -> None:
    """Every FSDP2 unit of ``model`` back to its shards: a unit left gathered (the root after a
    forward without a backward) holds plain tensors, which a sharded load cannot copy into."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def save_full(model: Any, tokenizer: Any, path: str | os.PathLike) -> str:
    """Writes ``model`` (safetensors), ``tokenizer`` and the generation config to ``path`` from
    rank 0, gathered first when sharded; every rank returns once the folder is complete."""
    path = os.fspath(path)
    state = full_state_dict(model) if is_sharded(model) else None
    if is_writer():
        write_plain(model if state is None else unsharded_copy(model, state), tokenizer, path)
    barrier()
    return path


def write_plain(model: Any, tokenizer: Any, path: str) -> None:
    """Writes an unsharded ``model`` (safetensors) and ``tokenizer`` to ``path`` (one process)."""
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)


def fresh_like(model: Any, dtype: torch.dtype) -> Any:
    """A new, unsharded model of ``model``'s class, config and generation config (weights not
    loaded)."""
    fresh = type(model)._from_config(copy.deepcopy(model.config), dtype=dtype)
    if getattr(model, "generation_config", None) is not None:
        fresh.generation_config = copy.deepcopy(model.generation_config)
    return fresh


def unsharded_copy(model: Any, state: dict[str, torch.Tensor]) -> Any:
    """A fresh, unsharded model of ``model``'s class and config holding ``state``."""
    fresh = fresh_like(model, next(iter(state.values())).dtype)
    fresh.load_state_dict(state)
    return fresh
