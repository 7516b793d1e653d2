"""What every stage of a pipeline run shares: settings, the curriculum, the logger, and its fits.

:meth:`StageContext.fit` is the only place a stage trains: one Lightning fit of a module on a
view of the curriculum, with a commit checkpoint, the run's RNG and spend in it, and resume
from the stage's own last whole checkpoint (:func:`~coscale.loop.checkpoint_store.last_checkpoint`)
when one is there.
"""

from __future__ import annotations

import copy
import os
from types import SimpleNamespace

import lightning as L
import torch

from coscale.datamodules.serving import CurriculumDataModule
from coscale.distributed import is_writer
from coscale.log import logger as coscale_log
from coscale.loop.checkpoint_store import last_checkpoint
from coscale.loop.curriculum import Curriculum
from coscale.modules.curriculum_table import log_curriculum
from coscale.modules.loggers import log_to_loggers
from coscale.rollout.dtype import precision_dtype
from coscale.rollout.run_engine import RunEngine
from coscale.run.checkpoint import CommitCheckpoint, RunState
from coscale.run.console import RunConsole, StageProgressBar
from coscale.run.epoch_counts import WholeEpochCounts
from coscale.run.precision import resolve_precision, training_device


class StageContext:
    """Shared by the stages of one run.

    Args:
        cfg: The pipeline's settings (``PipelineSettings``).
        curriculum: The loop's state.
        data: The ProblemDataModule the curriculum came from (batch sizes, held-out problems).
        logger: The Lightning logger of every fit (or False).
        sft_args: ``SFTModule`` arguments (objects built).
        grpo_args: ``GRPOModule`` arguments (objects built).
    """

    def __init__(self, cfg, curriculum: Curriculum, data, logger, sft_args, grpo_args) -> None:
        self.cfg, self.curriculum, self.data, self.logger = cfg, curriculum, data, logger
        self.fit_steps = 0  # optimiser steps of the stage's fit (the run's step axis)
        self.sft_args, self.grpo_args = sft_args, grpo_args
        # timed on the batch the SFT stages train on (sequences x the longest pair's tokens)
        shape = (data.sft_batch_size, sft_args.get("max_length", 1024))
        self.trainer_args, why = resolve_precision(
            dict(cfg.trainer), cfg.model, cfg.run_dir, shape=shape
        )
        # a strategy object (from YAML's class_path) holds its fit's model: each fit gets a
        # copy of it taken before any fit used it
        self._strategy = copy.deepcopy(self.trainer_args.pop("strategy", "auto"))
        if why:
            coscale_log.info(why)
        dtype = precision_dtype(self.trainer_args.get("precision", "32-true"))
        self.engine = RunEngine(cfg.rollout, dtype, cuda=self.device().type == "cuda")
        coscale_log.info(self.engine.why)
        self.console = RunConsole()

    def attach(self, module: L.LightningModule, model: str) -> None:
        """Lends the run's engine to ``module`` (whose weights are in folder ``model``)."""
        module.backend = self.engine.attach(module.policy, module.tokenizer, model)

    def path(self, *parts: str) -> str:
        return os.path.join(self.cfg.run_dir, *parts)

    def datamodule(self, sft_source: str = "all") -> CurriculumDataModule:
        """A fit's view of the curriculum, with the data section's batch sizes."""
        d = self.data
        return CurriculumDataModule(
            self.curriculum, sft_source, d.batch_size, d.sft_batch_size, d.val_batch_size
        )

    def resumable(self, name: str) -> bool:
        """Whether stage ``name`` left a checkpoint to resume from."""
        return last_checkpoint(self.path(name, "ckpt")) is not None

    def fit(
        self,
        name: str,
        module: L.LightningModule,
        data: CurriculumDataModule,
        callbacks: list,
        epochs: int,
        max_steps: int | None = None,
    ) -> None:
        """One fit of stage ``name``, resumed from its last checkpoint when there is one."""
        module.run_stage = name  # what the module's tables say the rows came from
        ckpt_dir = self.path(name, "ckpt")
        commit = CommitCheckpoint(ckpt_dir, self.cfg.checkpoint_every_n_steps, label=name)
        with self.console.fit():
            trainer = self.trainer(
                name, [RunState(), WholeEpochCounts(), *callbacks, commit], epochs, max_steps
            )
            trainer.fit(module, datamodule=data, ckpt_path=commit.last())
        self.fit_steps = trainer.global_step  # the stage's steps on the run's axis

    def trainer(self, name: str, callbacks: list, epochs: int, max_steps: int | None) -> L.Trainer:
        args = {
            "accelerator": "auto",
            "devices": 1,
            "log_every_n_steps": 1,
            "enable_model_summary": False,
            "num_sanity_val_steps": 0,
            "limit_val_batches": 0,
            "reload_dataloaders_every_n_epochs": 1,  # each epoch reads the pools as they are
            **self.trainer_args,
            "strategy": copy.deepcopy(self._strategy),
        }
        return L.Trainer(
            default_root_dir=self.path(name),
            logger=self.logger,
            callbacks=[*callbacks, StageProgressBar(name)],
            enable_checkpointing=True,
            max_epochs=epochs,
            max_steps=-1 if max_steps is None else max_steps,
            **args,
        )

    def device(self) -> torch.device:
        """Where measurement samples outside a fit: the trainer's accelerator."""
        return torch.device(training_device(str(self.trainer_args.get("accelerator", "auto"))))

    def log_curriculum(self, stage: str) -> None:
        """The curriculum table's row at the end of stage ``stage``."""
        if self.logger and is_writer():
            log_curriculum([self.logger], self.curriculum, stage, None)

    def log(self, metrics: dict[str, float]) -> None:
        """Metrics of work outside a fit, straight to the logger, after the stage's fit steps so
        far (on the run's step axis: where the run stands)."""
        loggers = SimpleNamespace(loggers=[self.logger] if self.logger else [])
        log_to_loggers(loggers, metrics, self.fit_steps)
