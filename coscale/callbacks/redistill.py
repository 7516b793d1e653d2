"""ReDistillation: merges RL gains by fine-tuning the *initial* model on what RL found.

At the end of a GRPO fit (METHOD.md idea 3) the initial model is fine-tuned on the latest correct
rollouts per problem (plus the bank of problems RL has not handled), in place of the RL policy.
"""

from __future__ import annotations

import os
from typing import Any

from lightning.pytorch import Callback
from lightning.pytorch.utilities import rank_zero_warn
from typing_extensions import override

from coscale.callbacks import sft_stage

_SHARED = ("prompt", "tokenizer", "reward")  # the SFT stage takes these from the policy module
_SHARED_HPARAMS = ("dtype", "trust_remote_code", "gradient_checkpointing")  # and these


class ReDistillation(Callback):
    """SFT from the initial weights on the re-distillation set, at the end of training.

    Args:
        max_per_problem: Latest correct rollouts taken per problem.
        max_total: Cap on the replay part of the set (a seeded subset beyond it); None: all.
        include_bank: Also train on the bank of problems RL has not handled (datamodule
            ``sft_source="all"``; otherwise ``"redistill"``).
        sft: :class:`~coscale.modules.SFTModule` arguments plus ``batch_size``; the policy's
            prompt, tokenizer, reward and dtype are used unless set here.
        trainer: ``lightning.Trainer`` arguments of the SFT fit (e.g. ``max_epochs``).
        initial_model: Name or folder of the initial weights (default: ``model_source`` of the
            module; set it when the module was loaded from a later stage's export).
        export_dir: Save the re-distilled policy here in HF format (overwritten each run).
    """

    def __init__(
        self,
        max_per_problem: int = 1,
        max_total: int | None = 1000,
        include_bank: bool = True,
        sft: dict[str, Any] | None = None,
        trainer: dict[str, Any] | None = None,
        initial_model: str | None = None,
        export_dir: str | None = None,
    ) -> None:
        super().__init__()
        errors = stage_errors(sft, trainer) + sft_stage.at_least(1, max_per_problem=max_per_problem)
        errors += sft_stage.at_least(1, optional=True, max_total=max_total)
        if errors:
            raise ValueError("ReDistillation: " + "; ".join(errors))
        self.max_per_problem, self.max_total, self.include_bank = (
            max_per_problem,
            max_total,
            include_bank,
        )
        self.sft, self.trainer_kwargs = dict(sft or {}), dict(trainer or {})
        self.initial_model, self.export_dir = initial_model, export_dir
        self.runs = 0  # re-distillations done
        self.last_size = 0  # examples in the last set

    @override
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage == "fit":
            initial_weights(self, pl_module)  # fail before training, not after it

    @override
    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.run(trainer, pl_module)

    def run(self, trainer: Any, pl_module: Any, datamodule: Any = None) -> int:
        """Re-distils now (from ``datamodule`` or the trainer's); returns the set size (0: none)."""
        if (dm := sft_stage.datamodule_or_warn(trainer, self, datamodule)) is None:
            return 0
        source = "all" if self.include_bank else "redistill"
        items = dm.curriculum.sft_pairs(source, self.max_per_problem, self.max_total)
        self.last_size = len(items)
        sft_stage.log_to_loggers(trainer, {"pool/redistill_examples": float(len(items))})
        if not items:
            rank_zero_warn("ReDistillation: empty re-distillation set; the policy is left as is")
            return 0
        retrain_from_initial(self, pl_module, items, seed=dm.curriculum.settings.seed)
        self.runs += 1
        if self.export_dir:  # every rank: the export gathers, rank 0 writes
            pl_module.export(self.export_dir)
        return len(items)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"runs": self.runs, "last_size": self.last_size}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.runs, self.last_size = int(state_dict["runs"]), int(state_dict["last_size"])


def initial_weights(owner: Any, pl_module: Any) -> str | os.PathLike:
    """``owner.initial_model``, else the path the module was built from; raises if neither."""
    if (initial := owner.initial_model or getattr(pl_module, "model_source", None)) is None:
        raise ValueError(
            f"{type(owner).__name__}: set initial_model (the module was built from an "
            "in-memory model, so its initial weights are unknown)"
        )
    return initial


def retrain_from_initial(owner: Any, pl_module: Any, items: list[dict], seed: int) -> None:
    """SFT from ``owner``'s initial weights with its ``sft`` / ``trainer_kwargs``, into the policy.

    It uses the policy module's prompt, tokenizer, reward, dtype, ``trust_remote_code`` and
    gradient checkpointing unless ``owner.sft`` sets them, on the policy's device. Under DDP every
    rank runs the same seeded fit; rank 0's weights are broadcast after it to be safe.
    """
    same = {k: getattr(pl_module, k) for k in _SHARED if hasattr(pl_module, k)}
    hparams = getattr(pl_module, "hparams", {})
    same |= {k: hparams[k] for k in _SHARED_HPARAMS if k in hparams}
    initial = initial_weights(owner, pl_module)
    sft = same | owner.sft
    # a plain loop on the policy's device: no fit starts inside the running one
    module = sft_stage.finetune(initial, items, sft, owner.trainer_kwargs, seed, pl_module.device)
    sft_stage.copy_weights(module, pl_module)  # rank 0's weights on every rank (or shard)


def stage_errors(sft: Any, trainer: Any) -> list[str]:
    """Checks of ``sft`` and ``trainer`` (shared with FinalRetrain)."""
    pairs = (("sft", sft), ("trainer", trainer))
    errors = [f"{k} must be a dict or None, got {v!r}" for k, v in pairs if not _dict_or_none(v)]
    if isinstance(sft, dict) and "model" in sft:
        errors.append("sft must not set 'model' (set initial_model instead)")
    if not errors:  # what the in-fit SFT loop can follow, checked before training
        errors += sft_stage.finetune_setting_errors(sft or {}, trainer or {})
    return errors


def _dict_or_none(value: Any) -> bool:
    return value is None or isinstance(value, dict)
