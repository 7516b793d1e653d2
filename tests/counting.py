"""Scripted correct-counts for tests that stand in for a module's sampling.

A module counts the correct samples of all of a measurement's chunks in one call
(``count_correct_many``, one backend call); these helpers let a test script or spy on the counts
of each chunk as if it were sampled alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

CountFn = Callable[[list[dict], int, Any], list[int]]


def each_chunk(module: Any, count: CountFn) -> None:
    """Makes ``module``'s counts come from ``count(problems, n, sampling)``, chunk by chunk."""
    module.count_correct_many = lambda chunks, n, samplings: [
        count(chunk, n, sampling) for chunk, sampling in zip(chunks, samplings)
    ]


def real_counts(module: Any) -> CountFn:
    """``module``'s own counting of one chunk (taken before :func:`each_chunk` replaces it)."""
    many = module.count_correct_many
    return lambda problems, n, sampling: many([problems], n, [sampling])[0]
