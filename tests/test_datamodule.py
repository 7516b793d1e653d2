"""Tests for ProblemDataModule / CurriculumDataModule: loading the sources into the curriculum,
the own solutions put in the bank at load, the loaders (served by the module's ``data_kind``),
mid-epoch resume through the state, and one plug-in run in a plain ``lightning.Trainer``.

The rules themselves (data scaling, SFT pairs, RL items, tally, schedule) are tested on the
Lightning-free :class:`~coscale.loop.curriculum.Curriculum` in ``test_curriculum.py``.
"""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest
import torch
from reward_examples import HasDigit
from trainers import quiet_trainer

from coscale.callbacks import PassRateMeasurement, RolloutNSchedule
from coscale.datamodules import ProblemDataModule
from coscale.datamodules import batches as batches_module
from coscale.datamodules.batches import FitCursor
from coscale.datamodules.serving import CurriculumDataModule
from coscale.loop.curriculum import Curriculum
from coscale.loop.pools import Pool
from coscale.modules import GRPOModule, SFTModule
from coscale.tasks import Problem
from coscale.tasks.arithmetic import ArithmeticTeacher

# 5-3+2 and 7+1 with some of their solutions (see test_curriculum.py for how they are made).
S012 = "5-3=2;2+2=4;\\boxed{4}"
S201 = "2+5=7;7-3=4;\\boxed{4}"
S210 = "2-3=-1;-1+5=4;\\boxed{4}"
C01 = "7+1=8;\\boxed{8}"


def _rows() -> list[dict]:
    return [
        {"id": "a", "question": "5-3+2", "answer": "4", "solutions": [S210, S012, S201]},
        {"id": "b", "question": "1+2", "answer": "3"},
        {"id": "c", "question": "7+1", "answer": "8", "solutions": [C01]},
    ]


def _dm(rows=None, **kwargs) -> ProblemDataModule:
    dm = ProblemDataModule(train=_rows() if rows is None else rows, **kwargs)
    dm.load()
    return dm


def _trainer(kind: str | None = "rl", epoch: int = 0, training: bool = True, reload: int = 1):
    """What the DataModule reads of a trainer: epoch, training flag, reload setting, module."""
    module = SimpleNamespace() if kind is None else SimpleNamespace(data_kind=kind)
    return SimpleNamespace(
        current_epoch=epoch,
        training=training,
        reload_dataloaders_every_n_epochs=reload,
        lightning_module=module,
    )


def _order(loader) -> list[str]:
    return [item["id"] for batch in loader for item in batch]


