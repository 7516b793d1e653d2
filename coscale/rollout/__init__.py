"""Generation backends behind one interface (`RolloutBackend.generate -> Rollouts`).

This folder holds the contract (`base`), the factory that builds a backend by name
(`factory.build_backend`, ``auto`` resolved there), the run's one engine (`run_engine`), the
engine dtype (`dtype`) and the helpers the backends share (`text`, `weights`, `lockstep`), beside
HF ``generate`` (`hf`). One folder per other backend: `cached/` (coscale's decode loop, the
default) and `vllm/` (a colocated vLLM engine), which only the factory imports:
``coscale.rollout.VLLMBackend`` resolves through it, and vllm itself is imported only when an
engine is built.
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
    """``coscale.rollout.VLLMBackend`` (and ``VLLMServerBackend``) without importing the vLLM
    modules up front."""
    if name in ("VLLMBackend", "VLLMServerBackend"):
        from coscale.rollout.factory import backend_class

        return backend_class("vllm" if name == "VLLMBackend" else "vllm-server")
    raise AttributeError(f"module 'coscale.rollout' has no attribute {name!r}")
