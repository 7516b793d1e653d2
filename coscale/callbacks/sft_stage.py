"""Helpers the callbacks share: a seeded SFT of the initial model, sampling, logging, checks.

Re-distillation and the final retrain fine-tune the *initial* model on (question, solution)
pairs, seeded so that the same set always gives the same weights, then copy them into the
policy in place. They run inside the user's fit, so they must not start a fit of their own:
:func:`finetune` is the loop Lightning would run for an :class:`~coscale.modules.SFTModule`
(AdamW with warm-up, the same shuffle, the same batches), in plain PyTorch. :func:`run_sft` is
the same SFT as a Lightning fit, for code outside any fit (benchmarks, tests).
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.utilities import rank_zero_warn
from torch.utils.data import DataLoader

from coscale.checks import at_least, is_number  # noqa: F401  (re-exported)
from coscale.loop.curriculum import Curriculum
from coscale.models.full_state import full_state_dict, load_full_state_dict
from coscale.modules.loggers import log_to_loggers  # noqa: F401  (re-exported)
from coscale.modules.sft import SFTModule
from coscale.stages.measure import pass_rates, sample_counts  # noqa: F401  (re-exported)

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
        loader = _shuffled(items, batch_size, seed)
        args = TRAINER_DEFAULTS | dict(trainer_kwargs)
        if args.get("enable_progress_bar") and "callbacks" not in args:
            # a nested fit inside another fit: rich's live display cannot nest, tqdm can
            args["callbacks"] = [TQDMProgressBar(leave=False)]
        L.Trainer(**args).fit(module, loader)
    return module


LOOP_SETTINGS = ("max_epochs", "max_steps", "precision")
"""The ``trainer`` settings :func:`finetune` follows; display settings are accepted and unused."""
_DISPLAY = ("accelerator", "devices", "logger", "callbacks", "enable_progress_bar")
_DISPLAY += ("enable_model_summary", "enable_checkpointing")
_AUTOCAST = {"32-true": None, "32": None, "bf16-mixed": torch.bfloat16}


def finetune(
    initial_model: str | os.PathLike | Any,
    items: Sequence[Mapping[str, str]],
    sft_kwargs: Mapping[str, Any],
    trainer_kwargs: Mapping[str, Any],
    seed: int = 0,
    device: torch.device | str = "cpu",
) -> SFTModule:
    """:func:`run_sft`'s SFT as a plain loop on ``device``: same arguments, same weights.

    Raises:
        ValueError: Naming each setting the loop cannot follow (the forgetting guard, other
            precisions, other ``trainer`` keys) and bad ``items`` / ``batch_size``.
    """
    kwargs = dict(sft_kwargs)
    batch_size = kwargs.pop("batch_size", 16)
    errors = _finetune_errors(items, batch_size, kwargs, trainer_kwargs)
    if errors:
        raise ValueError("finetune: " + "; ".join(errors))
    epochs, max_steps = trainer_kwargs.get("max_epochs", 1), trainer_kwargs.get("max_steps", -1)
    dtype = _AUTOCAST[str(trainer_kwargs.get("precision") or "32-true")]
    cuda = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=cuda):
        torch.manual_seed(seed)
        module = SFTModule(model=initial_model, **kwargs).to(device)
        opt, sched = _optimiser(module)
        loader, steps = _shuffled(items, batch_size, seed), 0
        for _ in range(epochs):
            for batch in loader:
                with torch.autocast(module.device.type, dtype or torch.float32, dtype is not None):
                    loss = module.batch_loss(module.encode(batch))[0]
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                if sched is not None:
                    sched.step()
                steps += 1
                if 0 <= max_steps <= steps:
                    return module
    return module


def _shuffled(items: Sequence[Mapping[str, str]], batch_size: int, seed: int) -> DataLoader:
    """Batches of ``items`` in a new seeded order each epoch (the same in both SFT paths)."""
    shuffle = torch.Generator().manual_seed(seed)
    return DataLoader(list(items), batch_size, shuffle=True, generator=shuffle, collate_fn=list)


def _optimiser(module: SFTModule) -> tuple[Any, Any]:
    conf = module.configure_optimizers()
    return conf["optimizer"], conf.get("lr_scheduler", {}).get("scheduler")


def _finetune_errors(items, batch_size, sft_kwargs, trainer_kwargs) -> list[str]:
    errors = [] if items else ["items must hold at least one {'question', 'solution'} dict"]
    return errors + finetune_setting_errors(dict(sft_kwargs, batch_size=batch_size), trainer_kwargs)


def finetune_setting_errors(sft_kwargs, trainer_kwargs) -> list[str]:
    """Every ``sft`` / ``trainer`` setting :func:`finetune` cannot follow, named."""
    errors = at_least(1, batch_size=sft_kwargs.get("batch_size", 16))
    if (guard := sft_kwargs.get("forgetting_guard", "none")) != "none":
        errors.append(
            f"sft.forgetting_guard={guard!r} needs a fit of its own: use `coscale run` (its "
            "re-distill and final stages are fits) or fit an SFTModule on the curriculum's "
            "sft_pairs('all') after your fit"
        )
    for key in sorted(set(trainer_kwargs) - set(LOOP_SETTINGS) - set(_DISPLAY)):
        errors.append(f"trainer.{key} is not followed here (it takes: {', '.join(LOOP_SETTINGS)})")
    if str(trainer_kwargs.get("precision") or "32-true") not in _AUTOCAST:
        errors.append(f"trainer.precision must be one of {', '.join(_AUTOCAST)}")
    return errors


def copy_weights(src_module: Any, dst_module: Any) -> None:
    """Loads ``src_module``'s policy weights into ``dst_module``'s policy, in place.

    Either may be a module with a ``policy`` or a bare ``torch.nn.Module``, sharded (FSDP2) or
    not; under DDP or FSDP2 every rank calls it and rank 0's weights win. A rollout backend
    of ``dst_module`` is pointed at the updated policy (an engine like vLLM holds a copy).
    """
    src = getattr(src_module, "policy", src_module)
    dst = getattr(dst_module, "policy", dst_module)
    load_full_state_dict(dst, full_state_dict(src))  # gathered / broadcast when sharded
    if hasattr(type(dst_module), "backend"):
        dst_module.backend.update_weights(dst)


def datamodule_or_warn(trainer: Any, owner: Any, datamodule: Any = None) -> Any | None:
    """``datamodule`` (default: the trainer's, set by ``fit``) when it serves a curriculum, or
    None with one warning."""
    dm = datamodule if datamodule is not None else getattr(trainer, "datamodule", None)
    if isinstance(getattr(dm, "curriculum", None), Curriculum):
        return dm
    if not getattr(owner, "_warned_no_datamodule", False):
        owner._warned_no_datamodule = True
        rank_zero_warn(f"{type(owner).__name__}: the trainer has no ProblemDataModule; skipping")
    return None
