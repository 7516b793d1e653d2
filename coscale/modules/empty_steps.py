"""Steps that move no weight: how a GRPO batch without signal still counts (as in TRL).

The optimiser steps with every ``.grad`` None, which torch's optimisers skip (no weight and no
optimiser state changes), so Lightning's step count and the LR schedule advance as for any
batch: ``max_steps`` and a checkpoint every n steps count batches. Without this, a fit whose
curriculum serves only problems the policy always (or never) solves would never reach
``max_steps``. A GradScaler (``16-mixed``) refuses a step with no gradient; there only the hooks
``LightningOptimizer.step`` runs around the step (the count) run.
"""

from __future__ import annotations

import lightning as L


def empty_steps(module: L.LightningModule, count: int) -> None:
    """``count`` optimiser steps of a manually optimised ``module`` that move no weight."""
    opt = module.optimizers()
    scaled = getattr(module.trainer.precision_plugin, "scaler", None) is not None
    for _ in range(count):
        opt.zero_grad()  # set_to_none: nothing for the optimiser to update
        if scaled:
            opt._on_before_step()
            opt._on_after_step()
        else:
            opt.step()
        if (sched := module.lr_schedulers()) is not None:
            sched.step()
