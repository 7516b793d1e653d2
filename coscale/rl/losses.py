"""Policy-gradient losses, one small class each: GRPO, Dr. GRPO, DAPO, GSPO and CISPO.

GRPO, Dr. GRPO and DAPO share the per-token PPO-style clipped surrogate of
:class:`~coscale.rl.policy_loss.PolicyLoss` and differ only in how they aggregate the masked
per-token losses; GSPO clips one ratio per sequence, CISPO caps each token's importance weight
(each class says how). Every variant takes the base's ``beta`` (KL), ``entropy_coef`` and
``mismatch`` (engine/trainer correction) settings. A variant is picked by its class (in YAML by
``class_path``, built by :func:`as_loss`); ``docs/losses.md`` lists them with the TRL settings
that give the same numbers.

Shapes: R rollouts (sequences) in this call, T completion tokens.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from coscale.checks import imported, is_number
from coscale.renamed import old_names
from coscale.rl.mismatch import MismatchSettings
from coscale.rl.policy_loss import LossOutput, PolicyLoss

__all__ = [
    "CISPOLoss",
    "DAPOLoss",
    "DrGRPOLoss",
    "GRPOLoss",
    "GSPOLoss",
    "LossOutput",
    "MismatchSettings",
    "PolicyLoss",
    "as_loss",
]


class GRPOLoss(PolicyLoss):
    """GRPO: mean over sequences of the token mean within each sequence (``num_tokens`` only
    normalises the entropy bonus, a token mean like every loss's)."""

    name = "grpo"

    def aggregate(self, per_token, keep, num_sequences, num_tokens):
        lengths = keep.sum(dim=1).clamp(min=1)  # [R] empty rows contribute 0
        return (per_token.sum(dim=1) / lengths).sum() / num_sequences  # []


class DrGRPOLoss(PolicyLoss):
    """Dr. GRPO: token sum over the batch / (num_sequences * max_tokens), no length bias.

    Args:
        max_tokens: The constant normaliser, usually the generation budget
            (``max_new_tokens``); positive int.
        epsilon: See :class:`PolicyLoss`.
        epsilon_high: See :class:`PolicyLoss`.
        beta: See :class:`PolicyLoss`.
        entropy_coef: See :class:`PolicyLoss`.
        mismatch: See :class:`PolicyLoss`.
    """

    name = "dr_grpo"

    def __init__(
        self,
        max_tokens: int,
        epsilon: float = 0.2,
        epsilon_high: float | None = None,
        beta: float = 0.0,
        entropy_coef: float = 0.0,
        mismatch: MismatchSettings = MismatchSettings(),
    ) -> None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"DrGRPOLoss: max_tokens={max_tokens!r} must be a positive int")
        super().__init__(epsilon, epsilon_high, beta, entropy_coef, mismatch)
        self.max_tokens = max_tokens

    def aggregate(self, per_token, keep, num_sequences, num_tokens):
        return per_token.sum() / (num_sequences * self.max_tokens)  # []


class DAPOLoss(PolicyLoss):
    """DAPO: token-level mean over the whole batch (sum / total masked tokens)."""

    name = "dapo"

    def aggregate(self, per_token, keep, num_sequences, num_tokens):
        return per_token.sum() / num_tokens  # []


class GSPOLoss(GRPOLoss):
    """GSPO: the clipped surrogate on one ratio per sequence, aggregated like GRPO.

    The sequence's ratio is the geometric mean of its token ratios, ``s = exp(mean_t log(pi /
    pi_old))``; each token carries ``sg(s) * pi_t / sg(pi_t)`` (``sg``: stop-gradient), whose
    value is ``s`` and whose gradient is ``s * grad log pi_t`` (the GSPO paper's GSPO-token form
    with a sequence's advantage on each token; the same loss and gradient as TRL's
    ``importance_sampling_level="sequence"``). The paper's clip range is much narrower than
    GRPO's (e.g. ``epsilon=3e-4, epsilon_high=4e-4``); the defaults are the base's.
    """

    name = "gspo"

    def log_ratio(self, logp, old, keep):
        lengths = keep.sum(dim=1, keepdim=True).clamp(min=1)  # [R, 1]
        sequence = (logp - old).sum(dim=1, keepdim=True) / lengths  # [R, 1] log s
        return torch.where(keep, sequence.detach() + logp - logp.detach(), 0)  # [R, T]


class CISPOLoss(DAPOLoss):
    """CISPO: ``-sg(min(ratio, max_weight)) * A * log pi`` per token, aggregated like DAPO.

    Every token keeps a gradient (nothing is clipped away as in PPO); only its importance
    weight is capped, and the weight carries no gradient (MiniMax-M1; ScaleRL's ``epsilon_max``).
    The clip metrics count the tokens whose weight was capped (``clip_ratio_high``).

    Args:
        max_weight: The cap on the importance weight; > 0. TRL's ``epsilon_high`` under
            ``loss_type="cispo"`` (TRL and ScaleRL recommend 5.0).
        beta: See :class:`PolicyLoss`.
        entropy_coef: See :class:`PolicyLoss`.
        mismatch: See :class:`PolicyLoss`.
    """

    name = "cispo"

    def __init__(
        self,
        max_weight: float = 5.0,
        beta: float = 0.0,
        entropy_coef: float = 0.0,
        mismatch: MismatchSettings = MismatchSettings(),
    ) -> None:
        if not (is_number(max_weight) and max_weight > 0):
            raise ValueError(f"CISPOLoss: max_weight={max_weight!r} must be a number > 0")
        super().__init__(beta=beta, entropy_coef=entropy_coef, mismatch=mismatch)
        self.max_weight = float(max_weight)

    def surrogate(self, ratio, adv, logp):
        weight = torch.clamp(ratio, max=self.max_weight).detach()  # [R, T] no gradient
        return -weight * adv * logp  # [R, T]

    def clipped(self, ratio, adv):
        return torch.zeros_like(ratio, dtype=torch.bool), ratio > self.max_weight  # [R, T] each


def as_loss(value: PolicyLoss | Mapping[str, Any] | None) -> PolicyLoss | None:
    """``value`` as a loss object: a ``{"class_path": ..., "init_args": {...}}`` mapping (YAML's
    form, e.g. from :func:`coscale.integrations.trl.from_grpo_config`) is built; a loss or None
    is returned as it is.

    Raises:
        ValueError: For a mapping without ``class_path``, or one naming no ``PolicyLoss``.
    """
    if value is None or isinstance(value, PolicyLoss):
        return value
    path = value.get("class_path") if isinstance(value, Mapping) else None
    if not isinstance(path, str) or "." not in path:
        raise ValueError(f"loss must be a PolicyLoss or a class_path mapping, got {value!r}")
    cls = imported(path, "loss.class_path")
    if not (isinstance(cls, type) and issubclass(cls, PolicyLoss)):
        raise ValueError(f"loss class_path={path!r} names no PolicyLoss class")
    return cls(**dict(value.get("init_args") or {}))


# the classes' earlier names, for one release
__getattr__ = old_names(__name__, {"Mismatch": MismatchSettings})
