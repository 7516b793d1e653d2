"""The callbacks every stage fit carries: atomic commit checkpoints, and the run's own state.

:class:`CommitCheckpoint` writes a whole checkpoint every ``every_n_steps`` optimiser steps (but
after an epoch's last one) and after each epoch's end-of-epoch work (it is a ``Checkpoint``, so Lightning runs its epoch-end hook
after the module's and the other callbacks'). The epoch-end save writes even at a step saved
already (where Lightning's ``ModelCheckpoint`` skips it), so the last checkpoint of an epoch
holds its end-of-epoch work.
:class:`RunState` puts in the same checkpoint what Lightning leaves out: the RNG states and the
fit's part of the run's spend (counted in ``coscale.loop.budget``), so a resumed fit counts and
samples as an uninterrupted one.
"""

from __future__ import annotations

import errno
import random
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback, Checkpoint
from typing_extensions import override

from coscale.loop import budget
from coscale.loop.checkpoint_store import (
    CheckpointWriteError,
    last_checkpoint,
    next_version,
    remove_leftovers,
    remove_path,
    switch_to,
)
from coscale.loop.commit import commit_point
from coscale.modules.fit_data import epoch_finished


class CommitCheckpoint(Checkpoint):
    """Whole checkpoints in ``dirpath`` after every ``every_n_steps`` steps and every epoch end.

    Each save is a new version behind the folder's pointer file
    (:mod:`coscale.loop.checkpoint_store`): every rank writes its part (FSDP2: its shards), a
    barrier, then rank 0 switches the pointer and removes the older version. The fit resumes from
    :meth:`last`. A write that fails (a full disk) removes its half-written version and stops the
    fit with an error naming the folder; the pointer still names the last whole checkpoint.
    """

    def __init__(self, dirpath: str, every_n_steps: int = 1, label: str = "") -> None:
        super().__init__()
        self.dirpath, self.every_n_steps, self.label = dirpath, every_n_steps, label
        self._saved_step = -1

    def last(self) -> str | None:
        """The whole checkpoint a fit resumes from (None: the stage starts afresh)."""
        return last_checkpoint(self.dirpath)

    @override
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if trainer.is_global_zero:  # half-written versions of a killed save
            remove_leftovers(self.dirpath)
        trainer.strategy.barrier("commit setup")

    @override
    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        step = trainer.global_step
        # After an epoch's last batch (or at max_steps) the epoch-end save follows, once the
        # epoch's end work is done. Lightning 2.6 resumes a checkpoint taken between the two in
        # the next epoch without the end hooks (measurement, the epoch-end save), builds that
        # epoch's loader at once (from an empty one it fails), or finds the fit finished: the
        # end work would be lost. A kill there resumes from the step before and redoes the last.
        last = 0 < trainer.max_steps <= step or epoch_finished(trainer)
        if step != self._saved_step and step % self.every_n_steps == 0 and step > 0 and not last:
            self.save(trainer, f"step {step}")

    @override
    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        self.save(trainer, f"epoch {trainer.current_epoch} end, step {trainer.global_step}")

    def save(self, trainer: Any, what: str) -> None:
        """Writes a new version (every rank takes part), then switches the pointer to it."""
        path = trainer.strategy.broadcast(next_version(self.dirpath))
        try:
            trainer.save_checkpoint(path)  # one file from rank 0, or a folder of shards
            trainer.strategy.barrier("commit written")  # every rank's part is on disk
            if trainer.is_global_zero:
                switch_to(path, what)
        except OSError as err:
            if trainer.is_global_zero:
                remove_path(path)
            raise CheckpointWriteError(err.errno, self._failure(path, err)) from err
        trainer.strategy.barrier("commit switched")
        self._saved_step = trainer.global_step
        commit_point(f"{self.label} ckpt {what}")

    def _failure(self, path: str, err: OSError) -> str:
        """What a failed write tells the user: the folder, what is left whole, what to do."""
        why = "the disk is full" if err.errno == errno.ENOSPC else err.strerror or str(err)
        last = self.last()
        kept = f"the last whole checkpoint, {last}," if last else "no checkpoint of this stage"
        return (
            f"writing checkpoint {path} failed: {why} ({err}). In {self.dirpath}, {kept} and the "
            f"run's pipeline_state.json are as they were: free space (or set "
            f"pipeline.checkpoint_every_n_steps higher) and run the same command to resume"
        )


class RunState(Callback):
    """RNG states and the fit's part of the run's spend, saved and restored with the checkpoint.

    The spend is counted once, in :mod:`coscale.loop.budget`; this callback only saves the fit's
    part of that count and, on resume, puts it back in place of what the resumed process redid.
    """

    def __init__(self) -> None:
        self._mark = budget.snapshot()

    @override
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        # before the checkpoint is restored (FSDP2 restores it after on_fit_start) and before
        # any hook that samples: where this fit's part of the count starts
        self._mark = budget.snapshot()

    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "spent": budget.since(self._mark, kinds=None),
            "torch_rng": torch.get_rng_state(),
            "python_rng": random.getstate(),
        }

    @override
    def load_state_dict(self, state: dict[str, Any]) -> None:
        budget.restore(self._mark, state["spent"])
        torch.set_rng_state(state["torch_rng"])
        random.setstate(state["python_rng"])
