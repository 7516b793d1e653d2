"""The parser class of ``coscale run``: ``pipeline.sft``, ``pipeline.grpo`` and
``pipeline.schedule`` are groups of their class's typed arguments (so ``--help`` shows each one,
documented, and a later ``--config`` sets only the keys it names), and ``PipelineConfig``
receives each group as one mapping of those arguments."""

from __future__ import annotations

import re
from typing import Any

from jsonargparse import ArgumentParser, Namespace

SET_BY = {
    ("sft", "distill"): "pipeline.distill_weight (the teacher is the latest RL model)",
    ("sft", "peft"): "pipeline.peft, for every stage",
    ("sft", "verifier"): "pipeline.grpo.verifier, for every stage",
    ("grpo", "peft"): "pipeline.peft, for every stage",
}
"""What a refusal of an argument the pipeline sets itself (``run_config.PIPELINE_SETS``) names
instead (the models need no hint: ``pipeline.model`` is in ``--help``); the arguments the run's
sampling definition sets name their key in it (:func:`coscale.stages.sampling.moved_keys`)."""


def _set_by() -> dict[tuple[str, str], str]:
    from coscale.stages.sampling import moved_keys

    run = {
        (group, key): f"{where}, the run's one for every stage"
        for group in ("sft", "grpo")
        for key, where in moved_keys(group).items()
        if "." not in key
    }
    return {**SET_BY, **run}


class RunParser(ArgumentParser):
    """jsonargparse's parser, building ``PipelineConfig`` through :func:`regrouped`."""

    def instantiate(self, namespace: Namespace, instantiate_groups: bool = True, **kwargs: Any):
        from coscale.pipeline import PipelineConfig

        kwargs.setdefault("instantiators", [(regrouped, PipelineConfig, False)])
        return super().instantiate(namespace, instantiate_groups, **kwargs)

    def error(self, message: str, ex: Exception | None = None):
        """jsonargparse's refusal, with the setting to use instead for each argument of a
        group that the pipeline sets itself (``pipeline.sft.peft``: ``pipeline.peft``)."""
        hints = [
            f"pipeline.{group}.{key} is set by {where}"
            for (group, key), where in _set_by().items()
            if re.search(rf"\b{group}\.{key}\b", message)  # a flag, or a YAML key
        ]
        return super().error("; ".join([message, *hints]), ex)


def regrouped(cls: type, *args: Any, **values: Any) -> Any:
    """``cls`` from the parser's flat keys (``sft.optimizer.lr``, ...): a nested group becomes
    one mapping of its arguments."""
    nested = Namespace()
    for key, value in values.items():
        nested[key] = value
    groups = {k: v.as_dict() if isinstance(v, Namespace) else v for k, v in vars(nested).items()}
    return cls(*args, **groups)
