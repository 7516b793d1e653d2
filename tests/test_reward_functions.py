"""Reward functions as users write them: both signatures, columns, None, async, weights, errors,
and the verifier beside the shaped reward (``coscale.scoring.reward_functions`` / ``reward_set``).
"""

from __future__ import annotations

import asyncio
import functools
import math

import pytest
import torch

from coscale.modules.grpo import settings_errors as grpo_settings_errors
from coscale.modules.sft import settings_errors as sft_settings_errors
from coscale.scoring.reward_functions import (
    RewardError,
    RewardFunction,
    RewardInputs,
    calling_style,
    columns_of,
    is_async,
    reward_name,
)
from coscale.scoring.reward_set import RewardSet, default_verifier, reward_errors
from coscale.scoring.rewards import MathReward

# Three completions of two problems: p1 (answer "1", level 2) twice, p2 (answer "3", no level).
INPUTS = RewardInputs(
    prompts=["Q1", "Q1", "Q2"],
    completions=["1", "22", "3"],
    completion_ids=[[5], [6, 6], [7]],
    answers=["1", "1", "3"],
    columns={"level": [2, 2, None]},
)


def exact(completions, answers, **columns):  # coscale-style
    return [float(c == a) for c, a in zip(completions, answers)]


def length_bonus(prompts, completions, completion_ids, **kwargs):  # TRL-style
    return [0.5 * len(ids) for ids in completion_ids]


def hard_only(completions, level, **kwargs):  # TRL-style: reads a dataset column by name
    return [None if lv is None else float(lv >= 2) for lv in level]


class Exact:
    def __call__(self, completions, answers):  # no **columns: gets none
        return exact(completions, answers)


class AsyncJudge:
    async def __call__(self, prompts, completions, **kwargs):
        await asyncio.sleep(0)
        return [0.25] * len(completions)


# ------------------------------------------------------------------------------ the signature
@pytest.mark.parametrize(
    ("fn", "style"),
    [
        (exact, "coscale"),
        (Exact(), "coscale"),
        (MathReward(num_workers=0), "coscale"),
        (lambda c, a: [0.0] * len(c), "coscale"),  # any names but TRL's
        (length_bonus, "trl"),
        (hard_only, "trl"),  # names completions, not answers: TRL's f(completions, solution)
        (lambda completions, **kw: [0.0], "trl"),
        (AsyncJudge(), "trl"),
        (functools.partial(length_bonus, prompts=None), "trl"),
    ],
)
def test_the_calling_style_is_read_from_the_signature(fn, style):
    assert calling_style(fn) == style


def test_names_and_async_of_functions_instances_and_partials():
    assert reward_name(exact) == "exact" and reward_name(Exact()) == "Exact"
    assert reward_name(functools.partial(exact)) == "exact"
    assert is_async(AsyncJudge()) and not is_async(Exact()) and not is_async(exact)

    async def fn(completions, **kw):
        return []

    assert is_async(fn) and is_async(functools.partial(fn))


def test_each_style_gets_its_arguments_and_the_columns_it_names():
    seen = {}

    def trl(prompts, completions, completion_ids, answer, level, **kwargs):
        seen["trl"] = (prompts, completions, completion_ids, answer, level, kwargs)
        return [0.0] * 3

    def mine(completions, answers, level=None):  # no **kwargs: only the column it names
        seen["mine"] = (completions, answers, level)
        return [0.0] * 3

    RewardFunction(trl).score(INPUTS)
    RewardFunction(mine).score(INPUTS)
    *given, kwargs = seen["trl"]
    assert given == [
        ["Q1", "Q1", "Q2"],
        ["1", "22", "3"],
        [[5], [6, 6], [7]],
        ["1", "1", "3"],
        [2, 2, None],
    ]
    assert set(kwargs) == {"trainer_state", "log_extra", "log_metric"}  # TRL's step arguments
    assert seen["mine"] == (["1", "22", "3"], ["1", "1", "3"], [2, 2, None])


