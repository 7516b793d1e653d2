"""The trainer's process as the engine found it: RNG states, torch threads, CPU affinity, env.

An engine built in the training process changes process-wide state the trainer relies on:

- its worker seeds every global RNG (torch, CUDA, Python's ``random``, NumPy) with the engine
  seed while it starts, so each RL stage's new engine would reset the trainer's seeded stream;
- vLLM's CPU worker replaces ``torch.set_num_threads`` by a function that only logs a warning
  (nothing may change the thread count after its binding), and leaves it so after shutdown;
- an engine may pin the process's threads to cores, and sets ``VLLM_*`` variables.

While it samples, vLLM draws from the global torch RNG even for requests that carry their own
seed: `seeded_rng_guard` keeps a seeded call from moving it (as the HF backend does).

`HostState.capture()` records all of it before the engine is built (before coscale sets the
variables vLLM reads, `coscale.rollout.vllm.launch.prepare_environment`). `restore` puts the RNG states,
``torch.set_num_threads``, the thread count and the CPU affinity back once the engine runs
(coscale seeds each of its requests, so the engine does not need the global RNG) and notes
which variables the start set; `restore_environment` (after shutdown) puts those back: vLLM
reads its variables lazily while an engine lives, so they stay until it is gone. A variable
someone changed again since is left as it is.
"""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from coscale.seeds import kept_rng


def _numpy_state() -> Any:
    try:
        import numpy
    except ImportError:
        return None
    return numpy.random.get_state()


def _affinity() -> set[int] | None:
    getter = getattr(os, "sched_getaffinity", None)
    return None if getter is None else set(getter(0))


@dataclass
class HostState:
    """What an engine may change in this process (see the module docstring)."""

    torch_rng: torch.Tensor
    cuda_rng: list[torch.Tensor] | None
    python_rng: Any
    numpy_rng: Any
    set_num_threads: Callable[[int], None]
    num_threads: int
    affinity: set[int] | None
    environ: dict[str, str] = field(default_factory=dict)
    engine_set: dict[str, str] = field(default_factory=dict)  # what the start changed

    @classmethod
    def capture(cls) -> HostState:
        """This process's state now."""
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        return cls(
            torch_rng=torch.get_rng_state(),
            cuda_rng=cuda,
            python_rng=random.getstate(),
            numpy_rng=_numpy_state(),
            set_num_threads=torch.set_num_threads,
            num_threads=torch.get_num_threads(),
            affinity=_affinity(),
            environ=dict(os.environ),
        )

    def restore(self) -> None:
        """After the start: RNG states and threads back, noting what it set in the environment."""
        torch.set_rng_state(self.torch_rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)
        random.setstate(self.python_rng)
        if self.numpy_rng is not None:
            import numpy

            numpy.random.set_state(self.numpy_rng)
        self.restore_threads()
        gone = {n: "" for n in self.environ if n not in os.environ}
        now = {n: v for n, v in os.environ.items() if self.environ.get(n) != v}
        self.engine_set = {**gone, **now}

    def restore_threads(self) -> None:
        """``torch.set_num_threads``, the thread count and the CPU affinity as captured. Also
        after shutdown, which may replace them again; the RNG states are left alone there:
        the trainer has drawn from them since."""
        torch.set_num_threads = self.set_num_threads
        if torch.get_num_threads() != self.num_threads:
            torch.set_num_threads(self.num_threads)
        if self.affinity is not None and _affinity() != self.affinity:
            os.sched_setaffinity(0, self.affinity)

    def restore_environment(self) -> None:
        """Undoes the start's changes of ``os.environ`` (call once the engine is shut down)."""
        for name, value in self.engine_set.items():
            if os.environ.get(name, "") != value:
                continue  # changed again since: not ours to undo
            if name in self.environ:
                os.environ[name] = self.environ[name]
            else:
                os.environ.pop(name, None)
        self.engine_set = {}


@contextlib.contextmanager
def seeded_rng_guard(seed: int | None) -> Iterator[None]:
    """The global torch RNG (CPU and the current CUDA device) as it was, after a seeded call;
    an unseeded call (`seed` None) uses and moves it."""
    if seed is None:
        yield
        return
    with kept_rng():
        yield
