"""Small collective helpers: no-ops in one process, collectives under DDP/FSDP.

Decisions that change training (pool labels, N per group, whether to skip a batch) must be the
same on every rank; gathering the inputs and deciding everywhere from the same data does that.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from coscale.models.full_state import collective_device, distributed


def global_sum(value: float) -> float:
    """Sum of ``value`` over ranks."""
    if not distributed():
        return value
    t = torch.tensor(float(value), dtype=torch.float64, device=collective_device())
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return float(t)


def global_max(value: int) -> int:
    """Maximum of ``value`` over ranks."""
    if not distributed():
        return value
    t = torch.tensor(int(value), dtype=torch.long, device=collective_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t)


def all_gather_objects(items: list[Any]) -> list[Any]:
    """Concatenation of every rank's ``items``, in rank order (picklable objects)."""
    if not distributed():
        return list(items)
    gathered: list[list[Any]] = [None] * dist.get_world_size()  # type: ignore[list-item]
    dist.all_gather_object(gathered, items)
    return [x for part in gathered for x in part]


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """``obj`` of rank ``src`` on every rank."""
    if not distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def rank_world() -> tuple[int, int]:
    """This process's rank and the world size (0, 1 without a process group)."""
    if distributed():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1
