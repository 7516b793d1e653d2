"""GRPOModule: one RL step of CoScale-RL, with each problem's own Rollout N.

A step: the batch's problems -> rollouts (problem b gets N_b of them) -> the reward (a weighted
sum of reward functions) and the verifier's verdict -> group advantages from the reward (groups
of different sizes in one batch) -> the verdicts into the pools' tally and the replay buffer ->
an explicit inner update loop over micro-batches. Groups whose rewards are all equal carry no
signal: they are dropped from the update and counted; a batch without any signal moves no
weight but counts its steps (:mod:`coscale.modules.empty_steps`), never a crash.

Manual optimisation: Lightning never calls ``optimizer_step`` here, so ``num_iterations`` and the
micro-batches are a plain loop in :meth:`update`.
"""

from __future__ import annotations

import time
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any

import lightning as L
import torch
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from typing_extensions import override

from coscale.checks import as_group, group_errors
from coscale.distributed import all_gather_objects, max_over_ranks, sum_over_ranks
from coscale.models.adapters import as_peft_config
from coscale.models.prompting import PromptSettings, as_prompt_format, prompt_fields
from coscale.modules.curriculum_table import log_module_curriculum
from coscale.modules.empty_steps import empty_steps
from coscale.modules.fit_data import curriculum_of, epoch_finished
from coscale.modules.grpo_settings import UpdateSettings
from coscale.modules.kl_reference import frozen_copy, reference_logprobs
from coscale.modules.optimizer_choice import choice_errors
from coscale.modules.policy_mixin import PolicyMixin, source_fields
from coscale.modules.prefetch import Prefetch, sample_ahead
from coscale.modules.settings import AdamWSettings, PolicyLoadSettings, ValidationSettings
from coscale.modules.step_log import log_step, reward_context
from coscale.rl.advantages import group_advantages
from coscale.rl.logprobs import sequence_logprobs
from coscale.rl.losses import GRPOLoss, PolicyLoss, as_loss
from coscale.rl.micro_batches import merge_stats, micro_batches
from coscale.rollout.base import Rollouts, SamplingParams
from coscale.rollout.factory import RolloutSettings
from coscale.rollout.lockstep import in_lockstep
from coscale.scoring.reward_set import RewardSet, RewardSpec, reward_errors
from coscale.seeds import derive_seed

if TYPE_CHECKING:  # an optional dependency (coscale[peft]); the CLI resolves the name
    from peft import PeftConfig


DEFAULT_OPTIMIZER = AdamWSettings(lr=1e-6)
"""The ``optimizer`` group's default."""


