"""FinalRetrain: the last step of CoScale-RL, retraining the initial model on everything.

In the final iteration the model is retrained from the initial weights on every solution
collected (bank + latest correct RL rollouts), so that nothing learned early is forgotten. The
pipeline's ``final/retrain`` and ``final`` stages do the same with a fit of their own; this
callback does it inside a user's fit (:mod:`coscale.callbacks.sft_in_fit`) and judges the two
models as the final stage does (:func:`coscale.measure.pass_rates.judge`, the same seeded samples
before and after, on the held-out problems or, without any, the training problems).
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from typing_extensions import override

from coscale.callbacks.retrain import RetrainCallback, datamodule_or_warn, retrain_from_initial
from coscale.checks import at_least, one_of
from coscale.loop.curriculum import SFT_SOURCES, SFTSource
from coscale.measure.pass_rates import KEEP, judge, judged_problems, keep_retrained
from coscale.measure.selection import SelectionSettings
from coscale.modules.loggers import log_to_loggers
from coscale.renamed import old_keyword

CALLBACK_KEEP = KEEP[:2]
"""``best`` also weighs every earlier iteration's model, which only the pipeline holds."""


class FinalRetrain(RetrainCallback):
    """At ``on_fit_end``: judge -> SFT from the initial weights on the datamodule's ``source``
    set -> load it into the policy in place -> judge again.

    Logs ``val/final_before_pass@1``, ``val/final_after_pass@1`` (and ``@judge_samples``) to the
    loggers, prints them, and keeps them in :attr:`results`.

    Args:
        sft: :class:`~coscale.modules.SFTModule` arguments plus ``batch_size``; the policy's
            prompt, tokenizer, verifier and dtype are used unless set here.
        trainer: The SFT's length: ``max_epochs``, ``max_steps``, ``gradient_clip_val``
            (strategy and precision are the running Trainer's).
        selection: Keep the weights with the best pass@1 on a slice of the training problems.
        initial_model: Name or folder of the initial weights (default: ``model_source``).
        judge_samples: Samples per problem in the before / after judging.
        export_dir: Save the retrained policy here in HF format.
        seed: Seed of the judging samples (the same before and after).
        keep: ``retrained`` (the paper) keeps the retrained weights; ``better`` keeps them only
            when their pass@1 is not lower than before, else restores the weights the fit ended
            with (``val/final_kept_retrained`` says which was kept).
        source: The retrain's set (plus the replay share): ``all`` (the paper: bank solutions
            and the latest correct RL rollouts), ``bank`` or ``redistill``.
        judge_k, eval_k: Earlier names of ``judge_samples`` (a warning names it).
    """

    def __init__(
        self,
        sft: dict[str, Any] | None = None,
        trainer: dict[str, Any] | None = None,
        selection: SelectionSettings | None = None,
        initial_model: str | None = None,
        judge_samples: int = 8,
        export_dir: str | None = None,
        seed: int = 0,
        keep: str = "retrained",
        source: SFTSource = "all",
        judge_k: int | None = None,
        eval_k: int | None = None,
    ) -> None:
        for old, given in (("judge_k", judge_k), ("eval_k", eval_k)):
            judge_samples = old_keyword(
                "FinalRetrain", old, "judge_samples", given, judge_samples, 8
            )
        errors = at_least(0, seed=seed) + at_least(1, judge_samples=judge_samples)
        errors += one_of(CALLBACK_KEEP, keep=keep) + one_of(SFT_SOURCES, source=source)
        super().__init__(errors, sft, trainer, selection, initial_model, export_dir)
        self.judge_samples, self.seed, self.keep, self.source = judge_samples, seed, keep, source
        self.results: dict[str, float] = {}  # val/final_{before,after}_pass@k of the last run
        self._device: torch.device | None = None

    @override
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._device = pl_module.device  # Lightning moves the module to CPU before on_fit_end

    @override
    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self.run(trainer, pl_module)

    def run(self, trainer: Any, pl_module: Any, datamodule: Any = None) -> dict[str, float]:
        """Judges, retrains from the initial weights, judges again; returns the results.

        ``datamodule`` defaults to the trainer's (a trainer that never ran ``fit`` has none).
        """
        if (dm := datamodule_or_warn(trainer, self, datamodule)) is None:
            return {}
        problems = judged_problems(dm.val_problems, dm.curriculum)
        back_to = pl_module.device
        pl_module.to(self._device or back_to)  # sample on the training device, not the CPU
        try:
            self.results = judge(pl_module, problems, "before", self.judge_samples, self.seed)
            if items := dm.curriculum.sft_pairs(self.source):
                self._retrain(trainer, pl_module, items, dm, problems)
            else:
                rank_zero_warn("FinalRetrain: nothing to retrain on; the policy is left as is")
        finally:
            pl_module.to(back_to)
        log_to_loggers(trainer, self.results)
        rank_zero_info(
            "FinalRetrain: " + ", ".join(f"{k}={v:.4f}" for k, v in self.results.items())
        )
        return dict(self.results)

    def _retrain(self, trainer, pl_module, items, dm, problems) -> None:
        fit_end = None
        if self.keep == "better":  # a copy on its device (this rank's shards under FSDP2)
            fit_end = {k: v.detach().clone() for k, v in pl_module.policy.state_dict().items()}
        guard = retrain_from_initial(self, trainer, pl_module, items, dm.curriculum)
        self.results |= {f"final/{k}": v for k, v in guard.items()}
        self.runs += 1
        self.results |= judge(pl_module, problems, "after", self.judge_samples, self.seed)
        if problems and not keep_retrained(self.results, self.keep):  # only with keep: better
            pl_module.policy.load_state_dict(fit_end)
            rank_zero_info("FinalRetrain: the retrain lowered pass@1; the fit's weights are kept")
        if self.export_dir:  # every rank: the export gathers, rank 0 writes
            pl_module.export(self.export_dir)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"runs": self.runs, "results": dict(self.results)}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.runs = int(state_dict["runs"])
        self.results = {k: float(v) for k, v in state_dict["results"].items()}
