"""How a module reaches the curriculum of its fit: the one typed interface, no duck typing.

A fit on a :class:`~coscale.datamodules.CurriculumDataModule` (or a ProblemDataModule) exposes
``datamodule.curriculum``; modules read from and report to that object only. A fit on any other
loader has none, and the modules then train without reporting.
"""

from __future__ import annotations

from typing import Any

from coscale.loop.curriculum import Curriculum


def curriculum_of(module: Any) -> Curriculum | None:
    """The curriculum of ``module``'s running fit, or None (no trainer, or another loader)."""
    trainer = getattr(module, "_trainer", None)
    curriculum = getattr(getattr(trainer, "datamodule", None), "curriculum", None)
    return curriculum if isinstance(curriculum, Curriculum) else None


def epoch_finished(trainer: Any) -> bool:
    """Whether the running epoch's last batch has been handed out: True from the step that
    trains it on. False when the fit stopped before it (``max_steps``, ``should_stop``): such
    an epoch is not over, so it must not be closed or measured."""
    loop = getattr(getattr(trainer, "fit_loop", None), "epoch_loop", None)
    return loop is None or loop._num_ready_batches_reached()
