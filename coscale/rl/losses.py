"""Clipped policy-gradient losses: GRPO, Dr. GRPO and DAPO, one small class each.

All variants share the per-token PPO-style clipped surrogate (with an optional k3 KL term to a
reference policy) and differ only in how the masked per-token losses are aggregated:

- ``grpo``: mean over sequences of the token mean within each sequence;
- ``dr_grpo``: sum over all tokens / (num_sequences * max_tokens), a constant normaliser;
- ``dapo``: sum over all tokens / total number of masked tokens.

For exact gradient accumulation, pass ``num_sequences`` / ``num_tokens`` totals of the whole
update batch to every micro-batch call: the micro-batch losses then sum to the full-batch loss.
A variant is picked in YAML by ``class_path`` or in code by :func:`build_loss`.

Shapes: R rollouts (sequences) in this call, T completion tokens.
"""

from __future__ import annotations

import math
from abc import ABCMeta, abstractmethod
from dataclasses import dataclass

import torch
from torch import Tensor, nn


@dataclass
class LossOutput:
    """Result of a loss call.

    Attributes:
        loss: Scalar loss to back-propagate.
        metrics: Detached floats over this call's masked tokens: ``clip_ratio``,
            ``clip_ratio_low``, ``clip_ratio_high``, ``ratio_mean`` and, when reference
            log-probs are given, ``kl``.
    """

    loss: Tensor
    metrics: dict[str, float]


class PolicyLoss(nn.Module, metaclass=ABCMeta):
    """Base class: clipped surrogate per token plus ``beta`` * k3 KL; subclasses aggregate.

    Args:
        epsilon: Lower clip range, the ratio is clipped below at ``1 - epsilon``; ``>= 0``.
        epsilon_high: Upper clip range (ratio clipped above at ``1 + epsilon_high``);
            ``None`` means ``epsilon``. DAPO's "clip-higher" uses a larger value (e.g. 0.28).
        beta: Weight of the k3 KL estimate ``exp(ref - logp) - (ref - logp) - 1``; ``>= 0``.
            With ``beta > 0`` every call needs ``ref_logprobs``.
    """

    name: str = ""

    def __init__(
        self, epsilon: float = 0.2, epsilon_high: float | None = None, beta: float = 0.0
    ) -> None:
        super().__init__()
        errors = [
            f"{key}={value!r} must be finite and >= 0"
            for key, value in (("epsilon", epsilon), ("epsilon_high", epsilon_high), ("beta", beta))
            if value is not None and not (0 <= value < math.inf)
        ]
        if errors:
            raise ValueError(f"{type(self).__name__}: " + "; ".join(errors))
        self.epsilon = float(epsilon)
        self.epsilon_high = float(epsilon if epsilon_high is None else epsilon_high)
        self.beta = float(beta)

    def forward(
        self,
        logprobs: Tensor,
        old_logprobs: Tensor,
        advantages: Tensor,
        mask: Tensor,
        ref_logprobs: Tensor | None = None,
        num_sequences: int | None = None,
        num_tokens: int | None = None,
    ) -> LossOutput:
        """Computes the loss of one (micro-)batch.

        Args:
            logprobs: Log-probs of the sampled tokens under the current policy, ``[R, T]``;
                the only input that receives gradient.
            old_logprobs: Log-probs under the sampling policy, ``[R, T]``.
            advantages: One advantage per sequence, ``[R]``.
            mask: 1 (or True) on completion tokens, 0 on padding, ``[R, T]``.
            ref_logprobs: Log-probs under the reference policy, ``[R, T]``; needed when
                ``beta > 0``, otherwise only used for the ``kl`` metric.
            num_sequences: Sequences in the whole update batch (default: ``R``).
            num_tokens: Masked tokens in the whole update batch (default: this call's).

        Returns:
            The scalar loss and detached metrics.
        """
        self._check_inputs(logprobs, old_logprobs, advantages, mask, ref_logprobs)
        keep = mask.detach() != 0  # [R, T] bool
        adv = advantages.detach().unsqueeze(1)  # [R, 1]
        per_token, ratio, kl = self._per_token(logprobs, old_logprobs, adv, keep, ref_logprobs)
        sequences = _total("num_sequences", num_sequences, keep.shape[0])
        tokens = _total("num_tokens", num_tokens, int(keep.sum()))
        loss = self.aggregate(per_token, keep, sequences, tokens)  # []
        return LossOutput(loss, self._metrics(ratio, adv, keep, kl))

    def _per_token(self, logprobs, old_logprobs, adv, keep, ref_logprobs):
        """Per-token loss ``[R, T]`` (0 on padding), ratio ``[R, T]`` and k3 KL or None."""
        dtype = torch.promote_types(logprobs.dtype, torch.float32)
        logp = logprobs.to(dtype)  # [R, T]
        zero = logp.new_zeros(())
        # Padding gets log-ratio 0 so garbage values there never reach exp() or the gradient.
        log_ratio = torch.where(keep, logp - old_logprobs.detach().to(dtype), zero)  # [R, T]
        ratio = torch.exp(log_ratio)  # [R, T]
        adv = adv.to(dtype)  # [R, 1]
        clipped = torch.clamp(ratio, 1 - self.epsilon, 1 + self.epsilon_high)  # [R, T]
        per_token = -torch.minimum(ratio * adv, clipped * adv)  # [R, T]
        kl = None
        if ref_logprobs is not None:
            ref_gap = torch.where(keep, ref_logprobs.detach().to(dtype) - logp, zero)  # [R, T]
            kl = torch.exp(ref_gap) - ref_gap - 1  # [R, T] k3 estimator, >= 0
            if self.beta > 0:
                per_token = per_token + self.beta * kl  # [R, T]
        return torch.where(keep, per_token, zero), ratio, kl

    @abstractmethod
    def aggregate(self, per_token: Tensor, keep: Tensor, num_sequences: int, num_tokens: int):
        """Reduces per-token losses ``[R, T]`` (0 where ``keep`` is False) to a scalar, using
        the update-batch totals ``num_sequences`` and ``num_tokens`` (both >= 1)."""

    def _metrics(self, ratio: Tensor, adv: Tensor, keep: Tensor, kl: Tensor | None) -> dict:
        """Clip fractions, mean ratio and mean KL over this call's masked tokens."""
        with torch.no_grad():
            low = (ratio < 1 - self.epsilon) & (adv < 0) & keep  # [R, T] clipped below
            high = (ratio > 1 + self.epsilon_high) & (adv > 0) & keep  # [R, T] clipped above
            sums = {
                "clip_ratio": (low | high).sum(),
                "clip_ratio_low": low.sum(),
                "clip_ratio_high": high.sum(),
                "ratio_mean": torch.where(keep, ratio, 0).sum(),
            }
            if kl is not None:
                sums["kl"] = torch.where(keep, kl, 0).sum()
            values = torch.stack([v.to(ratio.dtype) for v in (keep.sum(), *sums.values())])
            count, *totals = values.tolist()  # one device sync; divide in float64 on the host
        return {key: total / max(count, 1) for key, total in zip(sums, totals)}

    def _check_inputs(self, logprobs, old_logprobs, advantages, mask, ref_logprobs) -> None:
        """Raises one ``ValueError`` listing every shape problem."""
        if not isinstance(logprobs, Tensor) or logprobs.dim() != 2:
            raise ValueError(f"logprobs must be a 2-D tensor [R, T], got {_shape(logprobs)}")
        want = tuple(logprobs.shape)
        same = {"old_logprobs": old_logprobs, "mask": mask}
        if ref_logprobs is not None:
            same["ref_logprobs"] = ref_logprobs
        errors = [
            f"{key} shape {_shape(value)} must equal logprobs shape {want}"
            for key, value in same.items()
            if _shape(value) != want
        ]
        if _shape(advantages) != want[:1]:
            errors.append(f"advantages shape {_shape(advantages)} must be [R] = {want[:1]}")
        if self.beta > 0 and ref_logprobs is None:
            errors.append(f"ref_logprobs is required when beta={self.beta} > 0 (or set beta=0)")
        if errors:
            raise ValueError(f"{type(self).__name__} inputs: " + "; ".join(errors))

    def extra_repr(self) -> str:
        extra = {k: v for k, v in vars(self).items() if not k.startswith("_") and k != "training"}
        return ", ".join(f"{k}={v}" for k, v in extra.items())


