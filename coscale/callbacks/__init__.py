"""Callbacks that carry the cross-cutting parts of CoScale-RL across Lightning fits.

- :class:`PassRateMeasurement`: K samples per problem at chosen epochs -> pools relabelled.
- :class:`RolloutNSchedule`: difficulty groups, one Rollout N per group, raised on plateaus.
- :class:`ReDistillation`: SFT from the initial weights on the latest correct RL rollouts.
- :class:`FinalRetrain`: the final retrain from the initial weights, pass@k before / after.

They work with :class:`~coscale.datamodules.ProblemDataModule` and warn once (doing nothing)
when a trainer has none. The two retrains run their SFT inside the fit on its own strategy and
precision (:mod:`coscale.callbacks.sft_in_fit`); :func:`run_sft` is the same SFT outside any fit.
:class:`PassRateMeasurement` lives in :mod:`coscale.measure`, where the pipeline's stages reach
it too, as does :class:`SelectionSettings`, the settings of checkpoint selection (its callback,
:class:`~coscale.measure.selection.SelectOnProblems`, is what ``SelectionSettings.build`` returns).
"""

from coscale.callbacks.final_retrain import FinalRetrain
from coscale.callbacks.redistill import ReDistillation
from coscale.callbacks.rollout_schedule import RolloutNSchedule
from coscale.callbacks.sft_in_fit import SFTLoopSettings, copy_weights, run_sft
from coscale.measure.pass_rate_measurement import PassRateMeasurement
from coscale.measure.selection import SelectionSettings
from coscale.renamed import old_names

__all__ = [
    "FinalRetrain",
    "PassRateMeasurement",
    "ReDistillation",
    "RolloutNSchedule",
    "SFTLoopSettings",
    "SelectionSettings",
    "copy_weights",
    "run_sft",
]


# the classes' earlier names, for one release
__getattr__ = old_names(
    __name__,
    {
        "PassRateEvaluation": PassRateMeasurement,
        "Selection": SelectionSettings,
        "SFTLoop": SFTLoopSettings,
    },
)
