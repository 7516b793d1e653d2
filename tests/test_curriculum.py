"""Tests for the Curriculum's rules without Lightning: data scaling, SFT pairs, RL items, the RL
tally and its epoch close, the Rollout N schedule, measurements and the state.

The arithmetic problems are small enough that every solution ``ArithmeticTeacher`` writes is
worked out below by hand: it combines the signed terms in every order that starts with a
positive term (``itertools.permutations`` order), one ``a±b=c`` step per term.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from coscale.loop.curriculum import Curriculum, CurriculumSettings
from coscale.loop.pools import Pool
from coscale.loop.schedule import N_INIT, NSchedule
from coscale.tasks import Problem, load_problems
from coscale.tasks.arithmetic import ArithmeticTeacher

# 5-3+2 (terms +5, -3, +2); orders (0,1,2) (0,2,1) (2,0,1) (2,1,0); (1,..) starts with -3.
S012 = "5-3=2;2+2=4;\\boxed{4}"
S021 = "5+2=7;7-3=4;\\boxed{4}"
S201 = "2+5=7;7-3=4;\\boxed{4}"
S210 = "2-3=-1;-1+5=4;\\boxed{4}"
# 1+2: orders (0,1) (1,0); 7+1 likewise.
B01, B10 = "1+2=3;\\boxed{3}", "2+1=3;\\boxed{3}"
C01, C10 = "7+1=8;\\boxed{8}", "1+7=8;\\boxed{8}"


def _rows(a_solutions=(S210, S012, S201), c_solutions=(C01,)) -> list[dict]:
    return [
        {"id": "a", "question": "5-3+2", "answer": "4", "solutions": list(a_solutions)},
        {"id": "b", "question": "1+2", "answer": "3"},
        {"id": "c", "question": "7+1", "answer": "8", "solutions": list(c_solutions)},
    ]


def _cur(rows=None, teacher=None, schedule=None, replay=(), **settings) -> Curriculum:
    cur = Curriculum(
        CurriculumSettings(**settings), teacher=teacher, schedule=schedule, replay_pairs=replay
    )
    cur.add_problems(load_problems(_rows() if rows is None else rows).problems)
    return cur


def _outcomes(pid: str, n: int, correct: int, tag: str = "") -> list[tuple[str, str, bool]]:
    """``n`` rollouts of ``pid``, the first ``correct`` of them right (distinct texts)."""
    return [(pid, f"{pid}{tag}-{i}", i < correct) for i in range(n)]


def _all_in_pool(cur: Curriculum, pool: Pool) -> bool:
    return all(cur.pools.pool_of(i) is pool for i in cur.problems)


# -------------------------------------------------------------------------------- import
def test_importing_the_curriculum_does_not_import_lightning():
    code = (
        "import sys, coscale.loop.curriculum, coscale.loop.schedule\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "('lightning', 'pytorch_lightning', 'lightning_fabric')))"
    )
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert out.stdout.strip() == "[]"


# ---------------------------------------------------------------------------- problems
def test_problems_start_unsolvable_with_an_empty_bank():
    cur = _cur()
    assert list(cur.problems) == ["a", "b", "c"]
    assert cur.problems["a"] == Problem("a", "5-3+2", "4", (S210, S012, S201))
    assert cur.pools.counts() == {"unsolvable": 3, "solvable": 0, "solved": 0, "failed": 0}
    for pid in cur.problems:
        assert cur.pools.history(pid) == [] and cur.pools.solutions_used(pid) == 0
        assert cur.n_of(pid) == N_INIT == 8  # the one default
    assert cur.bank.total() == 0  # nothing is given before the first scaling round
    assert cur.tally == {} and cur.group_of == {} and cur.measurements == 0


def test_add_problems_rejects_a_duplicate_id():
    cur = _cur()
    cur.add_problems([Problem("d", "9+9", "18")])
    assert cur.pools.pool_of("d") is Pool.UNSOLVABLE
    with pytest.raises(ValueError, match="duplicate problem id 'a'"):
        cur.add_problems([Problem("a", "other", "1")])
    with pytest.raises(ValueError, match="duplicate problem id 'e'"):
        cur.add_problems([Problem("e", "1", "1"), Problem("e", "2", "2")])
    assert cur.problems["a"].question == "5-3+2"


def test_settings_name_every_bad_value_at_once():
    with pytest.raises(ValueError) as err:
        Curriculum(CurriculumSettings(replay_fraction=1.0, redistill_max_total=0))
    assert str(err.value) == (
        "data: redistill_max_total must be an int >= 1 or None, got 0; "
        "replay_fraction must be in [0, 1), got 1.0"
    )


# ---------------------------------------------------------------------------- data scaling
def test_scale_solutions_takes_own_solutions_in_file_order_until_failed():
    cur = _cur(max_solutions=3)
    # Round 1, k=2: a gets its first two (file order), b has none, c its only one.
    assert cur.scale_solutions(k=2) == 3
    assert cur.bank.take("a", 9) == [S210, S012]
    assert cur.bank.take("c", 9) == [C01] and cur.bank.count("b") == 0
    assert [cur.pools.solutions_used(i) for i in "abc"] == [2, 0, 1]
    assert _all_in_pool(cur, Pool.UNSOLVABLE)
    # Round 2: a's third makes 3 = max_solutions while unsolvable -> failed.
    assert cur.scale_solutions(k=2) == 1
    assert cur.bank.take("a", 9) == [S210, S012, S201]
    assert cur.pools.pool_of("a") is Pool.FAILED
    assert cur.pools.solutions_used("a") == 3
    # Round 3: a failed (not asked), b and c have nothing new.
    assert cur.scale_solutions(k=2) == 0
    assert cur.bank.total() == 4
    assert cur.pools.members(Pool.UNSOLVABLE) == ["b", "c"]


def test_scale_solutions_default_k_and_only_the_given_pools():
    cur = _cur(solutions_per_round=1)
    cur.pools.record("a", 10, 3)  # 0.3: solvable
    assert cur.scale_solutions() == 1  # k=1 to unsolvable b (none) and c
    assert cur.bank.ids() == ["c"]
    assert cur.scale_solutions(pools=[Pool.SOLVABLE]) == 1
    assert cur.bank.take("a", 9) == [S210]
    assert cur.pools.solutions_used("a") == 1 and cur.pools.pool_of("a") is Pool.SOLVABLE


def test_scale_solutions_with_teacher_tops_up_and_never_duplicates():
    cur = _cur(_rows(a_solutions=[S210]), teacher=ArithmeticTeacher())
    # k=3. a: own S210, then the teacher's first two not in the bank (S012, S021).
    # b: no own, the teacher has only two. c: own C01; the teacher's C01 is a repeat -> C10.
    assert cur.scale_solutions(k=3) == 3 + 2 + 2
    assert cur.bank.take("a", 9) == [S210, S012, S021]
    assert cur.bank.take("b", 9) == [B01, B10]
    assert cur.bank.take("c", 9) == [C01, C10]
    assert [cur.pools.solutions_used(i) for i in "abc"] == [3, 2, 2]
    # Round 2: a's only unused solution is S201 (S210 is already in); b and c are exhausted.
    assert cur.scale_solutions(k=3) == 1
    assert cur.bank.take("a", 9) == [S210, S012, S021, S201]
    assert cur.scale_solutions(k=3) == 0
    assert cur.bank.total() == 8


def test_scale_solutions_prefers_own_solutions_over_the_teacher():
    cur = _cur(teacher=ArithmeticTeacher())
    assert cur.scale_solutions(k=2) == 2 + 2 + 2
    assert cur.bank.take("a", 9) == [S210, S012]  # own ones, in file order; teacher not asked
    assert cur.bank.take("c", 9) == [C01, C10]


def test_add_solutions_own_only_never_asks_the_teacher():
    cur = _cur(teacher=ArithmeticTeacher())
    assert cur.add_solutions(["a", "b", "c"], 5, own_only=True) == 3 + 0 + 1
    assert cur.bank.take("a", 9) == [S210, S012, S201] and cur.bank.count("b") == 0
    assert [cur.pools.solutions_used(i) for i in "abc"] == [3, 0, 1]
    assert cur.add_solutions(["b"], 1) == 1  # the teacher's first
    assert cur.bank.take("b", 9) == [B01]


# ----------------------------------------------------------------------------- SFT pairs
def _sft_cur(**kwargs) -> Curriculum:
    cur = _cur(**kwargs)
    cur.scale_solutions(k=2)  # a: S210, S012; c: C01
    cur.bank.record_rollout("a", "ra", True, step=3)
    cur.bank.record_rollout("b", "rb1", True, step=5)
    cur.bank.record_rollout("b", "wrong", False, step=6)
    cur.bank.record_rollout("b", "rb2", True, step=6)
    return cur


def _pair(cur, pid, text):
    return {"id": pid, "question": cur.problems[pid].question, "solution": text}


def test_sft_pairs_bank_excludes_nothing():
    cur = _sft_cur()
    assert cur.sft_pairs("bank") == [
        _pair(cur, "a", S210),
        _pair(cur, "a", S012),
        _pair(cur, "c", C01),
    ]
    assert cur.sft_pairs() == cur.sft_pairs("bank")  # the default source


def test_sft_pairs_redistill_latest_correct_per_problem_latest_first():
    cur = _sft_cur()
    assert cur.sft_pairs("redistill") == [_pair(cur, "b", "rb2"), _pair(cur, "a", "ra")]
    expected = [_pair(cur, "b", "rb2"), _pair(cur, "b", "rb1"), _pair(cur, "a", "ra")]
    assert cur.sft_pairs("redistill", per_problem=2) == expected
    assert _sft_cur(redistill_per_problem=2).sft_pairs("redistill") == expected  # the setting


def test_sft_pairs_redistill_capped_total():
    pairs = _sft_cur(redistill_max_total=1, seed=4).sft_pairs("redistill")
    assert len(pairs) == 1
    assert pairs[0]["solution"] in ("rb2", "ra")
    assert _sft_cur(seed=4).sft_pairs("redistill", max_total=1) == pairs  # the argument


def test_sft_pairs_all_swaps_rl_problems_bank_for_their_latest_rollout():
    cur = _sft_cur()
    # a is in the replay buffer: its bank solutions give way to its latest correct rollout.
    assert cur.sft_pairs("all") == [
        _pair(cur, "c", C01),
        _pair(cur, "b", "rb2"),
        _pair(cur, "a", "ra"),
    ]


def test_sft_pairs_all_keeps_rl_problems_bank_when_asked():
    cur = _sft_cur(keep_rl_bank=True)
    bank = [_pair(cur, "a", S210), _pair(cur, "a", S012), _pair(cur, "c", C01)]
    assert cur.sft_pairs("all") == [*bank, _pair(cur, "b", "rb2"), _pair(cur, "a", "ra")]


def test_sft_pairs_rejects_an_unknown_source():
    with pytest.raises(ValueError, match="sft_source must be one of bank, redistill, all; got 'x'"):
        _sft_cur().sft_pairs("x")


REPLAY = {"id": "r", "question": "old question", "solution": "old solution"}


@pytest.mark.parametrize(
    ("fraction", "replayed", "with_redistill"),
    [(0.0, 0, 0), (0.25, 1, 1), (0.5, 3, 2), (0.75, 9, 6)],
)
def test_sft_pairs_replay_fraction_of_the_new_pairs(fraction, replayed, with_redistill):
    # 3 new bank pairs: replayed = round(3 * f / (1 - f)), so replayed / total = f;
    # 2 redistill pairs: round(2 * f / (1 - f)) = 0, 1 (0.67), 2, 6.
    replay = dict(REPLAY)
    cur = _sft_cur(replay=[replay], replay_fraction=fraction)
    pairs = cur.sft_pairs("bank")
    assert pairs[:3] == [_pair(cur, "a", S210), _pair(cur, "a", S012), _pair(cur, "c", C01)]
    assert pairs[3:] == [REPLAY] * replayed
    if replayed:
        pairs[3]["solution"] = "changed"  # copies: the replay data itself is left alone
        assert replay == REPLAY
    assert cur.sft_pairs("redistill")[2:] == [REPLAY] * with_redistill
    assert _cur(replay=[REPLAY], replay_fraction=fraction).sft_pairs("bank") == []  # none new


def test_sft_pairs_replay_draws_are_seeded():
    replay = [dict(REPLAY, id=f"r{i}", solution=f"s{i}") for i in range(5)]
    one = _sft_cur(replay=replay, replay_fraction=0.5).sft_pairs("bank")[3:]
    assert len(one) == 3 and all(p in replay for p in one)
    assert _sft_cur(replay=replay, replay_fraction=0.5).sft_pairs("bank")[3:] == one


# ------------------------------------------------------------------------------- RL items
def _rl_cur(**kwargs) -> Curriculum:
    rows = [{"id": i, "question": f"q{i}", "answer": f"ans{i}"} for i in "abcde"]
    cur = _cur(rows, **kwargs)
    cur.pools.record("a", 10, 5)  # 0.5: solvable
    cur.pools.record("b", 10, 0)  # 0.0: unsolvable (measured)
    cur.pools.record("c", 10, 9)  # 0.9: solved
    cur.pools.record("e", 8, 2)  # 0.25: solvable; d never measured
    cur.n_per_problem["a"] = 16
    return cur


def test_rl_items_serve_solvable_problems_with_their_n():
    cur = _rl_cur()
    assert cur.rl_items() == [
        {"id": "a", "question": "qa", "answer": "ansa", "n": 16},
        {"id": "e", "question": "qe", "answer": "anse", "n": 8},
    ]


def test_rl_groups_filter_by_difficulty_group():
    cur = _rl_cur()
    cur.group_of = {"a": 1}  # e has no group: group 0
    assert [x["id"] for x in cur.rl_items([0])] == ["e"]
    assert [x["id"] for x in cur.rl_items([1])] == ["a"]
    assert cur.rl_items([2]) == []
    assert [x["id"] for x in cur.rl_items(None)] == ["a", "e"]


def test_rl_unmeasured_adds_problems_never_measured():
    cur = _rl_cur(rl_unmeasured=True)
    assert [(x["id"], x["n"]) for x in cur.rl_items()] == [("a", 16), ("e", 8), ("d", 8)]


# ---------------------------------------------------------------------------------- tally
def test_record_rollouts_and_close_epoch():
    cur = _rl_cur()
    cur.record_rollouts(_outcomes("a", 4, 1, "x"), step=1)
    cur.record_rollouts(_outcomes("a", 4, 3, "y") + _outcomes("e", 8, 0), step=2)
    assert cur.tally == {"a": [8, 4], "e": [8, 0]}
    # the correct ones went to the replay buffer, the latest last
    assert cur.bank.replay_ids() == ["a"] and cur.bank.latest_correct("a") == "ay-2"
    # only the correct ones reach the bank (as before the refactor)
    assert cur.bank.replay_stats() == {"recorded": 4, "correct": 4, "kept": 4}
    assert cur.close_epoch() == {}  # no schedule: no sched/ metrics
    assert cur.pools.history("a") == [0.5, 0.5] and cur.pools.history("e") == [0.25, 0.0]
    assert (cur.pools.rl_rounds("a"), cur.pools.rl_rounds("e")) == (1, 1)
    assert cur.pools.pool_of("a") is Pool.SOLVABLE and cur.pools.pool_of("e") is Pool.UNSOLVABLE
    assert cur.last_epoch_acc == {"a": 0.5, "e": 0.0}
    assert cur.tally == {}
    # Closing again records nothing and keeps the last epoch's accuracies.
    assert cur.close_epoch() == {}
    assert cur.pools.history("a") == [0.5, 0.5] and cur.pools.rl_rounds("a") == 1
    assert cur.last_epoch_acc == {"a": 0.5, "e": 0.0}


def test_close_epoch_spends_the_rl_budget():
    cur = _rl_cur(max_rl_rounds=1)
    cur.record_rollouts(_outcomes("a", 4, 2), step=0)  # 0.5: still solvable, but its round is spent
    cur.close_epoch()
    assert cur.pools.pool_of("a") is Pool.FAILED
    assert cur.pools.pool_of("e") is Pool.SOLVABLE  # not trained: no round spent


# ----------------------------------------------------------------------------- N schedule
def _scheduled_cur(schedule: NSchedule) -> Curriculum:
    rows = [{"id": i, "question": f"q {i}", "answer": "x"} for i in "abcde"]
    cur = _cur(rows, schedule=schedule)
    for pid, c in {"a": 1, "b": 2, "c": 6, "d": 4}.items():
        cur.pools.record(pid, 10, c)  # 0.1, 0.2, 0.6, 0.4: all solvable; e never measured
    return cur


def _epoch(cur, epoch, tally, lr=1e-3):
    for pid, (n, c) in tally.items():
        cur.record_rollouts(_outcomes(pid, n, c, f"e{epoch}"), step=epoch)
    return cur.close_epoch(lr=lr)


def test_schedule_groups_by_difficulty_and_raises_n_of_a_stalled_group_only():
    sched = NSchedule(num_groups=3, n_init=8, factor=2.0, n_max=20, patience=1)
    cur = _scheduled_cur(sched)
    cur.assign_groups(lr=1e-3)  # what RolloutNSchedule does at fit start
    # bins of width 0.65 / 3 over [0.05, 0.7): 0.1, 0.2 -> 0; 0.4 -> 1; 0.6 -> 2
    assert cur.group_of == {"a": 0, "b": 0, "c": 2, "d": 1}
    assert cur.n_per_problem == dict.fromkeys("abcd", 8)
    _epoch(cur, 0, {"a": (8, 1), "b": (8, 1), "c": (8, 5), "d": (8, 3)})
    assert sched.n == [8, 8, 8] and sched.best == [0.125, 0.375, 0.625]
    cur.pools.record("e", 10, 3)  # newly solvable (0.3 -> group 1), gets its group's N
    _epoch(cur, 1, {"a": (8, 1), "b": (8, 1), "c": (8, 6)})  # g0 flat, g2 up, g1 idle
    assert sched.n == [16, 8, 8] and sched.stalled == [0, 0, 0]
    assert cur.group_of["e"] == 1
    assert cur.n_per_problem == {"a": 16, "b": 16, "c": 8, "d": 8, "e": 8}
    assert cur.n_per_group() == {0: 16, 1: 8, 2: 8}
    _epoch(cur, 2, {"a": (8, 1), "b": (8, 1)})
    assert sched.n[0] == 20  # 32 capped at n_max
    metrics = _epoch(cur, 3, {"a": (8, 1), "b": (8, 1)})
    assert sched.n == [20, 8, 8] and cur.n_per_problem["a"] == 20
    assert [x["n"] for x in cur.rl_items()] == [20, 20, 8, 8]  # a, b, d, e (c is solved)
    # N_eff(0.125, 20) = 20 * (1 - 0.125**20 - 0.875**20)
    n_eff = 20 * (1 - 0.125**20 - 0.875**20)
    assert metrics["sched/n_group0"] == 20.0 and metrics["sched/reward_group0"] == 0.125
    assert metrics["sched/n_eff_group0"] == pytest.approx(n_eff, rel=1e-12)
    assert metrics["sched/lr_over_n_eff_group0"] == pytest.approx(1e-3 / n_eff, rel=1e-12)
    assert "sched/reward_group1" not in metrics  # group 1 was not trained


def test_schedule_patience_and_min_delta():
    sched = NSchedule(num_groups=3, n_init=4, factor=1.5, patience=2, min_delta=0.05)
    cur = _scheduled_cur(sched)
    cur.assign_groups()
    _epoch(cur, 0, {"a": (8, 1)})  # best 0.125
    _epoch(cur, 1, {"a": (8, 1)})  # 1 bad epoch: patience 2 not reached
    assert sched.n[0] == 4 and sched.stalled[0] == 1
    _epoch(cur, 2, {"a": (100, 16)})  # 0.16 < 0.125 + 0.05: still no progress
    assert sched.n[0] == 6 and sched.stalled[0] == 0  # round(4 * 1.5) = 6
    _epoch(cur, 3, {"a": (100, 18)})  # 0.18 > 0.175: progress
    assert sched.n[0] == 6 and sched.best[0] == 0.18
    assert cur.n_per_problem == {"a": 6, "b": 6, "c": 4, "d": 4}


def test_schedule_lr_ratio_picks_n_from_theory():
    sched = NSchedule(num_groups=3, mode="lr_ratio", target_lr_over_n_eff=1e-4, n_max=64)
    cur = _scheduled_cur(sched)
    cur.assign_groups(lr=1e-3)
    _epoch(cur, 0, {"a": (8, 1), "b": (8, 1), "c": (8, 5), "d": (8, 3)})
    # smallest N with 1e-3 / N_eff(p, N) <= 1e-4, i.e. N_eff >= 10:
    # p = .125: N_eff(12) = 12 * (1 - .875**12 - .125**12) = 9.583, N_eff(13) = 10.709 -> 13
    # p = .625 (and .375, the same by symmetry): N_eff(10) = 9.909, N_eff(11) = 10.937 -> 11
    assert sched.n == [13, 11, 11]
    assert cur.n_per_problem == {"a": 13, "b": 13, "c": 11, "d": 11}
    with pytest.raises(ValueError, match="target_lr_over_n_eff must be a number > 0"):
        NSchedule(mode="lr_ratio")
    with pytest.raises(ValueError, match=r"needs the policy's learning rate: lr must be a number"):
        cur.assign_groups(lr=None)


def test_schedule_state_in_the_curriculum_state():
    sched = NSchedule(num_groups=2)
    cur = _scheduled_cur(sched)
    sched.n, sched.best, sched.stalled = [16, 8], [0.25, None], [0, 1]
    state = json.loads(json.dumps(cur.state_dict()))
    assert state["schedule"] == {"n": [16, 8], "best": [0.25, None], "stalled": [0, 1]}
    fresh = _scheduled_cur(NSchedule(num_groups=2))
    fresh.load_state_dict(state)
    assert fresh.schedule.state_dict() == sched.state_dict()
    with pytest.raises(ValueError, match="num_groups=3"):
        _scheduled_cur(NSchedule(num_groups=3)).load_state_dict(state)


# ----------------------------------------------------------------------------- measurement
def test_record_measurement_groups_newly_solvable_problems_and_sets_their_n():
    sched = NSchedule(num_groups=3, n_init=6)
    rows = [{"id": i, "question": f"q {i}", "answer": "x"} for i in "abcd"]
    cur = _cur(rows, schedule=sched)
    pools = cur.record_measurement({"a": (10, 1), "b": (10, 6), "c": (10, 0), "d": (10, 9)})
    assert pools == {"a": "solvable", "b": "solvable", "c": "unsolvable", "d": "solved"}
    assert cur.measurements == 1
    assert cur.group_of == {"a": 0, "b": 2}  # only solvable problems get a group
    assert cur.n_per_problem == {"a": 6, "b": 6}
    assert (cur.n_of("c"), cur.n_of("d")) == (6, 6)  # the schedule's n_init until grouped
    # c becomes solvable later: grouped with its group's N of now; a keeps its group
    sched.n = [16, 8, 12]
    assert cur.record_measurement({"a": (10, 6), "c": (10, 4)}) == {
        "a": "solvable",
        "c": "solvable",
    }
    assert cur.group_of == {"a": 0, "b": 2, "c": 1}
    assert cur.n_per_problem == {"a": 16, "b": 12, "c": 8}
    assert cur.pools.history("a") == [0.1, 0.6] and cur.measurements == 2
    # without a schedule nothing is grouped
    plain = _cur(rows)
    plain.record_measurement({"a": (10, 1)})
    assert plain.group_of == {} and plain.n_per_problem == {} and plain.n_of("a") == 8


def test_the_start_n_is_the_schedules_n_init_and_rollout_n_starts_in_one_place():
    rows = [{"id": "a", "question": "q", "answer": "x"}]
    assert _cur(rows).n_of("a") == 8 and _cur(rows, schedule=NSchedule(n_init=6)).n_of("a") == 6
    cur = _cur(rows)
    mine = NSchedule(n_init=6, factor=2.0)
    assert cur.use_schedule(mine) is mine and cur.use_schedule(NSchedule()) is mine  # kept
    cur.record_measurement({"a": (10, 5)})  # solvable: grouped at N = 6
    mine.n = [24] * mine.num_groups  # grown on plateaus in an earlier RL stage
    cur.start_rollout_n(None, afresh=False)
    assert cur.n_of("a") == 24  # the callback's start: N as it stands
    cur.start_rollout_n(None, afresh=True)
    assert cur.n_of("a") == 6  # a run's RL stage: afresh


def test_measure_ids_pools_and_a_seeded_subset_that_changes_with_measurements():
    rows = [{"id": f"p{i}", "question": f"q{i}", "answer": "x"} for i in range(6)]
    cur = _cur(rows)
    cur.pools.record("p0", 10, 9)  # solved
    cur.pools.note_solutions("p1", 64)  # budget spent: failed
    cur.pools.record("p2", 10, 3)  # solvable
    assert cur.measure_ids() == ["p0", "p2", "p3", "p4", "p5"]  # registration order, no failed
    assert cur.measure_ids(("solvable", "solved")) == ["p0", "p2"]
    assert cur.measure_ids(max_problems=5) == cur.measure_ids()  # no subset needed
    first = cur.measure_ids(max_problems=2)
    assert len(first) == 2 and set(first) <= set(cur.measure_ids())
    assert first == sorted(first, key=cur.pools.ids().index)  # still in registration order
    assert cur.measure_ids(max_problems=2) == first  # seeded: the same until a measurement
    subsets = []
    for _ in range(3):
        cur.record_measurement({})
        subsets.append(cur.measure_ids(max_problems=2))
    assert any(s != first for s in subsets)  # a new subset each measurement
    again = _cur(rows)
    again.pools.record("p0", 10, 9)
    again.pools.note_solutions("p1", 64)
    again.pools.record("p2", 10, 3)
    assert again.measure_ids(max_problems=2) == first  # same seed, same count: same subset


# ---------------------------------------------------------------------------------- state
def _busy_cur() -> Curriculum:
    sched = NSchedule(num_groups=3)
    sched.n = [3, 8, 12]
    cur = _sft_cur(teacher=ArithmeticTeacher(), max_solutions=5, schedule=sched)
    cur.scale_solutions(k=2)  # a: own S201, then the teacher's S021; b, c: nothing new
    cur.pools.record("a", 8, 3)
    cur.group_of.update({"a": 2, "b": 0})
    cur.record_rollouts(_outcomes("a", 12, 5, "x"), step=7)
    cur.close_epoch()  # a: 5/12 -> group 2's best; N from the schedule: a 12, b 3
    cur.record_rollouts(_outcomes("a", 12, 7, "y"), step=8)
    cur.measurements = 2
    return cur


def test_state_dict_round_trips_through_json():
    cur = _busy_cur()
    state = json.loads(json.dumps(cur.state_dict()))
    assert state["n_per_problem"] == {"a": 12, "b": 3}
    assert state["group_of"] == {"a": 2, "b": 0}
    assert state["tally"] == {"a": [12, 7]}
    assert "cursor" not in state  # where a fit is belongs to its loader (datamodules.batches)
    assert state["last_epoch_acc"] == {"a": 5 / 12}
    assert state["schedule"] == {"n": [3, 8, 12], "best": [None, None, 5 / 12], "stalled": [0] * 3}
    assert state["measurements"] == 2
    fresh = _cur(teacher=ArithmeticTeacher(), max_solutions=5, schedule=NSchedule(num_groups=3))
    fresh.load_state_dict(state)
    assert fresh.state_dict() == cur.state_dict()
    assert fresh.pools.history("a") == [3 / 8, 5 / 12]
    assert fresh.bank.take("a", 9) == cur.bank.take("a", 9) == [S210, S012, S201, S021]
    assert fresh.bank.latest_correct("b") == "rb2"
    assert fresh.bank.latest_correct("a") == "ay-6"
    assert (
        fresh.rl_items([2])
        == cur.rl_items([2])
        == [{"id": "a", "question": "5-3+2", "answer": "4", "n": 12}]
    )
    # the restored curriculum closes the open epoch as the original does
    assert fresh.close_epoch(lr=1e-3) == cur.close_epoch(lr=1e-3)
    assert fresh.pools.history("a") == [3 / 8, 5 / 12, 7 / 12] and fresh.tally == {}
    assert fresh.state_dict() == cur.state_dict()
    # a state saved before the cursor moved out (it held one) still loads
    old = _cur(teacher=ArithmeticTeacher(), max_solutions=5, schedule=NSchedule(num_groups=3))
    old.load_state_dict({**state, "cursor": {"epoch": 3, "consumed": 2, "batches": 5}})
    assert old.pools.history("a") == [3 / 8, 5 / 12]
    # a curriculum without a schedule keeps its own (none) and restores the rest
    bare = _cur(teacher=ArithmeticTeacher(), max_solutions=5)
    bare.load_state_dict(state)
    assert bare.schedule is None and bare.n_per_problem == {"a": 12, "b": 3}
