"""Reward functions for the tests, importable by dotted path from YAML (``reward_examples.X``).

A TRL-style format bonus (``prompts, completions, completion_ids, **columns``), an ``async def``
one, and coscale-style verifiers that work on a random tiny model (it rarely writes a box).
"""

from __future__ import annotations

import asyncio


def format_bonus(prompts, completions, completion_ids, **columns):
    """TRL-style: 1.0 for every other completion (the index decides, so every group of two or
    more has spread whatever the model writes)."""
    return [float(i % 2) for i in range(len(completions))]


async def async_bonus(prompts, completions, **columns):
    """TRL-style and async: 0.5 when the completion holds a digit, else no opinion (None)."""
    await asyncio.sleep(0)
    return [0.5 if any(ch.isdigit() for ch in c) else None for c in completions]


class HasDigit:
    """coscale-style verifier: correct (1.0) when the completion holds a digit."""

    def __call__(self, completions, answers, **columns):
        return [float(any(ch.isdigit() for ch in c)) for c in completions]
