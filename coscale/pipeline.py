"""The whole CoScale-RL loop, top-down. Every stage is a Lightning fit of the library's modules.

    warm-up SFT (format switch) -> measure every problem
    for each iteration:
        data scaling: more solutions for unsolvable problems (data set first, then a teacher)
        SFT from the initial model on the bank (+ the re-distilled set) -> measure, relabel pools
        RL (GRPO, Rollout N per difficulty group, N raised on plateaus) on solvable problems
        re-distillation into the initial model (a callback of the RL fit)
    final retrain from the initial model on everything collected, pass@k before / after

``results["spend"]`` holds the SFT examples and rollouts of every stage (coscale.budget).
Progress survives a crash: after every stage the pools, bank, replay buffer and N per problem
are written to ``<run_dir>/pipeline_state.json`` next to the stage's exported model, and a stage
interrupted mid-fit resumes from its own ``last.ckpt``.
"""

from __future__ import annotations

import importlib
import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint, TQDMProgressBar

from coscale import budget
from coscale.callbacks import FinalRetrain, PassRateEvaluation, ReDistillation, RolloutNSchedule
from coscale.callbacks.final_retrain import KEEP, judged_problems
from coscale.datamodules import ProblemDataModule
from coscale.modules import GRPOModule, SFTModule
from coscale.modules.loggers import LoggerKind, make_logger
from coscale.pools import Pool

FINAL_KEEP = (*KEEP, "best")
"""Values of ``pipeline.final_keep``: FinalRetrain's, plus ``best`` (over the iterations too)."""


@dataclass
class PipelineConfig:
    """Settings of ``coscale run``.

    Attributes:
        model: The initial model pi0 (hub name or local folder); every SFT starts from it.
        run_dir: Where stage checkpoints, exported models, logs and the state file go.
        iterations: Outer CoScale-RL iterations.
        warmup_problems: Problems whose first solution forms the warm-up (format) SFT set.
        eval_k: Samples per problem when measuring accuracy for the pools.
        eval_max_problems: Measure at most this many problems per evaluation (None: all).
        rl_eval_every: Also re-measure the pools with K fresh samples every this many RL epochs;
            0 relies on the RL rollouts themselves (each epoch's tally relabels the pools).
        sft_epochs: Epochs of every SFT stage.
        sft_max_steps: Cap on the optimiser steps of every SFT stage, the re-distillation and
            final retrain included (None: ``sft_epochs`` alone decide). SFT sets grow with every
            iteration; a cap keeps each stage's cost fixed.
        rl_epochs: Epochs of every RL stage (the solvable set is rebuilt each epoch).
        final_retrain: Retrain from the initial model at the end.
        final_keep: ``retrained`` (the paper); ``better``: keep the final retrain only if it
            does not lower pass@1 on the training problems (see ``FinalRetrain``); ``best``: as
            ``better``, then also measure every earlier iteration's model the same way (same
            problems, same seeded samples) and keep whichever scores highest (a later model
            wins ties). All three judge on training problems, never on held-out test sets.
        redistill_each_iteration: Re-distil into the initial model at the end of every RL stage.
            Off, the next iteration's SFT (from the initial model, on the bank plus the
            re-distilled set) is the re-distillation, and one SFT fit per iteration is saved;
            the iteration's exported model is then its RL model.
        checkpoint_every_n_steps: Save the running stage's ``last.ckpt`` every this many
            optimiser steps. 1 (the default) loses no step to a crash; a larger value saves the
            time of writing the model (and optimiser state) after every step, and a crash then
            redoes at most this many steps of the stage from the last checkpoint (pools, bank,
            replay buffer and N per problem are in it, so they rewind with the model).
        logger: ``wandb`` (offline without an API key), ``csv`` or ``none``.
        project: W&B project name.
        seed: Global seed.
        trainer: Extra ``lightning.Trainer`` arguments for every stage (accelerator, devices,
            strategy, precision, ...).
        sft: ``SFTModule`` arguments (the model is the pipeline's).
        grpo: ``GRPOModule`` arguments (the model is the previous stage's).
        schedule: ``RolloutNSchedule`` arguments.
    """

    model: str
    run_dir: str = "runs/coscale"
    iterations: int = 2
    warmup_problems: int = 16
    eval_k: int = 16
    eval_max_problems: int | None = None
    rl_eval_every: int = 0
    sft_epochs: int = 2
    sft_max_steps: int | None = None
    rl_epochs: int = 2
    final_retrain: bool = True
    redistill_each_iteration: bool = True
    final_keep: str = "retrained"
    checkpoint_every_n_steps: int = 1
    logger: LoggerKind = "wandb"
    project: str = "coscale"
    seed: int = 0
    trainer: dict[str, Any] = field(default_factory=dict)
    sft: dict[str, Any] = field(default_factory=dict)
    grpo: dict[str, Any] = field(default_factory=dict)
    schedule: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        errors = [
            f"{k} must be >= {lo}, got {v}"
            for k, v, lo in [
                ("iterations", self.iterations, 1),
                ("warmup_problems", self.warmup_problems, 0),
                ("eval_k", self.eval_k, 1),
                ("sft_epochs", self.sft_epochs, 1),
                ("rl_epochs", self.rl_epochs, 1),
                ("checkpoint_every_n_steps", self.checkpoint_every_n_steps, 1),
            ]
            if v < lo
        ]
        if self.sft_max_steps is not None and self.sft_max_steps < 1:
            errors.append(f"sft_max_steps must be >= 1 or null, got {self.sft_max_steps}")
        if self.final_keep not in FINAL_KEEP:  # checked now, not after hours of training
            errors.append(f"final_keep must be one of {FINAL_KEEP}, got {self.final_keep!r}")
        if errors:
            raise ValueError("pipeline: " + "; ".join(errors))


