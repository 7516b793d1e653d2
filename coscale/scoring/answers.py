"""Which reward settings read each problem's gold answer, and the refusal of prompt-only rows
(``data.fields.answer: null``) to any that does.

A function reads the answer when it says so (an attribute ``needs_answer``: ``MathReward``
does, a ``RewardModel`` does not), else by its calling convention
(:mod:`.reward_functions`): a coscale-style function is handed the answers as its second
argument, so it is taken to read them; a TRL-style one reads the answer when it names an
``answer`` parameter. One that takes ``**kwargs`` gets the row's columns, and for prompt-only
rows no ``answer`` (:meth:`RewardFunction._call` leaves it out when no problem of the call has
one), so reading ``kwargs["answer"]`` fails naming the function instead of scoring against
empty strings. The verifier counts as well: with no reward given it is ``MathReward`` (the default),
which needs answers, so a prompt-only run names its verifier.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from coscale.scoring.reward_functions import RewardFunction, RewardInputs

GRPO_FIX = (
    "give reward functions and a verifier that need no answer (pipeline.grpo.reward / "
    "pipeline.grpo.verifier; GRPOModule's reward= / verifier=)"
)
"""What a module's refusal asks for."""


def reads_answer(function: RewardFunction) -> bool:
    """Whether ``function`` reads the gold answer (the rule in the module docstring)."""
    said = getattr(function.fn, "needs_answer", None)
    if isinstance(said, bool):
        return said
    return function.style == "coscale" or "answer" in function.parameter_names


def answer_readers(rewards: Any) -> list[str]:
    """The settings that read the answer, each with the function's name, e.g. ``reward[0]
    (MathReward)``: of a :class:`~.reward_set.RewardSet` (its functions and verifier), or of a
    list of :class:`RewardFunction`."""
    functions = rewards if isinstance(rewards, list) else [*rewards.functions, rewards.verifier]
    return [f"{f.setting} ({f.name})" for f in functions if reads_answer(f)]


def check_answers(problems: Sequence[Any], rewards: Any, fix: str = GRPO_FIX) -> None:
    """Raises when a problem (a dict or a ``Problem``) has no answer (``""``) and a function of
    ``rewards`` (see :func:`answer_readers`) reads it; ``fix`` names the settings to change."""
    missing = [str(_get(p, "id")) for p in problems if _get(p, "answer") in ("", None)]
    if not missing or not (readers := answer_readers(rewards)):
        return
    raise ValueError(
        f"data.fields.answer: problem {missing[0]!r} has no answer (a prompt-only row), but "
        f"{' and '.join(readers)} read it; {fix}, or set data.fields.answer to the column that "
        "holds it"
    )


def reward_inputs(
    problems: Sequence[Any],
    prompts: Sequence[str],
    rollouts: Any,
    prompt: Any,
    rewards: Any,
    fix: str = GRPO_FIX,
) -> RewardInputs:
    """What ``rewards`` read about ``rollouts`` of ``problems`` (dicts or ``Problem``s, rendered
    by the prompt format ``prompt`` into ``prompts``): each problem's answer and other columns,
    and the messages a conversation prompt was rendered from. Prompt-only problems are refused
    first (:func:`check_answers`). The one builder of the policy's and the teacher's inputs."""
    check_answers(problems, rewards, fix)
    messages = prompt.conversations([_get(p, "question") for p in problems])
    answers, metas = [_get(p, "answer") for p in problems], [_get(p, "meta") for p in problems]
    return RewardInputs.of_rollouts(rollouts, prompts, answers, metas, messages)


def _get(problem: Any, key: str) -> Any:
    return problem.get(key) if isinstance(problem, dict) else getattr(problem, key, None)
