"""Tests for coscale.datamodules.batches: per-epoch shuffle, equal sharding across ranks, skip.

A fake world is set by monkeypatching ``rank_world``; the unsharded batch list (world 1) of
the same seed and epoch is the reference every rank's share is worked out from by hand.
"""

from __future__ import annotations

import pytest

from coscale.datamodules import batches
from coscale.datamodules.batches import (
    EpochBatches,
    FitCursor,
    ResumableLoader,
    epoch_loader,
    shard_batches,
)

ITEMS = [{"i": k} for k in range(7)]  # 7 items, batch 2 -> 4 batches of sizes 2, 2, 2, 1


def _world(monkeypatch, rank: int, world: int) -> None:
    monkeypatch.setattr(batches, "rank_world", lambda: (rank, world))


def _ids(batch_list) -> list[list[int]]:
    return [[item["i"] for item in batch] for batch in batch_list]


def test_single_rank_shuffles_a_permutation_into_batches(monkeypatch):
    _world(monkeypatch, 0, 1)
    items = list(ITEMS)
    got = shard_batches(items, 2, seed=3, epoch=0)
    assert [len(b) for b in got] == [2, 2, 2, 1]
    assert sorted(i for b in _ids(got) for i in b) == list(range(7))
    assert items == ITEMS  # the caller's list is not shuffled in place
    assert shard_batches(items, 2, seed=3, epoch=0) == got  # same seed + epoch, same order
    # The next epoch (and another seed) reshuffles: these orders differ for these seeds.
    assert _ids(shard_batches(items, 2, seed=3, epoch=1)) != _ids(got)
    assert _ids(shard_batches(items, 2, seed=4, epoch=0)) != _ids(got)


def test_uneven_batches_pad_with_the_first_batches(monkeypatch):
    _world(monkeypatch, 0, 1)
    b = shard_batches(ITEMS, 2, seed=5, epoch=2)  # b0..b3
    # 4 batches, world 3 -> padded to 6 with b0, b1; rank r takes every 3rd from r.
    expected = {0: [b[0], b[3]], 1: [b[1], b[0]], 2: [b[2], b[1]]}
    covered = []
    for rank in range(3):
        _world(monkeypatch, rank, 3)
        got = shard_batches(ITEMS, 2, seed=5, epoch=2)
        assert got == expected[rank]
        covered += [i for batch in _ids(got) for i in batch]
    assert sorted(set(covered)) == list(range(7))  # the union covers every item
    assert len(covered) == 7 + 2 + 2  # plus the repeated b0 and b1


def test_even_batches_are_not_padded(monkeypatch):
    _world(monkeypatch, 0, 1)
    b = shard_batches(ITEMS, 2, seed=1, epoch=0)
    for rank, expected in [(0, [b[0], b[2]]), (1, [b[1], b[3]])]:
        _world(monkeypatch, rank, 2)
        assert shard_batches(ITEMS, 2, seed=1, epoch=0) == expected


def test_world_larger_than_batch_count(monkeypatch):
    _world(monkeypatch, 0, 1)
    b = shard_batches(ITEMS, 4, seed=0, epoch=0)
    assert [len(x) for x in b] == [4, 3]
    # 2 batches, world 5 -> padded b0 b1 b0 b1 b0: one batch per rank.
    for rank, expected in enumerate([b[0], b[1], b[0], b[1], b[0]]):
        _world(monkeypatch, rank, 5)
        assert shard_batches(ITEMS, 4, seed=0, epoch=0) == [expected]


def test_no_items_gives_no_batches_on_every_rank(monkeypatch):
    for rank in range(3):
        _world(monkeypatch, rank, 3)
        assert shard_batches([], 2, seed=0, epoch=0) == []


def test_epoch_batches_skip_applies_to_the_first_pass_only(monkeypatch):
    _world(monkeypatch, 0, 1)
    full = shard_batches(ITEMS, 2, seed=9, epoch=4)
    ds = EpochBatches(ITEMS, 2, seed=9, epoch=4, skip=3)
    assert len(ds) == 4  # the epoch's length, not what is left of it
    assert list(ds) == full[3:]
    assert list(ds) == full  # a later pass (next time the loader is iterated) is whole
    assert list(EpochBatches(ITEMS, 2, seed=9, epoch=4, skip=4)) == []


def test_epoch_loader_yields_lists_of_items_from_a_snapshot(monkeypatch):
    _world(monkeypatch, 0, 1)
    source = list(ITEMS)
    loader = epoch_loader(lambda: source, 2, seed=9, epoch=4, skip=1)
    source.append({"i": 99})  # after construction: not seen by this epoch's loader
    assert isinstance(loader, ResumableLoader)
    assert loader.num_workers == 0
    assert list(loader) == shard_batches(ITEMS, 2, seed=9, epoch=4)[1:]


def test_epoch_loader_serves_this_ranks_share(monkeypatch):
    _world(monkeypatch, 0, 1)
    b = shard_batches(ITEMS, 2, seed=2, epoch=0)
    _world(monkeypatch, 1, 2)
    assert list(epoch_loader(lambda: ITEMS, 2, seed=2, epoch=0)) == [b[1], b[3]]


def test_resumable_loader_state_is_the_fit_cursor_and_resumes_its_epoch(monkeypatch):
    _world(monkeypatch, 0, 1)
    loader = epoch_loader(lambda: ITEMS, 3, seed=0, epoch=2)
    before = list(loader)
    assert [len(x) for x in before] == [3, 3, 1]
    assert loader.state_dict() == {"epoch": 2, "consumed": 0}
    loader.cursor.consumed += 2  # what the DataModule counts as batches go to the model
    state = loader.state_dict()
    assert state == {"epoch": 2, "consumed": 2}
    # Lightning gives a resumed fit's loader of the same epoch its state: the rest of the epoch
    again = epoch_loader(lambda: ITEMS, 3, seed=0, epoch=2)
    again.load_state_dict(state)
    assert again.cursor == FitCursor(2, 2) and list(again) == before[2:]
    # a loader of another epoch starts from its first batch
    later = epoch_loader(lambda: ITEMS, 3, seed=0, epoch=3)
    later.load_state_dict(state)
    assert later.cursor == FitCursor(3, 0) and len(list(later)) == 3


@pytest.mark.parametrize("world", [2, 3, 4])
def test_every_rank_gets_the_same_number_of_batches(monkeypatch, world):
    for n_items in range(1, 12):
        items = [{"i": k} for k in range(n_items)]
        real = -(-n_items // 2)  # batches of 2 before padding
        shares = []
        for rank in range(world):
            _world(monkeypatch, rank, world)
            shares.append(shard_batches(items, 2, seed=n_items, epoch=0))
        assert [len(s) for s in shares] == [-(-real // world)] * world
        seen = {item["i"] for share in shares for batch in share for item in batch}
        assert seen == set(range(n_items))
