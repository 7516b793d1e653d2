"""Problem sources: loaders for JSONL, Parquet and HF datasets, the builtin arithmetic task and
held-out tiers; they return :class:`~coscale.loop.problem.Problem` records (exported here too)."""

from __future__ import annotations

from coscale.loop.problem import Problem
from coscale.renamed import old_names
from coscale.tasks.fields import FieldSettings, as_field_map
from coscale.tasks.loaders import BAD_ROW_CHOICES, BadRow, LoadResult, load_problems

__all__ = [
    "BAD_ROW_CHOICES",
    "BadRow",
    "FieldSettings",
    "LoadResult",
    "Problem",
    "as_field_map",
    "load_problems",
]


# the classes' earlier names, for one release
__getattr__ = old_names(__name__, {"FieldMap": FieldSettings})
