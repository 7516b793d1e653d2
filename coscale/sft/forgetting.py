"""Gradient-similarity masking against forgetting (arXiv 2601.21577; docs/forgetting-guard.md).

While fine-tuning on new data, the gradient of the loss on already-mastered data (``g_old``) is
compared with the gradient on the new data (``g_new``, what the optimiser is about to use).
A coordinate whose two gradients agree in sign (``g_new * g_old >= 0``) is *collaborative*: a
small step down ``g_new`` there does not raise the mastered loss. A *conflicting* one is frozen
for the step. Dropping only conflicting terms from ``-lr * g_new . g_old`` means a masked SGD
step cannot raise the mastered loss to first order.

Granularities (:data:`GRANULARITIES`):

* ``parameter``: every coordinate on its own.
* ``neuron``: a whole output row of a weight (dim 0: ``nn.Linear`` / ``nn.Conv*`` output unit,
  ``nn.Embedding`` token) is kept or frozen together, by the sign of the sum of its products.
  A 1-D parameter (bias, norm scale) has one entry per output unit, so each entry is its own
  neuron there and both granularities agree. (HF ``Conv1D`` of GPT-2 stores ``[in, out]``; its
  rows are input units.)

Only trainable parameters (``requires_grad``) with a gradient are guarded; a parameter the
mastered set does not reach (no ``g_old``) is kept. Core file: plain PyTorch, no Lightning.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch

from coscale.checks import at_least, one_of
from coscale.distributed import sum_over_ranks

GRANULARITIES = ("parameter", "neuron")
"""Mask granularities; :class:`GuardSettings` also takes ``"none"`` (off)."""


@dataclass(frozen=True)
class GuardSettings:
    """The forgetting guard of an SFT (off by default).

    Attributes:
        mode: ``none`` (off), or freeze the coordinates whose gradient opposes the mastered
            set's per ``parameter`` or per ``neuron`` (output row). Logs ``train/masked_frac``
            and the mastered-set loss (``train/mastered_loss_start`` / ``_end``).
        refresh_every: Optimiser steps between recomputations of the mastered gradient.
        batch_size: Mastered pairs per recomputation, all ranks together (the set is cycled
            through in a fixed shuffled order); also the batch of the loss measurement.
    """

    mode: Literal["none", "parameter", "neuron"] = "none"
    refresh_every: int = 1
    batch_size: int = 16

    @property
    def on(self) -> bool:
        return self.mode != "none"

    def errors(self) -> list[str]:
        counts = {"refresh_every": self.refresh_every, "batch_size": self.batch_size}
        return one_of(("none", *GRANULARITIES), mode=self.mode) + at_least(1, **counts)


LossSum = Callable[[Any], tuple[torch.Tensor, int]]
"""``batch -> (loss summed over its target tokens, number of target tokens)``."""


def check_granularity(granularity: str) -> None:
    """Raises ``ValueError`` unless ``granularity`` is one of :data:`GRANULARITIES`."""
    if errors := one_of(GRANULARITIES, granularity=granularity):
        raise ValueError(errors[0])


def keep_mask(g_new: torch.Tensor, g_old: torch.Tensor, granularity: str) -> torch.Tensor:
    """Boolean mask shaped like ``g_new``: True where the coordinate may be updated.

    Args:
        g_new: Gradient on the new data.
        g_old: Gradient on the mastered data, same shape.
        granularity: ``parameter`` (per coordinate) or ``neuron`` (per row along dim 0).
    """
    check_granularity(granularity)
    if g_new.shape != g_old.shape:
        raise ValueError(f"g_new {tuple(g_new.shape)} and g_old {tuple(g_old.shape)} differ")
    products = g_new.float() * g_old.float()  # float32: row sums of bf16 products lose the sign
    if granularity == "parameter" or products.dim() < 2:
        return products >= 0
    rows = products.flatten(1).sum(dim=1) >= 0  # [out]
    return rows.view(-1, *[1] * (products.dim() - 1)).expand_as(products)


def guarded_parameters(module: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """Trainable parameters of ``module`` by name (frozen ones, ``requires_grad=False``, skipped)."""
    return {name: p for name, p in module.named_parameters() if p.requires_grad}


def reference_gradient(
    params: Mapping[str, torch.nn.Parameter], batches: Iterable[Any], loss_sum: LossSum
) -> tuple[dict[str, torch.Tensor], float]:
    """Token-mean gradient and loss of the mastered set over ``batches``, all ranks together.

    Each rank passes its own share of the set; the summed gradients, losses and token counts are
    all-reduced, so the result is the gradient of the whole set's token mean on every rank
    (whatever the number of ranks). ``torch.autograd.grad`` leaves ``.grad`` untouched and does
    not fire DDP's gradient hooks. A parameter no batch reaches gets a zero gradient.
    """
    names, tensors = list(params), list(params.values())
    sums = [torch.zeros_like(p, dtype=torch.float32) for p in tensors]
    device = tensors[0].device if tensors else torch.device("cpu")
    loss_total = torch.zeros((), dtype=torch.float64, device=device)
    tokens = torch.zeros((), dtype=torch.float64, device=device)
    with torch.enable_grad():
        for batch in batches:
            loss, n = loss_sum(batch)
            grads = torch.autograd.grad(loss, tensors, allow_unused=True)
            for acc, g in zip(sums, grads):
                if g is not None:
                    acc.add_(g.float())
            loss_total += loss.detach().double()
            tokens += n
    for total in [*sums, loss_total, tokens]:
        sum_over_ranks(total)  # in place
    scale = 1.0 / max(float(tokens), 1.0)
    return {k: g.mul_(scale) for k, g in zip(names, sums)}, float(loss_total) * scale


@torch.no_grad()
def mean_loss(batches: Iterable[Any], loss_sum: LossSum, device: Any = "cpu") -> float:
    """Token-mean loss over ``batches`` (this rank's share), all ranks together."""
    loss_total = torch.zeros((), dtype=torch.float64, device=device)
    tokens = torch.zeros((), dtype=torch.float64, device=device)
    for batch in batches:
        loss, n = loss_sum(batch)
        loss_total += loss.double()
        tokens += n
    for total in (loss_total, tokens):
        sum_over_ranks(total)  # in place
    return float(loss_total) / max(float(tokens), 1.0)


class ForgettingGuard:
    """Masks a module's gradients against a reference (mastered-set) gradient.

    Call :meth:`set_reference` with ``g_old`` (refresh it as often as wanted), then, between
    ``backward`` and the optimiser step, :meth:`mask_gradients`; after the step, :meth:`restore`.
    Masked coordinates get a zero gradient *and* are put back to their values after the step,
    so momentum and weight decay (AdamW) do not move them either: they are frozen for the step.

    Args:
        module: The model whose trainable parameters are guarded.
        granularity: ``parameter`` or ``neuron`` (see the module docstring).
    """

    def __init__(self, module: torch.nn.Module, granularity: str) -> None:
        check_granularity(granularity)
        self.module, self.granularity = module, granularity
        self.reference: dict[str, torch.Tensor] | None = None
        self._frozen: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def set_reference(self, g_old: Mapping[str, torch.Tensor]) -> None:
        """Stores the mastered-set gradient by parameter name (detached)."""
        self.reference = {k: v.detach() for k, v in g_old.items()}

    @torch.no_grad()
    def mask_gradients(self) -> float:
        """Zeroes the conflicting gradient coordinates in place; returns the share frozen.

        The share is over all coordinates of the trainable parameters that have a gradient.
        """
        if self.reference is None:
            raise ValueError("ForgettingGuard.mask_gradients: call set_reference first")
        self._frozen, frozen, total = [], 0, 0
        for name, p in guarded_parameters(self.module).items():
            if p.grad is None:
                continue
            total += p.numel()
            if name not in self.reference:
                continue
            drop = ~keep_mask(p.grad, self.reference[name], self.granularity)
            if (n := int(drop.sum())) > 0:
                p.grad.masked_fill_(drop, 0.0)
                self._frozen.append((p, drop, p[drop].clone()))
                frozen += n
        return frozen / total if total else 0.0

    @torch.no_grad()
    def restore(self) -> None:
        """Puts the coordinates frozen by the last :meth:`mask_gradients` back (after a step)."""
        for p, drop, values in self._frozen:
            p[drop] = values
        self._frozen = []
