"""The optimiser both modules use: AdamW with a linear learning-rate warm-up."""

from __future__ import annotations

from typing import Any

import torch


def adamw_with_warmup(
    model: torch.nn.Module,
    lr: float,
    betas: tuple[float, float],
    weight_decay: float,
    warmup_steps: int,
) -> dict[str, Any]:
    """AdamW over the trainable parameters, the LR ramped linearly over ``warmup_steps`` steps."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, betas=tuple(betas), weight_decay=weight_decay)
    if warmup_steps <= 0:
        return {"optimizer": opt}
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / warmup_steps))
    return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