# ---------------------------------------------------------------------------------- loading
def _write_jsonl(tmp_path):
    path = tmp_path / "train.jsonl"
    lines = [
        json.dumps({"id": "p1", "question": "1+1", "answer": "2", "solutions": ["1+1=2"]}),
        json.dumps({"id": "p2", "question": " ", "answer": "1"}),  # line 2: empty question
        json.dumps({"id": "p3", "question": "2+2"}),  # line 3: no answer
        json.dumps({"id": "p4", "question": "3+3", "answer": 6}),
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_jsonl_with_bad_rows_skip_keeps_the_good_ones_and_warns_where(tmp_path):
    path = _write_jsonl(tmp_path)
    dm = ProblemDataModule(train=str(path), read={"on_bad_row": "skip"})
    with pytest.warns(UserWarning) as record:
        dm.setup("fit")
    message = "\n".join(str(w.message) for w in record)
    assert "skipped 2 bad rows" in message
    assert f"{path}:2: empty question" in message
    assert f"{path}:3: missing answer" in message
    assert list(dm.problems) == ["p1", "p4"]
    assert dm.problems is dm.curriculum.problems
    assert dm.problems["p1"].solutions == ("1+1=2",)
    assert dm.problems["p4"].answer == "6"
    assert dm.curriculum.pools.ids() == ["p1", "p4"]


def test_jsonl_with_bad_rows_raise_names_file_line_and_flag(tmp_path):
    path = _write_jsonl(tmp_path)
    dm = ProblemDataModule(train=str(path), read={"on_bad_row": "raise"})
    with pytest.raises(ValueError) as err:
        dm.load()
    text = str(err.value)
    assert f"2 bad rows in data.train={path}" in text
    assert f"{path}:2:" in text and f"{path}:3:" in text
    assert "on_bad_row='raise'" in text
    assert dm.problems == {} and len(dm.curriculum.pools) == 0
    assert not dm.loaded


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
        assert dm.curriculum.bank.take(p.id, 9) == expected  # all own ones in the bank


def test_list_of_rows_every_problem_starts_unsolvable():
    dm = _dm(bank_solutions=0)
    cur = dm.curriculum
    assert list(dm.problems) == ["a", "b", "c"]
    assert dm.problems["a"] == Problem("a", "5-3+2", "4", (S210, S012, S201))
    assert dm.problems["b"].solutions == ()
    assert cur.pools.counts() == {"unsolvable": 3, "solvable": 0, "solved": 0, "failed": 0}
    for pid in dm.problems:
        assert cur.pools.history(pid) == []
        assert cur.pools.solutions_used(pid) == 0
    assert cur.bank.total() == 0  # bank_solutions=0: nothing before the first scaling round
    dm.load()  # a second load reads nothing again
    dm.setup("fit")
    assert len(cur.pools) == 3


def test_limit_keeps_the_first_problems():
    assert list(_dm(read={"limit": 2}).problems) == ["a", "b"]


def test_duplicate_ids_in_the_source_and_from_code():
    rows = [*_rows(), {"id": "a", "question": "other", "answer": "1"}]
    with pytest.warns(UserWarning, match=r"rows\[3\]: duplicate id 'a' \(first at rows\[0\]\)"):
        dm = _dm(rows)
    assert list(dm.problems) == ["a", "b", "c"] and dm.problems["a"].question == "5-3+2"
    with pytest.raises(ValueError, match="duplicate id 'a'"):
        _dm(rows, read={"on_bad_row": "raise"})
    dm.curriculum.add_problems([Problem("d", "9+9", "18")])  # the plug-in path: from code
    assert dm.curriculum.pools.pool_of("d") is Pool.UNSOLVABLE and "d" in dm.problems
    with pytest.raises(ValueError, match="duplicate problem id 'a'"):
        dm.curriculum.add_problems([Problem("a", "other", "1")])


# ------------------------------------------------------------------------------ validation
def test_constructor_collects_every_bad_flag_in_one_error():
    # BUG (coscale/datamodules/problems.py, ProblemDataModule.__init__): its own checks
    # (on_bad_row, limit, bank_solutions, the curriculum settings) raise before
    # CurriculumDataModule.__init__ checks sft_source and the batch sizes, so an error names
    # only one of the two sets. Passes once ProblemDataModule adds the serving checks
    # (sft_source, batch_size, sft_batch_size, val_batch_size) to its `errors` before raising.
    with pytest.raises(ValueError) as err:
        ProblemDataModule(
            batch_size=0,
            sft_source="x",
            read={"on_bad_row": "x"},
            curriculum={"solutions_per_round": 0},
        )
    text = str(err.value)
    assert text.startswith("ProblemDataModule: ")
    assert "read.on_bad_row must be one of skip, raise; got 'x'" in text
    assert "curriculum.solutions_per_round must be an int >= 1, got 0" in text
    assert "sft_source must be one of bank, redistill, all; got 'x'" in text
    assert "batch_size must be an int >= 1, got 0" in text
    assert "sft_batch_size" not in text and "val_batch_size" not in text


def test_constructor_names_the_serving_flags_together():
    with pytest.raises(ValueError) as err:
        ProblemDataModule(batch_size=0, sft_source="x")
    assert str(err.value) == (
        "ProblemDataModule: sft_source must be one of bank, redistill, all; got 'x'; "
        "batch_size must be an int >= 1, got 0"
    )


@pytest.mark.parametrize(
    "flag",
    [
        "sft_batch_size",
        "val_batch_size",
        "curriculum.redistill_per_problem",
        "curriculum.solutions_per_round",
    ],
)
def test_constructor_names_each_count_flag(flag):
    group, _, key = flag.rpartition(".")
    kwargs = {group: {key: -1}} if group else {key: -1}
    with pytest.raises(
        ValueError, match=rf"ProblemDataModule: {flag} must be an int >= 1, got -1$"
    ):
        ProblemDataModule(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"curriculum": {"redistill_per_problem": 0}},
            "curriculum.redistill_per_problem must be an int >= 1, got 0",
        ),
        ({"read": {"on_bad_row": "x"}}, "read.on_bad_row must be one of skip, raise; got 'x'"),
        ({"read": {"limit": 0}}, "read.limit must be an int >= 1 or None, got 0"),
        ({"bank_solutions": -1}, "bank_solutions must be an int >= 0 or None, got -1"),
        (
            {"curriculum": {"replay_fraction": 1.0}},
            r"curriculum.replay_fraction must be in \[0, 1\), got 1.0",
        ),
    ],
)
def test_constructor_checks_the_other_flags(kwargs, message):
    with pytest.raises(ValueError, match=rf"^ProblemDataModule: {message}$"):
        ProblemDataModule(**kwargs)


