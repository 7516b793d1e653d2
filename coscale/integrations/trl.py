"""A TRL ``GRPOConfig`` (an object, a dict of its fields or its YAML file) as coscale settings.

:func:`from_grpo_config` returns plain data in the shapes coscale takes them:

* ``grpo``: :class:`~coscale.modules.GRPOModule` arguments (``optimizer``, ``sampling``,
  ``update``, ``load``, ``validation``, ``rollout``, ``loss`` as a ``class_path`` mapping, and
  ``reward_weights`` / ``log_completions_every`` when set): ``GRPOModule(model=..., reward=...,
  **settings["grpo"])``, or ``model.init_args`` of a ``coscale fit`` config (for a
  ``coscale run`` one, :func:`coscale.integrations.trl_pipeline.pipeline_settings` moves the
  run's sampling settings to ``pipeline.sampling``);
* ``data``: :class:`~coscale.datamodules.ProblemDataModule` arguments for a plain GRPO fit
  (problems per step, every problem served to RL);
* ``trainer``: ``lightning.Trainer`` arguments (steps or epochs, logging, precision, folder);
* ``schedule``: ``{"n_init": num_generations, "factor": 1.0}``, TRL's fixed N as
  :class:`~coscale.callbacks.RolloutNSchedule` arguments (``coscale run`` takes ``n_init`` as
  ``pipeline.schedule``'s start N and raises N per difficulty group from there);
* ``prompt``: ``{"chat_template_kwargs": ...}``, fields of the run's prompt definition
  (:class:`~coscale.models.prompting.PromptSettings`): ``GRPOModule(prompt=settings["prompt"])``,
  or ``pipeline.sampling.prompt`` of a ``coscale run`` config (with its other fields);
* ``seed_everything``: TRL's ``seed``.

Every field of ``GRPOConfig`` is translated, accepted (no effect on what is trained) or refused
when not at TRL's default (:mod:`.trl_fields`; ``docs/trl-grpo-config.md``). Every refusal and
every value coscale cannot take is named in one ``ValueError``.
"""

from __future__ import annotations

import dataclasses
import enum
import os
from collections.abc import Mapping
from typing import Any

from coscale.integrations.trl_fields import grpo_config_defaults, refusals
from coscale.integrations.trl_loss import loss_settings
from coscale.models.capabilities import DTYPES

DECAY_OF = {
    "linear": "linear",
    "cosine": "cosine",
    "constant": "constant",
    "constant_with_warmup": "constant",
}
"""TRL's ``lr_scheduler_type`` -> ``optimizer.decay`` (the warm-up is ``warmup_steps``)."""


def config_values(config: Any) -> tuple[dict[str, Any], list[str]]:
    """``config`` (a ``GRPOConfig``, a mapping of its fields, or a YAML file's path) as every
    field's value, TRL's defaults filled in -> (values, errors for unknown keys)."""
    defaults = grpo_config_defaults()
    if isinstance(config, (str, os.PathLike)):
        import yaml

        with open(config, encoding="utf-8") as f:
            config = yaml.safe_load(f) or {}
    if dataclasses.is_dataclass(config):
        given = {name: getattr(config, name) for name in defaults}
    elif isinstance(config, Mapping):
        given = dict(config)
    else:
        raise ValueError(f"config must be a GRPOConfig, a dict or a YAML path, got {config!r}")
    errors = [f"{name} is not a field of GRPOConfig" for name in sorted(set(given) - set(defaults))]
    values = defaults | {k: _plain(v) for k, v in given.items() if k in defaults}
    values["scale_rewards"] = {True: "group", False: "none"}.get(
        values["scale_rewards"], values["scale_rewards"]
    )
    if values["vllm_importance_sampling_cap"] is not None:  # TRL's deprecated name
        values["vllm_importance_sampling_clip_max"] = values["vllm_importance_sampling_cap"]
    return values, errors


def _plain(value: Any) -> Any:
    """An enum as its value (``TrainingArguments`` turns strings into enums)."""
    return value.value if isinstance(value, enum.Enum) else value


def from_grpo_config(config: Any, num_processes: int = 1) -> dict[str, Any]:
    """The coscale settings of a TRL GRPO set-up (the keys in the module docstring).

    Args:
        config: A ``trl.GRPOConfig``, a dict of its fields, or the path of its YAML file.
        num_processes: Ranks of the coscale run (TRL's generation batch is over all ranks;
            ``data.batch_size`` is per rank). A ``GRPOConfig`` object has filled in
            ``generation_batch_size`` for the ranks it was built under: give the same number.

    Raises:
        ValueError: Naming every field coscale cannot take and every bad value at once.
    """
    v, errors = config_values(config)
    errors += refusals(v)
    settings = {
        "grpo": _grpo(v, loss_settings(v, num_processes, errors), errors),
        "data": _data(v, num_processes, errors),
        "trainer": _trainer(v, errors),
        "schedule": {"n_init": v["num_generations"], "factor": 1.0},
        "prompt": {"chat_template_kwargs": dict(v["chat_template_kwargs"] or {})},
        "seed_everything": v["seed"],
    }
    if errors:
        raise ValueError("GRPOConfig -> coscale: " + "; ".join(errors))
    return settings


