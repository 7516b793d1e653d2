"""RolloutNSchedule: gives the fit's curriculum a Rollout N schedule (one N per difficulty group).

A thin adapter for a user's own ``Trainer``. The rule (groups by difficulty, N raised on
plateaus or set from lr / N_eff) is :class:`coscale.loop.schedule.NSchedule`; the curriculum owns it,
saves its state, and steps it when the RL module closes an epoch.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Callback
from typing_extensions import override

from coscale.loop.schedule import NSchedule
from coscale.modules.feed import curriculum_of
from coscale.modules.loggers import log_to_loggers


class RolloutNSchedule(NSchedule, Callback):
    """An :class:`~coscale.loop.schedule.NSchedule` (same arguments) that installs itself in the fit's
    curriculum, unless that has one already (e.g. restored), and groups the solvable problems at
    fit start. Lightning saves its state with the callbacks; the curriculum saves it too.
    """

    @override
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        cur = getattr(getattr(trainer, "datamodule", None), "curriculum", None)
        if cur is not None and cur.schedule is None:
            cur.schedule = self

    @override
    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        if (cur := curriculum_of(pl_module)) is not None:
            log_to_loggers(trainer, cur.assign_groups(getattr(pl_module, "lr", None)))