def instantiate(value: Any) -> Any:
    """``{"class_path": ..., "init_args": {...}}`` dicts (from YAML) become objects, recursively."""
    if isinstance(value, dict) and "class_path" in value:
        module_name, _, cls_name = value["class_path"].rpartition(".")
        cls = getattr(importlib.import_module(module_name), cls_name)
        return cls(**instantiate(value.get("init_args", {})))
    if isinstance(value, dict):
        return {k: instantiate(v) for k, v in value.items()}
    return value


class Pipeline:
    """Runs (or resumes) the stages of :class:`PipelineConfig` on one DataModule."""

    def __init__(self, config: PipelineConfig, data: ProblemDataModule) -> None:
        self.cfg, self.dm = config, data
        self.state_path = os.path.join(config.run_dir, "pipeline_state.json")
        self.done: list[str] = []
        self.current = config.model  # folder of the latest stage's model
        self.logger = make_logger(
            config.logger, os.path.join(config.run_dir, "logs"), config.project
        )
        self.results: dict[str, Any] = {}
        self.sft_args, self.grpo_args = instantiate(config.sft), instantiate(config.grpo)

    def run(self, close_logger: bool = True) -> dict[str, Any]:
        """Runs the remaining stages; returns per-stage pool counts, N per group and models."""
        L.seed_everything(self.cfg.seed, workers=True)
        self.dm.load()
        self._restore()
        self.stage("warmup", self.warmup)
        for it in range(1, self.cfg.iterations + 1):
            self.stage(f"it{it}/scale", self.scale_data)
            self.stage(f"it{it}/sft", lambda name: self.sft(name))
            self.stage(f"it{it}/eval", self.measure)
            # the last iteration's re-distillation is the final retrain: do it once
            last = it == self.cfg.iterations and self.cfg.final_retrain
            redistill = not last and (
                self.cfg.redistill_each_iteration or it == self.cfg.iterations
            )
            self.stage(f"it{it}/rl", lambda name, r=redistill: self.rl(name, redistill=r))
        if self.cfg.final_retrain:
            self.stage("final", self.final)
        self.results["pools"] = self.dm.pools.counts()
        self._save()
        if close_logger:
            self.close_logger()
        return self.results

    # ------------------------------------------------------------------ stages
    def warmup(self, name: str) -> None:
        """SFT pi0 on the first solution of a few problems (output format), then measure all."""
        firsts = list(self.dm.problems)[: self.cfg.warmup_problems]
        if self.dm.add_solutions(firsts, 1):
            self.sft(name)
        self.measure(name + "/eval")

    def scale_data(self, name: str) -> None:
        added = self.dm.scale_solutions()
        self.results[name] = {"solutions_added": added, "bank_total": self.dm.bank.total()}

    def sft(self, name: str) -> None:
        """SFT from the initial model on the bank of non-RL problems plus the re-distilled set."""
        self.dm.mode, self.dm.sft_source = "sft", "all"
        if not self.dm.sft_items():
            return
        module = SFTModule(model=self.cfg.model, **self.sft_args)
        self.fit(name, module, [], self.cfg.sft_epochs, max_steps=self.cfg.sft_max_steps)
        self.current = module.export(os.path.join(self.cfg.run_dir, name, "model"))

    def measure(self, name: str) -> None:
        """K samples of every non-failed problem with the latest model -> relabel the pools."""
        module = self._standalone(SFTModule(model=self.current, **self.sft_args), name)
        self._evaluator().evaluate(module.trainer, module, tag=name, datamodule=self.dm)
        self.results[name] = self.dm.pools.counts()

    def rl(self, name: str, redistill: bool) -> None:
        """GRPO on the solvable problems with per-group N; re-distils into pi0 at the end."""
        if not self.dm.pools.members(Pool.SOLVABLE):
            print(f"[coscale] {name}: no solvable problems, RL skipped")
            return
        self.dm.mode = "rl"
        module = GRPOModule(model=self.current, **self.grpo_args)
        callbacks: list = [RolloutNSchedule(**self.cfg.schedule)]
        if self.cfg.rl_eval_every:
            callbacks.append(self._evaluator(every_n_epochs=self.cfg.rl_eval_every))
        if redistill:
            sft = self._stage_sft_args()
            callbacks.append(
                ReDistillation(
                    sft=sft, trainer=self._sft_trainer_args(), initial_model=self.cfg.model
                )
            )
        self.fit(name, module, callbacks, self.cfg.rl_epochs)
        self.current = module.export(os.path.join(self.cfg.run_dir, name, "model"))
        self.results[name] = {"pools": self.dm.pools.counts(), "n_per_group": self._n_per_group()}

    def final(self, name: str) -> None:
        """Retrain from pi0 on everything collected; pass@k before and after."""
        module = self._standalone(SFTModule(model=self.current, **self.sft_args), name)
        best = self.cfg.final_keep == "best"
        retrain = FinalRetrain(
            sft=self._stage_sft_args(),
            trainer=self._sft_trainer_args(),
            initial_model=self.cfg.model,
            eval_k=min(8, self.cfg.eval_k),
            keep="better" if best else self.cfg.final_keep,
        )
        self.results["final"] = dict(retrain.run(module.trainer, module, datamodule=self.dm))
        if best:
            self.results["final"] |= self._keep_best_iteration(retrain, module)
        self.current = module.export(os.path.join(self.cfg.run_dir, "final", "model"))

    def _keep_best_iteration(self, retrain: FinalRetrain, module: L.LightningModule) -> dict:
        """``final_keep: best``: measures each earlier iteration's model like the final one and
        loads the best into ``module`` when it beats what the final stage kept."""
        final = self.results["final"]
        kept = max(
            final.get("val/final_before_pass@1", 0.0), final.get("val/final_after_pass@1", 0.0)
        )
        scores, winner, problems = {}, None, judged_problems(self.dm)
        # latest first, and only a strictly higher score replaces: a later model wins ties
        for it in range(self.cfg.iterations - 1, 0, -1):
            path = os.path.join(self.cfg.run_dir, f"it{it}", "rl", "model")
            if not os.path.isdir(path):  # that iteration had no RL stage
                continue
            other = self._standalone(SFTModule(model=path, **self.sft_args), f"final/it{it}")
            key = f"val/final_it{it}_pass@1"
            scores[key] = retrain.measure(other.trainer, other, problems, f"it{it}")[key]
            if scores[key] > kept:
                kept, winner = scores[key], (it, other.policy.state_dict())
        # 0: the final stage's own choice (last RL model or retrain) stays; k: iteration k's model
        scores["val/final_kept_iteration"] = float(winner[0] if winner else 0)
        if winner is not None:
            module.policy.load_state_dict(winner[1])
        print(
            f"[coscale] final_keep=best: {', '.join(f'{k}={v:.4f}' for k, v in scores.items())}",
            flush=True,
        )
        return scores

    # --------------------------------------------------------------- plumbing
    def stage(self, name: str, fn) -> None:
        if name in self.done:
            return
        counts = " ".join(f"{k}={v}" for k, v in self.dm.pools.counts().items())
        print(
            f"\n[coscale] == stage {name} | pools: {counts} | bank: {self.dm.bank.total()} ==",
            flush=True,
        )
        before = budget.snapshot()
        fn(name)
        # SFT examples and rollouts of this stage (a stage resumed mid-fit counts its rest)
        self.results.setdefault("spend", {})[name] = budget.since(before)
        self.done.append(name)
        self._save()

    def fit(
        self,
        name: str,
        module: L.LightningModule,
        callbacks: list,
        epochs: int,
        max_steps: int | None = None,
    ) -> None:
        ckpt_dir = os.path.join(self.cfg.run_dir, name, "ckpt")
        ckpt = ModelCheckpoint(
            dirpath=ckpt_dir,
            save_last=True,
            every_n_train_steps=self.cfg.checkpoint_every_n_steps,
            save_top_k=0,
        )
        trainer = self._trainer(name, [*callbacks, ckpt], max_epochs=epochs, max_steps=max_steps)
        last = os.path.join(ckpt_dir, "last.ckpt")
        trainer.fit(module, datamodule=self.dm, ckpt_path=last if os.path.exists(last) else None)

    def _trainer(
        self, name: str, callbacks: list, max_epochs: int, max_steps: int | None = None
    ) -> L.Trainer:
        args = {
            "accelerator": "auto",
            "devices": 1,
            "log_every_n_steps": 1,
            "enable_model_summary": False,
            "num_sanity_val_steps": 0,
            "limit_val_batches": 0,
            **self.cfg.trainer,
        }
        bar = TQDMProgressBar()  # one plain bar per stage; nested stages print their own
        return L.Trainer(
            default_root_dir=os.path.join(self.cfg.run_dir, name),
            logger=self.logger,
            callbacks=[*callbacks, bar],
            max_epochs=max_epochs,
            max_steps=-1 if max_steps is None else max_steps,
            **args,
        )

    def _standalone(self, module: L.LightningModule, name: str) -> L.LightningModule:
        """A module attached to a trainer (loggers, device) outside of any fit."""
        trainer = self._trainer(name, [], max_epochs=1)
        trainer.strategy.connect(module)
        module.trainer = trainer
        return module.to(trainer.strategy.root_device)

    def _stage_sft_args(self) -> dict[str, Any]:
        """SFT settings of the callbacks' nested SFT fits (same batch size as the SFT stages)."""
        return {**self.sft_args, "batch_size": self.dm.sft_batch_size}

    def _n_per_group(self) -> dict[int, int]:
        """Rollout N of each difficulty group (the schedule's decision, read from the data)."""
        out: dict[int, int] = {}
        for pid, group in sorted(self.dm.group_of.items()):
            out.setdefault(group, self.dm.n_of(pid))
        return out

    def _sft_trainer_args(self) -> dict[str, Any]:
        return {
            "max_epochs": self.cfg.sft_epochs,
            "max_steps": -1 if self.cfg.sft_max_steps is None else self.cfg.sft_max_steps,
            **{k: v for k, v in self.cfg.trainer.items() if k in ("accelerator", "precision")},
        }

    def _evaluator(self, every_n_epochs: int = 1) -> PassRateEvaluation:
        return PassRateEvaluation(
            k=self.cfg.eval_k,
            max_problems=self.cfg.eval_max_problems,
            every_n_epochs=every_n_epochs,
        )

    def close_logger(self) -> None:
        """Flushes and closes the W&B run so that its files are complete when ``run`` returns."""
        if (
            self.logger
            and hasattr(self.logger, "experiment")
            and hasattr(self.logger.experiment, "finish")
        ):
            self.logger.experiment.finish()

    def _save(self) -> None:
        os.makedirs(self.cfg.run_dir, exist_ok=True)
        state = {
            "done": self.done,
            "current": self.current,
            "data": self.dm.state_dict(),
            "results": self.results,
            "config": asdict(self.cfg),
        }
        tmp = self.state_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(state, f, indent=1, default=str)
        os.replace(tmp, self.state_path)  # atomic: a crash never leaves half a state file

    def _restore(self) -> None:
        if not os.path.exists(self.state_path):
            return
        with open(self.state_path) as f:
            state = json.load(f)
        self.done, self.current, self.results = state["done"], state["current"], state["results"]
        self.dm.load_state_dict(state["data"])
        print(f"[coscale] resuming after stages: {', '.join(self.done) or 'none'}")