def test_mode_is_gone():
    with pytest.raises(TypeError, match="mode"):
        ProblemDataModule(mode="sft")


# --------------------------------------------------------------------------- bank_solutions
def test_bank_solutions_none_puts_every_own_solution_in_the_bank():
    dm = _dm(teacher=ArithmeticTeacher())  # the teacher is not asked at load
    cur = dm.curriculum
    assert cur.bank.take("a", 9) == [S210, S012, S201]
    assert cur.bank.take("c", 9) == [C01] and cur.bank.count("b") == 0
    assert [cur.pools.solutions_used(i) for i in "abc"] == [3, 0, 1]
    assert cur.pools.members(Pool.UNSOLVABLE) == ["a", "b", "c"]
    assert [x["solution"] for x in cur.sft_pairs("bank")] == [S210, S012, S201, C01]


def test_bank_solutions_zero_leaves_the_bank_empty():
    cur = _dm(bank_solutions=0).curriculum
    assert cur.bank.total() == 0
    assert [cur.pools.solutions_used(i) for i in "abc"] == [0, 0, 0]
    assert cur.scale_solutions(k=1) == 2  # the pipeline hands them out by rounds instead
    assert cur.bank.take("a", 9) == [S210]


def test_bank_solutions_two_takes_the_first_two_of_each():
    cur = _dm(bank_solutions=2).curriculum
    assert cur.bank.take("a", 9) == [S210, S012]
    assert cur.bank.take("c", 9) == [C01] and cur.bank.count("b") == 0
    assert [cur.pools.solutions_used(i) for i in "abc"] == [2, 0, 1]


def test_sft_replay_source_gives_the_first_solution_of_each_row():
    replay = [
        {"id": "r1", "question": "rq1", "answer": "1", "solutions": ["s1", "s1b"]},
        {"id": "r2", "question": "rq2", "answer": "2"},
    ]
    dm = _dm(sft_replay=replay, curriculum={"replay_fraction": 0.5})
    assert dm.curriculum.replay_pairs == [{"id": "r1", "question": "rq1", "solution": "s1"}]
    assert _dm(sft_replay=replay).curriculum.replay_pairs == []  # fraction 0: not read


# -------------------------------------------------------------------------------- loaders
def _solvable_dm(seed: int, n: int = 8) -> ProblemDataModule:
    rows = [{"id": f"p{i}", "question": f"q{i}", "answer": str(i)} for i in range(n)]
    dm = _dm(rows, batch_size=3, curriculum={"seed": seed})
    for pid in dm.problems:
        dm.curriculum.pools.record(pid, 4, 1)
    return dm


def test_rl_loader_without_trainer_yields_shuffled_item_lists():
    dm = _solvable_dm(seed=3)
    batches = list(dm.train_dataloader())
    assert dm.cursor == FitCursor(epoch=0, consumed=0)
    assert [len(b) for b in batches] == [3, 3, 2]
    assert all(isinstance(b, list) for b in batches)
    ids = [item["id"] for b in batches for item in b]
    assert sorted(ids) == [f"p{i}" for i in range(8)]
    assert ids != sorted(ids)  # shuffled (this seed and epoch do move items)
    item = next(x for b in batches for x in b if x["id"] == "p5")
    assert item == {"id": "p5", "question": "q5", "answer": "5", "n": 8}
    # Same seed and epoch: same order; the next epoch reshuffles.
    assert _order(_solvable_dm(seed=3).train_dataloader()) == ids
    nxt = _order(dm.train_dataloader())
    assert dm.cursor == FitCursor(epoch=1, consumed=0)
    assert sorted(nxt) == sorted(ids) and nxt != ids
    assert _order(_solvable_dm(seed=4).train_dataloader()) != ids


