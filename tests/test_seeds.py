"""coscale.seeds: one rule for every derived seed, one way to seed torch for a block."""

from __future__ import annotations

import torch

from coscale.seeds import derive_seed, kept_rng, seeded


def test_derived_seeds_are_fixed_in_range_and_apart_for_other_parts():
    seeds = {
        derive_seed(tag, s, i) for tag in ("step", "batch") for s in range(3) for i in range(50)
    }
    assert len(seeds) == 300 and all(0 <= s < 2**31 for s in seeds)
    assert derive_seed("step", 1, 2) == derive_seed("step", 1, 2)  # same parts, same seed
    assert derive_seed("step", 1, 2) != derive_seed("step", 2, 1)  # order counts
    assert derive_seed("step", True) == derive_seed("step", 1)  # parts are read as ints


def test_seeded_blocks_repeat_and_leave_the_generator_as_it_was():
    torch.manual_seed(123)
    outside = torch.get_rng_state()
    with seeded(7):
        a = torch.rand(3)
    assert torch.equal(torch.get_rng_state(), outside)
    with seeded(7):
        b = torch.rand(3)
    assert torch.equal(a, b)


def test_the_model_devices_generator_is_kept_and_a_kept_block_may_draw_freely():
    torch.manual_seed(3)
    before = torch.random.get_rng_state()
    with seeded(7, torch.device("cpu")):
        on_cpu = torch.rand(2)
    with seeded(7, "cpu"):
        assert torch.equal(torch.rand(2), on_cpu)
    with kept_rng():
        torch.rand(5)  # drawn, not seeded: still put back
    assert torch.equal(torch.random.get_rng_state(), before)
