"""One rollout engine for a whole run (one per rank): every sample the run takes goes through it.

A CoScale-RL run mostly samples: the pool measurements, each SFT stage's checkpoint selection
and the final judge take far more samples than RL itself. So the run chooses its engine once
(``pipeline.rollout``) and hands it each stage's model with :meth:`RunEngine.attach` instead of
building one per stage:

* HF ``generate`` and the cached decode sample on the model itself: attaching points them at it.
* A vLLM engine starts at the run's first sample, once, and keeps running across stages; a new
  model reaches it by a weight sync (`VLLMBackend.update_weights`, which the caller makes on
  every rank before sampling), never a rebuild. On a GPU it sleeps between samplings (level 2
  unless ``engine.sleep_level`` says otherwise: its weights are replaced by the next sync anyway),
  so a stage that trains gets the memory back; vLLM's CPU build has no sleep mode.

The modules that borrow it never close it (:attr:`PolicyMixin.backend`); :meth:`close` at the
run's end does.
"""

from __future__ import annotations

import os
from typing import Any

from torch import nn

from coscale.rollout.base import RolloutBackend
from coscale.rollout.factory import RolloutSettings, build_backend, close_backend, resolve_backend

GPU_SLEEP_LEVEL = 2
"""A run engine's sleep level on a GPU unless set: weights dropped, the next sync loads them."""


class RunEngine:
    """The run's one rollout backend, built at the first :meth:`attach`.

    Args:
        spec: ``pipeline.rollout``: the backend (``auto`` resolved here) and its options.
        dtype: The engine's compute dtype when its options leave it unset (the trainer's
            precision as a vLLM dtype, `coscale.rollout.dtype.precision_dtype`).
        cuda: Whether the run's models sample on a CUDA device.
    """

    def __init__(self, spec: RolloutSettings, dtype: str | None = None, cuda: bool = False) -> None:
        self.kind, self.why = resolve_backend(spec.backend, cuda)
        options = dict(spec.options)
        if self.kind == "vllm" and cuda:
            options = _with_sleep(options, GPU_SLEEP_LEVEL)
        self.options, self.dtype = options, dtype
        self.backend: RolloutBackend | None = None

    @property
    def spec(self) -> RolloutSettings:
        """The resolved choice, as a module's ``rollout`` setting would state it."""
        return RolloutSettings(self.kind, self.options)

    @property
    def starts(self) -> int:
        """How many times this process started an engine (0 for HF and the cached decode)."""
        return int(getattr(self.backend, "starts", 0))

    @property
    def start_seconds(self) -> float:
        """Seconds this process spent starting engines."""
        return float(getattr(self.backend, "start_seconds", 0.0))

    def attach(
        self, policy: nn.Module, tokenizer: Any, model_path: str | os.PathLike
    ) -> RolloutBackend:
        """The run's backend, sampling for ``policy`` from now on (``model_path``: the folder or
        hub name of its weights, which a vLLM engine built now starts from)."""
        if self.backend is None:
            kind, options = self.kind, self.options
            self.backend = build_backend(kind, policy, tokenizer, model_path, self.dtype, **options)
        else:
            self.backend.follow(policy)
        return self.backend

    def release(self) -> None:
        """Lets go of the model the last stage lent (its memory is freed with the stage's
        module); the engine itself stays up."""
        if self.backend is not None:
            self.backend.release()

    def close(self) -> None:
        """Shuts the engine down (the run's end); a later :meth:`attach` starts a new one."""
        close_backend(self.backend)


def _with_sleep(options: dict[str, Any], level: int) -> dict[str, Any]:
    """``options`` with ``engine.sleep_level`` set to ``level`` where it is unset."""
    engine = options.get("engine")
    if engine is None or isinstance(engine, dict):
        return {**options, "engine": {"sleep_level": level, **(engine or {})}}
    return options  # an EngineSettings object states its own sleep level
