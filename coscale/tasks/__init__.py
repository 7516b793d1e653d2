"""Problem sources: loaders for JSONL, Parquet and HF datasets, the builtin arithmetic task and
held-out tiers; they return :class:`~coscale.loop.problem.Problem` records (exported here too)."""

from __future__ import annotations

from coscale.loop.problem import Problem
from coscale.tasks.fields import FieldMap, as_field_map
from coscale.tasks.loaders import BAD_ROW_CHOICES, BadRow, LoadResult, load_problems

__all__ = [
    "BAD_ROW_CHOICES",
    "BadRow",
    "FieldMap",
    "LoadResult",
    "Problem",
    "as_field_map",
    "load_problems",
]
