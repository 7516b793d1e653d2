"""Tests for coscale.loop.pools: transitions at and around every threshold and budget, errors, state."""

from __future__ import annotations

import json

import pytest

from coscale.loop.pools import Pool, PoolSettings, ProblemPools

_PER_ID = ("pool_of", "history", "accuracy", "solutions_used", "rl_rounds")


def _all_queries(pools: ProblemPools) -> dict:
    """Every query answer of ``pools``, for round-trip comparisons."""
    return {
        "ids": pools.ids(),
        "per_id": {pid: [getattr(pools, q)(pid) for q in _PER_ID] for pid in pools.ids()},
        "members": {p: pools.members(p) for p in Pool},
        "counts": pools.counts(),
        "config": (pools.low, pools.high, pools.max_solutions, pools.max_rl_rounds),
    }


def test_pool_values() -> None:
    assert [p.value for p in Pool] == ["unsolvable", "solvable", "solved", "failed"]
    assert Pool("solved") is Pool.SOLVED and Pool.SOLVED == "solved"


def test_add_registers_unsolvable_idempotently() -> None:
    pools = ProblemPools()
    pools.add("a")
    pools.record("a", 10, 3)
    pools.add("a")  # must not reset the record
    assert pools.pool_of("a") is Pool.SOLVABLE and pools.history("a") == [0.3]
    pools.add("b")
    assert pools.pool_of("b") is Pool.UNSOLVABLE and pools.accuracy("b") is None
    assert len(pools) == 2 and "a" in pools and "zz" not in pools
    assert pools.counts() == {"unsolvable": 1, "solvable": 1, "solved": 0, "failed": 0}


@pytest.mark.parametrize(
    ("n", "c", "pool"),
    [
        (20, 1, Pool.SOLVABLE),  # 1/20 == 0.05 exactly: low is inclusive
        (10000, 499, Pool.UNSOLVABLE),  # 0.0499 < 0.05
        (10000, 501, Pool.SOLVABLE),  # 0.0501
        (10, 7, Pool.SOLVED),  # 0.70 exactly: high is inclusive
        (10000, 6999, Pool.SOLVABLE),  # 0.6999 < 0.70
        (16, 0, Pool.UNSOLVABLE),
        (16, 16, Pool.SOLVED),
    ],
)
def test_threshold_edges(n: int, c: int, pool: Pool) -> None:
    pools = ProblemPools()
    assert pools.record("p", n, c) is pool
    assert pools.pool_of("p") is pool and pools.accuracy("p") == c / n


def test_record_auto_registers_and_keeps_history_in_order() -> None:
    pools = ProblemPools()
    pools.record("x", 4, 0)
    pools.record("x", 4, 1)
    pools.record("x", 4, 3)
    assert pools.history("x") == [0.0, 0.25, 0.75]
    assert pools.accuracy("x") == 0.75 and pools.pool_of("x") is Pool.SOLVED
    pools.record("x", 4, 0)  # relabel follows the latest accuracy, solved can fall back
    assert pools.pool_of("x") is Pool.UNSOLVABLE
    hist = pools.history("x")
    hist.append(1.0)  # a copy: mutating it changes nothing
    assert pools.history("x") == [0.0, 0.25, 0.75, 0.0]


def test_solution_budget_reached_exactly_fails() -> None:
    pools = ProblemPools(PoolSettings(max_solutions=3))
    pools.record("p", 8, 0)
    assert pools.note_solutions("p", 2) is Pool.UNSOLVABLE  # 2 < 3
    assert pools.note_solutions("p", 3) is Pool.FAILED  # 3 >= 3
    assert pools.solutions_used("p") == 3 and pools.members(Pool.FAILED) == ["p"]


def test_solution_budget_without_measurement_fails() -> None:
    pools = ProblemPools(PoolSettings(max_solutions=1))
    assert pools.note_solutions("new", 1) is Pool.FAILED  # never measured counts as acc < low


def test_solution_budget_does_not_fail_solvable() -> None:
    pools = ProblemPools(PoolSettings(max_solutions=2))
    pools.record("p", 10, 1)
    assert pools.note_solutions("p", 5) is Pool.SOLVABLE


