"""Tests for coscale.rl.theory: effective Rollout N, lr/N efficiency and N per group."""

from __future__ import annotations

import itertools

import pytest

from coscale.rl.theory import (
    effective_rollouts,
    efficiency,
    fit_efficiency,
    instability_threshold,
    n_for_lr_ratio,
    optimal_lr_over_n,
    rollouts_for,
)


@pytest.mark.parametrize(
    ("p", "n", "expected"),
    [
        (0.5, 2, 1.0),  # 2 * (1 - 1/4 - 1/4)
        (0.5, 4, 3.5),  # 4 * (1 - 1/16 - 1/16)
        (0.1, 8, 4.55626224),  # 8 * (1 - 1e-8 - 0.9**8 = 0.43046721) = 8 * 0.56953278
        (0.25, 3, 1.6875),  # 3 * (1 - 1/64 - 27/64) = 3 * 36/64
        (0.0, 8, 0.0),  # all-wrong groups never carry signal
        (1.0, 8, 0.0),  # all-correct groups neither
        (0.3, 1, 0.0),  # one rollout: 1 - 0.3 - 0.7
    ],
)
def test_effective_rollouts(p, n, expected):
    assert abs(effective_rollouts(p, n) - expected) <= 1e-12


def test_effective_rollouts_increase_with_n():
    for p in (0.01, 0.2, 0.5, 0.9, 0.999):
        values = [effective_rollouts(p, n) for n in range(1, 200)]
        assert all(b > a for a, b in itertools.pairwise(values)), p


def test_efficiency_optimum_and_threshold():
    # mu_p=2, mu_n=5: E(0.1) = 0.2 - 0.05 = 0.15; x* = 2/10 = 0.2 with E = 0.4 - 0.2 = 0.2;
    # threshold 2/5 = 0.4 where E = 0.8 - 0.8 = 0; beyond it E < 0.
    assert abs(efficiency(0.1, 2.0, 5.0) - 0.15) <= 1e-12
    assert abs(optimal_lr_over_n(2.0, 5.0) - 0.2) <= 1e-12
    assert abs(efficiency(0.2, 2.0, 5.0) - 0.2) <= 1e-12
    assert abs(instability_threshold(2.0, 5.0) - 0.4) <= 1e-12
    assert abs(efficiency(0.4, 2.0, 5.0)) <= 1e-12
    assert efficiency(0.5, 2.0, 5.0) < 0
    assert efficiency(0, 1, 1) == 0.0


@pytest.mark.parametrize(
    ("p", "min_effective", "n_max", "n_min", "expected"),
    [
        (0.5, 3.0, 64, 1, 4),  # N_eff: N=3 -> 2.25, N=4 -> 3.5
        (0.5, 1.0, 64, 1, 2),  # N=1 -> 0, N=2 -> 1.0 (exactly reached)
        (0.5, 1.0, 64, 8, 8),  # already reached at the floor
        (0.1, 4.0, 64, 1, 8),  # N=7: 7 * (1 - 1e-7 - 0.9**7 = 0.4782969) = 3.65 < 4; N=8: 4.56
        (0.5, 100.0, 16, 1, 16),  # N_eff < N <= 16 never reaches 100 -> cap
        (0.0, 1.0, 32, 1, 32),  # no N gives signal -> cap
        (1.0, 1.0, 32, 1, 32),
    ],
)
def test_rollouts_for(p, min_effective, n_max, n_min, expected):
    assert rollouts_for(p, min_effective, n_max, n_min=n_min) == expected


def test_n_for_lr_ratio():
    # lr=1, target lr/N_eff <= 0.5 -> N_eff >= 2: p=0.5: N=2 -> 1.0, N=3 -> 2.25 -> N=3.
    assert n_for_lr_ratio(1.0, 0.5, 0.5, n_max=64) == 3
    # p=0.1, target 0.25 -> N_eff >= 4 -> N=8 (see test_rollouts_for).
    assert n_for_lr_ratio(1.0, 0.1, 0.25, n_max=64) == 8
    assert n_for_lr_ratio(1.0, 0.1, 0.25, n_max=6) == 6  # capped
    assert n_for_lr_ratio(1.0, 0.0, 0.5, n_max=16) == 16  # p=0: lr / N_eff is infinite
    assert n_for_lr_ratio(1.0, 0.5, 0.5, n_max=64, n_min=5) == 5


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: effective_rollouts(1.5, 4), r"p must be a number in \[0.0, 1.0\], got 1.5"),
        (lambda: effective_rollouts(-0.1, 4), r"p must .* got -0.1"),
        (lambda: effective_rollouts(float("nan"), 4), r"p must be a number in .* got nan"),
        (lambda: effective_rollouts(0.5, 0), r"n must be an int >= 1, got 0"),
        (lambda: effective_rollouts(0.5, 2.0), r"n must be an int >= 1, got 2.0"),
        (lambda: effective_rollouts(0.5, True), r"n must be an int >= 1, got True"),
        (lambda: efficiency(-1.0, 1.0, 1.0), r"lr_over_n must .* got -1.0"),
        (lambda: efficiency(1.0, "a", 1.0), r"mu_p must .* got 'a'"),
        (lambda: optimal_lr_over_n(1.0, 0.0), r"mu_n must be a number > 0.0, got 0.0"),
        (lambda: instability_threshold(-1.0, 1.0), r"mu_p must .* got -1.0"),
        (lambda: rollouts_for(0.5, 0.0, 8), r"min_effective must .* got 0.0"),
        (lambda: rollouts_for(0.5, 1.0, 4, n_min=8), r"n_max must be an int >= 8, got 4"),
        (lambda: rollouts_for(0.5, 1.0, 8, n_min=0), r"n_min must .* got 0"),
        (lambda: n_for_lr_ratio(0.0, 0.5, 0.1, 8), r"lr must .* got 0.0"),
        (lambda: n_for_lr_ratio(1.0, 0.5, -0.1, 8), r"target_lr_over_n_eff must .* got -0.1"),
    ],
)
def test_rejects_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_fit_efficiency_recovers_a_quadratic_and_its_optimum():
    xs = [1e-6, 3e-6, 1e-5, 3e-5, 1e-4]
    gains = [efficiency(x, mu_p=2.0e4, mu_n=3.0e8) for x in xs]
    mu_p, mu_n = fit_efficiency(xs, gains)
    assert mu_p == pytest.approx(2.0e4, rel=1e-6)
    assert mu_n == pytest.approx(3.0e8, rel=1e-6)
    assert optimal_lr_over_n(mu_p, mu_n) == pytest.approx(2.0e4 / 6.0e8, rel=1e-6)


def test_fit_efficiency_reports_a_convex_curve_as_non_positive_noise():
    _, mu_n = fit_efficiency([1.0, 2.0, 3.0], [1.0, 4.0, 9.0])  # gain = x^2: no optimum
    assert mu_n < 0


@pytest.mark.parametrize(
    ("xs", "gains", "match"),
    [([1.0], [1.0], ">= 2"), ([1.0, 2.0], [1.0], "equal length"), ([0.0, 0.0], [0, 0], "distinct")],
)
def test_fit_efficiency_rejects_too_little_data(xs, gains, match):
    with pytest.raises(ValueError, match=match):
        fit_efficiency(xs, gains)
