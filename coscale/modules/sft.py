"""SFTModule: supervised fine-tuning of a causal LM on (prompt, solution) pairs.

The loss is the token mean over the solution tokens only (the prompt is context, not target),
over the whole global batch on several ranks (as one process with every rank's pairs computes
it; not the mean of the ranks' own token means).
Used for the warm-up, for data scaling (many solutions per hard problem), re-distillation and
the final retrain; batches are lists of ``{"question", "solution"}`` dicts from
:class:`~coscale.datamodules.ProblemDataModule` or any loader that yields the same.

``forgetting_guard`` (off by default) masks each step's gradient against the gradient of a
mastered set (:mod:`coscale.sft.forgetting`). Per optimiser step the order is: backward (DDP has
averaged the gradients) -> ``on_before_optimizer_step``: refresh the mastered gradient when due,
zero the conflicting coordinates -> gradient clipping (it sees the masked gradient) -> the
optimiser step -> the frozen coordinates are put back (momentum and weight decay do not move
them either).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import lightning as L
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from lightning.pytorch.utilities import rank_zero_warn
from typing_extensions import override

from coscale.checks import as_group, at_least, group_errors
from coscale.distributed import rank_world, sum_over_ranks
from coscale.models.adapters import as_peft_config
from coscale.models.prompting import PromptSettings, as_prompt_format, prompt_fields
from coscale.modules.fit_data import curriculum_of
from coscale.modules.loggers import log_to_loggers
from coscale.modules.optimizer_choice import choice_errors
from coscale.modules.policy_mixin import PolicyMixin, source_fields
from coscale.modules.settings import AdamWSettings, PolicyLoadSettings, ValidationSettings
from coscale.rollout.base import SamplingParams
from coscale.scoring.reward_set import RewardSet, reward_errors
from coscale.sft.batch import solution_loss, tokenize_pairs
from coscale.sft.distill import DistillationSettings, Teacher, distill_loss
from coscale.sft.forgetting import (
    ForgettingGuard,
    GuardSettings,
    guarded_parameters,
    mean_loss,
    reference_gradient,
)

if TYPE_CHECKING:  # an optional dependency (coscale[peft]); the CLI resolves the name
    from peft import PeftConfig


DEFAULT_OPTIMIZER = AdamWSettings()
"""The ``optimizer`` group's default."""


