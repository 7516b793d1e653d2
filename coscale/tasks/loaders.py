"""Load problems from JSON Lines or JSON arrays, Parquet, a saved ``datasets`` directory, the HF
Hub or rows.

Rows are mapped through a :class:`FieldSettings` (or a dict of its fields) and checked; a bad row
becomes a :class:`BadRow` saying where it is, ``data/train.jsonl:17`` (1-based line, as editors
count) or ``x.parquet row 16`` (0-based, as ``dataset[16]``), and ``on_bad_row`` skips or rejects
it. A file that is not JSON (a malformed line) is an error naming the file and line, whatever
``on_bad_row`` says: the file is broken, not one row. A question or answer field that no row has
is a wrong ``FieldSettings``: that raises too; so does a source left with no usable problem, and a
local path that does not exist.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coscale.loop.problem import Problem
from coscale.renamed import old_names
from coscale.tasks.fields import (
    BadValue,
    FieldSettings,
    as_field_map,
    field_map_problems,
    to_problem,
)
from coscale.tasks.files import (
    json_records,
    load_saved,
    local_path,
    not_local_note,
    open_parquet,
    parquet_rows,
)

BAD_ROW_CHOICES = ("skip", "raise")
_DEFAULT_FIELDS = FieldSettings()  # frozen, so one shared default is safe


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
    records: Iterator[tuple[int, str, Any]]  # (0-based row index, where, row or BadValue)


def load_problems(
    source: str | os.PathLike | Sequence[Mapping],
    fields: FieldSettings | Mapping[str, str | None] = _DEFAULT_FIELDS,
    split: str = "train",
    on_bad_row: str = "skip",
    limit: int | None = None,
    *,
    name: str | None = None,
) -> LoadResult:
    """Load and check the problems of ``source``.

    Args:
        source: A ``.jsonl``/``.json`` (JSON Lines or a JSON array) or ``.parquet`` file, a
            ``save_to_disk`` directory, a HF ``datasets`` name (needs the network) or a list of
            dicts.
        fields: Field names of the rows: a `FieldSettings` or a dict of some of its fields.
        split: Split of a saved ``DatasetDict`` or of a Hub data set.
        on_bad_row: ``"skip"`` (warn once) or ``"raise"`` (one error listing every bad row).
        limit: Keep the first ``limit`` good problems; rows after them are not read.
        name: How messages name the source, e.g. ``train=builtin:tiers?T3=64`` when ``source``
            holds the rows made from it; by default the path, the hub name or "the given rows".

    Raises:
        ValueError: Bad settings or ``fields`` (all listed at once), bad rows under
            ``"raise"``, a source with no usable problem, an unreadable source, a file that is
            not JSON (naming its line).
        FileNotFoundError: A local path that does not exist.
    """
    fields = _checked_fields(fields, on_bad_row, limit)
    src = _open(source, split)
    src.label = name or src.label
    with closing(src.records):
        result = _collect(src, fields, limit)
    _report(result, on_bad_row, fields)
    return result


def _checked_fields(fields: Any, on_bad_row: Any, limit: Any) -> FieldSettings:
    """``fields`` as a `FieldSettings` once every setting is checked; raise once, listing each."""
    problems = field_map_problems(fields)
    if on_bad_row not in BAD_ROW_CHOICES:
        problems.append(f"on_bad_row must be one of {BAD_ROW_CHOICES}, got {on_bad_row!r}")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        problems.append(f"limit must be None or an int >= 1, got {limit!r}")
    if problems:
        raise ValueError("; ".join(problems))
    return as_field_map(fields)


def _collect(src: _Source, fields: FieldSettings, limit: int | None) -> LoadResult:
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
            problem = to_problem(row, fields, f"{src.stem}-{index}")
            if problem.id in first_at:
                raise BadValue(f"duplicate id {problem.id!r} (first at {first_at[problem.id]})")
        except BadValue as err:
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
    label, path = os.fspath(source), local_path(source)
    if path is None:
        return _hub_source(label, split)
    if path.is_dir():
        data, used = load_saved(path, split)
        label = label if used is None else f"{label}[{used}]"
        return _Source(label, path.name, data.column_names, _rows(label, data))
    if path.suffix.lower() == ".parquet":
        table = open_parquet(path)
        return _Source(
            label, path.stem, table.schema_arrow.names, _rows(label, parquet_rows(table))
        )
    return _Source(label, path.stem, None, json_records(path, label))


def _hub_source(name: str, split: str) -> _Source:
    """A data set that ``datasets.load_dataset`` finds by name (on the Hub or in its cache)."""
    import datasets

    try:
        data = datasets.load_dataset(name, split=split)
    except Exception as err:  # offline, unknown name or split: all land here
        raise ValueError(
            f"could not load source={name!r} (split={split!r}) with datasets.load_dataset: "
            f"{err}. Offline, pass a local path instead: a .jsonl/.json/.parquet file or a "
            f"directory written by Dataset.save_to_disk.{not_local_note(name)}"
        ) from err
    label = f"{name}[{split}]"
    return _Source(label, Path(name).name, data.column_names, _rows(label, data))


def _rows(label: str, rows: Iterable[Any]) -> Iterator[tuple[int, str, Any]]:
    return ((i, f"{label} row {i}", row) for i, row in enumerate(rows))


def _check_mapping(fields: FieldSettings, label: str, keys: set[str], first: list[str]) -> None:
    """Raise when no row has the question or the answer field: the ``FieldSettings`` is wrong."""
    pairs = (("question", fields.question), ("answer", fields.answer))
    missing = [f"fields.{n}={v!r}" for n, v in pairs if v is not None and v not in keys]
    if missing:
        raise ValueError(
            f"{' and '.join(missing)} not found in any row of {label}; the first row has keys "
            f"{first}. Map them with e.g. "
            "FieldSettings(question='problem', answer='expected_answer')."
        )


def _listing(bad: list[BadRow], limit: int | None = 5) -> list[str]:
    shown = bad if limit is None else bad[:limit]
    more = [f"  ... and {len(bad) - len(shown)} more"] if len(bad) > len(shown) else []
    return [f"  {row.where}: {row.reason}" for row in shown] + more


def _report(result: LoadResult, on_bad_row: str, fields: FieldSettings) -> None:
    """Warn once about skipped rows; raise once listing every bad row, or for no problem left."""
    bad, source = result.bad_rows, result.source
    if bad and on_bad_row == "raise":
        head = f"{len(bad)} bad rows in {source} (on_bad_row='raise'; 'skip' skips them):\n"
        raise ValueError(head + "\n".join(_listing(bad, None)))
    if not result.problems:
        skipped = f"{len(bad)} bad rows skipped" if bad else "it has no rows"
        head = (
            f"{source} holds 0 usable problems ({skipped}); check the file or `fields` "
            f"(question={fields.question!r}, answer={fields.answer!r})"
        )
        raise ValueError("\n".join([head + (":" if bad else ""), *_listing(bad)]))
    if bad:
        head = f"skipped {len(bad)} bad rows of {source} (on_bad_row='skip'):\n"
        warnings.warn(head + "\n".join(_listing(bad)), stacklevel=3)


# the classes' earlier names, for one release
__getattr__ = old_names(__name__, {"FieldMap": FieldSettings})
