"""RolloutNSchedule: one Rollout N per difficulty group, raised when a group's RL stalls.

A problem gets a group when it first becomes solvable: equal-width accuracy bins over
``[low, high)`` of the pools, group 0 the hardest (METHOD.md idea 2). ``plateau``: N x ``factor``
once the group's mean RL accuracy has not beaten its best by > ``min_delta`` for ``patience``
epochs. ``lr_ratio``: the smallest N with ``lr / N_eff(p_g, N) <= target`` (coscale.theory).
Decisions use only datamodule state, the same on every rank; rank 0's are broadcast anyway.
"""

from __future__ import annotations

import math
from typing import Any

from lightning.pytorch import Callback
from typing_extensions import override

from coscale.callbacks.sft_stage import at_least, datamodule_or_warn, is_number
from coscale.modules.distributed import broadcast_object
from coscale.pools import Pool
from coscale.theory import effective_rollouts, n_for_lr_ratio


class RolloutNSchedule(Callback):
    """Groups solvable problems by difficulty; writes ``dm.group_of`` and ``dm.n_per_problem``.

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
    """

    def __init__(
        self,
        num_groups: int = 3,
        n_init: int = 8,
        factor: float = 2.0,
        n_max: int = 64,
        patience: int = 1,
        min_delta: float = 0.0,
        mode: str = "plateau",
        target_lr_over_n_eff: float | None = None,
        n_min: int = 2,
    ) -> None:
        super().__init__()
        errors = at_least(1, num_groups=num_groups, n_init=n_init, patience=patience, n_min=n_min)
        errors += at_least(1 if errors else max(n_min, n_init), n_max=n_max)
        errors += at_least(1, float, factor=factor) + at_least(0, float, min_delta=min_delta)
        if mode not in ("plateau", "lr_ratio"):
            errors.append(f"mode must be 'plateau' or 'lr_ratio', got {mode!r}")
        if target_lr_over_n_eff is not None or mode == "lr_ratio":  # required by lr_ratio
            errors += at_least(0, float, strict=True, target_lr_over_n_eff=target_lr_over_n_eff)
        if errors:
            raise ValueError("RolloutNSchedule: " + "; ".join(errors))
        self.num_groups, self.factor, self.n_max, self.n_min = num_groups, factor, n_max, n_min
        self.patience, self.min_delta, self.mode = patience, min_delta, mode
        self.target = target_lr_over_n_eff
        self.n = [n_init] * num_groups  # N of each group
        self.best: list[float | None] = [None] * num_groups  # best mean accuracy so far
        self.bad = [0] * num_groups  # epochs since the last improvement

    def group_for(self, acc: float, low: float, high: float) -> int:
        """Equal-width bin of ``acc`` over ``[low, high)``; 0 is the hardest, ends clamped."""
        g = math.floor((acc - low) * self.num_groups / (high - low))
        return min(self.num_groups - 1, max(0, g))

    @override
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if (dm := datamodule_or_warn(trainer, self)) is not None:
            self._decide(dm, pl_module, [None] * self.num_groups)

    @override
    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if (dm := datamodule_or_warn(trainer, self)) is None:
            return
        dm.close_rl_epoch()  # a no-op when closed already: last_epoch_acc is this epoch's RL
        rewards = self._group_means(dm, dm.last_epoch_acc)
        if self.mode == "plateau":
            self._plateau(rewards)
        p = self._decide(dm, pl_module, rewards)
        metrics = {f"sched/n_group{g}": float(n) for g, n in enumerate(self.n)}
        metrics |= {f"sched/reward_group{g}": r for g, r in enumerate(rewards) if r is not None}
        for g, n_eff in (
            (g, effective_rollouts(p_g, self.n[g])) for g, p_g in enumerate(p) if p_g is not None
        ):
            metrics[f"sched/n_eff_group{g}"] = n_eff
            if n_eff > 0 and is_number(lr := getattr(pl_module, "lr", None)):
                metrics[f"sched/lr_over_n_eff_group{g}"] = lr / n_eff
        pl_module.log_dict(metrics, rank_zero_only=True)

    def _plateau(self, rewards: list[float | None]) -> None:
        for g, reward in enumerate(rewards):
            if reward is None:  # the group did not train this epoch
                continue
            if self.best[g] is None or reward > self.best[g] + self.min_delta:
                self.best[g], self.bad[g] = reward, 0
                continue
            self.bad[g] += 1
            if self.bad[g] >= self.patience and self.factor > 1:
                grown = max(math.floor(self.n[g] * self.factor + 0.5), self.n[g] + 1)
                self.n[g], self.bad[g] = min(grown, self.n_max), 0

    def _decide(self, dm: Any, pl_module: Any, rewards: list[float | None]) -> list[float | None]:
        """Groups new solvable problems, sets N (lr_ratio), broadcasts, writes N; returns p_g."""
        pools = dm.pools
        for pid in pools.members(Pool.SOLVABLE):
            if not 0 <= dm.group_of.get(pid, -1) < self.num_groups:
                dm.group_of[pid] = self.group_for(pools.accuracy(pid), pools.low, pools.high)
        latest = {pid: pools.accuracy(pid) for pid in pools.members(Pool.SOLVABLE)}
        p = [r if r is not None else a for r, a in zip(rewards, self._group_means(dm, latest))]
        if self.mode == "lr_ratio":
            lr = getattr(pl_module, "lr", None)
            if errors := at_least(0, float, strict=True, **{"pl_module.lr": lr}):
                raise ValueError("RolloutNSchedule(mode='lr_ratio'): " + errors[0])
            self.n = [
                n if p_g is None else n_for_lr_ratio(lr, p_g, self.target, self.n_max, self.n_min)
                for n, p_g in zip(self.n, p)
            ]
        decided = (self.n, self.best, self.bad, dict(dm.group_of))
        self.n, self.best, self.bad, groups = broadcast_object(decided)
        dm.group_of.update(groups)
        for pid, g in groups.items():
            if 0 <= g < self.num_groups:
                dm.n_per_problem[pid] = self.n[g]
        return p

    def _group_means(self, dm: Any, acc: dict[str, float]) -> list[float | None]:
        """Mean of ``acc`` over each group's problems (None for a group without any)."""
        values: list[list[float]] = [[] for _ in range(self.num_groups)]
        for pid, a in acc.items():
            if 0 <= (g := dm.group_of.get(pid, -1)) < self.num_groups:
                values[g].append(a)
        return [sum(v) / len(v) if v else None for v in values]

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"n": list(self.n), "best": list(self.best), "bad": list(self.bad)}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if any(len(state_dict[key]) != self.num_groups for key in ("n", "best", "bad")):
            raise ValueError(f"RolloutNSchedule: state is not for num_groups={self.num_groups}")
        self.n, self.best, self.bad = (list(state_dict[k]) for k in ("n", "best", "bad"))
