"""Value checks shared by every config: each returns messages, so callers collect and raise once."""

from __future__ import annotations

import importlib
import math
from numbers import Integral, Real
from typing import Any


def at_least(
    low: float, kind: type = int, strict: bool = False, optional: bool = False, **values: Any
) -> list[str]:
    """A message for each value that is not a ``kind`` ``>= low`` (``> low`` when ``strict``).

    ``kind`` is ``int`` or ``float`` (any finite number); with ``optional`` None is allowed too.
    """
    errors, sign, what = [], ">" if strict else ">=", "an int" if kind is int else "a number"
    for k, v in values.items():
        if not ((v is None and optional) or (is_a(kind, v) and (v > low if strict else v >= low))):
            errors.append(f"{k} must be {what} {sign} {low}{' or None' * optional}, got {v!r}")
    return errors


def within(low: float, high: float, /, kind: type = int, **values: Any) -> list[str]:
    """A message for each value that is not a ``kind`` in ``[low, high]`` (kinds of at_least)."""
    what = "an int" if kind is int else "a number"
    return [
        f"{k} must be {what} in [{low}, {high}], got {v!r}"
        for k, v in values.items()
        if not (is_a(kind, v) and low <= v <= high)
    ]


def one_of(choices: tuple[str, ...], **values: Any) -> list[str]:
    """A message for each value that is not one of ``choices``."""
    return [
        f"{k} must be one of {', '.join(choices)}; got {v!r}"
        for k, v in values.items()
        if v not in choices
    ]


def is_number(value: Any) -> bool:
    """A finite real number (an int, a float, a numpy scalar; not a bool)."""
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)


def is_a(kind: type, value: Any) -> bool:
    """``value`` is an integer (``kind`` int) or any finite number (``kind`` float)."""
    return is_number(value) and (kind is not int or isinstance(value, Integral))


def as_group(cls: type, value: Any) -> Any:
    """``value`` as a ``cls`` group: a mapping (hyper-parameters read back from a checkpoint,
    a plain dict in Python) becomes one; a group or None is returned as it is."""
    if isinstance(value, dict):
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in value.items()})
    return value


def group_errors(**groups: Any) -> list[str]:
    """Every group's :meth:`errors`, prefixed with its argument name (None: skipped)."""
    return [f"{name}.{e}" for name, g in groups.items() if g is not None for e in g.errors()]


def imported(path: str, setting: str) -> Any:
    """What a ``class_path`` names (``module.Name``), imported: the one reader of the settings
    that name a class; a ValueError names ``setting`` when it cannot be imported."""
    module_name, _, name = str(path).rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError, ValueError) as err:
        raise ValueError(f"{setting}={path!r} cannot be imported ({err})") from err
