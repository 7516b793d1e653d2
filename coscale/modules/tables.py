"""A sampled completions table per step, logged under its own key so tables never overwrite.

Only a handful of rows are logged (full tables of every rollout slow training down), and only to a
logger that can take a table (W&B); others get nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

MAX_ROWS = 16


def log_completions(
    module: Any,
    batch: list[dict],
    rollouts: Any,
    rewards: torch.Tensor,
    advantages: torch.Tensor,
    extra: Mapping[str, Sequence[Any]] | None = None,
) -> None:
    """Logs up to ``MAX_ROWS`` (step, problem, completion, reward, advantage) rows, then one
    column per ``extra`` entry (what reward functions logged with ``log_extra``: one value per
    rollout; a column of another length is left empty)."""
    if module.global_rank != 0:
        return
    loggers = [lg for lg in module.loggers if hasattr(lg, "log_table")]
    if not loggers:
        return
    extra, step, total = extra or {}, module.global_step, len(rollouts.texts)
    columns = ["step", "problem", "completion", "reward", "advantage", *extra]
    rows = [
        [step, batch[i]["id"], rollouts.texts[r], float(rewards[r]), float(advantages[r])]
        + [values[r] if len(values) == total else None for values in extra.values()]
        for r, i in enumerate(rollouts.prompt_index.tolist()[:MAX_ROWS])
    ]
    for lg in loggers:
        lg.log_table(key=f"completions/step_{step}", columns=columns, data=rows)
