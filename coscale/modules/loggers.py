"""The Lightning logger of a pipeline's fits (W&B by default, offline without an API key), and
the one way to log outside ``self.log``."""

from __future__ import annotations

import os
from typing import Any, Literal

LoggerKind = Literal["wandb", "csv", "none"]


def wandb_mode() -> str:
    """``WANDB_MODE`` if set, else ``online`` with an API key and ``offline`` without one (a run
    never fails for lack of one)."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    has_key = os.environ.get("WANDB_API_KEY") or os.path.exists(os.path.expanduser("~/.netrc"))
    return "online" if has_key else "offline"


def make_logger(
    kind: LoggerKind, save_dir: str, project: str = "coscale", name: str | None = None
) -> Any:
    """A Lightning logger writing under ``save_dir``; ``none`` returns False (no logger)."""
    if kind == "none":
        return False
    os.makedirs(save_dir, exist_ok=True)
    if kind == "csv":
        from lightning.pytorch.loggers import CSVLogger

        return CSVLogger(save_dir=save_dir, name=name or project)
    if kind == "wandb":
        from lightning.pytorch.loggers import WandbLogger

        os.environ["WANDB_MODE"] = wandb_mode()
        return WandbLogger(project=project, name=name, save_dir=save_dir)
    raise ValueError(f"logger must be one of wandb, csv, none; got {kind!r}")


def log_to_loggers(trainer: Any, metrics: dict[str, float], step: int | None = None) -> None:
    """Logs ``metrics`` at ``step`` (None: the trainer's global step) straight to the trainer's
    loggers, from rank 0: where ``self.log`` cannot (outside the training loop, or from code that
    is not a module). ``trainer`` may be anything with ``loggers`` (a stage's, outside a fit)."""
    if metrics and trainer is not None and getattr(trainer, "is_global_zero", True):
        at = trainer.global_step if step is None else step
        for logger in getattr(trainer, "loggers", []):
            logger.log_metrics(dict(metrics), step=at)
