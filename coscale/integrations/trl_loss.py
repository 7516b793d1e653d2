"""TRL's loss settings of a ``GRPOConfig`` as a coscale loss: the class and its arguments.

``loss_type`` and ``importance_sampling_level`` pick the class (``LOSSES``); ``epsilon`` /
``epsilon_high``, ``beta``, ``entropy_coef`` and the vLLM importance-sampling settings become its
arguments. ``docs/losses.md`` shows that each pair gives TRL's loss and gradient (checked in
``tests/test_loss_parity_trl.py``); what it cannot give is refused, named.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

LOSSES = {
    ("grpo", "token"): "GRPOLoss",
    ("grpo", "sequence"): "GSPOLoss",
    ("dr_grpo", "token"): "DrGRPOLoss",
    ("dapo", "token"): "DAPOLoss",
    ("bnpo", "token"): "DAPOLoss",
    ("cispo", "token"): "CISPOLoss",
}
"""(``loss_type``, ``importance_sampling_level``) -> the coscale loss class."""
LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo", "cispo")


def loss_settings(v: Mapping[str, Any], num_processes: int, errors: list[str]) -> dict[str, Any]:
    """``loss_type`` + ``importance_sampling_level`` + clip / KL / entropy / mismatch settings as
    a loss ``class_path`` mapping (docs/losses.md: the same loss and gradient as TRL's)."""
    if v["beta"] > 0 and v["use_bias_correction_kl"]:
        errors.append("use_bias_correction_kl=True with beta > 0: coscale's KL is TRL's without "
                      "the correction; set use_bias_correction_kl=False")  # fmt: skip
    kind, level = v["loss_type"], v["importance_sampling_level"]
    name = LOSSES.get((kind, level))
    if name is None:
        if kind in LOSS_TYPES:
            errors.append(f"importance_sampling_level={level!r} with loss_type={kind!r}: "
                          "coscale takes sequence only with loss_type grpo (GSPO)")  # fmt: skip
        return {}
    if kind == "bnpo" and (v["gradient_accumulation_steps"] != 1 or num_processes != 1):
        errors.append("loss_type='bnpo' equals DAPOLoss only on one process without gradient "
                      "accumulation: use loss_type='dapo'")  # fmt: skip
    args: dict[str, Any] = {"beta": v["beta"], "entropy_coef": v["entropy_coef"]}
    if name == "CISPOLoss":
        high = v["epsilon_high"]
        args["max_weight"] = high if high is not None else v["epsilon"]
    else:
        args |= {"epsilon": v["epsilon"], "epsilon_high": v["epsilon_high"]}
    if name == "DrGRPOLoss":
        args["max_tokens"] = v["max_completion_length"]
    args["mismatch"] = mismatch_settings(v, errors)
    return {"class_path": f"coscale.rl.losses.{name}", "init_args": args}


def mismatch_settings(v: Mapping[str, Any], errors: list[str]) -> dict[str, Any]:
    if not v["vllm_importance_sampling_correction"]:
        return {"mode": "none"}
    level, _, mode = str(v["vllm_importance_sampling_mode"]).partition("_")
    cap = v["vllm_importance_sampling_clip_max"]
    if cap is None:
        errors.append("vllm_importance_sampling_clip_max=None: coscale's correction needs a cap")
    return {"mode": mode or "mask", "level": level, "cap": cap}