class GRPOModule(PolicyMixin, L.LightningModule):
    """Group-relative policy optimisation with per-problem Rollout N.

    On a :class:`~coscale.datamodules.ProblemDataModule` it is served the solvable problems,
    each with its N (``data_kind = "rl"``), reports every rollout to the curriculum and closes
    each epoch there (tally -> pools, N schedule) in the step that trains its last batch.

    Args:
        model: HF hub name or local folder of the policy (or a built model, in Python).
        tokenizer: Tokenizer name or folder; defaults to the model's.
        prompt: How a question becomes the prompt.
        reward: The shaped reward the advantages use: one function or a list, each coscale-style
            ``f(completions, answers, **columns)`` or TRL-style ``f(prompts, completions,
            completion_ids, **columns)``, sync or ``async def``, a score or None ("no opinion")
            per completion (``docs/rewards.md``; YAML: ``class_path`` or a dotted function path),
            or a reward model (``RewardModel``, or its folder or hub id in Python). TRL-style
            functions also get ``trainer_state``, ``log_extra`` and ``log_metric``.
            None: the verifier's score.
        reward_weights: One weight per reward function; the reward is the weighted sum of their
            scores, Nones left out (TRL's rule). None: all 1.0.
        verifier: Decides which rollouts are correct (score >= 1.0) for the pools, pass-rate
            measurement, the replay buffer and validation; never the advantages. None: the one
            reward function when exactly one is given, else the MathReward among the rewards,
            else ``MathReward()``.
        loss: Policy loss object (``class_path`` in YAML, and that mapping in Python too):
            GRPOLoss, DrGRPOLoss, DAPOLoss, GSPOLoss or CISPOLoss, with its KL, entropy bonus
            and engine/trainer mismatch correction (``docs/losses.md``). ``train/entropy`` is
            logged whatever it is.
        load: How the policy loads (dtype, gradient checkpointing, remote code).
        optimizer: AdamW and its learning-rate warm-up (the CoScale-RL authors' verl runs used
            beta1 = 0.5).
        custom_optimizer: Another optimiser class with its arguments (``class_path`` in YAML,
            a ``functools.partial`` in Python); replaces ``optimizer``
            (:mod:`coscale.modules.optimizer_choice`). None: coscale's AdamW.
        lr_scheduler: A scheduler class with its arguments, stepped every optimiser step;
            replaces ``optimizer.warmup_steps`` and ``decay``. None: theirs.
        sampling: Token limit, temperature, top-p, top-k, seed and stop strings of the
            rollouts.
        update: Optimiser steps per batch, micro-batch size, clipping, advantage scaling.
        validation: Samples and temperature of validation on held-out problems (the token
            limit and temperature default to ``sampling``'s).
        rollout: Where rollouts come from: ``cached`` (the default), ``hf``, ``vllm``,
            ``vllm-server`` or ``auto``, with the backend's options
            (:func:`coscale.rollout.factory.build_backend`). Assigning ``module.backend`` in
            Python replaces it.
        log_completions_every: Add sampled completions to the run's one completions table every
            this many steps (0: never; :mod:`coscale.modules.tables`).
        peft: Train a PEFT adapter on the frozen base instead of every weight (a
            ``peft.PeftConfig`` such as ``peft.LoraConfig``; :mod:`coscale.models.adapters`).
            The KL reference (``loss.beta`` > 0) is the base with the adapter off, not a copy;
            exports are merged, the adapter in ``<folder>/adapter``. Every backend samples it:
            ``cached`` and ``hf`` on the policy, ``vllm`` from merged weights or as a LoRA
            adapter (``sync.adapter``; ``vllm-server`` merged only). None: full fine-tune.

    The update groups rollouts of similar length into its micro-batches and runs each distinct
    prompt through the policy once per micro-batch (its KV cache feeds the prompt's
    completions); both give the loss and gradient of the plain update up to float rounding
    (``tests/test_speed_paths.py``), so they are not settings.
    """

    data_kind = "rl"

    def __init__(
        self,
        model: str | Any,
        tokenizer: str | None = None,
        prompt: PromptSettings | str = PromptSettings(),
        reward: RewardSpec | list[RewardSpec | str] | str | None = None,
        reward_weights: list[float] | None = None,
        verifier: RewardSpec | None = None,
        loss: PolicyLoss | None = None,
        load: PolicyLoadSettings = PolicyLoadSettings(),
        optimizer: AdamWSettings = DEFAULT_OPTIMIZER,
        custom_optimizer: OptimizerCallable | None = None,
        lr_scheduler: LRSchedulerCallable | None = None,
        sampling: SamplingParams = SamplingParams(),
        update: UpdateSettings = UpdateSettings(),
        validation: ValidationSettings = ValidationSettings(),
        rollout: RolloutSettings = RolloutSettings(),
        log_completions_every: int = 0,
        peft: PeftConfig | None = None,
    ) -> None:
        super().__init__()
        peft = as_peft_config(peft)
        given = dict(load=load, optimizer=optimizer, sampling=sampling, update=update)
        given |= dict(validation=validation, rollout=rollout)
        groups = {name: as_group(GROUPS[name], value) for name, value in given.items()}
        errors = settings_errors(
            reward=reward, reward_weights=reward_weights, verifier=verifier, **groups
        )
        errors += choice_errors(optimizer, custom_optimizer, lr_scheduler, DEFAULT_OPTIMIZER)
        if errors:
            raise ValueError("GRPOModule: " + "; ".join(errors))
        self._choose_optimizer(custom_optimizer, lr_scheduler)
        self.save_hyperparameters(
            {"prompt": prompt_fields(prompt), "tokenizer": tokenizer}
            | {k: asdict(v) for k, v in groups.items()}
            | {"log_completions_every": log_completions_every}
            | source_fields(model, peft)
            | self.optimizer_fields()
        )
        self.automatic_optimization = False
        self.prompt = as_prompt_format(prompt)
        self.rewards = RewardSet(reward, reward_weights, verifier)
        self.loss_fn = GRPOLoss() if loss is None else as_loss(loss)  # a mapping is built
        self.update_settings, self.rollout_settings = groups["update"], groups["rollout"]
        s = groups["sampling"]
        self.sampling = replace(s, seed=None)  # each step's seed comes from the base below
        self.seed, self.log_completions_every = s.seed or 0, log_completions_every
        self._init_policy(model, tokenizer, peft, groups, self.sampling)
        # same result, less work (tests/test_speed_paths.py compares them with the plain paths)
        self.sort_micro_batches = self.share_prompt_in_update = True
        kl = self.loss_fn.beta > 0  # its reference: a frozen copy, or the base under the adapter
        self.ref_policy = frozen_copy(self.policy) if kl and peft is None else None
        self.base_is_reference = kl and peft is not None
        self.prefetched = Prefetch()  # rollouts sampled ahead (update.max_staleness)

    @property
    def updates_per_batch(self) -> int:
        """Optimiser steps per batch: ``update.num_iterations`` (the LR decay's length)."""
        return self.update_settings.num_iterations

    @override
    def training_step(self, batch: list[dict], batch_idx: int) -> None:
        start = time.perf_counter()
        if getattr(self.backend, "needs_sync", False):  # e.g. a vLLM engine woken from sleep
            self.backend.update_weights(self.policy)
        sampling = replace(self.sampling, seed=self._step_seed())
        with self.rewards.using(reward_context(self, batch_idx)) as context:  # TRL's step kwargs
            if self.update_settings.max_staleness:
                rollouts, scores, stale = sample_ahead(self, batch)  # R rollouts
                self.log("train/staleness", float(stale), on_step=True, batch_size=len(batch))
            else:
                rollouts, scores = self.sample(batch, [p["n"] for p in batch], sampling)
        rollouts = rollouts.to(self.device)
        scale = self.update_settings.scale_rewards
        adv = group_advantages(scores.reward, rollouts.prompt_index.cpu(), scale)
        self.record_outcomes(batch, rollouts, scores.correct)
        trained = ~adv.zero_std[rollouts.prompt_index.cpu()]  # [R] rows of groups with signal
        trained &= scores.scorable  # no function had an opinion: no signal (TRL: advantage 0)
        if self.update_settings.mask_truncated:
            trained &= torch.tensor([r != "length" for r in rollouts.finish_reasons])
        gen_s = time.perf_counter() - start
        stats = self.update(rollouts, adv.advantages.to(self.device), trained.to(self.device))
        step_s = time.perf_counter() - start
        log_step(self, batch, rollouts, scores, adv, stats, gen_s, step_s, context.log)
        self.close_epoch_if_done()

    def update(
        self, rollouts: Rollouts, advantages: torch.Tensor, trained: torch.Tensor
    ) -> dict[str, float]:
        """``num_iterations`` optimiser steps over the ``trained`` [R] rollouts, in micro-batches.

        Old log-probs need no second forward pass. Sampled by the trainer's own model (the
        backend shares the policy), the rollouts' log-probs are the old ones. Sampled by an
        engine with its own weights (``rollouts.from_engine``: vLLM using its log-probs) and with
        the loss's ``mismatch.mode`` not ``none``, the old log-probs are the trainer's: each
        micro-batch's detached log-probs in the first iteration (no optimiser step has been
        taken yet, so they are the sampling policy's under the trainer's kernels), kept for the
        later iterations; the engine's log-probs only weight the loss (TIS / MIS). With mode
        ``none`` the engine's log-probs are the old ones, uncorrected.
        """
        rows = trained.nonzero().squeeze(1)  # [K] indices of rollouts with signal
        if sum_over_ranks(len(rows)) == 0:
            empty_steps(self, self.update_settings.num_iterations)  # counted, as in TRL
            return {"skipped": 1.0}
        mask = rollouts.completion_mask.float()  # [R, T]
        # Normalisers are totals over all ranks, so the loss is that of the whole global batch.
        totals = int(sum_over_ranks(len(rows))), int(sum_over_ranks(float(mask[rows].sum())))
        ref = self._ref_logprobs(rollouts, rows)
        correct = self._corrects_mismatch(rollouts)
        old_logprobs = torch.zeros_like(rollouts.logprobs) if correct else rollouts.logprobs
        chunks = micro_batches(
            rows, rollouts.lengths, self.update_settings.micro_batch_size, self.sort_micro_batches
        )
        n_chunks = max_over_ranks(len(chunks))  # every rank runs as many backward passes
        opt = self.optimizers()
        stats: dict[str, float] = {}
        for iteration in range(self.update_settings.num_iterations):
            opt.zero_grad()
            parts = []
            for i in range(n_chunks):
                idx = chunks[i] if i < len(chunks) else rows[:0]
                step = (rollouts, advantages, mask, ref, idx, totals)
                parts.append(self._micro_step(*step, old_logprobs, correct and iteration == 0))
            stats = merge_stats(parts)
            stats["grad_norm"] = self._clip()
            opt.step()
            if (sched := self.lr_schedulers()) is not None:
                sched.step()
        self.prefetched.wait()  # no request straddles the sync (coscale.modules.prefetch)
        self.backend.update_weights(self.policy)  # an engine with its own copy (vLLM) follows
        return stats

    def _micro_step(
        self, ro: Rollouts, adv, mask, ref, idx, totals, old_logprobs, record_old
    ) -> tuple[dict, float]:
        """Forward + backward of one micro-batch -> (its stats, its masked-token count).

        ``old_logprobs`` [R, T] holds the old log-probs; with ``record_old`` this pass's detached
        log-probs are the trainer's old ones and are stored there first (see :meth:`update`).
        """
        padding = len(idx) == 0  # a pass so DDP sees the same number of backward calls
        if padding:  # on row 0 with no token in the loss: no policy term, KL or entropy
            idx = torch.zeros(1, dtype=torch.long, device=adv.device)
        rows_mask = torch.zeros_like(mask[idx]) if padding else mask[idx]  # [m, T]
        logp, entropy = sequence_logprobs(
            self.policy,
            ro.input_ids[idx],
            ro.attention_mask[idx],
            ro.prompt_length,
            self.sampling.temperature,
            trim_padding=self.sort_micro_batches,
            prompt_index=ro.prompt_index[idx] if self._share_prompt() else None,
            entropy=True,  # from the same logits, for train/entropy and any entropy bonus
            entropy_grad=self.loss_fn.entropy_coef > 0,
        )  # [m, T] each
        if record_old and not padding:
            old_logprobs[idx] = logp.detach()  # [m, T]
        out = self.loss_fn(
            logp,
            old_logprobs[idx],
            adv[idx],
            rows_mask,
            None if ref is None else ref[idx],
            num_sequences=totals[0],
            num_tokens=totals[1],
            entropy=entropy,
            sampling_logprobs=ro.logprobs[idx] if self._corrects_mismatch(ro) else None,
        )
        world = self.trainer.world_size if self._trainer is not None else 1
        self.manual_backward(out.loss * world)  # DDP averages gradients over ranks; undo it
        return {"loss": float(out.loss.detach()), **out.metrics}, float(rows_mask.sum())

    def _corrects_mismatch(self, ro: Rollouts) -> bool:
        """Whether the update corrects the engine/trainer mismatch of these rollouts."""
        return ro.from_engine and self.loss_fn.mismatch.mode != "none"

    def _share_prompt(self) -> bool:
        """Whether the update runs each prompt once. Not for a sharded policy on several ranks:
        whether a micro-batch shares a prompt decides between one and two forward passes, and
        under FSDP2 every rank must run as many (each one is a collective)."""
        return self.share_prompt_in_update and not in_lockstep(self.policy)

    def _ref_logprobs(self, ro: Rollouts, rows: torch.Tensor) -> torch.Tensor | None:
        """[R, T] log-probs under the KL reference, or None without one."""
        if self.ref_policy is None and not self.base_is_reference:
            return None
        model = self.ref_policy if self.ref_policy is not None else self.policy
        return reference_logprobs(model, ro, self.sampling.temperature, self.base_is_reference)

    def _clip(self) -> float:
        params = [p for p in self.policy.parameters() if p.grad is not None]  # none: norm 0.0
        limit = self.update_settings.max_grad_norm or float("inf")
        return float(torch.nn.utils.clip_grad_norm_(params, limit))

    def record_outcomes(self, batch: list[dict], rollouts: Rollouts, correct: torch.Tensor) -> None:
        """Reports every rollout's (problem, text, correct by the verifier) to the curriculum
        (its epoch tally and replay buffer), identically on every rank: outcomes are gathered
        first."""
        if (curriculum := curriculum_of(self)) is None:
            return
        index = rollouts.prompt_index.tolist()
        mine = [
            (batch[i]["id"], text, bool(ok))
            for i, text, ok in zip(index, rollouts.texts, correct.tolist())
        ]
        curriculum.record_rollouts(all_gather_objects(mine), self.global_step)

    def _step_seed(self) -> int:
        rank = self.global_rank if self._trainer is not None else 0
        return derive_seed("step", self.seed, self.global_step, rank)

    @override
    def on_train_start(self) -> None:
        self.backend.update_weights(self.policy)  # a resumed policy reaches the engine
        if len(self.prefetched):  # restored from the checkpoint: as old as they were then
            self.prefetched.rebase(self.backend.book.version)

    @override
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        if self.update_settings.max_staleness and hasattr(self.backend, "book"):
            # every rank's, in rank order (rank 0 writes the checkpoint)
            mine = self.prefetched.state_dict(self.backend.book.version)
            checkpoint["prefetched"] = all_gather_objects([mine])

    @override
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        ranks = checkpoint.get("prefetched") or []
        world = self.trainer.world_size if self._trainer is not None else 1
        if len(ranks) == world:  # saved by as many ranks (else those batches are re-requested)
            self.prefetched.load_state_dict(ranks[self.global_rank])

    @override
    def teardown(self, stage: str) -> None:
        # the vLLM engine this module built (its GPU memory), after any fit / validate / test;
        # rebuilt (and synced) on the next use. A lent engine (the run's) stays up.
        self.prefetched.clear()  # requests sampled ahead of a stopped fit are not kept
        self.close_own_backend()

    def close_epoch_if_done(self) -> None:
        """After the step that trains an epoch's last batch: closes that epoch in the curriculum
        (tally -> pools, the N schedule's step) and logs the pools, the replay buffer's counts and the
        schedule's decisions.

        This module is the one owner of the close, and it closes in that step rather than in
        ``on_train_epoch_end``: Lightning runs the callbacks' ``on_train_epoch_end`` before the
        module's, so an epoch-end close would come after a callback that measures the epoch
        (:class:`~coscale.callbacks.PassRateMeasurement`), and it saves step checkpoints between
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
        metrics |= {f"replay/{k}": float(v) for k, v in curriculum.bank.replay_stats().items()}
        # epoch-level: logged at the epoch's end whatever log_every_n_steps is
        self.log_dict(metrics, on_step=False, on_epoch=True, rank_zero_only=True, batch_size=1)
        log_module_curriculum(self, curriculum)  # the pools-over-time table


def settings_errors(**args: Any) -> list[str]:
    """Every out-of-range setting among ``args`` (groups as objects or mappings; the rewards and
    the verifier), named; the pipeline checks ``pipeline.grpo`` with it before any work."""
    errors = reward_errors(args.get("reward"), args.get("reward_weights"), args.get("verifier"))
    groups = {k: as_group(GROUPS[k], v) for k, v in args.items() if k in GROUPS}
    chosen = [args.get(k) for k in ("optimizer", "custom_optimizer", "lr_scheduler")]
    return errors + group_errors(**groups) + choice_errors(*chosen, DEFAULT_OPTIMIZER)


GROUPS = {
    "load": PolicyLoadSettings,
    "optimizer": AdamWSettings,
    "sampling": SamplingParams,
    "update": UpdateSettings,
    "validation": ValidationSettings,
    "rollout": RolloutSettings,
}
"""The settings groups of :class:`GRPOModule`, by argument name."""
