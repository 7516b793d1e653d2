"""Rollout N per difficulty group: the computation-scaling rule of CoScale-RL, without Lightning.

A problem gets a group when it is first seen solvable: equal-width accuracy bins over
``[low, high)`` of the pools, group 0 the hardest (docs/method.md, computation scaling). Two ways to set each
group's N:

* ``plateau``: N x ``factor`` once the group's mean RL accuracy has not beaten its best by more
  than ``min_delta`` for ``patience`` epochs;
* ``lr_ratio``: the smallest N with ``lr / N_eff(p_g, N) <= target`` (:mod:`coscale.rl.theory`).

:class:`NSchedule` holds the settings and the running state (N, best, epochs without gain) of
every group; the :class:`~coscale.loop.curriculum.Curriculum` owns one and saves its state.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from typing import Any

from coscale.checks import at_least
from coscale.rl.theory import n_for_lr_ratio

MODES = ("plateau", "lr_ratio")
N_INIT = 8
"""Rollout N of a problem nothing else sets: the one default (a schedule's ``n_init``)."""


class NSchedule:
    """One Rollout N per difficulty group.

    Args:
        num_groups: Number of difficulty groups.
        n_init: Starting N of every group.
        factor: Growth of a stalled group's N (rounded half up, at least +1 when > 1).
        n_max: Cap on N.
        patience: Epochs without improvement before N grows.
        min_delta: Gain of the group's mean accuracy over its best that counts as progress.
        mode: ``plateau`` or ``lr_ratio``.
        target_lr_over_n_eff: Target of ``lr / N_eff`` (required in ``lr_ratio`` mode).
        n_min: Floor on N in ``lr_ratio`` mode.

    Raises:
        ValueError: Naming every bad setting at once.
    """

    def __init__(
        self,
        num_groups: int = 3,
        n_init: int = N_INIT,
        factor: float = 2.0,
        n_max: int = 64,
        patience: int = 1,
        min_delta: float = 0.0,
        mode: str = "plateau",
        target_lr_over_n_eff: float | None = None,
        n_min: int = 2,
    ) -> None:
        args = (num_groups, n_init, factor, n_max, patience, min_delta, mode, target_lr_over_n_eff)
        if errors := _errors(*args, n_min):
            raise ValueError("schedule: " + "; ".join(errors))
        self.num_groups, self.factor, self.n_max, self.n_min = num_groups, factor, n_max, n_min
        self.patience, self.min_delta, self.mode = patience, min_delta, mode
        self.target, self.n_init = target_lr_over_n_eff, n_init
        self.reset()

    def reset(self) -> None:
        """Every group back to ``n_init`` with no history: what a new RL stage starts from."""
        self.n = [self.n_init] * self.num_groups  # N of each group
        self.best: list[float | None] = [None] * self.num_groups  # best mean accuracy so far
        self.stalled = [0] * self.num_groups  # epochs since the last improvement

    def group_for(self, acc: float, low: float, high: float) -> int:
        """Equal-width bin of ``acc`` over ``[low, high)``; 0 is the hardest, ends clamped."""
        g = math.floor((acc - low) * self.num_groups / (high - low))
        return min(self.num_groups - 1, max(0, g))

    def step(self, rewards: Sequence[float | None]) -> None:
        """One epoch of the plateau rule over the groups' mean RL accuracies (None: not trained)."""
        if self.mode != "plateau":
            return
        for g, reward in enumerate(rewards):
            if reward is None:
                continue
            if self.best[g] is None or reward > self.best[g] + self.min_delta:
                self.best[g], self.stalled[g] = reward, 0
                continue
            self.stalled[g] += 1
            if self.stalled[g] >= self.patience and self.factor > 1:
                grown = max(math.floor(self.n[g] * self.factor + 0.5), self.n[g] + 1)
                self.n[g], self.stalled[g] = min(grown, self.n_max), 0

    def fit_to_lr(self, lr: float | None, p: Sequence[float | None]) -> None:
        """``lr_ratio`` mode: each group's N from its accuracy ``p[g]`` and the learning rate."""
        if self.mode != "lr_ratio":
            return
        if errors := at_least(0, float, strict=True, lr=lr):
            raise ValueError(
                "schedule (mode='lr_ratio') needs the policy's learning rate: " + errors[0]
            )
        self.n = [
            n if p_g is None else n_for_lr_ratio(lr, p_g, self.target, self.n_max, self.n_min)
            for n, p_g in zip(self.n, p)
        ]

    def state_dict(self) -> dict[str, Any]:
        return {"n": list(self.n), "best": list(self.best), "stalled": list(self.stalled)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        state = {"stalled": state.get("bad"), **state}  # "bad": its name in earlier releases
        if any(len(state[key]) != self.num_groups for key in ("n", "best", "stalled")):
            raise ValueError(f"schedule: saved state is not for num_groups={self.num_groups}")
        self.n, self.best, self.stalled = (list(state[k]) for k in ("n", "best", "stalled"))


def schedule_errors(*args: Any, **kwargs: Any) -> list[str]:
    """Every bad :class:`NSchedule` setting among ``args`` / ``kwargs`` (its defaults for the
    rest), named, without building one."""
    bound = inspect.signature(NSchedule).bind(*args, **kwargs)
    bound.apply_defaults()
    return _errors(**bound.arguments)


def _errors(
    num_groups, n_init, factor, n_max, patience, min_delta, mode, target_lr_over_n_eff, n_min
) -> list[str]:
    errors = at_least(1, num_groups=num_groups, n_init=n_init, patience=patience, n_min=n_min)
    errors += at_least(1 if errors else max(n_min, n_init), n_max=n_max)
    errors += at_least(1, float, factor=factor) + at_least(0, float, min_delta=min_delta)
    if mode not in MODES:
        errors.append(f"mode must be one of {', '.join(MODES)}; got {mode!r}")
    if target_lr_over_n_eff is not None or mode == "lr_ratio":  # required by lr_ratio
        errors += at_least(0, float, strict=True, target_lr_over_n_eff=target_lr_over_n_eff)
    return errors
