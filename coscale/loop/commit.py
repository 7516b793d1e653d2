"""Commit points: where the run's state reaches the disk, atomically, and where tests kill it.

Every write of state (a stage's ``last.ckpt``, ``pipeline_state.json``) goes to a temporary file
that is then renamed over the old one, so a crash leaves either the old or the new state, never
half of one. Each commit point, and each named point between a stage's end and its state write,
calls :func:`commit_point`. Fault injection for tests: with ``COSCALE_KILL_AT`` set to ``k`` or
to a point's label, the process SIGKILLs itself at its k-th point (1-based) or at the first
point with that label; with ``COSCALE_COMMIT_LOG=<file>`` every point's label is appended to
that file, so a test can pick where to kill.
"""

from __future__ import annotations

import json
import os
import signal
from typing import Any

KILL_AT = "COSCALE_KILL_AT"
COMMIT_LOG = "COSCALE_COMMIT_LOG"
_count = 0


def commit_point(label: str) -> None:
    """Marks one commit point (rank 0's count); logs it and kills the process when asked."""
    global _count
    _count += 1
    if path := os.environ.get(COMMIT_LOG):
        with open(path, "a") as f:
            f.write(f"{_count}\t{label}\n")
    if os.environ.get(KILL_AT) in (str(_count), label):
        os.kill(os.getpid(), signal.SIGKILL)


def write_json(path: str, state: Any) -> None:
    """Writes ``state`` as JSON to ``path`` atomically (temporary file, fsync, rename)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(state, f, indent=1, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
