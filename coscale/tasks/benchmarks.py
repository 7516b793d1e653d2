"""Named problem sources of the paper's set-up: training data with many solutions, test sets.

A `BenchmarkSource` says where a data set lives (a HF hub name for ``datasets.load_dataset``,
a local ``.jsonl``/``.json``/``.parquet`` file or ``save_to_disk`` folder) and which fields
hold question, answer, id and worked solution. Rows with the same (whitespace-normalised)
question become one problem with all their solutions: OpenMathReasoning has one row per
generated solution, and many solutions per problem are what CoScale-RL's data scaling uses.

`SOURCES` holds the paper's sets (docs/method.md) with their columns as published when this was
written (override any field if a data set changes). Specs are strings, as in YAML:
``math500``, ``amc?limit=40``, ``openmathreasoning?max_rows=200000&limit=2000``, or a custom
``mine?path=data/test.jsonl&question=q&answer=a&where=level:4|5`` (any `BenchmarkSource`
field). In a DataModule, ``train: source:openmathreasoning?limit=2000`` reads one (`source_rows`);
``&side=train`` / ``&side=val`` split one source into disjoint training and validation problems.
"""

from __future__ import annotations

import hashlib
import itertools
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, fields, replace
from typing import Any
from urllib.parse import parse_qsl

from coscale.loop.problem import Problem
from coscale.tasks import files
from coscale.tasks.loaders import FieldSettings, load_problems
from coscale.tasks.sides import side_of

SOURCE_PREFIX = "source:"


@dataclass(frozen=True)
class BenchmarkSource:
    """Where a problem set lives and how its rows map onto problems."""

    name: str
    """Short name, used in ids and result tables."""
    path: str
    """HF hub name, or a local .jsonl / .json / .parquet file or save_to_disk folder."""
    split: str = "test"
    """Split to read."""
    subset: str | None = None
    """HF configuration name (e.g. ``en-easy``); None for the default."""
    question: str = "problem"
    """Field with the problem statement."""
    answer: str = "answer"
    """Field with the reference answer."""
    id: str | None = None
    """Field with a unique id; None: ``{name}-{hash of the question}``, stable across runs."""
    solution: str | None = None
    """Field with a worked solution (a string or a list); rows of one question are merged."""
    where: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """Keep only rows whose field holds one of the values: ``((field, (v1, v2)), ...)``."""
    limit: int | None = None
    """Keep the first ``limit`` problems (after merging)."""
    max_rows: int | None = None
    """Read at most this many rows (bounds a huge hub set; use with ``streaming``)."""
    streaming: bool = False
    """Stream a hub data set instead of downloading all of it first."""
    side: str | None = None
    """``train`` or ``val``: only the problems on that side of the set's hash split (one in ten
    is ``val``, :mod:`coscale.tasks.sides`), so a validation set read from the training source
    shares no problem with the training set; None: every problem."""


SOURCES: dict[str, BenchmarkSource] = {
    "openmathreasoning": BenchmarkSource(
        "openmathreasoning",
        "nvidia/OpenMathReasoning",
        split="cot",
        answer="expected_answer",
        solution="generated_solution",
        where=(("problem_type", ("has_answer_extracted",)),),
        streaming=True,
    ),
    "math500": BenchmarkSource("math500", "HuggingFaceH4/MATH-500", id="unique_id"),
    "amc": BenchmarkSource("amc", "AI-MO/aimo-validation-amc", split="train"),
    "olymmath-en-easy": BenchmarkSource("olymmath-en-easy", "RUC-AIBOX/OlymMATH", subset="en-easy"),
    "olymmath-en-hard": BenchmarkSource("olymmath-en-hard", "RUC-AIBOX/OlymMATH", subset="en-hard"),
}


@dataclass(frozen=True)
class GroupStats:
    """What merging rows into problems did."""

    rows: int  # rows read
    kept_rows: int  # rows that passed `where` and had a question
    problems: int
    solutions: int
    answer_conflicts: int  # rows whose answer differs from their problem's first answer
    columns: tuple[str, ...] = ()  # fields of the first row read


def parse_source(spec: str | BenchmarkSource) -> BenchmarkSource:
    """A source from a spec string (``name?setting=value&...``; see the module docstring).

    Raises:
        ValueError: For an unknown name without ``path``, or an unknown or bad setting.
    """
    if isinstance(spec, BenchmarkSource):
        return spec
    name, _, query = spec.removeprefix(SOURCE_PREFIX).partition("?")
    settings = dict(parse_qsl(query, keep_blank_values=True))
    if name not in SOURCES and "path" not in settings:
        raise ValueError(
            f"unknown problem source {name!r} in {spec!r}; choose one of {sorted(SOURCES)} "
            "or give a path, e.g. 'mine?path=data/test.jsonl&question=problem&answer=answer'"
        )
    base = SOURCES.get(name) or BenchmarkSource(name, settings["path"])
    allowed = {f.name for f in fields(BenchmarkSource)} - {"name"}
    unknown = sorted(set(settings) - allowed)
    if unknown:
        raise ValueError(f"unknown settings {unknown} in {spec!r}; allowed: {sorted(allowed)}")
    return replace(base, **{key: _setting(key, value, spec) for key, value in settings.items()})


