"""A stage's checkpoints on disk: whole versions behind an atomically switched pointer file.

A Lightning checkpoint is a file (one process, DDP: rank 0 writes it) or a folder of shards
(FSDP2 through ``ModelParallelStrategy``: a ``.distcp`` file per rank, ``.metadata``, ``meta.pt``).
A folder cannot be renamed over another (``os.replace`` refuses a non-empty target), so a save
never overwrites: it writes a new version ``<dir>/v<k>.ckpt``, every rank's part complete, and only
then is the small pointer file ``<dir>/latest`` (the version's name, written to a temporary file,
fsynced, renamed) switched to it and the older version removed. A SIGKILL at any instant leaves the
pointer naming a whole version: before the switch the old one (a half-written new version is a
leftover, removed by :func:`remove_leftovers` when the next fit starts), after it the new one.

:func:`last_checkpoint` is the one reader: the stage fits resume from it, and tools that look
into a stage's state (``benchmarks/rollback_run.py``) read it too. Lightning-free; the caller
decides which rank writes and where the barriers go (``coscale.stages.checkpoint``).
"""

from __future__ import annotations

import contextlib
import os
import shutil

POINTER = "latest"
LEGACY = "last.ckpt"  # runs saved before versions: one file, replaced atomically


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (a full disk, ...); the last whole one is untouched."""


def last_checkpoint(dirpath: str) -> str | None:
    """The whole checkpoint to resume from in ``dirpath`` (file or folder), None when none.

    Raises:
        FileNotFoundError: When the pointer names a version that is not there (removed by hand).
    """
    name = _target(dirpath)
    if name is None:
        return None
    path = os.path.join(dirpath, name)
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"{os.path.join(dirpath, POINTER)} names {name}, which is missing: the stage cannot "
            f"resume from it; remove {dirpath} to run the stage again from its start"
        )
    return path


def next_version(dirpath: str) -> str:
    """The path the next save writes to: one version after the pointer's (``v000001.ckpt`` first)."""
    name = _target(dirpath)
    number = int(name[1:7]) if name and name != LEGACY else 0
    return os.path.join(dirpath, f"v{number + 1:06d}.ckpt")


def switch_to(path: str) -> None:
    """Points ``<dir>/latest`` at the whole version ``path`` atomically, then removes the rest.

    Call on one rank, after every rank's part of ``path`` is on disk.
    """
    dirpath, name = os.path.split(path)
    tmp = os.path.join(dirpath, POINTER + ".tmp")
    with open(tmp, "w") as f:
        f.write(name + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(dirpath, POINTER))
    _fsync_dir(dirpath)
    remove_leftovers(dirpath)


def remove_leftovers(dirpath: str) -> list[str]:
    """Removes every entry of ``dirpath`` but the pointer and the version it names (half-written
    versions of a killed save, the version before a switch); returns the names removed."""
    if not os.path.isdir(dirpath):
        return []
    keep = {POINTER, _target(dirpath)}
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
    """The name the pointer holds; without a pointer, a legacy ``last.ckpt`` when there is one."""
    pointer = os.path.join(dirpath, POINTER)
    if os.path.exists(pointer):
        with open(pointer) as f:
            return f.read().strip()
    return LEGACY if os.path.exists(os.path.join(dirpath, LEGACY)) else None


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
