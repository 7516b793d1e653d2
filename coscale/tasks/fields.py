"""The fields of a source row: which holds each part of a problem, and the checks of each value.

``fields`` may be given as a `FieldSettings` or as a plain dict with some of its keys (from YAML or
Python, e.g. ``{"question": "problem", "answer": "expected_answer"}``); `as_field_map` turns
either into a checked `FieldSettings`, so every reader takes both. `to_problem` checks one row
through a `FieldSettings` and builds its `Problem`, or raises `BadValue` with the row's first fault.
The row's other columns go into ``Problem.meta``, and so does the answer's column when it has
another name than ``answer`` (``solution`` in TRL's data sets): reward functions get it by name.

TRL's data formats map onto the same fields (:mod:`.conversations`; each `FieldSettings` field says
what its column may hold).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from coscale.loop.problem import Problem, Question
from coscale.renamed import old_names
from coscale.tasks.conversations import completion_text, is_conversation, split_conversation


@dataclass(frozen=True)
class FieldSettings:
    """Which field of a source row holds each part of a problem."""

    question: str = "question"
    """Field with the problem statement: a non-empty string, or a list of ``{"role",
    "content"}`` messages (TRL's conversational ``prompt``, or its ``messages``: a last
    assistant turn is then a worked solution)."""
    answer: str | None = "answer"
    """Field with the reference answer (a string or a number); null: prompt-only rows, with no
    answer (the problem's ``answer`` is then ``""``), for reward functions and a verifier that
    need none (:mod:`coscale.scoring.answers` refuses the ones that do)."""
    solutions: str | None = "solutions"
    """Field with worked solutions: a list of strings, one string or one assistant message
    (TRL's ``completion``, text or conversational); null ignores it. Rows may omit it."""
    id: str | None = "id"
    """Field with a unique id (str or int); if null or absent the id is ``{stem}-{row index}``."""


FIELD_KEYS = tuple(f.name for f in fields(FieldSettings))
"""The keys a ``fields`` dict may have."""
_OPTIONAL = ("answer", "solutions", "id")  # keys that may be null (the part is then not read)


def field_map_problems(value: Any, setting: str = "fields") -> list[str]:
    """Every reason why ``value`` is not a usable ``fields`` setting (empty when it is).

    Args:
        value: A `FieldSettings` or a dict with keys from `FIELD_KEYS`.
        setting: How messages name the setting, e.g. ``fields`` or ``val_fields``.
    """
    if isinstance(value, FieldSettings):
        given = {key: getattr(value, key) for key in FIELD_KEYS}
    elif isinstance(value, Mapping):
        given = dict(value)
    else:
        return [
            f"{setting} must be a FieldSettings or a dict with keys {', '.join(FIELD_KEYS)}; "
            f"got {type(value).__name__} {value!r}"
        ]
    problems = [
        f"{setting} has unknown key {key!r}; allowed keys: {', '.join(FIELD_KEYS)}"
        for key in given
        if key not in FIELD_KEYS
    ]
    for key, name in given.items():
        if key not in FIELD_KEYS or (name is None and key in _OPTIONAL):
            continue
        if not isinstance(name, str) or not name.strip():
            allowed = "a non-empty str or null" if key in _OPTIONAL else "a non-empty str"
            problems.append(f"{setting}.{key} must be {allowed} (a column name), got {name!r}")
    return problems


def as_field_map(
    value: FieldSettings | Mapping[str, str | None], setting: str = "fields"
) -> FieldSettings:
    """``value`` as a checked `FieldSettings`; a dict's missing keys keep their defaults.

    Args:
        value: A `FieldSettings`, or a dict such as ``{"question": "problem", "solutions":
            "sols"}``.
        setting: How the error names the setting.

    Raises:
        ValueError: Listing every unknown key (with the allowed keys) and every bad field name.
    """
    problems = field_map_problems(value, setting)
    if problems:
        raise ValueError("; ".join(problems))
    return value if isinstance(value, FieldSettings) else FieldSettings(**value)


class BadValue(Exception):
    """Raised by the row checks (or read in place of a row); its message is the reason."""


def to_problem(row: Any, fields: FieldSettings, default_id: str) -> Problem:
    """Check one row and build its problem; raises ``BadValue`` with the first fault."""
    if isinstance(row, BadValue):
        raise row
    if not isinstance(row, Mapping):
        raise BadValue(f"row must be an object, got {type(row).__name__}")
    question, solved = _question(row, fields.question)
    required = fields.answer is not None
    answer = _value(row, "answer", fields.answer, (str, int, float), required=required)
    solutions = _solutions(row, fields.solutions) + solved
    problem_id = _value(row, "id", fields.id, (str, int), required=False)
    pid = default_id if problem_id is None else str(problem_id)
    # The answer's column stays in meta (module docstring); TRL-style functions get ``answer``.
    used = {fields.question, fields.solutions, fields.id}
    if fields.answer == "answer":
        used.add("answer")
    meta = {key: value for key, value in row.items() if key not in used}
    gold = "" if answer is None else str(answer)
    return Problem(pid, question, gold, tuple(dict.fromkeys(solutions)), meta)


def _question(row: Mapping, name: str) -> tuple[Question, list[str]]:
    """The question (a text or a conversation) and the solution a conversation ends with."""
    value = row.get(name)
    if isinstance(value, (list, tuple)) and not is_conversation(value):
        raise BadValue(
            f"question (field {name!r}) must be str or a list of {{role, content}} messages, "
            f"got {type(value).__name__} {value!r:.60}"
        )
    if not is_conversation(value):
        return _value(row, "question", name, (str,), required=True), []
    try:
        messages, solution = split_conversation(value, name)
    except ValueError as err:
        raise BadValue(str(err)) from None
    return messages, [] if solution is None else [solution]


def _solutions(row: Mapping, name: str | None) -> list[str]:
    """The worked solutions of the row: a list of texts, one text or one assistant message."""
    value = None if name is None else row.get(name)
    if isinstance(value, str):
        return [_value(row, "solutions", name, (str,), required=False)]  # refuses an empty one
    if is_conversation(value):
        try:
            return [completion_text(value, name)]
        except ValueError as err:
            raise BadValue(str(err)) from None
    if value is not None and not isinstance(value, (list, tuple)):
        raise BadValue(
            f"solutions (field {name!r}) must be a str, a list of str or one assistant message, "
            f"got {type(value).__name__}"
        )
    return list(_value(row, "solutions", name, (list, tuple), required=False) or ())


def _value(row: Mapping, part: str, name: str | None, kinds: tuple, required: bool) -> Any:
    """The checked value of field ``name``; None for an absent or null optional field."""
    value = None if name is None else row.get(name)
    if value is None:  # null counts as absent: columnar sources have every column in every row
        if required:
            raise BadValue(f"missing {part} (field {name!r})")
        return None
    if isinstance(value, bool) or not isinstance(value, kinds):
        allowed = " or ".join(kind.__name__ for kind in kinds)
        raise BadValue(f"{part} (field {name!r}) must be {allowed}, got {type(value).__name__}")
    if isinstance(value, str) and not value.strip():
        raise BadValue(f"empty {part} (field {name!r})")
    if isinstance(value, float) and not math.isfinite(value):
        raise BadValue(f"{part} (field {name!r}) must be a finite number, got {value!r}")
    if part == "solutions" and not all(isinstance(s, str) and s.strip() for s in value):
        raise BadValue(f"{part} (field {name!r}) must be a list of non-empty str")
    return value


# the classes' earlier names, for one release
__getattr__ = old_names(__name__, {"FieldMap": FieldSettings})
