"""Stops a GRPO fit once it has sampled a budget of rollouts: the budget the study compares at.

``Trainer(max_steps=...)`` counts optimiser steps, and a GRPO batch without any signal (every
group all right or all wrong) takes none (``coscale.modules.grpo``): on a set the policy has
learnt, a fit bounded by ``max_steps`` alone samples on and never ends. Every rollout is counted
in ``coscale.loop.budget`` whatever its step does; :class:`RolloutBudget` ends the fit at the
first step end where this fit's count reaches ``rollouts``, and at the end of an epoch that
served no batch (no problem left to serve).
"""

from __future__ import annotations

from lightning.pytorch.callbacks import Callback

from coscale.loop import budget


class RolloutBudget(Callback):
    """Sets ``trainer.should_stop`` once the fit has sampled ``rollouts`` rollouts or an epoch
    served nothing; ``spent`` holds how many it sampled, printed at the fit's end."""

    def __init__(self, rollouts: int) -> None:
        self.rollouts, self.spent, self.served = rollouts, 0, 0
        self.before = budget.snapshot()

    def on_train_start(self, trainer, pl_module) -> None:
        self.before = budget.snapshot()

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self.served = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.served += 1
        self.spent = budget.since(self.before, ("rollouts",))["rollouts"]
        if self.spent >= self.rollouts:
            trainer.should_stop = True

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if not self.served:
            trainer.should_stop = True

    def on_train_end(self, trainer, pl_module) -> None:
        steps = f"{trainer.global_step}/{trainer.max_steps} steps"
        print(f"[grpo] ended: {steps}, {self.spent} of {self.rollouts} rollouts", flush=True)
