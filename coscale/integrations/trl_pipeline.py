"""A translated TRL ``GRPOConfig`` (:func:`coscale.integrations.trl.from_grpo_config`) as the
``pipeline`` section of ``coscale run``.

In a run, the prompt, the token limit and the sampling of every sample are stated once
(``pipeline.sampling``) and the engine is the run's (``pipeline.rollout``): the GRPO module's
own copies of them are refused there. :func:`pipeline_settings` moves them to those keys.
"""

from __future__ import annotations

import copy
from typing import Any

RUN_SAMPLING = ("max_new_tokens", "temperature", "top_p", "top_k")
"""GRPO ``sampling`` fields that are the run's (``pipeline.sampling``) in ``coscale run``."""


def pipeline_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """``{"sampling", "rollout", "grpo", "schedule"}`` for ``coscale run``'s ``pipeline`` from
    :func:`~coscale.integrations.trl.from_grpo_config`'s result (left as it was)."""
    grpo = copy.deepcopy(settings["grpo"])
    sampling = grpo.pop("sampling", {})
    run = {key: sampling.pop(key) for key in RUN_SAMPLING if key in sampling}
    if sampling:  # what stays a module setting (the seed)
        grpo["sampling"] = sampling
    validation = {k: v for k, v in grpo.pop("validation", {}).items() if k == "samples"}
    if validation:
        grpo["validation"] = validation
    if settings.get("prompt"):  # PromptSettings fields (chat_template_kwargs): the run's prompt
        run["prompt"] = dict(settings["prompt"])
    # the start N; the run's schedule raises N per difficulty group from there (TRL's is fixed)
    out = {"sampling": run, "grpo": grpo, "schedule": {"n_init": settings["schedule"]["n_init"]}}
    if "rollout" in grpo:
        out["rollout"] = grpo.pop("rollout")
    return out