class SFTModule(PolicyMixin, L.LightningModule):
    """Causal-LM fine-tuning with the loss on solution tokens.

    On a :class:`~coscale.datamodules.ProblemDataModule` it is served (question, solution) pairs
    (``data_kind = "sft"``); any loader of such dicts works too.

    Args:
        model: HF hub name or local folder of a causal LM (or a built model, in Python).
        tokenizer: Tokenizer name or folder; defaults to the model's.
        prompt: How a question becomes the prompt.
        verifier: Decides which samples are correct (score >= 1.0) in validation, pass-rate
            measurement and checkpoint selection: coscale-style ``f(completions, answers,
            **columns)`` or TRL-style (``docs/rewards.md``; ``class_path`` or a dotted function
            path in YAML). Default: MathReward.
        load: How the policy loads (dtype, gradient checkpointing, remote code).
        optimizer: AdamW and its learning-rate warm-up.
        custom_optimizer: Another optimiser class with its arguments (``class_path`` in YAML,
            a ``functools.partial`` in Python); replaces ``optimizer``
            (:mod:`coscale.modules.optimizer_choice`). None: coscale's AdamW.
        lr_scheduler: A scheduler class with its arguments, stepped every optimiser step;
            replaces ``optimizer.warmup_steps`` and ``decay``. None: theirs.
        max_length: Longest (prompt + solution) in tokens; longer pairs are cut.
        padding_free: Run each batch with its rows end to end and attention kept per row
            (:mod:`coscale.sft.packing`), so no FLOPs go to padding; same loss up to float rounding.
            Applies where :func:`coscale.sft.packing.can_pack` holds (SDPA, no window shorter than
            a row, no activation checkpointing); any other model takes the padded path
            (``bench_sft.py`` measures both).
        validation: Samples, temperature and token limit of validation on held-out problems.
        forgetting_guard: Mask each step's gradient against the mastered set's
            (:mod:`coscale.sft.forgetting`; figures also in :attr:`guard_report`).
        mastered: The guard's mastered set as ``{"question", "solution"}`` dicts. Default: the
            ``solved`` problems of the trainer's ProblemDataModule with their latest correct
            rollout (else first bank solution). Not saved in the hyper-parameters.
        distill: Also match a teacher's next-token distributions on the solution tokens
            (:mod:`coscale.sft.distill`; logs ``train/ce`` and ``train/kl``). The pipeline sets it
            to the latest RL model in the SFT stages from the initial model that follow RL when
            ``pipeline.distill_weight`` > 0. None: plain SFT.
        peft: Train a PEFT adapter on the frozen base instead of every weight (a
            ``peft.PeftConfig`` such as ``peft.LoraConfig``; :mod:`coscale.models.adapters`).
            Exports are merged, with the adapter in ``<folder>/adapter``. None: full fine-tune.
    """

    data_kind = "sft"

    def __init__(
        self,
        model: str | Any,
        tokenizer: str | None = None,
        prompt: PromptSettings | str = PromptSettings(),
        verifier: Callable[..., Any] | None = None,
        load: PolicyLoadSettings = PolicyLoadSettings(),
        optimizer: AdamWSettings = DEFAULT_OPTIMIZER,
        custom_optimizer: OptimizerCallable | None = None,
        lr_scheduler: LRSchedulerCallable | None = None,
        max_length: int = 1024,
        padding_free: bool = True,
        validation: ValidationSettings = ValidationSettings(),
        forgetting_guard: GuardSettings = GuardSettings(),
        mastered: list[dict[str, str]] | None = None,
        distill: DistillationSettings | None = None,
        peft: PeftConfig | None = None,
    ) -> None:
        super().__init__()
        peft = as_peft_config(peft)
        given = dict(load=load, optimizer=optimizer, validation=validation)
        given |= dict(forgetting_guard=forgetting_guard, distill=distill)
        groups = {name: as_group(GROUPS[name], value) for name, value in given.items()}
        errors = settings_errors(verifier=verifier, max_length=max_length, **groups)
        errors += choice_errors(optimizer, custom_optimizer, lr_scheduler, DEFAULT_OPTIMIZER)
        if errors:
            raise ValueError("SFTModule: " + "; ".join(errors))
        self._choose_optimizer(custom_optimizer, lr_scheduler)
        guard, distill = groups.pop("forgetting_guard"), groups.pop("distill")
        self.save_hyperparameters(
            {
                "prompt": prompt_fields(prompt),
                "max_length": max_length,
                "padding_free": padding_free,
            }
            | {"tokenizer": tokenizer, "forgetting_guard": asdict(guard)}
            | {k: asdict(v) for k, v in groups.items()}
            | {"distill": asdict(distill) if distill is not None else None}
            | source_fields(model, peft)
            | self.optimizer_fields()
        )
        self.prompt, self.max_length = as_prompt_format(prompt), max_length
        self.rewards, self.padding_free = RewardSet(verifier=verifier), padding_free
        self.guard, self.mastered = guard, mastered
        self.guard_report: dict[str, float] = {}  # mastered-set figures of the last fit
        self._guard: ForgettingGuard | None = None
        self._guard_resume: dict[str, Any] | None = None  # the guard's place, from a checkpoint
        self._mastered_cycle: list[dict] = []
        self.loop_steps = 0  # optimiser steps when a loop other than the Trainer's runs the fit
        self._init_policy(model, tokenizer, peft, groups, SamplingParams())
        self.distill = distill
        # not a submodule: no optimiser state, not in checkpoints, not wrapped or sharded
        self.teacher = Teacher(distill.teacher, self.load_settings) if distill is not None else None

    @override
    def forward(self, **batch: torch.Tensor) -> Any:
        return self.policy(**batch)

    @override
    def training_step(self, batch: list[dict], batch_idx: int) -> torch.Tensor:
        start = time.perf_counter()
        enc = self.encode(batch)
        loss, n_tokens, parts = self.batch_loss(enc)
        self.log("train/loss", loss, prog_bar=True, batch_size=len(batch))
        for key, value in parts.items():
            self.log(f"train/{key}", value, batch_size=len(batch))
        self.log("train/solution_tokens", float(n_tokens), batch_size=len(batch))
        tokens_per_s = enc["attention_mask"].sum().item() / (time.perf_counter() - start)
        self.log("perf/tokens_per_s", tokens_per_s, batch_size=len(batch))
        return loss * _token_share(n_tokens)

    def batch_loss(self, enc: dict[str, torch.Tensor]) -> tuple[torch.Tensor, int, dict]:
        """(loss, solution tokens, parts to log) of one encoded batch: the solution tokens'
        cross-entropy, mixed with the KL to the teacher when there is one."""
        if self.teacher is None:
            loss, n_tokens = solution_loss(self.policy, enc, self.padding_free)
            return loss, n_tokens, {}
        d = self.distill
        return distill_loss(
            self.policy, self.teacher, enc, d.weight, d.temperature, self.padding_free
        )

    def encode(self, batch: list[dict]) -> dict[str, torch.Tensor]:
        """Tokenises a batch of ``{"question", "solution"}`` dicts onto the module's device."""
        questions = [row["question"] for row in batch]
        solutions = [row["solution"] for row in batch]
        chat = [self.prompt.is_chat(q) for q in questions]  # their targets end the chat turn
        enc = tokenize_pairs(
            self.tokenizer, self.prompts_for(questions), solutions, self.max_length, chat=chat
        )
        return {k: v.to(self.device) for k, v in enc.items()}

    # ---------------------------------------------------------- forgetting guard
    @override
    def on_train_start(self) -> None:
        self._guard, self.guard_report = None, {}
        if not self.guard.on:
            return
        check_guard_strategy(self.trainer.strategy, self.guard.mode)
        items = list(self.mastered) if self.mastered is not None else self._datamodule_mastered()
        if not items:
            rank_zero_warn(
                "SFTModule: forgetting_guard is on but the mastered set is empty (no `mastered` "
                "given and no solved problem in the datamodule); training without the guard"
            )
            return
        random.Random(0).shuffle(items)  # the same cycle on every rank and every run
        self._mastered_cycle, self._cursor, self._masked = items, 0, [0.0, 0]
        self._guard = ForgettingGuard(self.policy, self.guard.mode)
        if (saved := self._guard_resume) is not None:  # a resumed fit goes on where it was
            self._cursor, self._masked = saved["cursor"], list(saved["masked"])
            self.guard_report, self._guard.reference = dict(saved["report"]), saved["reference"]
            return
        self._report({"mastered_examples": float(len(items))})
        self._report({"mastered_loss_start": self.mastered_loss()})

    @override
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        if self._guard is None:
            return
        # the reference only when it outlives a step (the same on every rank: all-reduced)
        kept = self._guard.reference if self.guard.refresh_every > 1 else None
        checkpoint["forgetting_guard"] = {
            "cursor": self._cursor,
            "masked": list(self._masked),
            "report": dict(self.guard_report),
            "reference": kept,
        }

    @override
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        self._guard_resume = checkpoint.get("forgetting_guard")

    @override
    def on_before_optimizer_step(self, optimizer: Any) -> None:
        if self._guard is None:
            return
        if self._guard.reference is None or self.steps_done % self.guard.refresh_every == 0:
            rows = self._next_mastered()
            grads, _ = reference_gradient(
                guarded_parameters(self.policy), [rows] if rows else [], self._loss_sum
            )
            self._guard.set_reference(grads)
        frac = self._guard.mask_gradients()
        self._masked[0] += frac
        self._masked[1] += 1
        self.log("train/masked_frac", frac)

    @override
    def optimizer_step(self, *args: Any, **kwargs: Any) -> None:
        super().optimizer_step(*args, **kwargs)
        self.after_optimizer_step()

    def after_optimizer_step(self) -> None:
        """The frozen coordinates back to their pre-step values (a no-op without the guard)."""
        if self._guard is not None:
            self._guard.restore()

    @property
    def steps_done(self) -> int:
        """Optimiser steps of the running fit: the Trainer's ``global_step``, or the count of the
        in-fit loop (:mod:`coscale.callbacks.sft_in_fit`) that runs this module on Fabric."""
        return self._trainer.global_step if self._trainer is not None else self.loop_steps

    @override
    def on_train_end(self) -> None:
        if self._guard is None:
            return
        self._report({"mastered_loss_end": self.mastered_loss()})
        if self._masked[1]:
            self._report({"masked_frac_mean": self._masked[0] / self._masked[1]})

    def mastered_loss(self, items: list[dict] | None = None) -> float:
        """Token-mean loss on ``items`` (default: the mastered set of the running fit).

        Under DDP each rank scores its share and the sums are all-reduced.
        """
        source = self._mastered_cycle if items is None else items
        if not source:
            raise ValueError("mastered_loss: items is empty and this fit has no mastered set")
        rank, world = rank_world()
        mine = list(source)[rank::world]
        size = self.guard.batch_size
        batches = [mine[i : i + size] for i in range(0, len(mine), size)]
        return mean_loss(batches, self._loss_sum, self.device)

    def _loss_sum(self, rows: list[dict]) -> tuple[torch.Tensor, int]:
        loss, n_tokens = solution_loss(self.policy, self.encode(rows), self.padding_free)
        return loss * n_tokens, n_tokens

    def _next_mastered(self) -> list[dict]:
        """This rank's share of the next ``guard_batch_size`` pairs of the mastered cycle."""
        cycle, n = self._mastered_cycle, min(self.guard.batch_size, len(self._mastered_cycle))
        rows = [cycle[(self._cursor + i) % len(cycle)] for i in range(n)]
        self._cursor = (self._cursor + n) % len(cycle)
        rank, world = rank_world()
        return rows[rank::world]

    def _datamodule_mastered(self) -> list[dict]:
        """Solved problems of the fit's curriculum (none without one)."""
        curriculum = curriculum_of(self)
        return curriculum.mastered() if curriculum is not None else []

    def _report(self, values: dict[str, float]) -> None:
        """Keeps ``values`` in :attr:`guard_report` and logs them as ``train/<key>``."""
        self.guard_report |= values
        log_to_loggers(self.trainer, {f"train/{k}": v for k, v in values.items()}, self.global_step)


