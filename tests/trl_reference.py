"""TRL 1.16's own reward scoring, run on the smallest stand-in for its trainer: the reference the
parity tests compare coscale with.

``GRPOTrainer._calculate_rewards`` is called unbound on an object of a ``GRPOTrainer`` subclass
that skips ``__init__`` and holds only what that method (and its profiling decorator) reads: the
device, the step, ``report_to``, the functions with their names, weights and processing classes,
``chat_template_kwargs``, the log sinks and the event loop TRL starts for async functions. Being
a ``GRPOTrainer``, it also runs the reward-model branch (``super()._prepare_inputs``).
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace
from typing import Any

import torch
import trl.trainer.grpo_trainer as trl_grpo  # TRL is a dev dependency: never skipped
from accelerate import PartialState
from trl.trainer.utils import (
    get_callable_name,
    get_config_model_id,
    shutdown_event_loop_in_daemon,
    start_event_loop_in_daemon,
)


class StandIn(trl_grpo.GRPOTrainer):
    """A ``GRPOTrainer`` with the given attributes and nothing else."""

    def __init__(self, **attributes: Any) -> None:  # GRPOTrainer.__init__ is not run
        self.__dict__.update(attributes)


def stand_in(functions, weights=None, processing_classes=None, **attributes) -> StandIn:
    """The stand-in trainer for ``functions`` (its ``_pending_*`` hold what they logged)."""
    names = [  # as GRPOTrainer.__init__ names them
        get_config_model_id(f.config).split("/")[-1]
        if isinstance(f, torch.nn.Module)
        else get_callable_name(f)
        for f in functions
    ]
    trainer = StandIn(
        accelerator=SimpleNamespace(device=torch.device("cpu"), is_main_process=True),
        args=SimpleNamespace(report_to=[], device=torch.device("cpu")),
        is_deepspeed_enabled=False,
        state=SimpleNamespace(global_step=0, epoch=0.0),
        reward_funcs=list(functions),
        reward_processing_classes=processing_classes or [None] * len(functions),
        reward_func_names=names,
        reward_weights=torch.tensor(weights or [1.0] * len(functions), dtype=torch.float32),
        chat_template_kwargs={},
        environments=None,
        _pending_extra_logs=defaultdict(list),
        _pending_metrics=defaultdict(list),
    )
    trainer._log_completion_extra = lambda column, values: trainer._pending_extra_logs[
        column
    ].extend(values)
    trainer._log_metric = lambda name, value: trainer._pending_metrics[name].append(value)
    trainer.__dict__.update(attributes)
    return trainer


def trl_rewards(trainer: StandIn, rows, prompts, completions, completion_ids) -> torch.Tensor:
    """``[R, F]`` TRL's per-function scores: ``rows`` are the data set's rows, one per completion
    (the prompt column included, as TRL's ``inputs``)."""
    PartialState(cpu=True)  # TRL warns through accelerate's logger when a row has no score
    thread, loop, ready = start_event_loop_in_daemon(name="trl-reference")
    ready.wait()
    trainer.async_loop = loop
    try:
        return trl_grpo.GRPOTrainer._calculate_rewards(
            trainer, rows, prompts, completions, completion_ids
        )
    finally:
        shutdown_event_loop_in_daemon(thread, loop)
