"""Tests for coscale.rl.advantages: group-relative advantages with unequal group sizes."""

from __future__ import annotations

import math

import pytest
import torch

from coscale.rl.advantages import Advantages, group_advantages

# Four groups of sizes 3, 2, 1, 2, interleaved in one batch:
#   group 0: rewards 1, 0, 0   mean 1/3, deviations 2/3, -1/3, -1/3,
#            sum of squares 4/9 + 1/9 + 1/9 = 2/3, unbiased var (2/3)/2 = 1/3, std sqrt(1/3)
#   group 1: rewards 1, 1      mean 1, std 0 -> zero_std
#   group 2: reward 0.5        size 1 -> std 0 -> zero_std
#   group 3: rewards 0, 1      mean 1/2, deviations -1/2, 1/2, var 0.5/1, std sqrt(1/2)
GROUP_IDS = torch.tensor([2, 0, 3, 1, 0, 3, 0, 1])
REWARDS = torch.tensor([0.5, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0], dtype=torch.float64)
CENTERED = [0.0, 2 / 3, -0.5, 0.0, -1 / 3, 0.5, -1 / 3, 0.0]  # r - mean_group, 0 in zero_std
STD = [math.sqrt(1 / 3), 0.0, 0.0, math.sqrt(1 / 2)]
EPS = 1e-4


def _close(actual: torch.Tensor, expected: list[float]) -> None:
    torch.testing.assert_close(
        actual, torch.tensor(expected, dtype=actual.dtype), rtol=0, atol=1e-12
    )


def test_group_statistics():
    out = group_advantages(REWARDS, GROUP_IDS)
    assert isinstance(out, Advantages)
    _close(out.group_mean, [1 / 3, 1.0, 0.5, 0.5])
    _close(out.group_std, STD)
    assert out.zero_std.tolist() == [False, True, True, False]
    assert out.sizes.tolist() == [3, 2, 1, 2]
    assert out.num_groups == 4
    assert out.zero_std_fraction == 0.5


def test_scale_group():
    # A = (r - mean_group) / (std_group + eps), row by row with the std of its group.
    s0, s3 = STD[0] + EPS, STD[3] + EPS
    expected = [0.0, (2 / 3) / s0, -0.5 / s3, 0.0, (-1 / 3) / s0, 0.5 / s3, (-1 / 3) / s0, 0.0]
    _close(group_advantages(REWARDS, GROUP_IDS, scale="group", eps=EPS).advantages, expected)


def test_scale_batch():
    # Batch mean 4.5/8 = 0.5625; squared deviations: 0.0625^2 once, 0.4375^2 four times,
    # 0.5625^2 three times: 0.00390625 + 0.765625 + 0.94921875 = 1.71875;
    # unbiased var 1.71875 / 7, std sqrt(1.71875 / 7). Numerator stays r - mean_group.
    batch_std = math.sqrt(1.71875 / 7)
    expected = [c / (batch_std + EPS) for c in CENTERED]
    _close(group_advantages(REWARDS, GROUP_IDS, scale="batch", eps=EPS).advantages, expected)


def test_scale_none_is_centered_only():
    _close(group_advantages(REWARDS, GROUP_IDS, scale="none").advantages, CENTERED)


def test_zero_std_rows_are_exactly_zero():
    # 0.1 * 3 / 3 != 0.1 in floating point, so the rows must be zeroed explicitly.
    rewards = torch.tensor([0.1, 0.1, 0.1, 0.3, 0.7])
    out = group_advantages(rewards, torch.tensor([0, 0, 0, 1, 1]))
    assert out.advantages[:3].tolist() == [0.0, 0.0, 0.0]
    assert out.group_std[0].item() == 0.0
    assert out.zero_std.tolist() == [True, False]
    assert out.advantages.dtype == torch.float32


def test_all_groups_zero_std_with_eps_zero_is_finite():
    out = group_advantages(torch.ones(4), torch.tensor([0, 0, 1, 1]), scale="batch", eps=0.0)
    assert out.advantages.tolist() == [0.0, 0.0, 0.0, 0.0]
    out = group_advantages(torch.ones(1), torch.tensor([0]), scale="group", eps=0.0)
    assert out.advantages.tolist() == [0.0]


def test_integer_rewards_become_default_float():
    out = group_advantages(torch.tensor([1, 0]), torch.tensor([0, 0]), scale="none")
    assert out.advantages.dtype == torch.get_default_dtype()
    assert out.advantages.tolist() == [0.5, -0.5]


def test_matches_per_group_loop_on_random_unequal_groups():
    gen = torch.Generator().manual_seed(0)
    sizes = [1, 2, 3, 5, 8, 16, 4]
    group_ids = torch.cat([torch.full((s,), g) for g, s in enumerate(sizes)])
    group_ids = group_ids[torch.randperm(len(group_ids), generator=gen)]
    rewards = torch.rand(len(group_ids), generator=gen, dtype=torch.float64)
    out = group_advantages(rewards, group_ids, scale="group", eps=EPS)
    for g in range(len(sizes)):
        rows = group_ids == g
        r = rewards[rows]
        std = r.std() if len(r) > 1 else torch.tensor(0.0, dtype=r.dtype)
        expected = torch.zeros_like(r) if len(r) == 1 else (r - r.mean()) / (std + EPS)
        torch.testing.assert_close(out.advantages[rows], expected, rtol=0, atol=1e-12)


def test_does_not_track_gradients_of_rewards():
    rewards = torch.tensor([1.0, 0.0], requires_grad=True)
    assert not group_advantages(rewards, torch.tensor([0, 0])).advantages.requires_grad


@pytest.mark.parametrize(
    ("rewards", "group_ids", "kwargs", "match"),
    [
        (torch.ones(3), torch.tensor([0, 0, 0]), {"scale": "std"}, r"scale='std'.*'group'"),
        (torch.ones(3), torch.tensor([0, 0, 0]), {"eps": -1.0}, r"eps=-1.0"),
        (torch.ones(3), torch.tensor([0, 2, 2]), {}, r"contiguous.*\[1\]"),
        (torch.ones(3), torch.tensor([0, -1, 1]), {}, r"group_ids must be >= 0, got min -1"),
        (torch.ones(3), torch.tensor([0, 0]), {}, r"group_ids shape \(2,\)"),
        (torch.ones(2), torch.tensor([0.0, 0.0]), {}, r"integer dtype"),
        (torch.ones(2, 1), torch.tensor([0, 0]), {}, r"rewards must be a non-empty 1-D"),
        (torch.ones(0), torch.zeros(0, dtype=torch.long), {}, r"non-empty"),
        (torch.tensor([1.0, float("nan")]), torch.tensor([0, 0]), {}, r"finite.*nan"),
    ],
)
def test_rejects_bad_input(rewards, group_ids, kwargs, match):
    with pytest.raises(ValueError, match=match):
        group_advantages(rewards, group_ids, **kwargs)


def test_reports_all_problems_at_once():
    with pytest.raises(ValueError, match=r"scale=.*; eps=.*; rewards must be finite"):
        group_advantages(torch.tensor([float("inf")]), torch.tensor([0]), scale="x", eps=-1)
