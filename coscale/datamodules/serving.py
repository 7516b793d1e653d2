"""CurriculumDataModule: serves a :class:`~coscale.loop.curriculum.Curriculum` to one Lightning fit.

What a fit gets depends on the module, not on a flag flipped from outside: a module whose
``data_kind`` is ``"sft"`` gets (question, solution) pairs of ``sft_source``; one whose
``data_kind`` is ``"rl"`` gets the solvable problems, each with its own Rollout N. The loader is
rebuilt every epoch (the pools change); the curriculum and what the running epoch was served
(:class:`~coscale.datamodules.epoch_snapshot.EpochSnapshot`) are saved in every Lightning
checkpoint, and the fit's position (:class:`~coscale.datamodules.batches.FitCursor`, counted
here) with the loader, which resumes mid-epoch from it, over the same items.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lightning as L
from lightning.pytorch.utilities import rank_zero_info

from coscale.checks import at_least, one_of
from coscale.datamodules.batches import FitCursor, epoch_loader
from coscale.datamodules.epoch_snapshot import EpochSnapshot, resumed_items
from coscale.loop.curriculum import SFT_SOURCES, Curriculum, SFTSource
from coscale.loop.problem import Problem

DATA_KINDS = ("sft", "rl")


def data_kind(module: Any) -> str:
    """What ``module`` trains on: its ``data_kind`` attribute, checked."""
    kind = getattr(module, "data_kind", None)
    if kind not in DATA_KINDS:
        raise TypeError(
            f"{type(module).__name__} has data_kind={kind!r}: a curriculum serves modules whose "
            f"data_kind is one of {DATA_KINDS} (SFTModule: 'sft', GRPOModule: 'rl')"
        )
    return kind


def serving_errors(sft_source, batch_size, sft_batch_size, val_batch_size) -> list[str]:
    """Every bad serving setting, named."""
    errors = one_of(SFT_SOURCES, sft_source=sft_source)
    errors += at_least(1, batch_size=batch_size, sft_batch_size=sft_batch_size)
    return errors + at_least(1, val_batch_size=val_batch_size)


class CurriculumDataModule(L.LightningDataModule):
    """One fit's view of a curriculum.

    Args:
        curriculum: The loop's state (shared with the stages that run before and after).
        sft_source: Pairs an SFT module gets: ``bank``, ``redistill`` or ``all``.
        batch_size: Problems per RL step.
        sft_batch_size: (question, solution) pairs per SFT step.
        val_batch_size: Problems per validation batch.
        rl_groups: Serve only the solvable problems of these difficulty groups (None: all).
        val_problems: Held-out problems for validation.
    """

    def __init__(
        self,
        curriculum: Curriculum,
        sft_source: SFTSource = "bank",
        batch_size: int = 8,
        sft_batch_size: int = 16,
        val_batch_size: int = 16,
        rl_groups: Sequence[int] | None = None,
        val_problems: Sequence[Problem] = (),
    ) -> None:
        super().__init__()
        if errors := serving_errors(sft_source, batch_size, sft_batch_size, val_batch_size):
            raise ValueError(f"{type(self).__name__}: " + "; ".join(errors))
        self.curriculum, self.sft_source, self.rl_groups = curriculum, sft_source, rl_groups
        self.batch_size, self.sft_batch_size = batch_size, sft_batch_size
        self.val_batch_size, self.val_problems = val_batch_size, list(val_problems)
        self.cursor = FitCursor()  # where the running fit is: its train loader's state
        self.served: EpochSnapshot | None = None  # what the running epoch's loader holds
        self._resume_from: dict[str, Any] | None = None  # a checkpoint's EpochSnapshot state

    def setup(self, stage: str | None = None) -> None:
        if stage == "fit":
            self.cursor = FitCursor()  # a new fit starts at epoch 0; a resumed one's loader
            # gets its position back from the checkpoint, its items from load_state_dict
            self.served, self._resume_from = None, None
        trainer = self.trainer
        if trainer is not None and trainer.reload_dataloaders_every_n_epochs != 1:
            rank_zero_info(f"{type(self).__name__}: reloading the train loader every epoch")
            trainer.reload_dataloaders_every_n_epochs = 1

    # ------------------------------------------------------------------ loaders
    def items(self, kind: str) -> list[dict[str, Any]]:
        """The items of this epoch for a module of ``kind``."""
        if kind == "rl":
            return self.curriculum.rl_items(self.rl_groups)
        return self.curriculum.sft_pairs(self.sft_source)

    def train_dataloader(self):
        trainer = self.trainer
        kind = data_kind(trainer.lightning_module) if trainer is not None else "rl"
        epoch = trainer.current_epoch if trainer is not None else self.cursor.epoch + 1
        size = self.batch_size if kind == "rl" else self.sft_batch_size
        items = resumed_items(self._resume_from, kind, epoch, lambda: self.items(kind))
        self._resume_from = None  # the first loader after a restore only
        self.served = EpochSnapshot(epoch, kind, items)
        loader = epoch_loader(lambda: items, size, self.curriculum.settings.seed, epoch)
        self.cursor = loader.cursor  # counted below, saved and restored with the loader
        return loader

    def val_dataloader(self):
        rows = [
            {"id": p.id, "question": p.question, "answer": p.answer}
            | ({"meta": dict(p.meta)} if p.meta else {})  # the columns the reward functions get
            for p in self.val_problems
        ]
        if not rows:
            return []
        return epoch_loader(lambda: rows, self.val_batch_size, seed=0, epoch=-1, pad=False)

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        trainer = self.trainer
        if trainer is not None and trainer.training:
            self.cursor.consumed += 1  # one more batch of this epoch goes to the model
        return batch

    # -------------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """The curriculum and what the running epoch was served (the fit's position in it is
        its train loader's state)."""
        served = self._resume_from if self.served is None else self.served.state_dict()
        return {"curriculum": self.curriculum.state_dict(), "served": served}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.curriculum.load_state_dict(state["curriculum"])
        self._resume_from = state.get("served")  # none in checkpoints of earlier releases
