"""Confidence intervals for pass@k over a set of problems (bootstrap over problems)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from coscale.scoring.metrics import pass_at_k


@dataclass(frozen=True)
class Estimate:
    """A mean over problems with its 95% bootstrap interval, all in [0, 1]."""

    mean: float
    low: float
    high: float

    def fmt(self, scale: float = 100.0) -> str:
        return f"{self.mean * scale:.1f} [{self.low * scale:.1f}, {self.high * scale:.1f}]"


def bootstrap(
    values: Sequence[float], level: float = 0.95, resamples: int = 2000, seed: int = 0
) -> Estimate:
    """Mean of ``values`` and the percentile bootstrap interval (problems resampled)."""
    if not values:
        raise ValueError("values must not be empty")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    rng, n = random.Random(seed), len(values)
    means = sorted(sum(values[rng.randrange(n)] for _ in range(n)) / n for _ in range(resamples))
    tail = (1 - level) / 2
    low = means[int(tail * resamples)]
    high = means[min(resamples - 1, int((1 - tail) * resamples))]
    return Estimate(sum(values) / n, low, high)


def pass_at_k_estimate(n: int, correct: Sequence[int], k: int, seed: int = 0) -> Estimate:
    """pass@k over problems (each sampled ``n`` times, ``correct[i]`` right) with its interval."""
    return bootstrap([pass_at_k(n, c, k) for c in correct], seed=seed)
