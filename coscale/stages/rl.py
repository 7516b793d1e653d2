"""The RL stage: GRPO on the solvable problems, each with its group's Rollout N.

Each epoch serves the solvable set anew; the module reports every rollout to the curriculum and
closes the epoch there (tally -> pools, the N schedule's step); with ``rl_measure_every`` a
measurement follows on chosen epochs. The run's one schedule starts afresh (N = ``n_init``) unless
the stage resumes from its checkpoint, which holds the schedule with the rest of the curriculum.
With ``pipeline.peft`` the stage trains a new adapter on the previous stage's merged export (the
KL reference: that model, the adapter off), as a full fine-tune starts from that model and keeps
it as the reference; its ``adapter/`` then applies to that model, not to the initial one.
"""

from __future__ import annotations

from coscale.log import logger
from coscale.loop.pools import Pool
from coscale.measure.pass_rate_measurement import PassRateMeasurement
from coscale.modules import GRPOModule
from coscale.run.context import StageContext


def rl_stage(ctx: StageContext, name: str, model: str) -> str | None:
    """GRPO from ``model``; returns the exported model's folder (None: nothing solvable)."""
    cur, cfg = ctx.curriculum, ctx.cfg
    resuming = ctx.resumable(name)
    if not resuming and not cur.pools.members(Pool.SOLVABLE):
        logger.info(f"{name}: no solvable problems, RL skipped")
        return None
    module = GRPOModule(model=model, peft=ctx.cfg.peft, **ctx.grpo_args)
    ctx.attach(module, model)  # the run's engine: synced from the policy at the fit's start
    if not resuming:  # the run's one schedule, afresh (a resumed fit restores it)
        ctx.log(cur.start_rollout_n(module.lr, afresh=True))
    callbacks = []
    if cfg.rl_measure_every:
        callbacks.append(
            PassRateMeasurement(
                samples=cfg.measure_samples,
                max_problems=cfg.measure_max_problems,
                every_n_epochs=cfg.rl_measure_every,
                **cfg.sampling.rl_sampling,
            )
        )
    ctx.fit(name, module, ctx.datamodule(), callbacks, cfg.rl_epochs)
    return module.export(ctx.path(name, "model"))
