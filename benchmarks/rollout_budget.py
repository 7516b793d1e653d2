"""Stops a GRPO fit once it has sampled a budget of rollouts: the budget the study compares at.

A GRPO step samples as many rollouts as its batch holds problems times their N, and a
curriculum that leaves out the problems the policy always solves serves smaller and smaller
batches, so ``Trainer(max_steps=...)`` bounds no budget in rollouts. Every rollout is counted in
``coscale.loop.budget``; :class:`RolloutBudget` ends the fit at the first step end where this
fit's count reaches ``rollouts``, and at the end of an epoch that served no batch (no problem
left to serve), so a fit with no ``max_steps`` ends too.
"""

from __future__ import annotations

from lightning.pytorch.callbacks import Callback
from step_lines import step_of

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
        steps = f"{step_of(trainer)} steps"
        print(f"[grpo] ended: {steps}, {self.spent} of {self.rollouts} rollouts", flush=True)
