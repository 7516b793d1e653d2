"""Tests for coscale.loop.solutions: bank order and duplicates, replay buffer, redistill set, state."""

from __future__ import annotations

import json
import random

import pytest

from coscale.loop.solutions import SolutionBank


def _all_queries(bank: SolutionBank) -> dict:
    """Every query answer of ``bank``, for round-trip comparisons."""
    ids = bank.ids() + bank.replay_ids() + ["unknown"]
    return {
        "ids": bank.ids(),
        "replay_ids": bank.replay_ids(),
        "total": bank.total(),
        "stats": bank.replay_stats(),
        "per_id": {p: (bank.take(p, 100), bank.count(p), bank.latest_correct(p)) for p in ids},
        "redistill": [
            bank.redistill_set(m, t, s, since)
            for m in (1, 3)
            for t in (None, 2)
            for s in (0, 5)
            for since in (None, 4)
        ],
        "config": (bank.replay_capacity, bank.replay_per_problem),
    }


def test_bank_order_duplicates_take() -> None:
    bank = SolutionBank()
    assert bank.add("q2", "s1") is True
    assert bank.add("q1", "a") is True
    assert bank.add("q2", "s0") is True
    assert bank.add("q2", "s1") is False  # duplicate ignored, order kept
    assert bank.add_many("q2", ["s2", "s0", "s3", "s2"]) == 2
    assert bank.take("q2", 3) == ["s1", "s0", "s2"]
    assert bank.take("q2", 99) == ["s1", "s0", "s2", "s3"]
    assert bank.take("q2", 0) == [] and bank.take("nope", 5) == []
    assert bank.count("q2") == 4 and bank.count("q1") == 1 and bank.count("nope") == 0
    assert bank.ids() == ["q2", "q1"] and bank.total() == 5
    bank.take("q2", 2).append("x")  # a copy
    assert bank.count("q2") == 4


