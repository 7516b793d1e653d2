"""The parser class of ``coscale run``: ``pipeline.sft``, ``pipeline.grpo`` and
``pipeline.schedule`` are groups of their class's typed arguments (so ``--help`` shows each one,
documented, and a later ``--config`` sets only the keys it names), and ``PipelineSettings``
receives each group as one mapping of those arguments."""

from __future__ import annotations

import re
from typing import Any

from jsonargparse import ArgumentParser, Namespace

from coscale.app.refusal import OneLineRefusals


def _set_by() -> dict[tuple[str, str], str]:
    """The arguments the run sets itself (not offered by the parser) -> the key that sets them
    (:data:`coscale.run.settings.SET_BY_RUN`)."""
    from coscale.run.settings import SET_BY_RUN

    return {(g, key): where for (g, key), where in SET_BY_RUN.items() if "." not in key}


class RunParser(OneLineRefusals, ArgumentParser):
    """jsonargparse's parser, building ``PipelineSettings`` through :func:`regrouped`."""

    def instantiate(self, namespace: Namespace, instantiate_groups: bool = True, **kwargs: Any):
        from coscale.pipeline import PipelineSettings

        kwargs.setdefault("instantiators", [(regrouped, PipelineSettings, False)])
        return super().instantiate(namespace, instantiate_groups, **kwargs)

    def error(self, message: str, ex: Exception | None = None):
        """jsonargparse's refusal in one line (:class:`~coscale.app.refusal.OneLineRefusals`),
        with the setting to use instead for each argument of a group that the pipeline sets
        itself (``pipeline.sft.peft``: ``pipeline.peft``)."""
        hints = [
            f"pipeline.{group}.{key} is set by {where}, for every stage"
            for (group, key), where in _set_by().items()
            if re.search(rf"\b{group}\.{key}\b", message)  # a flag, or a YAML key
        ]
        return self.refuse(message, ex, hints)


def regrouped(cls: type, *args: Any, **values: Any) -> Any:
    """``cls`` from the parser's flat keys (``sft.optimizer.lr``, ...): a nested group becomes
    one mapping of its arguments."""
    nested = Namespace(values)  # each flat key set as ``nested[key]``
    groups = {k: v.as_dict() if isinstance(v, Namespace) else v for k, v in vars(nested).items()}
    return cls(*args, **groups)
