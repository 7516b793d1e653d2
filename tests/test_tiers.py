"""The built-in demo task: tiers, the train / validation / test sides, teacher solutions, builtin sources."""

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


def test_train_validation_and_test_problems_are_disjoint_whatever_the_seed():
    for tier in tiers.BENCHMARKS:
        sides = {
            side: {p.question for seed in (0, 1) for p in tiers.problems(tier, 200, seed, side)}
            for side in tiers.SIDES
        }
        assert all(len(questions) > 200 for questions in sides.values())
        assert not sides["train"] & sides["val"]
        assert not sides["train"] & sides["test"]
        assert not sides["val"] & sides["test"]
        assert all(tiers.side_of(q) == side for side, qs in sides.items() for q in qs)
    (p,) = tiers.problems("T3", 1, seed=0, side="val")
    assert p.id == "T3-val-0"
    with pytest.raises(ValueError, match="side must be one of train, val, test; got 'dev'"):
        tiers.problems("T3", 1, seed=0, side="dev")


def test_problem_answers_and_tier_shapes():
    (p,) = tiers.problems("T3", 1, seed=0, side="train")
    a, b, c, d = map(int, re.fullmatch(r"(\d+)\+(\d+)-(\d+)\+(\d+)", p.question).groups())
    assert p.answer == str(a + b - c + d)
    assert all(10 <= v <= 99 for v in (a, b, c, d))
    (q,) = tiers.problems("T3w", 1, seed=0, side="train")
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
    (p,) = tiers.problems("T3x", 1, seed=3, side="train")
    first = tiers.canonical_solution(p.question)
    out = tiers.TierTeacher().propose([(p, 5)], lambda pid: [first])
    assert len(out[p.id]) == 5 and first not in out[p.id]


def test_builtin_tier_rows_and_errors():
    rows = builtin_rows("builtin:tiers?T1=3&T3=2&solutions=2&seed=4")
    assert [r["tier"] for r in rows] == ["T1"] * 3 + ["T3"] * 2
    assert all(len(r["solutions"]) in (1, 2) for r in rows)
    held = builtin_rows("builtin:tiers?T3=5&side=val")
    assert [tiers.side_of(r["question"]) for r in held] == ["val"] * 5
    with pytest.raises(ValueError, match="side must be one of train, val, test"):
        builtin_rows("builtin:tiers?T3=5&side=heldout")
    with pytest.raises(ValueError, match=r"allowed: tier names .* side, seed, solutions"):
        builtin_rows("builtin:tiers?T3=5&held_out=1")
    with pytest.raises(ValueError, match="allowed: tier names"):
        builtin_rows("builtin:tiers?T9=3")