def check_guard_strategy(strategy: Any, guard: str) -> None:
    """The guard needs whole, unsharded parameters and gradients: single device or DDP (a
    Lightning or a Fabric strategy)."""
    name = type(strategy).__name__
    if any(sharded in name for sharded in ("FSDP", "DeepSpeed", "ModelParallel")):
        raise ValueError(
            f"SFTModule: forgetting_guard={guard!r} works on one device or with DDP, not with "
            f"{name} (sharded parameters); set forgetting_guard.mode: none or strategy: ddp"
        )


GROUPS = {
    "load": PolicyLoadSettings,
    "optimizer": AdamWSettings,
    "validation": ValidationSettings,
    "forgetting_guard": GuardSettings,
    "distill": DistillationSettings,
}
"""The settings groups of :class:`SFTModule`, by argument name."""


def settings_errors(**args: Any) -> list[str]:
    """Every out-of-range setting among ``args`` (groups as objects or mappings, the verifier),
    named; the pipeline checks ``pipeline.sft`` with it before any work."""
    errors = reward_errors(None, None, args.get("verifier"))
    errors += at_least(2, max_length=args["max_length"]) if "max_length" in args else []
    groups = {k: as_group(GROUPS[k], v) for k, v in args.items() if k in GROUPS}
    chosen = [args.get(k) for k in ("optimizer", "custom_optimizer", "lr_scheduler")]
    return errors + group_errors(**groups) + choice_errors(*chosen, DEFAULT_OPTIMIZER)


def _token_share(n_tokens: int) -> float:
    """This rank's solution tokens over the ranks' mean: a rank's token-mean loss times it has
    the gradient that DDP's average over ranks (FSDP2's reduce-scatter likewise) turns into the
    gradient of the global batch's token mean. 1.0 in one process. Every rank calls it (a
    collective)."""
    world = rank_world()[1]
    if world == 1:
        return 1.0
    return n_tokens * world / max(sum_over_ranks(float(n_tokens)), 1.0)
