"""Which weights an SFT stage from the initial model ends with: the best on validation.

:class:`SelectOnProblems` scores the policy during the fit, every ``every_n_steps`` optimiser
steps and at the fit's end, by pass@1 on a seeded slice of the validation problems (``data.val``;
the stage's own training problems when there are none, never a test set), the problems
``final.keep`` judges on too, with the same seeded samples at every scoring, and the stage
exports the best-scoring weights instead of the last ones. Each improvement is written to
``<stage>/select/step<k>``; the score history and the best step live in the stage checkpoint, so
a resumed fit selects as an uninterrupted one.
"""

from __future__ import annotations

import os
import random
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from lightning.pytorch.callbacks import Callback
from typing_extensions import override

from coscale.checks import at_least, one_of
from coscale.distributed import barrier, is_writer
from coscale.log import logger
from coscale.loop.commit import commit_point
from coscale.measure.pass_rates import judged_problems, sample_counts
from coscale.modules.loggers import log_to_loggers
from coscale.renamed import adopt_earlier_names, earlier_name, old_names
from coscale.rollout.base import SamplingParams
from coscale.scoring.sample_count import pass_rates


@dataclass(frozen=True)
class SelectionSettings:
    """Checkpoint selection of an SFT from the initial model (:class:`SelectOnProblems`).

    Attributes:
        problems: Score pass@1 on this many of the validation problems (``data.val``, else the
            training problems; a seeded slice); 0: off, the SFT keeps its last weights.
        source: ``val`` (the validation problems when ``data.val`` has any) or ``train`` (the
            training problems even then).
        every: Optimiser steps between two scorings (and one at the end).
        samples: Samples per problem of each scoring.
        k: Earlier name of ``samples`` (a warning names it).
    """

    problems: int = 0
    every: int = 100
    samples: int = 4
    source: str = "val"
    k: int | None = earlier_name("samples")

    def __post_init__(self) -> None:
        adopt_earlier_names(self)

    def errors(self) -> list[str]:
        """Every out-of-range setting, named."""
        errors = at_least(0, problems=self.problems) + at_least(
            1, every=self.every, samples=self.samples
        )
        return errors + one_of(("val", "train"), source=self.source)

    def candidates(self, val_problems: list, curriculum: Any) -> list[dict]:
        """The problems a slice is drawn from: ``val_problems`` (``data.val``) with ``source:
        val`` when there are any, else the training problems."""
        return judged_problems(val_problems if self.source == "val" else [], curriculum)

    def build(
        self, problems: Iterable[Any], folder: str, seed: int, label: str = ""
    ) -> SelectOnProblems | None:
        """The selection callback on ``problems`` (None when it is off)."""
        if not self.problems:
            return None
        chosen = selection_slice(list(problems), self.problems, seed)
        return SelectOnProblems(chosen, self.samples, self.every, folder, seed, label=label)


def selection_slice(problems: list, count: int, seed: int) -> list[dict]:
    """``count`` of ``problems`` chosen by ``seed`` (all when fewer), as dicts, in a fixed order."""
    chosen = list(problems)
    if count < len(chosen):
        chosen = random.Random(seed).sample(chosen, count)
    return [p.to_dict() if hasattr(p, "to_dict") else dict(p) for p in chosen]


