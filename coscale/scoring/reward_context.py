"""What a reward function may know about the training step it scores, and where it may log.

TRL's ``GRPOTrainer`` passes three keyword arguments to every reward function besides the
data: ``trainer_state`` (the trainer's progress, for reward shaping that changes over training),
``log_extra(column, values)`` (a column of the completions table, one value per completion) and
``log_metric(name, value)`` (a scalar logged with the step's metrics). coscale passes the same
three, from one :class:`RewardContext` per scoring call: a TRL-style function gets them when it
names them or takes ``**kwargs``; a coscale-style function only when it names them.

The GRPO module builds a context for each training step (the step, the epoch, the policy's
device) and logs what the functions wrote into its :class:`RewardLog`
(:mod:`coscale.modules.step_log`). Scoring outside a training step (pass-rate measurement,
validation) gets a fresh :class:`RewardContext`: a zero state, and a log nobody reads.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch

CONTEXT_ARGUMENTS = ("trainer_state", "log_extra", "log_metric")
"""The keyword arguments a context adds to a reward call (TRL 1.16's names)."""


@dataclass(frozen=True)
class TrainerState:
    """The trainer's progress, under the names of ``transformers.TrainerState`` that TRL passes.

    Attributes:
        global_step: Optimiser steps taken so far (the Lightning trainer's ``global_step``).
        epoch: Epochs done, with the fraction of the current one (``1.5``: half-way through the
            second epoch), as TRL counts it.
        max_steps: The step limit of the fit (0: none set).
        num_train_epochs: The epoch limit of the fit (0: none set).
        is_world_process_zero: Whether this process is rank 0.
    """

    global_step: int = 0
    epoch: float = 0.0
    max_steps: int = 0
    num_train_epochs: int = 0
    is_world_process_zero: bool = True


class RewardLog:
    """What reward functions logged during one scoring call (TRL's ``log_extra`` / ``log_metric``).

    Attributes:
        extra: Column name -> values, one per completion (a column logged twice is extended).
        metrics: Metric name -> every value logged under it (the step logs their mean).
    """

    def __init__(self) -> None:
        self.extra: dict[str, list[Any]] = defaultdict(list)
        self.metrics: dict[str, list[float]] = defaultdict(list)

    def log_extra(self, column: str, values: list[Any]) -> None:
        """Adds ``values`` (one per completion) to the completions table's ``column``."""
        self.extra[column].extend(values)

    def log_metric(self, name: str, value: float) -> None:
        """Logs the scalar ``value`` under ``name`` (averaged with the step's other values)."""
        self.metrics[name].append(float(value))

    def metric_means(self) -> dict[str, float]:
        """Each logged metric's mean over the values logged in this call."""
        return {name: sum(v) / len(v) for name, v in self.metrics.items() if v}


@dataclass(frozen=True)
class RewardContext:
    """The step a scoring call belongs to: its state, its log and the policy's device.

    Attributes:
        state: Passed as ``trainer_state``.
        log: Its ``log_extra`` and ``log_metric`` are passed under those names.
        device: Where the policy is; a reward model (:class:`~coscale.scoring.reward_model.
            RewardModel`) moves there before it scores. None: models stay where they are.
    """

    state: TrainerState = TrainerState()
    log: RewardLog = field(default_factory=RewardLog)
    device: torch.device | None = None

    def arguments(self) -> dict[str, Any]:
        """``trainer_state``, ``log_extra`` and ``log_metric``, as TRL passes them."""
        return {
            "trainer_state": self.state,
            "log_extra": self.log.log_extra,
            "log_metric": self.log.log_metric,
        }

    def detached(self) -> RewardContext:
        """The same state and device with a log of its own: for calls whose logs must not count
        (repeating a failed call one completion at a time to find the failing one)."""
        return RewardContext(self.state, RewardLog(), self.device)
