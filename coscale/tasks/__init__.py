"""Problem sources: the ``Problem`` record and loaders for JSONL, Parquet and HF datasets."""

from __future__ import annotations

from coscale.tasks.fields import FieldMap, as_field_map
from coscale.tasks.loaders import BAD_ROW_CHOICES, BadRow, LoadResult, load_problems
from coscale.tasks.problem import Problem

__all__ = [
    "BAD_ROW_CHOICES",
    "BadRow",
    "FieldMap",
    "LoadResult",
    "Problem",
    "as_field_map",
    "load_problems",
]
