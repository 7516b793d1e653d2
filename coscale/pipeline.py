"""The whole CoScale-RL loop, top-down. Each stage is a plain function of :mod:`coscale.stages`.

    warmup       SFT pi0 on one solution of a few problems (output format) -> measure all
    for each iteration k:
      it<k>/scale     data scaling: more solutions for the unsolvable problems
      it<k>/sft       SFT from pi0 on the bank (+ re-distilled set) -> it<k>/measure: measure
      it<k>/rl        GRPO on the solvable problems, Rollout N per difficulty group
      it<k>/redistill SFT from pi0 on what RL found (when ``redistill_each_iteration``)
    final/retrain   SFT from pi0 on everything collected (-> final/measure, final/rl with ``final.rl``)
    final        judge the retrain against the last iteration's model; keep one (``final.keep``)

State lives in one :class:`~coscale.loop.curriculum.Curriculum`. Commit points: a stage fit writes
a whole checkpoint (the curriculum, RNG and spend in it; a file, or a folder of shards under FSDP2)
every ``checkpoint_every_n_steps`` steps and after each epoch's end work; when a stage ends,
``pipeline_state.json`` (curriculum, done stages, results, spend) is replaced atomically, and then
the stage's checkpoints are removed (``keep_checkpoints`` keeps them). A run killed anywhere and
started again with the same command ends with the same state and weights as an uninterrupted one
(``tests/test_kill_anywhere.py``, one process, DDP and FSDP2).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import lightning as L

from coscale import clock
from coscale.checks import as_group, at_least, group_errors
from coscale.datamodules import ProblemDataModule
from coscale.distributed import barrier, is_writer
from coscale.log import logger as coscale_log
from coscale.loop import budget
from coscale.loop.checkpoint_store import remove_all
from coscale.loop.commit import commit_point, write_json
from coscale.loop.schedule import NSchedule, schedule_errors
from coscale.measure.selection import SelectionSettings
from coscale.models.adapters import as_peft_config
from coscale.modules import GRPOModule, SFTModule
from coscale.modules.artifacts import log_model_folder
from coscale.modules.grpo import settings_errors as grpo_settings_errors
from coscale.modules.loggers import LoggerKind, finish, make_logger
from coscale.modules.run_steps import at_stage
from coscale.modules.sft import settings_errors as sft_settings_errors
from coscale.renamed import old_names
from coscale.rollout.factory import RolloutSettings
from coscale.run.context import StageContext
from coscale.run.plan import Stage, plan, state_config, upgrade_state
from coscale.run.settings import (
    FinalSettings,
    RunSamplingSettings,
    instantiate,
    one_verifier,
    set_by_run_errors,
    take_renamed,
    trainer_errors,
    typed_errors,
)
from coscale.stages.final import final_stage
from coscale.stages.measure import measure_stage
from coscale.stages.rl import rl_stage
from coscale.stages.sft import sft_stage

if TYPE_CHECKING:  # an optional dependency (coscale[peft]); the CLI resolves the name
    from peft import PeftConfig


@dataclass
class PipelineSettings:
    """Settings of ``coscale run``.

    Attributes:
        model: The initial model pi0 (hub name or local folder); every SFT starts from it.
        run_dir: Where stage checkpoints, exported models, logs and the state file go.
        iterations: Outer CoScale-RL iterations.
        warmup_problems: Problems whose first solution forms the warm-up (format) SFT set.
        measure_samples: Samples per problem when measuring accuracy for the pools (K).
        measure_max_problems: Measure at most this many problems per measurement (None: all).
        rl_measure_every: Re-measure every problem (K samples) every this many RL epochs (1: the
            paper); 0: each epoch's rollouts relabel only what they drew (the pool drains).
        eval_k, measure_k, eval_max_problems, rl_eval_every: Earlier names of the three above.
        sft_epochs: Epochs of every SFT stage.
        sft_max_steps: Cap on the optimiser steps of every SFT stage, the re-distillation and
            final retrain included (None: the epochs alone decide). SFT sets grow with every
            iteration; a cap keeps each stage's cost fixed.
        selection: Which weights every SFT stage from the initial model ends with (each
            iteration's SFT, re-distillation, the final retrain): with ``problems`` > 0 the
            best-scoring by pass@1 on a seeded slice of ``data.val`` (else the training problems),
            else its last (:mod:`coscale.measure.selection`).
        distill_weight: SFT stages from the initial model that follow an RL stage (the
            re-distillation, the next iteration's SFT, the final retrain) also match the latest
            RL model's next-token distributions on their solution tokens, with this weight on
            KL(RL model || model) and 1 - it on the tokens' cross-entropy
            (:mod:`coscale.sft.distill`; one more forward pass of the RL model per batch).
            0: off, token cross-entropy only (the paper).
        rl_epochs: Epochs of every RL stage (the solvable set is rebuilt each epoch).
        redistill_each_iteration: Re-distil into the initial model after every RL stage but
            the last (the final retrain is the last one's). Off, the next iteration's SFT (from
            the initial model, on the bank plus the re-distilled set) is the re-distillation,
            one SFT fit per iteration is saved, and an iteration's model is its RL model.
        final: The run's end: the retrain from the initial model, its own RL stage, and which
            model is kept.
        checkpoint_every_n_steps: Save the running stage's checkpoint (``<stage>/ckpt``) every
            this many optimiser steps (and after every epoch's end work). 1 loses no step to a
            crash; a larger value saves the time of writing the model after every step, and a
            crash then redoes at most this many steps, to the same result.
        keep_checkpoints: Keep each finished stage's last checkpoint (model, optimiser state,
            curriculum: about 12 bytes per parameter, 1.6 GB for a 135M model). Off, a stage's
            ``<stage>/ckpt`` is removed once the state file records the stage as done: the
            run's disk peaks at a stage's last two checkpoints (a damaged latest resumes from
            the one before) and the exported models; on, a finished stage can be read back.
        logger: ``wandb`` (offline without an API key), ``csv`` or ``none``.
        project: W&B project name.
        wandb: ``WandbLogger``'s arguments (name, entity, group, tags, notes, mode, log_model:
            the final model folder as a W&B model artifact with its scores); the W&B run id is
            kept in ``<run_dir>/logs``: a resumed run goes on in that run.
        seed: Global seed.
        trainer: Extra ``lightning.Trainer`` arguments for every stage (accelerator, devices,
            strategy, precision, ...). ``precision: auto`` times a training step of the model in
            32-true and bf16-mixed on the CPU and takes the faster (CUDA: bf16-mixed where
            supported), prints both times, and keeps the choice for every rank and resume in
            ``<run_dir>/precision.json`` (:mod:`coscale.run.precision`). Keys are checked
            against ``lightning.Trainer``'s signature before any work (a typo is refused with
            the nearest names); those each stage sets itself (``max_epochs``, ``max_steps``,
            ``logger``, ...) are refused naming the setting that decides them.
        peft: Train a PEFT adapter (a ``peft.PeftConfig`` such as ``peft.LoraConfig``; YAML
            ``class_path: peft.LoraConfig`` with ``init_args``) in every stage instead of every
            weight. Each SFT from the initial model trains a new adapter on the untouched base;
            each RL stage a new one on the previous stage's exported (merged) model, which is
            also its KL reference. Every stage's ``model`` folder stays a merged Hugging Face
            folder with its adapter in ``model/adapter`` (``docs/peft.md``). None: full
            fine-tunes.
        sampling: The run's one sampling definition (``RunSamplingSettings``: the prompt, the token
            limit and temperature of every sample the run takes); the modules' copies of it
            are refused.
        rollout: The run's one rollout engine per rank (``auto``, ``cached``, ``hf`` or
            ``vllm`` with its options; :mod:`coscale.rollout.run_engine`).
        sft: ``SFTModule`` arguments (the model, ``peft`` and ``prompt`` are the pipeline's).
        grpo: ``GRPOModule`` arguments (the model is the previous stage's; ``peft``, ``prompt``
            and ``rollout`` the pipeline's). Its ``verifier`` (or that default) is the run's one
            verifier: every stage's, the measurements' and the teacher's unless it sets its own.
        schedule: ``NSchedule`` arguments (Rollout N per difficulty group): the run's one
            schedule, built once and started afresh by every RL stage; a schedule the data's
            curriculum already holds is refused.
    """

    model: str
    run_dir: str = "runs/coscale"
    iterations: int = 2
    warmup_problems: int = 16
    measure_samples: int = 16
    measure_max_problems: int | None = None
    rl_measure_every: int = 0
    sft_epochs: int = 2
    sft_max_steps: int | None = None
    selection: SelectionSettings = field(default_factory=SelectionSettings)
    distill_weight: float = 0.0
    rl_epochs: int = 2
    redistill_each_iteration: bool = True
    final: FinalSettings = field(default_factory=FinalSettings)
    checkpoint_every_n_steps: int = 1
    keep_checkpoints: bool = False
    logger: LoggerKind = "wandb"
    project: str = "coscale"
    wandb: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    trainer: dict[str, Any] = field(default_factory=dict)
    peft: PeftConfig | None = None
    sampling: RunSamplingSettings = field(default_factory=RunSamplingSettings)
    rollout: RolloutSettings = field(default_factory=lambda: RolloutSettings("auto"))
    sft: dict[str, Any] = field(default_factory=dict)
    grpo: dict[str, Any] = field(default_factory=dict)
    schedule: dict[str, Any] = field(default_factory=dict)
    eval_k: int | None = None
    measure_k: int | None = None
    eval_max_problems: int | None = None
    rl_eval_every: int | None = None

    def __post_init__(self) -> None:
        """Every setting is checked here, before any work: all problems in one error."""
        take_renamed(self)
        errors = at_least(1, iterations=self.iterations, measure_samples=self.measure_samples)
        errors += at_least(1, sft_epochs=self.sft_epochs, rl_epochs=self.rl_epochs)
        errors += at_least(1, checkpoint_every_n_steps=self.checkpoint_every_n_steps)
        errors += at_least(
            0, warmup_problems=self.warmup_problems, rl_measure_every=self.rl_measure_every
        )
        errors += at_least(1, optional=True, sft_max_steps=self.sft_max_steps)
        self.selection = as_group(SelectionSettings, self.selection)
        self.final = as_group(FinalSettings, self.final)
        self.sampling = as_group(RunSamplingSettings, self.sampling)
        self.rollout = as_group(RolloutSettings, self.rollout)
        errors += group_errors(
            selection=self.selection, final=self.final, sampling=self.sampling, rollout=self.rollout
        )
        self.sft, self.grpo = dict(self.sft), dict(self.grpo)
        errors += set_by_run_errors("sft", self.sft) + set_by_run_errors("grpo", self.grpo)
        errors += at_least(1, optional=True, measure_max_problems=self.measure_max_problems)
        if not 0.0 <= self.distill_weight <= 1.0:
            errors.append(f"distill_weight must be in [0, 1]; got {self.distill_weight!r}")
        self.peft = as_peft_config(instantiate(self.peft, "pipeline.peft"))  # class_path, mapping
        errors += typed_errors("sft", SFTModule, self.sft, sft_settings_errors)
        errors += typed_errors("grpo", GRPOModule, self.grpo, grpo_settings_errors)
        errors += typed_errors("schedule", NSchedule, self.schedule, schedule_errors)
        errors += trainer_errors(self.trainer)
        if errors:
            raise ValueError("pipeline: " + "; ".join(errors))


class Pipeline:
    """Runs (or resumes) the stages of :class:`PipelineSettings` on the data of one DataModule."""

    def __init__(self, config: PipelineSettings, data: ProblemDataModule) -> None:
        self.cfg, self.data = config, data
        self.curriculum = data.curriculum
        if self.curriculum.use_schedule(one := NSchedule(**config.schedule)) is not one:
            raise ValueError(
                "the data's curriculum has a Rollout N schedule: coscale run takes it from "
                "pipeline.schedule only (remove the other)"
            )
        self.plan = plan(config)  # every stage's name, kind and iteration, in order
        self.state_path = os.path.join(config.run_dir, "pipeline_state.json")
        self.done: list[str] = []
        self.running: str | None = None  # the stage at work (None: none has started)
        self.current = config.model  # folder of the latest stage's model
        self.models: dict[str, str] = {}  # stage -> its exported model
        self.results: dict[str, Any] = {}
        self.seconds: dict[str, float] = {}  # wall time per stage, not part of the results
        self.timing: dict[str, dict[str, float]] = {}  # its parts (coscale.clock.since)
        logs = os.path.join(config.run_dir, "logs")
        logger = make_logger(config.logger, logs, config.project, **config.wandb)
        sft = config.sampling.sft_args(instantiate(config.sft, "pipeline.sft"))
        grpo = config.sampling.grpo_args(instantiate(config.grpo, "pipeline.grpo"))
        one_verifier(sft, grpo, data)
        self.ctx = StageContext(config, self.curriculum, data, logger, sft, grpo)
        grpo["rollout"] = self.ctx.engine.spec  # what the modules state; they borrow the engine

    @property
    def logger(self) -> Any:
        """The Lightning logger every stage logs to (False: none)."""
        return self.ctx.logger

    def run(self, close_logger: bool = True) -> dict[str, Any]:
        """Runs the remaining stages; returns per-stage pool counts, N per group and results."""
        L.seed_everything(self.cfg.seed, workers=True)
        self.data.load()
        self._restore()
        try:
            with self.ctx.console:
                for stage in self.plan.values():
                    self.stage(stage.name, self._runner(stage))
        finally:  # the run's engine (a vLLM engine's memory) ends with the run
            self.ctx.engine.close()
        if set(self.plan) <= set(self.done) and getattr(self.logger, "log_final_model", False):
            log_model_folder(self.logger, self.current, self.results.get("final") or {})
        if close_logger:
            self.close_logger()
        return self.results

    # ------------------------------------------------------------------ stages
    def warmup(self, name: str) -> None:
        firsts = list(self.curriculum.problems)[: self.cfg.warmup_problems]
        if self.curriculum.add_solutions(firsts, 1):
            self._adopt(name, sft_stage(self.ctx, name))
        self.results[name] = measure_stage(self.ctx, name, self.current)

    def scale(self, name: str) -> None:
        added = self.curriculum.scale_solutions()
        self.results[name] = {"solutions_added": added, "bank_total": self.curriculum.bank.total()}

    def sft(self, name: str) -> None:
        final = self.plan[name].kind == "retrain"
        epochs = self.cfg.final.epochs if final else None  # None: sft_epochs
        source = self.cfg.final.source if final else "all"
        self._adopt(
            name, sft_stage(self.ctx, name, source, teacher=self._latest_rl(), epochs=epochs)
        )

    def measure(self, name: str) -> None:
        self.results[name] = measure_stage(self.ctx, name, self.current)

    def rl(self, name: str) -> None:
        self._adopt(name, rl_stage(self.ctx, name, self.current))
        self.results[name] = {
            "pools": self.curriculum.pools.counts(),
            "n_per_group": self.curriculum.n_per_group(),
        }

    def final(self, name: str) -> None:
        earlier = [
            (it, m) for it in range(1, self.cfg.iterations) if (m := self._iteration_model(it))
        ]
        candidate = self.models.get("final/rl") or self.models.get("final/retrain")
        self.results[name], self.current = final_stage(
            self.ctx, name, self._before_final(), candidate, earlier
        )

    def _runner(self, stage: Stage):
        """The method that runs a stage of ``stage``'s kind (looked up now: tests stub them)."""
        return getattr(self, "sft" if stage.kind in ("redistill", "retrain") else stage.kind)

    def _before_final(self) -> str:
        """The model the last iteration ended with (what the final retrain must beat)."""
        before = [self.models.get(s.name) for s in self.plan.values() if s.iteration is not None]
        return ([m for m in before if m] or [self.cfg.model])[-1]

    def _adopt(self, name: str, model: str | None) -> None:
        """Stage ``name``'s exported ``model`` (if any) is the run's current model from now."""
        if model is not None:
            self.current = self.models[name] = model

    def _latest_rl(self) -> str | None:
        """The last iteration's RL model (None before any RL): what a later SFT distils from."""
        rl = [self.models.get(s.name) for s in self.plan.values() if s.kind == "rl" and s.iteration]
        return ([m for m in rl if m] or [None])[-1]

    def _iteration_model(self, it: int) -> str | None:
        """Iteration ``it``'s model: its re-distilled model, else its RL model."""
        models = {s.kind: self.models.get(s.name) for s in self.plan.values() if s.iteration == it}
        return models.get("redistill") or models.get("rl")

    # --------------------------------------------------------------- plumbing
    def stage(self, name: str, fn) -> None:
        """Runs stage ``name`` unless done; then commits the state file."""
        if name in self.done:
            return
        counts = " ".join(f"{k}={v}" for k, v in self.curriculum.pools.counts().items())
        bank = self.curriculum.bank.total()
        coscale_log.info(f"== stage {name} | pools: {counts} | bank: {bank} ==")
        before, clocked = budget.snapshot(), clock.snapshot()
        moved = dict(self.curriculum.pools.moves)
        start, self.running, self.ctx.fit_steps = time.perf_counter(), name, 0
        at_stage(self.logger, self.results.get("run_steps", 0), len(self.done))
        fn(name)
        self.results["run_steps"] = self.results.get("run_steps", 0) + self.ctx.fit_steps
        self.ctx.engine.release()  # the stage's model goes with it; the engine stays up
        # wall time of this process's part (a resumed stage counts only what it redid)
        self.seconds[name] = round(time.perf_counter() - start, 1)
        self.timing[name] = clock.since(clocked, self.seconds[name])
        took = f"{self.seconds[name]:.1f} s: {clock.describe(self.timing[name])}"
        coscale_log.info(f"{name} took {took}")
        # a resumed fit puts its checkpoint's count back (RunState): as an uninterrupted run's
        self.results.setdefault("spend", {})[name] = budget.since(before)
        self._record_moves(name, moved)
        self.ctx.log_curriculum(name)
        self.done.append(name)
        self.results["pools"] = self.curriculum.pools.counts()  # as of the last finished stage
        commit_point(f"{name} end, before the state file")
        self._save()
        commit_point(f"{name} state file written")
        self._drop_checkpoints(name)

    def _record_moves(self, name: str, before: dict[str, int]) -> None:
        """The problems the stage moved between pools, by rule: said, logged, in results."""
        moved = self.curriculum.pools.moves_since(before)
        self.results.setdefault("moves", {})[name] = moved
        if moved:
            coscale_log.info(f"{name} moved " + ", ".join(f"{k}: {n}" for k, n in moved.items()))
            self.ctx.log({f"moves/{name}/{k}": float(n) for k, n in moved.items()})

    def _drop_checkpoints(self, name: str) -> None:
        """Removes done stage ``name``'s checkpoints (unless ``keep_checkpoints``): the state
        file holds everything a later stage needs. Also run for every done stage on resume, for
        a run killed between the state file and the removal."""
        if not self.cfg.keep_checkpoints and is_writer():
            remove_all(self.ctx.path(name, "ckpt"))
        barrier()

    def close_logger(self) -> None:
        """Flushes and closes the W&B run so that its files are complete when ``run`` returns."""
        finish(self.ctx.logger)

    def _save(self) -> None:
        state = dict(done=self.done, current=self.current, models=self.models)
        state |= dict(curriculum=self.curriculum.state_dict(), results=self.results)
        state |= dict(seconds=self.seconds, timing=self.timing, config=state_config(self.cfg))
        if is_writer():  # every rank holds the same state; rank 0 writes it
            write_json(self.state_path, state)  # atomic: a crash never leaves half a state file
        barrier()

    def _restore(self) -> None:
        if not os.path.exists(self.state_path):
            return
        with open(self.state_path) as f:
            state = upgrade_state(json.load(f))
        self.done, self.current, self.results = state["done"], state["current"], state["results"]
        self.models, self.seconds, self.timing = state["models"], state["seconds"], state["timing"]
        self.curriculum.load_state_dict(state["curriculum"])
        coscale_log.info(f"resuming after stages: {', '.join(self.done) or 'none'}")
        for name in self.done:
            self._drop_checkpoints(name)


# the classes' earlier names, for one release
__getattr__ = old_names(__name__, {"PipelineConfig": PipelineSettings})
