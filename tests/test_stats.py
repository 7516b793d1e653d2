"""Bootstrap intervals of pass@k: one set, and the average of several sets (stratified)."""

from __future__ import annotations

import pytest

from coscale.app.demo import average_cell, lead_cell
from coscale.scoring.stats import (
    Estimate,
    bootstrap,
    mean_of_sets,
    paired_difference,
    pass_at_k_estimate,
)
from coscale.tasks import tiers


def test_one_set_interval_holds_the_mean_and_keeps_the_values():
    values = [0.0, 0.25, 0.5, 1.0, 1.0, 0.75, 0.0, 0.5]
    est = bootstrap(values)
    assert est.mean == pytest.approx(sum(values) / len(values))
    assert est.low < est.mean < est.high
    assert est.values == tuple(values)
    assert mean_of_sets([values]) == est  # one set: the same resamples, the same interval


def test_sets_weigh_alike_whatever_their_size():
    small, large = [1.0] * 4, [0.0] * 400
    est = mean_of_sets([small, large])
    assert est.mean == pytest.approx(0.5)  # not the pooled mean (4 / 404)
    # every resample draws each set from itself: constant sets give no spread at all
    assert (est.low, est.high) == (pytest.approx(0.5), pytest.approx(0.5))


def test_average_of_sets_is_narrower_than_one_set():
    first = [float(i % 3 == 0) for i in range(128)]
    second = [float(i % 2 == 0) for i in range(128)]
    one, both = bootstrap(first), mean_of_sets([first, second])
    assert both.mean == pytest.approx((one.mean + 0.5) / 2)
    assert both.high - both.low < one.high - one.low


@pytest.mark.parametrize(
    "sets, match",
    [([], "every set"), ([[1.0], []], "every set")],
)
def test_bad_sets_are_named(sets, match):
    with pytest.raises(ValueError, match=match):
        mean_of_sets(sets)
    with pytest.raises(ValueError, match="level"):
        mean_of_sets([[1.0]], level=1.5)


def test_table_cell_gives_the_average_with_its_interval():
    correct = {name: [i % 9 for i in range(64)] for name in tiers.BENCHMARKS}
    row = {name: {"pass@1": pass_at_k_estimate(8, c, 1)} for name, c in correct.items()}
    cell = average_cell({"models": {"m": row}}, "m")
    expected = mean_of_sets([row[name]["pass@1"].values for name in tiers.BENCHMARKS])
    assert cell == expected.fmt() and "[" in cell
    bare = {name: {"pass@1": Estimate(0.25, 0.2, 0.3)} for name in tiers.BENCHMARKS}
    assert average_cell({"models": {"m": bare}}, "m") == "25.0"  # values not kept: mean only
    assert Estimate(0.25, 0.2, 0.3).plain() == {"mean": 0.25, "low": 0.2, "high": 0.3}


def test_paired_difference_cancels_what_both_models_share():
    # problems of very different difficulty; the second model is 0.05 better on every one
    hard = [[(i % 10) / 10 for i in range(64)] for _ in range(4)]
    better = [[x + 0.05 for x in v] for v in hard]
    lead = paired_difference(better, hard)
    assert lead.mean == pytest.approx(0.05)
    assert (lead.low, lead.high) == (pytest.approx(0.05), pytest.approx(0.05))
    # the separate intervals overlap, the paired one does not reach 0
    apart = mean_of_sets(better), mean_of_sets(hard)
    assert apart[0].low < apart[1].high and lead.low > 0
    with pytest.raises(ValueError, match="same problems"):
        paired_difference(better, [v[:-1] for v in hard])


def test_lead_cell_is_the_paired_difference_in_points():
    rows = {
        m: {name: {"pass@1": pass_at_k_estimate(8, [(i + shift) % 9 for i in range(64)], 1)}
            for name in tiers.BENCHMARKS}
        for m, shift in (("f", 1), ("c", 0))
    }  # fmt: skip
    values = {m: [rows[m][s]["pass@1"].values for s in tiers.BENCHMARKS] for m in rows}
    cell = lead_cell({"models": rows}, "f", "c")
    assert cell == paired_difference(values["f"], values["c"]).fmt()
    bare = {name: {"pass@1": Estimate(0.25, 0.2, 0.3)} for name in tiers.BENCHMARKS}
    assert lead_cell({"models": {"f": bare, "c": bare}}, "f", "c") == ""