def test_columns_of_rows_fill_missing_columns_with_none():
    assert columns_of([{"a": 1}, {}, {"b": 2, "a": 3}]) == {"a": [1, None, 3], "b": [None, None, 2]}


# ---------------------------------------------------------------------- None, weights, async
def test_weighted_sum_leaves_none_out_per_completion():
    rewards = RewardSet([exact, length_bonus, hard_only], [1.0, 2.0, -1.0], verifier=exact)
    scores = rewards.score(INPUTS)
    # per completion: exact, length_bonus (0.5 per token), hard_only (None for p2)
    #   "1":  1, 0.5, 1   -> 1 + 2*0.5 - 1 = 1.0
    #   "22": 0, 1.0, 1   -> 0 + 2*1.0 - 1 = 1.0
    #   "3":  1, 0.5, None -> 1 + 2*0.5      = 2.0
    assert scores.reward.tolist() == [1.0, 1.0, 2.0]
    assert scores.names == ("exact", "length_bonus", "hard_only")
    assert torch.isnan(scores.per_function[2, 2]) and scores.scorable.all()
    third = pytest.approx(2 / 3, abs=1e-7)  # float32 means
    assert scores.means() == {"exact": third, "length_bonus": third, "hard_only": 1.0}


def test_a_completion_no_function_scores_has_reward_zero_and_is_not_scorable():
    def opinionless(completions, **kwargs):
        return [None, 1.0, None]

    scores = RewardSet([opinionless, hard_only], verifier=exact).score(INPUTS)
    # "3": both None -> nansum of nothing = 0, and no function had an opinion
    assert scores.reward.tolist() == [1.0, 2.0, 0.0]
    assert scores.scorable.tolist() == [True, True, False]


def test_async_functions_run_concurrently_on_one_loop():
    # each waits for the other to have started: run one after the other, both would time out
    started = {"a": None, "b": None}

    def waiter(me: str, other: str):
        async def judge(prompts, completions, **kwargs):
            started[me] = asyncio.get_running_loop()
            for _ in range(500):
                if started[other] is not None:
                    return [1.0] * len(completions)
                await asyncio.sleep(0.01)
            raise TimeoutError(f"{other} never started while {me} waited")

        judge.__name__ = f"judge_{me}"
        return judge

    rewards = RewardSet([waiter("a", "b"), exact, waiter("b", "a")], [1, 1, 2], verifier=exact)
    scores = rewards.score(INPUTS)
    assert scores.reward.tolist() == [4.0, 3.0, 4.0]  # 1 + exact + 2
    assert started["a"] is started["b"]  # one event loop


def test_an_async_function_alone_is_awaited_on_the_reward_loop():
    # as a teacher's verifier is called: one function, no RewardSet around it
    assert RewardFunction(AsyncJudge(), "verifier").score(INPUTS) == [0.25] * 3


# ------------------------------------------------------------------------------------ errors
def test_a_raising_function_is_named_with_the_first_failing_completion():
    def picky(completions, answers):
        if any(len(c) > 1 for c in completions):
            raise ValueError("too long")
        return [1.0] * len(completions)

    with pytest.raises(RewardError, match=r"'picky' \(reward\[1\]\) raised on completion 1 of 3: "
                       r"ValueError: too long") as info:  # fmt: skip
        RewardSet([exact, picky], verifier=exact).score(INPUTS)
    assert isinstance(info.value.__cause__, ValueError)


def test_an_async_function_that_raises_is_named_too():
    async def flaky(completions, **kwargs):
        if "3" in completions:
            raise KeyError("3")
        return [0.0] * len(completions)

    with pytest.raises(RewardError, match=r"'flaky' \(reward\[0\]\) raised on completion 2 of 3"):
        RewardSet([flaky], verifier=exact).score(INPUTS)


def test_a_batch_only_failure_has_no_completion_index():
    def batchy(completions, answers):
        if len(completions) > 1:
            raise RuntimeError("needs one at a time")
        return [0.0]

    with pytest.raises(RewardError, match=r"on the batch of 3 completions \(each alone scores"):
        RewardFunction(batchy).score(INPUTS)