def _grpo(v: Mapping[str, Any], loss: dict[str, Any], errors: list[str]) -> dict[str, Any]:
    grpo: dict[str, Any] = {
        "load": {
            "dtype": _dtype(v["model_init_kwargs"], errors),
            "gradient_checkpointing": v["gradient_checkpointing"],
            "trust_remote_code": v["trust_remote_code"],
        },
        "optimizer": {
            "lr": v["learning_rate"],
            "betas": [v["adam_beta1"], v["adam_beta2"]],
            "weight_decay": v["weight_decay"],
            "warmup_steps": _warmup(v, errors),
            "decay": DECAY_OF[v["lr_scheduler_type"]],
        },
        "sampling": {
            "max_new_tokens": v["max_completion_length"],
            "temperature": v["temperature"],
            "top_p": v["top_p"],
            "top_k": v["top_k"] or 0,
            "seed": v["seed"],
        },
        "update": {
            "num_iterations": v["num_iterations"],
            "micro_batch_size": v["per_device_train_batch_size"],
            "max_grad_norm": v["max_grad_norm"],
            "scale_rewards": v["scale_rewards"],
            "mask_truncated": v["mask_truncated_completions"],
        },
        "validation": {"temperature": v["temperature"]}
        | ({"samples": v["num_generations_eval"]} if v["num_generations_eval"] else {}),
        "loss": loss,
    }
    if v["use_vllm"]:
        engine = {
            "gpu_memory_utilization": v["vllm_gpu_memory_utilization"],
            "max_model_len": v["vllm_max_model_length"],
            "sleep_level": 2 if v["vllm_enable_sleep_mode"] else 0,
        }
        grpo["rollout"] = {"backend": "vllm", "options": {"engine": engine}}
        if v["vllm_mode"] == "server":  # the server holds the engine: its settings are its own
            grpo["rollout"] = {"backend": "vllm-server", "options": {"server": {"url": _url(v)}}}
    if v["reward_weights"] is not None:
        grpo["reward_weights"] = list(v["reward_weights"])
    if v["log_completions"]:
        grpo["log_completions_every"] = _whole(v, "logging_steps", errors)
    return grpo


def _dtype(kwargs: Mapping[str, Any] | None, errors: list[str]) -> str:
    kwargs = dict(kwargs or {})
    dtype = str(kwargs.pop("dtype", kwargs.pop("torch_dtype", "float32"))).removeprefix("torch.")
    errors += [f"model_init_kwargs.{k} has no coscale meaning" for k in sorted(kwargs)]
    if dtype not in DTYPES:
        errors.append(f"model_init_kwargs.dtype={dtype!r}: coscale takes {', '.join(DTYPES)}")
    return dtype


def _warmup(v: Mapping[str, Any], errors: list[str]) -> int:
    """TRL's ``warmup_steps``: steps, or below 1 a share of ``max_steps``."""
    steps = v["warmup_steps"]
    if isinstance(steps, float) and 0 < steps < 1:
        if v["max_steps"] > 0:
            return round(steps * v["max_steps"])
        errors.append(f"warmup_steps={steps} is a share of max_steps, which is unset: give steps")
        return 0
    return _whole(v, "warmup_steps", errors)


def _whole(v: Mapping[str, Any], name: str, errors: list[str]) -> int:
    """Field ``name`` as an int; a fractional value is refused, named."""
    value = v[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        errors.append(f"{name}={value!r}: coscale takes a whole number here")
        return 0
    return int(value)


def _data(v: Mapping[str, Any], num_processes: int, errors: list[str]) -> dict[str, Any]:
    """Problems per step and rank, from TRL's generation batch (completions over all ranks)."""
    accumulation, n = v["gradient_accumulation_steps"], v["num_generations"]
    per_step = v["per_device_train_batch_size"] * num_processes
    steps = v["steps_per_generation"] or (
        v["generation_batch_size"] // per_step if v["generation_batch_size"] else accumulation
    )
    generation = v["generation_batch_size"] or per_step * steps
    if steps != accumulation:
        errors.append(
            f"steps_per_generation={steps} with gradient_accumulation_steps={accumulation}: TRL "
            "would take several optimiser steps per generation; coscale takes one per batch "
            "(times num_iterations). Make them equal"
        )
    if generation % (n * num_processes):
        errors.append(
            f"generation_batch_size={generation} is no whole number of groups of "
            f"num_generations={n} on each of {num_processes} ranks"
        )
    curriculum: dict[str, Any] = {"rl_unmeasured": True, "low": 0.0}
    curriculum["seed"] = v["data_seed"] if v["data_seed"] is not None else v["seed"]
    return {"batch_size": max(generation // (n * num_processes), 1), "curriculum": curriculum}


def _trainer(v: Mapping[str, Any], errors: list[str]) -> dict[str, Any]:
    trainer: dict[str, Any] = {"log_every_n_steps": _whole(v, "logging_steps", errors)}
    if v["max_steps"] > 0:
        trainer["max_steps"] = v["max_steps"]
    else:
        trainer["max_epochs"] = _whole(v, "num_train_epochs", errors)
    if v["output_dir"]:
        trainer["default_root_dir"] = str(v["output_dir"])
    if v["fp16"]:
        trainer["precision"] = "16-mixed"
    elif v["bf16"] is not None:
        trainer["precision"] = "bf16-mixed" if v["bf16"] else "32-true"
    if v["use_cpu"]:
        trainer["accelerator"] = "cpu"
    return trainer


def _url(v: Mapping[str, Any]) -> str:
    """The server TRL's server mode connects to: its base URL, else host and port."""
    if v["vllm_server_base_url"]:
        return str(v["vllm_server_base_url"]).rstrip("/")
    host = "127.0.0.1" if v["vllm_server_host"] in ("0.0.0.0", "") else v["vllm_server_host"]
    return f"http://{host}:{v['vllm_server_port']}"