def test_rl_budget_reached_exactly_fails_unsolvable_and_solvable() -> None:
    pools = ProblemPools(PoolSettings(max_rl_rounds=2))
    pools.record("u", 10, 0)
    pools.record("s", 10, 5)
    pools.record("d", 10, 9)
    for pid in ("u", "s", "d"):
        pools.note_rl_round(pid)
    assert [pools.pool_of(p) for p in ("u", "s", "d")] == [
        Pool.UNSOLVABLE,
        Pool.SOLVABLE,
        Pool.SOLVED,
    ]
    for pid in ("u", "s", "d"):
        pools.note_rl_round(pid)  # rl_rounds == 2 == max_rl_rounds
    assert [pools.pool_of(p) for p in ("u", "s", "d")] == [Pool.FAILED, Pool.FAILED, Pool.SOLVED]
    assert pools.rl_rounds("s") == 2


def test_failed_problem_measured_solvable_returns() -> None:
    pools = ProblemPools(PoolSettings(max_solutions=4, max_rl_rounds=3))
    pools.record("p", 16, 0)
    assert pools.note_solutions("p", 4) is Pool.FAILED
    assert pools.record("p", 16, 2) is Pool.SOLVABLE  # 0.125 in [0.05, 0.70), RL budget left
    assert pools.record("p", 16, 0) is Pool.FAILED  # back below low with the budget spent
    assert pools.record("p", 20, 14) is Pool.SOLVED  # 0.70 exactly


def test_failed_by_rl_budget_can_still_be_solved() -> None:
    pools = ProblemPools(PoolSettings(max_rl_rounds=1))
    pools.record("p", 10, 3)
    assert pools.note_rl_round("p") is Pool.FAILED
    assert pools.record("p", 10, 6) is Pool.FAILED  # still not solved, budget spent
    assert pools.record("p", 10, 7) is Pool.SOLVED


def test_members_and_counts_follow_registration_order() -> None:
    pools = ProblemPools()
    for pid, c in [("c", 0), ("a", 5), ("b", 0), ("d", 9), ("e", 5)]:
        pools.record(pid, 10, c)
    assert pools.ids() == ["c", "a", "b", "d", "e"]
    assert pools.members(Pool.UNSOLVABLE) == ["c", "b"]
    assert pools.members("solvable") == ["a", "e"]
    assert pools.members(Pool.SOLVED) == ["d"] and pools.members(Pool.FAILED) == []
    assert pools.counts() == {"unsolvable": 2, "solvable": 2, "solved": 1, "failed": 0}


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"low": -0.1}, "low"),
        ({"high": 1.5}, "high"),
        ({"low": 0.7, "high": 0.7}, "low"),
        ({"low": 0.8, "high": 0.5}, "high"),
        ({"max_solutions": 0}, "max_solutions"),
        ({"max_rl_rounds": 0}, "max_rl_rounds"),
        ({"max_rl_rounds": 1.5}, "max_rl_rounds"),
    ],
)
def test_bad_config(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name):
        ProblemPools(PoolSettings(**kwargs))


def test_bad_config_names_every_problem_at_once() -> None:
    with pytest.raises(ValueError, match="max_solutions") as info:
        ProblemPools(PoolSettings(low=0.9, high=0.1, max_solutions=0, max_rl_rounds=-1))
    assert "low" in str(info.value) and "max_rl_rounds" in str(info.value)


@pytest.mark.parametrize(
    ("args", "name"),
    [
        ((0, 0), "n_samples"),
        ((-4, 0), "n_samples"),
        ((4, -1), "n_correct"),
        ((4, 5), "n_correct"),
        ((4.0, 1), "n_samples"),
        ((4, True), "n_correct"),
    ],
)
def test_bad_record(args: tuple, name: str) -> None:
    pools = ProblemPools()
    with pytest.raises(ValueError, match=name):
        pools.record("p", *args)
    assert "p" not in pools  # a rejected record registers nothing


def test_bad_other_inputs() -> None:
    pools = ProblemPools()
    with pytest.raises(ValueError, match="total"):
        pools.note_solutions("p", -1)
    with pytest.raises(ValueError, match="problem_id"):
        pools.add("")
    with pytest.raises(ValueError, match="problem_id"):
        pools.record(3, 4, 1)
    with pytest.raises(ValueError, match="pool"):
        pools.members("easy")


