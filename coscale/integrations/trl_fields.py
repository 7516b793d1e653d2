"""What each field of TRL's ``GRPOConfig`` becomes in coscale: translated, accepted, or refused.

Three kinds, for every field of ``trl.GRPOConfig`` (TRL 1.16: its own and ``TrainingArguments``'):

* ``TRANSLATED``: the value becomes the coscale setting named (some only within ``CHOICES``);
* ``ACCEPTED``: any value is taken and has no effect on what is trained (display, hub identity,
  the Hugging Face Trainer's checkpoint cadence, ...); the text says what to use instead;
* every other field is **refused** unless it keeps TRL's default, with a hint where coscale
  has a way to get the same (``HINTS``).

:mod:`coscale.integrations.trl` applies these; ``docs/trl-grpo-config.md`` lists every field with
its kind, and ``tests/test_trl_config.py`` checks that the page and these tables agree.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from coscale.integrations.trl_loss import LOSS_TYPES

TRANSLATED: dict[str, str] = {
    # the policy and its loading
    "model_init_kwargs": "`grpo.load.dtype` from its `dtype` (or `torch_dtype`); other keys refused",
    "trust_remote_code": "`grpo.load.trust_remote_code`",
    "gradient_checkpointing": "`grpo.load.gradient_checkpointing` (TRL's default is on)",
    # the optimiser
    "learning_rate": "`grpo.optimizer.lr`",
    "adam_beta1": "`grpo.optimizer.betas[0]`",
    "adam_beta2": "`grpo.optimizer.betas[1]`",
    "weight_decay": "`grpo.optimizer.weight_decay`",
    "warmup_steps": "`grpo.optimizer.warmup_steps` (a ratio < 1 times `max_steps`)",
    "lr_scheduler_type": "`grpo.optimizer.decay`: `linear` and `cosine` as named (down to 0 at "
    "the fit's last step), `constant` / `constant_with_warmup` as `constant`",
    "optim": "`adamw_torch_fused` / `adamw_torch`: coscale's AdamW (fused where torch can)",
    "max_grad_norm": "`grpo.update.max_grad_norm`",
    # sampling
    "num_generations": "`schedule.n_init` with `factor: 1.0` (`RolloutNSchedule`; in "
    "`coscale run`, `pipeline.schedule.n_init`, the start N)",
    "num_generations_eval": "`grpo.validation.samples`",
    "max_completion_length": "`grpo.sampling.max_new_tokens` (and `DrGRPOLoss.max_tokens`)",
    "temperature": "`grpo.sampling.temperature` and `grpo.validation.temperature`",
    "top_p": "`grpo.sampling.top_p`",
    "top_k": "`grpo.sampling.top_k`",
    "chat_template_kwargs": "`prompt.chat_template_kwargs`: `PromptSettings`'s (`pipeline.sampling."
    "prompt` of `coscale run`), passed to the chat template of every chat-rendered prompt",
    "seed": "`seed_everything` and `grpo.sampling.seed` (and `data.curriculum.seed` without "
    "`data_seed`)",
    "data_seed": "`data.curriculum.seed` (the per-epoch shuffle)",
    # batches
    "per_device_train_batch_size": "`grpo.update.micro_batch_size` (rollouts per forward pass)",
    "gradient_accumulation_steps": "must equal `steps_per_generation`: coscale takes one optimiser "
    "step per batch (per `num_iterations`)",
    "steps_per_generation": "with `generation_batch_size`: `data.batch_size`, problems per step "
    "and rank = generation batch / `num_generations` / ranks",
    "generation_batch_size": "`data.batch_size` (see `steps_per_generation`)",
    # the loss and the update
    "loss_type": "the loss class: `grpo` GRPOLoss, `dr_grpo` DrGRPOLoss, `dapo` DAPOLoss, "
    "`cispo` CISPOLoss, `bnpo` DAPOLoss (one process, no accumulation: the same numbers)",
    "importance_sampling_level": "`sequence` with `loss_type: grpo`: GSPOLoss",
    "beta": "`grpo.loss` `beta` (KL to the initial policy)",
    "use_bias_correction_kl": "with `beta > 0` it must be False (coscale's KL is TRL's without "
    "the correction); no effect at `beta = 0`",
    "epsilon": "`grpo.loss` `epsilon` (CISPO: `max_weight` when `epsilon_high` is unset)",
    "epsilon_high": "`grpo.loss` `epsilon_high` (CISPO: `max_weight`)",
    "entropy_coef": "`grpo.loss` `entropy_coef`",
    "vllm_importance_sampling_correction": "False: `grpo.loss` `mismatch.mode: none`",
    "vllm_importance_sampling_mode": "`grpo.loss` `mismatch` `level` and `mode`",
    "vllm_importance_sampling_clip_max": "`grpo.loss` `mismatch.cap`",
    "vllm_importance_sampling_cap": "`grpo.loss` `mismatch.cap` (TRL's deprecated name)",
    "scale_rewards": "`grpo.update.scale_rewards` (True: `group`, False: `none`)",
    "multi_objective_aggregation": "`sum_then_normalize` only: coscale sums the weighted rewards",
    "mask_truncated_completions": "`grpo.update.mask_truncated`",
    "num_iterations": "`grpo.update.num_iterations`",
    "reward_weights": "`grpo.reward_weights`",
    # the rollout engine
    "use_vllm": "`grpo.rollout.backend: vllm` (else coscale's `cached` backend)",
    "vllm_mode": "`colocate`: `grpo.rollout.backend: vllm`; `server`: `backend: vllm-server`, "
    "attached to the server at `vllm_server_base_url` (or `vllm_server_host`:`vllm_server_port`), "
    "which must run coscale's worker extension (docs/vllm.md), not `trl vllm-serve`",
    "vllm_server_base_url": "`grpo.rollout.options.server.url` (server mode)",
    "vllm_server_host": "`grpo.rollout.options.server.url` (server mode, without a base URL; "
    "`0.0.0.0` is this machine)",
    "vllm_server_port": "`grpo.rollout.options.server.url` (server mode, without a base URL)",
    "vllm_gpu_memory_utilization": "`grpo.rollout.options.engine.gpu_memory_utilization`",
    "vllm_max_model_length": "`grpo.rollout.options.engine.max_model_len`",
    "vllm_enable_sleep_mode": "`grpo.rollout.options.engine.sleep_level: 2` (TRL's level)",
    "vllm_tensor_parallel_size": "1 only",
    # the Lightning Trainer
    "output_dir": "`trainer.default_root_dir`",
    "max_steps": "`trainer.max_steps` (optimiser steps, as in TRL; a batch without signal counts)",
    "num_train_epochs": "`trainer.max_epochs` (a whole number) when `max_steps` is unset",
    "logging_steps": "`trainer.log_every_n_steps` (a whole number)",
    "log_completions": "`grpo.log_completions_every: logging_steps` (a W&B table)",
    "bf16": "`trainer.precision: bf16-mixed` (False with `fp16` False: `32-true`; unset: not set)",
    "fp16": "`trainer.precision: 16-mixed`",
    "use_cpu": "`trainer.accelerator: cpu`",
}
"""Field -> the coscale setting it becomes (settings keys as :func:`.trl.from_grpo_config`
returns them)."""

CHOICES: dict[str, tuple] = {
    "lr_scheduler_type": ("linear", "cosine", "constant", "constant_with_warmup"),
    "optim": ("adamw_torch_fused", "adamw_torch"),
    "loss_type": LOSS_TYPES,
    "multi_objective_aggregation": ("sum_then_normalize",),
    "vllm_mode": ("colocate", "server"),
    "vllm_tensor_parallel_size": (1,),
    "vllm_importance_sampling_mode": (
        "token_truncate",
        "token_mask",
        "sequence_truncate",
        "sequence_mask",
    ),
}
"""Translated fields that coscale takes only at these values."""

_DISPLAY = "display only"
_HUB = "hub only: coscale never pushes (`push_to_hub` is refused)"
_SAVE = "the HF Trainer's checkpoints: a Lightning `ModelCheckpoint` decides when coscale saves"
_LOGGER = "give `L.Trainer` a logger (e.g. `WandbLogger`; `coscale run`: `pipeline.logger`)"

ACCEPTED: dict[str, str] = {
    "report_to": _LOGGER,
    "run_name": _LOGGER,
    "project": _LOGGER,
    "trackio_space_id": _LOGGER,
    "trackio_bucket_id": _LOGGER,
    "trackio_static_space_id": _LOGGER,
    "logging_first_step": _DISPLAY,
    "log_on_each_node": _DISPLAY,
    "logging_nan_inf_filter": _DISPLAY,
    "log_level": _DISPLAY,
    "log_level_replica": _DISPLAY,
    "disable_tqdm": "display only (`L.Trainer(enable_progress_bar=...)`)",
    "include_num_input_tokens_seen": _DISPLAY,
    "skip_memory_metrics": _DISPLAY,
    "num_completions_to_print": _DISPLAY,
    "log_unique_prompts": _DISPLAY,
    "log_multimodal": "text only in coscale",
    "save_strategy": _SAVE,
    "save_steps": _SAVE,
    "save_total_limit": _SAVE,
    "save_only_model": _SAVE,
    "save_on_each_node": _SAVE,
    "enable_jit_checkpoint": _SAVE,
    "hub_token": _HUB,
    "hub_private_repo": _HUB,
    "hub_model_id": _HUB,
    "hub_strategy": _HUB,
    "hub_always_push": _HUB,
    "hub_revision": _HUB,
    "do_train": "not read by TRL's trainer either",
    "do_eval": "not read by TRL's trainer either (evaluation: `eval_strategy`)",
    "do_predict": "not read by TRL's trainer either",
    "local_rank": "set by launchers; Lightning reads its own",
    "per_device_eval_batch_size": "no evaluation is translated (`eval_strategy`); "
    "`data.val_batch_size` counts problems",
    "dataloader_pin_memory": "no effect on what is trained",
    "remove_unused_columns": "coscale keeps every column (reward functions get them all)",
    "label_names": "not used by GRPO",
    "length_column_name": "not used by GRPO",
    "ds3_gather_for_generation": "DeepSpeed only (`deepspeed` is refused)",
    "use_cache": "coscale's rollouts use their own KV cache; training forwards use none",
}
"""Field -> why any value is fine (and what to use instead)."""

HINTS: dict[str, str] = {
    "adam_epsilon": "coscale's AdamW keeps torch's eps 1e-8",
    "eval_strategy": "give `ProblemDataModule(val=...)` and `L.Trainer(val_check_interval=...)`",
    "push_to_hub": "export with `module.export(folder)` and push the folder yourself",
    "resume_from_checkpoint": "`trainer.fit(..., ckpt_path=...)`",
    "dataloader_num_workers": "coscale samples the pools in the main process (0 workers)",
    "shuffle_dataset": "coscale shuffles the solvable problems every epoch",
    "vllm_importance_sampling_clip_min": "coscale's correction has no lower bound",
    "off_policy_mask_threshold": "not built (docs/losses.md)",
    "delta": "two-sided clipping is not built (docs/losses.md)",
    "top_entropy_quantile": "not built (docs/losses.md)",
    "use_adaptive_entropy": "a fixed `entropy_coef` only",
    "sync_ref_model": "the KL reference is the initial policy",
    "disable_dropout": "build the policy with dropout 0 in its config",
    "gradient_checkpointing_kwargs": "`grpo.load.gradient_checkpointing` takes no options",
    "tf32": "`torch.set_float32_matmul_precision(...)` before the fit",
    "torch_compile": "`grpo.rollout.options.compile` compiles the decode step",
    "full_determinism": "`seed_everything(...)` and `L.Trainer(deterministic=True)`",
    "fsdp": "`L.Trainer(strategy=ModelParallelStrategy(...))` (docs/scale.md)",
    "fsdp_config": "`L.Trainer(strategy=ModelParallelStrategy(...))` (docs/scale.md)",
    "deepspeed": "Lightning strategies (DDP, FSDP2) only",
    "ddp_backend": "`L.Trainer(strategy=DDPStrategy(...))`",
    "ddp_timeout": "`L.Trainer(strategy=DDPStrategy(timeout=...))`",
    "ddp_find_unused_parameters": "`L.Trainer(strategy=DDPStrategy(...))`",
    "lr_scheduler_kwargs": "coscale's schedule takes `warmup_steps` and `decay` only",
    "sapo_temperature_neg": "`sapo` is not built",
    "sapo_temperature_pos": "`sapo` is not built",
    "vespo_k_pos": "`vespo` is not built",
    "vespo_lambda_pos": "`vespo` is not built",
    "vespo_k_neg": "`vespo` is not built",
    "vespo_lambda_neg": "`vespo` is not built",
    "generation_kwargs": "the sampling settings are `grpo.sampling`'s",
    "repetition_penalty": "coscale samples without one",
    "min_p": "`grpo.sampling` has top-p and top-k",
}
"""Refused field -> how coscale gets the same, where it can."""


def grpo_config_defaults() -> dict[str, Any]:
    """Every ``GRPOConfig`` field with TRL's default (before ``__post_init__``)."""
    try:
        from trl import GRPOConfig
    except ImportError:
        raise ImportError("install trl to translate a GRPOConfig (pip install trl)") from None
    return {
        f.name: f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
        for f in dataclasses.fields(GRPOConfig)
    }


def refusals(values: Mapping[str, Any]) -> list[str]:
    """Each field set to a value coscale cannot take, named with its value."""
    defaults = grpo_config_defaults()
    errors = []
    for name, value in values.items():
        if name in TRANSLATED or name in ACCEPTED or _same(name, value, defaults[name]):
            continue
        hint = f": {HINTS[name]}" if name in HINTS else ""
        errors.append(
            f"{name}={value!r} has no coscale meaning (TRL's default {defaults[name]!r}){hint}"
        )
    for name, allowed in CHOICES.items():
        if values[name] not in allowed:
            errors.append(
                f"{name}={values[name]!r}: coscale takes {' or '.join(map(repr, allowed))}"
            )
    return errors


def _same(name: str, value: Any, default: Any) -> bool:
    """``value`` is TRL's default, up to what ``__post_init__`` fills in."""
    if value == default or (name == "debug" and not value):
        return True
    if name == "pad_to_multiple_of":
        return value is None
    if name == "accelerator_config":
        from transformers.trainer_pt_utils import AcceleratorConfig

        plain = dataclasses.asdict(AcceleratorConfig())
        return value is None or (
            dataclasses.is_dataclass(value) and dataclasses.asdict(value) == plain
        )
    return False
