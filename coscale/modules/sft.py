"""SFTModule: supervised fine-tuning of a causal LM on (prompt, solution) pairs.

The loss is the token mean over the solution tokens only (the prompt is context, not target).
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

import os
import random
import time
from typing import Any, Literal

import lightning as L
import torch
from lightning.pytorch.utilities import rank_zero_warn
from typing_extensions import override

from coscale.models.prompting import PromptFormat, as_prompt_format, prompt_fields
from coscale.modules.distributed import rank_world
from coscale.modules.feed import curriculum_of
from coscale.modules.generation import PolicyMixin
from coscale.modules.optim import adamw_with_warmup
from coscale.rollout.base import SamplingParams
from coscale.sft.batch import solution_loss, tokenize_pairs
from coscale.sft.distill import Teacher, distill_errors, distill_loss
from coscale.sft.forgetting import (
    ForgettingGuard,
    guarded_parameters,
    mean_loss,
    reference_gradient,
)


class SFTModule(PolicyMixin, L.LightningModule):
    """Causal-LM fine-tuning with the loss on solution tokens.

    On a :class:`~coscale.datamodules.ProblemDataModule` it is served (question, solution) pairs
    (``data_kind = "sft"``); any loader of such dicts works too.

    Args:
        model: HF hub name or local folder of a causal LM (or a built model, in Python).
        tokenizer: Tokenizer name or folder; defaults to the model's.
        prompt: How a question becomes the prompt.
        lr: AdamW learning rate.
        betas: AdamW betas.
        weight_decay: AdamW weight decay.
        warmup_steps: Linear warm-up steps of the learning rate.
        max_length: Longest (prompt + solution) in tokens; longer pairs are cut.
        dtype: Weights' dtype name (``float32``, ``bfloat16``, ``float16``).
        gradient_checkpointing: Recompute activations in the backward pass to save memory.
        padding_free: Run each batch with its rows end to end and attention kept per row
            (:mod:`coscale.sft.packing`), so no FLOPs go to padding; same loss up to float rounding.
            Applies where :func:`coscale.sft.packing.can_pack` holds (SDPA, no window shorter than
            a row, no activation checkpointing); any other model takes the padded path
            (``bench_sft.py`` measures both).
        trust_remote_code: Allow custom model code shipped with the model (off unless asked).
        reward: Verifier used by validation (``class_path`` in YAML); default MathReward.
        val_samples: Samples per held-out problem in validation (pass@k up to this k).
        val_temperature: Sampling temperature in validation.
        val_max_new_tokens: Token limit of a validation sample.
        forgetting_guard: ``none`` (off), or freeze the coordinates whose gradient opposes the
            mastered set's per ``parameter`` or per ``neuron`` (output row); see
            :mod:`coscale.sft.forgetting`. Logs ``train/masked_frac`` and the mastered-set loss
            (``train/mastered_loss_start`` / ``_end``; also in :attr:`guard_report`).
        guard_refresh_every: Optimiser steps between recomputations of the mastered gradient.
        guard_batch_size: Mastered pairs per recomputation, all ranks together (the set is
            cycled through in a fixed shuffled order); also the batch of the loss measurement.
        mastered: The mastered set as ``{"question", "solution"}`` dicts. Default: the
            ``solved`` problems of the trainer's ProblemDataModule with their latest correct
            rollout (else first bank solution). Not saved in the hyper-parameters.
        teacher: A model (folder or hub name, same tokenizer) to distil from: the loss then
            mixes the solution tokens' cross-entropy with KL(teacher || model) on the same
            tokens (:mod:`coscale.sft.distill`). None: plain SFT. The pipeline sets it to the
            latest RL model in the SFT stages from the initial model that follow RL when
            ``pipeline.distill_weight`` > 0. Logs ``train/ce`` and ``train/kl``.
        distill_weight: Weight of the KL term (the cross-entropy gets 1 - it); used with a
            teacher only.
        distill_temperature: Temperature both distributions are softened with in the KL term.
    """

    data_kind = "sft"

    def __init__(
        self,
        model: str | Any,
        tokenizer: str | None = None,
        prompt: PromptFormat | str = PromptFormat(),
        lr: float = 1e-5,
        betas: tuple[float, float] = (0.9, 0.999),
        weight_decay: float = 0.0,
        warmup_steps: int = 0,
        max_length: int = 1024,
        dtype: str = "float32",
        gradient_checkpointing: bool = False,
        padding_free: bool = True,
        trust_remote_code: bool = False,
        reward: Any = None,
        val_samples: int = 8,
        val_temperature: float = 1.0,
        val_max_new_tokens: int = 256,
        forgetting_guard: Literal["none", "parameter", "neuron"] = "none",
        guard_refresh_every: int = 1,
        guard_batch_size: int = 16,
        mastered: list[dict[str, str]] | None = None,
        teacher: str | None = None,
        distill_weight: float = 0.5,
        distill_temperature: float = 1.0,
    ) -> None:
        super().__init__()
        guard = (forgetting_guard, guard_refresh_every, guard_batch_size)
        distill = (distill_weight, distill_temperature)
        errors = settings_errors(lr, max_length, val_samples, *guard, *distill)
        if errors:
            raise ValueError("SFTModule: " + "; ".join(errors))
        in_memory = not isinstance(model, (str, os.PathLike))
        prompt = prompt_fields(prompt)  # hparams: a plain dict (loggers refuse a frozen dataclass)
        self.save_hyperparameters(ignore=["model"] * in_memory + ["reward", "mastered"])
        prompt = as_prompt_format(prompt)
        self.prompt, self.lr, self.betas = prompt, lr, betas
        self.weight_decay, self.warmup_steps, self.max_length = (
            weight_decay,
            warmup_steps,
            max_length,
        )
        self.reward = reward if reward is not None else _default_reward()
        self.padding_free = padding_free
        self.val_samples = val_samples
        self.val_sampling = SamplingParams(
            max_new_tokens=val_max_new_tokens, temperature=val_temperature
        )
        self.forgetting_guard, self.mastered = forgetting_guard, mastered
        self.guard_refresh_every, self.guard_batch_size = guard_refresh_every, guard_batch_size
        self.guard_report: dict[str, float] = {}  # mastered-set figures of the last fit
        self._guard: ForgettingGuard | None = None
        self._guard_resume: dict[str, Any] | None = None  # the guard's place, from a checkpoint
        self._mastered_cycle: list[dict] = []
        self.loop_steps = 0  # optimiser steps when a loop other than the Trainer's runs the fit
        self._init_policy(model, tokenizer, dtype, trust_remote_code, gradient_checkpointing)
        self.distill_weight, self.distill_temperature = distill_weight, distill_temperature
        # not a submodule: no optimiser state, not in checkpoints, not wrapped or sharded
        self.teacher = Teacher(teacher, dtype, trust_remote_code) if teacher is not None else None

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
        self.log(
            "perf/tokens_per_s",
            enc["attention_mask"].sum().item() / (time.perf_counter() - start),
            batch_size=len(batch),
        )
        return loss

    def batch_loss(self, enc: dict[str, torch.Tensor]) -> tuple[torch.Tensor, int, dict]:
        """(loss, solution tokens, parts to log) of one encoded batch: the solution tokens'
        cross-entropy, mixed with the KL to the teacher when there is one."""
        if self.teacher is None:
            loss, n_tokens = solution_loss(self.policy, enc, self.padding_free)
            return loss, n_tokens, {}
        return distill_loss(
            self.policy,
            self.teacher,
            enc,
            self.distill_weight,
            self.distill_temperature,
            self.padding_free,
        )

    def encode(self, batch: list[dict]) -> dict[str, torch.Tensor]:
        """Tokenises a batch of ``{"question", "solution"}`` dicts onto the module's device."""
        prompts = self.prompts_for([row["question"] for row in batch])
        enc = tokenize_pairs(
            self.tokenizer, prompts, [row["solution"] for row in batch], self.max_length
        )
        return {k: v.to(self.device) for k, v in enc.items()}

    @override
    def configure_optimizers(self) -> Any:
        return adamw_with_warmup(
            self.policy, self.lr, self.betas, self.weight_decay, self.warmup_steps
        )

    # ---------------------------------------------------------- forgetting guard
    @override
    def on_train_start(self) -> None:
        self._guard, self.guard_report = None, {}
        if self.forgetting_guard == "none":
            return
        check_guard_strategy(self.trainer.strategy, self.forgetting_guard)
        items = list(self.mastered) if self.mastered is not None else self._datamodule_mastered()
        if not items:
            rank_zero_warn(
                "SFTModule: forgetting_guard is on but the mastered set is empty (no `mastered` "
                "given and no solved problem in the datamodule); training without the guard"
            )
            return
        random.Random(0).shuffle(items)  # the same cycle on every rank and every run
        self._mastered_cycle, self._cursor, self._masked = items, 0, [0.0, 0]
        self._guard = ForgettingGuard(self.policy, self.forgetting_guard)
        if (saved := self._guard_resume) is not None:  # a resumed fit goes on where it was
            self._cursor, self._masked = saved["cursor"], list(saved["masked"])
            self.guard_report, self._guard.reference = dict(saved["report"]), saved["reference"]
            return
        self._report({"mastered_examples": float(len(items))})
        self._report({"mastered_loss_start": self.mastered_loss()})

    @override
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self._guard is None:
            return
        # the reference only when it outlives a step (the same on every rank: all-reduced)
        kept = self._guard.reference if self.guard_refresh_every > 1 else None
        checkpoint["forgetting_guard"] = {
            "cursor": self._cursor,
            "masked": list(self._masked),
            "report": dict(self.guard_report),
            "reference": kept,
        }

    @override
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._guard_resume = checkpoint.get("forgetting_guard")

    @override
    def on_before_optimizer_step(self, optimizer: Any) -> None:
        if self._guard is None:
            return
        if self._guard.reference is None or self.steps_done % self.guard_refresh_every == 0:
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
        size = self.guard_batch_size
        batches = [mine[i : i + size] for i in range(0, len(mine), size)]
        return mean_loss(batches, self._loss_sum, self.device)

    def _loss_sum(self, rows: list[dict]) -> tuple[torch.Tensor, int]:
        loss, n_tokens = solution_loss(self.policy, self.encode(rows), self.padding_free)
        return loss * n_tokens, n_tokens

    def _next_mastered(self) -> list[dict]:
        """This rank's share of the next ``guard_batch_size`` pairs of the mastered cycle."""
        cycle, n = self._mastered_cycle, min(self.guard_batch_size, len(self._mastered_cycle))
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
        if self.trainer.is_global_zero:
            for logger in self.trainer.loggers:
                logger.log_metrics({f"train/{k}": v for k, v in values.items()}, self.global_step)


