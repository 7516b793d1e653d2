"""Unbiased pass@k: a scalar estimator and a torchmetrics Metric that syncs across processes.

``pass@k = 1 - C(n - c, k) / C(n, k)`` for a problem with ``n`` samples of which ``c`` are
correct (Chen et al., 2021). The binomial ratio is evaluated as the product
``prod_{i=n-c+1}^{n} (1 - k / i)`` whose factors all lie in [0, 1), so it never overflows
and stays accurate for n in the thousands.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Integral

import torch
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities.data import dim_zero_cat

from coscale.checks import at_least, within


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k estimate of one problem.

    Args:
        n: Number of samples drawn, ``>= 1``.
        c: Number of correct samples, ``0 <= c <= n``.
        k: Budget of attempts, ``1 <= k <= n``.

    Returns:
        The probability that at least one of ``k`` samples drawn without replacement from the
        ``n`` is correct; 1.0 when ``n - c < k``.

    Raises:
        ValueError: Naming the parameter and value that is out of range.
    """
    errors = at_least(1, n=n)
    most = math.inf if errors else n  # c and k are bounded by a good n only
    errors += within(0, most, c=c) + within(1, most, k=k)
    if errors:
        raise ValueError("pass_at_k: " + "; ".join(errors))
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


class PassAtK(Metric):
    """Mean unbiased pass@k over problems, for several k at once.

    Every ``update`` appends per-problem ``(n, c)`` counts; the states are concatenated across
    processes (``dist_reduce_fx="cat"``), so ``compute`` sees every problem of every rank.

    Args:
        k: The budgets to report, each ``>= 1``, no duplicates.
        **kwargs: Forwarded to :class:`torchmetrics.Metric`.

    Example:
        >>> metric = PassAtK(k=(1, 2))
        >>> metric.update(n=[4, 4], c=[1, 0])
        >>> {key: round(float(v), 4) for key, v in metric.compute().items()}
        {'pass@1': 0.125, 'pass@2': 0.25}
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    def __init__(self, k: Sequence[int] = (1, 8), **kwargs) -> None:
        super().__init__(**kwargs)
        self.k = _check_ks(k)
        self.add_state("n", default=[], dist_reduce_fx="cat")
        self.add_state("c", default=[], dist_reduce_fx="cat")

    def update(self, n: Tensor | Sequence[int] | int, c: Tensor | Sequence[int] | int) -> None:
        """Adds problems: ``n[i]`` samples of which ``c[i]`` were correct.

        Args:
            n: Samples per problem, ``[B]`` (tensor, list or int), each ``>= 1``.
            c: Correct samples per problem, ``[B]``, each in ``[0, n]``.

        Raises:
            ValueError: On shape mismatch, non-integer counts or counts out of range.
        """
        n_t, c_t = _counts("n", n, self.device), _counts("c", c, self.device)  # [B], [B]
        if n_t.shape != c_t.shape:
            raise ValueError(f"n shape {tuple(n_t.shape)} must equal c shape {tuple(c_t.shape)}")
        errors = []
        if (n_t < 1).any():
            errors.append(f"n must be >= 1, got {n_t[n_t < 1].tolist()[:5]}")
        bad = (c_t < 0) | (c_t > n_t)
        if bad.any():
            pairs = list(zip(c_t[bad].tolist(), n_t[bad].tolist()))[:5]
            errors.append(f"c must be in [0, n], got (c, n) = {pairs}")
        if errors:
            raise ValueError("PassAtK.update: " + "; ".join(errors))
        self.n.append(n_t)
        self.c.append(c_t)

    def compute(self) -> dict[str, Tensor]:
        """Mean pass@k over all problems seen, as ``{"pass@<k>": scalar tensor}``.

        Returns NaN values when no problem was added.

        Raises:
            ValueError: When a k exceeds some problem's ``n`` (the estimator is undefined).
        """
        if isinstance(self.n, list) and not self.n:
            return {f"pass@{k}": torch.tensor(float("nan"), device=self.device) for k in self.k}
        n, c = dim_zero_cat(self.n).tolist(), dim_zero_cat(self.c).tolist()  # [B], [B]
        smallest = min(n)
        result = {}
        for k in self.k:
            if k > smallest:
                raise ValueError(
                    f"PassAtK: k={k} exceeds n={smallest} samples of a problem; "
                    f"sample at least {k} per problem or drop k={k}"
                )
            mean = math.fsum(pass_at_k(ni, ci, k) for ni, ci in zip(n, c)) / len(n)
            result[f"pass@{k}"] = torch.tensor(mean, dtype=torch.float32, device=self.device)
        return result


def _check_ks(k: Sequence[int]) -> tuple[int, ...]:
    """Validates the k budgets of :class:`PassAtK`."""
    ks = (k,) if isinstance(k, Integral) else tuple(k)
    if not ks or any(at_least(1, k=v) for v in ks) or len(set(ks)) != len(ks):
        raise ValueError(f"PassAtK: k={k!r} must be a non-empty list of distinct ints >= 1")
    return ks


def _counts(key: str, value: Tensor | Sequence[int] | int, device: torch.device) -> Tensor:
    """Converts counts to a 1-D long tensor, rejecting non-integral values."""
    t = torch.as_tensor(value).detach().flatten()  # [B]
    integral = torch.isfinite(t) & (t == t.round()) if t.is_floating_point() else None
    if t.dtype == torch.bool or t.is_complex() or (integral is not None and not integral.all()):
        raise ValueError(f"{key} must hold integer counts, got {t.tolist()[:5]}")
    return t.to(device=device, dtype=torch.long)
