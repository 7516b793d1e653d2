"""The KL reference of GRPO (``loss.beta`` > 0): a frozen copy of the initial policy, or, with
an adapter, the policy itself with its adapter switched off (the frozen base is the initial
model, so no second set of weights is kept)."""

from __future__ import annotations

import copy
from contextlib import nullcontext

import torch

from coscale.models.adapters import adapter_disabled
from coscale.rl.logprobs import sequence_logprobs
from coscale.rollout.base import Rollouts


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` that never trains: no gradients, eval mode (no dropout in the KL
    reference; Lightning counts its modules in the "Found N module(s) in eval mode at the start
    of training" warning)."""
    ref = copy.deepcopy(model).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


def reference_logprobs(
    model: torch.nn.Module, ro: Rollouts, temperature: float, adapter_off: bool
) -> torch.Tensor:
    """[R, T] log-probs of the rollouts' completion tokens under ``model`` (the frozen copy, or
    with ``adapter_off`` the policy as its base), without gradients."""
    switch = adapter_disabled(model) if adapter_off else nullcontext(model)
    with torch.no_grad(), switch as ref:
        return sequence_logprobs(
            ref, ro.input_ids, ro.attention_mask, ro.prompt_length, temperature
        )  # [R, T]