def check_guard_strategy(strategy: Any, guard: str) -> None:
    """The guard needs whole, unsharded parameters and gradients: single device or DDP (a
    Lightning or a Fabric strategy)."""
    name = type(strategy).__name__
    if any(sharded in name for sharded in ("FSDP", "DeepSpeed", "ModelParallel")):
        raise ValueError(
            f"SFTModule: forgetting_guard={guard!r} works on one device or with DDP, not with "
            f"{name} (sharded parameters); set forgetting_guard: none or strategy: ddp"
        )


def settings_errors(
    lr=1e-5,
    max_length=1024,
    val_samples=8,
    forgetting_guard="none",
    guard_refresh_every=1,
    guard_batch_size=16,
    distill_weight=0.5,
    distill_temperature=1.0,
    **_: Any,
) -> list[str]:
    """Every out-of-range setting, named (checked by the pipeline before any work, too)."""
    errors = []
    if lr <= 0 or max_length < 2 or val_samples < 1:
        errors.append(
            f"lr must be > 0 (got {lr}), max_length >= 2 (got {max_length}), "
            f"val_samples >= 1 (got {val_samples})"
        )
    errors += distill_errors(distill_weight, distill_temperature)
    return errors + _guard_errors(forgetting_guard, guard_refresh_every, guard_batch_size)


def _guard_errors(guard: Any, refresh_every: Any, batch_size: Any) -> list[str]:
    """Messages for bad forgetting-guard settings (empty when they are fine)."""
    errors = []
    if guard not in ("none", "parameter", "neuron"):
        errors.append(f"forgetting_guard must be one of none, parameter, neuron; got {guard!r}")
    for name, value in (("guard_refresh_every", refresh_every), ("guard_batch_size", batch_size)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            errors.append(f"{name} must be an int >= 1, got {value!r}")
    return errors


def _default_reward() -> Any:
    from coscale.scoring.rewards import MathReward

    return MathReward()
