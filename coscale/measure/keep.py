"""The final keep rule: whether the final retrain replaces the model the run had before it.

One rule for the pipeline's final stage (:mod:`coscale.stages.final`, which adds ``best``: the
earlier iterations' models too) and for :class:`~coscale.callbacks.FinalRetrain`.
"""

from __future__ import annotations

KEEP = ("retrained", "better", "best")
"""Values of ``pipeline.final.keep`` (and of :class:`~coscale.callbacks.FinalRetrain`'s ``keep``, which
has no earlier iterations' models and so takes the first two)."""


def keeps_retrained(keep: str, before: float, after: float) -> bool:
    """Whether the retrain replaces the model before it: always with ``retrained``, else when
    its pass@1 ``after`` is not lower than ``before``."""
    return keep == "retrained" or after >= before