def test_bank_bad_inputs() -> None:
    bank = SolutionBank()
    for bad in ("", "   \n\t"):
        with pytest.raises(ValueError, match="text"):
            bank.add("q", bad)
    with pytest.raises(ValueError, match="text"):
        bank.add_many("q", ["fine", " "])
    assert bank.count("q") == 0  # add_many validates everything before adding anything
    with pytest.raises(ValueError, match="k"):
        bank.take("q", -1)
    with pytest.raises(ValueError, match="problem_id"):
        bank.add("", "x")


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"replay_capacity": 0}, "replay_capacity"),
        ({"replay_per_problem": 0}, "replay_per_problem"),
    ],
)
def test_bad_config(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        SolutionBank(**kwargs)


def test_replay_keeps_latest_correct_per_problem() -> None:
    bank = SolutionBank(replay_per_problem=2)
    bank.record_rollout("p", "wrong", False, step=0)
    assert bank.latest_correct("p") is None and bank.replay_ids() == []
    bank.record_rollout("p", "r1", True, step=1)
    bank.record_rollout("p", "r2", True, step=2)
    bank.record_rollout("p", "bad", False, step=3)
    bank.record_rollout("p", "r3", True, step=3)  # pushes r1 out (2 per problem)
    assert bank.latest_correct("p") == "r3"
    assert bank.redistill_set(max_per_problem=5) == [("p", "r3"), ("p", "r2")]
    assert bank.replay_stats() == {"recorded": 5, "correct": 3, "kept": 2}
    assert bank.latest_correct("unknown") is None


def test_replay_out_of_order_steps_and_repeats() -> None:
    bank = SolutionBank()
    bank.record_rollout("p", "late", True, step=9)
    bank.record_rollout("p", "early", True, step=4)  # arrives after, but is older
    assert bank.latest_correct("p") == "late"
    bank.record_rollout("p", "early", True, step=10)  # a repeat moves to its later step
    assert bank.redistill_set(max_per_problem=9) == [("p", "early"), ("p", "late")]
    bank.record_rollout("p", "late", True, step=2)  # repeat at an older step keeps step 9
    assert bank.redistill_set(max_per_problem=9, since_step=9) == [("p", "early"), ("p", "late")]
    assert bank.replay_stats()["kept"] == 2


def test_replay_capacity_drops_globally_oldest() -> None:
    bank = SolutionBank(replay_capacity=3)
    bank.record_rollout("a", "a1", True, step=1)
    bank.record_rollout("b", "b1", True, step=1)
    bank.record_rollout("a", "a2", True, step=2)
    bank.record_rollout("c", "c1", True, step=3)  # drops a1 (step 1, recorded first)
    assert bank.redistill_set(max_per_problem=9) == [("c", "c1"), ("a", "a2"), ("b", "b1")]
    bank.record_rollout("c", "c2", True, step=4)  # drops b1, b leaves the buffer
    assert bank.replay_ids() == ["a", "c"] and bank.latest_correct("b") is None


def _replay_bank() -> SolutionBank:
    """Problems with latest steps: d 7, b 5, a 5, c 2 -> order d, a, b, c (ties by id)."""
    bank = SolutionBank()
    for pid, text, step in [
        ("a", "a1", 1),
        ("c", "c1", 2),
        ("b", "b1", 3),
        ("a", "a2", 5),
        ("b", "b2", 5),
        ("d", "d1", 6),
        ("d", "d2", 7),
    ]:
        bank.record_rollout(pid, text, True, step)
        bank.record_rollout(pid, text + "-wrong", False, step)
    return bank


def test_redistill_order_latest_first() -> None:
    bank = _replay_bank()
    assert bank.redistill_set() == [("d", "d2"), ("a", "a2"), ("b", "b2"), ("c", "c1")]
    assert bank.redistill_set(max_per_problem=2) == [
        ("d", "d2"),
        ("d", "d1"),
        ("a", "a2"),
        ("a", "a1"),
        ("b", "b2"),
        ("b", "b1"),
        ("c", "c1"),
    ]


def test_redistill_since_step() -> None:
    bank = _replay_bank()
    assert bank.redistill_set(since_step=5) == [("d", "d2"), ("a", "a2"), ("b", "b2")]
    assert bank.redistill_set(max_per_problem=3, since_step=6) == [("d", "d2"), ("d", "d1")]
    assert bank.redistill_set(since_step=8) == []
    assert bank.redistill_set(since_step=0) == bank.redistill_set()


def test_redistill_max_total_is_seeded_subset_in_order() -> None:
    bank = _replay_bank()
    full = bank.redistill_set(max_per_problem=2)
    picked = bank.redistill_set(max_per_problem=2, max_total=3, seed=11)
    # what random.Random(11) picks from the 7 indices, back in latest-first order
    expected = [full[i] for i in sorted(random.Random(11).sample(range(7), 3))]
    assert picked == expected and len(picked) == 3
    assert bank.redistill_set(max_per_problem=2, max_total=3, seed=11) == picked  # deterministic
    draws = {tuple(bank.redistill_set(max_per_problem=2, max_total=3, seed=s)) for s in range(8)}
    assert len(draws) > 1  # the seed matters
    assert bank.redistill_set(max_per_problem=2, max_total=7, seed=3) == full  # not exceeded


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"max_per_problem": 0}, "max_per_problem"),
        ({"max_total": 0}, "max_total"),
        ({"since_step": -1}, "since_step"),
        ({"seed": 1.5}, "seed"),
    ],
)
def test_redistill_bad_args(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        _replay_bank().redistill_set(**kwargs)


def test_record_rollout_bad_args() -> None:
    bank = SolutionBank()
    with pytest.raises(ValueError, match="step"):
        bank.record_rollout("p", "x", True, step=-1)
    with pytest.raises(ValueError, match="correct"):
        bank.record_rollout("p", "x", 0.5, step=0)
    with pytest.raises(ValueError, match="text"):
        bank.record_rollout("p", " ", True, step=0)
    assert bank.replay_stats() == {"recorded": 0, "correct": 0, "kept": 0}
    bank.record_rollout("p", "", False, step=0)  # an empty wrong rollout is only counted
    assert bank.replay_stats()["recorded"] == 1


def _busy_bank() -> SolutionBank:
    bank = _replay_bank()
    bank.replay_per_problem = 3
    bank.add_many("z", ["z1", "z0"])
    bank.add("a", "sol with \\boxed{1/2} and ünïcode")
    return bank


def test_state_dict_json_round_trip_is_exact() -> None:
    bank = _busy_bank()
    state = json.loads(json.dumps(bank.state_dict()))
    restored = SolutionBank(replay_per_problem=3)
    restored.add("stale", "x")  # load replaces, never merges
    restored.load_state_dict(state)
    assert _all_queries(restored) == _all_queries(bank)
    # both keep behaving the same after the restore (seq counter restored too)
    for b in (bank, restored):
        b.record_rollout("a", "a3", True, step=7)
    assert restored.redistill_set(max_per_problem=2)[:3] == [("a", "a3"), ("a", "a2"), ("d", "d2")]
    assert restored.state_dict() == bank.state_dict()


def test_load_keeps_saved_config_and_warns() -> None:
    state = json.loads(
        json.dumps(SolutionBank(replay_capacity=5, replay_per_problem=2).state_dict())
    )
    bank = SolutionBank()
    with pytest.warns(UserWarning, match="keeping the saved values"):
        bank.load_state_dict(state)
    assert (bank.replay_capacity, bank.replay_per_problem) == (5, 2)
