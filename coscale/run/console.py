"""The run's console reads as one program, not as one Lightning fit after another.

Lightning prints its device banner at every ``Trainer`` and a fit warns about things the user of
a run cannot act on. In a run (:class:`RunConsole`) the banner shows at the first fit only; the
lines and warnings below are left out; transformers' per-file load and save bars are off; and
each stage fit has one bar (:class:`StageProgressBar`) that names the stage and counts its time
left.
"""

from __future__ import annotations

import logging
import warnings
from contextlib import contextmanager

from lightning.pytorch.callbacks import TQDMProgressBar
from transformers.utils import logging as hf_logging

# Lightning's INFO lines that say nothing about this run (the litlogger tip, the end of a fit the
# stage line already reports, a checkpoint default coscale does not rely on)
NOT_SHOWN = ("litlogger", "`Trainer.fit` stopped", "`weights_only` was not set")
# Lightning's banner: shown at a run's first fit only
BANNER = ("available: ", "Automatic Mixed Precision")
WARNINGS_NOT_SHOWN = (
    # Lightning's own use of torch's LeafSpec (lightning/pytorch/utilities/_pytree.py)
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",
    # coscale's epoch loaders have a length and load in the main process (num_workers=0), so
    # the multi-worker caveat never applies
    r"Your `IterableDataset` has `__len__` defined",
)


class RunConsole:
    """What one run shows: enter it for the whole run (transformers' load and save bars off: each
    stage loads and saves models) and wrap each of its fits in :meth:`fit`."""

    def __init__(self) -> None:
        self.fits, self.bars_were_on = 0, False

    def __enter__(self) -> RunConsole:
        self.bars_were_on = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()
        return self

    def __exit__(self, *_) -> None:
        if self.bars_were_on:
            hf_logging.enable_progress_bar()

    @contextmanager
    def fit(self):
        texts = NOT_SHOWN + (BANNER if self.fits else ())
        self.fits += 1
        handlers = _lightning_handlers()
        drop = lambda record: not any(t in record.getMessage() for t in texts)  # noqa: E731
        for handler in handlers:
            handler.addFilter(drop)
        try:
            with warnings.catch_warnings():
                for pattern in WARNINGS_NOT_SHOWN:
                    warnings.filterwarnings("ignore", message=pattern)
                yield
        finally:
            for handler in handlers:
                handler.removeFilter(drop)


def _lightning_handlers() -> list[logging.Handler]:
    """Every handler a Lightning line reaches: its loggers' own and their parents' up to the
    first that does not propagate (where the handlers are depends on who set logging up)."""
    out = []
    for name in ("lightning.pytorch", "lightning.fabric"):
        logger = logging.getLogger(name)
        while logger is not None:
            out += logger.handlers
            logger = logger.parent if logger.propagate else None
    return list(dict.fromkeys(out))


class StageProgressBar(TQDMProgressBar):
    """One bar for a stage's whole fit: named for the stage and its epoch, counting the batches of
    every epoch, so its time left is the stage's (the epochs still to run are taken to be as long
    as the current one: an RL epoch's length follows the solvable pool)."""

    def __init__(self, stage: str) -> None:
        super().__init__()
        self.stage = stage
        self.done = 0  # batches of this fit's finished epochs
        self.seen = 0

    @property
    def train_description(self) -> str:
        return self.stage

    def on_train_start(self, *args) -> None:
        super().on_train_start(*args)
        self.done = self.seen = 0

    def on_train_epoch_start(self, trainer, *_) -> None:
        self.done = self.seen
        bar, epoch, last = self.train_progress_bar, trainer.current_epoch, trainer.max_epochs
        per_epoch = self.total_train_batches
        finite = per_epoch != float("inf") and last is not None and last > 0
        bar.total = self.done + per_epoch * (last - epoch) if finite else None
        of = f"/{last}" if last is not None and last > 0 else ""
        bar.set_description(f"{self.stage} epoch {epoch + 1}{of}")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        self.seen = self.done + batch_idx + 1
        bar = self.train_progress_bar
        if not bar.disable and self._should_update(self.seen, bar.total or self.seen):
            bar.n = self.seen
            bar.refresh()
            bar.set_postfix(self.get_metrics(trainer, pl_module))
