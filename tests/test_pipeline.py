"""`coscale run --config configs/tiny.yaml` end to end, its W&B offline run, export and resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from coscale.cli import main

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny.yaml"
STAGES = ["warmup", "it1/scale", "it1/sft", "it1/eval", "it1/rl", "final"]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_tiny_pipeline_runs_every_stage(tmp_path, capsys, wandb_log):
    run_dir = tmp_path / "run"
    assert main(["run", "--config", str(TINY), "--pipeline.run_dir", str(run_dir)]) == 0
    out = capsys.readouterr().out
    for stage in STAGES:
        assert f"== stage {stage} |" in out
    state = json.loads((run_dir / "pipeline_state.json").read_text())
    assert state["done"] == STAGES
    counts = state["results"]["pools"]
    assert sum(counts.values()) == 48
    assert counts["solvable"] + counts["solved"] > 0  # SFT moved problems inside the boundary
    assert set(state["results"]["final"]) >= {"val/final_before_pass@1", "val/final_after_pass@1"}
    # the W&B offline run holds pool sizes, pass rates, N per group and a completions table
    keys = [
        b"pool/solvable",
        b"pool/unsolvable",
        b"pool/pass@1",
        b"sched/n_group0",
        b"sched/n_eff_group0",
        b"train/reward",
        b"completions/step_",
    ]
    data = wandb_log(run_dir / "logs" / "wandb", keys)
    for key in keys:
        assert key in data, key
    # every stage's model is a plain HF folder
    from transformers import AutoModelForCausalLM, AutoTokenizer

    for stage in ["it1/sft", "it1/rl", "final"]:
        folder = run_dir / stage / "model"
        assert (folder / "model.safetensors").exists() and (
            folder / "generation_config.json"
        ).exists()
    AutoModelForCausalLM.from_pretrained(run_dir / "final" / "model")
    AutoTokenizer.from_pretrained(run_dir / "final" / "model")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_sigkill_mid_rl_then_same_command_resumes(tmp_path):
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "coscale",
        "run",
        "--config",
        str(TINY),
        "--pipeline.run_dir",
        str(run_dir),
        "--pipeline.rl_epochs",
        "4",
        "--pipeline.final_retrain",
        "false",
        "--pipeline.logger",
        "csv",
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    log_file = (tmp_path / "first.log").open("w")  # a pipe nobody reads would block the child
    proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=env)
    ckpt = run_dir / "it1" / "rl" / "ckpt" / "last.ckpt"
    deadline = time.time() + 240
    while not ckpt.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    assert ckpt.exists(), "no RL checkpoint was written"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    log_file.close()
    assert proc.returncode == -signal.SIGKILL
    state = json.loads((run_dir / "pipeline_state.json").read_text())
    assert "it1/rl" not in state["done"] and "it1/eval" in state["done"]
    rerun = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    log = rerun.stdout + rerun.stderr
    assert "resuming after stages: warmup, it1/scale, it1/sft, it1/eval" in log
    assert "Restored all states from the checkpoint" in log
    assert "== stage it1/sft |" not in log  # finished stages are not run again
    final = json.loads((run_dir / "pipeline_state.json").read_text())
    assert final["done"][-1] == "it1/rl"


def _stage_plan(tmp_path, **settings) -> list[tuple[str, bool | None]]:
    """The stages a pipeline runs, each RL stage with whether it re-distils (fits stubbed)."""
    from coscale.datamodules import ProblemDataModule
    from coscale.pipeline import Pipeline, PipelineConfig

    rows = [{"id": "a", "question": "1+1", "answer": "2"}]
    cfg = PipelineConfig(model="unused", run_dir=str(tmp_path), logger="none", **settings)
    pipe = Pipeline(cfg, ProblemDataModule(train=rows))
    plan: list[tuple[str, bool | None]] = []
    for stage in ("warmup", "scale_data", "sft", "measure", "final"):
        setattr(pipe, stage, lambda name: plan.append((name, None)))
    pipe.rl = lambda name, redistill: plan.append((name, redistill))
    pipe.run()
    return plan


def test_redistillation_each_iteration_or_only_through_the_next_sft(tmp_path):
    rl = [s for s in _stage_plan(tmp_path / "a", iterations=3) if s[0].endswith("/rl")]
    assert rl == [("it1/rl", True), ("it2/rl", True), ("it3/rl", False)]  # last: final retrain
    rl = [
        s
        for s in _stage_plan(tmp_path / "b", iterations=3, redistill_each_iteration=False)
        if s[0].endswith("/rl")
    ]
    assert rl == [("it1/rl", False), ("it2/rl", False), ("it3/rl", False)]
    plan = _stage_plan(
        tmp_path / "c", iterations=2, redistill_each_iteration=False, final_retrain=False
    )
    assert ("it2/rl", True) in plan and not any(name == "final" for name, _ in plan)


def test_sft_max_steps_must_be_positive():
    from coscale.pipeline import PipelineConfig

    with pytest.raises(ValueError, match="sft_max_steps must be >= 1"):
        PipelineConfig(model="m", sft_max_steps=0)
    with pytest.raises(ValueError, match="final_keep must be one of"):
        PipelineConfig(model="m", final_keep="newest")


def test_checkpoint_interval_reaches_the_stage_checkpoint(tmp_path):
    from lightning.pytorch.callbacks import ModelCheckpoint

    from coscale.datamodules import ProblemDataModule
    from coscale.pipeline import Pipeline, PipelineConfig

    with pytest.raises(ValueError, match="checkpoint_every_n_steps must be >= 1, got 0"):
        PipelineConfig(model="m", checkpoint_every_n_steps=0)
    cfg = PipelineConfig(
        model="m", run_dir=str(tmp_path), logger="none", checkpoint_every_n_steps=25
    )
    pipe = Pipeline(cfg, ProblemDataModule(train=[{"id": "a", "question": "q", "answer": "1"}]))
    seen = []

    class _Trainer:
        def fit(self, module, datamodule, ckpt_path):
            seen.append(ckpt_path)

    def fake_trainer(name, callbacks, max_epochs, max_steps=None):
        seen.extend(c for c in callbacks if isinstance(c, ModelCheckpoint))
        return _Trainer()

    pipe._trainer = fake_trainer
    pipe.fit("it1/sft", module=None, callbacks=[], epochs=1)
    ckpt, resume = seen
    assert ckpt._every_n_train_steps == 25 and ckpt.save_last
    assert ckpt.dirpath == str(tmp_path / "it1" / "sft" / "ckpt") and resume is None


def test_final_keep_best_loads_an_earlier_iteration_that_scores_higher(tmp_path, monkeypatch):
    import torch

    from coscale.datamodules import ProblemDataModule
    from coscale.pipeline import Pipeline, PipelineConfig

    with pytest.raises(ValueError, match="final_keep must be one of"):
        PipelineConfig(model="m", final_keep="best_of")
    cfg = PipelineConfig(
        model="m", run_dir=str(tmp_path), logger="none", iterations=3, final_keep="best"
    )
    pipe = Pipeline(cfg, ProblemDataModule(train=[{"id": "a", "question": "q", "answer": "1"}]))
    for it in (1, 2):  # both earlier iterations exported a model
        (tmp_path / f"it{it}" / "rl" / "model").mkdir(parents=True)

    class _Module:
        def __init__(self, value: float) -> None:
            self.policy = torch.nn.Linear(1, 1, bias=False)
            torch.nn.init.constant_(self.policy.weight, value)
            self.trainer = None

    it_score = {"it1": 0.5, "it2": 0.3}  # final stage kept 0.4: iteration 1 must win

    class _Retrain:
        def measure(self, trainer, module, problems, when):
            assert [p["id"] for p in problems] == ["a"]
            return {f"val/final_{when}_pass@1": it_score[when]}

    loaded = []
    pipe._standalone = lambda module, name: loaded.append(name) or _Module(float(name[-1]))
    monkeypatch.setattr("coscale.pipeline.SFTModule", lambda **kwargs: None)  # loads nothing
    pipe.dm.load()
    pipe.results["final"] = {"val/final_before_pass@1": 0.4, "val/final_after_pass@1": 0.2}
    final_module = _Module(9.0)
    out = pipe._keep_best_iteration(_Retrain(), final_module)
    assert loaded == ["final/it2", "final/it1"]  # latest first
    assert out == {
        "val/final_it1_pass@1": 0.5,
        "val/final_it2_pass@1": 0.3,
        "val/final_kept_iteration": 1.0,
    }
    assert float(final_module.policy.weight) == 1.0  # iteration 1's weights were loaded
    # a tie with what the final stage kept keeps the final stage's model
    it_score.update(it1=0.4, it2=0.4)
    final_module = _Module(9.0)
    out = pipe._keep_best_iteration(_Retrain(), final_module)
    assert out["val/final_kept_iteration"] == 0.0 and float(final_module.policy.weight) == 9.0
    # two earlier iterations tie above it: the later one (2) is kept
    it_score.update(it1=0.5, it2=0.5)
    final_module = _Module(9.0)
    out = pipe._keep_best_iteration(_Retrain(), final_module)
    assert out["val/final_kept_iteration"] == 2.0 and float(final_module.policy.weight) == 2.0
