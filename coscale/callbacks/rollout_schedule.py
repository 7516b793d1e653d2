"""RolloutNSchedule: gives the fit's curriculum a Rollout N schedule (one N per difficulty group).

The way to set Rollout N in your own ``Trainer`` (``coscale run`` has ``pipeline.schedule``, the
same arguments; docs/pipeline.md). The rule (groups by difficulty, N raised on plateaus or set
from lr / N_eff) is :class:`coscale.loop.schedule.NSchedule`; the curriculum owns it, saves its
state with the rest of the loop's, and steps it when the RL module closes an epoch.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Callback
from typing_extensions import override

from coscale.loop.schedule import NSchedule
from coscale.modules.fit_data import curriculum_of, warn_no_curriculum
from coscale.modules.loggers import log_to_loggers


class RolloutNSchedule(Callback):
    """Installs an :class:`~coscale.loop.schedule.NSchedule` built from ``settings`` (its
    arguments: ``RolloutNSchedule(n_init=4, factor=1.0)`` keeps every N at 4) in the fit's
    curriculum, unless that has one already (e.g. restored), and groups the solvable problems at
    fit start. Its state is the curriculum's, saved once with the DataModule's.
    """

    def __init__(self, **settings: Any) -> None:
        self.schedule = NSchedule(**settings)

    @override
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if (cur := getattr(getattr(trainer, "datamodule", None), "curriculum", None)) is not None:
            cur.use_schedule(self.schedule)

    @override
    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        if (cur := curriculum_of(pl_module)) is None:
            warn_no_curriculum(self)
        else:
            log_to_loggers(trainer, cur.start_rollout_n(getattr(pl_module, "lr", None), False))
