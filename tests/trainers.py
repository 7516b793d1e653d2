"""One quiet CPU Trainer for the tests that fit a module for a few steps."""

from __future__ import annotations

import lightning as L


def quiet_trainer(steps: int, **kw) -> L.Trainer:
    """``max_steps=steps`` on CPU, with no logger, checkpoints, progress bar or model summary
    unless ``kw`` (more Trainer arguments) says otherwise."""
    quiet = {
        "accelerator": "cpu",
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
    }
    return L.Trainer(max_steps=steps, **(quiet | kw))
