"""The shaped reward (several weighted functions) and the verifier (correctness), scored together.

GRPO's advantages use the **reward**: the weighted sum of the reward functions' scores, each
function's ``None`` ("no opinion") left out of the sum, as TRL sums with ``nansum``. Which
completions are **correct** (the pools, pass-rate measurement, the solution bank, the replay
buffer) is the **verifier's** call: a completion is correct when the verifier scores it
``>= 1.0`` (:data:`CORRECT_AT`, :func:`is_correct`). A format bonus in the reward therefore
moves advantages, never a pool label.

Which verifier, when none is given (:func:`default_verifier`):

* no reward either: ``MathReward()``, whose score is also the reward (the defaults);
* one reward function: that function (the reward decides correctness);
* several: the first ``MathReward`` among them, else a new ``MathReward()``.

And with a verifier but no reward, the verifier's score is the reward. A verifier that is also
one of the reward functions (the same object) is called once. ``async def`` functions of one
step run concurrently on one event loop (:mod:`.async_loop`); the others run in turn, in the
caller's thread, before them.

A reward model is one entry of the list, as in TRL (:mod:`.reward_model`: a ``RewardModel``, or
a folder, hub id or ``transformers`` model that becomes one). Each call may carry the step's
context (:mod:`.reward_context`): given to :meth:`RewardSet.score`, or set by :meth:`using`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from coscale.checks import is_number
from coscale.scoring.async_loop import run_concurrently
from coscale.scoring.reward_context import RewardContext
from coscale.scoring.reward_functions import RewardFunction, RewardInputs
from coscale.scoring.reward_model import as_reward, is_model_spec

RewardSpec = Callable[..., Any]
"""A reward function or verifier: coscale-style or TRL-style (:mod:`.reward_functions`)."""


@dataclass(frozen=True)
class Scores:
    """The scores of R completions.

    Attributes:
        reward: Weighted sum of the reward functions, ``[R]`` float32 (0 where no function
            has an opinion).
        per_function: Each reward function's score, ``[R, F]`` float32; NaN: no opinion.
        names: The F functions' names (``train/rewards/<name>``).
        correct: Whether the verifier scored the completion ``>= 1.0``, ``[R]`` bool.
    """

    reward: Tensor
    per_function: Tensor
    names: tuple[str, ...]
    correct: Tensor

    @property
    def scorable(self) -> Tensor:
        """``[R]`` bool: some reward function has an opinion on the completion."""
        return ~torch.isnan(self.per_function).all(dim=1)

    def means(self) -> dict[str, float]:
        """Each function's mean over the completions it scored (functions that scored none are
        left out)."""
        scored = ~torch.isnan(self.per_function)  # [R, F]
        return {
            name: float(self.per_function[scored[:, f], f].mean())
            for f, name in enumerate(self.names)
            if scored[:, f].any()
        }


def as_list(reward: Any) -> list[Any]:
    """``reward`` as a list of functions (None: none; one callable: a list of one)."""
    if reward is None:
        return []
    return list(reward) if isinstance(reward, (list, tuple)) else [reward]


def reward_errors(reward: Any, reward_weights: Any, verifier: Any = None) -> list[str]:
    """Every problem with the ``reward`` / ``reward_weights`` / ``verifier`` settings (functions,
    or YAML's ``class_path`` mappings), each message naming the setting."""
    functions = as_list(reward)
    if isinstance(reward, (list, tuple)) and not functions:
        return ["reward is an empty list: give one function or more, or leave it unset"]
    named = [(f"reward[{i}]", fn) for i, fn in enumerate(functions)] + [("verifier", verifier)]
    errors = [
        _not_a_reward(name, fn)
        for name, fn in named
        if fn is not None and not (callable(fn) or is_model_spec(fn) or _is_class_path(fn))
    ]
    if reward_weights is None:
        return errors
    if not isinstance(reward_weights, (list, tuple)):
        return [*errors, f"reward_weights must be a list of numbers, got {reward_weights!r}"]
    errors += [
        f"reward_weights[{i}] must be a finite number, got {w!r}"
        for i, w in enumerate(reward_weights)
        if not is_number(w)
    ]
    count = max(len(functions), 1)  # unset: the one default reward
    if len(reward_weights) != count:
        errors.append(
            f"reward_weights has {_count(len(reward_weights), 'weight')} but reward has "
            f"{_count(count, 'function')}: give one weight per reward function"
        )
    return errors


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' * (n != 1)}"


def _not_a_reward(name: str, value: Any) -> str:
    if isinstance(value, str):
        return (
            f"{name}={value!r} is no importable function (a dotted path), no existing folder of "
            "a reward model and no hub id (owner/name)"
        )
    return (
        f"{name} must be callable, a class_path or a reward model (a folder or hub id), got "
        f"{type(value).__name__} {value!r}"
    )


def _is_class_path(value: Any) -> bool:
    return isinstance(value, dict) and "class_path" in value


def default_verifier(reward: Any, verifier: Any = None) -> Any:
    """The verifier used when ``verifier`` is None (the rule in the module docstring)."""
    if verifier is not None:
        return verifier
    from coscale.scoring.rewards import MathReward

    functions = as_list(reward)
    if len(functions) == 1:
        return functions[0]
    return next((f for f in functions if isinstance(f, MathReward)), None) or MathReward()


class RewardSet:
    """Reward functions with their weights, and the verifier.

    Args:
        reward: One reward function or a list (None: the verifier's score is the reward).
        reward_weights: One weight per reward function (None: all 1.0).
        verifier: Decides correctness (None: :func:`default_verifier`).

    The settings are checked by :func:`reward_errors` where they come in (the modules'
    ``settings_errors``, which the pipeline runs on its YAML before any work); here each
    function is only wrapped (:class:`~.reward_functions.RewardFunction` refuses one that is
    not callable, for a ``RewardSet`` built in Python).
    """

    def __init__(
        self,
        reward: RewardSpec | Sequence[RewardSpec] | None = None,
        reward_weights: Sequence[float] | None = None,
        verifier: RewardSpec | None = None,
    ) -> None:
        reward, verifier = _built(reward, verifier)
        self.verifier_fn = default_verifier(reward, verifier)
        raw = as_list(reward) or [self.verifier_fn]
        self.functions = [RewardFunction(fn, f"reward[{i}]") for i, fn in enumerate(raw)]
        self.names = _unique([f.name for f in self.functions])
        weights = reward_weights if reward_weights is not None else [1.0] * len(raw)
        self.weights = torch.tensor([float(w) for w in weights], dtype=torch.float32)  # [F]
        same = [i for i, fn in enumerate(raw) if fn is self.verifier_fn]
        self._verifier_column = same[0] if same else None
        self.verifier = RewardFunction(self.verifier_fn, "verifier")
        self._context: RewardContext | None = None

    @contextmanager
    def using(self, context: RewardContext) -> Iterator[RewardContext]:
        """Scoring calls inside the block that are given no context use ``context``: how a
        training step hands its state and log sinks to the scoring its sampling does."""
        self._context = context
        try:
            yield context
        finally:
            self._context = None

    def score(self, inputs: RewardInputs, context: RewardContext | None = None) -> Scores:
        """Every reward function and the verifier on ``inputs`` (the verifier once).

        Args:
            inputs: What the functions read about the R completions.
            context: The step's state, log sinks and device (:mod:`.reward_context`); None: the
                one set by :meth:`using`, else a fresh one.
        """
        extra = [self.verifier] if self._verifier_column is None else []
        columns = run_all([*self.functions, *extra], inputs, self._context_for(context))
        per_function = torch.tensor(columns[: len(self.functions)], dtype=torch.float32)
        per_function = per_function.reshape(len(self.functions), len(inputs)).T  # [R, F]
        verdict = columns[-1] if extra else columns[self._verifier_column]
        reward = (per_function * self.weights.unsqueeze(0)).nansum(dim=1)  # [R] TRL's sum
        return Scores(reward, per_function, tuple(self.names), is_correct(verdict))

    def verify(self, inputs: RewardInputs, context: RewardContext | None = None) -> Tensor:
        """``[R]`` bool: the verifier alone (measurement needs no shaped reward)."""
        return is_correct(run_all([self.verifier], inputs, self._context_for(context))[0])

    def _context_for(self, context: RewardContext | None) -> RewardContext:
        """The call's context; reward models are moved to its device first."""
        context = context or self._context or RewardContext()
        if context.device is not None:
            for f in [*self.functions, self.verifier]:
                if hasattr(f.fn, "to_device"):  # a RewardModel: scores on the policy's device
                    f.fn.to_device(context.device)
        return context


def _built(reward: Any, verifier: Any) -> tuple[list[Any] | None, Any]:
    """``reward`` and ``verifier`` with reward models built (:func:`.reward_model.as_reward`),
    once per object: a verifier that is one of the rewards stays the same object."""
    built: dict[int, Any] = {}
    for fn in [*as_list(reward), verifier]:
        if fn is not None and id(fn) not in built:
            built[id(fn)] = as_reward(fn)
    rewards = [built[id(fn)] for fn in as_list(reward)] or None
    return rewards, None if verifier is None else built[id(verifier)]


CORRECT_AT = 1.0
"""A completion is correct when the verifier scores it at least this (the module docstring)."""


def is_correct(scores: Sequence[float]) -> Tensor:
    """``[R]`` bool of ``[R]`` verifier scores; NaN (no opinion) is not correct."""
    return torch.tensor(scores, dtype=torch.float32) >= CORRECT_AT


def correct_per_prompt(prompt_index: Tensor, correct: Tensor, num_prompts: int) -> list[int]:
    """Correct rollouts of each of B prompts: ``prompt_index`` and ``correct`` are ``[R]``."""
    counts = torch.zeros(num_prompts, dtype=torch.long)  # [B]
    counts.index_add_(0, prompt_index.cpu(), correct.long().cpu())
    return counts.tolist()


def _unique(names: list[str]) -> list[str]:
    """``names`` with the second ``x`` renamed ``x_2``, the third ``x_3``, ..."""
    seen: dict[str, int] = {}
    out = []
    for name in names:
        seen[name] = seen.get(name, 0) + 1
        out.append(name if seen[name] == 1 else f"{name}_{seen[name]}")
    return out


def run_all(
    functions: Sequence[RewardFunction], inputs: RewardInputs, context: RewardContext
) -> list[list[float]]:
    """Each function's scores: sync ones in turn, then the async ones together on the loop."""
    out = [None if f.is_async else f.score(inputs, context) for f in functions]
    pending = [i for i, f in enumerate(functions) if f.is_async]
    if pending:  # no async function: the loop is never started
        results = run_concurrently([functions[i].ascore(inputs, context) for i in pending])
        for i, scores in zip(pending, results):
            out[i] = scores
    return out  # type: ignore[return-value]
