"""The built-in demo task: signed-integer arithmetic in difficulty tiers, with a teacher.

A problem is a chain of signed terms (``38+71-12+45``); a solution combines two numbers per
step (``38+71=109;109-12=97;97+45=142;\\boxed{142}``). The programmatic teacher writes many
distinct correct solutions by combining the terms in different orders, so "more solutions per
problem" is real. A hash of a problem's question puts it on one of three sides, whatever seed
made it (:func:`side_of`): ``train`` (the problems to train on), ``val`` (validation: checkpoint
selection, the final keep rule, every config choice) and ``test`` (the held-out sets a report
scores once). The three are disjoint by construction.

Tiers (``TIERS``): the base model is pre-trained on the easy tiers (two and three terms) and
single-step drills; the four held-out "benchmarks" are four-term sign patterns, which need
composition the base has only seen rarely: they sit at its ability boundary.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from coscale.loop.problem import Problem
from coscale.loop.solution_sources import Request, SolutionSource
from coscale.tasks import sides
from coscale.tasks.sides import SIDES

CHARS = "0123456789+-=;\\boxed{}Q:A\n"
"""Every character the task's prompts and solutions use (the demo model's vocabulary)."""

PROMPT = "Q:{question}\nA:"
"""Prompt template of the demo task."""


@dataclass(frozen=True)
class Tier:
    """A family of problems: the signs of the terms after the first, and the term range."""

    name: str
    signs: tuple[int, ...]  # +1 / -1 for terms 2..k
    low: int = 1
    high: int = 99


TIERS = {
    "T1": Tier("T1", (1,)),  # a+b
    "T2": Tier("T2", (1, -1)),  # a+b-c
    "T2v": Tier("T2v", (-1, 1)),  # a-b+c
    "T3": Tier("T3", (1, -1, 1), 10, 99),  # a+b-c+d
    "T3v": Tier("T3v", (1, 1, -1), 10, 99),  # a+b+c-d
    "T3w": Tier("T3w", (-1, 1, 1), 10, 99),  # a-b+c+d
    "T3x": Tier("T3x", (1, 1, 1), 10, 99),  # a+b+c+d
}
BENCHMARKS = ("T3", "T3v", "T3w", "T3x")
"""The four held-out sets that play the paper's four benchmarks."""
EASY = "T1"


def terms_of(question: str) -> list[tuple[int, int]]:
    """``"38+71-12"`` -> ``[(1, 38), (1, 71), (-1, 12)]``: the signed terms of a chain."""
    terms, sign, digits = [], 1, ""
    for ch in question + "+":
        if ch.isdigit():
            digits += ch
            continue
        if digits:
            terms.append((sign, int(digits)))
            digits = ""
        sign = -1 if ch == "-" else 1
    return terms


def side_of(question: str) -> str:
    """The side ``question`` is on (:mod:`coscale.tasks.sides`): one problem in ten is
    ``test``, one in ten ``val``, the rest ``train``."""
    return sides.side_of(question)


def is_held_out(question: str) -> bool:
    """Whether ``question`` is kept out of training (a ``val`` or ``test`` problem): the
    shipped base model was pre-trained on ``train`` problems only."""
    return side_of(question) != "train"


def _question(rng: random.Random, tier: Tier) -> str:
    values = [rng.randint(tier.low, tier.high) for _ in range(len(tier.signs) + 1)]
    ops = "".join(("+" if s > 0 else "-") + str(v) for s, v in zip(tier.signs, values[1:]))
    return f"{values[0]}{ops}"


def problems(tier: str, n: int, seed: int, side: str = "train") -> list[Problem]:
    """``n`` distinct problems of ``tier`` from one of :data:`SIDES`; ids are
    ``<tier>-<side>-<i>``."""
    if side not in SIDES:
        raise ValueError(f"side must be one of {', '.join(SIDES)}; got {side!r}")
    spec, rng, seen, out = TIERS[tier], random.Random(f"{tier}-{seed}"), set(), []
    while len(out) < n:
        q = _question(rng, spec)
        if q in seen or side_of(q) != side:
            continue
        seen.add(q)
        answer = sum(s * v for s, v in terms_of(q))
        out.append(Problem(f"{tier}-{side}-{len(out)}", q, str(answer), meta={"tier": tier}))
    return out


def worked_solution(terms: Sequence[tuple[int, int]]) -> str:
    """The signed ``terms`` added in the order given, one step each, then the boxed total."""
    total, parts = terms[0][0] * terms[0][1], []
    for sign, value in terms[1:]:
        new = total + sign * value
        parts.append(f"{total}{'+' if sign > 0 else '-'}{value}={new}")
        total = new
    return ";".join([*parts, f"\\boxed{{{total}}}"])


def canonical_solution(question: str) -> str:
    """Left-to-right solution (the style the base model is pre-trained on)."""
    return worked_solution(terms_of(question))


def solutions(question: str) -> Iterator[str]:
    """Distinct correct solutions, the canonical left-to-right one first.

    Variants: the terms in every order that starts with an added term (the running total then
    starts from a number, as in the canonical style), and each two-digit term after the first
    that is not a multiple of ten optionally added in two steps, tens then units (``+54`` as
    ``+50``, ``+4``). All reorderings come first, then solutions with one split, two splits,
    ...: the closer a solution is to the canonical style, the earlier it comes. ``a+b-c+d`` has
    3 x 3! = 18 reorderings and up to 18 x 8 = 144 solutions.
    """
    terms, seen = terms_of(question), set()
    for n_splits in range(len(terms)):
        for lead, rest in _orders(terms):
            splittable = [i for i, (_, v) in enumerate(rest) if v >= 10 and v % 10]
            for split in itertools.combinations(splittable, n_splits):
                text = worked_solution([lead, *_expand(rest, set(split))])
                if text not in seen:
                    seen.add(text)
                    yield text


def _orders(terms: Sequence[tuple[int, int]]) -> list[tuple[tuple[int, int], tuple]]:
    """(first term, the others in some order) for every order led by an added term; the
    question's own order first."""
    out = []
    for i, lead in enumerate(terms):
        if lead[0] > 0:
            others = [t for j, t in enumerate(terms) if j != i]
            out += [(lead, rest) for rest in itertools.permutations(others)]
    return out


def _expand(rest: Sequence[tuple[int, int]], split: set[int]) -> list[tuple[int, int]]:
    """The terms with those at the ``split`` positions written as tens, then units."""
    out = []
    for i, (sign, value) in enumerate(rest):
        pieces = (value - value % 10, value % 10) if i in split else (value,)
        out += [(sign, piece) for piece in pieces]
    return out


class TierTeacher(SolutionSource):
    """The programmatic teacher of the demo task: new correct solutions, in a fixed order."""

    def propose(self, requests: Sequence[Request], known) -> dict[str, list[str]]:
        out = {}
        for problem, k in requests:
            have = set(known(problem.id))
            out[problem.id] = [s for s in solutions(problem.question) if s not in have][:k]
        return out


def rows(tier_counts: dict[str, int], seed: int, side: str = "train") -> list[dict]:
    """JSON-ready rows (id, question, answer, tier) of several tiers, from one side."""
    return [
        {"id": p.id, "question": p.question, "answer": p.answer, "tier": tier}
        for tier, n in tier_counts.items()
        for p in problems(tier, n, seed, side)
    ]
