"""RolloutNSchedule: Rollout N per difficulty group, raised when a group's RL stalls.

Solvable problems are put in ``num_groups`` equal-width accuracy bins over ``[low, high)`` of
the pools (group 0 = hardest) when they first become solvable and keep that group. Each group
shares one N (METHOD.md idea 2): in ``plateau`` mode N x ``factor`` (up to ``n_max``) once the
group's mean RL accuracy has not beaten its best by more than ``min_delta`` for ``patience``
epochs; in ``lr_ratio`` mode the smallest N with ``lr / N_eff(p_g, N) <= target`` (theory.py).
Decisions depend only on datamodule state that is identical on every rank; rank 0's table is
broadcast anyway.
"""

from __future__ import annotations

import math
from typing import Any

from lightning.pytorch import Callback
from typing_extensions import override

from coscale.callbacks.sft_stage import datamodule_or_warn
from coscale.modules.distributed import broadcast_object
from coscale.pools import Pool
from coscale.theory import effective_rollouts, n_for_lr_ratio


class RolloutNSchedule(Callback):
    """Groups solvable problems by difficulty and writes each group's N to the datamodule.

    Args:
        num_groups: Number of difficulty groups.
        n_init: Starting N of every group.
        factor: Growth of a stalled group's N (rounded half up, at least +1 when > 1).
        n_max: Cap on N.
        patience: Epochs without improvement before N grows.
        min_delta: Improvement of the group's mean accuracy that counts as progress.
        mode: ``plateau`` or ``lr_ratio``.
        target_lr_over_n_eff: Target of ``lr / N_eff`` (required in ``lr_ratio`` mode).
        n_min: Floor on N in ``lr_ratio`` mode.
    """

    def __init__(
        self, num_groups: int = 3, n_init: int = 8, factor: float = 2.0, n_max: int = 64,
        patience: int = 1, min_delta: float = 0.0, mode: str = "plateau",
        target_lr_over_n_eff: float | None = None, n_min: int = 2,
    ) -> None:
        super().__init__()
        errors = [f"{name} must be an int >= 1, got {v!r}" for name, v in [("num_groups", num_groups),
                  ("n_init", n_init), ("n_max", n_max), ("patience", patience), ("n_min", n_min)]
                  if isinstance(v, bool) or not isinstance(v, int) or v < 1]
        if not errors and (n_min > n_max or n_init > n_max):
            errors.append(f"n_min <= n_max and n_init <= n_max required, got n_min={n_min}, n_init={n_init}, n_max={n_max}")
        if not _number(factor) or factor < 1:
            errors.append(f"factor must be a number >= 1, got {factor!r}")
        if not _number(min_delta) or min_delta < 0:
            errors.append(f"min_delta must be a number >= 0, got {min_delta!r}")
        if mode not in ("plateau", "lr_ratio"):
            errors.append(f"mode must be 'plateau' or 'lr_ratio', got {mode!r}")
        target = target_lr_over_n_eff
        if (target is None and mode == "lr_ratio") or (target is not None and not (_number(target) and target > 0)):
            errors.append(f"target_lr_over_n_eff must be a number > 0 (required by mode='lr_ratio'), got {target_lr_over_n_eff!r}")
        if errors:
            raise ValueError("RolloutNSchedule: " + "; ".join(errors))
        self.num_groups, self.n_init, self.factor, self.n_max = num_groups, n_init, factor, n_max
        self.patience, self.min_delta, self.mode = patience, min_delta, mode
        self.target, self.n_min = target_lr_over_n_eff, n_min
        self.n = [n_init] * num_groups  # N of each group
        self.best: list[float | None] = [None] * num_groups  # best mean accuracy so far
        self.bad = [0] * num_groups  # epochs since the last improvement

    def group_for(self, acc: float, low: float, high: float) -> int:
        """Equal-width bin of ``acc`` over ``[low, high)``; 0 is the hardest, ends clamped."""
        return min(self.num_groups - 1, max(0, math.floor((acc - low) / ((high - low) / self.num_groups))))

    @override
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        dm = datamodule_or_warn(trainer, self)
        if dm is not None:
            self._assign(dm)
            if self.mode == "lr_ratio":
                self._lr_ratio(pl_module, self._group_p(dm, [None] * self.num_groups))
            self._sync_and_write(dm)

    @override
    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        dm = datamodule_or_warn(trainer, self)
        if dm is None:
            return
        dm.close_rl_epoch()  # no-op when already closed; last_epoch_acc holds this epoch's RL
        rewards = self._group_means(dm, dm.last_epoch_acc)
        if self.mode == "plateau":
            self._plateau(rewards)
        else:
            self._lr_ratio(pl_module, self._group_p(dm, rewards))
        self._assign(dm)
        self._sync_and_write(dm)
        self._log(pl_module, rewards, self._group_p(dm, rewards))

    def _plateau(self, rewards: list[float | None]) -> None:
        for g, reward in enumerate(rewards):
            if reward is None:  # the group did not train this epoch
                continue
            if self.best[g] is None or reward > self.best[g] + self.min_delta:
                self.best[g], self.bad[g] = reward, 0
                continue
            self.bad[g] += 1
            if self.bad[g] >= self.patience:
                grown = max(math.floor(self.n[g] * self.factor + 0.5), self.n[g] + int(self.factor > 1))
                self.n[g], self.bad[g] = min(grown, self.n_max), 0

    def _lr_ratio(self, pl_module: Any, p: list[float | None]) -> None:
        lr = getattr(pl_module, "lr", None)
        if not _number(lr) or lr <= 0:
            raise ValueError(f"RolloutNSchedule(mode='lr_ratio') needs pl_module.lr > 0, got {lr!r}")
        for g, p_g in enumerate(p):
            if p_g is not None:
                self.n[g] = n_for_lr_ratio(lr, p_g, self.target, self.n_max, self.n_min)

    def _assign(self, dm: Any) -> None:
        """Groups solvable problems that have none (or one outside this schedule's range)."""
        for pid in dm.pools.members(Pool.SOLVABLE):
            if not 0 <= dm.group_of.get(pid, -1) < self.num_groups:
                dm.group_of[pid] = self.group_for(dm.pools.accuracy(pid), dm.pools.low, dm.pools.high)

    def _group_means(self, dm: Any, acc: dict[str, float]) -> list[float | None]:
        values: list[list[float]] = [[] for _ in range(self.num_groups)]
        for pid, a in acc.items():
            if 0 <= dm.group_of.get(pid, -1) < self.num_groups:
                values[dm.group_of[pid]].append(a)
        return [sum(v) / len(v) if v else None for v in values]

    def _group_p(self, dm: Any, rewards: list[float | None]) -> list[float | None]:
        """The epoch's RL accuracy of a group, else the latest accuracy of its solvable members."""
        solvable = dm.pools.members(Pool.SOLVABLE)
        fallback = self._group_means(dm, {pid: dm.pools.accuracy(pid) for pid in solvable})
        return [r if r is not None else f for r, f in zip(rewards, fallback)]

    def _sync_and_write(self, dm: Any) -> None:
        self.n, self.best, self.bad, groups = broadcast_object((self.n, self.best, self.bad, dict(dm.group_of)))
        dm.group_of.clear()
        dm.group_of.update(groups)
        for pid, g in groups.items():
            if 0 <= g < self.num_groups:
                dm.n_per_problem[pid] = self.n[g]

    def _log(self, pl_module: Any, rewards: list[float | None], p: list[float | None]) -> None:
        lr, metrics = getattr(pl_module, "lr", None), {}
        for g in range(self.num_groups):
            metrics[f"sched/n_group{g}"] = float(self.n[g])
            if rewards[g] is not None:
                metrics[f"sched/reward_group{g}"] = rewards[g]
            if p[g] is not None:
                n_eff = effective_rollouts(p[g], self.n[g])
                metrics[f"sched/n_eff_group{g}"] = n_eff
                if _number(lr) and n_eff > 0:
                    metrics[f"sched/lr_over_n_eff_group{g}"] = lr / n_eff
        pl_module.log_dict(metrics, rank_zero_only=True)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"n": list(self.n), "best": list(self.best), "bad": list(self.bad)}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if any(len(state_dict[key]) != self.num_groups for key in ("n", "best", "bad")):
            raise ValueError(f"RolloutNSchedule: saved state has {len(state_dict['n'])} groups, num_groups={self.num_groups}")
        self.n, self.best, self.bad = list(state_dict["n"]), list(state_dict["best"]), list(state_dict["bad"])


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
