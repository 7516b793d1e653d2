"""Sample and count: the one way coscale scores a model on problems.

Chunks of problems go to a backend in one ``generate_many`` call (a vLLM engine batches them all),
chunk ``j`` sampled with :func:`chunk_sampling` ``(sampling, j)``; a verdict function marks each
completion correct or not, and the correct ones are counted per problem. Measurement, checkpoint
selection, the final judge (through the modules' ``count_correct_many``), ``coscale eval``, the
benchmarks and the demo's report all count here, and aggregate with :func:`pass_rates`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from torch import Tensor

from coscale.clock import timed
from coscale.rollout.base import SampleCall, SamplingParams
from coscale.scoring.metrics import pass_at_k
from coscale.scoring.reward_set import correct_per_prompt

Verdicts = Callable[[list[Any], list[str], Any], Tensor]
"""``(chunk's problems, their prompts, rollouts) -> [R]`` bool: which completions are correct."""


@dataclass(frozen=True)
class Counted:
    """One chunk's outcome: correct samples per problem, and what its rollouts cost."""

    correct: list[int]
    rollouts: int  # completions sampled
    tokens: float  # completion tokens
    truncated: int  # completions cut at the token limit


def chunk_sampling(sampling: SamplingParams, j: int) -> SamplingParams:
    """Chunk ``j``'s sampling: seeded ``sampling.seed + j`` (unseeded stays unseeded)."""
    return sampling if sampling.seed is None else replace(sampling, seed=sampling.seed + j)


def sample_and_count(
    backend: Any,
    chunks: Sequence[list[Any]],
    prompts: Sequence[list[str]],
    n: int,
    samplings: Sequence[SamplingParams],
    verdicts: Verdicts,
) -> list[Counted]:
    """``n`` samples of every prompt of each chunk (``prompts[j]`` are ``chunks[j]``'s problems'
    prompts, sampled with ``samplings[j]``), in one backend call; each chunk's correct count per
    problem by ``verdicts``. The backend call counts as ``sampling`` on the stage's clock."""
    if not chunks:
        return []
    calls = [SampleCall(list(p), n, s) for p, s in zip(prompts, samplings)]
    with timed("sampling"):
        batches = backend.generate_many(calls)
    out = []
    for chunk, texts, rollouts in zip(chunks, prompts, batches):
        correct = verdicts(chunk, list(texts), rollouts)  # [R]
        counts = correct_per_prompt(rollouts.prompt_index, correct, len(chunk))
        cut = sum(r == "length" for r in rollouts.finish_reasons)
        out.append(Counted(counts, rollouts.num_rollouts, float(rollouts.lengths.sum()), cut))
    return out


def pass_rates(n: int, counts: Sequence[int], ks: Sequence[int] | None = None) -> dict[str, float]:
    """``{"pass@k"}`` (unbiased, each ``k <= n``; default 1 and ``n``) over problems with ``n``
    samples and ``counts`` correct; empty without problems."""
    if not counts:
        return {}
    return {
        f"pass@{k}": math.fsum(pass_at_k(n, c, k) for c in counts) / len(counts)
        for k in sorted(set(ks or (1, n)))
    }
