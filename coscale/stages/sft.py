"""SFT stages: the warm-up, each iteration's SFT, re-distillation and the final retrain's fit.

All of them fine-tune the initial model (or a given start) on pairs the curriculum serves and
export the result as a plain Hugging Face folder; none changes the curriculum.
"""

from __future__ import annotations

from coscale.modules import SFTModule
from coscale.stages.context import StageContext


def sft_stage(ctx: StageContext, name: str, source: str = "all", start: str | None = None):
    """SFT of ``start`` (default: the initial model) on the curriculum's ``source`` pairs.

    Returns:
        The exported model's folder, or None when the curriculum has no such pairs.
    """
    view = ctx.view(sft_source=source)
    if not view.items("sft"):
        print(f"[coscale] {name}: no SFT pairs, stage skipped", flush=True)
        return None
    module = SFTModule(model=start or ctx.cfg.model, **ctx.sft_args)
    ctx.fit(name, module, view, [], ctx.cfg.sft_epochs, max_steps=ctx.cfg.sft_max_steps)
    return module.export(ctx.path(name, "model"))


def load_for_sampling(ctx: StageContext, model: str) -> SFTModule:
    """``model`` in an SFTModule (its prompt, reward and sampling settings), on the device."""
    return SFTModule(model=model, **ctx.sft_args).to(ctx.device())
