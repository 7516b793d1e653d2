"""A line every few optimiser steps of a fit that runs without a progress bar (a study's log).

Studies run their fits with ``enable_progress_bar=False`` (a bar's redraws make one log line of
megabytes); :class:`StepLines` prints the step, the seconds since the fit began and the step's
logged figures instead, so a slow fit can be told from a stuck one.
"""

from __future__ import annotations

import time

from lightning.pytorch.callbacks import Callback

SHOWN = ("train/reward", "train/completion_len", "train/truncated")
"""The logged figures each line shows (those the fit logs)."""


class StepLines(Callback):
    """Prints ``[<label>] step s/max, t s, <figures>`` every ``every`` optimiser steps (``/max``
    only where ``max_steps`` is set)."""

    def __init__(self, label: str, every: int = 10) -> None:
        self.label, self.every, self.start = label, every, time.perf_counter()

    def on_train_start(self, trainer, pl_module) -> None:
        self.start = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step, last = trainer.global_step, trainer.max_steps
        if step % self.every and step != last:
            return
        metrics = trainer.callback_metrics
        shown = ", ".join(f"{k[6:]} {float(metrics[k]):.3g}" for k in SHOWN if k in metrics)
        seconds = time.perf_counter() - self.start
        print(f"[{self.label}] step {step_of(trainer)}, {seconds:.0f} s, {shown}", flush=True)


def step_of(trainer) -> str:
    """``s/max``, or ``s`` where ``max_steps`` is unset (-1: the fit ends by other means)."""
    last = trainer.max_steps
    return f"{trainer.global_step}/{last}" if last > 0 else str(trainer.global_step)
