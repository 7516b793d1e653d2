"""What every policy loss shares: the per-token terms, the batch totals, metrics and checks.

A loss call computes, per completion token, a policy term from the ratio
``pi / pi_old`` and the sequence's advantage (the variant's :meth:`PolicyLoss.surrogate`, from
the variant's :meth:`PolicyLoss.log_ratio`), weighted by the engine/trainer mismatch correction
when the engine's log-probs are given (:mod:`coscale.rl.mismatch`), plus ``beta`` times the k3
KL to a reference policy; the variant reduces these to a scalar (:meth:`PolicyLoss.aggregate`)
and ``entropy_coef`` times the mean token entropy is subtracted. The variants are in
:mod:`coscale.rl.losses`.

For exact gradient accumulation, pass ``num_sequences`` / ``num_tokens`` totals of the whole
update batch to every micro-batch call: the micro-batch losses then sum to the full-batch loss.

Shapes: R rollouts (sequences) in this call, T completion tokens.
"""

from __future__ import annotations

from abc import ABCMeta, abstractmethod
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from coscale.checks import as_group, is_number
from coscale.rl.mismatch import MismatchSettings, mismatch_weights


@dataclass
class LossOutput:
    """Result of a loss call.

    Attributes:
        loss: Scalar loss to back-propagate.
        metrics: Detached floats over this call's masked tokens: ``clip_ratio``,
            ``clip_ratio_low``, ``clip_ratio_high``, ``ratio_mean``; ``kl`` when reference
            log-probs are given; ``entropy`` when token entropies are; ``is_ratio_mean`` (the
            mean mismatch weight, 0 where masked) and ``is_capped`` (the share of tokens whose
            ratio exceeded the cap) when the engine's log-probs are.
    """

    loss: Tensor
    metrics: dict[str, float]


