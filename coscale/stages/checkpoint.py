"""The callbacks every stage fit carries: atomic commit checkpoints, and the run's own state.

:class:`CommitCheckpoint` writes ``last.ckpt`` every ``every_n_steps`` optimiser steps and after
each epoch's end-of-epoch work (it is a ``Checkpoint``, so Lightning runs its epoch-end hook
after the module's and the other callbacks'). Lightning's ``ModelCheckpoint`` skips a save at
a step it has saved already, which is how an epoch's end work used to be lost.
:class:`RunState` puts in the same checkpoint what Lightning leaves out: the RNG states and the
compute the fit has spent (``coscale.loop.budget``), so a resumed fit counts and samples as an
uninterrupted one.
"""

from __future__ import annotations

import os
import random
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback, Checkpoint
from typing_extensions import override

from coscale.loop import budget
from coscale.loop.commit import commit_point


class CommitCheckpoint(Checkpoint):
    """Atomic ``<dirpath>/last.ckpt`` after every ``every_n_steps`` steps and every epoch end."""

    def __init__(self, dirpath: str, every_n_steps: int = 1, label: str = "") -> None:
        super().__init__()
        self.dirpath, self.every_n_steps, self.label = dirpath, every_n_steps, label
        self.path = os.path.join(dirpath, "last.ckpt")
        self._saved_step = -1

    @override
    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        step = trainer.global_step
        if step != self._saved_step and step % self.every_n_steps == 0 and step > 0:
            self.save(trainer, f"step {step}")

    @override
    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self.save(trainer, f"epoch {trainer.current_epoch} end")

    def save(self, trainer: Any, what: str) -> None:
        tmp = self.path + ".tmp"
        trainer.save_checkpoint(tmp)  # every rank takes part; rank 0 writes
        if trainer.is_global_zero:
            os.replace(tmp, self.path)
        trainer.strategy.barrier("commit")
        self._saved_step = trainer.global_step
        commit_point(f"{self.label} ckpt {what}")


class RunState(Callback):
    """RNG states and the fit's spend, saved and restored with the checkpoint.

    Put it first among a fit's callbacks: its ``on_fit_start`` marks where this process's
    counting starts, before any other callback samples.
    """

    def __init__(self) -> None:
        self.restored: dict[str, int] = {}
        self._mark = budget.snapshot()

    @override
    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self._mark = budget.snapshot()

    def spent(self) -> dict[str, int]:
        """SFT examples and rollouts of the whole fit, the part before a restart included."""
        now = budget.since(self._mark)
        return {k: now.get(k, 0) + self.restored.get(k, 0) for k in now}

    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "spent": self.spent(),
            "torch_rng": torch.get_rng_state(),
            "python_rng": random.getstate(),
        }

    @override
    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.restored = dict(state["spent"])
        torch.set_rng_state(state["torch_rng"])
        random.setstate(state["python_rng"])
