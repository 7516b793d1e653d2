"""Helpers the callbacks share: an SFT stage run as its own small fit, and datamodule access.

Re-distillation and the final retrain both fine-tune the *initial* model on a set of
(question, solution) pairs and then put the result into the running policy in place. That SFT
is a separate ``lightning.Trainer`` fit of an :class:`~coscale.modules.SFTModule` (no logger,
no checkpoints), seeded so that the same set always gives the same weights.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.utilities import rank_zero_warn
from torch.utils.data import DataLoader

from coscale.modules.sft import SFTModule

DEFAULT_BATCH_SIZE = 16
"""Pairs per SFT step when ``sft_kwargs`` has no ``batch_size``."""

TRAINER_DEFAULTS: dict[str, Any] = {
    "max_epochs": 1,
    "logger": False,
    "enable_checkpointing": False,
    "enable_model_summary": False,
    "enable_progress_bar": True,
    "devices": 1,
    "accelerator": "auto",
}
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
        initial_model: Name or folder of the model to start from. A built model object is
            trained in place (pass a path to start from saved initial weights).
        items: ``{"id", "question", "solution"}`` dicts, shuffled each epoch with ``seed``.
        sft_kwargs: :class:`~coscale.modules.SFTModule` arguments, plus ``batch_size`` (pairs
            per step, default :data:`DEFAULT_BATCH_SIZE`) so that one YAML block configures
            the whole stage. The mapping is not modified.
        trainer_kwargs: ``lightning.Trainer`` arguments over :data:`TRAINER_DEFAULTS`.
        seed: Seed of the shuffle and of torch's RNG during the fit (the caller's RNG state
            is restored afterwards).

    Raises:
        ValueError: When ``items`` is empty or ``sft_kwargs["batch_size"]`` is not an int >= 1.
    """
    if not items:
        raise ValueError("run_sft: items must hold at least one {'question', 'solution'} dict")
    kwargs = dict(sft_kwargs)
    batch_size = kwargs.pop("batch_size", DEFAULT_BATCH_SIZE)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"run_sft: sft_kwargs['batch_size'] must be an int >= 1, got {batch_size!r}")
    cuda = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=cuda), warnings.catch_warnings():
        warnings.filterwarnings("ignore", ".*does not have many workers.*")
        torch.manual_seed(seed)
        module = SFTModule(model=initial_model, **kwargs)
        loader = DataLoader(
            list(items), batch_size=batch_size, shuffle=True, num_workers=0,
            collate_fn=_as_list, generator=torch.Generator().manual_seed(seed),
        )
        L.Trainer(**(TRAINER_DEFAULTS | dict(trainer_kwargs))).fit(module, train_dataloaders=loader)
    return module


def copy_weights(src_module: Any, dst_module: Any) -> None:
    """Loads the policy weights of ``src_module`` into ``dst_module``'s policy, in place.

    Either may be a module with a ``policy`` attribute or a bare ``torch.nn.Module``. A rollout
    backend of ``dst_module`` is pointed at the updated policy (vLLM needs the new weights).
    """
    src = getattr(src_module, "policy", src_module)
    dst = getattr(dst_module, "policy", dst_module)
    dst.load_state_dict(src.state_dict())
    if hasattr(type(dst_module), "backend"):
        dst_module.backend.update_weights(dst)


def retrain_from_initial(
    pl_module: Any, initial_model: str | os.PathLike, items: list[dict], sft: Mapping[str, Any],
    trainer_kwargs: Mapping[str, Any], seed: int, device: torch.device | None = None,
) -> None:
    """SFT from ``initial_model`` on ``items``, then the result into ``pl_module.policy``.

    The SFT module reuses the policy's prompt format, tokenizer, reward, dtype and
    ``trust_remote_code`` unless ``sft`` sets them, and trains on the policy's device. Under
    DDP every rank runs the same seeded fit; rank 0's weights are then broadcast to be safe.
    """
    device = device if device is not None else pl_module.device
    placed = {"accelerator": "cpu", "devices": 1}
    if device.type == "cuda":
        placed = {"accelerator": "gpu", "devices": [device.index or 0]}
    module = run_sft(initial_model, items, sft_defaults(pl_module) | dict(sft),
                     placed | dict(trainer_kwargs), seed)
    copy_weights(module, pl_module)
    _broadcast_weights(pl_module.policy)


def sft_defaults(pl_module: Any) -> dict[str, Any]:
    """:class:`~coscale.modules.SFTModule` arguments that must match the policy being replaced."""
    out = {name: getattr(pl_module, name) for name in ("prompt", "tokenizer", "reward")
           if getattr(pl_module, name, None) is not None}
    hparams = getattr(pl_module, "hparams", {})
    out |= {name: hparams[name] for name in ("dtype", "trust_remote_code") if name in hparams}
    return out


def datamodule_or_warn(trainer: Any, owner: Any) -> Any | None:
    """The trainer's ProblemDataModule, or ``None`` with one warning per ``owner``."""
    dm = getattr(trainer, "datamodule", None)
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


def _broadcast_weights(model: torch.nn.Module) -> None:
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        for tensor in model.state_dict().values():
            dist.broadcast(tensor, src=0)


def _as_list(batch: list[dict]) -> list[dict]:
    return list(batch)
