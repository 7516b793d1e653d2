"""The Lightning logger of a pipeline's fits (W&B by default, offline without an API key), and
the one way to log outside ``self.log``."""

from __future__ import annotations

import os
import secrets
import string
from typing import Any, Literal

LoggerKind = Literal["wandb", "csv", "none"]


def wandb_mode() -> str:
    """``WANDB_MODE`` if set, else ``online`` with an API key and ``offline`` without one (a run
    never fails for lack of one)."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    has_key = os.environ.get("WANDB_API_KEY") or os.path.exists(os.path.expanduser("~/.netrc"))
    return "online" if has_key else "offline"


WANDB_ARGS = ("name", "entity", "group", "tags", "notes", "mode", "log_model", "job_type")
"""``WandbLogger`` arguments ``pipeline.wandb`` passes through."""
RUN_ID = "wandb_run_id"  # in the logs folder: the W&B run a resumed run goes on in


def make_logger(
    kind: LoggerKind, save_dir: str, project: str = "coscale", name: str | None = None, **wandb
) -> Any:
    """A Lightning logger writing under ``save_dir``; ``none`` returns False (no logger).

    W&B: one run per ``save_dir``, its id kept in ``<save_dir>/wandb_run_id``, so a restarted
    run resumes the same W&B run; ``wandb`` holds ``WandbLogger``'s own arguments
    (:data:`WANDB_ARGS`; ``mode`` defaults to :func:`wandb_mode`). ``log_model`` is not handed to
    ``WandbLogger`` (it logs ``ModelCheckpoint`` files; a run's commit checkpoints are training
    state): it sets ``log_final_model``, and the run logs its final model folder as an artifact
    (:mod:`coscale.modules.artifacts`). Both loggers log on the run's one step axis
    (:mod:`coscale.modules.run_steps`).
    """
    if unknown := sorted(set(wandb) - set(WANDB_ARGS)):
        raise ValueError(f"pipeline.wandb: unknown keys {unknown}; it takes {list(WANDB_ARGS)}")
    if kind == "none":
        return False
    os.makedirs(save_dir, exist_ok=True)
    if kind == "csv":
        from coscale.modules.run_steps import RunCSVLogger

        return RunCSVLogger(save_dir=save_dir, name=name or project)
    if kind == "wandb":
        from coscale.modules.run_steps import RunWandbLogger

        os.environ["WANDB_MODE"] = wandb.pop("mode", None) or wandb_mode()
        name, log_model = wandb.pop("name", name), bool(wandb.pop("log_model", False))
        logger = RunWandbLogger(
            project=project,
            name=name,
            save_dir=save_dir,
            id=_run_id(save_dir),
            resume="allow",
            **wandb,
        )
        logger.log_final_model = log_model  # the run's final model, not Lightning's checkpoints
        return logger
    raise ValueError(f"logger must be one of wandb, csv, none; got {kind!r}")


def _run_id(save_dir: str) -> str:
    """The W&B run id of the run logging under ``save_dir`` (made and kept on first use)."""
    path = os.path.join(save_dir, RUN_ID)
    if os.path.exists(path):
        with open(path) as f:
            return f.read().strip()
    from lightning.pytorch.utilities import rank_zero_only

    from coscale.loop.commit import write_text

    run_id = "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))
    if rank_zero_only.rank == 0:  # the rank whose W&B run it is (the others log nothing)
        write_text(path, run_id + "\n")
    return run_id


def log_to_loggers(trainer: Any, metrics: dict[str, float], step: int | None = None) -> None:
    """Logs ``metrics`` at ``step`` (None: the trainer's global step) straight to the trainer's
    loggers, from rank 0: where ``self.log`` cannot (outside the training loop, or from code that
    is not a module). ``trainer`` may be anything with ``loggers`` (a stage's, outside a fit)."""
    if metrics and trainer is not None and getattr(trainer, "is_global_zero", True):
        at = trainer.global_step if step is None else step
        for logger in getattr(trainer, "loggers", []):
            logger.log_metrics(dict(metrics), step=at)


def finish(logger: Any) -> None:
    """Writes what the logger still holds (a CSV log's rows since the last fit's end: the final
    stage's) and closes a W&B run (False: nothing to do)."""
    if logger and hasattr(logger, "save"):
        logger.save()
    experiment = getattr(logger, "experiment", None) if logger else None
    if experiment is not None and hasattr(experiment, "finish"):
        experiment.finish()