class SelectOnProblems(Callback):
    """Keeps the weights with the highest pass@1 on ``problems`` during an SFT fit.

    Args:
        problems: Dicts with ``question`` and ``answer``: a slice of the validation problems.
        samples: Samples per problem per scoring (temperature of the module's ``val_sampling``).
        every_n_steps: Score every this many optimiser steps (and always at the fit's end).
        folder: Where each new best is exported (``<folder>/step<k>``).
        seed: Seed of the samples, the same at every scoring so that scores compare.
        label: The stage's name, in the commit point each scoring ends with.
    """

    def __init__(
        self,
        problems: list[dict],
        samples: int,
        every_n_steps: int,
        folder: str,
        seed: int = 0,
        label: str = "",
    ) -> None:
        self.problems, self.samples, self.every_n_steps = problems, samples, every_n_steps
        self.folder, self.seed, self.label = folder, seed, label
        self.scores: dict[int, float] = {}  # step -> pass@1
        self.best_step = -1
        self._finished = False

    @property
    def best(self) -> float:
        return self.scores.get(self.best_step, float("-inf"))

    def best_model(self) -> str | None:
        """The folder of the best weights (None before any scoring)."""
        return self.path(self.best_step) if self.best_step >= 0 else None

    def path(self, step: int) -> str:
        return os.path.join(self.folder, f"step{step}")

    @override
    def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
        step = trainer.global_step
        if step % self.every_n_steps == 0 and step not in self.scores:
            self.score(trainer, pl_module, step)

    @override
    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        # the fit's last scoring goes into the epoch-end checkpoint (Lightning runs checkpoint
        # callbacks last): a fit resumed from it is finished, and Lightning skips its loop
        if _fit_ends(trainer) and trainer.global_step not in self.scores:
            self.score(trainer, pl_module, trainer.global_step)

    @override
    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if trainer.global_step not in self.scores:  # a fit stopped before its end
            self.score(trainer, pl_module, trainer.global_step)
        self.finish()

    def finish(self) -> None:
        """Removes the exported folders but the best one and reports the choice, once. The stage
        calls it after its fit too: a fit resumed finished never reaches ``on_train_end``."""
        if self._finished:
            return
        self._finished = True
        self.prune()
        first = self.problems[0].get("id", "") if self.problems else ""
        logger.info(
            f"selection: step {self.best_step} of {max(self.scores, default=0)} kept, "
            f"pass@1 {self.best:.4f} on {len(self.problems)} problems (first: {first}) "
            f"(scores: {', '.join(f'{s}:{v:.3f}' for s, v in sorted(self.scores.items()))})"
        )

    def score(self, trainer: Any, pl_module: Any, step: int) -> None:
        """pass@1 of the policy now; a new best is exported (every rank takes part)."""
        base = getattr(pl_module, "val_sampling", None) or SamplingParams()
        # an engine with its own copy (the run's vLLM engine) gets this step's weights first
        pl_module.backend.update_weights(pl_module.policy)
        counts = sample_counts(
            pl_module, self.problems, self.samples, replace(base, seed=self.seed), 16
        )
        value = pass_rates(self.samples, counts, [1]).get("pass@1", 0.0)
        self.scores[step] = value
        if value > self.best:  # a later step must do strictly better to replace the choice
            pl_module.export(self.path(step))
            self.best_step = step
        metrics = {"select/pass@1": value, "select/best_step": float(self.best_step)}
        log_to_loggers(trainer, metrics, step)
        # scored (and a new best exported), not yet in a checkpoint: a kill here redoes the step
        commit_point(f"{self.label} select step {step} scored")

    def prune(self) -> None:
        """Removes the exported folders other than the best one."""
        if is_writer() and os.path.isdir(self.folder):
            for name in os.listdir(self.folder):
                if name != f"step{self.best_step}":
                    shutil.rmtree(os.path.join(self.folder, name), ignore_errors=True)
        barrier()

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"scores": dict(self.scores), "best_step": self.best_step}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.scores = {int(k): float(v) for k, v in state_dict["scores"].items()}
        self.best_step = int(state_dict["best_step"])


def _fit_ends(trainer: Any) -> bool:
    """Whether the epoch ending now is the fit's last: its ``max_steps`` or epochs are done."""
    steps_done = 0 < trainer.max_steps <= trainer.global_step
    epochs = trainer.max_epochs if trainer.max_epochs not in (None, -1) else None
    return steps_done or (epochs is not None and trainer.current_epoch + 1 >= epochs)


# the classes' earlier names, for one release
__getattr__ = old_names(__name__, {"Selection": SelectionSettings})
