"""SFT stages: the warm-up, each iteration's SFT, re-distillation and the final retrain's fit.

All of them fine-tune the initial model (or a given start) on pairs the curriculum serves and
export the result as a plain Hugging Face folder; none changes the curriculum. With
``pipeline.peft`` each trains a new adapter on the untouched start and exports it merged, with
the adapter in ``model/adapter``; sampling loads the merged folder, with no adapter.
"""

from __future__ import annotations

import os
import shutil

from coscale.distributed import barrier, is_writer
from coscale.log import logger
from coscale.measure.selection import SelectOnProblems
from coscale.modules import SFTModule
from coscale.run.context import StageContext
from coscale.sft.distill import DistillationSettings


def sft_stage(
    ctx: StageContext,
    name: str,
    source: str = "all",
    teacher: str | None = None,
    epochs: int | None = None,
):
    """SFT of the initial model on the curriculum's ``source`` pairs,
    distilled from ``teacher`` as well when one is given and ``pipeline.distill_weight`` > 0,
    for ``epochs`` passes (default: ``pipeline.sft_epochs``).

    Returns:
        The exported model's folder, or None when the curriculum has no such pairs.
    """
    view = ctx.datamodule(sft_source=source)
    if not view.items("sft"):
        logger.info(f"{name}: no SFT pairs, stage skipped")
        return None
    distill = {}
    if teacher is not None and ctx.cfg.distill_weight > 0:
        distill = {"distill": DistillationSettings(teacher, weight=ctx.cfg.distill_weight)}
        logger.info(f"{name}: distilling from {teacher} (weight {ctx.cfg.distill_weight})")
    module = SFTModule(model=ctx.cfg.model, peft=ctx.cfg.peft, **ctx.sft_args, **distill)
    select = selection(ctx, name)
    callbacks = [select] if select is not None else []
    if select is not None:  # the scorings sample with the run's engine
        ctx.attach(module, ctx.cfg.model)
    epochs = epochs or ctx.cfg.sft_epochs
    ctx.fit(name, module, view, callbacks, epochs, max_steps=ctx.cfg.sft_max_steps)
    if select is not None:
        select.finish()  # when the fit resumed finished (Lightning skipped its end)
        if (best := select.best_model()) is not None:
            return copy_model(best, ctx.path(name, "model"))
    return module.export(ctx.path(name, "model"))


def selection(ctx: StageContext, name: str) -> SelectOnProblems | None:
    """The stage's checkpoint selection on the validation problems (``data.val``; the training
    problems when there are none), None when it is off."""
    select = ctx.cfg.selection
    problems = select.candidates(ctx.data.val_problems, ctx.curriculum)
    return select.build(problems, ctx.path(name, "select"), ctx.cfg.seed, name)


def copy_model(src: str, dst: str) -> str:
    """``src``'s files into ``dst`` (rank 0 copies; every rank returns once it is done); nothing
    to do when they are one folder."""
    if os.path.abspath(src) != os.path.abspath(dst) and is_writer():
        shutil.copytree(src, dst, dirs_exist_ok=True)
    barrier()
    return dst


def load_for_sampling(ctx: StageContext, model: str) -> SFTModule:
    """``model`` in an SFTModule (its prompt, reward and sampling settings), on the device,
    sampling with the run's engine, which holds its weights (every rank syncs them)."""
    module = SFTModule(model=model, **ctx.sft_args).to(ctx.device())
    ctx.attach(module, model)
    if getattr(module.backend, "needs_sync", False):  # an engine that sampled another model
        module.backend.update_weights(module.policy)
    return module
