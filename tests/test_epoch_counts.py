"""Two resumes from epochs' last-step checkpoints train as many batches as a fit never stopped.

A plain Lightning fit (a linear model, 3 epochs of 4 batches, a checkpoint after every step) is
stopped right after epoch 0's last step, resumed, stopped after epoch 1's last step, resumed
again. Without :class:`~coscale.run.epoch_counts.WholeEpochCounts` Lightning 2.6 repeats
epoch 1 after the second resume (the test shows it), with it the batches and weights equal
those of the fit never stopped.
"""

from __future__ import annotations

import lightning as L
import pytest
import torch
from torch.utils.data import DataLoader
from trainers import quiet_trainer

from coscale.run.epoch_counts import WholeEpochCounts

BATCHES, EPOCHS = 4, 3


class Linear(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(2, 1)
        self.seen: list[tuple[int, int]] = []  # (epoch, batch index) of every step run

    def training_step(self, batch, batch_idx):
        self.seen.append((self.current_epoch, batch_idx))
        return self.layer(batch).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        data = torch.arange(BATCHES * 4 * 2, dtype=torch.float32).reshape(-1, 2) / 10
        return DataLoader(data, batch_size=4)


class Stopped(Exception):
    """Raised where a process would be killed."""


class StopAfter(L.Callback):
    """Saves a checkpoint after every step; stops the fit (as a kill would) after ``step``."""

    def __init__(self, folder, step: int | None) -> None:
        self.folder, self.step = folder, step

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        trainer.save_checkpoint(self.folder / f"step{trainer.global_step}.ckpt")
        if trainer.global_step == self.step:
            raise Stopped  # the fit ends at once, with no epoch-end work


def _fit(folder, stop: int | None, resume: str | None, fix: bool) -> Linear:
    module = Linear()
    callbacks = [StopAfter(folder, stop), *([WholeEpochCounts()] if fix else [])]
    trainer = quiet_trainer(-1, max_epochs=EPOCHS, callbacks=callbacks)
    try:
        trainer.fit(module, ckpt_path=None if resume is None else str(folder / resume))
    except Stopped:
        assert stop is not None
    return module


@pytest.mark.parametrize("fix", [True, False])
def test_two_resumes_from_last_steps_train_what_one_fit_trains(tmp_path, fix):
    whole = _fit(tmp_path, None, None, fix)
    assert len(whole.seen) == BATCHES * EPOCHS
    first = _fit(tmp_path, BATCHES, None, fix)  # stopped after epoch 0's last step
    second = _fit(tmp_path, 2 * BATCHES, f"step{BATCHES}.ckpt", fix)  # after epoch 1's
    third = _fit(tmp_path, None, f"step{2 * BATCHES}.ckpt", fix)
    seen = first.seen + second.seen + third.seen
    if not fix:  # Lightning alone runs epoch 1 again after the second resume
        assert len(seen) == BATCHES * (EPOCHS + 1), seen
        return
    assert seen == whole.seen
    assert all(torch.equal(a, b) for a, b in zip(third.parameters(), whole.parameters()))
