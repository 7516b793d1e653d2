"""A loader whose contents are rebuilt from the pools at the start of every epoch.

The solvable set changes between epochs, so the RL loader cannot be a fixed list: each epoch
takes a fresh snapshot, shuffles it with ``seed + epoch`` (reproducible, resumable), shards it
across ranks with equal batch counts (DDP needs every rank to step together) and can skip the
batches already consumed before a crash. Where the fit is (:class:`FitCursor`) is the loader's
state: Lightning saves it in every checkpoint and gives it back to the loader it resumes with.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

from torch.utils.data import DataLoader, IterableDataset

from coscale.distributed import rank_world
from coscale.seeds import derive_seed

Item = dict[str, Any]


def shard_batches(
    items: list[Item], batch_size: int, seed: int, epoch: int, pad: bool = True
) -> list[list[Item]]:
    """Shuffles ``items`` for ``epoch`` and returns this rank's batches.

    With ``pad`` every rank gets the same number of batches (training steps must line up across
    ranks): when the batch count does not divide by the world size, the first batches are
    repeated. Evaluation passes ``pad=False`` so that no problem is scored twice.
    """
    order = list(items)
    random.Random(derive_seed("shuffle", seed, epoch)).shuffle(order)
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    rank, world = rank_world()
    real = len(batches)
    while pad and len(batches) % world:
        batches.append(batches[(len(batches) - real) % real])
    return batches[rank::world]


class EpochBatches(IterableDataset):
    """Yields lists of items (one list = one batch) from a snapshot taken at construction."""

    def __init__(
        self,
        items: list[Item],
        batch_size: int,
        seed: int,
        epoch: int,
        skip: int = 0,
        pad: bool = True,
    ) -> None:
        super().__init__()
        self.batches = shard_batches(items, batch_size, seed, epoch, pad)
        self.skip = skip

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self) -> Iterator[list[Item]]:
        start, self.skip = self.skip, 0
        yield from self.batches[start:]


@dataclass
class FitCursor:
    """Where a fit is: the epoch being served and how many of its batches went to the model
    (counted as each batch is handed over, not as the loader yields it: Lightning fetches one
    batch ahead)."""

    epoch: int = -1
    consumed: int = 0


def epoch_loader(
    build: Callable[[], list[Item]],
    batch_size: int,
    seed: int,
    epoch: int,
    skip: int = 0,
    pad: bool = True,
) -> ResumableLoader:
    """A ``DataLoader`` over :class:`EpochBatches`; ``num_workers=0`` so it reads live pools."""
    dataset = EpochBatches(build(), batch_size, seed, epoch, skip, pad)
    cursor = FitCursor(epoch, skip)
    return ResumableLoader(dataset, cursor, batch_size=None, num_workers=0, collate_fn=_identity)


class ResumableLoader(DataLoader):
    """A loader that resumes mid-epoch: its state is its :class:`FitCursor`.

    Lightning saves ``state_dict()`` with the fit loop in every checkpoint and, on resume, hands
    it to the loader of the epoch it restarts in; a loader of that epoch then skips the batches
    consumed before, one of another epoch starts from its first batch.
    """

    def __init__(self, dataset: EpochBatches, cursor: FitCursor, **kwargs: Any) -> None:
        super().__init__(dataset, **kwargs)
        self.cursor = cursor

    def state_dict(self) -> dict[str, Any]:
        return asdict(self.cursor)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state["epoch"]) == self.cursor.epoch:
            self.cursor.consumed = self.dataset.skip = int(state["consumed"])


def _identity(batch: list[Item]) -> list[Item]:
    return batch
