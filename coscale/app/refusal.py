"""A parser's refusal in one line: the setting, the file and line that set it, what is wrong, and
for an unknown key the nearest known ones (instead of jsonargparse's usage dump).

jsonargparse says what is wrong in a few shapes (``Group 'pipeline' does not accept option 'x'``,
``Parser key "pipeline.x": Expected ...``, ``unrecognized arguments: --pipeline.x 3``, ``Option
'model.init_args.x' is not accepted``); the key is read out of it, looked up in the ``--config``
files given (``yaml.compose`` keeps each key's line) and compared with the parser's own keys.
"""

from __future__ import annotations

import difflib
import inspect
import re
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

import yaml

from coscale.checks import imported

_KEY_PATTERNS = (
    r"Group '(?P<group>[^']+)' does not accept option '(?P<key>[^']+)'",
    r"Subcommand '[^']+' does not accept option '(?P<key>[^']+)'",
    r'Parser key "(?P<key>[^"]+)"',
    r"unrecognized arguments: --(?P<key>[\w.]+)",
    r"Option '(?P<key>[^']+)' is not accepted",
)
UNKNOWN = ("does not accept", "unrecognized arguments", "is not accepted")
FIT_SECTIONS = ("model", "trainer", "ckpt_path", "seed_everything", "optimizer", "lr_scheduler")


def config_files(argv: Sequence[str]) -> list[str]:
    """The ``--config`` files of a command line, in order."""
    files = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--config"]
    return files + [a.split("=", 1)[1] for a in argv if a.startswith("--config=")]


def refused_key(message: str) -> str | None:
    """The dotted setting a jsonargparse refusal is about, or None. An option refused inside
    a ``class_path`` value (``Parser key "model": ... class_path 'C': Option 'x' is not
    accepted``) is ``model.init_args.x``."""
    inner = re.search(r"""Parser key "([^"]+)".*class_path '[^']+'.*Option '([^']+)'""", message)
    if inner:
        return f"{inner[1]}.init_args.{inner[2]}"
    for pattern in _KEY_PATTERNS:
        if found := re.search(pattern, message):
            group = found.groupdict().get("group")
            return f"{group}.{found['key']}" if group else found["key"]
    return None


def where_set(key: str, files: Sequence[str]) -> str | None:
    """``file:line`` of the last config file that sets ``key``, or None when no file names it
    (a flag set it)."""
    found = None
    for path in files:
        line = _line_of(path, key.split("."))
        if line is not None:
            found = f"{path}:{line}"
    return found


def _line_of(path: str, parts: list[str]) -> int | None:
    try:
        with open(path) as f:
            node = yaml.compose(f)
    except (OSError, yaml.YAMLError):
        return None
    line = None
    for part in parts:
        pairs = node.value if isinstance(node, yaml.MappingNode) else []
        found = next(((k, v) for k, v in pairs if getattr(k, "value", None) == part), None)
        if found is None:
            return None
        line, node = found[0].start_mark.line + 1, found[1]
    return line


def other_command(files: Sequence[str], prog: str) -> str | None:
    """The refusal of a config file written for the other command: a ``coscale fit`` config
    (top-level ``model`` / ``trainer``, no ``pipeline``) given to ``coscale run``, or a run
    config (top-level ``pipeline``) given to ``coscale fit`` / ``validate``; None if neither."""
    for path in files:
        try:
            with open(path) as f:
                top = yaml.safe_load(f)
        except (OSError, yaml.YAMLError):
            continue
        if not isinstance(top, dict):
            continue
        if "run" in prog and "pipeline" not in top and set(top) & set(FIT_SECTIONS):
            return (
                f"{path} is a coscale fit config (top-level model/trainer sections): {prog} "
                f"takes pipeline and data sections; run it with coscale fit --config {path}"
            )
        if "run" not in prog and "pipeline" in top:
            return (
                f"{path} is a coscale run config (top-level pipeline section): run it with "
                f"coscale run --config {path}"
            )
    return None


