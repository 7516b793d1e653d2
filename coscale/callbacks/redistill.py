"""ReDistillation: merges RL gains by fine-tuning the *initial* model on what RL found.

At the end of a GRPO fit the initial model is fine-tuned on the latest correct rollouts per
problem (plus the bank of problems RL has not handled), in place of the RL policy: the same SFT
as the pipeline's ``it<k>/redistill`` stage, run inside the fit on its own strategy and precision
(:mod:`coscale.callbacks.sft_in_fit`).
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.utilities import rank_zero_warn
from typing_extensions import override

from coscale.callbacks.retrain import RetrainCallback, datamodule_or_warn, retrain_from_initial
from coscale.checks import at_least
from coscale.measure.selection import SelectionSettings
from coscale.modules.loggers import log_to_loggers


class ReDistillation(RetrainCallback):
    """SFT from the initial weights on the re-distillation set, at the end of training.

    Args:
        max_per_problem: Latest correct rollouts taken per problem.
        max_total: Cap on the replay part of the set (a seeded subset beyond it); None: all.
        include_bank: Also train on the bank of problems RL has not handled (datamodule
            ``sft_source="all"``; otherwise ``"redistill"``).
        sft: :class:`~coscale.modules.SFTModule` arguments plus ``batch_size``; the policy's
            prompt, tokenizer, verifier and dtype are used unless set here.
        trainer: The SFT's length: ``max_epochs``, ``max_steps``, ``gradient_clip_val``
            (strategy and precision are the running Trainer's).
        selection: Keep the weights with the best pass@1 on a slice of the training problems.
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
        selection: SelectionSettings | None = None,
        initial_model: str | None = None,
        export_dir: str | None = None,
    ) -> None:
        errors = at_least(1, max_per_problem=max_per_problem)
        errors += at_least(1, optional=True, max_total=max_total)
        super().__init__(errors, sft, trainer, selection, initial_model, export_dir)
        self.max_per_problem, self.max_total = max_per_problem, max_total
        self.include_bank = include_bank
        self.last_size = 0  # examples in the last set
        self.guard_report: dict[str, float] = {}  # the forgetting guard's figures of the last run

    @override
    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.run(trainer, pl_module)

    def run(self, trainer: Any, pl_module: Any, datamodule: Any = None) -> int:
        """Re-distils now (from ``datamodule`` or the trainer's); returns the set size (0: none)."""
        if (dm := datamodule_or_warn(trainer, self, datamodule)) is None:
            return 0
        source = "all" if self.include_bank else "redistill"
        items = dm.curriculum.sft_pairs(source, self.max_per_problem, self.max_total)
        self.last_size = len(items)
        log_to_loggers(trainer, {"pool/redistill_examples": float(len(items))})
        if not items:
            rank_zero_warn("ReDistillation: empty re-distillation set; the policy is left as is")
            return 0
        self.guard_report = retrain_from_initial(self, trainer, pl_module, items, dm.curriculum)
        log_to_loggers(trainer, {f"redistill/{k}": v for k, v in self.guard_report.items()})
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
