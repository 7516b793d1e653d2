"""PassRateEvaluation: re-measures problems' accuracy with K samples at chosen epochs.

A thin adapter for a user's own ``Trainer``: the sampling and the rule live in
:func:`coscale.stages.measure.measure` and the curriculum. At the end of a chosen epoch it
closes the epoch's RL tally first (once, shared with the module), then measures, so the
measurement is the last word on each problem's pool.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Callback
from typing_extensions import override

from coscale.checks import at_least
from coscale.loop.pools import Pool
from coscale.modules.feed import curriculum_of, epoch_finished
from coscale.modules.loggers import log_to_loggers
from coscale.stages.measure import measure

_POOLS = [p.value for p in Pool]
_COLUMNS = ("id", "pool", "acc", "evaluations")


class PassRateEvaluation(Callback):
    """Samples ``k`` completions per problem of ``pools`` and records the accuracy.

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
        seed: Base seed of the samples.
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
        self.last_metrics: dict[str, float] = {}

    @override
    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        fresh = trainer.global_step == 0 and not getattr(trainer, "ckpt_path", None)
        cur = curriculum_of(pl_module) if self.at_fit_start and fresh else None
        if cur is not None and cur.pending_epoch() is None:
            self.evaluate(trainer, pl_module, tag="fit_start")

    @override
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        # after the checkpoint is restored under every strategy (FSDP2 restores it after
        # on_fit_start); a fit resumed finished never gets here, and has nothing left to do
        cur = curriculum_of(pl_module)
        if cur is not None and (epoch := cur.pending_epoch()) is not None:
            self._epoch_end(trainer, pl_module, epoch, log=True)  # restored before its end work

    @override
    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if epoch_finished(trainer):
            self._epoch_end(trainer, pl_module, trainer.current_epoch, log=False)

    def _epoch_end(self, trainer: Any, pl_module: Any, epoch: int, log: bool) -> None:
        if (cur := curriculum_of(pl_module)) is None or (epoch + 1) % self.every_n_epochs:
            return
        closed = cur.close_epoch(epoch, lr=getattr(pl_module, "lr", None))
        if closed is None:
            return  # closed and measured already (a resumed fit may end an epoch twice)
        self.evaluate(trainer, pl_module, tag=f"epoch_{epoch}", log=log)
        if not log:  # -> callback_metrics; with the close's sched/ metrics the module won't get
            pl_module.log_dict(closed | self.last_metrics, rank_zero_only=True)
        else:
            log_to_loggers(trainer, closed)

    def evaluate(self, trainer: Any, pl_module: Any, tag: str = "", log: bool = True) -> dict:
        """Measures the chosen problems now and records them in the fit's curriculum.

        Returns:
            ``{problem_id: {"n", "c", "pool"}}`` of the evaluated problems ({} without one).
        """
        if (cur := curriculum_of(pl_module)) is None:
            return {}
        results, self.last_metrics = measure(
            pl_module,
            cur,
            self.k,
            self.pools,
            self.max_problems,
            self.temperature,
            self.max_new_tokens,
            self.seed,
            self.batch_size,
        )
        if self.log_table:
            _log_table(trainer, cur.pools, tag or f"eval_{cur.measurements}")
        if log:
            log_to_loggers(trainer, self.last_metrics)
        return results


def _log_table(trainer: Any, pools: Any, tag: str) -> None:
    if not getattr(trainer, "is_global_zero", True):
        return
    rows = [
        [i, pools.pool_of(i).value, pools.accuracy(i), len(pools.history(i))] for i in pools.ids()
    ]
    for lg in getattr(trainer, "loggers", []):
        if hasattr(lg, "log_table"):
            lg.log_table(key=f"pool/problems_{tag}", columns=list(_COLUMNS), data=rows)
