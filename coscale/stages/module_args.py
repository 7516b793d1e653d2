"""The modules' arguments of ``coscale run``: ``pipeline.sft`` / ``pipeline.grpo`` mappings from
YAML checked against the modules' signatures and turned into objects, and the run's one verifier
handed to every stage that judges."""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from coscale.datamodules import ProblemDataModule
from coscale.scoring.reward_set import default_verifier


def instantiate(value: Any) -> Any:
    """``{"class_path": ..., "init_args": {...}}`` dicts (from YAML) become objects, recursively
    (in lists too: a list of reward functions)."""
    if isinstance(value, dict) and "class_path" in value:
        module_name, _, cls_name = value["class_path"].rpartition(".")
        cls = getattr(importlib.import_module(module_name), cls_name)
        return cls(**instantiate(value.get("init_args", {})))
    if isinstance(value, dict):
        return {k: instantiate(v) for k, v in value.items()}
    if isinstance(value, list):
        return [instantiate(v) for v in value]
    return value


def one_verifier(sft: dict[str, Any], grpo: dict[str, Any], data: ProblemDataModule) -> None:
    """Makes ``pipeline.grpo.verifier`` (or its default, :func:`default_verifier`) the run's one
    verifier: the RL stages' and the SFT stages' (measurement, selection, the final judge), and
    the teacher's when it has none of its own (the bank)."""
    verifier = default_verifier(grpo.get("reward"), grpo.get("verifier"))
    grpo["verifier"] = sft["verifier"] = verifier
    if (teacher := data.curriculum.teacher) is not None and hasattr(teacher, "adopt_verifier"):
        teacher.adopt_verifier(verifier)


def typed_errors(name: str, cls: type, args: dict[str, Any], ranges) -> list[str]:
    """``args`` checked against ``cls``'s typed signature (keys, types, ``class_path`` parts)
    by jsonargparse, then its value ranges by ``ranges``; messages name ``pipeline.<name>``."""
    from jsonargparse import ArgumentParser

    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(cls, skip={"model"}, instantiate=False)
    try:
        parser.parse_object(args)
    except Exception as err:  # jsonargparse's ArgumentError: unknown key or wrong type
        detail = " ".join(line.strip() for line in str(err).splitlines())
        params = ", ".join(sorted(set(inspect.signature(cls).parameters) - {"model"}))
        return [f"{name}: {detail} ({cls.__name__} takes: {params})"]
    return [f"{name}.{e}" for e in ranges(**args)]
