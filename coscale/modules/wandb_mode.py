"""W&B's mode: offline when there is no API key, so a run never fails for lack of one."""

from __future__ import annotations

import os


def wandb_mode() -> str:
    """``WANDB_MODE`` if set, else ``online`` with an API key and ``offline`` without one."""
    if os.environ.get("WANDB_MODE"):
        return os.environ["WANDB_MODE"]
    has_key = os.environ.get("WANDB_API_KEY") or os.path.exists(os.path.expanduser("~/.netrc"))
    return "online" if has_key else "offline"
