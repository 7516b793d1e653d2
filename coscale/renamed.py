"""Old names of renamed classes, kept for one release: each use warns and names the new one.

A module that renamed a class sets ``__getattr__`` with :func:`old_names`, so that
``from coscale.x import OldName`` and a pickle that names ``coscale.x.OldName`` (a checkpoint
written before the rename) still resolve, to the new class.
"""

import warnings
from collections.abc import Callable
from dataclasses import field, fields
from typing import Any

GOES_IN = "0.2.0"
"""The release that drops the old names."""


def old_names(module: str, renamed: dict[str, Any]) -> Callable[[str], Any]:
    """A module ``__getattr__`` (``__getattr__ = old_names(__name__, {...})``) that gives each
    class of ``renamed`` under its old name, with a warning (:func:`old_name`)."""
    return lambda name: old_name(module, name, renamed)


def old_name(module: str, name: str, renamed: dict[str, Any]) -> Any:
    """``renamed[name]`` for a module's ``__getattr__``, with a ``FutureWarning`` naming the new
    name; ``AttributeError`` for any other name, as a module without ``__getattr__`` raises."""
    if name not in renamed:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    new = renamed[name]
    warnings.warn(
        f"{module}.{name} is now {new.__name__} ({name} goes in coscale {GOES_IN})",
        FutureWarning,
        stacklevel=3,
    )
    return new


def old_keyword(owner: str, old: str, new: str, given: Any, value: Any, default: Any) -> Any:
    """``given`` (an argument passed under its earlier name ``old``), with a ``FutureWarning``
    naming ``new``, when it is not None; else ``value`` (the argument under its name now).
    Both set (``value`` not its ``default``): a ``ValueError`` naming both."""
    if given is None:
        return value
    if value != default:
        raise ValueError(f"{owner}: {old} is the earlier name of {new}; set {new} only")
    warnings.warn(
        f"{owner}({old}=...) is now {new}= ({old} goes in coscale {GOES_IN})",
        FutureWarning,
        stacklevel=3,
    )
    return given


def earlier_name(now: str) -> Any:
    """A settings dataclass field for the earlier name of its field ``now`` (None unless given;
    out of its repr, comparisons and :func:`field_names`)."""
    return field(default=None, repr=False, compare=False, metadata={"now": now})


def adopt_earlier_names(settings: Any) -> None:
    """Each :func:`earlier_name` field of settings dataclass ``settings`` that is set: its value
    under the name now (:func:`old_keyword`: a warning, or an error when both are set), the
    earlier one cleared; frozen dataclasses too (for their ``__post_init__``)."""
    defaults = {f.name: f.default for f in fields(settings)}
    for f in fields(settings):
        if (now := f.metadata.get("now")) is not None:
            given, value = getattr(settings, f.name), getattr(settings, now)
            value = old_keyword(type(settings).__name__, f.name, now, given, value, defaults[now])
            object.__setattr__(settings, now, value)
            object.__setattr__(settings, f.name, None)


def field_names(cls: type) -> list[str]:
    """The fields of settings dataclass ``cls`` a user sets now (earlier names left out)."""
    return [f.name for f in fields(cls) if "now" not in f.metadata]
