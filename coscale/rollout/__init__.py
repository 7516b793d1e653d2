"""Generation backends behind one interface (`RolloutBackend.generate -> Rollouts`).

`HFGenerateBackend` (HF `generate`, CPU or GPU) is the default. `VLLMBackend` (a colocated
vLLM engine) is loaded on first access of the name and imports vllm only when an engine is
built; `build_backend("hf" | "vllm", ...)` picks one by name.
"""

from __future__ import annotations

from typing import Any

from coscale.rollout.base import (
    FINISH_REASONS,
    RolloutBackend,
    Rollouts,
    SamplingParams,
    normalize_n_per_prompt,
)
from coscale.rollout.cached import CachedDecodeBackend
from coscale.rollout.factory import BACKENDS, build_backend
from coscale.rollout.hf import HFGenerateBackend

__all__ = [
    "BACKENDS",
    "FINISH_REASONS",
    "CachedDecodeBackend",
    "HFGenerateBackend",
    "RolloutBackend",
    "Rollouts",
    "SamplingParams",
    "VLLMBackend",
    "build_backend",
    "normalize_n_per_prompt",
]


def __getattr__(name: str) -> Any:
    """``coscale.rollout.VLLMBackend`` without importing the vLLM modules up front."""
    if name == "VLLMBackend":
        from coscale.rollout.vllm import VLLMBackend

        return VLLMBackend
    raise AttributeError(f"module 'coscale.rollout' has no attribute {name!r}")
