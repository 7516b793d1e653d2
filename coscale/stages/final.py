"""The final stage: judge the final retrain (trained in the stages before this one) against the
model the last iteration ended with, then keep a model.

``final.keep`` decides what the run ends with, judged on the held-out problems (or the training
problems when there are none), never on the sets you report:

* ``retrained`` (the paper): the retrain from the initial model;
* ``better``: the retrain unless it scores lower than the model before it;
* ``best``: as ``better``, then each earlier iteration's model too (latest first; a model
  replaces the choice only with a strictly higher score, so later models win ties).
"""

from __future__ import annotations

from coscale.log import logger
from coscale.loop.commit import commit_point
from coscale.measure.pass_rates import judged_problems, keep_retrained
from coscale.run.context import StageContext
from coscale.stages.measure import judge_model
from coscale.stages.sft import copy_model


def final_stage(
    ctx: StageContext,
    name: str,
    current: str,
    candidate: str | None,
    earlier: list[tuple[int, str]],
):
    """Judges, keeps; returns (results, the kept model's folder ``<name>/model``).

    Args:
        current: The model the last iteration ended with.
        candidate: The final retrain's model (after its RL with ``final.rl``); None when the
            retrain had nothing to train on.
        earlier: ``(iteration, folder)`` of each earlier iteration's model, for ``best``.
    """
    problems = judged_problems(ctx.data.val_problems, ctx.curriculum)
    samples, keep = min(8, ctx.cfg.measure_samples), ctx.cfg.final.keep
    results = judge_model(ctx, current, problems, "before", samples)
    kept, score = current, results["val/final_before_pass@1"]
    if candidate is not None:
        results |= judge_model(ctx, candidate, problems, "after", samples)
        if keep_retrained(results, keep):
            kept, score = candidate, results["val/final_after_pass@1"]
    if keep == "best":
        results["val/final_kept_iteration"] = 0.0
        for it, folder in sorted(earlier, reverse=True):
            key = f"it{it}"
            results |= judge_model(ctx, folder, problems, key, samples)
            if results[f"val/final_{key}_pass@1"] > score:
                kept, score = folder, results[f"val/final_{key}_pass@1"]
                results["val/final_kept_iteration"] = float(it)
    ctx.log(results)
    commit_point(f"{name} judged, before the copy")  # a kill here judges again on restart
    out = copy_model(kept, ctx.path(name, "model"))  # no rank reads it before rank 0 copied it
    logger.info("final: " + ", ".join(f"{k}={v:.4f}" for k, v in results.items()))
    return results, out
