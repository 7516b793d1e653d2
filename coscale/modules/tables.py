"""One completions table for the whole run, under one key, that grows as steps are logged.

Each logged GRPO step adds up to :data:`MAX_ROWS` rows (full tables of every rollout slow
training down): the run's stage, the fit's step, the problem with its pool and Rollout N, the
completion, the weighted reward, each reward function's score, the advantage, then what the
reward functions logged with ``log_extra``. The table keeps the latest :data:`MAX_TABLE_ROWS`
rows and is logged whole under :data:`KEY` each time, as TRL logs its completions: the W&B run
shows one table that grows, not one table per step (:mod:`coscale.modules.growing_table`: every
stage of a ``coscale run`` adds to the same table).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from coscale.modules.fit_data import curriculum_of
from coscale.modules.growing_table import add_rows, table_loggers

KEY = "completions"
MAX_ROWS = 16
"""Rows a logged step adds."""
MAX_TABLE_ROWS = 512
"""Rows the table keeps (the latest)."""
COLUMNS = ["stage", "step", "problem", "pool", "n", "completion", "reward"]
"""The first columns; each reward function's score, ``advantage`` and the extra ones follow."""


def log_completions(
    module: Any,
    batch: list[dict],
    rollouts: Any,
    scores: Any,
    advantages: torch.Tensor,
    extra: Mapping[str, Sequence[Any]] | None = None,
) -> None:
    """Adds up to ``MAX_ROWS`` rows of this step (``scores``: the step's ``Scores``) and logs the
    table; an ``extra`` column of another length than the rollouts' is left empty."""
    if module.global_rank != 0:
        return
    loggers = table_loggers(module.loggers)
    if not loggers:
        return
    rows = _rows(module, batch, rollouts, scores, advantages, extra or {})
    for lg in loggers:
        add_rows(lg, KEY, rows, first=COLUMNS, keep=MAX_TABLE_ROWS)


def _rows(module, batch, rollouts, scores, advantages, extra) -> list[dict[str, Any]]:
    """This step's rows, as column -> value."""
    cur, total = curriculum_of(module), len(rollouts.texts)
    stage = getattr(module, "run_stage", None) or ""
    rows = []
    for r, i in enumerate(rollouts.prompt_index.tolist()[:MAX_ROWS]):
        pid = batch[i]["id"]
        row = {"stage": stage, "step": module.global_step, "problem": pid}
        row |= {"pool": _pool(cur, pid)}
        row |= {"n": batch[i].get("n"), "completion": rollouts.texts[r]}
        row |= {"reward": float(scores.reward[r])}
        row |= {
            f"reward/{name}": _score(scores.per_function[r, f])
            for f, name in enumerate(scores.names)
        }
        row |= {"advantage": float(advantages[r])}
        row |= {k: (v[r] if len(v) == total else None) for k, v in extra.items()}
        rows.append(row)
    return rows


def _pool(cur: Any, pid: str) -> str | None:
    """The problem's pool now (None without a curriculum, or for a problem it does not hold)."""
    try:
        return None if cur is None else cur.pools.pool_of(pid).value
    except KeyError:
        return None


def _score(value: torch.Tensor) -> float | None:
    """A reward function's score; None where it had no opinion (NaN)."""
    value = float(value)
    return None if value != value else value
