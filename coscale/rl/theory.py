"""CoScale-RL theory: effective Rollout N, lr/N efficiency, and choosing N per group.

- A group of N rollouts of a problem with success rate p carries gradient signal only when it
  is neither all-correct nor all-wrong, so its expected number of useful rollouts is
  ``N_eff(p, N) = N * (1 - p**N - (1 - p)**N)``.
- Per-step efficiency is quadratic in ``x = lr / N``: ``E(x) = x * mu_p - x**2 * mu_n``, best at
  ``x* = mu_p / (2 mu_n)`` and negative (unstable) beyond ``mu_p / mu_n``. For hard problems
  the effective x is ``lr / N_eff(p, N)``, which is why they need a larger N.

``N_eff(p, N)`` strictly increases with N for ``0 < p < 1``, so "the smallest N that reaches a
target" is well defined; for ``p`` of 0 or 1 it is 0 for every N and the cap ``n_max`` is
returned.
"""

from __future__ import annotations

from collections.abc import Sequence

from coscale.checks import at_least, within


def effective_rollouts(p: float, n: int) -> float:
    """Expected number of rollouts in groups with signal, ``n * (1 - p**n - (1-p)**n)``.

    Args:
        p: Success rate of the problem, in ``[0, 1]``.
        n: Rollout N, int ``>= 1``.

    Returns:
        ``N_eff`` in ``[0, n)``; e.g. ``p=0.5, n=2 -> 1.0``.
    """
    if errors := within(0.0, 1.0, float, p=p) + at_least(1, n=n):
        raise ValueError("effective_rollouts: " + "; ".join(errors))
    return n * (1.0 - p**n - (1.0 - p) ** n)


def efficiency(lr_over_n: float, mu_p: float, mu_n: float) -> float:
    """Computational efficiency ``E(x) = x * mu_p - x**2 * mu_n`` at ``x = lr / N``.

    Args:
        lr_over_n: ``x = lr / N`` (or ``lr / N_eff``), ``>= 0``.
        mu_p: Signal coefficient, ``>= 0``.
        mu_n: Noise coefficient, ``>= 0``.
    """
    if errors := at_least(0.0, float, lr_over_n=lr_over_n, mu_p=mu_p, mu_n=mu_n):
        raise ValueError("efficiency: " + "; ".join(errors))
    return float(lr_over_n * mu_p - lr_over_n**2 * mu_n)


def optimal_lr_over_n(mu_p: float, mu_n: float) -> float:
    """The maximiser ``x* = mu_p / (2 mu_n)`` of :func:`efficiency`.

    Args:
        mu_p: Signal coefficient, ``>= 0``.
        mu_n: Noise coefficient, ``> 0``.
    """
    if errors := at_least(0.0, float, mu_p=mu_p) + at_least(0.0, float, strict=True, mu_n=mu_n):
        raise ValueError("optimal_lr_over_n: " + "; ".join(errors))
    return mu_p / (2.0 * mu_n)


def fit_efficiency(lr_over_n: Sequence[float], gains: Sequence[float]) -> tuple[float, float]:
    """Least-squares ``(mu_p, mu_n)`` of ``gain ~ x * mu_p - x**2 * mu_n`` (no intercept).

    ``gains`` are measured efficiencies (e.g. accuracy gained at a fixed rollout budget) at the
    ratios ``lr_over_n``. The fit is unconstrained, so a measured curve that is not concave
    shows up as ``mu_n <= 0`` (no optimum inside the range): check before calling
    :func:`optimal_lr_over_n`.
    """
    if len(lr_over_n) != len(gains) or len(gains) < 2:
        raise ValueError(
            f"fit_efficiency needs >= 2 (lr_over_n, gain) pairs of equal length, got "
            f"{len(lr_over_n)} and {len(gains)}"
        )
    xs = list(lr_over_n)
    if errors := at_least(0.0, float, **{f"lr_over_n[{i}]": x for i, x in enumerate(xs)}):
        raise ValueError("fit_efficiency: " + "; ".join(errors))
    # normal equations of [x, -x^2] @ [mu_p, mu_n] = gain
    s2, s3, s4 = (sum(x**k for x in xs) for k in (2, 3, 4))
    b1 = sum(x * g for x, g in zip(xs, gains))
    b2 = -sum(x * x * g for x, g in zip(xs, gains))
    det = s2 * s4 - s3 * s3
    if det <= 0:
        raise ValueError("fit_efficiency needs at least two distinct non-zero lr_over_n values")
    return (s4 * b1 + s3 * b2) / det, (s3 * b1 + s2 * b2) / det  # mu_p, mu_n


def instability_threshold(mu_p: float, mu_n: float) -> float:
    """The ``x = mu_p / mu_n`` beyond which :func:`efficiency` is negative (unstable).

    Args:
        mu_p: Signal coefficient, ``>= 0``.
        mu_n: Noise coefficient, ``> 0``.
    """
    if errors := at_least(0.0, float, mu_p=mu_p) + at_least(0.0, float, strict=True, mu_n=mu_n):
        raise ValueError("instability_threshold: " + "; ".join(errors))
    return mu_p / mu_n


def rollouts_for(p: float, min_effective: float, n_max: int, n_min: int = 1) -> int:
    """Smallest N in ``[n_min, n_max]`` with ``effective_rollouts(p, N) >= min_effective``.

    Args:
        p: Success rate of the problem (group), in ``[0, 1]``.
        min_effective: Wanted effective rollouts, ``> 0``.
        n_max: Cap on N, ``>= n_min``.
        n_min: Floor on N, ``>= 1``.

    Returns:
        That N, or ``n_max`` when no N in range reaches the target (always so for p of 0 or 1).
    """
    errors = at_least(1, n_min=n_min)
    errors += at_least(1 if errors else n_min, n_max=n_max) + within(0.0, 1.0, float, p=p)
    errors += at_least(0.0, float, strict=True, min_effective=min_effective)
    if errors:
        raise ValueError("rollouts_for: " + "; ".join(errors))
    reached = (n for n in range(n_min, n_max + 1) if effective_rollouts(p, n) >= min_effective)
    return next(reached, n_max)


def n_for_lr_ratio(
    lr: float, p: float, target_lr_over_n_eff: float, n_max: int, n_min: int = 1
) -> int:
    """Smallest N in ``[n_min, n_max]`` with ``lr / effective_rollouts(p, N) <= target``.

    Keeps the effective ``x = lr / N_eff`` of a group at (or below) a target such as
    :func:`optimal_lr_over_n`, so hard groups (p near 0) get a larger N.

    Args:
        lr: Learning rate, ``> 0``.
        p: Success rate of the group, in ``[0, 1]``.
        target_lr_over_n_eff: Target for ``lr / N_eff``, ``> 0``.
        n_max: Cap on N, ``>= n_min``.
        n_min: Floor on N, ``>= 1``.

    Returns:
        That N, or ``n_max`` when no N in range reaches the target (always so for p of 0 or 1).
    """
    target = target_lr_over_n_eff
    if errors := at_least(0.0, float, strict=True, lr=lr, target_lr_over_n_eff=target):
        raise ValueError("n_for_lr_ratio: " + "; ".join(errors))
    return rollouts_for(p, lr / target, n_max, n_min)  # lr / N_eff <= target: N_eff >= lr / target
