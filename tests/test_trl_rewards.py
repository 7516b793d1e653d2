"""Every reward function TRL ships in ``trl.rewards`` scores in coscale as in TRL 1.16 itself.

The reference is TRL's own ``GRPOTrainer._calculate_rewards`` (``trl_reference.py``), called as
the trainer calls it, with the same data set rows: a prompt column and the answer in a column
named ``solution`` (TRL's math data sets). coscale's side loads the same rows with
``fields={"question": "prompt", "answer": "solution"}``, so the ``solution`` column reaches the
functions from ``Problem.meta`` under its own name, and scores them with ``RewardSet``. Both
formats: conversational (message lists; coscale's ``RewardInputs.prompt_messages``) and standard
(text). In the standard format TRL's functions that read ``completion[0]["content"]`` raise in
TRL itself; they must raise in coscale too (named), not score differently. What the functions
log with ``log_extra`` must be the same too.
"""

from __future__ import annotations

import inspect

import pytest
import torch
import trl.rewards
from trl_reference import stand_in, trl_rewards

from coscale.scoring.reward_context import RewardContext
from coscale.scoring.reward_functions import RewardError, RewardInputs, columns_of
from coscale.scoring.reward_set import RewardSet
from coscale.tasks.loaders import load_problems

FACTORIES = {  # the arguments of TRL's reward factories (a new factory must be added here)
    "get_cosine_scaled_reward": {"max_len": 20},
    "get_repetition_penalty_reward": {"ngram_size": 2},
    "get_soft_overlong_punishment": {"max_completion_len": 12, "soft_punish_cache": 4},
}

# three problems (the last one's gold answer does not parse: TRL's "no opinion"), two
# completions each; token ids with repeats for the repetition penalty
QUESTIONS = ["What is 1/3 as a fraction?", "What is 2 + 3?", "Name a shape."]
SOLUTIONS = ["\\frac{1}{3}", "5", "a circle ]["]
COMPLETIONS = [
    "<think>\nsplit in three\n</think>\nThe answer is \\boxed{\\frac{1}{3}}",
    "<think>hmm</think> so \\boxed{\\frac{1}{2}}",
    "The answer is \\boxed{5}",
    "<think>a</think><think>b</think> \\boxed{5}",
    "\\boxed{7}",
    "<think>round</think> a circle",
]
INDEX = [0, 0, 1, 1, 2, 2]
IDS = [[4, 5, 4, 5, 4, 5, 2], [7, 8, 9, 2], list(range(10, 24)), [3, 3, 3, 3, 2], [6, 2], [9] * 9]
SYSTEM = {"role": "system", "content": "Put the final answer in \\boxed{}."}


def trl_functions() -> dict[str, object]:
    """Every reward function in ``trl.rewards``, its factories called with ``FACTORIES``."""
    out = {}
    for name in trl.rewards.__all__:
        value = getattr(trl.rewards, name)
        if inspect.ismodule(value):
            continue
        if name.startswith("get_"):
            assert name in FACTORIES, f"trl.rewards.{name} is new: give its arguments in FACTORIES"
            value = value(**FACTORIES[name])
        out[name] = value
    return out


FUNCTIONS = trl_functions()


def messages(q: int) -> list[dict[str, str]]:
    return [SYSTEM, {"role": "user", "content": QUESTIONS[q]}]


def coscale_inputs(conversational: bool) -> RewardInputs:
    """What GRPOModule's scoring gets: the rows loaded as problems, the answer column in meta."""
    rows = [{"prompt": q, "solution": s} for q, s in zip(QUESTIONS, SOLUTIONS)]
    fields = {"question": "prompt", "answer": "solution"}
    problems = load_problems(rows, fields=fields).problems
    assert [p.meta for p in problems] == [{"solution": s} for s in SOLUTIONS]
    return RewardInputs(
        prompts=[problems[i].question for i in INDEX],
        completions=COMPLETIONS,
        completion_ids=IDS,
        answers=[problems[i].answer for i in INDEX],
        columns=columns_of([problems[i].meta for i in INDEX]),
        prompt_messages=[messages(i) for i in INDEX] if conversational else None,
    )


def trl_call(fn, conversational: bool):
    """TRL's scores of ``fn`` (``[R]``) and what it logged, or the exception TRL raised."""
    if conversational:
        prompts = [messages(i) for i in INDEX]
        completions = [[{"role": "assistant", "content": c}] for c in COMPLETIONS]
    else:
        prompts, completions = [QUESTIONS[i] for i in INDEX], list(COMPLETIONS)
    rows = [{"prompt": p, "solution": SOLUTIONS[i]} for p, i in zip(prompts, INDEX)]
    trainer = stand_in([fn])
    try:
        scores = trl_rewards(trainer, rows, prompts, completions, [list(x) for x in IDS])
    except Exception as err:
        return err, None
    return scores[:, 0], dict(trainer._pending_extra_logs)


@pytest.mark.parametrize("conversational", [True, False], ids=["conversational", "standard"])
@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_each_trl_reward_function_scores_as_in_trl(name, conversational):
    fn = FUNCTIONS[name]
    expected, logged = trl_call(fn, conversational)
    context = RewardContext()
    if isinstance(expected, Exception):  # TRL itself cannot score it in this format
        with pytest.raises(RewardError, match=type(expected).__name__):
            RewardSet(fn).score(coscale_inputs(conversational), context)
        assert not conversational  # every function works on conversational data
        return
    scores = RewardSet(fn).score(coscale_inputs(conversational), context)
    got = scores.per_function[:, 0]  # [R]
    assert torch.equal(torch.isnan(got), torch.isnan(expected))  # the same "no opinion"s
    assert torch.equal(got.nan_to_num(9.0), expected.nan_to_num(9.0))  # bit for bit
    assert dict(context.log.extra) == logged  # log_extra columns, as TRL's table gets them


def test_the_references_are_not_trivial():
    """The cases above tell the functions' outcomes apart: each scores differently across the
    completions, accuracy has a None (the unparseable gold), and the think format both ways."""
    for name, fn in FUNCTIONS.items():
        scores, _ = trl_call(fn, conversational=True)
        assert len(set(scores.nan_to_num(9.0).tolist())) > 1, name
    accuracy, _ = trl_call(FUNCTIONS["accuracy_reward"], conversational=True)
    assert accuracy.tolist()[:4] == [1.0, 0.0, 1.0, 1.0] and torch.isnan(accuracy[4:]).all()
