"""Load problems from JSON Lines, Parquet, a saved ``datasets`` directory, the HF Hub or rows.

Rows are mapped through a :class:`FieldMap` and checked; a bad row becomes a :class:`BadRow`
saying where it is, ``data/train.jsonl:17`` (1-based line, as editors count) or ``x.parquet
row 16`` (0-based, as ``dataset[16]``), and ``on_bad_row`` skips or rejects it. A question or
answer field that no row has is a wrong ``FieldMap``: that raises, it is not a bad row.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coscale.tasks.problem import Problem

BAD_ROW_CHOICES = ("skip", "raise")


@dataclass(frozen=True)
class FieldMap:
    """Which field of a source row holds each part of a problem."""

    question: str = "question"
    """Field with the problem statement (a non-empty string)."""
    answer: str = "answer"
    """Field with the reference answer (a string or a number)."""
    solutions: str | None = "solutions"
    """Field with a list of worked solutions; null ignores it. Rows may omit it."""
    id: str | None = "id"
    """Field with a unique id (str or int); if null or absent the id is ``{stem}-{row index}``."""


@dataclass(frozen=True)
class BadRow:
    """A row that was skipped or rejected, and why."""

    where: str  # data/train.jsonl:17, x.parquet row 16, openmath[train] row 16 or rows[3]
    reason: str  # what is wrong with the row


@dataclass
class LoadResult:
    """The problems that loaded and the rows that did not."""

    problems: list[Problem]
    bad_rows: list[BadRow]
    source: str = ""  # how messages name the source

    def summary(self) -> str:
        """A line of counts, then the first bad rows, one per line."""
        head = f"{len(self.problems)} problems, {len(self.bad_rows)} bad rows from {self.source}"
        return "\n".join([head, *_listing(self.bad_rows)])


@dataclass
class _Source:
    label: str  # how messages name the source
    stem: str  # prefix of generated ids
    columns: list[str] | None  # known before reading for columnar sources
    records: Iterator[tuple[int, str, Any]]  # (0-based row index, where, row or _BadValue)


class _BadValue(Exception):
    """Raised by the row checks (or read in place of a row); its message is the reason."""


def load_problems(
    source: str | os.PathLike | Sequence[Mapping],
    fields: FieldMap = FieldMap(),
    split: str = "train",
    on_bad_row: str = "skip",
    limit: int | None = None,
) -> LoadResult:
    """Load and check the problems of ``source``.

    Args:
        source: A ``.jsonl``/``.json`` (JSON Lines) or ``.parquet`` file, a ``save_to_disk``
            directory, a HF ``datasets`` name (needs the network) or a list of dicts.
        fields: Field names of the rows.
        split: Split of a saved ``DatasetDict`` or of a Hub data set.
        on_bad_row: ``"skip"`` (warn once) or ``"raise"`` (one error listing every bad row).
        limit: Keep the first ``limit`` good problems; rows after them are not read.

    Raises:
        ValueError: Bad settings or ``fields``, bad rows under ``"raise"``, an unreadable source.
    """
    if on_bad_row not in BAD_ROW_CHOICES:
        raise ValueError(f"on_bad_row must be one of {BAD_ROW_CHOICES}, got {on_bad_row!r}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be None or an int >= 1, got {limit!r}")
    src = _open(source, split)
    with closing(src.records):
        result = _collect(src, fields, limit)
    _report(result, on_bad_row)
    return result


def _collect(src: _Source, fields: FieldMap, limit: int | None) -> LoadResult:
    """Read records until the end or ``limit`` good problems; check the mapping of row sources."""
    result = LoadResult([], [], src.label)
    first_at: dict[str, str] = {}  # id -> where it was first seen
    keys, first_keys = set(src.columns or ()), src.columns  # a columnar source knows them now
    if first_keys is not None:
        _check_mapping(fields, src.label, keys, first_keys)
    for index, where, row in src.records:
        if isinstance(row, Mapping):
            keys.update(row)
            first_keys = list(row) if first_keys is None else first_keys
        try:
            problem = _to_problem(row, fields, f"{src.stem}-{index}")
            if problem.id in first_at:
                raise _BadValue(f"duplicate id {problem.id!r} (first at {first_at[problem.id]})")
        except _BadValue as err:
            result.bad_rows.append(BadRow(where, str(err)))
            continue
        first_at[problem.id] = where
        result.problems.append(problem)
        if len(result.problems) == limit:
            break
    if first_keys is not None:  # again now that a row source has shown its keys
        _check_mapping(fields, src.label, keys, first_keys)
    return result


def _open(source: Any, split: str) -> _Source:
    """Pick the reader from the type of ``source``, its suffix, or whether it is a directory."""
    if isinstance(source, Sequence) and not isinstance(source, (str, bytes)):
        records = ((i, f"rows[{i}]", row) for i, row in enumerate(source))
        return _Source("the given rows", "rows", None, records)
    if not isinstance(source, (str, os.PathLike)):
        raise ValueError(f"source must be a path, a dataset name or rows, got {source!r}")
    label, path = str(source), Path(source)
    if path.suffix in (".jsonl", ".json"):
        return _Source(label, path.stem, None, _json_lines(path, label))
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        table = pq.ParquetFile(path)
        rows = (row for batch in table.iter_batches(batch_size=1024) for row in batch.to_pylist())
        return _Source(label, path.stem, table.schema_arrow.names, _rows(label, rows))
    return _datasets_source(path, label, split)


def _json_lines(path: Path, label: str) -> Iterator[tuple[int, str, Any]]:
    """One record per non-blank line; a line that is not JSON is read as a ``_BadValue``."""
    with path.open("rb") as handle:  # bytes, so a bad encoding spoils one line, not the load
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as err:
                row = _BadValue(f"invalid JSON: {err}")
            yield line_no - 1, f"{label}:{line_no}", row


def _datasets_source(path: Path, label: str, split: str) -> _Source:
    """A directory written by ``save_to_disk``, else a name for ``datasets.load_dataset``."""
    import datasets

    if path.is_dir():
        data = datasets.load_from_disk(label)
        if isinstance(data, datasets.DatasetDict):
            if split not in data:
                raise ValueError(f"split={split!r} is not in {label!r}; choose one of {list(data)}")
            data, label = data[split], f"{label}[{split}]"
    else:
        try:
            data, label = datasets.load_dataset(label, split=split), f"{label}[{split}]"
        except Exception as err:  # offline, unknown name or split: all land here
            hint = "a .jsonl/.json/.parquet file or a directory written by Dataset.save_to_disk"
            raise ValueError(
                f"could not load source={label!r} (split={split!r}) with datasets.load_dataset: "
                f"{err}. Offline, pass a local path instead: {hint}."
            ) from err
    return _Source(label, path.name, data.column_names, _rows(label, data))


def _rows(label: str, rows: Iterable[Any]) -> Iterator[tuple[int, str, Any]]:
    return ((i, f"{label} row {i}", row) for i, row in enumerate(rows))


def _check_mapping(fields: FieldMap, label: str, keys: set[str], first: list[str]) -> None:
    """Raise when no row has the question or the answer field: the ``FieldMap`` is wrong."""
    pairs = (("question", fields.question), ("answer", fields.answer))
    missing = [f"fields.{name}={value!r}" for name, value in pairs if value not in keys]
    if missing:
        raise ValueError(
            f"{' and '.join(missing)} not found in any row of {label}; the first row has keys "
            f"{first}. Map them with e.g. FieldMap(question='problem', answer='expected_answer')."
        )


def _to_problem(row: Any, fields: FieldMap, default_id: str) -> Problem:
    """Check one row and build its problem; raises ``_BadValue`` with the first fault."""
    if isinstance(row, _BadValue):
        raise row
    if not isinstance(row, Mapping):
        raise _BadValue(f"row must be an object, got {type(row).__name__}")
    question = _value(row, "question", fields.question, (str,), required=True)
    answer = _value(row, "answer", fields.answer, (str, int, float), required=True)
    solutions = _value(row, "solutions", fields.solutions, (list, tuple), required=False)
    problem_id = _value(row, "id", fields.id, (str, int), required=False)
    pid = default_id if problem_id is None else str(problem_id)
    used = {fields.question, fields.answer, fields.solutions, fields.id}
    meta = {key: value for key, value in row.items() if key not in used}
    return Problem(pid, question, str(answer), tuple(solutions or ()), meta)


def _value(row: Mapping, part: str, name: str | None, kinds: tuple, required: bool) -> Any:
    """The checked value of field ``name``; None for an absent or null optional field."""
    value = None if name is None else row.get(name)
    if value is None:  # null counts as absent: columnar sources have every column in every row
        if required:
            raise _BadValue(f"missing {part} (field {name!r})")
        return None
    if isinstance(value, bool) or not isinstance(value, kinds):
        allowed = " or ".join(kind.__name__ for kind in kinds)
        raise _BadValue(f"{part} (field {name!r}) must be {allowed}, got {type(value).__name__}")
    if isinstance(value, str) and not value.strip():
        raise _BadValue(f"empty {part} (field {name!r})")
    if isinstance(value, float) and not math.isfinite(value):
        raise _BadValue(f"{part} (field {name!r}) must be a finite number, got {value!r}")
    if part == "solutions" and not all(isinstance(s, str) and s.strip() for s in value):
        raise _BadValue(f"{part} (field {name!r}) must be a list of non-empty str")
    return value


def _listing(bad: list[BadRow], limit: int | None = 5) -> list[str]:
    shown = bad if limit is None else bad[:limit]
    more = [f"  ... and {len(bad) - len(shown)} more"] if len(bad) > len(shown) else []
    return [f"  {row.where}: {row.reason}" for row in shown] + more


def _report(result: LoadResult, on_bad_row: str) -> None:
    """Warn once about skipped rows, or raise once listing every bad row."""
    bad, source = result.bad_rows, result.source
    if bad and on_bad_row == "raise":
        head = f"{len(bad)} bad rows in {source} (on_bad_row='raise'; 'skip' skips them):\n"
        raise ValueError(head + "\n".join(_listing(bad, None)))
    if bad:
        head = f"skipped {len(bad)} bad rows of {source} (on_bad_row='skip'):\n"
        warnings.warn(head + "\n".join(_listing(bad)), stacklevel=3)
