"""A process-wide count of the compute a run spends: SFT examples trained on and rollouts sampled.

Every SFT example passes through :func:`coscale.sft.batch.tokenize_pairs` and every rollout
through a module's ``sample``; both add to :data:`BUDGET`, so a benchmark can compare methods
at equal budget by reading the counter before and after each one.
"""

from __future__ import annotations

from collections import Counter

BUDGET: Counter[str] = Counter()
"""Running totals: ``sft_examples`` and ``rollouts`` (generated completions, any purpose)."""


def spend(kind: str, amount: int) -> None:
    """Adds ``amount`` to ``kind``."""
    BUDGET[kind] += int(amount)


def snapshot() -> dict[str, int]:
    """A copy of the totals so far."""
    return dict(BUDGET)


def since(before: dict[str, int]) -> dict[str, int]:
    """What was spent after ``before`` (a :func:`snapshot`): SFT examples and rollouts."""
    now = snapshot()
    return {k: now.get(k, 0) - before.get(k, 0) for k in ("sft_examples", "rollouts")}
