"""Sampling from a sharded policy: every rank runs as many forward passes as the others.

Under FSDP2 each forward pass all-gathers the parameters of every layer, a collective: a rank
that stops decoding while another goes on leaves that one waiting forever. So with a sharded
policy and several ranks, the number of chunks per call and the number of decode steps per chunk
are agreed across ranks (their maximum); a rank whose rows are done keeps stepping and throws
the extra tokens away (completions are cut at their end token, so nothing it returns changes).
Unsharded policies (one process, DDP) never pay a collective here.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from coscale.models.full_state import collective_device, distributed, is_sharded


def in_lockstep(model: nn.Module) -> bool:
    """Whether ``model``'s forward passes are collectives (sharded, several ranks)."""
    return distributed() and is_sharded(model)


def agreed_max(value: int, together: bool) -> int:
    """The largest ``value`` over ranks when ``together`` (see :func:`in_lockstep`, asked once
    per call, not per decode step), else ``value``."""
    if not together:
        return value
    t = torch.tensor(int(value), dtype=torch.long, device=collective_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t)


def all_finished(done: bool, together: bool) -> bool:
    """``done`` on every rank when ``together``, else ``done``."""
    return agreed_max(int(not done), together) == 0 if together else done
