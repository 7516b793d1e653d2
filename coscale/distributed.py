"""Collective helpers: no-ops in one process, collectives under DDP / FSDP.

Decisions that change training (pool labels, N per group, whether to skip a batch) must be the
same on every rank; gathering the inputs and deciding everywhere from the same data does that.
Every helper of the package that talks to other ranks is here, and each is a plain value in one
process, so a layer that calls one needs no process group to be tested. Only torch is imported:
any layer of the package may use this module.
"""

from __future__ import annotations

import os
from typing import Any, TypeVar

import torch
import torch.distributed as dist

Number = TypeVar("Number", float, torch.Tensor)


def distributed() -> bool:
    """Whether a process group with more than one rank is running."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank_world() -> tuple[int, int]:
    """This process's rank and the world size (0, 1 without a process group)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def world_size() -> int:
    """Ranks of the default process group (1 without one)."""
    return rank_world()[1]


def is_writer() -> bool:
    """Rank 0 (or the only process): the one that writes shared files."""
    return rank_world()[0] == 0


RANK_VARIABLES = ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID")
"""Launchers' rank variables (torchrun, Lightning, SLURM): any above 0 marks a rank other than 0."""


def launched_as_rank_zero() -> bool:
    """Whether the launcher started this process as rank 0 (or as the only one): what a process
    knows of its rank before its process group exists."""
    return all(int(os.environ.get(name) or 0) == 0 for name in RANK_VARIABLES)


def is_rank_zero() -> bool:
    """Rank 0 of the process group when one runs, else the launcher's rank 0."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank() == 0
    return launched_as_rank_zero()


def barrier() -> None:
    """Waits for every rank (a no-op in one process)."""
    if distributed():
        dist.barrier()


def collective_device() -> torch.device:
    """Where a collective's tensor lives: nccl needs a CUDA tensor, gloo a CPU one."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def sum_over_ranks(value: Number) -> Number:
    """Sum of ``value`` over ranks: a number gives a float; a tensor is summed in place (on its
    own device) and returned."""
    if not distributed():
        return value
    if isinstance(value, torch.Tensor):
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        return value
    t = torch.tensor(float(value), dtype=torch.float64, device=collective_device())
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return float(t)


def max_over_ranks(value: int) -> int:
    """Largest ``value`` over ranks."""
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
