"""The GRPO module's own settings group: how the policy is updated (its rollouts are sampled by
:class:`~coscale.rollout.base.SamplingParams`, the one sampling class).

Frozen dataclasses documented once (``coscale fit --help`` and ``coscale run --help`` show these
docstrings), each checking its own ranges; in YAML a group is a mapping:
``update: {num_iterations: 2, micro_batch_size: 8}``.
"""

from __future__ import annotations

from dataclasses import dataclass

from coscale.checks import at_least, one_of
from coscale.renamed import old_names
from coscale.rl.advantages import SCALES


@dataclass(frozen=True)
class UpdateSettings:
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


# the classes' earlier names, for one release
__getattr__ = old_names(__name__, {"Update": UpdateSettings})
