"""Engine/trainer mismatch correction: truncated or masked importance sampling (TIS / MIS).

A rollout engine with its own copy of the weights (vLLM) computes the sampling log-probs with
other kernels, and often another precision, than the trainer: the tokens were drawn from
``pi_engine``, not from the trainer's ``pi_old``. The policy term of each token is weighted by
``rho = pi_old / pi_engine`` (a token's ratio, or the product of a sequence's), with ``rho``
capped (TIS: ``min(rho, cap)``) or the tokens / sequences beyond the cap dropped (MIS: weight
0 there, ``rho`` elsewhere). The weight carries no gradient: both log-probs are constants of
the update. Nothing here knows where log-probs came from; the GRPO update passes the engine's
only when the rollouts say they are an engine's (``Rollouts.logprob_source``).

Shapes: R rollouts, T completion tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from coscale.checks import is_number, one_of
from coscale.renamed import old_names

MODES = ("none", "truncate", "mask")
LEVELS = ("token", "sequence")


@dataclass(frozen=True)
class MismatchSettings:
    """How a loss corrects the engine/trainer mismatch when old log-probs come from an engine.

    The defaults are TRL 1.16's (``vllm_importance_sampling_correction=True``,
    ``vllm_importance_sampling_mode="sequence_mask"``, ``vllm_importance_sampling_clip_max=3.0``,
    no lower bound): sequences whose ratio ``prod_t pi_old / pi_engine`` exceeds 3 are left out
    of the policy term, the others weighted by their ratio. Rollouts sampled by the trainer's
    own model (the ``hf`` and ``cached`` backends, or vLLM with ``logprobs: trainer``) are never
    corrected, whatever is set here.

    Attributes:
        mode: ``none`` (engine log-probs are the old log-probs, uncorrected), ``truncate``
            (TIS: weight ``min(rho, cap)``) or ``mask`` (MIS: weight 0 where ``rho > cap``, else
            ``rho``).
        level: ``token`` (one ratio per token) or ``sequence`` (the product of a sequence's
            token ratios, ``exp`` of the summed log-ratio, shared by its tokens).
        cap: The ratio bound ``C``; > 0.
    """

    mode: str = "mask"
    level: str = "sequence"
    cap: float = 3.0

    def errors(self) -> list[str]:
        errors = one_of(MODES, mode=self.mode) + one_of(LEVELS, level=self.level)
        if not (is_number(self.cap) and self.cap > 0):
            errors.append(f"cap must be a number > 0, got {self.cap!r}")
        return errors


def mismatch_weights(
    trainer_logprobs: Tensor, engine_logprobs: Tensor, keep: Tensor, settings: MismatchSettings
) -> tuple[Tensor, Tensor]:
    """Per-token correction weights and where the cap acted.

    Args:
        trainer_logprobs: The trainer's old log-probs of the sampled tokens, ``[R, T]``.
        engine_logprobs: The engine's log-probs of the same tokens, ``[R, T]``; a NaN (a token
            the engine gave none for) counts as no mismatch, as in TRL.
        keep: True on completion tokens, ``[R, T]`` bool.
        settings: The mode, level and cap.

    Returns:
        ``weights`` ``[R, T]`` (float32 or wider, no gradient; 1 everywhere for mode ``none``)
        and ``capped`` ``[R, T]`` bool: kept tokens whose ratio exceeded the cap (truncated or
        masked).
    """
    with torch.no_grad():
        dtype = torch.promote_types(trainer_logprobs.dtype, torch.float32)
        gap = trainer_logprobs.to(dtype) - engine_logprobs.to(dtype)  # [R, T]
        gap = torch.nan_to_num(torch.where(keep, gap, 0), nan=0.0)  # [R, T] 0 on padding
        if settings.level == "sequence":
            gap = gap.sum(dim=1, keepdim=True)  # [R, 1] log of the product of token ratios
        ratio = torch.exp(gap).expand(keep.shape)  # [R, T]
        if settings.mode == "none":
            return torch.ones_like(ratio), torch.zeros_like(keep)
        over = (ratio > settings.cap) & keep  # [R, T]
        if settings.mode == "truncate":
            return ratio.clamp(max=settings.cap), over  # [R, T]
        return torch.where(over, 0, ratio), over  # [R, T]


# the classes' earlier names, for one release
__getattr__ = old_names(__name__, {"Mismatch": MismatchSettings})
