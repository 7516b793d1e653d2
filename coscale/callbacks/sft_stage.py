"""Helpers the callbacks share: an SFT stage as its own seeded fit, sampling, logging, checks.

Re-distillation and the final retrain fine-tune the *initial* model on (question, solution)
pairs in a separate ``lightning.Trainer`` fit of an :class:`~coscale.modules.SFTModule`, seeded
so that the same set always gives the same weights, then copy them into the policy in place.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.utilities import rank_zero_warn
from torch.utils.data import DataLoader

from coscale.metrics import PassAtK
from coscale.modules.distributed import all_gather_objects
from coscale.modules.sft import SFTModule
from coscale.rollout.base import SamplingParams

_OFF = dict(logger=False, enable_checkpointing=False, enable_model_summary=False)
TRAINER_DEFAULTS = _OFF | dict(
    max_epochs=1, enable_progress_bar=True, devices=1, accelerator="auto"
)
"""``lightning.Trainer`` arguments of an SFT stage; ``trainer_kwargs`` override them."""


def run_sft(
    initial_model: str | os.PathLike | Any,
    items: Sequence[Mapping[str, str]],
    sft_kwargs: Mapping[str, Any],
    trainer_kwargs: Mapping[str, Any],
    seed: int = 0,
) -> SFTModule:
    """Fine-tunes ``initial_model`` on ``items`` and returns the trained module.

    Args:
        initial_model: Name or folder of the start weights (a model object is trained in place).
        items: ``{"id", "question", "solution"}`` dicts, shuffled each epoch with ``seed``.
        sft_kwargs: :class:`~coscale.modules.SFTModule` arguments plus ``batch_size`` (pairs
            per step, default 16): one YAML block configures the stage. Not modified.
        trainer_kwargs: ``lightning.Trainer`` arguments over :data:`TRAINER_DEFAULTS`.
        seed: Seeds the shuffle and torch's RNG for the fit (the caller's RNG is restored).

    Raises:
        ValueError: When ``items`` is empty or ``batch_size`` is not an int >= 1.
    """
    kwargs = dict(sft_kwargs)
    batch_size = kwargs.pop("batch_size", 16)
    errors = at_least(1, batch_size=batch_size)
    if not items:
        errors.append("items must hold at least one {'question', 'solution'} dict")
    if errors:
        raise ValueError("run_sft: " + "; ".join(errors))
    cuda = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=cuda), warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*(many workers|no `val_dataloader`).*")
        torch.manual_seed(seed)
        module = SFTModule(model=initial_model, **kwargs)
        shuffle = torch.Generator().manual_seed(seed)
        loader = DataLoader(
            list(items), batch_size, shuffle=True, generator=shuffle, collate_fn=list
        )
        args = TRAINER_DEFAULTS | dict(trainer_kwargs)
        if args.get("enable_progress_bar") and "callbacks" not in args:
            # a nested fit inside another fit: rich's live display cannot nest, tqdm can
            args["callbacks"] = [TQDMProgressBar(leave=False)]
        L.Trainer(**args).fit(module, loader)
    return module


def copy_weights(src_module: Any, dst_module: Any) -> None:
    """Loads ``src_module``'s policy weights into ``dst_module``'s policy, in place.

    Either may be a module with a ``policy`` or a bare ``torch.nn.Module``. A rollout backend
    of ``dst_module`` is pointed at the updated policy (an engine like vLLM holds a copy).
    """
    src = getattr(src_module, "policy", src_module)
    dst = getattr(dst_module, "policy", dst_module)
    dst.load_state_dict(src.state_dict())
    if hasattr(type(dst_module), "backend"):
        dst_module.backend.update_weights(dst)


def datamodule_or_warn(trainer: Any, owner: Any, datamodule: Any = None) -> Any | None:
    """``datamodule`` (default: the trainer's, set by ``fit``), or None with one warning."""
    dm = datamodule if datamodule is not None else getattr(trainer, "datamodule", None)
    if dm is not None and hasattr(dm, "pools") and hasattr(dm, "problems"):
        return dm
    if not getattr(owner, "_warned_no_datamodule", False):
        owner._warned_no_datamodule = True
        rank_zero_warn(f"{type(owner).__name__}: the trainer has no ProblemDataModule; skipping")
    return None


def log_to_loggers(trainer: Any, metrics: Mapping[str, float]) -> None:
    """Logs ``metrics`` at the current step straight to the loggers (where ``self.log`` cannot)."""
    if metrics and getattr(trainer, "is_global_zero", True):
        for logger in getattr(trainer, "loggers", []):
            logger.log_metrics(dict(metrics), step=trainer.global_step)


def at_least(
    low: float, kind: type = int, strict: bool = False, optional: bool = False, **values: Any
) -> list[str]:
    """A message for each value that is not a ``kind`` ``>= low`` (``> low`` when ``strict``).

    ``kind`` is ``int`` or ``float`` (any finite number); with ``optional`` None is allowed too.
    """
    errors, sign, what = [], ">" if strict else ">=", "an int" if kind is int else "a number"
    for k, v in values.items():
        typed = is_number(v) and (kind is not int or isinstance(v, int))
        if not ((v is None and optional) or (typed and (v > low if strict else v >= low))):
            errors.append(f"{k} must be {what} {sign} {low}{' or None' * optional}, got {v!r}")
    return errors


def is_number(value: Any) -> bool:
    """A finite int or float (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def sample_counts(
    trainer: Any, pl_module: Any, problems: list[dict], n: int, sampling: SamplingParams, chunk: int
) -> list[int]:
    """Correct samples out of ``n`` per problem (``pl_module.count_correct``), all ranks together.

    Chunks of ``chunk`` problems are dealt round-robin to the ranks, chunk ``j`` sampled with
    ``sampling.seed + j``, so the counts do not depend on the number of ranks; the counts are
    gathered, and every rank returns the full list in the order of ``problems``.
    """
    chunks = [problems[i : i + chunk] for i in range(0, len(problems), chunk)]
    rank, world = getattr(trainer, "global_rank", 0), getattr(trainer, "world_size", 1)
    mine = []
    rounds = -(-len(chunks) // world)  # every rank makes as many calls: a sharded policy needs it
    for r in range(rounds):
        j = r * world + rank
        real = j < len(chunks)
        params = sampling if sampling.seed is None else replace(sampling, seed=sampling.seed + j)
        counts = list(pl_module.count_correct(chunks[j if real else 0], n, params))
        if real:
            mine.append((j, counts))
    done = dict(all_gather_objects(mine))
    return [c for j in range(len(chunks)) for c in done[j]]


def pass_rates(n: int, counts: list[int]) -> dict[str, float]:
    """``{"pass@1", "pass@<n>"}`` over problems with ``n`` samples and ``counts`` correct."""
    metric = PassAtK(k=sorted({1, n}), sync_on_compute=False)  # counts are gathered already
    metric.update([n] * len(counts), counts)
    return {key: float(v) for key, v in metric.compute().items()}
