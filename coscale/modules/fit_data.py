"""How a module reaches its fit's curriculum and batches: every read of them is here.

A fit on a :class:`~coscale.datamodules.serving.CurriculumDataModule` (a ProblemDataModule is
one) exposes ``datamodule.curriculum`` (a :class:`~coscale.loop.curriculum.Curriculum`, checked
by type) and a cursor into its epoch's batches; the functions below find them on the trainer
(by attribute: a trainer of any other loader has none) and return None or nothing then, and the
modules train without reporting.
"""

from __future__ import annotations

from typing import Any

from coscale.datamodules.batches import ResumableLoader
from coscale.loop.curriculum import Curriculum


def curriculum_of(module: Any) -> Curriculum | None:
    """The curriculum of ``module``'s running fit, or None (no trainer, or another loader)."""
    trainer = getattr(module, "_trainer", None)
    curriculum = getattr(getattr(trainer, "datamodule", None), "curriculum", None)
    return curriculum if isinstance(curriculum, Curriculum) else None


def warn_no_curriculum(owner: Any) -> None:
    """One warning per callback ``owner`` that its trainer serves no curriculum (no
    ProblemDataModule), so it does nothing."""
    if not getattr(owner, "_warned_no_datamodule", False):
        from lightning.pytorch.utilities import rank_zero_warn

        owner._warned_no_datamodule = True
        rank_zero_warn(f"{type(owner).__name__}: the trainer has no ProblemDataModule; skipping")


def epoch_finished(trainer: Any) -> bool:
    """Whether the running epoch's last batch has been handed out: True from the step that
    trains it on. False when the fit stopped before it (``max_steps``, ``should_stop``): such
    an epoch is not over, so it must not be closed or measured."""
    loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
    return loop is None or loop._num_ready_batches_reached()


def batch_position(trainer: Any) -> tuple[int, int] | None:
    """(epoch, index in the epoch) of the batch being trained, from coscale's loader's cursor;
    None for a loader coscale did not build."""
    cursor = getattr(getattr(trainer, "datamodule", None), "cursor", None)
    if cursor is None or not isinstance(
        getattr(trainer, "train_dataloader", None), ResumableLoader
    ):
        return None
    return cursor.epoch, cursor.consumed - 1


def upcoming_batches(trainer: Any, depth: int) -> list[tuple[tuple[int, int], list[dict]]]:
    """The next `depth` batches of this epoch after the one being trained, each with its
    position (`batch_position`); fewer near the epoch's end, none past it (the next epoch's
    batches depend on the pools its start builds)."""
    here = batch_position(trainer)
    if here is None:
        return []
    epoch, index = here
    batches = trainer.train_dataloader.dataset.batches
    ahead = range(index + 1, min(index + 1 + depth, len(batches)))
    return [((epoch, i), batches[i]) for i in ahead]
