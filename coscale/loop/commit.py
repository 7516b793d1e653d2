"""Commit points: where the run's state reaches the disk, atomically, and where tests kill it.

Every write of state is atomic, so a crash leaves either the old or the new state, never half of
one: ``pipeline_state.json`` goes to a temporary file renamed over the old one (:func:`write_json`);
a stage's checkpoint, a file or a folder of shards, is a new version behind a pointer file that is
switched the same way (:mod:`coscale.loop.checkpoint_store`). Each commit point, and each named
point between a stage's end and its state write, calls :func:`commit_point`.

Fault injection for tests: with ``COSCALE_KILL_AT`` set to ``k`` or to a point's label, a process
SIGKILLs itself at its k-th point (1-based) or at the first point with that label. Every rank
passes the same points, so every rank of a multi-process run dies there (a lost machine); with
``COSCALE_KILL_RANK=<r>`` only rank ``r`` does, and the others meet its absence at their next
collective. With ``COSCALE_COMMIT_LOG=<file>`` rank 0 appends every point's label to that file,
so a test can pick where to kill.
"""

from __future__ import annotations

import json
import os
import signal
from typing import Any

KILL_AT = "COSCALE_KILL_AT"
KILL_RANK = "COSCALE_KILL_RANK"
COMMIT_LOG = "COSCALE_COMMIT_LOG"
_count = 0


def commit_point(label: str) -> None:
    """Marks one commit point (this process's count); logs it and kills the process when asked."""
    global _count
    _count += 1
    rank = _rank()
    if (path := os.environ.get(COMMIT_LOG)) and rank == 0:
        with open(path, "a") as f:
            f.write(f"{_count}\t{label}\n")
    this_rank = os.environ.get(KILL_RANK) in (None, str(rank))
    if os.environ.get(KILL_AT) in (str(_count), label) and this_rank:
        os.kill(os.getpid(), signal.SIGKILL)


def _rank() -> int:
    """This process's global rank: the process group's, else the launcher's ``LOCAL_RANK``
    (Lightning starts rank 1 with it, before the group exists), else 0."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("LOCAL_RANK", 0))


def write_json(path: str, state: Any) -> None:
    """Writes ``state`` as JSON to ``path`` atomically (temporary file, fsync, rename)."""
    write_text(path, json.dumps(state, indent=1, default=str))


def write_text(path: str, text: str) -> None:
    """Writes ``text`` to ``path`` atomically (temporary file, fsync, rename)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
