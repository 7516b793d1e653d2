"""PassRateMeasurement: re-measures problems' accuracy with K samples at chosen epochs.

A thin adapter for a user's own ``Trainer`` (import it from :mod:`coscale.callbacks`), used by
the RL stage too (``rl_measure_every``): the sampling and the rule live in
:func:`coscale.measure.pass_rates.measure` and the curriculum. It closes nothing: the RL module
closes each epoch in the step that trains its last batch, before any epoch-end hook, so a
measurement at the end of a chosen epoch always comes after that epoch's close and is the last
word on each problem's pool. Each chosen epoch is measured once, a resumed fit included: the
last epoch measured is saved with the checkpoint.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Callback
from typing_extensions import override

from coscale.checks import at_least
from coscale.loop.pools import Pool
from coscale.measure.pass_rates import measure
from coscale.modules.fit_data import curriculum_of, epoch_finished, warn_no_curriculum
from coscale.modules.growing_table import add_rows, table_loggers
from coscale.modules.loggers import log_to_loggers
from coscale.renamed import old_keyword

_POOLS = [p.value for p in Pool]
_COLUMNS = ("stage", "measurement", "id", "pool", "acc", "evaluations")
TABLE_ROWS = 8192
"""Rows the ``pool/problems`` table keeps (the latest; 32 measurements of 256 problems)."""


class PassRateMeasurement(Callback):
    """Samples ``samples`` completions per problem of ``pools`` and records the accuracy.

    Logs ``pool/<name>`` of all four pools, ``pool/pass@1`` and ``pool/pass@<samples>`` over the
    evaluated problems, and every problem's row (stage, measurement tag, id, pool, acc,
    evaluations) added to one ``pool/problems`` table on loggers that have ``log_table`` (W&B).

    Args:
        samples: Samples per problem (the method's K).
        every_n_epochs: Evaluate when ``(epoch + 1) % every_n_epochs == 0``.
        pools: Pools whose problems are evaluated.
        max_problems: At most this many problems, a new seeded subset each time; None: all.
        temperature: Sampling temperature (overrides the module's ``val_sampling``).
        max_new_tokens: Token limit per sample; None keeps the module's ``val_sampling``.
        on_fit_start: Also evaluate at the start of a fresh fit (``global_step == 0``).
        log_table: Log the per-problem table.
        batch_size: Problems per seeded chunk of samples (:func:`.pass_rates.sample_counts`).
        seed: Base seed of the samples.
        top_p: Nucleus sampling (1: off), as the RL rollouts sample.
        top_k: Keep the k most likely tokens (0: off), as the RL rollouts sample.
        k: Earlier name of ``samples`` (a warning names it).
    """

    def __init__(
        self,
        samples: int = 16,
        every_n_epochs: int = 1,
        pools: tuple[str, ...] = ("unsolvable", "solvable", "solved"),
        max_problems: int | None = None,
        temperature: float = 1.0,
        max_new_tokens: int | None = None,
        on_fit_start: bool = False,
        log_table: bool = True,
        batch_size: int = 16,
        seed: int = 0,
        top_p: float = 1.0,
        top_k: int = 0,
        k: int | None = None,
    ) -> None:
        super().__init__()
        samples = old_keyword("PassRateMeasurement", "k", "samples", k, samples, 16)
        pools = (pools,) if isinstance(pools, str) else tuple(pools)
        errors = at_least(1, samples=samples, every_n_epochs=every_n_epochs, batch_size=batch_size)
        errors += at_least(1, optional=True, max_problems=max_problems)
        errors += at_least(1, optional=True, max_new_tokens=max_new_tokens)
        errors += at_least(0, float, temperature=temperature) + at_least(0, seed=seed)
        if not pools or any(p not in _POOLS for p in pools):
            errors.append(f"pools must be a non-empty list from {_POOLS}, got {list(pools)}")
        if errors:
            raise ValueError("PassRateMeasurement: " + "; ".join(errors))
        self.samples, self.every_n_epochs, self.pools = samples, every_n_epochs, pools
        self.max_problems, self.max_new_tokens = max_problems, max_new_tokens
        self.temperature, self.batch_size, self.seed = temperature, batch_size, seed
        self.at_fit_start, self.log_table = on_fit_start, log_table
        self.top_p, self.top_k = top_p, top_k
        self.last_metrics: dict[str, float] = {}
        self.measured = -1  # the last epoch measured in the running fit

    @override
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self.measured = -1  # a new fit (a resumed one then loads its own from the checkpoint)

    @override
    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        fresh = trainer.global_step == 0 and not getattr(trainer, "ckpt_path", None)
        if self.at_fit_start and fresh:
            self.evaluate(trainer, pl_module, tag="fit_start")

    @override
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        # restored from a checkpoint taken after an epoch's last step but before its end (a step
        # checkpoint): Lightning resumes in the next epoch without that epoch's end hooks, so its
        # measurement is taken now, before the next epoch's loader is built. on_train_start:
        # FSDP2 (ModelParallelStrategy) restores the checkpoint after on_fit_start.
        self._measure(trainer, pl_module, trainer.current_epoch - 1, in_loop=False)

    @override
    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        if epoch_finished(trainer):  # a fit stopped mid-epoch has not ended it
            self._measure(trainer, pl_module, trainer.current_epoch, in_loop=True)

    def _measure(self, trainer: Any, pl_module: Any, epoch: int, in_loop: bool) -> None:
        """Measures at the end of ``epoch`` when it is a chosen epoch not measured yet."""
        chosen = epoch >= 0 and (epoch + 1) % self.every_n_epochs == 0
        if not chosen or epoch <= self.measured:
            return
        if curriculum_of(pl_module) is None:
            warn_no_curriculum(self)
            return
        self.evaluate(trainer, pl_module, tag=f"epoch_{epoch}", log=not in_loop)
        self.measured = epoch
        if in_loop:  # -> callback_metrics and the loggers, at the epoch's step
            pl_module.log_dict(self.last_metrics, rank_zero_only=True)

    @property
    @override
    def state_key(self) -> str:
        # named k, as before the rename: a checkpoint's callback state is found under this key
        return self._generate_state_key(k=self.samples, every_n_epochs=self.every_n_epochs)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"measured": self.measured}

    @override
    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.measured = int(state["measured"])

    def evaluate(self, trainer: Any, pl_module: Any, tag: str = "", log: bool = True) -> dict:
        """Measures the chosen problems now and records them in the fit's curriculum.

        Returns:
            ``{problem_id: {"samples", "correct", "pool", ...}}`` of the evaluated problems ({}
            without one).
        """
        if (cur := curriculum_of(pl_module)) is None:
            warn_no_curriculum(self)
            return {}
        results, self.last_metrics = measure(
            pl_module,
            cur,
            self.samples,
            self.pools,
            self.max_problems,
            self.temperature,
            self.max_new_tokens,
            self.seed,
            self.batch_size,
            top_p=self.top_p,
            top_k=self.top_k,
        )
        if self.log_table:
            _log_table(trainer, pl_module, cur.pools, tag or f"eval_{cur.measurements}")
        if log:
            log_to_loggers(trainer, self.last_metrics)
        return results


def _log_table(trainer: Any, module: Any, pools: Any, tag: str) -> None:
    """Every problem's row, with the measurement's tag and stage (``module.run_stage`` under
    ``coscale run``, where every RL stage's epochs count from 0), added to the one
    ``pool/problems`` table on each logger that takes tables (the latest :data:`TABLE_ROWS`
    rows kept, and always the whole of this measurement)."""
    if not getattr(trainer, "is_global_zero", True):
        return
    stage = getattr(module, "run_stage", None)
    rows = [
        dict(
            zip(
                _COLUMNS,
                (stage, tag, i, pools.pool_of(i).value, pools.accuracy(i), len(pools.history(i))),
            )
        )
        for i in pools.ids()
    ]
    for lg in table_loggers(getattr(trainer, "loggers", [])):
        add_rows(lg, "pool/problems", rows, _COLUMNS, keep=max(TABLE_ROWS, len(rows)))
