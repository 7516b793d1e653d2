"""The records of a W&B offline run file (``offline-run-*/run-<id>.wandb``), read back without
syncing it: what a run logged (its rows, config, artifacts), for tests and pictures of a run.

wandb 0.31 ships no Python reader of its own transaction log. The file is ``:W&B``, a 2-byte
magic and a version byte, then LevelDB's log format: 32 KiB blocks of chunks, each chunk a 7-byte
header (CRC-32, little-endian length, type: 1 full, 2 first, 3 middle, 4 last) and its bytes; a
record is one full chunk or first, middles and last. Each record is a ``wandb_internal_pb2.Record``.
"""

from __future__ import annotations

import json
from pathlib import Path

BLOCK = 32 * 1024
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list:
    """Every record of the run file at ``path``, in the order written."""
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    out, parts, pos = [], b"", HEADER
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # a block's tail too short for a header is padding
            pos += left
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        if kind == 0:  # zeros to the block's end
            pos += left
            continue
        if pos + HEADER + length > len(data):  # a tail cut off mid-chunk (a killed writer)
            break
        parts += data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            out.append(record)
            parts = b""
    return out


def history(path: Path) -> list[dict]:
    """Each ``log`` call's row (key -> value) of the run file at ``path``, in order; a value W&B
    stored in parts (a table: its type, rows, file) comes back as one dict under its key."""
    rows = []
    for record in records(path):
        if record.HasField("history"):
            row: dict = {}
            for item in record.history.item:
                *outer, last = list(item.nested_key) or [item.key]
                place = row
                for key in outer:
                    place = place.setdefault(key, {})
                place[last] = json.loads(item.value_json)
            rows.append(row)
    return rows


def artifacts(path: Path) -> list:
    """The artifact records (``log_artifact``) of the run file at ``path``."""
    return [r.artifact for r in records(path) if r.HasField("artifact")]
