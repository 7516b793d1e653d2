"""Stages that sample but do not train: measure the pools, and judge a model's pass@k.

Neither is a fit: a model is loaded into an SFTModule for its prompt, reward and sampling
settings and sampled through :mod:`coscale.stages.measure`, which spreads the work over ranks.
"""

from __future__ import annotations

from dataclasses import replace

from coscale.rollout.base import SamplingParams
from coscale.stages.context import StageContext
from coscale.stages.measure import measure, pass_rates, sample_counts
from coscale.stages.sft import load_for_sampling


def measure_stage(ctx: StageContext, name: str, model: str) -> dict[str, int]:
    """``eval_k`` samples of every unfailed problem with ``model`` -> pools relabelled."""
    module = load_for_sampling(ctx, model)
    _, metrics = measure(
        module, ctx.curriculum, ctx.cfg.eval_k, max_problems=ctx.cfg.eval_max_problems
    )
    ctx.log(metrics)
    return ctx.curriculum.pools.counts()


def judged_problems(ctx: StageContext) -> list[dict]:
    """What models are judged on: the held-out problems, else the training problems."""
    problems = ctx.data.val_problems or list(ctx.curriculum.problems.values())
    return [p.to_dict() for p in problems]


def judge(ctx: StageContext, model: str, problems: list[dict], tag: str, k: int) -> dict:
    """``val/final_<tag>_pass@1`` and ``@k`` of ``model``: every model judged gets the same
    seeded samples, so two models are compared on equal terms."""
    module = load_for_sampling(ctx, model)
    sampling = replace(module.val_sampling or SamplingParams(), seed=ctx.cfg.seed)
    counts = sample_counts(module, problems, k, sampling, 16)
    return {f"val/final_{tag}_{key}": v for key, v in pass_rates(k, counts).items()}
