"""The settings of the run's end (``pipeline.final:`` in YAML): the retrain from the initial model,
its own RL stage, and which model the run keeps."""

from __future__ import annotations

from dataclasses import dataclass

from coscale.checks import at_least, one_of
from coscale.loop.curriculum import SFT_SOURCES, SFTSource
from coscale.measure.pass_rates import KEEP


@dataclass(frozen=True)
class FinalSettings:
    """The final stage's switches.

    Attributes:
        retrain: Retrain from the initial model at the end (stage ``final/retrain``, distilled
            from the last RL model when ``distill_weight`` > 0). Off: the run ends with the last
            iteration's model.
        epochs: Epochs of the final retrain (None: ``sft_epochs``). The retrain is the one SFT
            whose model is shipped; the iterations' SFT stages only feed their RL stages, so a
            short ``sft_epochs`` with a long retrain moves SFT budget to where it is kept.
        source: What the retrain trains on (plus the replay share): ``all`` (the bank and the
            latest correct RL rollouts: "everything collected", the paper), ``bank`` (the bank
            only: each pass is cheaper, so the same time buys more passes) or ``redistill``
            (the rollouts only).
        rl: After the retrain, measure it (``final/eval``) and run RL on its solvable problems
            (``final/rl``), as after every iteration's SFT; the final candidate is then that RL
            model. Off: the retrain itself (the paper).
        keep: ``retrained`` (the paper), ``better`` or ``best`` (:mod:`coscale.stages.final`),
            judged on the held-out problems (else the training problems).
    """

    retrain: bool = True
    epochs: int | None = None
    source: SFTSource = "all"
    rl: bool = False
    keep: str = "retrained"

    def errors(self) -> list[str]:
        """Every out-of-range setting, named."""
        errors = at_least(1, optional=True, epochs=self.epochs)
        errors += one_of(SFT_SOURCES, source=self.source)
        return errors + one_of(KEEP, keep=self.keep)
