"""FinalRetrain: the last step of CoScale-RL, retraining the initial model on everything.

In the final iteration the model is retrained from the initial weights on every solution
collected (bank + latest correct RL rollouts), so that nothing learned early is forgotten
(METHOD.md, "The loop"). Accuracy is measured before and after, on the held-out problems
(or on the training problems when there are none), with the same seeded samples both times.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from typing_extensions import override

from coscale.callbacks.pass_rate import sample_counts
from coscale.callbacks.redistill import ReDistillation, _check_common
from coscale.callbacks.sft_stage import datamodule_or_warn, log_to_loggers, retrain_from_initial
from coscale.metrics import PassAtK
from coscale.rollout.base import SamplingParams


class FinalRetrain(ReDistillation):
    """At ``on_fit_end``: evaluate -> SFT from the initial weights on ``sft_source="all"`` ->
    load into the policy -> evaluate again.

    Logs ``val/final_before_pass@1``, ``val/final_after_pass@1`` and the same at ``eval_k``,
    prints them, and keeps them in :attr:`results`.

    Args:
        sft: :class:`~coscale.modules.SFTModule` arguments plus ``batch_size``.
        trainer: ``lightning.Trainer`` arguments of the SFT fit.
        initial_model: Name or folder of the initial weights (default: ``model_source``).
        eval_k: Samples per problem in the before/after evaluation.
        export_dir: Save the retrained policy here in HF format.
        batch_size: Problems per sampling call of the evaluation.
        seed: Seed of the evaluation samples (the same before and after).
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
    ) -> None:
        errors = _check_common(sft, trainer, initial_model, export_dir)
        errors += [
            f"{name} must be an int >= 1, got {value!r}"
            for name, value in (("eval_k", eval_k), ("batch_size", batch_size))
            if isinstance(value, bool) or not isinstance(value, int) or value < 1
        ]
        if isinstance(seed, bool) or not isinstance(seed, int):
            errors.append(f"seed must be an int, got {seed!r}")
        if errors:
            raise ValueError("FinalRetrain: " + "; ".join(errors))
        super().__init__(
            max_total=None,
            include_bank=True,
            sft=sft,
            trainer=trainer,
            initial_model=initial_model,
            export_dir=export_dir,
        )
        self.eval_k, self.batch_size, self.seed = eval_k, batch_size, seed
        self.results: dict[str, float] = {}
        self._device: torch.device | None = None

    @override
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self._device = pl_module.device  # Lightning moves the module to CPU before on_fit_end

    @override
    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        pass  # this callback works at on_fit_end

    @override
    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self.run(trainer, pl_module)

    @override
    def run(self, trainer: Any, pl_module: Any) -> int:
        """Evaluates, retrains from the initial weights, evaluates again; returns the set size."""
        dm = datamodule_or_warn(trainer, self)
        if dm is None:
            return 0
        back_to = pl_module.device
        pl_module.to(self._device or back_to)
        try:
            problems = [
                {"id": p.id, "question": p.question, "answer": p.answer}
                for p in (dm.val_problems or dm.problems.values())
            ]
            self.results = self._measure(trainer, pl_module, problems, "before")
            items = self.collect(dm)
            self.last_size = len(items)
            if not items:
                rank_zero_warn(
                    "FinalRetrain: nothing collected to retrain on; the policy is left as is"
                )
            else:
                retrain_from_initial(
                    pl_module,
                    self.initial_of(pl_module),
                    items,
                    self.sft,
                    self.trainer_kwargs,
                    seed=getattr(dm, "seed", 0),
                )
                self.runs += 1
                self.results |= self._measure(trainer, pl_module, problems, "after")
                if self.export_dir and getattr(trainer, "is_global_zero", True):
                    pl_module.export(self.export_dir)
        finally:
            pl_module.to(back_to)
        log_to_loggers(trainer, self.results)
        rank_zero_info(
            "FinalRetrain: " + ", ".join(f"{k}={v:.4f}" for k, v in self.results.items())
        )
        return len(items)

    def _measure(
        self, trainer: Any, pl_module: Any, problems: list[dict], when: str
    ) -> dict[str, float]:
        if not problems:
            return {}
        base = getattr(pl_module, "val_sampling", None) or SamplingParams()
        sampling = SamplingParams(**{**base.__dict__, "seed": self.seed})
        counts = sample_counts(trainer, pl_module, problems, self.eval_k, sampling, self.batch_size)
        metric = PassAtK(k=sorted({1, self.eval_k}), sync_on_compute=False)
        metric.update([self.eval_k] * len(counts), counts)
        return {f"val/final_{when}_{key}": float(v) for key, v in metric.compute().items()}

    @override
    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {"results": dict(self.results)}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self.results = {k: float(v) for k, v in state_dict.get("results", {}).items()}
