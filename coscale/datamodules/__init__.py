"""The DataModule that serves a curriculum (:class:`~coscale.loop.curriculum.Curriculum`, which
holds the problem pools, the solution bank and the replay buffer) to SFT and GRPO fits."""

from coscale.datamodules.problems import ProblemDataModule

__all__ = ["ProblemDataModule"]
