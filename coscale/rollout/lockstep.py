"""Sampling from a sharded policy: every rank runs as many forward passes as the others.

Under FSDP2 each forward pass all-gathers the parameters of every layer, a collective: a rank
that stops decoding while another goes on leaves that one waiting forever. So with a sharded
policy and several ranks, the number of chunks per call and the number of decode steps per chunk
are agreed across ranks (their maximum); a rank whose rows are done keeps stepping and throws
the extra tokens away (completions are cut at their end token, so nothing it returns changes).
Unsharded policies (one process, DDP) never pay a collective here.
"""

from __future__ import annotations

from torch import nn

from coscale.distributed import distributed, max_over_ranks
from coscale.models.full_state import is_sharded


def in_lockstep(model: nn.Module) -> bool:
    """Whether ``model``'s forward passes are collectives (sharded, several ranks): then the
    caller agrees on its counts with :func:`coscale.distributed.max_over_ranks`, asked once per
    call, not per decode step."""
    return distributed() and is_sharded(model)


def all_finished(done: bool, together: bool) -> bool:
    """``done`` on every rank when ``together`` (see :func:`in_lockstep`), else ``done``."""
    return max_over_ranks(int(not done)) == 0 if together else done
