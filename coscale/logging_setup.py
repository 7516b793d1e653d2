"""Choosing the experiment logger: W&B by default, offline when there is no API key.

Lightning is imported lazily so that this file stays usable from the core.
"""

from __future__ import annotations

import os
from typing import Any, Literal

LoggerKind = Literal["wandb", "csv", "none"]


def wandb_mode() -> str:
    """``WANDB_MODE`` if set, else ``online`` with an API key and ``offline`` without one."""
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
