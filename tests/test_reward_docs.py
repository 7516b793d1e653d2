"""docs/rewards.md's verl adapter, run as written: ``compute_score`` results (floats or dicts with
a ``score``) per completion, with the ``data_source`` and ``extra_info`` columns or without."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

from coscale.scoring.reward_functions import RewardInputs, calling_style
from coscale.scoring.reward_set import RewardSet

ROOT = Path(__file__).resolve().parents[1]


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """A verl-style reward: a dict for gsm8k rows, a float (plus a bonus from extra_info) else."""
    if data_source == "gsm8k":
        return {"score": float(solution_str.endswith(ground_truth)), "acc": True}
    return float(ground_truth in solution_str) + (extra_info or {}).get("bonus", 0.0)


def _verl_reward(monkeypatch):
    text = (ROOT / "docs" / "rewards.md").read_text()
    section = text[text.index("## verl's `compute_score`") :]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    task = types.ModuleType("my_verl_task")
    task.compute_score = compute_score
    monkeypatch.setitem(sys.modules, "my_verl_task", task)
    scope: dict = {}
    exec(compile(code, "docs/rewards.md (verl adapter)", "exec"), scope)
    return scope["verl_reward"]


def test_the_verl_adapter_in_the_docs_scores_each_completion(monkeypatch):
    verl_reward = _verl_reward(monkeypatch)
    assert calling_style(verl_reward) == "coscale"
    inputs = RewardInputs(
        prompts=["p"] * 4,
        completions=["so 12", "12 or 13", "7", "x 7"],
        completion_ids=[[1]] * 4,
        answers=["12", "12", "7", "7"],
        columns={
            "data_source": ["gsm8k", "gsm8k", "math", "math"],
            "extra_info": [None, None, {"bonus": 0.5}, None],
        },
    )
    # gsm8k: ends with the answer -> 1, 0 (the dict's score); math: contains it (+ bonus)
    scores = RewardSet(verl_reward, verifier=verl_reward).score(inputs)
    assert scores.reward.tolist() == [1.0, 0.0, 1.5, 1.0]
    assert scores.names == ("verl_reward",)
    # problems without those columns: compute_score(None, text, answer, None)
    bare = RewardInputs(["p"], ["the answer is 3"], [[1]], ["3"])
    assert RewardSet(verl_reward).score(bare).reward.tolist() == [1.0]
