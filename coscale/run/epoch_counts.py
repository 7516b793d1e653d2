"""Lightning's epoch counts after a resume from an epoch's last-step checkpoint, made whole.

A step checkpoint taken after an epoch's last batch but before its end (what every stage writes
with ``checkpoint_every_n_steps: 1``) resumes in Lightning 2.6 as "mid-epoch, last batch done":
the fit loop counts that epoch processed and completed, then starts the next epoch without
counting it ready and started (``FitLoop.on_advance_start`` skips both while the restart stage is
mid-epoch). The next epoch runs as it should, but a checkpoint taken inside it says that no epoch
is running; a second resume from that checkpoint then starts the epoch again from its first
batch. Seen here: the tiny pipeline killed after the RL stage's first epoch's last step and
again after its second's ran more rollouts, and ended elsewhere, than the run never killed.
:class:`WholeEpochCounts` counts the next epoch ready and started when Lightning will not, so
its checkpoints hold what an uninterrupted fit's hold (``tests/test_kill_anywhere.py``).
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import Callback
from typing_extensions import override


def skips_next_epoch_count(fit_loop: Any) -> bool:
    """Whether ``fit_loop`` was restored after an epoch's last batch, so that it will start the
    next epoch without counting it ready and started (the counts show no running epoch)."""
    total = fit_loop.epoch_progress.total
    return (
        fit_loop.restarted_mid_epoch
        and fit_loop.epoch_loop.restarted_on_train_batch_end
        and fit_loop.epoch_loop.batch_progress.is_last_batch
        and total.ready == total.started == total.processed == total.completed
    )


class WholeEpochCounts(Callback):
    """Counts the epoch a resumed fit goes on with as ready and started, where Lightning skips
    it (:func:`skips_next_epoch_count`). Its start hooks stay skipped, as Lightning has them."""

    @override
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        loop = trainer.fit_loop
        if skips_next_epoch_count(loop):
            loop.epoch_progress.increment_ready()
            loop.epoch_progress.increment_started()
