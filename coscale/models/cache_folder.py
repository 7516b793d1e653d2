"""A model folder in the shared cache, built once even when several processes ask at once.

Ranks of one job, or two jobs started together, may all find a cached model missing and build
it. Each builds into a private temporary folder beside the target and renames it into place:
the first rename wins, the others are dropped, and no process ever reads a half-written folder
(one that has its ``config.json`` but not yet its weights).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def build_once(folder: str | os.PathLike, build: Callable[[Path], None]) -> str:
    """``folder``, made by ``build(tmp)`` into a temporary folder renamed into place unless a
    complete one (with ``config.json``) is there already. Errors of ``build`` propagate."""
    folder = Path(folder)
    if (folder / "config.json").exists():
        return str(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=folder.parent))
    try:
        build(tmp)
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache may be shared
        os.rename(tmp, folder)
    except OSError:
        if not (folder / "config.json").exists():  # not a lost race: a real failure
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return str(folder)
