"""`coscale.clock`: nested timers count exclusively, and a stage's parts add up to its wall time."""

from __future__ import annotations

import pytest

from coscale import clock


@pytest.fixture
def ticks(monkeypatch):
    """perf_counter() returns the values put in this list, one per call."""
    values: list[float] = []
    monkeypatch.setattr(clock.time, "perf_counter", lambda: values.pop(0))
    monkeypatch.setattr(clock, "SECONDS", clock.Counter())
    monkeypatch.setattr(clock, "CALLS", clock.Counter())
    return values


def test_an_inner_timer_pauses_the_outer_one(ticks):
    # sampling 0..10, an engine starts 2..7 inside it, a sync 12..13 alone
    ticks.extend([0.0, 2.0, 7.0, 10.0, 12.0, 13.0])
    before = clock.snapshot()
    with clock.timed("sampling"), clock.timed("engine_start"):
        pass
    with clock.timed("weight_sync"):
        pass
    parts = clock.since(before, wall=20.0)
    assert parts == {
        "sampling": 5.0,
        "engine_start": 5.0,
        "weight_sync": 1.0,
        "other": 9.0,
        "engine_starts": 1,
    }


def test_a_timer_counts_when_its_body_raises(ticks):
    ticks.extend([1.0, 4.0])
    with pytest.raises(RuntimeError), clock.timed("sampling"):
        raise RuntimeError("engine died")
    assert clock.SECONDS["sampling"] == 3.0
    assert clock._open == []


def test_since_counts_only_what_came_after(ticks):
    ticks.extend([0.0, 3.0, 5.0, 6.0])
    with clock.timed("sampling"):
        pass
    before = clock.snapshot()
    with clock.timed("sampling"):
        pass
    assert clock.since(before, wall=2.0) == {"sampling": 1.0, "other": 1.0, "engine_starts": 0}


def test_describe_names_every_part():
    line = clock.describe({"sampling": 5.0, "engine_start": 40.0, "other": 2.0, "engine_starts": 1})
    assert line == "sampling 5.0 s, engine_start 40.0 s, other 2.0 s (1 engine start)"
    assert clock.describe({"other": 2.0, "engine_starts": 0}) == "other 2.0 s"


def test_a_kind_timed_since_is_listed_however_short(ticks):
    ticks.extend([0.0, 0.0004])  # a tiny model's weight sync
    before = clock.snapshot()
    with clock.timed("weight_sync"):
        pass
    assert clock.since(before, wall=1.0) == {"weight_sync": 0.0, "other": 1.0, "engine_starts": 0}
