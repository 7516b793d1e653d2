"""SFT and GRPO under strategy=ddp on 2 CPU processes: every rank ends with the same pools,
bank, N per problem and weights (decisions are made from gathered data, identically): the whole
curriculum state is compared."""

from __future__ import annotations

import pytest
from runs import worker_ranks


@pytest.mark.slow
def test_ddp_two_cpu_ranks_agree(tiny_model_dir, tmp_path):
    r0, r1 = worker_ranks("ddp_worker.py", tiny_model_dir, tmp_path, timeout=240)
    assert r0["data"] == r1["data"]
    assert r0["sft_sum"] == pytest.approx(r1["sft_sum"], abs=1e-9)
    assert r0["grpo_sum"] == pytest.approx(r1["grpo_sum"], abs=1e-9)
    # RL really ran on both ranks' rollouts: every problem got an RL round recorded
    assert r0["data"]["n_per_problem"] and r0["data"]["group_of"]  # the schedule decided N
    # RolloutNSchedule installed itself in the curriculum; the 3 RL epochs were each closed once
    assert r0["data"]["schedule"]["n"] and r0["closes"] == r1["closes"] == 3
    # the ranks shared the evaluation's calls: every rank holds all the counts, the same as one
    # process that makes every call itself (each call is seeded by its index, not its rank)
    assert (r0["evaluation"]["calls"], r1["evaluation"]["calls"]) == (2, 1)  # 3 calls shared
    assert r0["evaluation"]["shared"] == r1["evaluation"]["shared"] == r0["evaluation"]["alone"]
    assert r1["evaluation"]["alone"] == r0["evaluation"]["alone"]
    assert len(r0["evaluation"]["shared"]["correct"]) == 5
    problems = r0["data"]["pools"]["problems"]
    assert all(len(p["history"]) >= 2 for p in problems)
