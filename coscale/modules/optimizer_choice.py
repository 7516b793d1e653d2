"""An optimiser and a learning-rate scheduler of the user's choosing, as Lightning users give them.

Both modules train with coscale's AdamW (:mod:`coscale.modules.optim`, the ``optimizer``
settings group) unless told otherwise:

* ``custom_optimizer``: any ``torch.optim.Optimizer`` class with its arguments but not the
  parameters (LightningCLI's ``OptimizerCallable``): in YAML ``{class_path: torch.optim.SGD,
  init_args: {lr: 0.01, momentum: 0.9}}``, in Python ``functools.partial(torch.optim.SGD,
  lr=0.01)``. It is built over the trainable parameters (after FSDP2's sharding) and replaces
  the ``optimizer`` group, which is then left at its default.
* ``lr_scheduler``: any scheduler class with its arguments but not the optimiser
  (``LRSchedulerCallable``), stepped after every optimiser step, the way Hugging Face and TRL
  count. It replaces ``optimizer.warmup_steps`` and ``optimizer.decay``, left at 0 and
  ``constant``; it can also schedule coscale's AdamW.

In ``coscale fit`` they are LightningCLI's top-level ``optimizer:`` and ``lr_scheduler:`` keys;
in ``coscale run``, ``pipeline.sft`` / ``pipeline.grpo`` take them under these names.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import torch

from coscale.checks import as_group, imported
from coscale.modules.settings import AdamWSettings

CALLABLE_KEYS = ("custom_optimizer", "lr_scheduler")
"""The module arguments that hold a class to be called later, not an object to build now."""


def as_callable(value: Any, setting: str) -> Callable[..., Any] | None:
    """None, a callable, or a ``{"class_path", "init_args"}`` mapping made into one (the class
    with those arguments bound); a class that cannot be imported is refused naming ``setting``."""
    if value is None or callable(value):
        return value
    if not isinstance(value, Mapping) or "class_path" not in value:
        raise ValueError(
            f"{setting} must be a class_path mapping ({{class_path: torch.optim.SGD, init_args: "
            f"{{lr: 0.01}}}}) or a callable, got {value!r}"
        )
    cls = imported(value["class_path"], f"{setting}.class_path")
    return functools.partial(cls, **dict(value.get("init_args") or {}))


def choice_errors(
    optimizer: Any, custom_optimizer: Any, lr_scheduler: Any, default: AdamWSettings
) -> list[str]:
    """What is wrong with a module's choice, named: a class that cannot be imported, or settings
    of the ``optimizer`` group that the chosen optimiser or scheduler would silently override.
    ``optimizer`` is the group as given (an ``AdamWSettings``, a mapping, or None for
    ``default``)."""
    errors, chosen = [], {}
    for name, value in (("custom_optimizer", custom_optimizer), ("lr_scheduler", lr_scheduler)):
        try:
            chosen[name] = as_callable(value, name)
        except ValueError as err:
            errors.append(str(err))
            chosen[name] = None
    settings = default if optimizer is None else as_group(AdamWSettings, optimizer)
    if chosen["custom_optimizer"] is not None and settings != default:
        errors.append(
            "custom_optimizer replaces the optimizer group (coscale's AdamW): leave optimizer "
            f"at its default, got {settings}"
        )
    if chosen["lr_scheduler"] is not None and (
        settings.warmup_steps or settings.decay != "constant"
    ):
        errors.append(
            "lr_scheduler replaces optimizer.warmup_steps and optimizer.decay: leave them at 0 "
            f"and constant, got {settings.warmup_steps} and {settings.decay!r}"
        )
    return errors


def with_scheduler(optimizer: torch.optim.Optimizer, lr_scheduler: Callable | None) -> dict:
    """Lightning's ``configure_optimizers`` answer: the scheduler stepped every optimiser step."""
    if lr_scheduler is None:
        return {"optimizer": optimizer}
    schedule = {"scheduler": lr_scheduler(optimizer), "interval": "step"}
    return {"optimizer": optimizer, "lr_scheduler": schedule}


def peak_lr(custom_optimizer: Callable[..., torch.optim.Optimizer]) -> float:
    """The learning rate the optimiser starts at (built once over a stand-in parameter)."""
    probe = custom_optimizer([torch.nn.Parameter(torch.zeros(1))])
    return float(probe.param_groups[0]["lr"])


def describe(value: Callable | None) -> dict[str, Any] | None:
    """How the hyper-parameters record a chosen class: its ``class_path`` mapping, which
    :func:`as_callable` reads back (``load_from_checkpoint``). ``value`` is a
    ``functools.partial`` of the class (jsonargparse's holds the class among its arguments)."""
    if value is None:
        return None
    bound = [getattr(value, "func", value), *getattr(value, "args", ())]
    cls = next((b for b in bound if isinstance(b, type)), bound[0])
    path = f"{getattr(cls, '__module__', '')}.{getattr(cls, '__qualname__', repr(cls))}"
    return {"class_path": path, "init_args": dict(getattr(value, "keywords", {}))}
