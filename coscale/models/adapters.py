"""PEFT adapters on a policy: checked, wrapped, switched off for the KL reference, exported.

A module given ``peft`` (any ``peft.PeftConfig``, e.g. ``peft.LoraConfig``; in YAML
``class_path: peft.LoraConfig`` with ``init_args``) trains an adapter on a frozen base, wrapped by
PEFT's own ``get_peft_model``. Its targets are checked against the model first, each one that
matches no module named with the model's linear layers. The base with the adapter switched off is
the initial model, so it serves as the KL reference without a second copy. An export writes the
merged weights as a plain Hugging Face folder (what transformers and vLLM load unchanged) and the
adapter alone in its ``adapter/`` subfolder (:data:`ADAPTER_FOLDER`, loadable with
``PeftModel.from_pretrained(base, folder / "adapter")``): one call writes only inside the folder
it is given, and both loaders ignore the subfolder.

``peft`` is an optional dependency (``pip install coscale[peft]``), imported at first use.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from coscale.distributed import barrier, is_writer
from coscale.models.full_state import fresh_like, full_state_dict, is_sharded, write_plain
from coscale.seeds import seeded

ADAPTER_FOLDER = "adapter"
"""Subfolder of an export that holds the adapter alone (``adapter_config.json`` + weights)."""
ALL_LINEAR = "all-linear"
"""PEFT's shorthand for every linear layer but the output head."""


def _peft() -> Any:
    """The ``peft`` package, or an error that says how to install it."""
    try:
        import peft
    except ModuleNotFoundError as err:
        raise ModuleNotFoundError("install coscale[peft] to use peft adapters") from err
    return peft


def as_peft_config(value: Any) -> Any:
    """``value`` as a ``peft.PeftConfig``: a mapping (hyper-parameters read back from a
    checkpoint, :func:`config_fields`) becomes one; a config or None is returned as it is."""
    if isinstance(value, dict):
        if "peft_type" not in value:
            raise ValueError(
                f"peft as a mapping needs its peft_type (e.g. LORA), got {value!r}; "
                "or give a config: class_path: peft.LoraConfig with init_args"
            )
        return _peft().get_peft_config(dict(value))
    return value


def config_fields(config: Any) -> dict[str, Any]:
    """The config as plain JSON values (sets as sorted lists), for the hyper-parameters."""
    return json.loads(json.dumps(config.to_dict(), default=sorted))


def linear_layer_names(model: nn.Module) -> list[str]:
    """The last name part of every ``nn.Linear`` in ``model``: what ``target_modules`` lists."""
    names = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear)}
    return sorted(names)


def adapter_errors(model: nn.Module, config: Any) -> list[str]:
    """A message for a value that is not a PEFT config, a task other than causal LM, and each
    entry of ``target_modules`` that matches no module of ``model`` (PEFT's own matching)."""
    peft = _peft()
    if not isinstance(config, peft.PeftConfig):
        return [f"peft must be a peft.PeftConfig (e.g. peft.LoraConfig), got {config!r}"]
    if config.task_type not in (None, peft.TaskType.CAUSAL_LM):
        return [f"peft.task_type must be CAUSAL_LM or unset, got {config.task_type!r}"]
    targets = getattr(config, "target_modules", None)
    if targets is None or targets == ALL_LINEAR:  # PEFT's defaults, or every linear layer
        return []
    from peft.tuners.tuners_utils import check_target_module_exists

    names = [n for n, _ in model.named_modules() if n]
    missing = []
    for target in [targets] if isinstance(targets, str) else sorted(targets):
        one = copy.copy(config)  # PEFT matches one entry at a time here
        one.target_modules = target if isinstance(targets, str) else {target}
        if not any(check_target_module_exists(one, name) for name in names):
            missing.append(target)
    if not missing:
        return []
    return [
        f"peft.target_modules: {', '.join(map(repr, missing))} matches no module of the model; "
        f"its linear layers: {', '.join(linear_layer_names(model))} (or {ALL_LINEAR!r})"
    ]


