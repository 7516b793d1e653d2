"""Tests for coscale.scoring.metrics: unbiased pass@k and the PassAtK torchmetrics Metric."""

from __future__ import annotations

import itertools
import math
import os
import socket
from fractions import Fraction

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from coscale.scoring.metrics import PassAtK, pass_at_k


def _enumerate(n: int, c: int, k: int) -> float:
    """Fraction of all k-subsets of n samples (c correct) holding at least one correct."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in subset) for subset in subsets) / len(subsets)


def test_matches_enumeration_for_small_n():
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert abs(pass_at_k(n, c, k) - _enumerate(n, c, k)) <= 1e-12, (n, c, k)


def test_hand_values():
    # n=4, c=1, k=2: 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5; pass@1 is c/n.
    assert abs(pass_at_k(4, 1, 2) - 0.5) <= 1e-15
    assert abs(pass_at_k(10, 3, 1) - 0.3) <= 1e-15
    assert pass_at_k(5, 0, 3) == 0.0
    assert pass_at_k(5, 3, 3) == 1.0  # n - c = 2 < k = 3: every 3-subset has a correct one
    import numpy as np  # counts from numpy are integers too (coscale.checks.is_a)

    assert pass_at_k(np.int64(4), np.int64(1), np.int64(2)) == pass_at_k(4, 1, 2)


@pytest.mark.parametrize(("c", "k"), [(1, 1), (1, 8), (3, 512), (17, 8), (512, 1000), (1000, 8)])
def test_large_n_stable_and_exact(c, k):
    n = 1024
    value = pass_at_k(n, c, k)
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k)) if n - c >= k else Fraction(1)
    assert 0.0 <= value <= 1.0 and math.isfinite(value)
    assert abs(value - float(exact)) <= 1e-12


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((0, 0, 1), r"n must be an int >= 1, got 0"),
        ((4, 5, 1), r"c must be an int in \[0, 4\], got 5"),
        ((4, -1, 1), r"c must .* got -1"),
        ((4, 1, 5), r"k must be an int in \[1, 4\], got 5"),
        ((4, 1, 0), r"k must .* got 0"),
        ((4.0, 1, 1), r"n must be an int >= 1, got 4.0"),
        ((4, True, 1), r"c must be an int .* got True"),
    ],
)
def test_pass_at_k_rejects_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        pass_at_k(*args)


def test_metric_update_compute_reset():
    metric = PassAtK(k=(1, 2))
    # problem A: n=4, c=1 -> pass@1 0.25, pass@2 0.5; problem B: n=4, c=0 -> 0, 0.
    metric.update(n=torch.tensor([4, 4]), c=torch.tensor([1, 0]))
    out = metric.compute()
    assert set(out) == {"pass@1", "pass@2"}
    assert abs(out["pass@1"].item() - 0.125) <= 1e-7
    assert abs(out["pass@2"].item() - 0.25) <= 1e-7
    metric.reset()
    metric.update(n=[2], c=[2])
    assert metric.compute()["pass@1"].item() == 1.0


def test_two_updates_concatenate():
    metric = PassAtK(k=(1, 8))
    metric.update(n=[8, 16], c=[0, 4])  # pass@8: 0 and 1 - C(12,8)/C(16,8) = 1 - 495/12870
    metric.update(n=[8], c=[8])  # pass@1 1, pass@8 1
    out = metric.compute()
    assert abs(out["pass@1"].item() - (0 + 0.25 + 1) / 3) <= 1e-7
    assert abs(out["pass@8"].item() - (0 + (1 - 495 / 12870) + 1) / 3) <= 1e-7


def test_merge_state_concatenates_problems():
    # dist_reduce_fx="cat": merging another process's state appends its problems.
    left, right = PassAtK(k=(1,)), PassAtK(k=(1,))
    left.update(n=[4], c=[4])
    right.update(n=[4, 4], c=[0, 1])
    left.merge_state(right)
    assert abs(left.compute()["pass@1"].item() - (1 + 0 + 0.25) / 3) <= 1e-7


def test_compute_rejects_k_above_n():
    metric = PassAtK(k=(1, 8))
    metric.update(n=[16, 4], c=[1, 1])
    with pytest.raises(ValueError, match=r"k=8 exceeds n=4"):
        metric.compute()


def test_compute_without_updates_is_nan():
    with pytest.warns(UserWarning):
        out = PassAtK(k=(1,)).compute()
    assert math.isnan(out["pass@1"].item())


@pytest.mark.parametrize(
    ("n", "c", "match"),
    [
        ([4, 4], [1], r"n shape \(2,\) must equal c shape \(1,\)"),
        ([0], [0], r"n must be >= 1, got \[0\]"),
        ([4], [5], r"c must be in \[0, n\], got \(c, n\) = \[\(5, 4\)\]"),
        ([4.5], [1], r"n must hold integer counts"),
    ],
)
def test_update_rejects_bad_counts(n, c, match):
    with pytest.raises(ValueError, match=match):
        PassAtK(k=(1,)).update(n=n, c=c)


@pytest.mark.parametrize("k", [(), (0,), (1, 1), (2.0,)])
def test_rejects_bad_k(k):
    with pytest.raises(ValueError, match=r"k=.*distinct ints >= 1"):
        PassAtK(k=k)


def _sync_worker(rank: int, world: int, port: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    metric = PassAtK(k=(1,))
    # rank 0: n=4, c=4 (1.0); rank 1: n=4, c=1 (0.25) -> synced mean 0.625 on both ranks.
    metric.update(n=[4], c=[4 if rank == 0 else 1])
    results[rank] = metric.compute()["pass@1"].item()
    dist.destroy_process_group()


@pytest.mark.slow
def test_syncs_across_processes():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    results = mp.Manager().dict()
    mp.spawn(_sync_worker, args=(2, port, results), nprocs=2, join=True)
    assert dict(results) == {0: 0.625, 1: 0.625}


def test_pass_rates_is_the_mean_unbiased_estimate_for_each_k():
    from coscale.scoring.sample_count import pass_rates

    got = pass_rates(4, [0, 1, 4], ks=[1, 2])
    want = {k: sum(pass_at_k(4, c, k) for c in (0, 1, 4)) / 3 for k in (1, 2)}
    assert got.keys() == {"pass@1", "pass@2"}
    assert all(abs(got[f"pass@{k}"] - want[k]) < 1e-6 for k in (1, 2))
    assert pass_rates(4, [2, 2]).keys() == {"pass@1", "pass@4"} and pass_rates(4, []) == {}
