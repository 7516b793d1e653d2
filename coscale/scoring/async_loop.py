"""The event loop that ``async def`` reward functions run on: one per process, in a daemon thread.

A persistent loop, not ``asyncio.run`` per call: clients that an async reward keeps between calls
(an HTTP session to a judge) stay bound to the loop they were made on, and it works from a caller
that runs an event loop of its own (a notebook). A forked child starts its own.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine
from typing import Any

_LOOP: dict[str, Any] = {}  # the process's event loop for async rewards, and its owner pid
_LOOP_LOCK = threading.Lock()


def run_concurrently(coros: list[Coroutine[Any, Any, Any]]) -> list[Any]:
    """Awaits ``coros`` together on the process's reward event loop; the first error raises."""

    async def gather() -> list[Any]:
        return list(await asyncio.gather(*coros))

    return asyncio.run_coroutine_threadsafe(gather(), _event_loop()).result()


def _event_loop() -> asyncio.AbstractEventLoop:
    """One event loop in a daemon thread, started at first use (again in a forked child, which
    inherits the loop but not its thread)."""
    with _LOOP_LOCK:
        if _LOOP.get("pid") != os.getpid():
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="coscale-rewards", daemon=True)
            thread.start()
            _LOOP.update(pid=os.getpid(), loop=loop)
        return _LOOP["loop"]
