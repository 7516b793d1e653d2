"""One step axis for a whole run: a stage's fit logs at its own step plus the steps of the run's
stages before it, so the curves of it1/sft, it1/rl, it2/sft ... follow one another instead of
all starting at 0.

Every stage of a ``coscale run`` is a fresh ``Trainer`` whose ``global_step`` starts at 0; the
run's logger is one of these loggers, and before each stage the pipeline sets its
:attr:`RunSteps.step_offset` to the optimiser steps the run's finished stages took (kept in the
state file, so a resumed run goes on from the same offset). What a stage measures outside a fit
is logged at the offset too: where the run stood when it ran. In W&B the axis is Lightning's own
``trainer/global_step``; each logged row also holds ``run/stage`` (the stage's number in the
run, from 0), to tell the stages apart on it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightning.pytorch.loggers import CSVLogger, WandbLogger


class RunSteps:
    """Mixed in before a Lightning logger: every step it logs at is moved by ``step_offset``."""

    step_offset: int = 0
    stage_index: int | None = None

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        at = None if step is None else step + self.step_offset
        if self.stage_index is not None:
            metrics = {**metrics, "run/stage": float(self.stage_index)}
        super().log_metrics(metrics, at)  # type: ignore[misc]


class RunWandbLogger(RunSteps, WandbLogger):
    """``WandbLogger`` on the run's step axis; with ``log_final_model`` the run logs its final
    model as an artifact (``pipeline.wandb.log_model``)."""

    log_final_model: bool = False


class RunCSVLogger(RunSteps, CSVLogger):
    """``CSVLogger`` on the run's step axis."""


def at_stage(logger: Any, offset: int, index: int) -> None:
    """Puts ``logger`` (any logger; only a :class:`RunSteps` one moves) at a stage's place."""
    if isinstance(logger, RunSteps):
        logger.step_offset, logger.stage_index = offset, index