@pytest.mark.parametrize(
    ("out", "match"),
    [
        ([1.0, 2.0], r"'f' \(reward\) returned 2 scores for 3 completions"),
        (torch.ones(3), r"returned Tensor for 3 completions"),
        ([1.0, "yes", 0.0], r"scored completion 1 'yes': a score must be a finite number"),
        ([1.0, math.inf, 0.0], r"scored completion 1 inf"),
    ],
)
def test_what_a_function_returns_is_checked(out, match):
    def f(completions, answers):
        return out

    with pytest.raises(RewardError, match=match):
        RewardFunction(f).score(INPUTS)


def test_settings_errors_name_the_settings_and_both_sides_of_a_mismatch():
    assert reward_errors([exact, length_bonus], [1.0, 2.0, 3.0]) == [
        "reward_weights has 3 weights but reward has 2 functions: give one weight per reward "
        "function"
    ]
    assert reward_errors(None, [1.0, 2.0])[0].startswith("reward_weights has 2 weights but "
                                                          "reward has 1 function:")  # fmt: skip
    assert reward_errors([], None) == [
        "reward is an empty list: give one function or more, or leave it unset"
    ]
    assert reward_errors([exact, 3], [1.0, "x"], verifier="v") == [
        "reward[1] must be callable, a class_path or a reward model (a folder or hub id), got "
        "int 3",
        "verifier='v' is no importable function (a dotted path), no existing folder of a reward "
        "model and no hub id (owner/name)",
        "reward_weights[1] must be a finite number, got 'x'",
    ]
    assert reward_errors([{"class_path": "m.R"}, exact], [1, 0.5]) == []  # YAML's form
    assert reward_errors(["some/reward-model", exact], None) == []  # a reward model, as in TRL
    # the one check, where the settings come in: the modules' (the pipeline runs them on YAML)
    grpo = grpo_settings_errors(reward=[exact, length_bonus], reward_weights=[1.0])
    assert grpo[0].startswith("reward_weights has 1 weight but reward has 2")
    assert sft_settings_errors(verifier=3)[0].startswith("verifier must be callable")


# -------------------------------------------------------------------------------- the verifier
def test_the_verifier_decides_correct_and_the_weighted_sum_the_reward():
    rewards = RewardSet([exact, length_bonus], [1.0, 1.0], verifier=exact)
    scores = rewards.score(INPUTS)
    assert scores.reward.tolist() == [1.5, 1.0, 1.5]
    assert scores.correct.tolist() == [True, False, True]  # exact alone, not the sum >= 1
    assert rewards.verify(INPUTS).tolist() == [True, False, True]


def test_which_verifier_by_default():
    math = MathReward(num_workers=0)
    assert default_verifier(exact) is exact  # one reward: it decides correctness (as before)
    assert default_verifier([exact]) is exact
    assert default_verifier([exact, math, length_bonus]) is math  # the MathReward among them
    assert isinstance(default_verifier([exact, length_bonus]), MathReward)
    assert isinstance(default_verifier(None), MathReward)
    assert default_verifier([exact, math], verifier=length_bonus) is length_bonus
    # no reward: the verifier's score is the reward
    scores = RewardSet(verifier=exact).score(INPUTS)
    assert scores.reward.tolist() == [1.0, 0.0, 1.0] and scores.names == ("exact",)


def test_a_verifier_among_the_rewards_is_called_once_and_none_is_not_correct():
    calls = []

    def counted(completions, answers):
        calls.append(len(completions))
        return [1.0, None, 0.5]

    scores = RewardSet([counted, length_bonus], verifier=counted).score(INPUTS)
    assert calls == [3]
    assert scores.correct.tolist() == [True, False, False]  # None: no opinion, not correct


def test_two_functions_of_one_name_are_logged_apart():
    assert RewardSet([exact, exact, Exact()], verifier=exact).names == ["exact", "exact_2", "Exact"]