def with_adapter(model: nn.Module, config: Any) -> nn.Module:
    """``model`` wrapped by ``get_peft_model`` with a copy of ``config`` (PEFT fills in the copy;
    the caller's can build the next module), its init seeded by :func:`adapter_seed`; only the
    adapter's parameters train.

    Raises:
        ValueError: the problems :func:`adapter_errors` finds, all in one message.
    """
    if errors := adapter_errors(model, config):
        raise ValueError("; ".join(errors))
    peft = _peft()
    config = copy.deepcopy(config)
    config.task_type = peft.TaskType.CAUSAL_LM  # PeftModelForCausalLM: generate, labels
    with seeded(adapter_seed()):  # the caller's random stream is left as it was
        return peft.get_peft_model(model, config)


def adapter_seed() -> int:
    """The seed of a new adapter's random init: the run's seed (``L.seed_everything``, which
    ``coscale run`` and ``coscale fit`` call), else 0. A fixed seed, not the random stream's
    state, so a resumed run that builds a stage's module in a fresh process starts the same
    adapter as the run that was not stopped."""
    return int(os.environ.get("PL_GLOBAL_SEED", 0))


def has_adapter(model: nn.Module) -> bool:
    """Whether ``model`` is a PEFT model (built by :func:`with_adapter`)."""
    return hasattr(model, "peft_config") and hasattr(model, "disable_adapter")


@contextmanager
def adapter_disabled(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` as its base: the adapter switched off and eval mode (no dropout), as the frozen
    copy that serves as the KL reference without an adapter; both restored on exit."""
    with eval_mode(model), model.disable_adapter():
        yield model


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` in eval mode (no dropout) for the block, then back in the mode it was in."""
    training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(training)


def merged_copy(model: nn.Module) -> nn.Module:
    """A plain model of the base class with the adapter merged into a copy of its weights; the
    live ``model`` (and its base weights) are left as they are."""
    with torch.no_grad():
        return copy.deepcopy(model).merge_and_unload()


def unsharded_adapter_copy(model: nn.Module, state: dict[str, torch.Tensor]) -> nn.Module:
    """A fresh, unsharded PEFT model like the sharded ``model`` (its base class and config, its
    adapter's config) holding ``state``, the gathered whole weights of ``model``."""
    name = model.active_adapter
    base = fresh_like(model.get_base_model(), next(iter(state.values())).dtype)
    fresh = _peft().get_peft_model(base, copy.deepcopy(model.peft_config[name]), name)
    fresh.load_state_dict(state)
    return fresh


def is_adapter_folder(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a folder holding an adapter alone (PEFT's ``adapter_config.json``,
    no model ``config.json``), such as an export's ``adapter/``."""
    return os.path.isfile(os.path.join(path, "adapter_config.json")) and not os.path.isfile(
        os.path.join(path, "config.json")
    )


def load_merged_adapter(path: str | os.PathLike, **load: Any) -> tuple[nn.Module, str]:
    """The adapter in folder ``path`` on its base (``base_model_name_or_path`` of its config),
    merged into a plain model; returns it with the base's path (where its tokenizer is).
    ``load``: ``from_pretrained`` keywords of the base (``dtype``, ``trust_remote_code``)."""
    from transformers import AutoModelForCausalLM

    peft = _peft()
    config = peft.PeftConfig.from_pretrained(os.fspath(path))
    base_path = config.base_model_name_or_path
    if not base_path:
        raise ValueError(f"{path}/adapter_config.json names no base_model_name_or_path")
    base = AutoModelForCausalLM.from_pretrained(base_path, **load)
    model = peft.PeftModel.from_pretrained(base, os.fspath(path))
    with torch.no_grad():
        return model.merge_and_unload(), base_path


def export_with_adapter(model: nn.Module, tokenizer: Any, path: str | os.PathLike) -> str:
    """Writes the merged weights, tokenizer and generation config to ``path`` and the adapter
    to ``path/adapter``; returns ``path``. Every rank calls it (DDP, FSDP2: the whole weights
    are gathered to rank 0 first); rank 0 writes, and no rank returns before it is done."""
    path = os.fspath(path)
    state = full_state_dict(model) if is_sharded(model) else None  # a collective when sharded
    if is_writer():
        plain = model if state is None else unsharded_adapter_copy(model, state)
        plain.save_pretrained(os.path.join(path, ADAPTER_FOLDER))
        with torch.no_grad():  # the live model's copy, or the gathered copy itself
            merged = merged_copy(plain) if state is None else plain.merge_and_unload()
        write_plain(merged, tokenizer, path)
    barrier()
    return path
