"""The one count of the compute a run spends: SFT examples trained on and rollouts sampled.

Every SFT example passes through :func:`coscale.sft.batch.tokenize_pairs` and every rollout
through a module's ``sample``; both add to :data:`BUDGET` and nothing else counts. It is
process-wide because those places sit below any fit or stage. Everything else reads it: a stage's
spend is :func:`since` its start, a benchmark compares methods at equal budget the same way, and
a fit's checkpoint holds the fit's part (``RunState``), which :func:`restore` puts back on resume
so that a resumed run reports the spend of an uninterrupted one.
"""

from __future__ import annotations

from collections import Counter

BUDGET: Counter[str] = Counter()
"""Running totals: ``sft_examples``, ``rollouts`` (generated completions, any purpose) and, of
those, ``rollouts_on_<backend>`` per rollout backend (``cached``, ``hf``, ``vllm``)."""

REPORTED = ("sft_examples", "rollouts")
ON = "rollouts_on_"
"""Prefix of the per-backend rollout counts, reported where a stage sampled on that backend."""


def spend(kind: str, amount: int) -> None:
    """Adds ``amount`` to ``kind``."""
    BUDGET[kind] += int(amount)


def snapshot() -> dict[str, int]:
    """A copy of the totals so far."""
    return dict(BUDGET)


def since(before: dict[str, int], kinds: tuple[str, ...] | None = REPORTED) -> dict[str, int]:
    """What was spent after ``before`` (a :func:`snapshot`): of ``kinds`` (None: every kind)."""
    if kinds is None:
        kinds = tuple(set(BUDGET) | set(before))
    elif kinds == REPORTED:  # with the backends that sampled
        kinds += tuple(
            sorted(k for k in BUDGET if k.startswith(ON) and BUDGET[k] != before.get(k, 0))
        )
    return {k: BUDGET.get(k, 0) - before.get(k, 0) for k in kinds}


def restore(before: dict[str, int], spent: dict[str, int]) -> None:
    """Makes the work begun at ``before`` count ``spent``, whatever this process has counted
    since: a resumed fit takes its checkpoint's count in place of the part it redid."""
    for kind in set(BUDGET) | set(before) | set(spent):
        BUDGET[kind] = before.get(kind, 0) + int(spent.get(kind, 0))
