"""The run's ``precision: auto`` decision on disk, so that it is made once per run.

A measured decision could come out differently in another process: a resumed run, or a rank of
a multi-process run, timing again on a busier machine might choose another precision than the
run trained with, and ranks with different precisions would not train one model. So one process,
the launcher's rank 0, decides and writes ``<run_dir>/precision.json`` (atomically: a temporary
file renamed into place); every later resolve of the run reads it back instead of timing.

Lightning's subprocess launcher starts ranks 1.. by running the script again at the first fit,
after rank 0 wrote the record; ``torchrun`` (or ``srun``) starts every rank at once, so a rank
other than 0 waits for the record to appear. No process group exists yet at that point (Lightning
makes it in the fit), so the rank is read from the launchers' environment variables. The run
folder must be one shared folder, as it already is for checkpoints and the state file.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

from coscale.loop.commit import write_json

RECORD = "precision.json"
"""File name of the record in the run folder."""
WAIT_S = 600.0
"""How long a rank other than 0 waits for rank 0's record (it may build or convert the model)."""


def record_path(run_dir: str) -> str:
    """Where the record of the run in ``run_dir`` lives."""
    return os.path.join(run_dir, RECORD)


def read_record(path: str) -> dict[str, Any] | None:
    """The record at ``path``; None when there is none yet."""
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def write_record(path: str, record: dict[str, Any]) -> None:
    """Writes ``record`` to ``path`` atomically."""
    write_json(path, record)


def wait_for_record(path: str, timeout_s: float = WAIT_S, poll_s: float = 0.2) -> dict[str, Any]:
    """The record at ``path`` once rank 0 has written it.

    Raises:
        TimeoutError: None appeared within ``timeout_s`` (names the setting that avoids it).
    """
    deadline = time.monotonic() + timeout_s
    while (record := read_record(path)) is None:
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"pipeline.trainer.precision: auto: this rank waited {timeout_s:.0f} s for rank "
                f"0's decision in {path} (is the run folder shared by every rank?); set "
                "pipeline.trainer.precision to 32-true or bf16-mixed to decide it yourself"
            )
        time.sleep(poll_s)
    return record
