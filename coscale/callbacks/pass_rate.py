"""PassRateEvaluation: re-measures problems' accuracy with K samples and relabels the pools.

The pools decide what each stage trains on (METHOD.md, "Problem pools"). Chunks of problems are
dealt to the ranks and the counts gathered, so every rank records the same outcomes.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

from lightning.pytorch import Callback
from typing_extensions import override

from coscale.callbacks import sft_stage
from coscale.callbacks.sft_stage import at_least, sample_counts
from coscale.pools import Pool
from coscale.rollout.base import SamplingParams

_POOLS = [p.value for p in Pool]
_COLUMNS = ("id", "pool", "acc", "evaluations")


class PassRateEvaluation(Callback):
    """Samples ``k`` completions per problem of ``pools`` and records the accuracy in the pools.

    Logs ``pool/<name>`` of all four pools, ``pool/pass@1`` and ``pool/pass@<k>`` over the
    evaluated problems, and a table (id, pool, acc, evaluations) of every problem under
    ``pool/problems_<tag>`` to loggers that have ``log_table`` (W&B).

    Args:
        k: Samples per problem.
        every_n_epochs: Evaluate when ``(epoch + 1) % every_n_epochs == 0``.
        pools: Pools whose problems are evaluated.
        max_problems: At most this many problems, a new seeded subset each time; None: all.
        temperature: Sampling temperature (overrides the module's ``val_sampling``).
        max_new_tokens: Token limit per sample; None keeps the module's ``val_sampling``.
        on_fit_start: Also evaluate at the start of a fresh fit (``global_step == 0``).
        log_table: Log the per-problem table.
        batch_size: Problems per ``count_correct`` call.
        seed: Base seed of the samples and of the subset.
    """

    def __init__(
        self,
        k: int = 16,
        every_n_epochs: int = 1,
        pools: tuple[str, ...] = ("unsolvable", "solvable", "solved"),
        max_problems: int | None = None,
        temperature: float = 1.0,
        max_new_tokens: int | None = None,
        on_fit_start: bool = False,
        log_table: bool = True,
        batch_size: int = 16,
        seed: int = 0,
    ) -> None:
        super().__init__()
        pools = (pools,) if isinstance(pools, str) else tuple(pools)
        errors = at_least(1, k=k, every_n_epochs=every_n_epochs, batch_size=batch_size)
        errors += at_least(1, optional=True, max_problems=max_problems)
        errors += at_least(1, optional=True, max_new_tokens=max_new_tokens)
        errors += at_least(0, float, temperature=temperature) + at_least(0, seed=seed)
        if not pools or any(p not in _POOLS for p in pools):
            errors.append(f"pools must be a non-empty list from {_POOLS}, got {list(pools)}")
        if errors:
            raise ValueError("PassRateEvaluation: " + "; ".join(errors))
        self.k, self.every_n_epochs, self.pools = k, every_n_epochs, pools
        self.max_problems, self.max_new_tokens = max_problems, max_new_tokens
        self.temperature, self.batch_size, self.seed = temperature, batch_size, seed
        self.at_fit_start, self.log_table = on_fit_start, log_table
        self.evaluations = 0
        self.last_metrics: dict[str, float] = {}

    @override
    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        if self.at_fit_start and trainer.global_step == 0:
            self.evaluate(trainer, pl_module, tag="fit_start")

    @override
    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        epoch = trainer.current_epoch
        if (epoch + 1) % self.every_n_epochs == 0 and sft_stage.datamodule_or_warn(trainer, self):
            self.evaluate(trainer, pl_module, tag=f"epoch_{epoch}", log=False)
            pl_module.log_dict(self.last_metrics, rank_zero_only=True)  # -> callback_metrics too

    def evaluate(
        self, trainer: Any, pl_module: Any, tag: str = "", log: bool = True, datamodule: Any = None
    ) -> dict:
        """Measures the chosen problems now and records them in the pools (same on every rank).

        Args:
            trainer: Gives the datamodule, rank, world size and loggers.
            pl_module: Has ``count_correct(problems, n, sampling)`` and ``val_sampling``.
            tag: Key suffix of the table (default ``eval_<number>``).
            log: Log :attr:`last_metrics` straight to the loggers.
            datamodule: The ProblemDataModule (default: the trainer's; pass it when not fitting).

        Returns:
            ``{problem_id: {"n", "c", "pool"}}`` of the evaluated problems ({} without pools).
        """
        if (dm := sft_stage.datamodule_or_warn(trainer, self, datamodule)) is None:
            return {}
        dm.close_rl_epoch()  # the epoch's RL tally first: this measurement is the last word
        ids = self._chosen(dm)
        problems = [dm.problems[i].to_dict() for i in ids]
        base = getattr(pl_module, "val_sampling", None) or SamplingParams()
        tokens = self.max_new_tokens or base.max_new_tokens
        seed = self.seed * 1_000_003 + self.evaluations * 10_007
        sampling = replace(base, temperature=self.temperature, max_new_tokens=tokens, seed=seed)
        counts = sample_counts(trainer, pl_module, problems, self.k, sampling, self.batch_size)
        results = {}
        for pid, c in zip(ids, counts):
            results[pid] = {"n": self.k, "c": c, "pool": dm.pools.record(pid, self.k, c).value}
        self.evaluations += 1
        self.last_metrics = {f"pool/{name}": float(n) for name, n in dm.pools.counts().items()}
        rates = sft_stage.pass_rates(self.k, counts) if counts else {}
        self.last_metrics |= {f"pool/{key}": value for key, value in rates.items()}
        if self.log_table:
            self._log_table(trainer, dm.pools, tag or f"eval_{self.evaluations}")
        if log:
            sft_stage.log_to_loggers(trainer, self.last_metrics)
        return results

    def _chosen(self, dm: Any) -> list[str]:
        pools = dm.pools  # registration order, whatever the pool
        ids = [i for i in pools.ids() if pools.pool_of(i).value in self.pools and i in dm.problems]
        if self.max_problems is None or len(ids) <= self.max_problems:
            return ids
        rng = random.Random(self.seed * 7_919 + self.evaluations)
        return [ids[i] for i in sorted(rng.sample(range(len(ids)), self.max_problems))]

    def _log_table(self, trainer: Any, pools: Any, tag: str) -> None:
        if not getattr(trainer, "is_global_zero", True):
            return
        rows = [
            [i, pools.pool_of(i).value, pools.accuracy(i), len(pools.history(i))]
            for i in pools.ids()
        ]
        for lg in getattr(trainer, "loggers", []):
            if hasattr(lg, "log_table"):
                lg.log_table(key=f"pool/problems_{tag}", columns=list(_COLUMNS), data=rows)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"evaluations": self.evaluations}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.evaluations = int(state_dict.get("evaluations", 0))
