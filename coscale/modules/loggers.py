"""The Lightning logger of a pipeline's fits: W&B by default (offline without an API key)."""

from __future__ import annotations

import os
from typing import Any, Literal

from coscale.modules.wandb_mode import wandb_mode

LoggerKind = Literal["wandb", "csv", "none"]


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


def log_to_loggers(trainer: Any, metrics: dict[str, float]) -> None:
    """Logs ``metrics`` at the current step straight to the loggers (where ``self.log`` cannot:
    outside the training loop, or from code that is not a module)."""
    if metrics and trainer is not None and getattr(trainer, "is_global_zero", True):
        for logger in getattr(trainer, "loggers", []):
            logger.log_metrics(dict(metrics), step=trainer.global_step)
