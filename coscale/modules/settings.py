"""Settings groups both LightningModules take: how the policy loads, its optimiser, validation.

Each group is a frozen dataclass documented once (``coscale fit --help`` and ``coscale run
--help`` show these docstrings) and checks its own ranges (:meth:`errors`, each message naming the
field); a module prefixes them with the argument's name, so an error reads
``optimizer.lr must be > 0``. In YAML a group is a mapping: ``optimizer: {lr: 1e-4}``.
"""

from __future__ import annotations

from dataclasses import dataclass

from coscale.checks import at_least, one_of
from coscale.models.capabilities import DTYPES
from coscale.renamed import old_names

DECAYS = ("constant", "linear", "cosine")
"""The learning rate after the warm-up (``AdamWSettings.decay``)."""


@dataclass(frozen=True)
class PolicyLoadSettings:
    """How the policy (and any model loaded beside it) is loaded.

    Attributes:
        dtype: Weights' dtype name: ``float32``, ``bfloat16`` or ``float16``.
        gradient_checkpointing: Recompute activations in the backward pass to save memory.
        trust_remote_code: Allow custom model code shipped with the model (off unless asked).
    """

    dtype: str = "float32"
    gradient_checkpointing: bool = False
    trust_remote_code: bool = False

    def errors(self) -> list[str]:
        if self.dtype not in DTYPES:
            return [f"dtype must be one of {', '.join(DTYPES)}; got {self.dtype!r}"]
        return []


@dataclass(frozen=True)
class AdamWSettings:
    """AdamW with a linear learning-rate warm-up, then a decay (:mod:`coscale.modules.optim`).

    Attributes:
        lr: Peak learning rate.
        betas: AdamW betas (the CoScale-RL authors' verl runs used beta1 = 0.5 in RL).
        weight_decay: Decoupled weight decay.
        warmup_steps: Optimiser steps over which the learning rate ramps up linearly.
        decay: The learning rate after the warm-up: ``constant``, or ``linear`` / ``cosine``
            down to 0 at the fit's last optimiser step (the trainer's
            ``estimated_stepping_batches``: the fit needs ``max_epochs`` or ``max_steps``).
    """

    lr: float = 1e-5
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 0.0
    warmup_steps: int = 0
    decay: str = "constant"

    def errors(self) -> list[str]:
        errors = at_least(0, float, strict=True, lr=self.lr)
        errors += at_least(0, float, weight_decay=self.weight_decay)
        errors += at_least(0, warmup_steps=self.warmup_steps)
        errors += one_of(DECAYS, decay=self.decay)
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            errors.append(f"betas must be two numbers in [0, 1), got {self.betas!r}")
        return errors


@dataclass(frozen=True)
class ValidationSettings:
    """Validation on held-out problems: pass@k with ``samples`` samples per problem.

    Attributes:
        samples: Samples per held-out problem (pass@k up to this k).
        temperature: Sampling temperature (None: the module's rollout temperature, else 1.0;
            as ``coscale run`` judges at ``pipeline.sampling.temperature``).
        max_new_tokens: Token limit of a sample (None: the module's rollout limit, else 256).
    """

    samples: int = 8
    temperature: float | None = None
    max_new_tokens: int | None = None

    def errors(self) -> list[str]:
        errors = at_least(1, samples=self.samples)
        errors += at_least(0, float, optional=True, temperature=self.temperature)
        return errors + at_least(1, optional=True, max_new_tokens=self.max_new_tokens)


# the classes' earlier names, for one release
__getattr__ = old_names(
    __name__,
    {"PolicyLoad": PolicyLoadSettings, "AdamW": AdamWSettings, "Validation": ValidationSettings},
)
