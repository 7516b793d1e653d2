"""Tests for ProblemDataModule without a Trainer: loading, data scaling, SFT/RL items, tally,
state round-trip and the loaders.

The arithmetic problems are small enough that every solution ``ArithmeticTeacher`` writes is
worked out below by hand: it combines the signed terms in every order that starts with a
positive term (``itertools.permutations`` order), one ``a±b=c`` step per term.
"""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest

from coscale.datamodules import ProblemDataModule
from coscale.datamodules import batches as batches_module
from coscale.pools import Pool
from coscale.tasks import Problem
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


def _dm(rows=None, **kwargs) -> ProblemDataModule:
    dm = ProblemDataModule(train=_rows() if rows is None else rows, **kwargs)
    dm.load()
    return dm


def _all_in_pool(dm, pool: Pool) -> bool:
    return all(dm.pools.pool_of(i) is pool for i in dm.problems)


# ---------------------------------------------------------------------------------- loading
def _write_jsonl(tmp_path):
    path = tmp_path / "train.jsonl"
    lines = [
        json.dumps({"id": "p1", "question": "1+1", "answer": "2", "solutions": ["1+1=2"]}),
        '{"id": "p2", "question": ',  # line 2: not JSON
        json.dumps({"id": "p3", "question": "2+2"}),  # line 3: no answer
        json.dumps({"id": "p4", "question": "3+3", "answer": 6}),
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_jsonl_with_bad_rows_skip_keeps_the_good_ones_and_warns_where(tmp_path):
    path = _write_jsonl(tmp_path)
    dm = ProblemDataModule(train=str(path), on_bad_row="skip")
    with pytest.warns(UserWarning) as record:
        dm.setup("fit")
    message = "\n".join(str(w.message) for w in record)
    assert "skipped 2 bad rows" in message
    assert f"{path}:2: invalid JSON" in message
    assert f"{path}:3: missing answer" in message
    assert list(dm.problems) == ["p1", "p4"]
    assert dm.problems["p1"].solutions == ("1+1=2",)
    assert dm.problems["p4"].answer == "6"
    assert dm.pools.ids() == ["p1", "p4"]


def test_jsonl_with_bad_rows_raise_names_file_line_and_flag(tmp_path):
    path = _write_jsonl(tmp_path)
    dm = ProblemDataModule(train=str(path), on_bad_row="raise")
    with pytest.raises(ValueError) as err:
        dm.load()
    text = str(err.value)
    assert f"2 bad rows in {path}" in text
    assert f"{path}:2:" in text and f"{path}:3:" in text
    assert "on_bad_row='raise'" in text
    assert dm.problems == {} and len(dm.pools) == 0


def _eval(question: str) -> int:
    return sum(int(t) for t in re.findall(r"[+-]?\d+", question))


def test_builtin_arithmetic_spec():
    dm = _dm("builtin:arithmetic?n=5&terms=2&seed=5&solutions=2&prefix=t")
    assert list(dm.problems) == ["t-0", "t-1", "t-2", "t-3", "t-4"]
    for p in dm.problems.values():
        x, sign, y = re.fullmatch(r"(\d+)([+-])(\d+)", p.question).groups()
        total = _eval(p.question)
        assert p.answer == str(total)
        # a+b has two orders; a-b only one (the other would start with -b).
        expected = [f"{x}{sign}{y}={total};\\boxed{{{total}}}"]
        if sign == "+":
            expected.append(f"{y}+{x}={total};\\boxed{{{total}}}")
        assert list(p.solutions) == expected


def test_list_of_rows_every_problem_starts_unsolvable():
    dm = _dm()
    assert list(dm.problems) == ["a", "b", "c"]
    assert dm.problems["a"] == Problem("a", "5-3+2", "4", (S210, S012, S201))
    assert dm.problems["b"].solutions == ()
    assert dm.pools.counts() == {"unsolvable": 3, "solvable": 0, "solved": 0, "failed": 0}
    for pid in dm.problems:
        assert dm.pools.history(pid) == []
        assert dm.pools.solutions_used(pid) == 0
    assert dm.bank.total() == 0  # nothing is given before the first scaling round
    dm.load()  # a second load reads nothing again
    assert len(dm.pools) == 3


def test_limit_keeps_the_first_problems():
    assert list(_dm(limit=2).problems) == ["a", "b"]


def test_add_problems_rejects_a_duplicate_id():
    dm = _dm()
    dm.add_problems([Problem("d", "9+9", "18")])
    assert dm.pools.pool_of("d") is Pool.UNSOLVABLE
    with pytest.raises(ValueError, match="duplicate problem id 'a'"):
        dm.add_problems([Problem("a", "other", "1")])
    with pytest.raises(ValueError, match="duplicate problem id 'e'"):
        dm.add_problems([Problem("e", "1", "1"), Problem("e", "2", "2")])
    assert dm.problems["a"].question == "5-3+2"


# ------------------------------------------------------------------------------ validation
def test_constructor_collects_every_bad_flag_in_one_error():
    with pytest.raises(ValueError) as err:
        ProblemDataModule(batch_size=0, mode="x", sft_source="x")
    text = str(err.value)
    assert "mode must be one of rl, sft; got 'x'" in text
    assert "sft_source must be one of bank, redistill, all; got 'x'" in text
    assert "; batch_size must be >= 1, got 0" in text
    assert "sft_batch_size" not in text and "rollout_n" not in text


@pytest.mark.parametrize("flag", ["sft_batch_size", "rollout_n", "solutions_per_round"])
def test_constructor_names_each_count_flag(flag):
    with pytest.raises(ValueError, match=rf"ProblemDataModule: {flag} must be >= 1, got -1$"):
        ProblemDataModule(**{flag: -1})


@pytest.mark.parametrize(
    "kwargs", [{"val_batch_size": 0}, {"redistill_per_problem": 0}, {"on_bad_row": "x"}]
)
def test_constructor_checks_the_other_flags(kwargs):
    flag = next(iter(kwargs))
    with pytest.raises(ValueError, match=flag):
        ProblemDataModule(**kwargs)


# ---------------------------------------------------------------------------- data scaling
def test_scale_solutions_takes_own_solutions_in_file_order_until_failed():
    dm = _dm(max_solutions=3)
    # Round 1, k=2: a gets its first two (file order), b has none, c its only one.
    assert dm.scale_solutions(k=2) == 3
    assert dm.bank.take("a", 9) == [S210, S012]
    assert dm.bank.take("c", 9) == [C01] and dm.bank.count("b") == 0
    assert [dm.pools.solutions_used(i) for i in "abc"] == [2, 0, 1]
    assert _all_in_pool(dm, Pool.UNSOLVABLE)
    # Round 2: a's third makes 3 = max_solutions while unsolvable -> failed.
    assert dm.scale_solutions(k=2) == 1
    assert dm.bank.take("a", 9) == [S210, S012, S201]
    assert dm.pools.pool_of("a") is Pool.FAILED
    assert dm.pools.solutions_used("a") == 3
    # Round 3: a failed (not asked), b and c have nothing new.
    assert dm.scale_solutions(k=2) == 0
    assert dm.bank.total() == 4
    assert dm.pools.members(Pool.UNSOLVABLE) == ["b", "c"]


def test_scale_solutions_default_k_and_only_the_given_pools():
    dm = _dm(solutions_per_round=1)
    dm.pools.record("a", 10, 3)  # 0.3: solvable
    assert dm.scale_solutions() == 1  # k=1 to unsolvable b (none) and c
    assert dm.bank.ids() == ["c"]
    assert dm.scale_solutions(pools=[Pool.SOLVABLE]) == 1
    assert dm.bank.take("a", 9) == [S210]
    assert dm.pools.solutions_used("a") == 1 and dm.pools.pool_of("a") is Pool.SOLVABLE


def test_scale_solutions_with_teacher_tops_up_and_never_duplicates():
    dm = _dm(_rows(a_solutions=[S210]), teacher=ArithmeticTeacher())
    # k=3. a: own S210, then the teacher's first two not in the bank (S012, S021).
    # b: no own, the teacher has only two. c: own C01; the teacher's C01 is a repeat -> C10.
    assert dm.scale_solutions(k=3) == 3 + 2 + 2
    assert dm.bank.take("a", 9) == [S210, S012, S021]
    assert dm.bank.take("b", 9) == [B01, B10]
    assert dm.bank.take("c", 9) == [C01, C10]
    assert [dm.pools.solutions_used(i) for i in "abc"] == [3, 2, 2]
    # Round 2: a's only unused solution is S201 (S210 is already in); b and c are exhausted.
    assert dm.scale_solutions(k=3) == 1
    assert dm.bank.take("a", 9) == [S210, S012, S021, S201]
    assert dm.scale_solutions(k=3) == 0
    assert dm.bank.total() == 8


def test_scale_solutions_prefers_own_solutions_over_the_teacher():
    dm = _dm(teacher=ArithmeticTeacher())
    assert dm.scale_solutions(k=2) == 2 + 2 + 2
    assert dm.bank.take("a", 9) == [S210, S012]  # own ones, in file order; teacher not asked
    assert dm.bank.take("c", 9) == [C01, C10]


# ----------------------------------------------------------------------------- SFT items
def _sft_dm(source: str, **kwargs) -> ProblemDataModule:
    dm = _dm(sft_source=source, **kwargs)
    dm.scale_solutions(k=2)  # a: S210, S012; c: C01
    dm.bank.record_rollout("a", "ra", True, step=3)
    dm.bank.record_rollout("b", "rb1", True, step=5)
    dm.bank.record_rollout("b", "wrong", False, step=6)
    dm.bank.record_rollout("b", "rb2", True, step=6)
    return dm


def _pair(dm, pid, text):
    return {"id": pid, "question": dm.problems[pid].question, "solution": text}


def test_sft_items_bank_excludes_nothing():
    dm = _sft_dm("bank")
    assert dm.sft_items() == [_pair(dm, "a", S210), _pair(dm, "a", S012), _pair(dm, "c", C01)]


def test_sft_items_redistill_latest_correct_per_problem_latest_first():
    dm = _sft_dm("redistill")
    assert dm.sft_items() == [_pair(dm, "b", "rb2"), _pair(dm, "a", "ra")]
    dm.redistill_per_problem = 2
    assert dm.sft_items() == [_pair(dm, "b", "rb2"), _pair(dm, "b", "rb1"), _pair(dm, "a", "ra")]


def test_sft_items_redistill_capped_total():
    items = _sft_dm("redistill", redistill_max_total=1, seed=4).sft_items()
    assert len(items) == 1
    assert items[0]["solution"] in ("rb2", "ra")


def test_sft_items_all_swaps_rl_problems_bank_for_their_latest_rollout():
    dm = _sft_dm("all")
    # a is in the replay buffer: its bank solutions give way to its latest correct rollout.
    assert dm.sft_items() == [_pair(dm, "c", C01), _pair(dm, "b", "rb2"), _pair(dm, "a", "ra")]


def test_sft_items_all_keeps_rl_problems_bank_when_asked():
    dm = _sft_dm("all", sft_keep_rl_bank=True)
    bank = [_pair(dm, "a", S210), _pair(dm, "a", S012), _pair(dm, "c", C01)]
    assert dm.sft_items() == [*bank, _pair(dm, "b", "rb2"), _pair(dm, "a", "ra")]


# ------------------------------------------------------------------------------- RL items
def _rl_dm(**kwargs) -> ProblemDataModule:
    rows = [{"id": i, "question": f"q{i}", "answer": f"ans{i}"} for i in "abcde"]
    dm = _dm(rows, rollout_n=4, **kwargs)
    dm.pools.record("a", 10, 5)  # 0.5: solvable
    dm.pools.record("b", 10, 0)  # 0.0: unsolvable (measured)
    dm.pools.record("c", 10, 9)  # 0.9: solved
    dm.pools.record("e", 8, 2)  # 0.25: solvable; d never measured
    dm.n_per_problem["a"] = 16
    return dm


def test_rl_items_serve_solvable_problems_with_their_n():
    dm = _rl_dm()
    assert dm.rl_items() == [
        {"id": "a", "question": "qa", "answer": "ansa", "n": 16},
        {"id": "e", "question": "qe", "answer": "anse", "n": 4},
    ]


def test_rl_groups_filter_by_difficulty_group():
    dm = _rl_dm()
    dm.group_of = {"a": 1}  # e has no group: group 0
    dm.rl_groups = [0]
    assert [x["id"] for x in dm.rl_items()] == ["e"]
    dm.rl_groups = [1]
    assert [x["id"] for x in dm.rl_items()] == ["a"]
    dm.rl_groups = [2]
    assert dm.rl_items() == []


def test_rl_unmeasured_adds_problems_never_measured():
    dm = _rl_dm(rl_unmeasured=True)
    assert [(x["id"], x["n"]) for x in dm.rl_items()] == [("a", 16), ("e", 4), ("d", 4)]


# ---------------------------------------------------------------------------------- tally
def test_tally_and_close_rl_epoch():
    dm = _rl_dm()
    dm.progress["epoch"] = 2
    dm.tally_rl("a", 4, 1)
    dm.tally_rl("a", 4, 3)
    dm.tally_rl("e", 8, 0)
    assert dm.tally == {"a": [8, 4], "e": [8, 0]} and dm.tally_epoch == 2
    assert dm.close_rl_epoch() == {"a": 0.5, "e": 0.0}
    assert dm.pools.history("a") == [0.5, 0.5] and dm.pools.history("e") == [0.25, 0.0]
    assert (dm.pools.rl_rounds("a"), dm.pools.rl_rounds("e")) == (1, 1)
    assert dm.pools.pool_of("a") is Pool.SOLVABLE and dm.pools.pool_of("e") is Pool.UNSOLVABLE
    assert dm.last_epoch_acc == {"a": 0.5, "e": 0.0}
    assert dm.tally == {} and dm.tally_epoch is None
    # Closing again records nothing and keeps the last epoch's accuracies.
    assert dm.close_rl_epoch() == {}
    assert dm.pools.history("a") == [0.5, 0.5] and dm.pools.rl_rounds("a") == 1
    assert dm.last_epoch_acc == {"a": 0.5, "e": 0.0}


def test_close_rl_epoch_spends_the_rl_budget():
    dm = _rl_dm(max_rl_rounds=1)
    dm.tally_rl("a", 4, 2)  # 0.5: still solvable, but its one RL round is spent
    dm.close_rl_epoch()
    assert dm.pools.pool_of("a") is Pool.FAILED


def test_next_epochs_loader_closes_the_open_tally():
    dm = _rl_dm()
    dm.train_dataloader()  # epoch 0
    dm.tally_rl("a", 4, 4)  # 1.0
    assert dm.tally_epoch == 0
    dm.train_dataloader()  # epoch 1 records the tally of epoch 0 before it serves
    assert dm.pools.pool_of("a") is Pool.SOLVED and dm.tally == {}
    assert dm.last_epoch_acc == {"a": 1.0}


# ---------------------------------------------------------------------------------- state
def _busy_dm() -> ProblemDataModule:
    dm = _sft_dm("bank", teacher=ArithmeticTeacher(), max_solutions=5)
    dm.scale_solutions(k=2)
    dm.pools.record("a", 8, 3)
    dm.n_per_problem.update({"a": 12, "b": 3})
    dm.group_of.update({"a": 2, "b": 0})
    dm.rl_groups = [2]
    dm.progress = {"epoch": 3, "consumed": 2}
    dm.tally_rl("a", 12, 5)
    dm.close_rl_epoch()
    dm.tally_rl("a", 12, 7)
    return dm


def test_state_dict_round_trips_through_json():
    dm = _busy_dm()
    state = json.loads(json.dumps(dm.state_dict()))
    assert state["n_per_problem"] == {"a": 12, "b": 3}
    assert state["tally"] == {"a": [12, 7]} and state["tally_epoch"] == 3
    assert state["progress"] == {"epoch": 3, "consumed": 2}
    assert state["last_epoch_acc"] == {"a": 5 / 12}
    fresh = ProblemDataModule(train=_rows(), teacher=ArithmeticTeacher(), max_solutions=5)
    fresh.load_state_dict(state)
    assert fresh.state_dict() == dm.state_dict()
    assert fresh.pools.history("a") == [3 / 8, 5 / 12]
    assert fresh.bank.take("a", 9) == dm.bank.take("a", 9)
    assert fresh.bank.latest_correct("b") == "rb2"
    assert (
        fresh.rl_items()
        == dm.rl_items()
        == [{"id": "a", "question": "5-3+2", "answer": "4", "n": 12}]
    )


def test_restored_state_resumes_mid_epoch():
    dm = _rl_dm(batch_size=2)
    for pid in "bcd":
        dm.pools.record(pid, 4, 1)  # all five solvable
    trainer = SimpleNamespace(current_epoch=1, training=True, reload_dataloaders_every_n_epochs=1)
    dm.trainer = trainer
    full = list(dm.train_dataloader())  # epoch 1: 5 problems in batches of 2
    assert [len(b) for b in full] == [2, 2, 1]
    dm.on_before_batch_transfer(full[0], 0)
    assert dm.progress == {"epoch": 1, "consumed": 1}
    fresh = ProblemDataModule(train=dm.train_source, rollout_n=4, batch_size=2)
    fresh.load_state_dict(json.loads(json.dumps(dm.state_dict())))
    fresh.trainer = trainer
    assert list(fresh.train_dataloader()) == full[1:]
    trainer.current_epoch = 2
    assert len(list(fresh.train_dataloader())) == 3  # a new epoch starts from its beginning


# -------------------------------------------------------------------------------- loaders
def _solvable_dm(seed: int, n: int = 8) -> ProblemDataModule:
    rows = [{"id": f"p{i}", "question": f"q{i}", "answer": str(i)} for i in range(n)]
    dm = _dm(rows, batch_size=3, rollout_n=2, seed=seed)
    for pid in dm.problems:
        dm.pools.record(pid, 4, 1)
    return dm


def _order(loader) -> list[str]:
    return [item["id"] for batch in loader for item in batch]


def test_rl_loader_without_trainer_yields_shuffled_item_lists():
    dm = _solvable_dm(seed=3)
    batches = list(dm.train_dataloader())
    assert dm.progress == {"epoch": 0, "consumed": 0}
    assert [len(b) for b in batches] == [3, 3, 2]
    assert all(isinstance(b, list) for b in batches)
    ids = [item["id"] for b in batches for item in b]
    assert sorted(ids) == [f"p{i}" for i in range(8)]
    assert ids != sorted(ids)  # shuffled (this seed and epoch do move items)
    item = next(x for b in batches for x in b if x["id"] == "p5")
    assert item == {"id": "p5", "question": "q5", "answer": "5", "n": 2}
    # Same seed and epoch: same order; the next epoch reshuffles.
    assert _order(_solvable_dm(seed=3).train_dataloader()) == ids
    nxt = _order(dm.train_dataloader())
    assert dm.progress == {"epoch": 1, "consumed": 0}
    assert sorted(nxt) == sorted(ids) and nxt != ids
    assert _order(_solvable_dm(seed=4).train_dataloader()) != ids


def test_sft_loader_yields_question_solution_dicts():
    dm = _dm(mode="sft", sft_batch_size=2)
    dm.scale_solutions(k=3)  # a: 3, c: 1
    batches = list(dm.train_dataloader())
    assert [len(b) for b in batches] == [2, 2]
    got = [item for b in batches for item in b]
    assert all(set(item) == {"id", "question", "solution"} for item in got)
    key = lambda x: (x["id"], x["solution"])  # noqa: E731
    assert sorted(got, key=key) == sorted(dm.sft_items(), key=key)


def test_val_loader():
    val = [{"id": f"v{i}", "question": f"vq{i}", "answer": str(i), "level": 1} for i in range(3)]
    dm = ProblemDataModule(train=_rows(), val=val, val_batch_size=2)
    dm.setup("validate")
    batches = list(dm.val_dataloader())
    assert [len(b) for b in batches] == [2, 1]
    got = sorted((x for b in batches for x in b), key=lambda x: x["id"])
    assert got == [{"id": f"v{i}", "question": f"vq{i}", "answer": str(i)} for i in range(3)]
    assert _order(dm.val_dataloader()) == _order(batches)  # fixed order every time
    assert _dm().val_dataloader() == []


def test_val_problems_are_scored_once_across_ranks(monkeypatch):
    val = [{"id": f"v{i}", "question": f"vq{i}", "answer": str(i)} for i in range(5)]
    dm = ProblemDataModule(train=_rows(), val=val, val_batch_size=2)
    dm.load()
    seen = []
    for rank in range(2):  # 3 batches of 2, 2, 1 over 2 ranks
        monkeypatch.setattr(batches_module, "_rank_world", lambda rank=rank: (rank, 2))
        seen += _order(dm.val_dataloader())
    assert sorted(seen) == [f"v{i}" for i in range(5)]
