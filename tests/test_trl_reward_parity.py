"""A list of TRL-style reward functions with weights scores the same in coscale as in TRL itself.

TRL's own code runs here: ``GRPOTrainer._calculate_rewards`` (TRL 1.16, unbound, on the smallest
stand-in for the trainer it reads: ``trl_reference.py``) gives the per-function scores; the weighted total is TRL's
own expression from ``_generate_and_score_completions``, read from TRL's source and evaluated
(``rewards_per_func * self.reward_weights ... .nansum(dim=1)``), so a change on TRL's side fails
this test rather than passing unnoticed. coscale's side is ``GRPOModule``'s path:
``RewardInputs.of_rollouts`` from a ``Rollouts`` batch, then ``RewardSet.score``.

What makes the two equal: TRL in its standard (not conversational) format, so prompts and
completions are plain text; the data set's answer column named ``answer`` (coscale passes the
gold answer as ``answer=`` to TRL-style functions, and every other column by its own name); the
same weights (TRL's ``reward_weights``). Both also pass ``trainer_state``, ``log_extra`` and
``log_metric`` (``**kwargs`` takes them here); TRL's own ``trl.rewards`` functions and the
conversational format are checked in ``test_trl_rewards.py``. Where no function has an
opinion on a completion TRL 1.16 marks its total NaN after the sum (left out of the group
baseline); coscale's total there is the sum's 0 and the completion is left out of the update.
"""

from __future__ import annotations

import asyncio
import inspect
import re

import pytest
import torch
import trl.trainer.grpo_trainer as trl_grpo  # TRL is a dev dependency: never skipped
from trl.rewards import get_soft_overlong_punishment
from trl_reference import stand_in, trl_rewards

from coscale.rollout.base import Rollouts
from coscale.scoring.reward_functions import RewardInputs
from coscale.scoring.reward_set import RewardSet


def accuracy(prompts, completions, completion_ids, answer, **kwargs):
    """1.0 when the completion ends with the gold answer."""
    return [float(c.strip().endswith(a)) for c, a in zip(completions, answer)]


def hard_only(completions, level, **kwargs):
    """An opinion on hard problems only: None (no opinion) below level 2."""
    return [None if lv < 2 else 0.1 * len(c) for c, lv in zip(completions, level)]


async def brevity(completion_ids, **kwargs):
    """Async: minus a hundredth per token."""
    await asyncio.sleep(0)
    return [-0.01 * len(ids) for ids in completion_ids]


FUNCTIONS = [accuracy, hard_only, brevity, get_soft_overlong_punishment(6, 4)]
WEIGHTS = [1.0, 0.5, 2.0, 0.3]

# two problems, three completions each; token ids are characters, 0 the end token, 9 padding
PROBLEMS = [
    {"id": "a", "question": "2+2", "answer": "4", "meta": {"level": 1}},
    {"id": "b", "question": "3*3", "answer": "9", "meta": {"level": 3}},
]
PROMPTS = ["Q:2+2\nA:", "Q:3*3\nA:"]
TEXTS = ["so 4", "5", "it is 4 really", "9", "maybe 9 or 8", "x"]


def _rollouts() -> Rollouts:
    ids = [[ord(ch) for ch in t] + [0] for t in TEXTS]  # the end token kept
    width = max(map(len, ids))
    completion = torch.tensor([row + [9] * (width - len(row)) for row in ids])  # [6, T]
    mask = torch.tensor([[1.0] * len(row) + [0.0] * (width - len(row)) for row in ids])
    prompt = torch.ones(6, 3, dtype=torch.long)  # [6, P]
    return Rollouts(
        prompt_index=torch.tensor([0, 0, 0, 1, 1, 1]),
        input_ids=torch.cat([prompt, completion], dim=1),
        attention_mask=torch.cat([torch.ones(6, 3), mask], dim=1).long(),
        completion_mask=mask,
        logprobs=torch.zeros(6, width),
        texts=TEXTS,
        finish_reasons=["stop"] * 6,
        prompt_length=3,
    )


def _trl_totals(rollouts: Rollouts) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """TRL's per-function scores and weighted totals, from TRL's own code."""
    index = rollouts.prompt_index.tolist()
    inputs = [  # one row per completion: the data set's columns, repeated per generation
        {"prompt": PROMPTS[i], "answer": PROBLEMS[i]["answer"], **PROBLEMS[i]["meta"]}
        for i in index
    ]
    trainer = stand_in(FUNCTIONS, WEIGHTS)  # weights as GRPOTrainer.__init__ keeps them
    per_function = trl_rewards(
        trainer,
        inputs,
        [PROMPTS[i] for i in index],
        list(TEXTS),
        rollouts.kept_completion_ids(),
    )
    source = inspect.getsource(trl_grpo.GRPOTrainer._generate_and_score_completions)
    line = (
        "rewards = (rewards_per_func * self.reward_weights.to(device).unsqueeze(0)).nansum(dim=1)"
    )
    assert line in source, "TRL's weighted sum changed: read it again before trusting this test"
    expression = re.sub(r"^rewards = ", "", line)
    scope = {"rewards_per_func": per_function, "self": trainer, "device": "cpu"}
    totals = eval(expression, {}, scope)  # TRL's own expression, on TRL's own scores
    return per_function, totals, trainer.reward_func_names


def test_trl_reward_list_with_weights_gives_trls_totals():
    rollouts = _rollouts()
    trl_per_function, trl_totals, trl_names = _trl_totals(rollouts)
    answers, metas = [p["answer"] for p in PROBLEMS], [p["meta"] for p in PROBLEMS]
    inputs = RewardInputs.of_rollouts(rollouts, PROMPTS, answers, metas)
    scores = RewardSet(FUNCTIONS, WEIGHTS, verifier=accuracy).score(inputs)
    assert list(scores.names) == trl_names  # train/rewards/<name> as TRL's rewards/<name>
    # the same NaNs (hard_only's None on problem a) and the same numbers, bit for bit
    assert torch.equal(torch.isnan(scores.per_function), torch.isnan(trl_per_function))
    assert (
        torch.isnan(trl_per_function[:3, 1]).all() and not torch.isnan(trl_per_function[3:]).any()
    )
    assert torch.equal(scores.per_function.nan_to_num(7.0), trl_per_function.nan_to_num(7.0))
    assert torch.equal(scores.reward, trl_totals)
    # worked by hand for the first completion, "so 4" (5 tokens with the end token, level 1):
    # accuracy 1, hard_only None, brevity -0.05, overlong (6, 4): 5 tokens > 6 - 4 -> (2 - 5) / 4
    expected = 1.0 * 1.0 + 2.0 * -0.05 + 0.3 * (2 - 5) / 4
    assert scores.reward[0].item() == pytest.approx(expected, abs=1e-6)