def test_rl_loader_serves_only_the_chosen_groups():
    rows = [{"id": f"p{i}", "question": f"q{i}", "answer": str(i)} for i in range(4)]
    cur = _dm(rows).curriculum
    for pid in cur.problems:
        cur.pools.record(pid, 4, 1)
    cur.group_of.update({"p1": 1, "p3": 1})
    dm = CurriculumDataModule(cur, batch_size=8, rl_groups=[1])
    assert sorted(_order(dm.train_dataloader())) == ["p1", "p3"]


def test_sft_loader_yields_question_solution_dicts():
    dm = _dm(sft_batch_size=2)  # bank: a 3, c 1
    dm.trainer = _trainer("sft")
    batches = list(dm.train_dataloader())
    assert [len(b) for b in batches] == [2, 2]
    got = [item for b in batches for item in b]
    assert all(set(item) == {"id", "question", "solution"} for item in got)
    key = lambda x: (x["id"], x["solution"])  # noqa: E731
    assert sorted(got, key=key) == sorted(dm.curriculum.sft_pairs("bank"), key=key)


def test_sft_loader_serves_the_chosen_source():
    dm = _dm(sft_source="redistill", sft_batch_size=4)
    dm.curriculum.bank.record_rollout("b", "rb", True, step=1)
    dm.trainer = _trainer("sft")
    assert [b for b in dm.train_dataloader()] == [
        [{"id": "b", "question": "1+2", "solution": "rb"}]
    ]


def test_the_module_data_kind_chooses_what_is_served():
    dm = _solvable_dm(seed=0)
    dm.curriculum.bank.add("p0", "p0 solution")
    dm.trainer = _trainer("rl")
    assert all(
        set(x) == {"id", "question", "answer", "n"} for b in dm.train_dataloader() for x in b
    )
    dm.trainer = _trainer("sft", epoch=1)
    assert list(dm.train_dataloader()) == [
        [{"id": "p0", "question": "q0", "solution": "p0 solution"}]
    ]
    dm.trainer = _trainer(None)
    with pytest.raises(TypeError, match=r"SimpleNamespace has data_kind=None.*data_kind is one of"):
        dm.train_dataloader()
    dm.trainer.lightning_module.data_kind = "dpo"
    with pytest.raises(TypeError, match="data_kind='dpo'"):
        dm.train_dataloader()


def test_val_loader():
    val = [{"id": f"v{i}", "question": f"vq{i}", "answer": str(i), "level": 1} for i in range(3)]
    dm = ProblemDataModule(train=_rows(), val=val, val_batch_size=2)
    dm.setup("validate")
    batches = list(dm.val_dataloader())
    assert [len(b) for b in batches] == [2, 1]
    got = sorted((x for b in batches for x in b), key=lambda x: x["id"])
    # the other columns travel in meta, for the reward functions' **columns
    assert got == [
        {"id": f"v{i}", "question": f"vq{i}", "answer": str(i), "meta": {"level": 1}}
        for i in range(3)
    ]
    assert _order(dm.val_dataloader()) == _order(batches)  # fixed order every time
    assert _dm().val_dataloader() == []


def test_val_problems_are_scored_once_across_ranks(monkeypatch):
    val = [{"id": f"v{i}", "question": f"vq{i}", "answer": str(i)} for i in range(5)]
    dm = ProblemDataModule(train=_rows(), val=val, val_batch_size=2)
    dm.load()
    seen = []
    for rank in range(2):  # 3 batches of 2, 2, 1 over 2 ranks
        monkeypatch.setattr(batches_module, "rank_world", lambda rank=rank: (rank, 2))
        seen += _order(dm.val_dataloader())
    assert sorted(seen) == [f"v{i}" for i in range(5)]


# --------------------------------------------------------------------------------- resume
def test_setup_reloads_every_epoch_and_starts_a_new_fit():
    dm = _solvable_dm(seed=0)
    dm.cursor = FitCursor(epoch=4, consumed=2)
    trainer = _trainer("rl", reload=0)
    dm.trainer = trainer
    dm.setup("fit")
    assert trainer.reload_dataloaders_every_n_epochs == 1  # the pools change between epochs
    assert dm.cursor == FitCursor()


