"""A stage's checkpoints on disk: whole versions behind an atomically switched pointer file.

A Lightning checkpoint is a file (one process, DDP: rank 0 writes it) or a folder of shards
(FSDP2 through ``ModelParallelStrategy``: a ``.distcp`` file per rank, ``.metadata``, ``meta.pt``).
A folder cannot be renamed over another (``os.replace`` refuses a non-empty target), so a save
never overwrites: it writes a new version ``<dir>/v<k>.ckpt``, every rank's part complete, and only
then is the small pointer file ``<dir>/latest`` (the version's name, written to a temporary file,
fsynced, renamed) switched to it and the older version removed. A SIGKILL at any instant leaves the
pointer naming a whole version: before the switch the old one (a half-written new version is a
leftover, removed by :func:`remove_leftovers` when the next fit starts), after it the new one.

Each switch also writes the version's manifest (``<version>.manifest.json``: what it holds, each
file's size) and keeps the whole version before it, so a damaged latest version (a truncated
file, a missing shard: storage that lost part of a write) is found on resume and the fit goes on
from the commit point before it, saying what it redoes; a stage whose every version is damaged
starts again from its beginning (the run's state file holds the state before it).

:func:`last_checkpoint` is the one reader: the stage fits resume from it, and tools that look
into a stage's state (``benchmarks/rollback_run.py``) read it too. Lightning-free; the caller
decides which rank writes and where the barriers go (``coscale.run.checkpoint``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil

from coscale.log import EVERY_RANK, logger
from coscale.loop.commit import write_text

POINTER = "latest"
LEGACY = "last.ckpt"  # runs saved before versions: one file, replaced atomically
MANIFEST = ".manifest.json"  # beside each version: <version>.manifest.json
_reported: set[str] = set()  # damaged versions already named in this process


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (a full disk, ...); the last whole one is untouched."""


def last_checkpoint(dirpath: str) -> str | None:
    """The whole checkpoint to resume from in ``dirpath`` (file or folder), None when none.

    The latest version unless its manifest finds it damaged; then the one kept before it (a
    line on stderr names the damage and what is redone), or None when none is whole.

    Raises:
        FileNotFoundError: When the pointer names a version that is not there (removed by hand).
    """
    names = _kept(dirpath)
    if not names:
        return None
    path = os.path.join(dirpath, names[0])
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"{os.path.join(dirpath, POINTER)} names {names[0]}, which is missing: the stage cannot "
            f"resume from it; remove {dirpath} to run the stage again from its start"
        )
    damaged = []
    for name in names:
        path = os.path.join(dirpath, name)
        why = damage(path)
        if why is None:
            _report(damaged, path)
            return path
        damaged.append((path, why))
    _report(damaged, None)
    return None


def damage(path: str) -> str | None:
    """What is wrong with version ``path`` by its manifest (None: whole, or no manifest)."""
    manifest = path + MANIFEST
    if not os.path.exists(manifest):
        return None if os.path.exists(path) else "it is missing"
    with open(manifest) as f:
        files = json.load(f)["files"]
    for rel, size in files.items():
        file = os.path.join(path, rel) if rel else path
        if not os.path.exists(file):
            return f"{rel or os.path.basename(path)} is missing"
        if (got := os.path.getsize(file)) != size:
            return f"{rel or os.path.basename(path)} holds {got} of its {size} bytes"
    return None


def _report(damaged: list[tuple[str, str]], resumed: str | None) -> None:
    """One line per damaged version skipped (once per process), naming what is redone."""
    for path, why in damaged:
        if path in _reported:
            continue
        _reported.add(path)
        if resumed is None:
            then = "no whole checkpoint is left before it: the stage starts again from its start"
        else:
            then = f"resuming from {os.path.basename(resumed)} ({_what(resumed)}), the commit "
            then += "point before it; the work after that point is redone"
        logger.warning(f"checkpoint {path} is damaged ({why}): {then}", extra=EVERY_RANK)


def _what(path: str) -> str:
    """The point a version was saved at, as its manifest says."""
    with contextlib.suppress(OSError, ValueError, KeyError), open(path + MANIFEST) as f:
        return json.load(f)["what"]
    return "an earlier save"


def next_version(dirpath: str) -> str:
    """The path the next save writes to: one version after the pointer's (``v000001.ckpt`` first)."""
    name = _target(dirpath)
    number = int(name[1:7]) if name and name != LEGACY else 0
    return os.path.join(dirpath, f"v{number + 1:06d}.ckpt")


def switch_to(path: str, what: str = "") -> None:
    """Points ``<dir>/latest`` at the whole version ``path`` atomically, keeping the whole
    version before it, then removes the rest. First writes ``path``'s manifest (``what``: the
    point it was saved at).

    Call on one rank, after every rank's part of ``path`` is on disk.
    """
    dirpath, name = os.path.split(path)
    before = last_checkpoint(dirpath)  # the whole one resumed from or saved last
    write_text(path + MANIFEST, json.dumps({"what": what, "files": _sizes(path)}))
    kept = [name] + ([os.path.basename(before)] if before and before != path else [])
    write_text(os.path.join(dirpath, POINTER), "".join(f"{n}\n" for n in kept))
    _fsync_dir(dirpath)
    remove_leftovers(dirpath)


def _sizes(path: str) -> dict[str, int]:
    """Each file of version ``path`` (relative; "" for a one-file version) with its size."""
    if not os.path.isdir(path):
        return {"": os.path.getsize(path)}
    return {
        os.path.relpath(os.path.join(root, f), path): os.path.getsize(os.path.join(root, f))
        for root, _, files in os.walk(path)
        for f in files
    }


def remove_leftovers(dirpath: str) -> list[str]:
    """Removes every entry of ``dirpath`` but the pointer and the versions it keeps, with their
    manifests (half-written versions of a killed save, older versions); returns the names
    removed."""
    if not os.path.isdir(dirpath):
        return []
    kept = _kept(dirpath)
    keep = {POINTER, *kept, *(name + MANIFEST for name in kept)}
    removed = sorted(set(os.listdir(dirpath)) - keep)
    for name in removed:
        remove_path(os.path.join(dirpath, name))
    return removed


def remove_all(dirpath: str) -> None:
    """Removes the stage's checkpoints: the pointer first, so that no reader meets a pointer to
    a version being deleted."""
    remove_path(os.path.join(dirpath, POINTER))
    shutil.rmtree(dirpath, ignore_errors=True)


def remove_path(path: str) -> None:
    """Removes a version (file or folder) if it is there."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        with contextlib.suppress(FileNotFoundError):  # another process removed it first
            os.remove(path)


def _target(dirpath: str) -> str | None:
    """The latest version's name; without a pointer, a legacy ``last.ckpt`` when there is one."""
    kept = _kept(dirpath)
    return kept[0] if kept else None


def _kept(dirpath: str) -> list[str]:
    """The versions the pointer keeps, newest first (a legacy ``last.ckpt`` without one)."""
    pointer = os.path.join(dirpath, POINTER)
    if os.path.exists(pointer):
        with open(pointer) as f:
            return [line.strip() for line in f if line.strip()]
    return [LEGACY] if os.path.exists(os.path.join(dirpath, LEGACY)) else []


def _fsync_dir(dirpath: str) -> None:
    """Makes the rename itself durable (a no-op where folders cannot be opened)."""
    try:
        fd = os.open(dirpath, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
