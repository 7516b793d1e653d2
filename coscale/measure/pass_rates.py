"""Measurement: K samples per problem with the current policy -> the curriculum's pools.

The pipeline's measure stage, :class:`~coscale.callbacks.PassRateMeasurement` and the final
retrain's before / after comparison all sample through here, so their numbers agree. Chunks of
problems are dealt to the ranks and the counts gathered, so every rank records the same outcome
and the counts do not depend on the number of ranks.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from coscale.distributed import all_gather_objects, rank_world
from coscale.loop.curriculum import Curriculum
from coscale.rollout.base import SamplingParams
from coscale.scoring.sample_count import chunk_sampling, pass_rates
from coscale.seeds import derive_seed


def measure(
    module: Any,
    curriculum: Curriculum,
    samples: int,
    pools: tuple[str, ...] = ("unsolvable", "solvable", "solved"),
    max_problems: int | None = None,
    temperature: float = 1.0,
    max_new_tokens: int | None = None,
    seed: int = 0,
    batch_size: int = 16,
    top_p: float = 1.0,
    top_k: int = 0,
) -> tuple[dict[str, dict], dict[str, float]]:
    """Samples ``samples`` completions of every chosen problem and records the accuracy.

    Returns:
        ``{id: {"samples", "correct", "pool", "solutions", "rl_rounds"}}`` of the measured
        problems (the budgets spent on each: what its pool may depend on), and the ``pool/``
        metrics (pool sizes, pass@1 and pass@k over the measured problems).
    """
    ids = curriculum.measure_ids(pools, max_problems)
    problems = [curriculum.problems[i].to_dict() for i in ids]
    base = getattr(module, "val_sampling", None) or SamplingParams()
    sampling = replace(
        base,
        temperature=temperature,
        max_new_tokens=max_new_tokens or base.max_new_tokens,
        top_p=top_p,
        top_k=top_k,
        seed=derive_seed("measure", seed, curriculum.measurements),
    )
    counts = sample_counts(module, problems, samples, sampling, batch_size)
    labels = curriculum.record_measurement(
        {pid: (samples, c) for pid, c in zip(ids, counts)}, lr=getattr(module, "lr", None)
    )
    spent = curriculum.pools
    results = {
        pid: {"samples": samples, "correct": c, "pool": labels[pid]}
        | {"solutions": spent.solutions_used(pid), "rl_rounds": spent.rl_rounds(pid)}
        for pid, c in zip(ids, counts)
    }
    metrics = {f"pool/{name}": float(n) for name, n in curriculum.pools.counts().items()}
    metrics |= {f"pool/{key}": v for key, v in pass_rates(samples, counts).items()}
    return results, metrics


def sample_counts(
    module: Any, problems: list[dict], n: int, sampling: SamplingParams, chunk: int
) -> list[int]:
    """Correct samples out of ``n`` per problem (``module.count_correct_many``), all ranks
    together.

    Chunks of ``chunk`` problems are dealt round-robin to the ranks, chunk ``j`` sampled with
    ``sampling.seed + j``, so the counts do not depend on the number of ranks; each rank hands
    all of its chunks to its backend in one call (a vLLM engine batches them all together). The
    counts are gathered, and every rank returns the full list in the order of ``problems``.
    Every rank samples as many chunks (a sharded policy needs it: a rank short of chunks
    samples its first one again and drops it).
    """
    chunks = [problems[i : i + chunk] for i in range(0, len(problems), chunk)]
    rank, world = rank_world()
    rounds = -(-len(chunks) // world)
    mine = [r * world + rank for r in range(rounds)]
    real = [j for j in mine if j < len(chunks)]
    padded = [chunks[j] if j < len(chunks) else chunks[real[0] if real else 0] for j in mine]
    samplings = [chunk_sampling(sampling, j) for j in mine]
    counts = _count_many(module, padded, n, samplings) if padded else []
    done = dict(all_gather_objects([(j, list(c)) for j, c in zip(mine, counts) if j in real]))
    return [c for j in range(len(chunks)) for c in done[j]]


def _count_many(
    module: Any, chunks: list[list[dict]], n: int, samplings: list[SamplingParams]
) -> list[list[int]]:
    """``module.count_correct_many`` (one backend call); an object with ``count_correct`` alone
    (a user's own sampler) is asked chunk by chunk."""
    many = getattr(module, "count_correct_many", None)
    if many is not None:
        return many(chunks, n, samplings)
    return [module.count_correct(c, n, s) for c, s in zip(chunks, samplings)]


def judged_problems(held_out: list[Any], curriculum: Curriculum) -> list[dict]:
    """What models are judged on: the ``held_out`` problems, else the training problems (never
    point it at the sets you report)."""
    return [p.to_dict() for p in (held_out or list(curriculum.problems.values()))]


def judge(module: Any, problems: list[dict], tag: str, samples: int, seed: int) -> dict[str, float]:
    """``val/final_<tag>_pass@1`` and ``@<samples>`` of ``module`` on ``problems``: every model
    gets the same seeded samples, so two models are compared on equal terms."""
    if not problems:
        return {}
    sampling = replace(getattr(module, "val_sampling", None) or SamplingParams(), seed=seed)
    counts = sample_counts(module, problems, samples, sampling, 16)
    return {f"val/final_{tag}_{key}": v for key, v in pass_rates(samples, counts).items()}


KEEP = ("retrained", "better", "best")
"""Values of ``pipeline.final.keep``; :class:`~coscale.callbacks.FinalRetrain`'s ``keep``, which
has no earlier iterations' models, takes the first two."""


def keep_retrained(results: dict[str, float], keep: str) -> bool:
    """Whether the final retrain replaces the model before it, by the judged ``results``
    (:func:`judge`'s ``before`` and ``after``): always with ``retrained``, else when its pass@1
    is not lower. Written to ``results`` as ``val/final_kept_retrained``. The one rule of the
    pipeline's final stage and of :class:`~coscale.callbacks.FinalRetrain`."""
    before, after = results["val/final_before_pass@1"], results["val/final_after_pass@1"]
    take = keep == "retrained" or after >= before
    results["val/final_kept_retrained"] = float(take)
    return take