def test_restored_state_resumes_mid_epoch():
    rows = [{"id": i, "question": f"q{i}", "answer": f"ans{i}"} for i in "abcde"]
    dm = _dm(rows, batch_size=2)
    for pid in "abcde":
        dm.curriculum.pools.record(pid, 4, 1)  # all five solvable
    trainer = _trainer("rl", epoch=1)
    dm.trainer = trainer
    dm.setup("fit")
    loader = dm.train_dataloader()
    full = list(loader)  # epoch 1: 5 problems in batches of 2
    assert [len(b) for b in full] == [2, 2, 1]
    dm.on_before_batch_transfer(full[0], 0)
    trainer.training = False
    dm.on_before_batch_transfer(full[1], 0)  # not training (e.g. validation): not counted
    trainer.training = True
    assert dm.cursor is loader.cursor and loader.state_dict() == {"epoch": 1, "consumed": 1}
    # the position is the loader's state (Lightning saves it with the fit loop); the
    # DataModule's own state is the curriculum and what the epoch was served
    loader_state = json.loads(json.dumps(loader.state_dict()))
    state = json.loads(json.dumps(dm.state_dict()))
    assert set(state) == {"curriculum", "served"} and state["served"]["count"] == 5
    fresh = ProblemDataModule(train=rows, batch_size=2)
    fresh.trainer = trainer
    fresh.setup("fit")  # Lightning's order: setup, the DataModule's state, the loader, its state
    fresh.load_state_dict(state)
    assert fresh.state_dict() == dm.state_dict()
    resumed = fresh.train_dataloader()
    resumed.load_state_dict(loader_state)
    assert list(resumed) == full[1:] and fresh.cursor == FitCursor(epoch=1, consumed=1)
    trainer.current_epoch = 2
    assert len(list(fresh.train_dataloader())) == 3  # a new epoch starts from its beginning
    assert fresh.cursor == FitCursor(epoch=2, consumed=0)


def test_a_resumed_epoch_serves_what_it_was_served_though_the_pools_changed():
    """The RL module closes an epoch in the step that trains its last batch (the pools change),
    and a step checkpoint follows: resumed from it, the epoch is served as it was, not rebuilt
    from the changed pools (rebuilt empty, Lightning skipped the rest of the stage)."""
    rows = [{"id": i, "question": f"q{i}", "answer": f"ans{i}"} for i in "abcde"]
    dm = _dm(rows, batch_size=2)
    for pid in "abcde":
        dm.curriculum.pools.record(pid, 4, 1)
    dm.trainer = _trainer("rl", epoch=0)
    dm.setup("fit")
    full = list(dm.train_dataloader())
    for batch in full:
        dm.on_before_batch_transfer(batch, 0)
    for pid in "abcde":  # the close: every problem leaves RL
        dm.curriculum.pools.record(pid, 4, 4)
    assert dm.curriculum.rl_items() == []
    state = json.loads(json.dumps(dm.state_dict()))
    fresh = ProblemDataModule(train=rows, batch_size=2)
    fresh.trainer = dm.trainer
    fresh.setup("fit")
    fresh.load_state_dict(state)
    resumed = fresh.train_dataloader()
    assert resumed.dataset.batches == full  # the same epoch, so the same batches
    resumed.load_state_dict({"epoch": 0, "consumed": 3})
    assert list(resumed) == []  # every batch was trained: the epoch's end work comes next
    fresh.trainer.current_epoch = 1
    assert list(fresh.train_dataloader()) == []  # the next epoch reads the pools as they are


def test_a_resumed_sft_epoch_checks_its_pairs_against_the_digest():
    dm = _dm(sft_batch_size=2)
    dm.trainer = _trainer("sft", epoch=0)
    dm.setup("fit")
    full = list(dm.train_dataloader())
    state = json.loads(json.dumps(dm.state_dict()))
    assert "items" not in state["served"]  # SFT pairs: a count and a digest, not the texts
    fresh = _dm(sft_batch_size=2)
    fresh.trainer = dm.trainer
    fresh.setup("fit")
    fresh.load_state_dict(state)
    assert list(fresh.train_dataloader()) == full
    fresh.setup("fit")
    fresh.load_state_dict(state)
    fresh.curriculum.bank.add("a", "a new solution")
    with pytest.warns(UserWarning, match=r"epoch 0 builds 5 SFT pairs that differ from the 4"):
        fresh.train_dataloader()


