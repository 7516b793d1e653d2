"""GRPOModule: one RL step of CoScale-RL, with each problem's own Rollout N.

A step: the batch's problems -> rollouts (problem b gets N_b of them) -> rewards -> group
advantages (groups of different sizes in one batch) -> outcomes into the pools' tally and the
replay buffer -> an explicit inner update loop over micro-batches. Groups whose rewards are all
equal carry no signal: they are dropped from the update and counted; a batch without any signal
is skipped (no optimiser step), never a crash.

Manual optimisation: Lightning never calls ``optimizer_step`` here, so ``num_iterations`` and the
micro-batches are a plain loop in :meth:`update`.
"""

from __future__ import annotations

import copy
import os
import time
from typing import Any

import lightning as L
import torch
from typing_extensions import override

from coscale.models.prompting import PromptFormat, as_prompt_format, prompt_fields
from coscale.modules.distributed import all_gather_objects, global_max, global_sum
from coscale.modules.feed import curriculum_of, epoch_finished
from coscale.modules.generation import PolicyMixin
from coscale.modules.optim import adamw_with_warmup
from coscale.modules.settings import AdamW, PolicyLoad
from coscale.rl.advantages import group_advantages
from coscale.rl.logprobs import sequence_logprobs
from coscale.rl.losses import GRPOLoss, PolicyLoss
from coscale.rl.micro_batches import merge_stats, micro_batches
from coscale.rollout.base import Rollouts, SamplingParams
from coscale.rollout.cached import CachedDecodeBackend
from coscale.rollout.factory import close_backend
from coscale.rollout.lockstep import in_lockstep