@pytest.mark.parametrize("query", _PER_ID)
def test_unknown_id_raises_key_error_naming_it(query: str) -> None:
    pools = ProblemPools()
    pools.add("known")
    with pytest.raises(KeyError, match="ghost-17"):
        getattr(pools, query)("ghost-17")


def _busy_pools() -> ProblemPools:
    pools = ProblemPools(PoolSettings(low=0.1, high=0.8, max_solutions=3, max_rl_rounds=2))
    pools.add("z")
    pools.record("m", 7, 1)  # 1/7: not a short decimal, checks float round trip
    pools.record("m", 3, 1)
    pools.note_rl_round("m")
    pools.record("a", 10, 9)
    pools.note_solutions("f", 3)
    pools.record("b", 10, 0)
    return pools


def test_state_dict_json_round_trip_is_exact() -> None:
    pools = _busy_pools()
    state = json.loads(json.dumps(pools.state_dict()))
    restored = ProblemPools(PoolSettings(low=0.1, high=0.8, max_solutions=3, max_rl_rounds=2))
    restored.add("stale")  # load replaces, never merges
    restored.load_state_dict(state)
    assert _all_queries(restored) == _all_queries(pools)
    assert restored.ids() == ["z", "m", "a", "f", "b"]
    assert restored.history("m") == [1 / 7, 1 / 3]
    assert restored.pool_of("f") is Pool.FAILED
    # both keep behaving the same after the restore
    assert restored.note_rl_round("m") is pools.note_rl_round("m") is Pool.FAILED
    assert restored.state_dict() == pools.state_dict()


def test_load_keeps_saved_config_and_warns() -> None:
    state = json.loads(json.dumps(_busy_pools().state_dict()))
    other = ProblemPools()  # default thresholds and budgets differ from the saved ones
    with pytest.warns(UserWarning, match="keeping the saved values"):
        other.load_state_dict(state)
    assert (other.low, other.high, other.max_solutions, other.max_rl_rounds) == (0.1, 0.8, 3, 2)
    assert other.record("b", 20, 1) is Pool.UNSOLVABLE  # 0.05 < saved low=0.1 (default: solvable)


def test_load_rejects_bad_state() -> None:
    state = _busy_pools().state_dict()
    state["config"]["high"] = 2.0
    with pytest.raises(ValueError, match="high"):
        ProblemPools().load_state_dict(state)
    state = _busy_pools().state_dict()
    state["problems"][0]["pool"] = "easy"
    with pytest.raises(ValueError):
        ProblemPools(
            PoolSettings(low=0.1, high=0.8, max_solutions=3, max_rl_rounds=2)
        ).load_state_dict(state)


def test_each_move_is_counted_by_the_rule_that_made_it() -> None:
    pools = ProblemPools(PoolSettings(low=0.25, high=0.75, max_solutions=2, max_rl_rounds=1))
    pools.add("a")
    pools.add("b")
    assert pools.record("a", 4, 2) is Pool.SOLVABLE  # a measurement
    assert pools.record("a", 4, 0, cause="rl_epoch") is Pool.UNSOLVABLE  # an RL epoch's tally
    assert pools.record("a", 4, 1) is Pool.SOLVABLE
    assert pools.note_rl_round("a") is Pool.FAILED  # the RL budget spent
    assert pools.note_solutions("b", 2) is Pool.FAILED  # the solution budget spent
    assert pools.record("b", 4, 0) is Pool.FAILED  # no move: not counted
    assert pools.moves == {
        "unsolvable->solvable by measurement": 2,
        "solvable->unsolvable by rl_epoch": 1,
        "solvable->failed by rl_budget": 1,
        "unsolvable->failed by solutions_budget": 1,
    }
    again = ProblemPools(PoolSettings(low=0.25, high=0.75, max_solutions=2, max_rl_rounds=1))
    again.load_state_dict(json.loads(json.dumps(pools.state_dict())))
    assert again.moves == pools.moves  # saved with the rest: a resumed stage counts them all
