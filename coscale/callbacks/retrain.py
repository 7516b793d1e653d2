"""What ReDistillation and FinalRetrain share: their base, settings, the initial weights, and one
retrain from them into the running policy (:mod:`coscale.callbacks.sft_in_fit`)."""

from __future__ import annotations

import os
from typing import Any

from lightning.pytorch import Callback
from typing_extensions import override

from coscale.callbacks.sft_in_fit import copy_weights, fabric_for, loop_from, sft_in_fit
from coscale.checks import as_group
from coscale.loop.curriculum import Curriculum
from coscale.measure.selection import SelectionSettings
from coscale.modules.fit_data import warn_no_curriculum
from coscale.modules.sft import SFTModule, check_guard_strategy
from coscale.seeds import seeded
from coscale.sft.forgetting import GuardSettings

_SHARED = ("prompt", "tokenizer", "verifier", "load")  # the SFT takes these from the policy module


class RetrainSettings:
    """The checked ``sft`` / ``trainer`` / ``selection`` settings of a retrain callback.

    Args:
        sft: :class:`~coscale.modules.SFTModule` arguments plus ``batch_size`` (pairs per step,
            default 16); the policy's prompt, tokenizer, verifier and dtype are used unless set.
        trainer: The loop's length (:data:`~coscale.callbacks.sft_in_fit.LOOP_KEYS`); strategy
            and precision are the running Trainer's.
        selection: Keep the best-scoring weights of the retrain instead of its last ones.
    """

    def __init__(
        self, owner: str, sft: Any, trainer: Any, selection: SelectionSettings | None
    ) -> None:
        pairs = (("sft", sft), ("trainer", trainer))
        bad = [(k, v) for k, v in pairs if not isinstance(v, dict | None)]
        errors = [f"{k} must be a dict or None, got {v!r}" for k, v in bad]
        if not errors:
            self.sft = dict(sft or {})
            if "model" in self.sft:
                errors.append("sft must not set 'model' (set initial_model instead)")
            self.loop, more = loop_from(trainer or {}, self.sft.pop("batch_size", 16))
            errors += more + (selection.errors() if selection is not None else [])
        if errors:
            raise ValueError(f"{owner}: " + "; ".join(errors))
        self.selection = selection

    def check_trainer(self, trainer: Any) -> None:
        """Refuses, before training, what the running strategy cannot do (the forgetting guard
        under a sharded strategy)."""
        guard = as_group(GuardSettings, self.sft.get("forgetting_guard")) or GuardSettings()
        if guard.on and (strategy := getattr(trainer, "strategy", None)) is not None:
            check_guard_strategy(strategy, guard.mode)


class RetrainCallback(Callback):
    """Base of ReDistillation and FinalRetrain: refuses the subclass's ``errors`` and bad
    :class:`RetrainSettings`, holds ``initial_model`` and ``export_dir``, and checks the initial
    weights and the strategy at the fit's setup."""

    def __init__(self, errors, sft, trainer, selection, initial_model, export_dir) -> None:
        super().__init__()
        if errors:
            raise ValueError(f"{type(self).__name__}: " + "; ".join(errors))
        self.settings = RetrainSettings(type(self).__name__, sft, trainer, selection)
        self.initial_model, self.export_dir = initial_model, export_dir
        self.runs = 0  # retrains done

    @override
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage == "fit":  # fail before training, not after it
            initial_weights(self, pl_module)
            self.settings.check_trainer(trainer)


def initial_weights(owner: Any, pl_module: Any) -> str | os.PathLike:
    """``owner.initial_model``, else the path the module was built from; raises if neither."""
    if (initial := owner.initial_model or getattr(pl_module, "model_source", None)) is None:
        raise ValueError(
            f"{type(owner).__name__}: set initial_model (the module was built from an "
            "in-memory model, so its initial weights are unknown)"
        )
    return initial


def retrain_from_initial(
    owner: Any, trainer: Any, pl_module: Any, items: list[dict], curriculum: Curriculum
) -> dict[str, float]:
    """SFT from ``owner``'s initial weights on ``items``, on the running fit's strategy and
    precision, then into ``pl_module``'s policy in place (rank 0's weights on every rank).

    The SFT takes the policy module's prompt, tokenizer, verifier and ``load`` (dtype, remote code,
    gradient checkpointing) unless ``owner.settings.sft`` sets them; the forgetting guard's
    mastered set is the curriculum's (its solved problems), as in a pipeline SFT stage.

    Returns:
        The guard's figures (``mastered_loss_start``, ``masked_frac_mean``, ...; empty when off).
    """
    settings: RetrainSettings = owner.settings
    kwargs = {k: getattr(pl_module, k) for k in _SHARED if hasattr(pl_module, k)} | settings.sft
    guard = as_group(GuardSettings, kwargs.get("forgetting_guard")) or GuardSettings()
    if guard.on and "mastered" not in kwargs:
        kwargs["mastered"] = curriculum.mastered()
    seed = curriculum.settings.seed
    with seeded(seed):
        module = SFTModule(model=initial_weights(owner, pl_module), **kwargs)
        select = _selection(owner, trainer, curriculum)
        sft_in_fit(fabric_for(trainer), module, items, settings.loop, seed, select)
    copy_weights(module, pl_module)
    return dict(module.guard_report)


def _selection(owner: Any, trainer: Any, curriculum: Curriculum):
    selection = owner.settings.selection
    if selection is None:
        return None
    root = getattr(trainer, "default_root_dir", None) or "."
    folder = os.path.join(owner.export_dir or root, "select")
    label = type(owner).__name__
    held_out = getattr(trainer.datamodule, "val_problems", None) or []
    problems = selection.candidates(held_out, curriculum)
    return selection.build(problems, folder, curriculum.settings.seed, label)


def datamodule_or_warn(trainer: Any, owner: Any, datamodule: Any = None) -> Any | None:
    """``datamodule`` (default: the trainer's, set by ``fit``) when it serves a curriculum, or
    None with one warning."""
    dm = datamodule if datamodule is not None else getattr(trainer, "datamodule", None)
    if isinstance(getattr(dm, "curriculum", None), Curriculum):
        return dm
    warn_no_curriculum(owner)
    return None


__all__ = ["RetrainCallback", "RetrainSettings", "datamodule_or_warn", "retrain_from_initial"]
