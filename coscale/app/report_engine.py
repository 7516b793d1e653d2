"""The engine and sampling definition a held-out report samples every model with.

The demo's report and the benchmark scripts measure several models (the base, each iteration's,
the final one) on held-out sets. They sample as the run did: its engine kind
(``pipeline.rollout``, one engine for all the models: a vLLM engine starts once and is synced per
model) and its sampling definition (``pipeline.sampling``: prompt, token limit, the judge's
temperature).
"""

from __future__ import annotations

from typing import Any

import torch

from coscale.models.prompting import PromptSettings
from coscale.tasks import tiers


class ReportEngine:
    """The run's rollout engine and sampling definition (``cfg``: its ``PipelineSettings``; None:
    the machine's ``auto`` backend, the demo task's plain prompt, 96 tokens, temperature 1.0)."""

    def __init__(self, cfg: Any = None) -> None:
        from coscale.rollout.factory import RolloutSettings
        from coscale.rollout.run_engine import RunEngine

        cuda = torch.cuda.is_available()
        self.engine = RunEngine(
            cfg.rollout if cfg is not None else RolloutSettings("auto"), cuda=cuda
        )
        sampling = getattr(cfg, "sampling", None)
        self.fmt = (
            sampling.prompt if sampling is not None else PromptSettings(template=tiers.PROMPT)
        )
        self.max_new_tokens = sampling.max_new_tokens if sampling is not None else 96
        self.temperature = sampling.judging_temperature if sampling is not None else 1.0

    def backend_for(self, path: str) -> tuple[Any, Any]:
        """A backend sampling the model in folder ``path``, and its tokenizer."""
        from coscale.models.policy import load_policy

        model, tok = load_policy(path)
        if torch.cuda.is_available():
            model = model.cuda()
        backend = self.engine.attach(model, tok, path)
        if getattr(backend, "needs_sync", False):  # an engine that sampled another model
            backend.update_weights(model)
        return backend, tok

    def close(self) -> None:
        self.engine.close()
