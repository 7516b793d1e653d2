"""The GRPO update's micro-batches: which rollouts share a forward/backward pass, and how the
passes' statistics add up to the batch's."""

from __future__ import annotations

import torch


def micro_batches(
    rows: torch.Tensor, lengths: torch.Tensor, size: int, by_length: bool = True
) -> list[torch.Tensor]:
    """Splits ``rows`` ([K] rollout indices) into micro-batches of at most ``size``; with
    ``by_length``, longest first (stable), so each holds completions of similar length and
    trimming its padding saves the most. The loss sums micro-batches with batch-wide
    normalisers, so the order changes only the float rounding of the gradient."""
    if by_length:
        rows = rows[torch.sort(lengths[rows], descending=True, stable=True).indices]
    return list(rows.split(size))


def merge_stats(parts: list[tuple[dict, float]]) -> dict[str, float]:
    """Batch stats from the micro-batches': losses add up (each is its share of the batch
    loss), the other metrics are token-weighted means."""
    total = sum(tokens for _, tokens in parts) or 1.0
    merged = {key: sum(s[key] * t for s, t in parts) / total for key in parts[0][0]}
    merged["loss"] = sum(s["loss"] for s, _ in parts)
    return merged
