"""The curriculum over time in one table: where the problems stand after every RL epoch and every
stage of a run (the view no peer logs: problems moving between pools as the loop goes on).

One row per point (the run's stage, the fit's epoch or None at a stage's end): each pool's
count, the solution bank's size and the Rollout N of each difficulty group. The rows live on
the logger (every stage of a ``coscale run`` adds to the same table) and the whole table is
logged under :data:`KEY` each time; only a logger that can take a table (W&B) gets it. The same
figures are metrics too (``pool/*``, ``sched/*``), for plots.
"""

from __future__ import annotations

from typing import Any

KEY = "curriculum"


def log_curriculum(loggers: list[Any], curriculum: Any, stage: str, epoch: int | None) -> None:
    """Adds the curriculum's row now and logs the table to every logger that takes tables."""
    loggers = [lg for lg in loggers if hasattr(lg, "log_table")]
    if not loggers:
        return
    row = {"stage": stage, "epoch": epoch, **curriculum.pools.counts()}
    row |= {"bank": curriculum.bank.total()}
    row |= {f"n_group{g}": n for g, n in curriculum.n_per_group().items()}
    for lg in loggers:
        if not hasattr(lg, "_coscale_curriculum"):
            lg._coscale_curriculum = []
        rows = lg._coscale_curriculum
        rows.append(row)
        columns = list(dict.fromkeys(k for r in rows for k in r))
        lg.log_table(key=KEY, columns=columns, data=[[r.get(c) for c in columns] for r in rows])


def log_module_curriculum(module: Any, curriculum: Any) -> None:
    """:func:`log_curriculum` from a module's fit, on rank 0: its run stage (when a ``coscale
    run`` set one) and the epoch just closed."""
    if module.global_rank == 0:
        stage = getattr(module, "run_stage", None) or ""
        log_curriculum(module.loggers, curriculum, stage, module.current_epoch)