def nearest(key: str, known: Sequence[str]) -> list[str]:
    """Known keys for an unknown ``key``: its first part that no known key has, replaced by the
    nearest names the keys beside it have (the rest of ``key`` kept where that is known)."""
    parts = key.split(".")
    paths = [k.split(".") for k in known]
    at = next((i for i in range(len(parts)) if not _has(paths, parts[: i + 1])), len(parts) - 1)
    names = sorted({p[at] for p in paths if len(p) > at and p[:at] == parts[:at]})
    out = []
    for name in difflib.get_close_matches(parts[at], names, 2, 0.7):
        whole = ".".join([*parts[:at], name, *parts[at + 1 :]])
        out.append(whole if whole in known else ".".join([*parts[:at], name]))
    return out


def _has(paths: list[list[str]], prefix: list[str]) -> bool:
    return any(p[: len(prefix)] == prefix for p in paths)


def class_arguments(message: str, key: str) -> list[str]:
    """For an option refused inside a ``class_path`` value: that class's arguments, as keys
    beside ``key`` (``model.init_args.<name>``)."""
    found = re.search(r"class_path '([\w.]+)'", message)
    if not found or ".init_args." not in key:
        return []
    try:
        params = inspect.signature(imported(found[1], key)).parameters
    except (TypeError, ValueError):
        return []
    group = key.rpartition(".")[0]
    return [f"{group}.{p}" for p in params if p not in ("self", "args", "kwargs")]


def one_line(
    message: str, known: Sequence[str], argv: Sequence[str], prog: str, hints: Sequence[str] = ()
) -> str:
    """The refusal ``message`` as one line for ``prog`` (``coscale run``), ``hints`` after it."""
    text = " ".join(line.strip() for line in message.splitlines() if line.strip())
    files = config_files(argv)
    if any(u in text for u in UNKNOWN) and (other := other_command(files, prog)):
        return f"{prog}: error: {other}"
    key, after = refused_key(text), "".join(f"; {h}" for h in hints)
    if key is None:
        return f"{prog}: error: {text}{after}"
    where = where_set(key, files)
    prefix = f"{prog}: error: {where}: " if where else f"{prog}: error: "
    if any(u in text for u in UNKNOWN):
        known = [*known, *class_arguments(text, key)]
        near = nearest(key, known) if not hints else []
        after += f"; did you mean {' or '.join(near)}?" if near else ""
        return f"{prefix}{key} is not a setting of {prog}{after}"
    return prefix + text + after


class OneLineRefusals:
    """A jsonargparse parser's refusals in one line (:func:`one_line`) and exit status 2,
    where jsonargparse prints its usage; mixed in before the parser class."""

    def parse_args(self, args: Sequence[str] | None = None, *more: Any, **kwargs: Any) -> Any:
        self._argv = list(sys.argv[1:] if args is None else args)  # its --config files
        return super().parse_args(args, *more, **kwargs)  # type: ignore[misc]

    def refuse(self, message: str, ex: Exception | None = None, hints: Sequence[str] = ()):
        """Prints the refusal as one line and exits 2 (inside jsonargparse, where it handles
        the error itself, the parser's own ``error``)."""
        if not self.exit_on_error:  # type: ignore[attr-defined]
            return super().error("; ".join([message, *hints]), ex)  # type: ignore[misc]
        parser = getattr(ex, "subcommand_parser", None) or self
        known = [a.dest for a in parser._actions if a.dest not in ("help", "config")]
        prog = parser.prog.replace(" [options]", "")
        print(one_line(message, known, getattr(self, "_argv", []), prog, hints), file=sys.stderr)
        sys.exit(2)

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        self.refuse(message, ex)
        raise AssertionError("unreachable")  # refuse exits or raises


UNION_FAILED = "Does not validate against any of the Union subtypes"
"""How jsonargparse reports a class that raised while it was built (a module refusing its
settings), its own error among the lines of each subtype it tried."""


def refusal_line(message: str) -> str:
    """The one line of an error ``message`` that says what to change: its first line, or, when
    jsonargparse wrapped a module's refusal in `UNION_FAILED`, the module's own error."""
    lines = message.splitlines() or [message]
    if lines[0].startswith(UNION_FAILED):
        causes = [ln.strip()[2:] for ln in lines if ln.strip().startswith("- ")]
        own = [c for c in causes if not c.startswith("Expected a ")]
        return own[0] if own else lines[0]
    return lines[0]
