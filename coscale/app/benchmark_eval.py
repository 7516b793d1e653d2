"""pass@k of a model on named benchmarks: sample every problem n times, score, aggregate.

The engine of ``coscale eval`` (`coscale.app.evaluate`), usable on its own with any
`RolloutBackend` and reward: it samples and counts as every other score does
(`coscale.scoring.sample_count`), pass@k the unbiased estimator over a benchmark's problems; `result_rows` adds a macro average over benchmarks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from coscale.distributed import all_gather_objects, rank_world
from coscale.loop.problem import Problem
from coscale.rollout.base import RolloutBackend, SamplingParams
from coscale.scoring.reward_set import is_correct
from coscale.scoring.sample_count import chunk_sampling, pass_rates, sample_and_count


@dataclass
class BenchmarkResult:
    """pass@k of one benchmark, and the per-problem counts behind it."""

    name: str
    samples: int
    correct: list[int]  # per problem, out of `samples`
    pass_at: dict[int, float]
    mean_tokens: float  # mean completion length
    truncated: float  # share of completions cut by max_new_tokens

    @property
    def problems(self) -> int:
        return len(self.correct)


def evaluate(
    backend: RolloutBackend,
    prompts: Callable[[list[str]], list[str]],
    benchmarks: dict[str, list[Problem]],
    reward: Callable[[list[str], list[str]], list[float]],
    samples: int,
    ks: Sequence[int],
    sampling: SamplingParams,
    batch_size: int,
) -> list[BenchmarkResult]:
    """Samples every problem `samples` times and computes pass@k per benchmark.

    Args:
        backend: Generates the completions.
        prompts: Questions -> prompts (the model's prompt format).
        benchmarks: Problems per benchmark name.
        reward: ``reward(completions, answers) -> scores``, correct by :func:`is_correct`.
        samples: n, completions per problem.
        ks: pass@k budgets, each <= n.
        sampling: Sampling settings; call j is seeded ``sampling.seed + j`` when seeded.
        batch_size: Problems per backend call (one call at a time). Under a process group
            the ranks share the calls (call j on rank j mod world size) and every rank gets
            every result; call j's seed does not depend on the rank, so the counts are those of
            one process.
    """
    return [
        _evaluate_one(backend, prompts, name, problems, reward, samples, ks, sampling, batch_size)
        for name, problems in benchmarks.items()
    ]


def _evaluate_one(
    backend, prompts, name, problems, reward, samples, ks, sampling, batch_size
) -> BenchmarkResult:
    chunks = [problems[i : i + batch_size] for i in range(0, len(problems), batch_size)]
    texts = [prompts([p.question for p in chunk]) for chunk in chunks]
    samplings = [chunk_sampling(sampling, j) for j in range(len(chunks))]

    def verdicts(chunk: list[Problem], _: list[str], rollouts: Any) -> Any:
        answers = [chunk[i].answer for i in rollouts.prompt_index.tolist()]
        return is_correct(reward(rollouts.texts, answers))

    def count(j: int) -> Any:  # chunk j's counts; its rollouts are let go before the next
        return sample_and_count(
            backend, [chunks[j]], [texts[j]], samples, [samplings[j]], verdicts
        )[0]

    rank, world = rank_world()
    mine = [(j, count(j)) for j in range(rank, len(chunks), world)]
    counted = [one for _, one in sorted(all_gather_objects(mine), key=lambda pair: pair[0])]
    correct = [c for one in counted for c in one.correct]
    tokens, truncated = sum(one.tokens for one in counted), sum(one.truncated for one in counted)
    total = max(1, len(problems) * samples)
    rates = pass_rates(samples, correct, ks)
    pass_at = {k: rates.get(f"pass@{k}", float("nan")) for k in ks}
    return BenchmarkResult(name, samples, correct, pass_at, tokens / total, truncated / total)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def result_rows(results: Sequence[BenchmarkResult]) -> list[dict[str, Any]]:
    """One row per benchmark plus a macro ``average`` row (mean over benchmarks)."""
    rows = [
        {"benchmark": r.name, "problems": r.problems, "samples": r.samples}
        | {f"pass@{k}": v for k, v in r.pass_at.items()}
        | {"mean_tokens": r.mean_tokens, "truncated": r.truncated}
        for r in results
    ]
    if len(rows) > 1:
        keys = [k for k in rows[0] if k not in ("benchmark", "problems", "samples")]
        total = sum(row["problems"] for row in rows)
        head = {"benchmark": "average", "problems": total, "samples": rows[0]["samples"]}
        rows.append(head | {k: _mean([row[k] for row in rows]) for k in keys})
    return rows


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """A plain-text table of `result_rows` (floats with 4 decimals)."""
    columns = list(rows[0])
    cells = [[f"{v:.4f}" if isinstance(v, float) else str(v) for v in row.values()] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    line = "  ".join(c.ljust(w) for c, w in zip(columns, widths))
    body = ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in cells]
    return "\n".join([line, "-" * len(line), *body])
