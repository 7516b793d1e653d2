"""A tiny built-in arithmetic task: verifiable problems with many correct solutions each.

Problems are sums and differences of a few small integers, generated from a seed. A
programmatic teacher writes distinct step-by-step solutions by combining the terms in
different orders, so "more solutions per problem" is real. Answers are checked by
:class:`~coscale.scoring.rewards.MathReward` in ``\\boxed{}``.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence

from coscale.loop.problem import Problem
from coscale.loop.solution_sources import Request, SolutionSource
from coscale.tasks.tiers import terms_of, worked_solution


def make_problem(rng: random.Random, terms: int, index: int, prefix: str) -> Problem:
    """One problem ``a+b-c...`` with ``terms`` terms between 1 and 49 (first term positive)."""
    values = [rng.randint(1, 49) for _ in range(terms)]
    signs = [1] + [rng.choice((1, -1)) for _ in range(terms - 1)]
    question = "".join(
        ("" if i == 0 else ("+" if s > 0 else "-")) + str(v)
        for i, (s, v) in enumerate(zip(signs, values))
    )
    answer = sum(s * v for s, v in zip(signs, values))
    return Problem(
        id=f"{prefix}-{index}",
        question=question,
        answer=str(answer),
        meta={"terms": list(zip(signs, values))},
    )


def solutions_of(problem: Problem, limit: int = 24) -> list[str]:
    """Distinct step-by-step solutions: the signed terms combined in different orders."""
    terms = [tuple(t) for t in problem.meta["terms"]]
    out: list[str] = []
    for order in itertools.permutations(terms):
        if order[0][0] < 0:
            continue
        text = worked_solution(order)
        if text not in out:
            out.append(text)
        if len(out) >= limit:
            break
    return out


def generate(n: int, terms: Sequence[int], seed: int, prefix: str) -> list[Problem]:
    """``n`` problems with term counts cycled from ``terms``, reproducible from ``seed``."""
    rng = random.Random(seed)
    return [make_problem(rng, terms[i % len(terms)], i, prefix) for i in range(n)]


class ArithmeticTeacher(SolutionSource):
    """The programmatic teacher: parses the question and writes new correct solutions."""

    def propose(self, requests: Sequence[Request], known) -> dict[str, list[str]]:
        out = {}
        for problem, k in requests:
            terms = terms_of(problem.question)
            p = Problem(problem.id, problem.question, problem.answer, meta={"terms": terms})
            have = set(known(problem.id))
            out[problem.id] = [s for s in solutions_of(p, limit=10_000) if s not in have][:k]
        return out