def _setting(key: str, value: str, spec: str) -> Any:
    if key in ("limit", "max_rows"):
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"{key} must be an int >= 1 in {spec!r}, got {value!r}")
        return int(value)
    if key == "side":
        if value not in ("train", "val"):
            raise ValueError(f"side must be train or val in {spec!r}, got {value!r}")
        return value
    if key == "streaming":
        return value.lower() in ("1", "true", "yes")
    if key == "where":
        column, _, values = value.partition(":")
        return ((column, tuple(values.split("|"))),)
    return (value or None) if key in ("subset", "id", "solution") else value


def group_rows(
    rows: Iterable[dict[str, Any]], source: BenchmarkSource
) -> tuple[list[dict[str, Any]], GroupStats]:
    """Merges rows of one question into one problem row: ``id, question, answer, solutions``.

    The first row of a question gives its answer, id and meta fields; later rows add their
    solutions (duplicates dropped). Rows without a question text are left for the loader to
    report. Problems beyond ``limit`` are not started, but rows of earlier ones still count.
    """
    groups: dict[str, dict[str, Any]] = {}
    read = kept = conflicts = 0
    columns: tuple[str, ...] = ()
    for row in rows:
        read += 1
        columns = columns or tuple(row)
        if not all(str(row.get(col)) in values for col, values in source.where):
            continue
        question = row.get(source.question)
        key = " ".join(question.split()) if isinstance(question, str) else f"#row{read}"
        group = groups.get(key)
        if group is None:
            if source.side is not None and side_of(key, with_test=False) != source.side:
                continue
            if source.limit is not None and len(groups) >= source.limit:
                continue
            group = groups[key] = _new_group(row, key, source)
        kept += 1
        answer, first = row.get(source.answer), group["answer"]
        if answer is not None and first is not None and str(answer) != str(first):
            conflicts += 1
        group["answer"] = first if first is not None else answer
        group["solutions"] += [s for s in _solutions(row, source) if s not in group["solutions"]]
    problems = list(groups.values())
    total = sum(len(g["solutions"]) for g in problems)
    return problems, GroupStats(read, kept, len(problems), total, conflicts, columns)


def _new_group(row: dict[str, Any], key: str, source: BenchmarkSource) -> dict[str, Any]:
    used = {source.question, source.answer, source.id, source.solution}
    digest = hashlib.sha1(key.encode()).hexdigest()[:12]
    pid = row.get(source.id) if source.id else None
    meta = {k: v for k, v in row.items() if k not in used and isinstance(v, (str, int, float))}
    return {
        **meta,
        "id": f"{source.name}-{digest}" if pid is None else str(pid),
        "question": row.get(source.question),
        "answer": row.get(source.answer),
        "solutions": [],
    }


def _solutions(row: dict[str, Any], source: BenchmarkSource) -> list[str]:
    value = row.get(source.solution) if source.solution else None
    values = value if isinstance(value, (list, tuple)) else [value]
    return [s for s in values if isinstance(s, str) and s.strip()]


def read_rows(source: BenchmarkSource) -> Iterator[dict[str, Any]]:
    """The raw rows of `source` (at most ``max_rows``), from a local file/folder or the hub."""
    yield from (dict(row) for row in itertools.islice(_open(source), source.max_rows))


def _open(source: BenchmarkSource) -> Iterable[Any]:
    """A local file or ``save_to_disk`` folder when ``path`` names one, else a hub data set."""
    setting = f"problem source {source.name!r}: path"
    path = files.local_path(source.path, setting)
    if path is None:
        return _hub_rows(source)
    if path.is_dir():
        return files.load_saved(path, source.split, setting)[0]
    if path.suffix.lower() == ".parquet":
        return files.parquet_rows(files.open_parquet(path, setting))
    return files.json_rows(path)


def _hub_rows(source: BenchmarkSource) -> Iterable[Any]:
    import datasets

    try:
        return datasets.load_dataset(
            source.path, source.subset, split=source.split, streaming=source.streaming
        )
    except Exception as err:  # offline, unknown name, split or subset: all land here
        raise ValueError(
            f"could not load problem source {source.name!r} ({source.path}, subset="
            f"{source.subset!r}, split={source.split!r}): {err}. Offline, give a local copy: "
            f"'{source.name}?path=<file.jsonl or save_to_disk folder>'"
        ) from err


def source_rows(spec: str | BenchmarkSource) -> list[dict[str, Any]]:
    """Problem rows (``id, question, answer, solutions`` + meta) of a source, merged per question.

    A ``source:`` spec works too: `ProblemDataModule` reads these rows with its default fields.
    """
    source = parse_source(spec)
    rows, stats = group_rows(read_rows(source), source)
    missing = [f for f in (source.question, source.answer) if f not in stats.columns]
    if stats.rows and missing:
        raise ValueError(
            f"problem source {source.name!r}: fields {missing} are not in its rows, which have "
            f"{list(stats.columns)}; map them, e.g. '{source.name}?question=...&answer=...'"
        )
    if stats.answer_conflicts:
        warnings.warn(
            f"{source.name}: {stats.answer_conflicts} rows disagree with the first answer given "
            "for their question; the first answer is kept",
            stacklevel=2,
        )
    return rows


def load_benchmark(spec: str | BenchmarkSource, on_bad_row: str = "skip") -> list[Problem]:
    """The checked problems of a source (bad rows skipped with a warning, or raised).

    Raises ``ValueError`` when no usable problem is left (the message names ``spec``).
    """
    rows, name = source_rows(spec), spec if isinstance(spec, str) else spec.name
    return load_problems(rows, FieldSettings(), on_bad_row=on_bad_row, name=name).problems