def test_a_curriculum_datamodule_serves_a_shared_curriculum():
    cur = Curriculum()
    cur.add_problems([Problem("x", "1+1", "2"), Problem("y", "2+2", "4")])
    cur.record_measurement({"x": (4, 1), "y": (4, 0)})
    dm = CurriculumDataModule(cur, batch_size=4)
    assert list(dm.train_dataloader()) == [[{"id": "x", "question": "1+1", "answer": "2", "n": 8}]]
    assert dm.state_dict() == {"curriculum": cur.state_dict(), "served": dm.served.state_dict()}
    with pytest.raises(ValueError, match=r"CurriculumDataModule: sft_source must be one of"):
        CurriculumDataModule(cur, sft_source="x")


# ------------------------------------------------------------------------ plug-in (item 6)
FIELDS = {"question": "problem", "answer": "final", "solutions": "sols"}
PROMPT = {"template": "Q:{question}\nA:"}


def _weights(module):
    return {k: v.detach().clone() for k, v in module.policy.state_dict().items()}


def test_plug_in_sft_then_grpo_in_a_plain_trainer(tiny_model_dir, tmp_path):
    path = tmp_path / "mine.jsonl"
    rows = [
        {"problem": "1+1", "final": "2", "sols": ["1+1=2;\\boxed{2}", "1+1 is 2;\\boxed{2}"]},
        {"problem": "2+3", "final": "5", "sols": ["2+3=5;\\boxed{5}", "3+2=5;\\boxed{5}"]},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    dm = ProblemDataModule(train=str(path), fields=FIELDS, sft_batch_size=2)
    dm.setup("fit")
    cur = dm.curriculum
    assert [p.question for p in dm.problems.values()] == ["1+1", "2+3"]
    bank = [s for pid in dm.problems for s in cur.bank.take(pid, 9)]
    assert bank == [s for r in rows for s in r["sols"]]  # the file's solutions, all in the bank

    # SFT on the bank's pairs
    sft = SFTModule(model=str(tiny_model_dir), prompt=PROMPT, optimizer={"lr": 1e-3}, max_length=64)
    before = _weights(sft)
    trainer = quiet_trainer(2)
    trainer.fit(sft, datamodule=dm)
    assert trainer.global_step == 2
    after = _weights(sft)
    assert any(not torch.equal(before[k], after[k]) for k in before)

    # GRPO on the same DataModule once a measurement makes the problems solvable
    cur.record_measurement({pid: (4, 1) for pid in dm.problems})
    assert cur.pools.members(Pool.SOLVABLE) == list(dm.problems)
    history = {pid: len(cur.pools.history(pid)) for pid in dm.problems}
    measurements = cur.measurements
    grpo = GRPOModule(
        model=str(tiny_model_dir),
        prompt=PROMPT,
        reward=HasDigit(),
        optimizer={"lr": 0.001},
        sampling={"max_new_tokens": 6, "temperature": 1.0},
    )
    callbacks = [
        PassRateMeasurement(samples=2, every_n_epochs=1),
        RolloutNSchedule(num_groups=2, n_init=2, n_max=4),
    ]
    trainer = quiet_trainer(-1, max_epochs=2, callbacks=callbacks)
    trainer.fit(grpo, datamodule=dm)
    assert trainer.global_step >= 1
    assert cur.schedule is callbacks[1].schedule  # installed in the fit's curriculum
    # epoch 0 at least: its RL tally closed (one accuracy each) and a measurement (another)
    assert all(len(cur.pools.history(pid)) >= history[pid] + 2 for pid in dm.problems)
    assert cur.measurements >= measurements + 1
    assert cur.last_epoch_acc and set(cur.last_epoch_acc) <= set(dm.problems)
    assert cur.tally == {}  # the last epoch closed
    assert cur.group_of and set(cur.group_of) <= set(dm.problems)
    assert set(cur.n_per_problem) == set(cur.group_of)
    assert all(n in (2, 4) for n in cur.n_per_problem.values())
