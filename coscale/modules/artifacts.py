"""Files of a run kept in its W&B run as artifacts: the final model with ``pipeline.wandb.log_model``,
the demo's report and plots.

W&B's own ``log_model`` logs the checkpoints a Lightning ``ModelCheckpoint`` saves; a coscale run
has none (its commit checkpoints are training state, kept on disk for resuming). What a user wants
in W&B is the model the run ships: the final stage's Hugging Face folder (with ``adapter/`` when
the run trains LoRA adapters), its validation scores as the artifact's metadata. Logging the same
folder again (a finished run started again) adds no version: W&B keeps one per content digest.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

from coscale.distributed import is_writer
from coscale.log import logger as log


def wandb_run(logger: Any) -> Any:
    """The W&B run behind a Lightning logger, None for any other logger (or False: none)."""
    from lightning.pytorch.loggers import WandbLogger

    return logger.experiment if isinstance(logger, WandbLogger) else None


def artifact_name(text: str) -> str:
    """``text`` as a W&B artifact name (letters, digits, ``-``, ``_`` and ``.`` only)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "coscale"


def log_model_folder(
    logger: Any, folder: str, metadata: Mapping[str, Any] | None = None, name: str | None = None
) -> bool:
    """``folder`` (every file under it) as a ``model`` artifact of the logger's W&B run (``name``,
    default ``model-<run id>`` as Lightning names its own), aliased ``latest`` and ``final``;
    ``metadata``: its numbers (scores). False where nothing is logged: the logger is not W&B's,
    or this is not rank 0."""
    if not is_writer() or (run := wandb_run(logger)) is None:
        return False
    import wandb

    numbers = {k: v for k, v in (metadata or {}).items() if isinstance(v, int | float | str)}
    name = artifact_name(name or f"model-{run.id}")
    artifact = wandb.Artifact(name, type="model", metadata=numbers)
    artifact.add_dir(folder, policy="immutable")  # the folder is final: no staging copy
    run.log_artifact(artifact, aliases=["latest", "final"])
    log.info(f"logged {folder} to W&B as model artifact {artifact.name}")
    return True


def log_files(logger: Any, paths: Iterable[str], name: str, kind: str = "report") -> bool:
    """The files ``paths`` that exist as one artifact ``name`` of type ``kind``; False when the
    logger is not W&B's or no file exists."""
    paths = [p for p in paths if os.path.isfile(p)]
    if not paths or not is_writer() or (run := wandb_run(logger)) is None:
        return False
    import wandb

    artifact = wandb.Artifact(artifact_name(name), type=kind)
    for path in paths:
        artifact.add_file(path)
    run.log_artifact(artifact)
    return True
