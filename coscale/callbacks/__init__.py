"""Callbacks that carry the cross-cutting parts of CoScale-RL across Lightning fits.

- :class:`PassRateEvaluation`: K samples per problem at chosen epochs -> pools relabelled.
- :class:`RolloutNSchedule`: difficulty groups, one Rollout N per group, raised on plateaus.
- :class:`ReDistillation`: SFT from the initial weights on the latest correct RL rollouts.
- :class:`FinalRetrain`: the final retrain from the initial weights, pass@k before / after.

They work with :class:`~coscale.datamodules.ProblemDataModule` and warn once (doing nothing)
when a trainer has none. :func:`run_sft` and :func:`copy_weights` are the SFT stage they use.
"""

from coscale.callbacks.final_retrain import FinalRetrain
from coscale.callbacks.pass_rate import PassRateEvaluation
from coscale.callbacks.redistill import ReDistillation
from coscale.callbacks.rollout_schedule import RolloutNSchedule
from coscale.callbacks.sft_stage import copy_weights, run_sft

__all__ = [
    "FinalRetrain",
    "PassRateEvaluation",
    "ReDistillation",
    "RolloutNSchedule",
    "copy_weights",
    "run_sft",
]
