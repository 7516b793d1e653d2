"""Prompt-only rows (`data.fields.answer: null`): problems load with no answer, and train with
reward functions and a verifier that need none; a function that reads the answer (MathReward,
the default verifier; any coscale-style function unless it says `needs_answer = False`) is
refused naming data.fields.answer and the setting that reads it."""

from __future__ import annotations

import json

import pytest
import torch
from trainers import quiet_trainer

from coscale.datamodules import ProblemDataModule
from coscale.loop.pools import Pool
from coscale.modules import GRPOModule
from coscale.scoring.answers import answer_readers, check_answers
from coscale.scoring.reward_set import RewardSet
from coscale.scoring.rewards import MathReward

ROWS = [{"prompt": "Say a number:", "id": "a"}, {"prompt": "Count to three:", "id": "b"}]


def has_digit(completions, **kwargs):  # TRL-style, reads no answer
    return [float(any(ch.isdigit() for ch in c)) for c in completions]


def matches(completions, answer, **kwargs):  # TRL-style, names the answer
    return [float(a in c) for c, a in zip(completions, answer)]


class Positional:
    def __call__(self, completions, answers):
        return [0.0] * len(completions)


class SaysNone(Positional):
    needs_answer = False


def _data(tmp_path) -> ProblemDataModule:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return ProblemDataModule(train=str(path), fields={"question": "prompt", "answer": None})


def test_prompt_only_rows_load_without_an_answer(tmp_path):
    dm = _data(tmp_path)
    dm.setup("fit")
    assert [(p.question, p.answer) for p in dm.problems.values()] == [
        ("Say a number:", ""),
        ("Count to three:", ""),
    ]
    mapped = ProblemDataModule(train=str(tmp_path / "prompts.jsonl"), fields={"question": "prompt"})
    with pytest.raises(ValueError, match=r"fields\.answer='answer' not found in any row"):
        mapped.setup("fit")  # without `answer: null` the answer's column must exist


@pytest.mark.parametrize(
    ("reward", "verifier", "readers"),
    [
        (None, None, ["reward[0] (MathReward)", "verifier (MathReward)"]),  # the defaults
        ([has_digit, matches], has_digit, ["reward[1] (matches)"]),
        ([has_digit], Positional(), ["verifier (Positional)"]),
        ([has_digit], SaysNone(), []),
        (has_digit, None, []),  # one reward: it is the verifier
    ],
)
def test_the_settings_that_read_the_answer_are_named(reward, verifier, readers):
    rewards = RewardSet(reward, verifier=verifier)
    assert answer_readers(rewards) == readers
    problems = [{"id": "a", "question": "q", "answer": ""}]
    if readers:
        with pytest.raises(ValueError) as err:
            check_answers(problems, rewards)
        assert str(err.value).startswith("data.fields.answer: problem 'a' has no answer")
        assert " and ".join(readers) + " read it" in str(err.value)
    else:
        check_answers(problems, rewards)
    check_answers([{"id": "a", "question": "q", "answer": "4"}], RewardSet(MathReward()))


def test_grpo_trains_on_prompt_only_rows_and_refuses_the_default_verifier(tiny_model_dir, tmp_path):
    dm = _data(tmp_path)
    dm.setup("fit")
    dm.curriculum.record_measurement({pid: (4, 1) for pid in dm.problems})
    assert dm.curriculum.pools.members(Pool.SOLVABLE) == ["a", "b"]
    args = dict(model=str(tiny_model_dir), optimizer={"lr": 1e-3})
    args |= dict(sampling={"max_new_tokens": 6, "temperature": 1.0}, prompt="{question}")
    grpo = GRPOModule(reward=has_digit, **args)
    before = {k: v.clone() for k, v in grpo.policy.state_dict().items()}
    quiet_trainer(1).fit(grpo, datamodule=dm)
    after = grpo.policy.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)
    with pytest.raises(ValueError, match=r"data\.fields\.answer: .* verifier \(MathReward\)"):
        quiet_trainer(1).fit(GRPOModule(**args), datamodule=dm)


def test_a_kwargs_function_gets_no_answer_on_prompt_only_rows():
    from coscale.scoring.reward_functions import RewardError, RewardFunction, RewardInputs

    def reads_kwargs(completions, **kwargs):
        return [float(a in c) for c, a in zip(completions, kwargs["answer"])]

    def inputs(answer: str) -> RewardInputs:
        return RewardInputs(
            prompts=["p"], completions=["c 4"], completion_ids=[[1]], answers=[answer]
        )

    assert RewardFunction(reads_kwargs).score(inputs("4")) == [1.0]
    with pytest.raises(RewardError, match="reward function 'reads_kwargs'"):
        RewardFunction(reads_kwargs).score(inputs(""))  # not scored against ""


def test_the_teacher_refuses_prompt_only_rows_when_its_reward_reads_the_answer():
    from coscale.loop.problem import Problem
    from coscale.loop.solution_sources import TeacherSolutions

    teacher = TeacherSolutions("unused/teacher")  # MathReward: refused before it loads a model
    with pytest.raises(ValueError, match=r"data\.fields\.answer: .* data\.teacher's reward \(Math"):
        teacher.propose([(Problem("a", "q", ""), 1)], lambda pid: [])
