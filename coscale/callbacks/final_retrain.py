"""FinalRetrain: the last step of CoScale-RL, retraining the initial model on everything.

In the final iteration the model is retrained from the initial weights on every solution
collected (bank + latest correct RL rollouts), so that nothing learned early is forgotten
(METHOD.md, "The loop"). Accuracy is measured before and after, on the held-out problems (or
the training problems when there are none), with the same seeded samples both times.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from lightning.pytorch import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from typing_extensions import override

from coscale.callbacks import sft_stage
from coscale.callbacks.redistill import initial_weights, retrain_from_initial, stage_errors
from coscale.checks import one_of
from coscale.loop.curriculum import SFT_SOURCES, SFTSource
from coscale.rollout.base import SamplingParams

KEEP = ("retrained", "better")
"""What :class:`FinalRetrain` keeps: the retrained weights always, or the better of the two."""


def judged_problems(dm: Any) -> list[dict]:
    """The problems the before / after evaluation runs on: held-out ones, else training ones."""
    return [p.to_dict() for p in (dm.val_problems or list(dm.curriculum.problems.values()))]


def _weights(pl_module: Any) -> dict[str, torch.Tensor]:
    """A copy of the policy's weights (on their device)."""
    return {k: v.detach().clone() for k, v in pl_module.policy.state_dict().items()}


class FinalRetrain(Callback):
    """At ``on_fit_end``: evaluate -> SFT from the initial weights on the datamodule's
    ``source`` set -> load it into the policy in place -> evaluate again.

    Logs ``val/final_before_pass@1``, ``val/final_after_pass@1`` (and ``@eval_k``) to the
    loggers, prints them, and keeps them in :attr:`results`.

    Args:
        sft: :class:`~coscale.modules.SFTModule` arguments plus ``batch_size``; the policy's
            prompt, tokenizer, reward and dtype are used unless set here.
        trainer: ``lightning.Trainer`` arguments of the SFT fit (e.g. ``max_epochs``).
        initial_model: Name or folder of the initial weights (default: ``model_source``).
        eval_k: Samples per problem in the before / after evaluation.
        export_dir: Save the retrained policy here in HF format.
        batch_size: Problems per sampling call of the evaluation.
        seed: Seed of the evaluation samples (the same before and after).
        keep: ``retrained`` (the paper) keeps the retrained weights; ``better`` keeps them only
            when their pass@1 in that evaluation is not lower than before, else restores the
            weights the fit ended with (``val/final_kept_retrained`` says which was kept).
            The evaluation runs on the datamodule's held-out problems, or its training problems
            when it has none: never point it at the sets you report.
        source: The retrain's set (plus the replay share): ``all`` (the paper: bank solutions
            and the latest correct RL rollouts), ``bank`` (RL's rollouts left out; the pipeline's
            ``final_sft_source``, which the demo sets to ``bank``) or ``redistill``.
    """

    def __init__(
        self,
        sft: dict[str, Any] | None = None,
        trainer: dict[str, Any] | None = None,
        initial_model: str | None = None,
        eval_k: int = 8,
        export_dir: str | None = None,
        batch_size: int = 16,
        seed: int = 0,
        keep: str = "retrained",
        source: SFTSource = "all",
    ) -> None:
        super().__init__()
        errors = stage_errors(sft, trainer) + sft_stage.at_least(0, seed=seed)
        if keep not in KEEP:
            errors.append(f"keep must be one of {KEEP}, got {keep!r}")
        errors += sft_stage.at_least(1, eval_k=eval_k, batch_size=batch_size)
        errors += one_of(SFT_SOURCES, source=source)
        if errors:
            raise ValueError("FinalRetrain: " + "; ".join(errors))
        self.sft, self.trainer_kwargs = dict(sft or {}), dict(trainer or {})
        self.initial_model, self.export_dir = initial_model, export_dir
        self.eval_k, self.batch_size, self.seed, self.keep = eval_k, batch_size, seed, keep
        self.source = source
        self.runs = 0  # retrains done
        self.results: dict[str, float] = {}  # val/final_{before,after}_pass@k of the last run
        self._device: torch.device | None = None

    @override
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage == "fit":
            initial_weights(self, pl_module)  # fail before training, not after it

    @override
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._device = pl_module.device  # Lightning moves the module to CPU before on_fit_end

    @override
    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self.run(trainer, pl_module)

    def run(self, trainer: Any, pl_module: Any, datamodule: Any = None) -> dict[str, float]:
        """Evaluates, retrains from the initial weights, evaluates again; returns the results.

        ``datamodule`` defaults to the trainer's (a trainer that never ran ``fit`` has none).
        """
        if (dm := sft_stage.datamodule_or_warn(trainer, self, datamodule)) is None:
            return {}
        problems = judged_problems(dm)
        back_to = pl_module.device
        pl_module.to(self._device or back_to)  # sample on the training device, not the CPU
        try:
            self.results = self.measure(trainer, pl_module, problems, "before")
            items = dm.curriculum.sft_pairs(self.source)
            if items:
                fit_end = _weights(pl_module) if self.keep == "better" else None
                retrain_from_initial(self, pl_module, items, seed=dm.curriculum.settings.seed)
                self.runs += 1
                self.results |= self.measure(trainer, pl_module, problems, "after")
                self._keep_better(pl_module, fit_end)
            else:
                rank_zero_warn("FinalRetrain: nothing to retrain on; the policy is left as is")
            if items and self.export_dir:  # every rank: the export gathers, rank 0 writes
                pl_module.export(self.export_dir)
        finally:
            pl_module.to(back_to)
        sft_stage.log_to_loggers(trainer, self.results)
        rank_zero_info(
            "FinalRetrain: " + ", ".join(f"{k}={v:.4f}" for k, v in self.results.items())
        )
        return dict(self.results)

    def _keep_better(self, pl_module: Any, fit_end: dict[str, torch.Tensor] | None) -> None:
        """With ``keep="better"``: back to the fit's own weights if the retrain lowered pass@1."""
        if fit_end is None:
            return
        before = self.results.get("val/final_before_pass@1", 0.0)
        kept = self.results.get("val/final_after_pass@1", 0.0) >= before
        if not kept:
            pl_module.policy.load_state_dict(fit_end)
            rank_zero_info("FinalRetrain: the retrain lowered pass@1; the fit's weights are kept")
        self.results["val/final_kept_retrained"] = float(kept)

    def measure(self, trainer: Any, pl_module: Any, problems: list[dict], when: str) -> dict:
        """``val/final_<when>_pass@1`` and ``@eval_k`` of ``pl_module``'s policy on ``problems``
        (seeded: every model measured gets the same sampling seed)."""
        if not problems:
            return {}
        base = getattr(pl_module, "val_sampling", None) or SamplingParams()
        sampling = replace(base, seed=self.seed)
        n, chunk = self.eval_k, self.batch_size
        counts = sft_stage.sample_counts(pl_module, problems, n, sampling, chunk)
        return {f"val/final_{when}_{k}": v for k, v in sft_stage.pass_rates(n, counts).items()}

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"runs": self.runs, "results": dict(self.results)}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.runs = int(state_dict["runs"])
        self.results = {k: float(v) for k, v in state_dict["results"].items()}
