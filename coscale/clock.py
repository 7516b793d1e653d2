"""Where a process's seconds go: sampling, engine starts and weight syncs, each timed once.

A stage's wall time alone does not say whether a run is bound by its engine or by training.
The places that sample (`PolicyMixin`), start an engine and sync weights into it (the vLLM
backend) wrap their work in :func:`timed`; a stage reads :func:`since` its start, and what is
left of its wall time is training, loading and saving. Timers nest exclusively: an engine that
starts inside a sampling call stops the sampling clock while it starts, so the parts add up to
at most the wall time and none is counted twice. It is process-wide, as `coscale.loop.budget`
is, because those places sit below any stage; unlike the budget it is never saved in a
checkpoint (a resumed stage reports the seconds of its own process).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

SECONDS: Counter[str] = Counter()
"""Exclusive seconds per kind: ``sampling``, ``engine_start``, ``weight_sync``."""

CALLS: Counter[str] = Counter()
"""How many times each kind was timed (``engine_start``: the engines this process started)."""

_open: list[list] = []  # [kind, perf_counter() at its start or last resume]: the timers running now


@contextmanager
def timed(kind: str) -> Iterator[None]:
    """Counts the seconds of the ``with`` body as ``kind``, less those of timers opened in it."""
    now = time.perf_counter()
    if _open:  # the enclosing timer pauses
        outer = _open[-1]
        SECONDS[outer[0]] += now - outer[1]
    _open.append([kind, now])
    CALLS[kind] += 1
    try:
        yield
    finally:
        now = time.perf_counter()
        _, resumed = _open.pop()
        SECONDS[kind] += now - resumed
        if _open:
            _open[-1][1] = now


def snapshot() -> tuple[dict[str, float], dict[str, int]]:
    """A copy of the totals so far (seconds and calls), for :func:`since`."""
    return dict(SECONDS), dict(CALLS)


def since(before: tuple[dict[str, float], dict[str, int]], wall: float) -> dict[str, float]:
    """The seconds of each kind after ``before`` (a :func:`snapshot`) out of ``wall`` seconds,
    with ``other`` (the rest: training, loading, saving) and ``engine_starts`` (a count)."""
    seconds, calls = before
    ran = [k for k in CALLS if CALLS[k] > calls.get(k, 0)]  # kinds timed since, however short
    parts = {k: round(SECONDS[k] - seconds.get(k, 0.0), 3) for k in ran}
    parts["other"] = round(max(wall - sum(parts.values()), 0.0), 3)
    parts["engine_starts"] = CALLS["engine_start"] - calls.get("engine_start", 0)
    return parts


def describe(parts: dict[str, float]) -> str:
    """``parts`` as one line: ``sampling 12.3 s, engine_start 40.1 s (1 start), other 5.0 s``."""
    starts = parts.get("engine_starts", 0)
    words = [f"{k} {v:.1f} s" for k, v in parts.items() if k != "engine_starts"]
    return ", ".join(words) + (f" ({starts} engine start{'s' * (starts != 1)})" if starts else "")
