"""What both LightningModules share: the policy, its prompts, sampling, scoring and export.

A module samples through its ``backend``: the one its ``rollout`` setting builds (GRPOModule;
an SFTModule, which has none, samples with HF ``generate``), or one assigned to it. In
``coscale run`` every module is assigned the run's one engine (:mod:`coscale.rollout.run_engine`),
so RL, the pool measurements, checkpoint selection and the final judge all sample with the
backend ``pipeline.rollout`` chose, on the prompt and token limit of ``pipeline.sampling``.
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch

from coscale.clock import timed
from coscale.loop.budget import ON, spend
from coscale.loop.problem import Question
from coscale.models.adapter_checkpoint import drop_frozen_base, restore_frozen_base
from coscale.models.adapters import config_fields, export_with_adapter, has_adapter, with_adapter
from coscale.models.policy import export_policy, load_policy
from coscale.models.prompting import PromptSettings
from coscale.modules.optim import adamw_with_warmup
from coscale.modules.optimizer_choice import as_callable, describe, peak_lr, with_scheduler
from coscale.modules.settings import AdamWSettings
from coscale.rollout import build_backend
from coscale.rollout.base import RolloutBackend, Rollouts, SamplingParams
from coscale.rollout.dtype import precision_dtype
from coscale.rollout.factory import RolloutSettings, close_backend
from coscale.scoring.answers import reward_inputs
from coscale.scoring.metrics import PassAtK
from coscale.scoring.reward_functions import RewardInputs
from coscale.scoring.reward_set import RewardSet, Scores
from coscale.scoring.sample_count import sample_and_count


class PolicyMixin:
    """Mixed into :class:`~coscale.modules.SFTModule` and :class:`~coscale.modules.GRPOModule`.

    The host sets ``prompt`` and ``rewards`` (its reward functions and verifier) and calls
    :meth:`_init_policy`.
    """

    policy: Any
    tokenizer: Any
    prompt: PromptSettings
    rewards: RewardSet
    val_sampling: SamplingParams
    val_samples: int
    optimizer_settings: AdamWSettings
    custom_optimizer: Any = None
    lr_scheduler: Any = None

    def _choose_optimizer(self, custom_optimizer: Any, lr_scheduler: Any) -> None:
        """Keeps the user's optimiser and scheduler classes, checked by the module's
        ``choice_errors`` first (:mod:`coscale.modules.optimizer_choice`)."""
        self.custom_optimizer = as_callable(custom_optimizer, "custom_optimizer")
        self.lr_scheduler = as_callable(lr_scheduler, "lr_scheduler")

    def optimizer_fields(self) -> dict[str, Any]:
        """The hyper-parameters that record the chosen optimiser and scheduler classes."""
        return {
            name: describe(getattr(self, name)) for name in ("custom_optimizer", "lr_scheduler")
        }

    def _init_policy(
        self, model: Any, tokenizer: str | None, adapter: Any, groups: dict, rollouts: Any
    ) -> None:
        """Keeps the ``load``, ``optimizer`` and ``validation`` of ``groups`` (the validation
        token limit and temperature those of ``rollouts``, a ``SamplingParams``, unless it sets
        them; its stop strings always) and loads the policy and its tokenizer;
        with ``adapter`` (a ``peft.PeftConfig``) the policy is the frozen base wrapped with a
        new adapter (:mod:`coscale.models.adapters`)."""
        load, v = groups["load"], groups["validation"]
        self.load_settings, self.optimizer_settings = load, groups["optimizer"]
        self.val_samples, tokens = v.samples, v.max_new_tokens or rollouts.max_new_tokens
        temperature = rollouts.temperature if v.temperature is None else v.temperature
        stop = rollouts.stop  # the rollouts' stop strings end validation's samples too
        self.val_sampling = SamplingParams(tokens, temperature, stop=stop)
        self.model_source = model if isinstance(model, (str, os.PathLike)) else None
        self.policy, self.tokenizer = load_policy(
            model, tokenizer, load.dtype, load.trust_remote_code, load.gradient_checkpointing
        )
        if adapter is not None:
            try:
                self.policy = with_adapter(self.policy, adapter)
            except ValueError as err:
                raise ValueError(f"{type(self).__name__}: {err}") from None
        self.policy.train()  # from_pretrained returns eval mode; Lightning trains in train mode
        self._backend: RolloutBackend | None = None
        self._owns_backend = False  # built here from ``rollout`` (closed here), or lent
        ks = tuple(k for k in (1, 4, 8, 16, 32, 64) if k <= self.val_samples)
        self.val_pass = PassAtK(k=ks or (1,))

    @property
    def backend(self) -> RolloutBackend:
        """The rollout backend: the module's ``rollout`` setting (an SFTModule, which has none,
        samples with HF ``generate``). Assigning one replaces it; an assigned backend is lent
        (whoever assigned it closes it), a built one is closed at the fit's end."""
        if self._backend is None:
            self._owns_backend = True
            spec = getattr(self, "rollout_settings", None) or RolloutSettings("hf")
            self._backend = build_backend(
                spec.backend,
                self.policy,
                self.tokenizer,
                self.model_source,
                dtype=self._compute_dtype(),  # an engine samples in the trainer's compute dtype
                **spec.options,
            )
        return self._backend

    def _compute_dtype(self) -> str | None:
        """The trainer's compute dtype as a vLLM ``dtype`` (``bf16-mixed``: ``bfloat16``);
        None outside a Trainer."""
        return precision_dtype(getattr(getattr(self, "_trainer", None), "precision", None))

    @backend.setter
    def backend(self, value: RolloutBackend) -> None:
        self._backend, self._owns_backend = value, False

    def close_own_backend(self) -> None:
        """Closes the backend this module built (a lent one stays open)."""
        if self._owns_backend:
            close_backend(self._backend)

    def prompts_for(self, questions: list[Question]) -> list[str]:
        """The prompt text of each question (a text or a conversation)."""
        return [self.prompt(q, self.tokenizer) for q in questions]

    @property
    def verifier(self) -> Any:
        """The callable that decides which completions are correct (score >= 1.0)."""
        return self.rewards.verifier_fn

    def sample(
        self, problems: list[dict], n: int | list[int], sampling: SamplingParams
    ) -> tuple[Rollouts, Scores]:
        """Rollouts for ``problems`` (dicts with question, answer and optionally ``meta``, the
        other dataset columns) with their reward and the verifier's verdict."""
        rollouts, inputs = self.generate_for(problems, n, sampling)
        return rollouts, self.rewards.score(inputs)

    def generate_for(
        self, problems: list[dict], n: int | list[int], sampling: SamplingParams
    ) -> tuple[Rollouts, RewardInputs]:
        """Rollouts for ``problems`` and what the reward functions read about them."""
        prompts = self.prompts_for([p["question"] for p in problems])
        with timed("sampling"):
            rollouts = self.backend.generate(prompts, n, sampling)
        self.record_spend(rollouts.num_rollouts)
        return rollouts, self.reward_inputs(problems, prompts, rollouts)

    def reward_inputs(
        self, problems: list[dict], prompts: list[str], rollouts: Rollouts
    ) -> RewardInputs:
        """What the reward functions read about ``rollouts`` of ``problems`` (whose texts were
        ``prompts``): each problem's answer and other columns (``meta``), and the messages the
        prompt was rendered from when it is a conversation. A prompt-only problem (no answer)
        is refused when a reward function or the verifier reads the answer."""
        return reward_inputs(problems, prompts, rollouts, self.prompt, self.rewards)

    def count_correct(self, problems: list[dict], n: int, sampling: SamplingParams) -> list[int]:
        """Number of correct samples (by the verifier alone) out of ``n`` per problem."""
        return self.count_correct_many([problems], n, [sampling])[0]

    def count_correct_many(
        self, chunks: list[list[dict]], n: int, samplings: list[SamplingParams]
    ) -> list[list[int]]:
        """:meth:`count_correct` of each chunk with its own sampling (seed), all sampled in one
        backend call (`RolloutBackend.generate_many`: one engine call for a vLLM engine)."""
        prompts = [self.prompts_for([p["question"] for p in chunk]) for chunk in chunks]

        def verdicts(chunk: list[dict], texts: list[str], rollouts: Rollouts) -> torch.Tensor:
            return self.rewards.verify(self.reward_inputs(chunk, texts, rollouts))

        counted = sample_and_count(self.backend, chunks, prompts, n, samplings, verdicts)
        for c in counted:
            self.record_spend(c.rollouts)
        return [c.correct for c in counted]

    def record_spend(self, rollouts: int) -> None:
        """Counts ``rollouts`` in the run's budget, and on the backend that sampled them."""
        spend("rollouts", rollouts)
        spend(ON + getattr(self.backend, "name", type(self.backend).__name__), rollouts)

    def configure_model(self) -> None:
        """FSDP2 under Lightning's ``ModelParallelStrategy`` (:func:`shard_policy` over its
        data-parallel mesh). Other strategies leave the model as is."""
        mesh = getattr(self, "device_mesh", None)
        if mesh is not None:
            shard_policy(self.policy, mesh)

    @property
    def lr(self) -> float:
        """The optimiser's peak learning rate (what the Rollout N theory reads)."""
        if self.custom_optimizer is not None:
            return peak_lr(self.custom_optimizer)
        return self.optimizer_settings.lr

    updates_per_batch = 1
    """Optimiser steps per training batch (GRPO's ``update.num_iterations``)."""
    planned_steps: int | None = None
    """The fit's optimiser steps, set by a loop that runs the module outside a Trainer."""

    def configure_optimizers(self) -> Any:
        """AdamW with its learning-rate warm-up and decay (``optimizer_settings``), or the user's
        ``custom_optimizer`` over the trainable parameters; the user's ``lr_scheduler`` on it."""
        if self.custom_optimizer is not None:
            params = [p for p in self.policy.parameters() if p.requires_grad]
            return with_scheduler(self.custom_optimizer(params), self.lr_scheduler)
        settings = self.optimizer_settings
        total = None if settings.decay == "constant" else self.optimizer_steps()
        answer = adamw_with_warmup(self.policy, settings, total)
        if self.lr_scheduler is not None:
            return with_scheduler(answer["optimizer"], self.lr_scheduler)
        return answer

    def optimizer_steps(self) -> int | None:
        """The fit's optimiser steps: the trainer's ``estimated_stepping_batches`` times
        :attr:`updates_per_batch`, or :attr:`planned_steps` outside a Trainer (None: unbounded)."""
        trainer = getattr(self, "_trainer", None)
        if trainer is None:
            return self.planned_steps
        batches = trainer.estimated_stepping_batches
        return int(batches) * self.updates_per_batch if math.isfinite(batches) else None

    # ----------------------------------------------------------- validation
    def validation_step(self, batch: list[dict], batch_idx: int) -> None:
        correct = self.count_correct(batch, self.val_samples, self.val_sampling)
        self.val_pass.update([self.val_samples] * len(batch), correct)

    def on_validation_epoch_end(self) -> None:
        for name, value in self.val_pass.compute().items():
            self.log(f"val/{name}", value, prog_bar=name == "pass@1", sync_dist=False)
        self.val_pass.reset()

    # ------------------------------------------------------------ checkpoint
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """With an adapter, the checkpoint leaves the frozen base out
        (:mod:`coscale.models.adapter_checkpoint`)."""
        drop_frozen_base(checkpoint, self)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Puts the frozen base back, checked, before Lightning loads the weights."""
        restore_frozen_base(checkpoint, self)

    # ---------------------------------------------------------------- export
    def export(self, path: str | os.PathLike) -> str:
        """Saves the policy in HF format (safetensors, tokenizer, generation config). With an
        adapter: the merged weights there, and the adapter alone in ``path/adapter``."""
        if has_adapter(self.policy):
            return export_with_adapter(self.policy, self.tokenizer, path)
        return export_policy(self.policy, self.tokenizer, path)


def shard_policy(policy: torch.nn.Module, mesh: Any) -> torch.nn.Module:
    """FSDP2: each decoder block (the model's ``_no_split_modules``), then the whole model,
    sharded over ``mesh["data_parallel"]``; a policy sharded already is left as is.

    Under an adapter the root unit is the Hugging Face model inside PEFT's wrapper, not the
    wrapper: PEFT's ``generate`` calls that model directly, and a root hook on the wrapper would
    never gather the embeddings and head for it (every parameter lives inside that model).
    """
    if getattr(policy, "_is_fsdp_managed_module", False):
        return policy
    from torch.distributed.fsdp import fully_shard

    blocks = set(getattr(policy, "_no_split_modules", None) or ())
    for module in policy.modules():
        if type(module).__name__ in blocks:
            fully_shard(module, mesh=mesh["data_parallel"])
    root = policy.get_base_model() if has_adapter(policy) else policy
    fully_shard(root, mesh=mesh["data_parallel"])
    policy._is_fsdp_managed_module = True  # HF generate keeps ranks in lockstep
    return policy


def source_fields(model: Any, peft: Any) -> dict[str, Any]:
    """The hyper-parameters naming where the policy comes from: ``model`` when it is a name or
    folder (not a built model), and the adapter's config fields as ``peft`` when there is one."""
    named = {"model": model} if isinstance(model, (str, os.PathLike)) else {}
    return named | ({} if peft is None else {"peft": config_fields(peft)})
