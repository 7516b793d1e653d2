"""Callbacks that carry the cross-cutting parts of CoScale-RL across Lightning fits.

- :class:`PassRateMeasurement`: K samples per problem at chosen epochs -> pools relabelled.
- :class:`RolloutNSchedule`: difficulty groups, one Rollout N per group, raised on plateaus.
- :class:`ReDistillation`: SFT from the initial weights on the latest correct RL rollouts.
- :class:`FinalRetrain`: the final retrain from the initial weights, pass@k before / after.

They work with :class:`~coscale.datamodules.ProblemDataModule` and warn once (doing nothing)
when a trainer has none. The two retrains run their SFT inside the fit on its own strategy and
precision (:mod:`coscale.callbacks.sft_in_fit`); :func:`run_sft` is the same SFT outside any fit.
:class:`PassRateMeasurement` lives in :mod:`coscale.measure`, where the pipeline's stages reach
it too, as does :class:`Selection`, the settings of checkpoint selection (its callback,
:class:`~coscale.measure.selection.SelectOnProblems`, is what ``Selection.build`` returns).
"""

import warnings

from coscale.callbacks.final_retrain import FinalRetrain
from coscale.callbacks.redistill import ReDistillation
from coscale.callbacks.rollout_schedule import RolloutNSchedule
from coscale.callbacks.sft_in_fit import SFTLoop, copy_weights, run_sft
from coscale.measure.pass_rate_measurement import PassRateMeasurement
from coscale.measure.selection import Selection

__all__ = [
    "FinalRetrain",
    "PassRateMeasurement",
    "ReDistillation",
    "RolloutNSchedule",
    "SFTLoop",
    "Selection",
    "copy_weights",
    "run_sft",
]


def __getattr__(name: str) -> type:
    """``PassRateEvaluation``: the earlier name of :class:`PassRateMeasurement` (one release)."""
    if name == "PassRateEvaluation":
        warnings.warn("PassRateEvaluation is now PassRateMeasurement", FutureWarning, 2)
        return PassRateMeasurement
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
