"""`coscale.modules.prefetch` without a server: which requests sampled ahead a batch takes,
the staleness setting's range, and the refusals that name it."""

from __future__ import annotations

from concurrent.futures import Future

import pytest

from coscale.modules.grpo_settings import Update
from coscale.modules.prefetch import Prefetch, batch_ids, sample_ahead


class _Pending:
    def __init__(self, version: int) -> None:
        self.version, self.future = version, Future()
        self.future.set_result(None)

    def result(self):
        return self.future.result()


def _batch(*ids: str, n: int = 4) -> list[dict]:
    return [{"id": i, "question": "q", "n": n} for i in ids]


def test_a_batch_takes_only_requests_sent_for_its_position_and_its_problems():
    ahead = Prefetch()
    first, second = _Pending(1), _Pending(1)
    ahead.add((0, 1), _batch("a", "b"), first)
    ahead.add((0, 2), _batch("c", "d"), second)
    assert (0, 1) in ahead and len(ahead) == 2
    assert ahead.take((0, 1), _batch("a", "b")) is first
    # the batch at position 2 changed (its N did): sampled again, never with the old N
    assert ahead.take((0, 2), _batch("c", "d", n=8)) is None
    assert len(ahead) == 0


def test_requests_for_positions_passed_over_are_dropped():
    ahead = Prefetch()
    ahead.add((0, 3), _batch("a"), _Pending(2))
    ahead.add((1, 0), _batch("b"), _Pending(2))
    assert ahead.take((1, 0), _batch("b")) is not None  # a new epoch: (0, 3) is gone
    assert len(ahead) == 0
    ahead.add((1, 1), _batch("c"), _Pending(3))
    ahead.clear()
    assert len(ahead) == 0


def test_batch_ids_hold_the_problems_and_their_n_in_order():
    assert batch_ids(_batch("a", "b")) == ("a:4", "b:4")
    assert batch_ids(_batch("b", "a")) != batch_ids(_batch("a", "b"))


def test_max_staleness_must_be_a_non_negative_int():
    assert Update(max_staleness=-1).errors() == ["max_staleness must be an int >= 0, got -1"]
    assert Update(max_staleness=2).errors() == []


def test_a_backend_that_cannot_sample_in_the_background_is_refused_naming_the_setting():
    class Module:
        backend = type("Cached", (), {"name": "cached"})()
        update_settings = Update(max_staleness=1)

    with pytest.raises(ValueError, match=r"update\.max_staleness=1 needs .*vllm-server.*'cached'"):
        sample_ahead(Module(), _batch("a"))
