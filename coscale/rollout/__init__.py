"""Generation backends behind one interface (`RolloutBackend.generate -> Rollouts`).

`HFGenerateBackend` (HF `generate`, CPU or GPU) is the default. Optional engines such as
vLLM live in their own modules and are imported only when chosen.
"""

from __future__ import annotations

from coscale.rollout.base import (
    FINISH_REASONS,
    RolloutBackend,
    Rollouts,
    SamplingParams,
    normalize_n_per_prompt,
)
from coscale.rollout.hf import HFGenerateBackend

__all__ = [
    "FINISH_REASONS",
    "HFGenerateBackend",
    "RolloutBackend",
    "Rollouts",
    "SamplingParams",
    "normalize_n_per_prompt",
]
