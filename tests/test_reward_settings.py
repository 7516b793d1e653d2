"""``coscale run`` YAML takes a reward list (``class_path`` or a dotted function path), its weights
and a verifier under ``pipeline.grpo``; bad settings are refused before any work, named; the
pipeline hands one verifier to every stage and to the teacher."""

from __future__ import annotations

from pathlib import Path

import pytest
import reward_examples

from coscale.app.cli import main
from coscale.app.run_config import build_run
from coscale.datamodules import ProblemDataModule
from coscale.loop.solution_sources import TeacherSolutions
from coscale.modules import GRPOModule, SFTModule
from coscale.pipeline import Pipeline, PipelineSettings
from coscale.scoring.rewards import MathReward

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "run" / "tiny.yaml"
REWARDS = """
pipeline:
  logger: none
  grpo:
    reward:
      - class_path: coscale.scoring.rewards.MathReward
        init_args: {num_workers: 0}
      - reward_examples.format_bonus
      - reward_examples.async_bonus
    reward_weights: [1.0, 0.5, 0.25]
    verifier: {class_path: reward_examples.HasDigit}
"""


def test_yaml_reward_list_weights_and_verifier_reach_every_stage(tmp_path):
    extra = tmp_path / "rewards.yaml"
    extra.write_text(REWARDS)
    config, data = build_run(
        ["--config", str(TINY), "--config", str(extra), "--pipeline.run_dir", str(tmp_path)]
    )
    pipe = Pipeline(config, data)
    grpo, sft = pipe.ctx.grpo_args, pipe.ctx.sft_args
    assert isinstance(grpo["reward"][0], MathReward) and grpo["reward"][0].num_workers == 0
    assert grpo["reward"][1:] == [reward_examples.format_bonus, reward_examples.async_bonus]
    assert grpo["reward_weights"] == [1.0, 0.5, 0.25]
    assert isinstance(grpo["verifier"], reward_examples.HasDigit)
    assert sft["verifier"] is grpo["verifier"]  # measurement, selection and the judge use it
    module = GRPOModule(model=config.model, **grpo)
    assert module.rewards.names == ["MathReward", "format_bonus", "async_bonus"]
    assert module.rewards.weights.tolist() == [1.0, 0.5, 0.25]
    assert module.verifier is grpo["verifier"]
    assert SFTModule(model=config.model, **sft).verifier is grpo["verifier"]


def test_without_a_verifier_the_pipeline_shares_the_default_one(tmp_path):
    rows = [{"id": "a", "question": "1+1", "answer": "2"}]
    teacher = TeacherSolutions(model="unused/teacher")
    data = ProblemDataModule(train=rows, teacher=teacher)
    pipe = Pipeline(PipelineSettings(model="m", run_dir=str(tmp_path), logger="none"), data)
    verifier = pipe.ctx.grpo_args["verifier"]
    assert isinstance(verifier, MathReward) and pipe.ctx.sft_args["verifier"] is verifier
    assert teacher.reward is verifier  # the bank's solutions are verified by it too
    # one reward and no verifier: that reward decides correctness everywhere (as before)
    one = {"reward": {"class_path": "reward_examples.HasDigit"}}
    own = TeacherSolutions(model="unused/teacher", reward=reward_examples.HasDigit())
    data = ProblemDataModule(train=rows, teacher=own)
    pipe = Pipeline(
        PipelineSettings(model="m", run_dir=str(tmp_path), logger="none", grpo=one), data
    )
    assert isinstance(pipe.ctx.sft_args["verifier"], reward_examples.HasDigit)
    assert own.reward is not pipe.ctx.sft_args["verifier"]  # a teacher's own verifier stays


def test_bad_reward_settings_are_refused_before_any_work_naming_them(capsys):
    base = ["run", "--config", str(TINY)]
    assert main([*base, "--pipeline.grpo.reward_weights", "[1.0, 2.0]"]) == 2
    err = capsys.readouterr().err
    assert "grpo.reward_weights has 2 weights but reward has 1 function" in err
    two = '["reward_examples.format_bonus", "reward_examples.async_bonus"]'
    weights = ["--pipeline.grpo.reward_weights", "[1.0]"]
    assert main([*base, "--pipeline.grpo.reward", two, *weights]) == 2
    assert "grpo.reward_weights has 1 weight but reward has 2 functions" in capsys.readouterr().err
    assert main([*base, "--pipeline.sft.verifier", "reward_examples.HasDigit"]) == 2
    assert "pipeline.sft.verifier is set by pipeline.grpo.verifier" in capsys.readouterr().err
    with pytest.raises(
        ValueError, match=r"sft\.verifier is set by the run .* pipeline\.grpo\.verif"
    ):
        PipelineSettings(model="m", sft={"verifier": reward_examples.HasDigit()})


def test_run_help_documents_the_reward_settings(capsys):
    assert main(["run", "--config", str(TINY), "--help"]) == 0
    out = capsys.readouterr().out
    for name in ("reward ", "reward_weights", "verifier"):
        assert f"--pipeline.grpo.{name}" in out, name
    assert "--pipeline.sft.verifier" not in out  # the pipeline sets it from grpo.verifier