class PolicyLoss(nn.Module, metaclass=ABCMeta):
    """Base class: a policy term per token plus ``beta`` * k3 KL; subclasses aggregate.

    Args:
        epsilon: Lower clip range, the ratio is clipped below at ``1 - epsilon``; ``>= 0``.
        epsilon_high: Upper clip range (ratio clipped above at ``1 + epsilon_high``);
            ``None`` means ``epsilon``. DAPO's "clip-higher" uses a larger value (e.g. 0.28).
        beta: Weight of the k3 KL estimate ``exp(ref - logp) - (ref - logp) - 1``; ``>= 0``.
            With ``beta > 0`` every call needs ``ref_logprobs``.
        entropy_coef: Entropy bonus: the loss is lowered by ``entropy_coef`` times the mean
            token entropy of the policy over the update batch's completion tokens (TRL's
            ``entropy_coef``); ``>= 0``. With ``entropy_coef > 0`` every call needs ``entropy``.
        mismatch: The engine/trainer mismatch correction
            (:class:`~coscale.rl.mismatch.MismatchSettings`, a mapping in YAML), applied to the
            calls given ``sampling_logprobs``.
    """

    name: str = ""

    def __init__(
        self,
        epsilon: float = 0.2,
        epsilon_high: float | None = None,
        beta: float = 0.0,
        entropy_coef: float = 0.0,
        mismatch: MismatchSettings = MismatchSettings(),
    ) -> None:
        super().__init__()
        mismatch = as_group(MismatchSettings, mismatch)
        values = {"epsilon": epsilon, "epsilon_high": epsilon_high, "beta": beta}
        errors = [
            f"{key}={value!r} must be finite and >= 0"
            for key, value in (values | {"entropy_coef": entropy_coef}).items()
            if value is not None and not (is_number(value) and value >= 0)
        ]
        errors += [f"mismatch.{e}" for e in mismatch.errors()]
        if errors:
            raise ValueError(f"{type(self).__name__}: " + "; ".join(errors))
        self.epsilon = float(epsilon)
        self.epsilon_high = float(epsilon if epsilon_high is None else epsilon_high)
        self.beta, self.entropy_coef, self.mismatch = float(beta), float(entropy_coef), mismatch

    def forward(
        self,
        logprobs: Tensor,
        old_logprobs: Tensor,
        advantages: Tensor,
        mask: Tensor,
        ref_logprobs: Tensor | None = None,
        num_sequences: int | None = None,
        num_tokens: int | None = None,
        entropy: Tensor | None = None,
        sampling_logprobs: Tensor | None = None,
    ) -> LossOutput:
        """Computes the loss of one (micro-)batch.

        Args:
            logprobs: Log-probs of the sampled tokens under the current policy, ``[R, T]``;
                with ``entropy``, the only inputs that receive gradient.
            old_logprobs: Log-probs under the policy before the update (the trainer's), ``[R, T]``.
            advantages: One advantage per sequence, ``[R]``.
            mask: 1 (or True) on completion tokens, 0 on padding, ``[R, T]``.
            ref_logprobs: Log-probs under the reference policy, ``[R, T]``; needed when
                ``beta > 0``, otherwise only used for the ``kl`` metric.
            num_sequences: Sequences in the whole update batch (default: ``R``).
            num_tokens: Masked tokens in the whole update batch (default: this call's).
            entropy: Token entropies of the current policy, ``[R, T]``; needed when
                ``entropy_coef > 0``, otherwise only used for the ``entropy`` metric.
            sampling_logprobs: The engine's log-probs of the sampled tokens, ``[R, T]``, when
                the tokens were sampled by an engine other than the trainer: the policy term is
                then weighted by ``mismatch`` against ``old_logprobs``.

        Returns:
            The scalar loss and detached metrics.
        """
        self._check_inputs(
            logprobs, old_logprobs, advantages, mask, ref_logprobs, entropy, sampling_logprobs
        )
        keep = mask.detach() != 0  # [R, T] bool
        dtype = torch.promote_types(logprobs.dtype, torch.float32)
        # Padding gets 0 so garbage values there never reach exp() or the gradient.
        logp = torch.where(keep, logprobs.to(dtype), 0)  # [R, T]
        old = torch.where(keep, old_logprobs.detach().to(dtype), 0)  # [R, T]
        adv = advantages.detach().to(dtype).unsqueeze(1)  # [R, 1]
        ratio = torch.exp(self.log_ratio(logp, old, keep))  # [R, T]
        per_token = self.surrogate(ratio, adv, logp)  # [R, T]
        weights = capped = kl = None
        if sampling_logprobs is not None:
            weights, capped = mismatch_weights(old, sampling_logprobs, keep, self.mismatch)
            per_token = per_token * weights  # [R, T] the policy term only, as in TRL
        if ref_logprobs is not None:
            ref_gap = torch.where(keep, ref_logprobs.detach().to(dtype) - logp, 0)  # [R, T]
            kl = torch.exp(ref_gap) - ref_gap - 1  # [R, T] k3 estimator, >= 0
            if self.beta > 0:
                per_token = per_token + self.beta * kl  # [R, T]
        per_token = torch.where(keep, per_token, 0)  # [R, T]
        sequences = _total("num_sequences", num_sequences, keep.shape[0])
        tokens = _total("num_tokens", num_tokens, int(keep.sum()))
        loss = self.aggregate(per_token, keep, sequences, tokens)  # []
        if self.entropy_coef > 0:
            mean_entropy = torch.where(keep, entropy.to(dtype), 0).sum() / tokens  # []
            loss = loss - self.entropy_coef * mean_entropy  # []
        extra = {"kl": kl, "entropy": entropy, "is_ratio_mean": weights, "is_capped": capped}
        return LossOutput(loss, self._metrics(ratio, adv, keep, extra))

    def log_ratio(self, logp: Tensor, old: Tensor, keep: Tensor) -> Tensor:
        """``log(pi / pi_old)`` per token, ``[R, T]``, 0 on padding (inputs are 0 there)."""
        return logp - old  # [R, T]

    def surrogate(self, ratio: Tensor, adv: Tensor, logp: Tensor) -> Tensor:
        """The policy term per token, ``[R, T]``: the negated clipped surrogate
        ``-min(ratio * A, clip(ratio, 1 - epsilon, 1 + epsilon_high) * A)``."""
        clipped = torch.clamp(ratio, 1 - self.epsilon, 1 + self.epsilon_high)  # [R, T]
        return -torch.minimum(ratio * adv, clipped * adv)  # [R, T]

    def clipped(self, ratio: Tensor, adv: Tensor) -> tuple[Tensor, Tensor]:
        """Where the clip acts, below and above, ``[R, T]`` bool each (padding included)."""
        low = (ratio < 1 - self.epsilon) & (adv < 0)  # [R, T]
        high = (ratio > 1 + self.epsilon_high) & (adv > 0)  # [R, T]
        return low, high

    @abstractmethod
    def aggregate(self, per_token: Tensor, keep: Tensor, num_sequences: int, num_tokens: int):
        """Reduces per-token losses ``[R, T]`` (0 where ``keep`` is False) to a scalar, using
        the update-batch totals ``num_sequences`` and ``num_tokens`` (both >= 1)."""

    def _metrics(self, ratio: Tensor, adv: Tensor, keep: Tensor, extra: dict) -> dict:
        """Clip fractions, mean ratio and the given extras' means over this call's masked tokens."""
        with torch.no_grad():
            low, high = (c & keep for c in self.clipped(ratio, adv))  # [R, T] each
            sums = {
                "clip_ratio": (low | high).sum(),
                "clip_ratio_low": low.sum(),
                "clip_ratio_high": high.sum(),
                "ratio_mean": torch.where(keep, ratio, 0).sum(),
            }
            for key, value in extra.items():
                if value is not None:
                    sums[key] = torch.where(keep, value.to(ratio.dtype), 0).sum()
            values = torch.stack([v.to(ratio.dtype) for v in (keep.sum(), *sums.values())])
            count, *totals = values.tolist()  # one device sync; divide in float64 on the host
        return {key: total / max(count, 1) for key, total in zip(sums, totals)}

    def _check_inputs(self, logprobs, old_logprobs, advantages, mask, ref, entropy, sampling):
        """Raises one ``ValueError`` listing every shape problem."""
        if not isinstance(logprobs, Tensor) or logprobs.dim() != 2:
            raise ValueError(f"logprobs must be a 2-D tensor [R, T], got {_shape(logprobs)}")
        want = tuple(logprobs.shape)
        same = {"old_logprobs": old_logprobs, "mask": mask}
        same |= {"ref_logprobs": ref, "entropy": entropy, "sampling_logprobs": sampling}
        errors = [
            f"{key} shape {_shape(value)} must equal logprobs shape {want}"
            for key, value in same.items()
            if value is not None and _shape(value) != want
        ]
        if _shape(advantages) != want[:1]:
            errors.append(f"advantages shape {_shape(advantages)} must be [R] = {want[:1]}")
        if self.beta > 0 and ref is None:
            errors.append(f"ref_logprobs is required when beta={self.beta} > 0 (or set beta=0)")
        if self.entropy_coef > 0 and entropy is None:
            errors.append(f"entropy is required when entropy_coef={self.entropy_coef} > 0")
        if errors:
            raise ValueError(f"{type(self).__name__} inputs: " + "; ".join(errors))

    def extra_repr(self) -> str:
        extra = {k: v for k, v in vars(self).items() if not k.startswith("_") and k != "training"}
        return ", ".join(f"{k}={v}" for k, v in extra.items())


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
