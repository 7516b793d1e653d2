"""Group-relative advantages for GRPO-style RL with groups of different sizes in one batch.

CoScale-RL gives every problem its own Rollout N, so one batch holds groups of unequal size
and no ``R % G == 0`` rule applies. Each rollout carries the id of its group (problem);
statistics are gathered per group with ``index_add_`` / ``scatter_reduce`` (no Python loop
over groups) and broadcast back to the rollouts.

Shapes: R total rollouts (sum of per-problem N), Gn number of groups in the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

SCALES = ("group", "batch", "none")


@dataclass(frozen=True)
class Advantages:
    """Advantages of one batch and the per-group statistics behind them.

    Attributes:
        advantages: Advantage of every rollout, ``[R]``; exactly 0 in zero-std groups.
        group_mean: Mean reward of every group, ``[Gn]``.
        group_std: Unbiased (correction=1) reward std of every group, ``[Gn]``; 0 for size 1.
        zero_std: True where all rewards of the group are equal (no learning signal), ``[Gn]``.
        sizes: Number of rollouts in every group, ``[Gn]``.
    """

    advantages: Tensor
    group_mean: Tensor
    group_std: Tensor
    zero_std: Tensor
    sizes: Tensor

    @property
    def num_groups(self) -> int:
        """Number of groups Gn."""
        return int(self.sizes.numel())

    @property
    def zero_std_fraction(self) -> float:
        """Fraction of groups without signal (all rewards equal)."""
        return float(self.zero_std.float().mean()) if self.num_groups else 0.0


def group_advantages(
    rewards: Tensor, group_ids: Tensor, scale: str = "group", eps: float = 1e-4
) -> Advantages:
    """Computes group-relative advantages ``A = (r - mean_group) / scale``.

    Args:
        rewards: Reward of every rollout, ``[R]``, finite.
        group_ids: Group (problem) of every rollout, integer ``[R]``; the ids used must be
            exactly ``0..Gn-1`` (any order, any group sizes).
        scale: ``"group"`` divides by ``std_group + eps`` (GRPO); ``"batch"`` divides by the
            unbiased std of all rewards in the batch ``+ eps``; ``"none"`` does not divide
            (Dr. GRPO).
        eps: Added to the std before dividing, ``>= 0``.

    Returns:
        The advantages and per-group statistics. Rows of a group whose rewards are all equal
        (including groups of one rollout) get an advantage of exactly 0.

    Raises:
        ValueError: On bad shapes, dtypes, scale, eps, non-contiguous group ids or
            non-finite rewards (all problems are reported at once).
    """
    _validate(rewards, group_ids, scale, eps)
    out_dtype = rewards.dtype if rewards.is_floating_point() else torch.get_default_dtype()
    r = rewards.detach().to(torch.float64)  # [R] statistics in float64
    gid = group_ids.long()  # [R]
    sizes = torch.bincount(gid)  # [Gn]
    num_groups = sizes.numel()
    mean = _group_sum(r, gid, num_groups) / sizes  # [Gn]
    centered = r - mean[gid]  # [R]
    sq_sum = _group_sum(centered**2, gid, num_groups)  # [Gn]
    std = torch.sqrt(sq_sum / (sizes - 1).clamp(min=1))  # [Gn]; size 1 -> 0
    zero_std = _group_max(r, gid, num_groups) == -_group_max(-r, gid, num_groups)  # [Gn]
    std = torch.where(zero_std, torch.zeros_like(std), std)  # [Gn] exact 0 for equal rewards
    denom = _denominator(r, gid, std, scale, eps)  # [R]
    safe = torch.where(denom > 0, denom, torch.ones_like(denom))  # [R] avoid 0/0 on eps=0
    adv = torch.where(zero_std[gid], torch.zeros_like(centered), centered / safe)  # [R]
    return Advantages(
        advantages=adv.to(out_dtype),
        group_mean=mean.to(out_dtype),
        group_std=std.to(out_dtype),
        zero_std=zero_std,
        sizes=sizes,
    )


def _denominator(r: Tensor, gid: Tensor, std: Tensor, scale: str, eps: float) -> Tensor:
    """Per-rollout divisor ``[R]`` for the chosen scale."""
    if scale == "group":
        return std[gid] + eps  # [R]
    if scale == "batch":
        batch_std = r.std(correction=1) if r.numel() > 1 else r.new_zeros(())
        return (batch_std + eps).expand_as(r)  # [R]
    return torch.ones_like(r)  # [R] scale == "none"


def _group_sum(values: Tensor, gid: Tensor, num_groups: int) -> Tensor:
    """Sum of ``values`` ``[R]`` per group -> ``[Gn]``."""
    return values.new_zeros(num_groups).index_add_(0, gid, values)


def _group_max(values: Tensor, gid: Tensor, num_groups: int) -> Tensor:
    """Max of ``values`` ``[R]`` per group -> ``[Gn]`` (every group is non-empty)."""
    init = values.new_full((num_groups,), float("-inf"))
    return init.scatter_reduce(0, gid, values, reduce="amax", include_self=True)


def _validate(rewards: Tensor, group_ids: Tensor, scale: str, eps: float) -> None:
    """Collects every input problem and raises one ``ValueError``."""
    errors = []
    if scale not in SCALES:
        errors.append(f"scale={scale!r} is not one of {list(SCALES)}")
    if not (eps >= 0 and eps < float("inf")):
        errors.append(f"eps={eps!r} must be finite and >= 0")
    if not isinstance(rewards, Tensor) or rewards.dim() != 1 or rewards.numel() == 0:
        errors.append(f"rewards must be a non-empty 1-D tensor [R], got {_describe(rewards)}")
    elif not torch.isfinite(rewards.detach().double()).all():
        bad = rewards[~torch.isfinite(rewards.detach().double())].tolist()[:5]
        errors.append(f"rewards must be finite, got non-finite values {bad}")
    errors.extend(_group_id_errors(rewards, group_ids))
    if errors:
        raise ValueError("group_advantages: " + "; ".join(errors))


def _group_id_errors(rewards: Tensor, group_ids: Tensor) -> list[str]:
    """Problems with ``group_ids``: dtype, shape, and ids not exactly ``0..Gn-1``."""
    if not isinstance(group_ids, Tensor) or group_ids.dim() != 1:
        return [f"group_ids must be a 1-D integer tensor [R], got {_describe(group_ids)}"]
    if group_ids.is_floating_point() or group_ids.is_complex() or group_ids.dtype == torch.bool:
        return [f"group_ids must have an integer dtype, got {group_ids.dtype}"]
    errors = []
    if isinstance(rewards, Tensor) and group_ids.shape != rewards.shape:
        errors.append(
            f"group_ids shape {tuple(group_ids.shape)} must equal rewards shape "
            f"{tuple(rewards.shape)}"
        )
    if group_ids.numel() == 0:
        return errors
    low = int(group_ids.min())
    if low < 0:
        return [*errors, f"group_ids must be >= 0, got min {low}"]
    present = torch.bincount(group_ids.long()) > 0
    if not present.all():
        missing = torch.nonzero(~present).flatten().tolist()[:5]
        errors.append(
            f"group_ids must be contiguous 0..Gn-1 (Gn={present.numel()}), ids {missing} "
            "are missing; renumber the groups"
        )
    return errors


def _describe(x: object) -> str:
    """Short description of a bad argument for error messages."""
    if isinstance(x, Tensor):
        return f"tensor of shape {tuple(x.shape)} and dtype {x.dtype}"
    return f"{type(x).__name__}"
