"""SFT's one loss: cross-entropy averaged over the labelled tokens, padded, packed or distilled."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

IGNORE = -100
"""The label of a token that is not trained on (prompt, padding)."""


def token_mean_ce(logits: Tensor, targets: Tensor, n: int | None = None) -> tuple[Tensor, int]:
    """Cross-entropy summed over the targets that are not :data:`IGNORE`, over their count;
    returns it and the count. ``logits`` [K, V], ``targets`` [K]; ``n``: the count when the
    caller knows it (every target labelled), else counted here (a host sync)."""
    n = int((targets != IGNORE).sum()) if n is None else n
    loss = F.cross_entropy(logits.float(), targets, ignore_index=IGNORE, reduction="sum")
    return loss / max(n, 1), n