class GRPOLoss(PolicyLoss):
    """GRPO: mean over sequences of the token mean within each sequence (``num_tokens`` unused)."""

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
    """

    name = "dr_grpo"

    def __init__(
        self,
        max_tokens: int,
        epsilon: float = 0.2,
        epsilon_high: float | None = None,
        beta: float = 0.0,
    ) -> None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"DrGRPOLoss: max_tokens={max_tokens!r} must be a positive int")
        super().__init__(epsilon=epsilon, epsilon_high=epsilon_high, beta=beta)
        self.max_tokens = max_tokens

    def aggregate(self, per_token, keep, num_sequences, num_tokens):
        return per_token.sum() / (num_sequences * self.max_tokens)  # []


class DAPOLoss(PolicyLoss):
    """DAPO: token-level mean over the whole batch (sum / total masked tokens)."""

    name = "dapo"

    def aggregate(self, per_token, keep, num_sequences, num_tokens):
        return per_token.sum() / num_tokens  # []


LOSSES: dict[str, type[PolicyLoss]] = {cls.name: cls for cls in (GRPOLoss, DrGRPOLoss, DAPOLoss)}


def build_loss(name: str, **kwargs) -> PolicyLoss:
    """Builds a loss by name.

    Args:
        name: One of ``"grpo"``, ``"dr_grpo"``, ``"dapo"``.
        **kwargs: Constructor arguments of the chosen class.

    Raises:
        ValueError: For an unknown name (the message lists the choices).
    """
    if name not in LOSSES:
        raise ValueError(f"loss name={name!r} is not one of {sorted(LOSSES)}")
    return LOSSES[name](**kwargs)


def _total(key: str, value: int | Tensor | None, default: int) -> int:
    """Validates a batch total; ``None`` -> ``default`` (at least 1 so empty batches give 0)."""
    if value is None:
        return max(default, 1)
    if isinstance(value, Tensor) and value.numel() == 1 and not value.is_floating_point():
        value = int(value.item())
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key}={value!r} must be a positive int")
    return value


def _shape(x: object) -> tuple | str:
    return tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
