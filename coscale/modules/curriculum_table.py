"""The curriculum over time in one table: where the problems stand after every RL epoch and every
stage of a run (the view no peer logs: problems moving between pools as the loop goes on).

One row per point (the run's stage, the fit's epoch or None at a stage's end): each pool's
count, the solution bank's size and the Rollout N of each difficulty group, added to one table
under :data:`KEY` (:mod:`coscale.modules.growing_table`). The same figures are metrics too
(``pool/*``, ``sched/*``), for plots.
"""

from __future__ import annotations

from typing import Any

from coscale.modules.growing_table import add_rows, table_loggers

KEY = "curriculum"


def log_curriculum(loggers: list[Any], curriculum: Any, stage: str, epoch: int | None) -> None:
    """Adds the curriculum's row now and logs the table to every logger that takes tables."""
    loggers = table_loggers(loggers)
    if not loggers:
        return
    row = {"stage": stage, "epoch": epoch, **curriculum.pools.counts()}
    row |= {"bank": curriculum.bank.total()}
    row |= {f"n_group{g}": n for g, n in curriculum.n_per_group().items()}
    for lg in loggers:
        add_rows(lg, KEY, [row])


def log_module_curriculum(module: Any, curriculum: Any) -> None:
    """:func:`log_curriculum` from a module's fit, on rank 0: its run stage (when a ``coscale
    run`` set one) and the epoch just closed."""
    if module.global_rank == 0:
        stage = getattr(module, "run_stage", None) or ""
        log_curriculum(module.loggers, curriculum, stage, module.current_epoch)
