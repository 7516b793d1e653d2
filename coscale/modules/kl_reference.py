"""The KL reference of GRPO (``loss.beta`` > 0): a frozen copy of the initial policy, or, with
an adapter, the policy itself with its adapter switched off (the frozen base is the initial
model, so no second set of weights is kept)."""

from __future__ import annotations

import copy

import torch

from coscale.models.adapters import adapter_disabled, eval_mode
from coscale.rl.logprobs import sequence_logprobs
from coscale.rollout.base import Rollouts


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` that never trains (no gradients). Between calls it is in train mode
    like the rest of the fit (Lightning warns about modules in eval mode when a fit starts, and
    sets every module to train mode after a validation); :func:`reference_logprobs` reads it in
    eval mode, so the reference never has dropout."""
    return copy.deepcopy(model).requires_grad_(False)


def reference_logprobs(
    model: torch.nn.Module, ro: Rollouts, temperature: float, adapter_off: bool
) -> torch.Tensor:
    """[R, T] log-probs of the rollouts' completion tokens under ``model`` (the frozen copy, in
    eval mode, or with ``adapter_off`` the policy as its base), without gradients."""
    switch = adapter_disabled(model) if adapter_off else eval_mode(model)
    with torch.no_grad(), switch as ref:
        return sequence_logprobs(
            ref, ro.input_ids, ro.attention_mask, ro.prompt_length, temperature
        )
