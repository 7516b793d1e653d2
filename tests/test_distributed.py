"""coscale.distributed in one process: every helper is the plain value, no process group needed.

The collectives themselves run in the two-process tests (test_ddp.py, test_multiprocess.py).
"""

from __future__ import annotations

import torch

from coscale import distributed as d


def test_one_process_is_rank_0_of_1_and_writes():
    assert d.rank_world() == (0, 1) and d.world_size() == 1
    assert not d.distributed() and d.is_writer()
    d.barrier()  # returns at once


def test_reductions_and_gather_are_the_value_itself():
    assert d.sum_over_ranks(3) == 3 and d.max_over_ranks(5) == 5
    t = torch.tensor([1.0, 2.0])
    assert d.sum_over_ranks(t) is t and t.tolist() == [1.0, 2.0]
    items = [("a", 1)]
    gathered = d.all_gather_objects(items)
    assert gathered == items and gathered is not items
