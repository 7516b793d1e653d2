"""The mastered set: the solved problems, each with one solution, that the forgetting guard
protects while an SFT fits on new data (:mod:`coscale.sft.forgetting`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from coscale.loop.pools import Pool


def mastered_items(problems: Mapping[str, Any], pools: Any, bank: Any) -> list[dict[str, str]]:
    """The default mastered set: ``{"id", "question", "solution"}`` per *solved* problem.

    The solution is the problem's latest correct RL rollout (``bank.latest_correct``), else its
    first bank solution; a solved problem with neither is left out. ``problems`` maps ids to
    :class:`~coscale.loop.problem.Problem` records (or dicts with a ``question``).
    """
    items = []
    for pid in pools.members(Pool.SOLVED):
        text = bank.latest_correct(pid) or next(iter(bank.take(pid, 1)), None)
        if text is None or pid not in problems:
            continue
        row = problems[pid]
        question = row["question"] if isinstance(row, Mapping) else row.question
        items.append({"id": pid, "question": question, "solution": text})
    return items
