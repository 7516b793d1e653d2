"""One reward function as a user writes it: coscale's or TRL's signature, sync or ``async def``.

Two calling conventions are accepted, told apart by the function's signature:

* **coscale-style** ``f(completions, answers, **columns)``: called with the completions and the
  gold answers as its first two positional arguments (``MathReward`` is one).
* **TRL-style** ``f(prompts, completions, completion_ids, **columns)``: called by keyword, as
  TRL's ``GRPOTrainer`` calls its reward functions, with the gold answers as ``answer=`` (and
  under the answer column's own name, which travels in the columns), plus ``trainer_state``,
  ``log_extra`` and ``log_metric`` (:mod:`.reward_context`). For a conversational prompt
  (``RewardInputs.prompt_messages`` set) ``prompts`` are the message lists and each completion is
  ``[{"role": "assistant", "content": text}]``, as TRL hands them; otherwise both are text.

The rule: a function is TRL-style when its signature names ``prompts`` or ``completion_ids``, or
names ``completions`` but not ``answers`` (TRL's ``f(completions, solution, **kwargs)``); any other
is coscale-style. ``columns`` are the problem's other dataset columns (``Problem.meta``), one list
entry per completion; a function without ``**kwargs`` gets only the columns it names. A
coscale-style function gets texts, and the step context's arguments only when it names them.

A score of ``None`` (or NaN) means "no opinion" on that completion (TRL's rule); it becomes NaN
here and the weighted sum leaves it out. A function that raises is named, with the index of the
first completion that fails when scored alone, in a :class:`RewardError`.
"""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from coscale.scoring.async_loop import run_concurrently
from coscale.scoring.reward_context import CONTEXT_ARGUMENTS, RewardContext

TRL_NAMES = frozenset({"prompts", "completion_ids"})
"""Parameter names that only a TRL-style function has."""


class RewardError(RuntimeError):
    """A reward function raised, or returned something that is not one score per completion."""


@dataclass(frozen=True)
class RewardInputs:
    """What a reward function may read about R completions, each list with R entries.

    Attributes:
        prompts: The prompt text each completion answers (as the policy saw it).
        completions: The completion texts.
        completion_ids: The completion token ids (up to and including the end token).
        answers: The gold answer of each completion's problem.
        columns: The problem's other dataset columns by name, one value per completion (None
            where that problem has no such column).
        prompt_messages: None when the prompts are text (TRL's standard format). For a
            conversational prompt, the messages each completion's prompt was rendered from
            (system and few-shot turns included, before the chat template), one entry per
            completion: what TRL-style functions get as ``prompts`` (:meth:`trl_arguments`).
    """

    prompts: Sequence[str]
    completions: Sequence[str]
    completion_ids: Sequence[Sequence[int]]
    answers: Sequence[str]
    columns: Mapping[str, Sequence[Any]] = field(default_factory=dict)
    prompt_messages: Sequence[Sequence[Mapping[str, Any]]] | None = None

    @property
    def conversational(self) -> bool:
        """Whether the prompts are message lists (TRL's conversational format)."""
        return self.prompt_messages is not None

    def trl_arguments(self) -> dict[str, Any]:
        """``prompts``, ``completions`` and ``completion_ids`` as TRL's ``GRPOTrainer`` passes
        them: texts, or message lists for a conversational prompt."""
        if self.prompt_messages is None:
            prompts, completions = list(self.prompts), list(self.completions)
        else:
            prompts = [list(messages) for messages in self.prompt_messages]
            completions = [[{"role": "assistant", "content": c}] for c in self.completions]
        ids = [list(ids) for ids in self.completion_ids]
        return {"prompts": prompts, "completions": completions, "completion_ids": ids}

    @classmethod
    def of_rollouts(
        cls,
        rollouts: Any,
        prompts: Sequence[str],
        answers: Sequence[str],
        metas: Sequence[Mapping[str, Any] | None],
        messages: Sequence[Sequence[Mapping[str, Any]]] | None = None,
    ) -> RewardInputs:
        """The inputs of a ``Rollouts`` batch of B prompts (``prompts``, rendered from
        ``messages`` when chat-rendered), given each prompt's gold answer and other columns
        (``metas``, B entries each): one entry per rollout."""
        index = rollouts.prompt_index.tolist()  # [R] prompt of each rollout
        return cls(
            prompts=[prompts[i] for i in index],
            completions=rollouts.texts,
            completion_ids=rollouts.kept_completion_ids(),
            answers=[answers[i] for i in index],
            columns=columns_of([metas[i] or {} for i in index]),
            prompt_messages=None if messages is None else [messages[i] for i in index],
        )

    def __len__(self) -> int:
        return len(self.completions)

    def row(self, i: int) -> RewardInputs:
        """Completion ``i`` alone (to find which completion makes a function raise)."""
        cut = slice(i, i + 1)
        return RewardInputs(
            self.prompts[cut],
            self.completions[cut],
            self.completion_ids[cut],
            self.answers[cut],
            {k: v[cut] for k, v in self.columns.items()},
            None if self.prompt_messages is None else self.prompt_messages[cut],
        )