class GRPOModule(PolicyMixin, L.LightningModule):
    """Group-relative policy optimisation with per-problem Rollout N.

    On a :class:`~coscale.datamodules.ProblemDataModule` it is served the solvable problems,
    each with its N (``data_kind = "rl"``), reports every rollout to the curriculum and closes
    each epoch there (tally -> pools, N schedule) in the step that trains its last batch.

    Args:
        model: HF hub name or local folder of the policy (or a built model, in Python).
        tokenizer: Tokenizer name or folder; defaults to the model's.
        prompt: How a question becomes the prompt.
        reward: ``f(completions, answers) -> list[float]`` (``class_path`` in YAML); MathReward.
        loss: Policy loss object: GRPOLoss, DrGRPOLoss or DAPOLoss (``class_path`` in YAML).
        scale_rewards: Advantage scaling: ``group`` (std of the group), ``batch`` or ``none``.
        lr: AdamW learning rate.
        betas: AdamW betas (the authors' verl runs used beta1 = 0.5).
        weight_decay: AdamW weight decay.
        warmup_steps: Linear warm-up steps.
        max_grad_norm: Gradient clipping norm (0 disables).
        num_iterations: Optimiser steps on each batch of rollouts.
        micro_batch_size: Rollouts per forward/backward pass in the update.
        max_new_tokens: Token limit of one rollout.
        temperature: Sampling temperature of rollouts.
        top_p: Nucleus sampling of rollouts.
        mask_truncated: Exclude rollouts cut by ``max_new_tokens`` from the loss.
        dtype: Weights' dtype name.
        gradient_checkpointing: Recompute activations in the backward pass.
        trust_remote_code: Allow custom model code shipped with the model.
        seed: Base seed of rollout sampling (each step samples with ``seed + step``).
        val_samples: Samples per held-out problem in validation.
        val_temperature: Sampling temperature in validation.
        log_completions_every: Log a table of sampled completions every this many steps (0: never).
        fast_rollouts: Sample with :class:`~coscale.rollout.CachedDecodeBackend` (shared prompt
            prefill, finished rows dropped, preallocated KV cache) instead of HF ``generate``:
            same distribution and log-probs, faster. Assigning ``module.backend`` overrides it.
        compile_rollouts: With ``fast_rollouts``, run each decode step as one ``torch.compile``d
            forward over a static KV cache (full-attention models only; finished rows stay in
            the batch). Same tokens and log-probs; the first steps compile (seconds to a
            minute), then small models decode ~1.2x faster on CPU (``bench_rollout.py --compile``).
        sort_micro_batches: Group rollouts of similar length into the update's micro-batches and
            skip each one's padding columns; same loss and gradient up to float rounding.
        share_prompt_in_update: In each micro-batch, run every distinct prompt through the
            policy once and feed its KV cache to its rollouts' completions (gradients flow back
            through it); same loss and gradient up to float rounding, fewer FLOPs.
        rollout_backend: ``hf`` (in-process, the default) or ``vllm`` (a colocated engine that
            gets the policy's weights after every optimiser step; needs ``coscale[vllm]``).
        rollout_options: Arguments of the chosen backend (e.g. ``gpu_memory_utilization``).
    """

    data_kind = "rl"

    def __init__(
        self,
        model: str | Any,
        tokenizer: str | None = None,
        prompt: PromptFormat | str = PromptFormat(),
        reward: Any = None,
        loss: PolicyLoss | None = None,
        scale_rewards: str = "group",
        lr: float = 1e-6,
        betas: tuple[float, float] = (0.9, 0.999),
        weight_decay: float = 0.0,
        warmup_steps: int = 0,
        max_grad_norm: float = 1.0,
        num_iterations: int = 1,
        micro_batch_size: int = 32,
        max_new_tokens: int = 256,
        temperature: float = 0.7,
        top_p: float = 1.0,
        mask_truncated: bool = False,
        dtype: str = "float32",
        gradient_checkpointing: bool = False,
        trust_remote_code: bool = False,
        seed: int = 0,
        val_samples: int = 8,
        val_temperature: float = 1.0,
        log_completions_every: int = 0,
        fast_rollouts: bool = True,
        compile_rollouts: bool = False,
        sort_micro_batches: bool = True,
        share_prompt_in_update: bool = True,
        rollout_backend: str = "hf",
        rollout_options: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        _check(scale_rewards, lr, num_iterations, micro_batch_size, temperature, val_samples)
        prompt = prompt_fields(prompt)  # hparams: a plain dict (loggers refuse a frozen dataclass)
        self.save_hyperparameters(
            ignore=["model", "reward", "loss"]
            if not isinstance(model, (str, os.PathLike))
            else ["reward", "loss"]
        )
        self.automatic_optimization = False
        prompt = as_prompt_format(prompt)
        self.prompt, self.scale_rewards = prompt, scale_rewards
        self.reward = reward if reward is not None else _default_reward()
        self.loss_fn = loss if loss is not None else GRPOLoss()
        self.lr, self.betas, self.weight_decay, self.warmup_steps = (
            lr,
            betas,
            weight_decay,
            warmup_steps,
        )
        self.max_grad_norm, self.num_iterations, self.micro_batch_size = (
            max_grad_norm,
            num_iterations,
            micro_batch_size,
        )
        self.sampling = SamplingParams(
            max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p
        )
        self.mask_truncated, self.seed = mask_truncated, seed
        self.val_samples = val_samples
        self.val_sampling = SamplingParams(
            max_new_tokens=max_new_tokens, temperature=val_temperature
        )
        self.log_completions_every = log_completions_every
        self.rollout_backend = rollout_backend
        self.rollout_options = dict(rollout_options or {})
        self.load = PolicyLoad(dtype, gradient_checkpointing, trust_remote_code)
        self._init_policy(model, tokenizer, self.load)
        self.sort_micro_batches = sort_micro_batches
        self.share_prompt_in_update = share_prompt_in_update
        if fast_rollouts and rollout_backend == "hf":
            self.backend = CachedDecodeBackend(
                self.policy, self.tokenizer, compile=compile_rollouts
            )
        self.ref_policy = _frozen_copy(self.policy) if self.loss_fn.beta > 0 else None

    @override
    def training_step(self, batch: list[dict], batch_idx: int) -> None:
        start = time.perf_counter()
        if getattr(self.backend, "needs_sync", False):  # e.g. a vLLM engine woken from sleep
            self.backend.update_weights(self.policy)
        sampling = SamplingParams(**{**self.sampling.__dict__, "seed": self._step_seed()})
        rollouts, rewards = self.sample(batch, [p["n"] for p in batch], sampling)  # R rollouts
        rollouts = rollouts.to(self.device)
        adv = group_advantages(rewards, rollouts.prompt_index.cpu(), self.scale_rewards)
        self.record_outcomes(batch, rollouts, rewards)
        keep = ~adv.zero_std[rollouts.prompt_index.cpu()]  # [R] rows of groups with signal
        if self.mask_truncated:
            keep &= torch.tensor([r != "length" for r in rollouts.finish_reasons])
        gen_s = time.perf_counter() - start
        stats = self.update(rollouts, adv.advantages.to(self.device), keep.to(self.device))
        self.log_step(batch, rollouts, rewards, adv, stats, gen_s, time.perf_counter() - start)
        self.close_epoch_if_done()

    def update(
        self, rollouts: Rollouts, advantages: torch.Tensor, keep: torch.Tensor
    ) -> dict[str, float]:
        """``num_iterations`` optimiser steps over the kept rollouts, in micro-batches.

        The rollouts' own log-probs are the old log-probs of the ratio (the backend shares the
        policy, so they are the sampling policy's): no second forward pass before the update.
        """
        rows = keep.nonzero().squeeze(1)  # [K] indices of rollouts with signal
        if global_sum(len(rows)) == 0:
            return {"skipped": 1.0}
        mask = rollouts.completion_mask.float()  # [R, T]
        # Normalisers are totals over all ranks, so the loss is that of the whole global batch.
        n_seq = int(global_sum(len(rows)))
        n_tok = int(global_sum(float(mask[rows].sum())))
        ref = self._ref_logprobs(rollouts, rows)
        chunks = micro_batches(
            rows, rollouts.lengths, self.micro_batch_size, self.sort_micro_batches
        )
        n_chunks = global_max(len(chunks))  # every rank runs as many backward passes
        opt = self.optimizers()
        stats: dict[str, float] = {}
        for _ in range(self.num_iterations):
            opt.zero_grad()
            parts = []
            for i in range(n_chunks):
                idx = chunks[i] if i < len(chunks) else rows[:0]
                parts.append(self._micro_step(rollouts, advantages, mask, ref, idx, n_seq, n_tok))
            stats = merge_stats(parts)
            stats["grad_norm"] = self._clip()
            opt.step()
            if (sched := self.lr_schedulers()) is not None:
                sched.step()
        self.backend.update_weights(self.policy)  # an engine with its own copy (vLLM) follows
        return stats

    def _micro_step(self, ro: Rollouts, adv, mask, ref, idx, n_seq, n_tok) -> tuple[dict, float]:
        """Forward + backward of one micro-batch -> (its stats, its masked-token count)."""
        tokens = float(mask[idx].sum())
        if len(idx) == 0:  # padding pass so DDP sees the same number of backward calls
            idx = torch.zeros(1, dtype=torch.long, device=adv.device)
            adv, tokens = torch.zeros_like(adv), 0.0
        logp = sequence_logprobs(
            self.policy,
            ro.input_ids[idx],
            ro.attention_mask[idx],
            ro.prompt_length,
            self.sampling.temperature,
            trim_padding=self.sort_micro_batches,
            prompt_index=ro.prompt_index[idx] if self._share_prompt() else None,
        )  # [m, T]
        out = self.loss_fn(
            logp,
            ro.logprobs[idx],
            adv[idx],
            mask[idx],
            None if ref is None else ref[idx],
            num_sequences=n_seq,
            num_tokens=n_tok,
        )
        world = self.trainer.world_size if self._trainer is not None else 1
        self.manual_backward(out.loss * world)  # DDP averages gradients over ranks; undo it
        return {"loss": float(out.loss.detach()), **out.metrics}, tokens

    def _share_prompt(self) -> bool:
        """Whether the update runs each prompt once. Not for a sharded policy on several ranks:
        whether a micro-batch shares a prompt decides between one and two forward passes, and
        under FSDP2 every rank must run as many (each one is a collective)."""
        return self.share_prompt_in_update and not in_lockstep(self.policy)

    def _ref_logprobs(self, ro: Rollouts, rows: torch.Tensor) -> torch.Tensor | None:
        if self.ref_policy is None:
            return None
        with torch.no_grad():
            return sequence_logprobs(
                self.ref_policy,
                ro.input_ids,
                ro.attention_mask,
                ro.prompt_length,
                self.sampling.temperature,
            )  # [R, T]

    def _clip(self) -> float:
        params = [p for p in self.policy.parameters() if p.grad is not None]
        if not params:
            return 0.0
        norm = torch.nn.utils.clip_grad_norm_(params, self.max_grad_norm or float("inf"))
        return float(norm)

    def record_outcomes(self, batch: list[dict], rollouts: Rollouts, rewards: torch.Tensor) -> None:
        """Reports every rollout's (problem, text, correct) to the curriculum (its epoch tally
        and replay buffer), identically on every rank: outcomes are gathered first."""
        if (curriculum := curriculum_of(self)) is None:
            return
        index = rollouts.prompt_index.tolist()
        mine = [
            (batch[i]["id"], text, bool(r >= 1.0))
            for i, text, r in zip(index, rollouts.texts, rewards.tolist())
        ]
        curriculum.record_rollouts(all_gather_objects(mine), self.global_step)

    def _step_seed(self) -> int:
        rank = self.global_rank if self._trainer is not None else 0
        return self.seed * 1_000_003 + self.global_step * 1_009 + rank

    def log_step(self, batch, rollouts, rewards, adv, stats, gen_s, step_s) -> None:
        n = len(batch)
        self.log("train/reward", rewards.mean(), prog_bar=True, batch_size=n)
        self.log("train/frac_zero_std", adv.zero_std_fraction, batch_size=n)
        self.log("train/skipped", stats.pop("skipped", 0.0), batch_size=n)
        self.log("train/completion_len", rollouts.lengths.float().mean(), batch_size=n)
        self.log(
            "train/truncated",
            sum(r == "length" for r in rollouts.finish_reasons) / len(rewards),
            batch_size=n,
        )
        self.log("train/rollouts", float(len(rewards)), batch_size=n, reduce_fx="sum")
        for key, value in stats.items():
            self.log(f"train/{key}", value, batch_size=n)
        self.log("perf/step_s", step_s, batch_size=n)
        self.log("perf/generation_frac", gen_s / max(step_s, 1e-9), batch_size=n)
        if self.log_completions_every and self.global_step % self.log_completions_every == 0:
            from coscale.modules.tables import log_completions

            log_completions(self, batch, rollouts, rewards, adv.advantages)

    @override
    def on_train_start(self) -> None:
        self.backend.update_weights(self.policy)  # a resumed policy reaches the engine

    @override
    def teardown(self, stage: str) -> None:
        # a vLLM engine's GPU memory, after any fit / validate / test; rebuilt (and synced) on
        # the next use. Lightning skips this hook when the fit raises: rl_stage closes too.
        close_backend(self._backend)

    def close_epoch_if_done(self) -> None:
        """After the step that trains an epoch's last batch: closes that epoch in the curriculum
        (tally -> pools, the N schedule's step) and logs the pools and the schedule's decisions.

        This module is the one owner of the close, and it closes in that step rather than in
        ``on_train_epoch_end``: Lightning runs the callbacks' ``on_train_epoch_end`` before the
        module's, so an epoch-end close would come after a callback that measures the epoch
        (:class:`~coscale.callbacks.PassRateEvaluation`), and it saves step checkpoints between
        the last step and the epoch-end hooks, so a fit resumed from one would have to replay the
        close. In the step, the close comes before every epoch-end hook, and each checkpoint
        holds either the whole step with its close or neither: every epoch is closed exactly
        once, a resumed fit included. A fit stopped before the last batch (``max_steps``,
        ``should_stop``) leaves its epoch open.
        """
        if (curriculum := curriculum_of(self)) is None or not epoch_finished(self.trainer):
            return
        metrics = curriculum.close_epoch(lr=self.lr)
        metrics |= {f"pool/{k}": float(v) for k, v in curriculum.pools.counts().items()}
        # epoch-level: logged at the epoch's end whatever log_every_n_steps is
        self.log_dict(metrics, on_step=False, on_epoch=True, rank_zero_only=True, batch_size=1)

    @override
    def configure_optimizers(self) -> Any:
        settings = AdamW(self.lr, tuple(self.betas), self.weight_decay, self.warmup_steps)
        return adamw_with_warmup(self.policy, settings)


def _frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    # eval mode on purpose (no dropout in the KL reference); Lightning counts its modules in the
    # "Found N module(s) in eval mode at the start of training" warning when beta > 0
    ref = copy.deepcopy(model).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


def _check(scale_rewards, lr, num_iterations, micro_batch_size, temperature, val_samples) -> None:
    errors = settings_errors(
        scale_rewards, lr, num_iterations, micro_batch_size, temperature, val_samples
    )
    if errors:
        raise ValueError("GRPOModule: " + "; ".join(errors))


def settings_errors(
    scale_rewards="group",
    lr=1e-6,
    num_iterations=1,
    micro_batch_size=32,
    temperature=0.7,
    val_samples=8,
    **_: Any,
) -> list[str]:
    """Every out-of-range setting, named (checked by the pipeline before any work, too)."""
    errors = []
    if scale_rewards not in ("group", "batch", "none"):
        errors.append(f"scale_rewards must be one of group, batch, none; got {scale_rewards!r}")
    for name, value, ok in [
        ("lr", lr, lr > 0),
        ("num_iterations", num_iterations, num_iterations >= 1),
        ("micro_batch_size", micro_batch_size, micro_batch_size >= 1),
        ("temperature", temperature, temperature >= 0),
        ("val_samples", val_samples, val_samples >= 1),
    ]:
        if not ok:
            errors.append(f"{name} out of range: {value}")
    return errors


def _default_reward() -> Any:
    from coscale.scoring.rewards import MathReward

    return MathReward()
