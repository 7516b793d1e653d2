"""The GRPO module's own settings groups: how rollouts are sampled and how the policy is updated.

Frozen dataclasses documented once (``coscale fit --help`` and ``coscale run --help`` show these
docstrings), each checking its own ranges; in YAML a group is a mapping:
``sampling: {temperature: 1.0, max_new_tokens: 64}``.
"""

from __future__ import annotations

from dataclasses import dataclass

from coscale.checks import at_least, one_of
from coscale.rl.advantages import SCALES
from coscale.rollout.base import SamplingParams, sampling_errors


@dataclass(frozen=True)
class Sampling:
    """How the rollouts of a training step are sampled.

    Attributes:
        max_new_tokens: Token limit of one rollout.
        temperature: Sampling temperature (the update scores the rollouts at the same one).
        top_p: Nucleus sampling.
        top_k: Keep the k most likely tokens (0: off).
        seed: Base seed: each step samples with ``derive_seed("step", seed, step, rank)``.
    """

    # the defaults are SamplingParams', as those of the run's sampling (pipeline.sampling): a
    # GRPOModule in a user's Trainer samples as `coscale run` does with the same settings
    max_new_tokens: int = SamplingParams.max_new_tokens
    temperature: float = SamplingParams.temperature
    top_p: float = SamplingParams.top_p
    top_k: int = SamplingParams.top_k
    seed: int = 0

    def errors(self) -> list[str]:
        errors = sampling_errors(self.max_new_tokens, self.temperature, self.top_p, self.top_k)
        return errors + at_least(0, seed=self.seed)


@dataclass(frozen=True)
class Update:
    """How one batch of rollouts updates the policy.

    Attributes:
        num_iterations: Optimiser steps on each batch of rollouts.
        micro_batch_size: Rollouts per forward/backward pass (the step's gradient is the same
            for any size; smaller saves memory).
        max_grad_norm: Gradient clipping norm (0: none).
        scale_rewards: Advantage scaling: ``group`` (std of the group), ``batch`` or ``none``.
        mask_truncated: Leave rollouts cut by ``sampling.max_new_tokens`` out of the loss (their
            reward says nothing about an unfinished answer; TRL's ``mask_truncated_completions``).
        max_staleness: 0 samples each batch when it trains (the paper's loop). k > 0 samples the
            next k batches of the epoch while one trains, none by weights more than k optimiser
            steps old; needs ``rollout.backend: vllm-server`` and the engine's log-probs, which
            the mismatch correction (``loss.mismatch``) weights stale samples with
            (`coscale.modules.prefetch`).
    """

    num_iterations: int = 1
    micro_batch_size: int = 32
    max_grad_norm: float = 1.0
    scale_rewards: str = "group"
    mask_truncated: bool = False
    max_staleness: int = 0

    def errors(self) -> list[str]:
        errors = at_least(1, num_iterations=self.num_iterations)
        errors += at_least(0, max_staleness=self.max_staleness)
        errors += at_least(1, micro_batch_size=self.micro_batch_size)
        errors += at_least(0, float, max_grad_norm=self.max_grad_norm)
        return errors + one_of(SCALES, scale_rewards=self.scale_rewards)
