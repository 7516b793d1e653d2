"""Stages that sample but do not train: measure the pools, and judge a model's pass@k.

Neither is a fit: a model is loaded into an SFTModule for its prompt, reward and sampling
settings (``pipeline.sampling``), lent the run's engine, and sampled through
:mod:`coscale.measure.pass_rates`, which spreads the work over ranks.
"""

from __future__ import annotations

import time

from coscale.distributed import is_writer
from coscale.log import logger
from coscale.loop.commit import write_json
from coscale.measure import pass_rates
from coscale.run.context import StageContext
from coscale.stages.sft import load_for_sampling


def measure_stage(ctx: StageContext, name: str, model: str) -> dict[str, int]:
    """``measure_samples`` samples of every unfailed problem with ``model`` -> pools relabelled;
    each problem's ``{samples, correct, pool}`` goes to ``<run_dir>/<name>/pass_rates.json``."""
    module = load_for_sampling(ctx, model)
    start = time.perf_counter()
    results, metrics = pass_rates.measure(
        module,
        ctx.curriculum,
        ctx.cfg.measure_samples,
        max_problems=ctx.cfg.measure_max_problems,
        seed=ctx.cfg.seed,
        **ctx.cfg.sampling.rl_sampling,
    )
    seconds = time.perf_counter() - start
    if is_writer():  # each problem's samples, correct ones and new pool: what moved, and why
        write_json(ctx.path(name, "pass_rates.json"), results)
    samples = sum(r["samples"] for r in results.values())
    ctx.log(metrics | {"perf/measure_seconds": seconds, "perf/measure_samples": float(samples)})
    logger.info(
        f"{name}: {samples} samples on {ctx.engine.kind} in {seconds:.1f} s "
        f"({samples / max(seconds, 1e-9):.1f}/s; engine starts so far: {ctx.engine.starts})"
    )
    return ctx.curriculum.pools.counts()


def judge_model(
    ctx: StageContext, model: str, problems: list[dict], tag: str, samples: int
) -> dict:
    """``val/final_<tag>_pass@1`` and ``@<samples>`` of the model in folder ``model``."""
    start = time.perf_counter()
    results = pass_rates.judge(load_for_sampling(ctx, model), problems, tag, samples, ctx.cfg.seed)
    logger.info(
        f"judged {tag}: {samples * len(problems)} samples on {ctx.engine.kind} in "
        f"{time.perf_counter() - start:.1f} s (engine starts so far: {ctx.engine.starts})"
    )
    return results
