"""The DataModule that owns the problem pools and the solution bank."""

from coscale.datamodules.problems import ProblemDataModule

__all__ = ["ProblemDataModule"]
