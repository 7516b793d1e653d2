"""Weight sync between the trainer and a colocated engine: gather, time-box, verify.

Pain point: a weight sync that hangs without an error, or "succeeds" while the engine keeps
sampling from old weights (TRL #2923, #6796; OpenRLHF #660). This module holds the parts of the
guard that need no engine and no GPU:

- `push_weights`: gathers the full weights (`coscale.rollout.weights`) and loads them into the
  engine bucket by bucket, between the engine's ``begin_load`` and ``end_load``
  (`coscale.rollout.vllm.reload`); an error of any engine step reaches the caller as `WeightSyncError`.
- `call_with_timeout`: every engine-side step of a sync runs under a deadline.
- `SyncBook`: what each sync sent and what the engine said it loaded; a sync that sends other
  names than the first, or that the engine reports as loading nothing (or a different number
  of tensors than the first time), is an error, never a silent no-op.

The parity check itself (engine vs trainer log-probs after a sync) is in `coscale.rollout.vllm.parity`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from torch import nn

from coscale.rollout.weights import buckets, full_tensor, gathered_parameters


class WeightSyncError(RuntimeError):
    """The engine did not (verifiably) receive the policy's weights."""


class WeightSyncTimeout(WeightSyncError, TimeoutError):
    """An engine-side step of a weight sync ran past its deadline."""


class ParityError(WeightSyncError):
    """After a sync, engine and trainer log-probs of the same tokens disagree."""


def call_with_timeout(fn: Callable[[], Any], timeout_s: float | None, what: str) -> Any:
    """Runs `fn` and returns its result, or raises `WeightSyncTimeout` after `timeout_s`.

    `fn` runs in a helper thread (on the caller's CUDA device) so that the caller can stop
    waiting; a thread cannot be killed, so after a timeout the engine is in an unknown state
    and the run should stop. None waits forever; errors of `fn` are re-raised.
    """
    if timeout_s is None:
        return fn()
    if timeout_s <= 0:
        raise WeightSyncTimeout(f"{what}: no time left of the sync deadline")
    device = torch.cuda.current_device() if torch.cuda.is_available() else None
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            if device is not None:
                torch.cuda.set_device(device)
            box["value"] = fn()
        except BaseException as err:  # handed to the caller's thread
            box["error"] = err

    worker = threading.Thread(target=run, name="coscale-weight-sync", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise WeightSyncTimeout(
            f"{what} did not finish within {timeout_s:.1f} s (rollout.options.sync.timeout_s); the engine "
            "may hold stale or partial weights, so the run stops here instead of hanging"
        )
    if "error" in box:
        raise box["error"]
    return box.get("value")


@dataclass
class SyncRecord:
    """One finished weight sync."""

    version: int  # 1 for the first sync
    tensors: int
    bytes: int
    seconds: float
    engine_loaded: list[int | None] = field(default_factory=list)  # tensors loaded, per worker


class SyncBook:
    """Bookkeeping of weight syncs: the guard against a sync that silently does nothing.

    Args:
        parity_every: Check parity after the 1st sync and then every `parity_every`-th one
            (0: never).
    """

    def __init__(self, parity_every: int = 1) -> None:
        self.parity_every = parity_every
        self.version = 0
        self.names: tuple[str, ...] | None = None
        self.engine_loaded: list[int | None] | None = None
        self.last: SyncRecord | None = None
        self.parity_pending = False

    def begin(self, names: Sequence[str]) -> None:
        """Checks that a sync sends the same parameter names as the first one."""
        names = tuple(sorted(names))
        if self.names is None:
            self.names = names
            return
        missing = sorted(set(self.names) - set(names))
        extra = sorted(set(names) - set(self.names))
        if missing or extra:
            raise WeightSyncError(
                f"weight sync #{self.version + 1} sends other parameters than sync #1: "
                f"missing {missing[:5]}, new {extra[:5]} (was the model re-wrapped?)"
            )

    def finish(
        self, tensors: int, nbytes: int, seconds: float, reports: Sequence[Any]
    ) -> SyncRecord:
        """Records a sync; `reports` are the engine's per-call, per-worker loaded counts."""
        loaded = _per_worker_totals(reports)
        if any(n == 0 for n in loaded if n is not None):
            raise WeightSyncError(
                f"weight sync #{self.version + 1}: the engine reports loading 0 tensors "
                f"(per worker: {loaded}); parameter names probably do not match the engine's"
            )
        if self.engine_loaded is None:
            self.engine_loaded = loaded
        elif loaded != self.engine_loaded:
            raise WeightSyncError(
                f"weight sync #{self.version + 1}: the engine loaded {loaded} tensors per "
                f"worker, sync #1 loaded {self.engine_loaded}"
            )
        self.version += 1
        self.last = SyncRecord(self.version, tensors, nbytes, seconds, loaded)
        every = self.parity_every
        self.parity_pending = every > 0 and (self.version - 1) % every == 0
        return self.last


def _per_worker_totals(reports: Sequence[Any]) -> list[int | None]:
    """Sums the per-worker counts of several load calls; None where a worker gave none."""
    totals: list[int | None] = []
    for report in reports:
        for w, count in enumerate(report or ()):
            if w == len(totals):
                totals.append(None)
            if count is not None:
                totals[w] = (totals[w] or 0) + int(count)
    return totals


def remaining(deadline: float | None) -> float | None:
    """Seconds left until `deadline` (a `time.monotonic()` value); None: no deadline."""
    return None if deadline is None else deadline - time.monotonic()


def engine_step(fn: Callable[[], Any], deadline: float | None, what: str) -> Any:
    """`call_with_timeout` before `deadline`; another error of `fn` becomes `WeightSyncError`
    naming `what` (the engine may then hold partial weights)."""
    try:
        return call_with_timeout(fn, remaining(deadline), what)
    except WeightSyncError:
        raise
    except Exception as err:
        raise WeightSyncError(
            f"{what} failed: {type(err).__name__}: {err}; the engine may hold partial weights, "
            "so the run stops here"
        ) from err


def push_weights(
    engine: Any, model: nn.Module, book: SyncBook, prefix: str, bucket_bytes: int,
    deadline: float | None,
) -> SyncRecord:  # fmt: skip
    """Gathers `model`'s weights and loads them into `engine` bucket by bucket, then books it.

    Every engine call (``begin_load``, each bucket's ``load_weights``, ``end_load``, then
    ``reset_prefix_cache``: cached prompt KV was computed with the old weights) must finish
    before `deadline`.
    """
    start = time.monotonic()
    what = f"sync #{book.version + 1}"
    reports, tensors, nbytes = [], 0, 0
    with gathered_parameters(model, prefix) as named:
        book.begin([name for name, _ in named])
        engine_step(engine.begin_load, deadline, f"opening weight load {what}")
        for bucket in buckets(named, bucket_bytes):
            weights = [(name, full_tensor(p)) for name, p in bucket]
            tensors += len(weights)
            nbytes += sum(w.numel() * w.element_size() for _, w in weights)
            load = partial(engine.load_weights, weights)
            reports.append(engine_step(load, deadline, f"loading weights into the engine ({what})"))
        engine_step(engine.end_load, deadline, f"finishing weight load {what}")
    engine_step(engine.reset_prefix_cache, deadline, "resetting the engine's prefix cache")
    return book.finish(tensors, nbytes, time.monotonic() - start, reports)


def params_fingerprint(model: nn.Module) -> tuple[tuple[int, int], ...]:
    """(identity, in-place version) of every parameter: changes when an optimiser steps."""
    return tuple((id(p), p._version) for p in model.parameters())
