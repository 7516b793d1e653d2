"""The built-in demo task: tiers, held-out split, teacher solutions, builtin sources."""

from __future__ import annotations

import re

import pytest

from coscale.tasks import tiers
from coscale.tasks.builtin import builtin_rows


def _check_steps(question: str, solution: str) -> int:
    """Replays a solution's steps; every step must be true arithmetic. Returns the boxed value."""
    *steps, boxed = solution.split(";")
    for step in steps:
        left, right = step.split("=")
        a, op, b = re.fullmatch(r"(-?\d+)([+-])(\d+)", left).groups()
        assert int(a) + (int(b) if op == "+" else -int(b)) == int(right), step
    return int(re.fullmatch(r"\\boxed\{(-?\d+)\}", boxed).group(1))


def test_train_and_held_out_problems_are_disjoint():
    for tier in tiers.BENCHMARKS:
        train = {p.question for p in tiers.problems(tier, 300, seed=0, held_out=False)}
        test = {p.question for p in tiers.problems(tier, 128, seed=1, held_out=True)}
        assert len(train) == 300 and len(test) == 128
        assert not train & test


def test_problem_answers_and_tier_shapes():
    (p,) = tiers.problems("T3", 1, seed=0, held_out=False)
    a, b, c, d = map(int, re.fullmatch(r"(\d+)\+(\d+)-(\d+)\+(\d+)", p.question).groups())
    assert p.answer == str(a + b - c + d)
    assert all(10 <= v <= 99 for v in (a, b, c, d))
    (q,) = tiers.problems("T3w", 1, seed=0, held_out=False)
    assert re.fullmatch(r"\d+-\d+\+\d+\+\d+", q.question)


def test_teacher_solutions_are_distinct_correct_and_canonical_first():
    question = "89+38-37+54"
    sols = list(tiers.solutions(question))
    # 3 added leads x 3! orders of the other terms, x 2^3 optional tens/units splits of the
    # three terms after the lead (all of 89, 38, 37, 54 can be split)
    assert len(sols) == 144 == len(set(sols))
    # the 18 reorderings come first: three steps each, no split
    assert all(s.count("=") == 3 for s in sols[:18]) and sols[18].count("=") == 4
    assert "38+89=127;127-37=90;90+54=144;\\boxed{144}" in sols[:18]
    assert not any(s.startswith("37") for s in sols)  # a subtracted term never leads
    assert (
        sols[0]
        == tiers.canonical_solution(question)
        == "89+38=127;127-37=90;90+54=144;\\boxed{144}"
    )
    assert all(_check_steps(question, s) == 144 for s in sols)
    # a multiple of ten is never split; equal terms give one order, not two
    assert list(tiers.solutions("50+40")) == ["50+40=90;\\boxed{90}", "40+50=90;\\boxed{90}"]
    assert len(list(tiers.solutions("50-30"))) == 1
    assert len(list(tiers.solutions("20+20"))) == 1


def test_tier_teacher_skips_known_and_caps_k():
    (p,) = tiers.problems("T3x", 1, seed=3, held_out=False)
    first = tiers.canonical_solution(p.question)
    out = tiers.TierTeacher().propose([(p, 5)], lambda pid: [first])
    assert len(out[p.id]) == 5 and first not in out[p.id]


def test_builtin_tier_rows_and_errors():
    rows = builtin_rows("builtin:tiers?T1=3&T3=2&solutions=2&seed=4")
    assert [r["tier"] for r in rows] == ["T1"] * 3 + ["T3"] * 2
    assert all(len(r["solutions"]) in (1, 2) for r in rows)
    held = builtin_rows("builtin:tiers?T3=5&held_out=1")
    assert all(tiers.is_held_out(r["question"]) for r in held)
    with pytest.raises(ValueError, match="allowed: tier names"):
        builtin_rows("builtin:tiers?T9=3")
