"""GRPO fits with several rewards: a format bonus moves the advantages and no pool label; TRL-style
and async rewards read the problems' dataset columns and are logged one by one; a reward that
raises stops the step, named; TRL's step arguments (``trainer_state``, ``log_metric``,
``log_extra``) reach the functions and what they log is logged."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from reward_examples import HasDigit, async_bonus, format_bonus
from trainers import quiet_trainer

from coscale.datamodules import ProblemDataModule
from coscale.loop.curriculum import Curriculum, CurriculumSettings
from coscale.loop.problem import Problem
from coscale.modules import GRPOModule
from coscale.modules import tables as tables_module
from coscale.modules.tables import log_completions
from coscale.rl.advantages import group_advantages
from coscale.scoring.reward_context import TrainerState
from coscale.scoring.reward_functions import RewardError

SETTINGS = {"optimizer": {"lr": 0.01}, "sampling": {"max_new_tokens": 6, "temperature": 1.0}}


def _solvable_dm(n: int = 4) -> ProblemDataModule:
    """Three solvable problems, N = ``n`` each, one batch: one step an epoch. Each has a
    ``level`` column beside question and answer."""
    rows = [
        {"id": f"p{i}", "question": f"{i}+{i}", "answer": str(2 * i), "level": i} for i in range(3)
    ]
    dm = ProblemDataModule(train=rows, batch_size=3)
    dm.load()
    for pid in dm.problems:
        dm.curriculum.pools.record(pid, 10, 3)  # acc 0.3: solvable
        dm.curriculum.n_per_problem[pid] = n
    return dm


def _one_step(model_dir, **rewards):
    """One GRPO step (one epoch of one batch) -> (module, rewards and advantages the update got,
    the curriculum after the epoch's close, the logged metrics)."""
    module = GRPOModule(model=str(model_dir), **rewards, **SETTINGS)
    seen = {}
    sample, update = module.sample, module.update

    def spy_sample(batch, n, sampling):
        rollouts, scores = sample(batch, n, sampling)
        seen["scores"], seen["groups"] = scores, rollouts.prompt_index.clone()
        return rollouts, scores

    def spy_update(rollouts, advantages, keep):
        seen["advantages"] = advantages.clone()
        return update(rollouts, advantages, keep)

    module.sample, module.update = spy_sample, spy_update
    dm = _solvable_dm()
    trainer = quiet_trainer(-1, max_epochs=1)
    trainer.fit(module, datamodule=dm)
    return seen, dm.curriculum, trainer.callback_metrics


def test_a_format_bonus_changes_the_advantages_and_no_pool_label(tiny_model_dir):
    plain, cur_plain, _ = _one_step(tiny_model_dir, reward=HasDigit())
    shaped, cur_shaped, metrics = _one_step(
        tiny_model_dir,
        reward=[HasDigit(), format_bonus],
        reward_weights=[1.0, 0.5],
        verifier=HasDigit(),
    )
    # the same seeded rollouts: the verifier's verdicts are the same (some right, some wrong) ...
    assert torch.equal(plain["scores"].correct, shaped["scores"].correct)
    assert 0 < int(plain["scores"].correct.sum()) < 12
    r = plain["scores"].reward  # [12] HasDigit's 0/1
    # ... the reward is HasDigit + 0.5 * format_bonus (0, 1, 0, 1 in every group of four)
    bonus = torch.tensor([0.0, 1.0] * 6)
    assert torch.equal(shaped["scores"].reward, r + 0.5 * bonus)
    expected = group_advantages(r + 0.5 * bonus, shaped["groups"]).advantages
    assert torch.equal(shaped["advantages"].cpu(), expected)
    assert not torch.equal(
        shaped["advantages"].cpu(), group_advantages(r, plain["groups"]).advantages
    )
    # the pools, their histories and the replay buffer saw only the verdicts
    for pid in cur_plain.problems:
        assert cur_plain.pools.pool_of(pid) == cur_shaped.pools.pool_of(pid)
        assert cur_plain.pools.history(pid) == cur_shaped.pools.history(pid)
        assert cur_plain.bank.latest_correct(pid) == cur_shaped.bank.latest_correct(pid)
    assert float(metrics["train/rewards/format_bonus"]) == 0.5
    assert float(metrics["train/correct"]) == float(plain["scores"].correct.float().mean())


def test_trl_style_and_async_rewards_read_the_columns_and_are_logged_each(tiny_model_dir):
    levels = []

    def by_level(prompts, completions, completion_ids, level, answer, **columns):
        levels.append(list(level))
        assert len(prompts) == len(completion_ids) == len(answer) == len(completions)
        return [float(lv) for lv in level]

    seen, _, metrics = _one_step(
        tiny_model_dir,
        reward=[by_level, async_bonus, format_bonus],
        reward_weights=[1.0, 2.0, 1.0],
        verifier=HasDigit(),
    )
    # the level column, repeated for each of the problem's 4 rollouts, in the rollouts' order
    groups = seen["groups"].tolist()
    batch_levels = levels[0]
    assert len(batch_levels) == 12 and len(set(zip(groups, batch_levels))) == 3
    per = seen["scores"].per_function  # [12, 3]
    assert per[:, 0].tolist() == [float(v) for v in batch_levels]
    assert metrics["train/rewards/by_level"] == pytest.approx(1.0)  # levels 0, 1, 2 x 4 each
    assert "train/rewards/format_bonus" in metrics
    digits = per[:, 1]  # async_bonus: 0.5 or no opinion
    if torch.isnan(digits).all():
        assert "train/rewards/async_bonus" not in metrics
    else:
        assert metrics["train/rewards/async_bonus"] == pytest.approx(0.5)
    totals = torch.nansum(per * torch.tensor([1.0, 2.0, 1.0]), dim=1)
    assert torch.equal(seen["scores"].reward, totals)


def test_a_reward_that_raises_stops_the_step_naming_it_and_the_completion(tiny_model_dir):
    def fails_on_p1(completions, answer, **columns):  # TRL-style
        if "2" in answer:
            raise ZeroDivisionError("no")
        return [0.0] * len(completions)

    with pytest.raises(RewardError, match=r"'fails_on_p1' \(reward\[1\]\) raised on completion "
                       r"[048] of 12: ZeroDivisionError: no"):  # fmt: skip
        _one_step(tiny_model_dir, reward=[HasDigit(), fails_on_p1], verifier=HasDigit())


def test_trls_step_arguments_reach_the_functions_and_what_they_log_is_logged(tiny_model_dir):
    """TRL's ``trainer_state``, ``log_metric`` and ``log_extra`` in a training step: the state is
    the step's, a metric lands in ``train/<name>`` (the mean of the step's values)."""
    states = []

    def shaped(completions, trainer_state, log_metric, log_extra, **kwargs):  # TRL-style
        states.append(trainer_state)
        log_metric("chars", 2.0)
        log_metric("chars", 4.0)
        log_extra("length", [len(c) for c in completions])
        return [0.0] * len(completions)

    _, _, metrics = _one_step(tiny_model_dir, reward=[HasDigit(), shaped], verifier=HasDigit())
    assert states == [TrainerState(global_step=0, epoch=0.0, max_steps=0, num_train_epochs=1)]
    assert metrics["train/chars"] == pytest.approx(3.0)


def test_one_completions_table_grows_across_steps_and_stages():
    """One key for the whole run: each logged step adds its rows (stage, step, problem with its
    pool and N, completion, the weighted reward, each function's score, the advantage, then each
    column a reward function logged; one of another length stays empty), the latest kept."""
    tables = []
    logger = SimpleNamespace(log_table=lambda **table: tables.append(table))
    cur = Curriculum(CurriculumSettings())
    cur.add_problems([Problem("p", "1+1?", "2"), Problem("q", "2+2?", "4")])
    module = SimpleNamespace(global_rank=0, loggers=[logger], global_step=3, run_stage="it1/rl")
    module._trainer = SimpleNamespace(datamodule=SimpleNamespace(curriculum=cur))
    rollouts = SimpleNamespace(prompt_index=torch.tensor([0, 0, 1]), texts=["a", "bb", "c"])
    scores = SimpleNamespace(
        reward=torch.tensor([1.0, 0.0, 1.0]),
        per_function=torch.tensor([[1.0, 0.0], [0.0, float("nan")], [1.0, 0.0]]),
        names=("MathReward", "format"),
    )
    advantages, extra = torch.tensor([0.5, -0.5, 0.0]), {"length": [1, 2, 1], "partial": [7]}
    batch = [{"id": "p", "n": 4}, {"id": "q", "n": 8}]
    log_completions(module, batch, rollouts, scores, advantages, extra)
    module.run_stage, module.global_step = "it2/rl", 0  # the next stage: a fresh fit's step 0
    log_completions(module, batch[:1], SimpleNamespace(prompt_index=torch.tensor([0]), texts=["d"]),
                    SimpleNamespace(reward=torch.tensor([0.0]), per_function=torch.tensor([[0.0, 1.0]]),
                                    names=scores.names), torch.tensor([0.0]))  # fmt: skip
    assert [t["key"] for t in tables] == ["completions", "completions"]
    first, grown = tables
    assert first["columns"] == grown["columns"] == [
        "stage", "step", "problem", "pool", "n", "completion", "reward",
        "reward/MathReward", "reward/format", "advantage", "length", "partial",
    ]  # fmt: skip
    assert first["data"] == [
        ["it1/rl", 3, "p", "unsolvable", 4, "a", 1.0, 1.0, 0.0, 0.5, 1, None],
        ["it1/rl", 3, "p", "unsolvable", 4, "bb", 0.0, 0.0, None, -0.5, 2, None],
        ["it1/rl", 3, "q", "unsolvable", 8, "c", 1.0, 1.0, 0.0, 0.0, 1, None],
    ]
    assert grown["data"][:3] == first["data"]
    assert grown["data"][3] == [
        "it2/rl",
        0,
        "p",
        "unsolvable",
        4,
        "d",
        0.0,
        0.0,
        1.0,
        0.0,
        None,
        None,
    ]
    for _ in range(tables_module.MAX_TABLE_ROWS):  # capped: the latest rows stay
        log_completions(module, batch, rollouts, scores, advantages)
    assert len(tables[-1]["data"]) == tables_module.MAX_TABLE_ROWS
