"""Local problem files and folders: which one a source names, and clear errors when it is wrong.

`coscale.tasks.loaders` and `coscale.tasks.benchmarks` both look for a local file or folder
before they try the HF Hub. A missing local path is a one-line ``FileNotFoundError`` naming it,
never a traceback from pyarrow or ``datasets``; a file of a kind that is not read, an unreadable
Parquet file or a folder that ``save_to_disk`` did not write is an error naming the path too.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

FILE_KINDS = (".jsonl", ".json", ".parquet")
"""Suffixes of the local files that are read (``.json`` holds JSON Lines or a JSON array)."""
_DATA_SUFFIXES = (*FILE_KINDS, ".csv", ".tsv", ".txt", ".arrow", ".gz", ".zip")  # never on the Hub
_KINDS_HINT = "a .jsonl / .json / .parquet file, a Dataset.save_to_disk folder or a HF hub name"


def looks_like_path(name: str) -> bool:
    """True when ``name`` cannot be a HF hub id (``name`` or ``org/name``).

    That is a data-file suffix, a leading ``/``, ``.`` or ``~``, a backslash or two ``/``.
    """
    return (
        Path(name).suffix.lower() in _DATA_SUFFIXES
        or name.startswith(("/", ".", "~"))
        or "\\" in name
        or name.count("/") > 1
    )


def local_path(source: str | os.PathLike, setting: str = "source") -> Path | None:
    """The local file or folder that ``source`` names; None when it is to be a HF hub name.

    Args:
        source: A path or a hub name.
        setting: How messages name the setting, e.g. ``source`` or ``problem source 'x': path``.

    Raises:
        FileNotFoundError: ``source`` does not exist and is a path (`looks_like_path`).
        ValueError: ``source`` is a file whose kind is not read (e.g. ``.csv``).
    """
    text, path = os.fspath(source), Path(source)
    if path.is_dir():
        return path
    if path.is_file():
        if path.suffix.lower() in FILE_KINDS:
            return path
        kind = f"a {path.suffix} file" if path.suffix else "a file without a suffix"
        raise ValueError(f"{setting}={text!r} is {kind}, which is not read; give {_KINDS_HINT}")
    if looks_like_path(text):
        raise FileNotFoundError(
            f"{setting}={text!r}: no such file or folder (it is a local path, not a HF hub "
            f"name; relative paths start at {os.getcwd()})"
        )
    return None


def not_local_note(name: str) -> str:
    """Added to a failed Hub load: the name is no local path either."""
    return f" There is no local file or folder {name!r} either (relative to {os.getcwd()})."


def load_saved(path: Path, split: str, setting: str = "source") -> tuple[Any, str | None]:
    """A ``save_to_disk`` folder's data set, and the split taken from a ``DatasetDict`` (or None).

    Raises:
        FileNotFoundError: The folder was not written by ``save_to_disk``.
        ValueError: ``split`` is not a split of the saved ``DatasetDict``.
    """
    import datasets

    try:
        data = datasets.load_from_disk(str(path))
    except FileNotFoundError as err:  # datasets' own message, with our setting and hint
        raise FileNotFoundError(
            f"{setting}={str(path)!r} is a folder that Dataset.save_to_disk did not write "
            f"({err}); give {_KINDS_HINT}"
        ) from None
    if not isinstance(data, datasets.DatasetDict):
        return data, None
    if split not in data:
        raise ValueError(
            f"split={split!r} is not in {setting}={str(path)!r}; choose one of {list(data)}"
        )
    return data[split], split


def open_parquet(path: Path, setting: str = "source") -> Any:
    """A ``pyarrow.parquet.ParquetFile``; a file that is not Parquet names its path."""
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path)
    except Exception as err:  # ArrowInvalid, OSError: pyarrow's many ways of saying "not Parquet"
        raise ValueError(f"{setting}={str(path)!r} is not a readable Parquet file: {err}") from None


def parquet_rows(table: Any) -> Iterator[dict[str, Any]]:
    """The rows of a ``ParquetFile``, read 1024 at a time."""
    for batch in table.iter_batches(batch_size=1024):
        yield from batch.to_pylist()


def json_rows(path: Path) -> Iterator[Any]:
    """The values of a JSON array file or of a JSON Lines file (see :func:`json_records`)."""
    return (row for _, _, row in json_records(path))


def json_records(path: Path, label: str | None = None) -> Iterator[tuple[int, str, Any]]:
    """``(index, where, value)`` of each value of a JSON array file or a JSON Lines file.

    The one reader of JSON data: a file whose first non-blank character is ``[`` is a JSON array,
    any other is JSON Lines (blank lines skipped). ``where`` is ``<label>:<line>``, the line of
    the file where the value starts (1-based, as editors count); ``label`` is the path by default.

    Raises:
        ValueError: At the first text that is not JSON (a bad encoding included), naming the file
            and its line: ``data/train.jsonl:3: invalid JSON: Unterminated string (column 12)``.
    """
    label = str(path) if label is None else label
    data = path.read_bytes()
    if data.lstrip()[:1] == b"[":
        yield from _array_records(_text(data, label), label)
        return
    for line_no, line in enumerate(data.split(b"\n"), start=1):
        if line.strip():
            yield line_no - 1, f"{label}:{line_no}", _value(line, label, line_no)


def _text(data: bytes, label: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise ValueError(f"{label}:{line}: invalid JSON: not UTF-8 ({err.reason})") from None


def _value(line: bytes, label: str, line_no: int) -> Any:
    """One JSON Lines value; an error names the file's line (and the column in it)."""
    try:
        return json.loads(line)
    except json.JSONDecodeError as err:
        raise ValueError(
            f"{label}:{line_no}: invalid JSON: {err.msg} (column {err.colno})"
        ) from None
    except ValueError as err:  # an encoding json cannot read
        raise ValueError(f"{label}:{line_no}: invalid JSON: {err}") from None


def _array_records(text: str, label: str) -> Iterator[tuple[int, str, Any]]:
    """The items of a JSON array, each with the line it starts on."""
    decoder, pos, index = json.JSONDecoder(), text.index("[") + 1, 0
    try:
        while True:
            pos = _skip_space(text, pos)
            if text.startswith("]", pos) and index == 0:
                break
            value, end = decoder.raw_decode(text, pos)
            yield index, f"{label}:{text.count(chr(10), 0, pos) + 1}", value
            index, pos = index + 1, _skip_space(text, end)
            if text.startswith("]", pos):
                break
            if not text.startswith(",", pos):
                raise json.JSONDecodeError("expected ',' or ']' after an item", text, pos)
            pos += 1
    except json.JSONDecodeError as err:
        where = f"{label}:{err.lineno}"
        raise ValueError(f"{where}: invalid JSON: {err.msg} (column {err.colno})") from None
    if text[pos + 1 :].strip():
        line = text.count("\n", 0, pos) + 1
        raise ValueError(f"{label}:{line}: invalid JSON: text after the array's closing ']'")


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos
