"""Confidence intervals for pass@k over a set of problems (bootstrap over problems)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from coscale.scoring.metrics import pass_at_k

_CELLS = 1 << 22  # indices drawn at once: 32 MiB of int64


@dataclass(frozen=True)
class Estimate:
    """A mean over problems with its 95% bootstrap interval, all in [0, 1]; ``values`` are the
    per-problem values it is the mean of (empty when not kept)."""

    mean: float
    low: float
    high: float
    values: tuple[float, ...] = field(default=(), repr=False, compare=False)

    def fmt(self, scale: float = 100.0) -> str:
        return f"{self.mean * scale:.1f} [{self.low * scale:.1f}, {self.high * scale:.1f}]"

    def plain(self) -> dict[str, float]:
        """The mean and its interval (for JSON; the per-problem values left out)."""
        return {"mean": self.mean, "low": self.low, "high": self.high}


def bootstrap(
    values: Sequence[float], level: float = 0.95, resamples: int = 2000, seed: int = 0
) -> Estimate:
    """Mean of ``values`` and the percentile bootstrap interval (problems resampled)."""
    if not values:
        raise ValueError("values must not be empty")
    return mean_of_sets([values], level, resamples, seed)


def mean_of_sets(
    sets: Sequence[Sequence[float]], level: float = 0.95, resamples: int = 2000, seed: int = 0
) -> Estimate:
    """The average of the sets' means with its percentile bootstrap interval: each resample
    draws every set's problems anew from that set alone (stratified), so each set keeps its
    weight. One set: the plain bootstrap of its mean."""
    if not sets or any(not values for values in sets):
        raise ValueError("every set must hold at least one value")
    if not 0 < level < 1:
        raise ValueError(f"level must be in (0, 1), got {level}")
    rng = np.random.default_rng(seed)
    means = np.zeros(resamples)  # [resamples] the average of the sets' resampled means
    for values in sets:
        array = np.asarray(values, dtype=float)  # [n]
        rows = max(1, _CELLS // len(array))  # resamples per chunk: bounded memory
        for start in range(0, resamples, rows):
            count = min(rows, resamples - start)
            picks = rng.integers(0, len(array), size=(count, len(array)))  # [count, n]
            means[start : start + count] += array[picks].mean(axis=1)
    means = np.sort(means / len(sets)).tolist()
    tail = (1 - level) / 2
    low = means[int(tail * resamples)]
    high = means[min(resamples - 1, int((1 - tail) * resamples))]
    mean = sum(sum(v) / len(v) for v in sets) / len(sets)
    pooled = tuple(x for v in sets for x in v) if len(sets) == 1 else ()
    return Estimate(mean, low, high, pooled)


def paired_difference(
    first: Sequence[Sequence[float]], second: Sequence[Sequence[float]], seed: int = 0
) -> Estimate:
    """``mean_of_sets(first) - mean_of_sets(second)`` with its 95% interval, where both were
    measured on the same problems in the same order: each resample draws the problems once for
    both, so what the two models share (a problem's difficulty) cancels and the interval is
    that of the difference itself. An interval above 0: ``first`` is ahead beyond chance."""
    if len(first) != len(second) or any(len(a) != len(b) for a, b in zip(first, second)):
        raise ValueError("paired_difference needs the same problems (set sizes) on both sides")
    return mean_of_sets([[x - y for x, y in zip(a, b)] for a, b in zip(first, second)], seed=seed)


def pass_at_k_estimate(n: int, correct: Sequence[int], k: int, seed: int = 0) -> Estimate:
    """pass@k over problems (each sampled ``n`` times, ``correct[i]`` right) with its interval."""
    return bootstrap([pass_at_k(n, c, k) for c in correct], seed=seed)
