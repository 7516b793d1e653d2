"""A parser's refusal in one line: the setting, the file and line that set it, what is wrong, and
for an unknown key the nearest known ones (instead of jsonargparse's usage dump).

jsonargparse says what is wrong in a few shapes (``Group 'pipeline' does not accept option 'x'``,
``Parser key "pipeline.x": Expected ...``, ``unrecognized arguments: --pipeline.x 3``, ``Option
'model.init_args.x' is not accepted``); the key is read out of it, looked up in the ``--config``
files given (``yaml.compose`` keeps each key's line) and compared with the parser's own keys.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence

import yaml

_KEY_PATTERNS = (
    r"Group '(?P<group>[^']+)' does not accept option '(?P<key>[^']+)'",
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
    """The dotted setting a jsonargparse refusal is about, or None."""
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


def fit_config(files: Sequence[str]) -> str | None:
    """The first config file that is a ``coscale fit`` config (top-level ``model`` or
    ``trainer``, no ``pipeline``), or None."""
    for path in files:
        try:
            with open(path) as f:
                top = yaml.safe_load(f)
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(top, dict) and "pipeline" not in top and set(top) & set(FIT_SECTIONS):
            return path
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


def one_line(
    message: str, known: Sequence[str], argv: Sequence[str], prog: str, hints: Sequence[str] = ()
) -> str:
    """The refusal ``message`` as one line for ``prog`` (``coscale run``), ``hints`` after it."""
    text = " ".join(line.strip() for line in message.splitlines() if line.strip())
    files = config_files(argv)
    if any(u in text for u in UNKNOWN) and (fit := fit_config(files)):
        return (
            f"{prog}: error: {fit} is a coscale fit config (top-level model/trainer sections): "
            f"{prog} takes pipeline and data sections; run it with coscale fit --config {fit}"
        )
    key, after = refused_key(text), "".join(f"; {h}" for h in hints)
    if key is None:
        return f"{prog}: error: {text}{after}"
    where = where_set(key, files)
    prefix = f"{prog}: error: {where}: " if where else f"{prog}: error: "
    if any(u in text for u in UNKNOWN):
        near = nearest(key, known) if not hints else []
        after += f"; did you mean {' or '.join(near)}?" if near else ""
        return f"{prefix}{key} is not a setting of {prog}{after}"
    return prefix + text + after