def columns_of(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """Per-row column mappings -> one list per column name (first-seen order; None if absent)."""
    names = list(dict.fromkeys(k for row in rows for k in row))
    return {name: [row.get(name) for row in rows] for name in names}


def _unwrapped(fn: Any) -> Any:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return fn


def reward_name(fn: Any) -> str:
    """A function's ``__name__``, else its class name (a callable instance)."""
    return getattr(_unwrapped(fn), "__name__", type(_unwrapped(fn)).__name__)


def is_async(fn: Any) -> bool:
    """Whether calling ``fn`` returns a coroutine (an ``async def`` function or ``__call__``)."""
    fn = _unwrapped(fn)
    call = type(fn).__call__ if not inspect.isroutine(fn) else None  # a callable instance's
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)


def calling_style(fn: Any) -> str:
    """``"trl"`` or ``"coscale"``, by the rule in the module docstring."""
    names = set(_parameters(fn))
    if names & TRL_NAMES or ("completions" in names and "answers" not in names):
        return "trl"
    return "coscale"


def _parameters(fn: Any) -> Mapping[str, inspect.Parameter]:
    try:
        return inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature: coscale-style, all columns
        return {"kwargs": inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)}


class RewardFunction:
    """One user reward function, called in its own convention and checked.

    Args:
        fn: The callable.
        setting: How errors name where it was set, e.g. ``reward[1]`` or ``verifier``.
    """

    def __init__(self, fn: Callable[..., Any], setting: str = "reward") -> None:
        if not callable(fn):
            raise ValueError(f"{setting} must be callable, got {type(fn).__name__} {fn!r}")
        self.fn, self.setting = fn, setting
        self.name, self.style, self.is_async = reward_name(fn), calling_style(fn), is_async(fn)
        params = _parameters(fn).values()
        self._takes_all = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
        self._named = {p.name for p in params}

    @property
    def parameter_names(self) -> frozenset[str]:
        """The names the function's signature lists (its ``**kwargs`` left out)."""
        return frozenset(self._named) - {
            p.name for p in _parameters(self.fn).values() if p.kind is p.VAR_KEYWORD
        }

    def _call(self, inputs: RewardInputs, context: RewardContext) -> Any:
        """The raw call (a coroutine for an async function)."""
        columns, step = dict(inputs.columns), context.arguments()
        if self.style == "trl":
            fixed = inputs.trl_arguments()
            if any(inputs.answers):  # prompt-only rows have none (coscale.scoring.answers)
                fixed["answer"] = list(inputs.answers)
            return self.fn(**self._accepted(columns | step | fixed))
        rest = {k: v for k, v in columns.items() if k not in ("completions", "answers")}
        rest = self._accepted(rest) | {k: step[k] for k in CONTEXT_ARGUMENTS if k in self._named}
        return self.fn(list(inputs.completions), list(inputs.answers), **rest)

    def _accepted(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        return kwargs if self._takes_all else {k: v for k, v in kwargs.items() if k in self._named}

    def score(self, inputs: RewardInputs, context: RewardContext | None = None) -> list[float]:
        """Scores, NaN for "no opinion"; :class:`RewardError` if it fails. An async function is
        awaited on the reward event loop (:mod:`.async_loop`). ``context``: the step's state and
        log sinks (None: a fresh :class:`~.reward_context.RewardContext`)."""
        context = context or RewardContext()
        if self.is_async:
            return run_concurrently([self.ascore(inputs, context)])[0]
        try:
            out = self._call(inputs, context)
        except Exception as err:
            alone = context.detached()  # the repeats' logs do not count
            call = functools.partial(self._call, context=alone)
            failing = next((i for i in range(len(inputs)) if _raises(call, inputs, i)), None)
            raise self._error(err, failing, len(inputs)) from err
        return self.checked(out, len(inputs))

    async def ascore(self, inputs: RewardInputs, context: RewardContext) -> list[float]:
        """:meth:`score` of an ``async def`` function, awaited."""
        try:
            out = await self._call(inputs, context)
        except Exception as err:
            failing, alone = None, context.detached()
            for i in range(len(inputs)):
                try:
                    await self._call(inputs.row(i), alone)
                except Exception:
                    failing = i
                    break
            raise self._error(err, failing, len(inputs)) from err
        return self.checked(out, len(inputs))

    def _error(self, err: Exception, failing: int | None, n: int) -> RewardError:
        where = (
            f"on completion {failing} of {n}"
            if failing is not None
            else f"on the batch of {n} completions (each alone scores without error)"
        )
        return RewardError(
            f"reward function {self.name!r} ({self.setting}) raised {where}: "
            f"{type(err).__name__}: {err}"
        )

    def checked(self, out: Any, n: int) -> list[float]:
        """``out`` as ``n`` floats (None and NaN -> NaN), or a :class:`RewardError` naming the
        function and the first bad entry."""
        scores = list(out) if isinstance(out, (list, tuple)) else None
        if scores is None or len(scores) != n:
            got = f"{len(scores)} scores" if scores is not None else type(out).__name__
            raise RewardError(
                f"reward function {self.name!r} ({self.setting}) returned {got} for {n} "
                "completions: it must return a list with one score (or None) per completion"
            )
        return [self._number(value, i) for i, value in enumerate(scores)]

    def _number(self, value: Any, i: int) -> float:
        if value is None:
            return math.nan
        try:
            number = float(value)
        except (TypeError, ValueError):
            number = None
        if number is None or math.isinf(number) or isinstance(value, str):
            raise RewardError(
                f"reward function {self.name!r} ({self.setting}) scored completion {i} "
                f"{value!r}: a score must be a finite number or None"
            )
        return number


def _raises(call: Callable[[RewardInputs], Any], inputs: RewardInputs, i: int) -> bool:
    try:
        call(inputs.row(i))
    except Exception:
        return True
    return False
